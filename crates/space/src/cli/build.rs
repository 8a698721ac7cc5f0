//! `space template build NAME --debian SUITE [--packages a,b,…] [--mirror URL]
//! [--run CMD]…` (or `--from TEMPLATE --run CMD…`): a Debian system made by
//! `mmdebstrap` (its tar on a pipe, turned into a single-layer OCI image as it
//! arrives: no root filesystem on disk), imported through the API; then each `--run`
//! step executed (`sh -c`) in a sandbox of the template so far and committed as one
//! more layer (`POST /v1/sandboxes/{id}/commit`). The steps' templates are
//! `NAME:TAG-step<i>` while the build runs, removed once `NAME:TAG` is made.
//!
//! [`debian_layout`] is shared with `space up`'s `debian` default template.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use space_client::{Client, CreateSandbox};
use space_image::rootfs::{self, ImageSpec, LayerBlob, LayoutFormat};

/// `space template build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The template to make, `name[:tag]`.
    pub name: String,
    /// The Debian suite to install (`bookworm`, `trixie`, …).
    #[arg(
        long,
        value_name = "SUITE",
        required_unless_present = "from",
        conflicts_with = "from"
    )]
    pub debian: Option<String>,
    /// Build on an existing template instead (`name[:tag]`; needs a `--run`).
    #[arg(long, value_name = "TEMPLATE", requires = "run")]
    pub from: Option<String>,
    /// Packages to install besides the `apt` variant's (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub packages: Vec<String>,
    /// The Debian mirror (default: mmdebstrap's, deb.debian.org).
    #[arg(long, env = "SPACE_DEBIAN_MIRROR")]
    pub mirror: Option<String>,
    /// A command run (`sh -c`) in a sandbox of the template so far, its changes
    /// committed as a layer (repeatable; in order).
    #[arg(long = "run", value_name = "CMD")]
    pub run: Vec<String>,
    /// Seconds each `--run` step may take.
    #[arg(long, default_value_t = 1800)]
    pub step_timeout: u64,
}

/// How mmdebstrap runs here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    /// `unshare` or `root`.
    pub name: &'static str,
    /// Why, in words.
    pub why: String,
}

/// What a Debian build is made of.
#[derive(Debug, Clone)]
pub struct Debian {
    /// The suite.
    pub suite: String,
    /// Extra packages.
    pub packages: Vec<String>,
    /// The mirror, if not mmdebstrap's default.
    pub mirror: Option<String>,
}

/// A Debian image written.
#[derive(Debug, Clone)]
pub struct Built {
    /// Its one layer.
    pub layer: LayerBlob,
    /// How mmdebstrap ran.
    pub mode: Mode,
    /// How long it took.
    pub elapsed: Duration,
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// How mmdebstrap can run: `unshare` (unprivileged: user namespaces, `newuidmap`
/// and a subordinate id range of this user in `/etc/subuid` and `/etc/subgid`),
/// else `root` as root; else an error saying what is missing. Missing mmdebstrap is
/// an error naming its Debian package.
pub fn mode() -> Result<Mode, String> {
    if on_path("mmdebstrap").is_none() {
        return Err(
            "mmdebstrap is not installed (the Debian package `mmdebstrap`: apt-get install mmdebstrap)"
                .into(),
        );
    }
    let uid = rustix::process::geteuid();
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid.as_raw()))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_default();
    let mut missing = Vec::new();
    let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .is_ok_and(|s| s.trim() != "0")
        && std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
            .map_or(true, |s| s.trim() != "0");
    if !userns {
        missing.push("user namespaces".to_owned());
    }
    if on_path("newuidmap").is_none() || on_path("newgidmap").is_none() {
        missing.push("newuidmap and newgidmap (the package `uidmap`)".to_owned());
    }
    for file in ["/etc/subuid", "/etc/subgid"] {
        let listed = std::fs::read_to_string(file).is_ok_and(|s| {
            s.lines().any(|l| {
                l.split(':')
                    .next()
                    .is_some_and(|n| n == user || n == uid.as_raw().to_string())
            })
        });
        if !listed {
            missing.push(format!("a range for {user:?} in {file}"));
        }
    }
    if missing.is_empty() {
        return Ok(Mode {
            name: "unshare",
            why: "unprivileged, in a user namespace".into(),
        });
    }
    let missing = missing.join(", ");
    if uid.is_root() {
        Ok(Mode {
            name: "root",
            why: format!("as root (unshare mode needs {missing})"),
        })
    } else {
        Err(format!(
            "mmdebstrap cannot run here: its unshare mode needs {missing}, and this is not root"
        ))
    }
}

