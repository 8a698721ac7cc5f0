//! `space template import|pull|ls|rm|build`: templates, through the edge, with the
//! SDK. An import shows the bytes sent as they go (on stderr), then prints the digest;
//! a pull (see [`super::pull`]) fetches the image here first, then imports it so.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use space_client::{Client, ImageArchive, TemplateView};

use super::errors;
use super::output::{print_json, table};
use crate::args::{Cli, TemplateCmd};

/// `sha256:` and the first 12 hex digits.
fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn size(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
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

/// Imports the archive or OCI layout directory at `path` as `name`, showing the bytes
/// sent on stderr.
pub(crate) async fn upload(
    c: &Client,
    name: &str,
    path: &Path,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<TemplateView, String> {
    let archive = ImageArchive::open(path).await.map_err(sdk)?;
    let (sent, total) = (archive.sent(), archive.known_len());
    let progress = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = sent.load(Ordering::Relaxed);
            let of = total.map_or_else(String::new, |t| format!(" of {}", size(t)));
            eprint!("\rsent {}{of}   ", size(n));
            let _ = std::io::stderr().flush();
        }
    });
    let imported = c.import_template_from(name, archive).await;
    progress.abort();
    eprintln!();
    imported.map_err(sdk)
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
