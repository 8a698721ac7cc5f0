//! The binaries a cross-process test runs, built in the profile of the running test
//! and never older than their sources.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The path of binary `name` of workspace package `package` (see [`workspace_bins`]).
pub fn workspace_bin(package: &str, name: &str) -> PathBuf {
    workspace_bins(&[(package, name)]).remove(0)
}

/// The paths of binaries `(package, name)` of the workspace, in the profile of the
/// running test:
///
/// - a binary of the package under test is the one cargo built for its integration
///   tests (cargo names that package in `CARGO_PKG_NAME` when it runs a test);
/// - every other one is built once per test process, all in one `cargo build` (a
///   no-op when it is up to date): a test never runs a binary older than the sources,
///   which the test's own build does not rebuild.
pub fn workspace_bins(bins: &[(&str, &str)]) -> Vec<PathBuf> {
    static BUILT: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());
    let profile_dir = profile_dir();
    let under_test = std::env::var("CARGO_PKG_NAME").ok();
    let paths: Vec<PathBuf> = bins
        .iter()
        .map(|(_, name)| profile_dir.join(name))
        .collect();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let missing: Vec<(&str, &str)> = bins
        .iter()
        .zip(&paths)
        .filter(|((package, name), path)| {
            let cargos = under_test.as_deref() == Some(*package) && path.exists();
            !cargos && !built.contains(&((*package).to_owned(), (*name).to_owned()))
        })
        .map(|(bin, _)| *bin)
        .collect();
    if !missing.is_empty() {
        build(&profile_dir, &missing);
        built.extend(
            missing
                .iter()
                .map(|(p, n)| ((*p).to_owned(), (*n).to_owned())),
        );
    }
    paths
}

/// `<target>/<profile>/`: the test executable lives in its `deps/`.
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable under <target>/<profile>/deps")
        .to_path_buf()
}

/// `cargo build` of `bins` into the target dir and profile of the running test.
fn build(profile_dir: &Path, bins: &[(&str, &str)]) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let target_dir = profile_dir.parent().expect("target dir above the profile");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir);
    match profile_dir.file_name().and_then(|p| p.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    for (package, name) in bins {
        cmd.args(["-p", package, "--bin", name]);
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "cargo build of {bins:?} failed");
}

/// The guest agent linked statically (what image templates need: it runs from the
/// image's root, without the host's loader and libraries), built once per test
/// process with the workspace's `cargo static-agent` alias into
/// `<target>/<host triple>/<profile>/spaced-guest`.
pub fn static_agent() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let profile_dir = profile_dir();
            let target_dir = profile_dir.parent().expect("target dir above the profile");
            let profile = profile_dir
                .file_name()
                .and_then(|p| p.to_str())
                .unwrap_or("debug")
                .to_owned();
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            // Run from the workspace so that its `.cargo/config.toml` (the alias) applies.
            cmd.current_dir(manifest.parent().expect("workspace dir"))
                .args(["static-agent", "--quiet", "--manifest-path"])
                .arg(&manifest)
                .arg("--target-dir")
                .arg(target_dir);
            if profile != "debug" {
                cmd.args(["--profile", &profile]);
            }
            let status = cmd.status().expect("run cargo static-agent");
            assert!(status.success(), "cargo static-agent failed");
            target_dir
                .join(STATIC_AGENT_TRIPLE)
                .join(&profile)
                .join("spaced-guest")
        })
        .clone()
}

/// The target triple of `.cargo/config.toml`'s `static-agent` alias.
pub const STATIC_AGENT_TRIPLE: &str = "x86_64-unknown-linux-gnu";