/// The longest line of mmdebstrap's output shown (longer ones are cut).
const MAX_LINE: u64 = 4096;

/// Runs mmdebstrap for `d` with its tar on a pipe and writes the single-layer OCI
/// image layout tar of it at `out`; each line mmdebstrap prints goes to `progress`.
/// Blocking (minutes: it downloads and installs packages).
pub fn debian_layout(
    d: &Debian,
    out: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Built, String> {
    let mode = mode()?;
    let started = Instant::now();
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--mode={}", mode.name))
        .arg("--variant=apt")
        .arg("--format=tar");
    if !d.packages.is_empty() {
        cmd.arg(format!("--include={}", d.packages.join(",")));
    }
    cmd.arg(&d.suite).arg("-");
    if let Some(m) = &d.mirror {
        cmd.arg(m);
    }
    progress(&format!(
        "mmdebstrap --mode={} ({}) {}",
        mode.name, mode.why, d.suite
    ));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start mmdebstrap: {e}"))?;
    let (stdout, stderr) = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => (o, e),
        _ => return Err("mmdebstrap: no pipes".into()),
    };
    let tail = std::sync::Mutex::new(std::collections::VecDeque::<String>::new());
    let converted = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut r = std::io::BufReader::new(stderr);
            loop {
                let mut line = Vec::new();
                match (&mut r).take(MAX_LINE).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                progress(&format!("mmdebstrap: {text}"));
                let mut t = tail
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if t.len() == 20 {
                    t.pop_front();
                }
                t.push_back(text);
            }
        });
        let spec = ImageSpec::debian(Some(space_proto::api::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        )));
        let r = rootfs::layout_from_rootfs(
            std::io::BufReader::with_capacity(256 << 10, stdout),
            &spec,
            out,
            LayoutFormat::Tar,
        );
        if r.is_err() {
            let _ = child.kill();
        }
        r
    });
    let status = child.wait().map_err(|e| format!("mmdebstrap: {e}"))?;
    let tail: Vec<String> = tail
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into();
    if !status.success() {
        let _ = std::fs::remove_file(out);
        return Err(format!(
            "mmdebstrap failed ({status}); its last lines:\n  {}",
            tail.join("\n  ")
        ));
    }
    let (layer, _) = converted.map_err(|e| {
        let _ = std::fs::remove_file(out);
        format!("the root filesystem mmdebstrap wrote: {e}")
    })?;
    Ok(Built {
        layer,
        mode,
        elapsed: started.elapsed(),
    })
}

