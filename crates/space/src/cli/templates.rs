//! `space template import|pull|ls|rm|build`: templates, through the edge, with the
//! SDK. An import shows the bytes sent as they go (on stderr), then prints the digest;
//! a pull (see [`super::pull`]) fetches the image here first, then imports it so.

use space_client::{Client, TemplateView};

use super::errors;
use super::output::{print_json, table};
use super::upload::{size, upload};
use crate::args::{Cli, TemplateCmd};

/// `sha256:` and the first 12 hex digits.
fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn row(t: &TemplateView) -> Vec<String> {
    vec![
        format!("{}:{}", t.name, t.tag),
        short(&t.digest).to_owned(),
        t.layers.to_string(),
        size(t.size),
        t.created.clone(),
    ]
}

/// Runs a `space template` command; returns the exit code.
pub(crate) async fn run(
    c: &Client,
    cli: &Cli,
    url: &str,
    cmd: &TemplateCmd,
) -> Result<i32, String> {
    let sdk = |e: space_client::Error| errors::describe(&e, url);
    match cmd {
        TemplateCmd::Import { name, path } => {
            let t = upload(c, name, path, &sdk).await?;
            if cli.json {
                print_json(&t);
            } else {
                println!("{}", t.digest);
            }
        }
        TemplateCmd::Pull(a) => {
            let t = super::pull::pull(c, a, &sdk).await?;
            if cli.json {
                print_json(&t);
            } else {
                println!("{}", t.digest);
            }
        }
        TemplateCmd::Ls => {
            let list = c.templates().await.map_err(sdk)?;
            if cli.json {
                print_json(&list);
            } else {
                table(
                    &["NAME:TAG", "DIGEST", "LAYERS", "SIZE", "CREATED"],
                    &list.templates.iter().map(row).collect::<Vec<_>>(),
                );
            }
        }
        TemplateCmd::Rm { name } => c.remove_template(name).await.map_err(sdk)?,
        TemplateCmd::Build(b) => {
            let t = super::build::build(c, b, &sdk).await?;
            if cli.json {
                print_json(&t);
            } else {
                println!("{}", t.digest);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_shows_the_digest_short_and_the_size_readable() {
        let t = TemplateView {
            name: "py".into(),
            tag: "3.12".into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            layers: 3,
            size: 5 << 20,
            created: "2026-01-02T03:04:05Z".into(),
            config: Default::default(),
        };
        assert_eq!(
            row(&t),
            [
                "py:3.12",
                "sha256:abababababab",
                "3",
                "5.0 MiB",
                "2026-01-02T03:04:05Z"
            ]
        );
    }
}
