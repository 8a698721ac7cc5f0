//! `space template pull REF [--name NAME[:TAG]] [--platform OS/ARCH[/VARIANT]]
//! [--ca-file PEM] [--plain-http] [--username U (--password-stdin |
//! SPACE_REGISTRY_PASSWORD)]`: the image pulled here, on the caller's machine, with
//! the caller's credentials (space-registry), into a temporary OCI image layout that
//! is removed afterwards (also on failure), then imported through the API like
//! `space template import`. The platform never connects to a registry itself.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use space_client::Client;
use space_image::{ImageLimits, TemplateRef};
use space_registry::{Credentials, Platform, Progress, PullOptions, Reference};

/// The variable a registry password is read from (with `--username`).
pub const PASSWORD_VAR: &str = "SPACE_REGISTRY_PASSWORD";

/// `space template pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// The image, as Docker names it: `alpine`, `ghcr.io/owner/repo:tag`,
    /// `host:5000/repo@sha256:…`.
    pub reference: String,
    /// The template to make, `NAME[:TAG]` (default: the reference's last path
    /// component and its tag).
    #[arg(long)]
    pub name: Option<String>,
    /// The platform taken from a multi-platform image (default: linux/ and this
    /// machine's architecture).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's (a private
    /// registry's CA). Certificates are always verified.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// Plain HTTP instead of HTTPS, allowed only to a loopback registry
    /// (127.0.0.0/8, ::1, localhost).
    #[arg(long)]
    pub plain_http: bool,
    /// The registry user; the password comes from --password-stdin or
    /// SPACE_REGISTRY_PASSWORD. Without it, ~/.docker/config.json's entry for the
    /// registry is used, if any.
    #[arg(long)]
    pub username: Option<String>,
    /// Read the password from standard input (its first line).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
}

/// The credentials of a pull: `--username` with a password from stdin or the
/// environment, else Docker's config for the registry.
fn credentials(
    a: &PullArgs,
    reference: &Reference,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    stdin: impl FnOnce() -> std::io::Result<String>,
) -> Result<Option<Credentials>, String> {
    let from_env = env(PASSWORD_VAR).map(|p| p.to_string_lossy().into_owned());
    let Some(user) = &a.username else {
        if from_env.is_some() {
            return Err(format!(
                "{PASSWORD_VAR} is set: give the user with --username"
            ));
        }
        return space_registry::docker_config_credentials(reference.registry(), env)
            .map_err(|e| e.to_string());
    };
    let password = if a.password_stdin {
        let line = stdin().map_err(|e| format!("reading the password from stdin: {e}"))?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    } else {
        from_env.ok_or_else(|| {
            format!("--username needs a password: --password-stdin or {PASSWORD_VAR}")
        })?
    };
    Credentials::new(user.as_str(), password)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn read_line() -> std::io::Result<String> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Tells a pull's progress on stderr: a line per blob, updated at most 5 times a
/// second.
#[derive(Debug)]
struct Shown {
    last: Option<Instant>,
}

impl Shown {
    fn show(&mut self, p: &Progress) {
        match p {
            Progress::Resolved {
                digest,
                layers,
                bytes,
            } => eprintln!("manifest {digest}: {layers} layer(s), {}", mib(*bytes)),
            Progress::Blob {
                what,
                digest,
                received,
                size,
            } => {
                let done = received == size;
                let due = self
                    .last
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(200));
                if !done && !due {
                    return;
                }
                self.last = Some(Instant::now());
                let short = digest.to_string();
                eprint!(
                    "\r{what} {}: {} of {}   ",
                    &short[..19.min(short.len())],
                    mib(*received),
                    mib(*size)
                );
                if done {
                    eprintln!();
                }
                let _ = std::io::stderr().flush();
            }
        }
    }
}

/// Runs `space template pull`: the new template.
pub(crate) async fn pull(
    c: &Client,
    a: &PullArgs,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<space_proto::api::templates::TemplateView, String> {
    let reference = Reference::parse(&a.reference).map_err(|e| e.to_string())?;
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| reference.default_template_name());
    TemplateRef::parse(&name).map_err(|e| format!("{e} (choose one with --name)"))?;
    let platform = match &a.platform {
        Some(p) => p.parse::<Platform>().map_err(|e| e.to_string())?,
        None => Platform::host(),
    };
    let credentials = credentials(a, &reference, |k| std::env::var_os(k), read_line)?;
    let options = PullOptions {
        platform: platform.clone(),
        plain_http: a.plain_http,
        ca_file: a.ca_file.clone(),
        credentials,
        limits: ImageLimits::from_env()?,
        ..PullOptions::default()
    };
    options.check(&reference).map_err(|e| e.to_string())?;
    // The platform is reachable (and the key good) before anything is downloaded.
    c.templates().await.map_err(sdk)?;
    // Removed when dropped: on success, on an error, on a failed import.
    let work = tempfile::Builder::new()
        .prefix("space-pull-")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    eprintln!("pulling {reference} for {platform}");
    let mut shown = Shown { last: None };
    let pulled = space_registry::pull(&reference, work.path(), options, &mut |p| shown.show(p))
        .await
        .map_err(|e| format!("pull {reference}: {e}"))?;
    eprintln!(
        "pulled {} ({}, {} layer(s), {}); importing as {name}",
        pulled.digest,
        pulled.platform,
        pulled.layers,
        mib(pulled.bytes)
    );
    let view = super::upload::upload(c, &name, work.path(), sdk).await?;
    drop(work);
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(username: Option<&str>, password_stdin: bool) -> PullArgs {
        PullArgs {
            reference: "ghcr.io/o/r:1".into(),
            name: None,
            platform: None,
            ca_file: None,
            plain_http: false,
            username: username.map(Into::into),
            password_stdin,
        }
    }

    fn reference() -> Reference {
        Reference::parse("ghcr.io/o/r:1").unwrap_or_else(|e| panic!("{e}"))
    }

    fn no_stdin() -> std::io::Result<String> {
        panic!("stdin read")
    }

    #[test]
    fn a_password_comes_from_stdin_or_the_environment_and_only_with_a_user() {
        let env = |v: Option<&'static str>| {
            move |k: &str| (k == PASSWORD_VAR).then_some(v).flatten().map(Into::into)
        };
        let got = credentials(&args(Some("me"), true), &reference(), env(None), || {
            Ok("pw-from-stdin\n".into())
        });
        assert_eq!(
            got.ok().flatten().map(|c| c.username().to_owned()),
            Some("me".into())
        );
        let got = credentials(
            &args(Some("me"), false),
            &reference(),
            env(Some("pw")),
            no_stdin,
        );
        assert!(got.is_ok_and(|c| c.is_some()));
        let e = credentials(&args(Some("me"), false), &reference(), env(None), no_stdin);
        assert!(e.is_err_and(|e| e.contains("--password-stdin")));
        let e = credentials(&args(None, false), &reference(), env(Some("pw")), no_stdin);
        assert!(e.is_err_and(|e| e.contains("--username")));
        let e = credentials(&args(Some("me"), true), &reference(), env(None), || {
            Ok("\n".into())
        });
        assert!(e.is_err_and(|e| e.contains("empty password")));
    }
}