/// The names of the build's templates: the steps' (`NAME:TAG-step<i>`, the base
/// first) and the final one.
fn step_names(name: &str, steps: usize) -> Result<(Vec<String>, String), String> {
    let r = space_image::TemplateRef::parse(name).map_err(|e| e.to_string())?;
    let names: Vec<String> = (0..steps)
        .map(|i| format!("{}:{}-step{i}", r.name, r.tag))
        .collect();
    for n in &names {
        space_image::TemplateRef::parse(n).map_err(|_| {
            format!(
                "the tag {:?} is too long for the names of --run steps",
                r.tag
            )
        })?;
    }
    Ok((names, r.to_string()))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `space template build`: prints progress on stderr; answers the template made.
pub async fn build(
    c: &Client,
    a: &BuildArgs,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<space_proto::api::templates::TemplateView, String> {
    let (mut steps, last) = step_names(&a.name, a.run.len())?;
    // The templates this build makes and removes once it is done.
    let mut made: Vec<String> = steps.clone();
    let mut view = match (&a.debian, &a.from) {
        (Some(suite), None) => {
            let first = steps.first().cloned().unwrap_or_else(|| last.clone());
            debian_base(c, a, suite, &first, sdk).await?
        }
        (None, Some(from)) if !a.run.is_empty() => {
            let base = c.template(from).await.map_err(sdk)?;
            steps[0] = format!("{}:{}", base.name, base.tag);
            made.remove(0);
            base
        }
        _ => return Err("a build takes --debian SUITE, or --from TEMPLATE with a --run".into()),
    };
    let mut failed = None;
    for (i, cmd) in a.run.iter().enumerate() {
        let current = steps[i].clone();
        let next = steps.get(i + 1).cloned().unwrap_or_else(|| last.clone());
        eprintln!("step {}/{}: {cmd}", i + 1, a.run.len());
        match run_step(c, &current, &next, cmd, a.step_timeout, sdk).await {
            Ok(v) => view = v,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        eprintln!(
            "  committed as {next}: {} layers ({})",
            view.layers, view.digest
        );
    }
    // The steps' templates go, the build failed or not (the final one shares
    // their layers).
    for n in made.iter().filter(|n| **n != last) {
        match c.remove_template(n).await {
            Ok(()) => {}
            Err(e) if e.status() == Some(hyper::StatusCode::NOT_FOUND) => {}
            Err(e) => eprintln!("  (could not remove the step template {n}: {})", sdk(e)),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(view),
    }
}

/// The Debian base of a build, imported as `name`.
async fn debian_base(
    c: &Client,
    a: &BuildArgs,
    suite: &str,
    name: &str,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<space_proto::api::templates::TemplateView, String> {
    let work = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let layout = work.path().join("image.tar");
    let debian = Debian {
        suite: suite.to_owned(),
        packages: a.packages.clone(),
        mirror: a.mirror.clone(),
    };
    let out = layout.clone();
    let built = tokio::task::spawn_blocking(move || {
        debian_layout(&debian, &out, &|line| eprintln!("  {line}"))
    })
    .await
    .map_err(|e| e.to_string())??;
    eprintln!(
        "built {} in {:.0} s with mmdebstrap --mode={}: one layer, {} ({} entries, {} device nodes left out)",
        suite,
        built.elapsed.as_secs_f64(),
        built.mode.name,
        mib(built.layer.size),
        built.layer.entries,
        built.layer.skipped
    );
    let view = c.import_template(name, &layout).await.map_err(sdk)?;
    eprintln!("imported {name} ({})", view.digest);
    Ok(view)
}

/// One `--run` step: a sandbox of `current`, `sh -c CMD` in it (its output shown; a
/// non-zero exit fails the build), its changes committed as `next`.
async fn run_step(
    c: &Client,
    current: &str,
    next: &str,
    cmd: &str,
    timeout: u64,
    sdk: &dyn Fn(space_client::Error) -> String,
) -> Result<space_proto::api::templates::TemplateView, String> {
    let req = CreateSandbox {
        template: Some(current.to_owned()),
        ..Default::default()
    };
    let s = c.create_sandbox(&req).await.map_err(sdk)?;
    let result = async {
        let mut exec = space_client::exec(["sh", "-c", cmd]);
        exec.timeout_secs = Some(timeout);
        let r = c.exec(&s.id, &exec).await.map_err(sdk)?;
        for (stream, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            for line in text.lines() {
                eprintln!("  {stream}: {line}");
            }
        }
        if r.timed_out {
            return Err(format!("the step {cmd:?} timed out after {timeout} s"));
        }
        if r.exit_code != 0 || r.signal.is_some() {
            let how = r.signal.map_or_else(
                || format!("exit {}", r.exit_code),
                |s| format!("killed by signal {s}"),
            );
            return Err(format!(
                "the step {cmd:?} failed ({how}); nothing was committed"
            ));
        }
        c.commit_sandbox(&s.id, next).await.map_err(sdk)
    }
    .await;
    if let Err(e) = c.delete_sandbox(&s.id).await {
        eprintln!(
            "  (could not remove the step's sandbox {}: {})",
            s.id,
            sdk(e)
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_of_a_build_are_named_after_its_tag() {
        let (steps, last) = step_names("py", 2).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(steps, ["py:latest-step0", "py:latest-step1"]);
        assert_eq!(last, "py:latest");
        let (steps, last) = step_names("py:3", 0).unwrap_or_else(|e| panic!("{e}"));
        assert!(steps.is_empty());
        assert_eq!(last, "py:3");
        let long = format!("py:{}", "t".repeat(126));
        let e = step_names(&long, 1).map(|_| ());
        assert!(matches!(&e, Err(m) if m.contains("too long")), "{e:?}");
        assert!(step_names("Py", 0).is_err());
    }
}
