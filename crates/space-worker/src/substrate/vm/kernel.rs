//! The guest kernel: Debian's (the `cloud` flavour, made for VMs), taken from its
//! package without installing it on the host (`dpkg-deb -x` into a temporary
//! directory), kept in the worker's data directory with the modules a guest loads.
//!
//! Layout of `<dir>`: `vmlinuz`, `release` (the kernel's release string) and
//! `modules/<name>.ko` for every name of [`vm::GUEST_MODULES`].

use std::path::{Path, PathBuf};
use std::process::Command;

use space_proto::vm;

/// The package whose dependency is the kernel image (Debian's VM flavour).
pub const KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";

/// A prepared guest kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestKernel {
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// Its release (`uname -r` in the guest).
    pub release: String,
    /// `(name, path)` of each module, in load order.
    pub modules: Vec<(String, PathBuf)>,
}

/// The kernel prepared in `dir`, or what is missing (and how to prepare it).
pub fn load(dir: &Path) -> Result<GuestKernel, String> {
    let missing = |what: &str| {
        format!(
            "no guest kernel in {} ({what}): run `space vm setup`",
            dir.display()
        )
    };
    let vmlinuz = dir.join("vmlinuz");
    if !vmlinuz.is_file() {
        return Err(missing("vmlinuz"));
    }
    let release = std::fs::read_to_string(dir.join("release"))
        .map_err(|_| missing("release"))?
        .trim()
        .to_owned();
    let mut modules = Vec::new();
    for name in vm::GUEST_MODULES {
        let path = dir.join("modules").join(format!("{name}.ko"));
        if !path.is_file() {
            return Err(missing(&format!("module {name}")));
        }
        modules.push(((*name).to_owned(), path));
    }
    Ok(GuestKernel {
        vmlinuz,
        release,
        modules,
    })
}

/// Prepares the kernel in `dir` from the Debian package file `deb`, or (without one)
/// from [`KERNEL_PACKAGE`]'s kernel fetched with `apt-get download`. `progress` hears
/// each step. Done once: a prepared `dir` is returned as it is.
pub fn setup(
    dir: &Path,
    deb: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<GuestKernel, String> {
    if let Ok(k) = load(dir) {
        progress(&format!(
            "guest kernel {} ready in {}",
            k.release,
            dir.display()
        ));
        return Ok(k);
    }
    let parent = dir
        .parent()
        .ok_or_else(|| format!("{} has no parent", dir.display()))?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let work = WorkDir(parent.join(format!(".kernel-{}", std::process::id())));
    let _ = crate::substrate::tree::remove_tree(work.path());
    std::fs::create_dir_all(work.path()).map_err(|e| format!("{}: {e}", work.path().display()))?;
    let deb = match deb {
        Some(d) => d.to_path_buf(),
        None => download(work.path(), progress)?,
    };
    progress(&format!("extracting {}", deb.display()));
    let tree = work.path().join("tree");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let boot = tree.join("boot");
    let image = std::fs::read_dir(&boot)
        .map_err(|e| format!("{}: {e}", boot.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("vmlinuz-"))
        .ok_or("the package holds no boot/vmlinuz-*")?;
    let release = image.trim_start_matches("vmlinuz-").to_owned();
    let out = work.path().join("kernel");
    std::fs::create_dir_all(out.join("modules")).map_err(|e| e.to_string())?;
    std::fs::copy(boot.join(&image), out.join("vmlinuz")).map_err(|e| e.to_string())?;
    let modules_root = tree.join("lib/modules").join(&release).join("kernel");
    for name in vm::GUEST_MODULES {
        let found = find_module(&modules_root, name)
            .ok_or_else(|| format!("the package has no module {name}.ko"))?;
        std::fs::copy(&found, out.join("modules").join(format!("{name}.ko")))
            .map_err(|e| e.to_string())?;
    }
    std::fs::write(out.join("release"), format!("{release}\n")).map_err(|e| e.to_string())?;
    // Into place in one step: a half-prepared kernel is never taken for one.
    std::fs::rename(&out, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    progress(&format!(
        "guest kernel {release} ready in {}",
        dir.display()
    ));
    load(dir)
}

/// A directory removed (with everything in it) when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = crate::substrate::tree::remove_tree(&self.0);
    }
}

/// `apt-get download` of the kernel image [`KERNEL_PACKAGE`] depends on, into `into`.
fn download(into: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf, String> {
    let depends = output(Command::new("apt-cache").args(["depends", KERNEL_PACKAGE]))?;
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| format!("apt-cache names no kernel image for {KERNEL_PACKAGE}"))?
        .to_owned();
    progress(&format!("downloading {package}"));
    run(Command::new("apt-get")
        .args(["download", "-q", &package])
        .current_dir(into))?;
    std::fs::read_dir(into)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
        })
        .ok_or_else(|| format!("apt-get download left no {package} package"))
}

fn find_module(root: &Path, name: &str) -> Option<PathBuf> {
    let want = format!("{name}.ko");
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() && e.file_name().to_string_lossy() == want {
                return Some(e.path());
            }
        }
    }
    None
}

fn run(cmd: &mut Command) -> Result<(), String> {
    output(cmd).map(drop)
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
