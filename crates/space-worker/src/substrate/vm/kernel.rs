//! The guest kernel: Debian's (the `cloud` flavour, made for VMs), taken from its
//! package without installing it on the host (`dpkg-deb -x` into a temporary
//! directory), kept in the worker's data directory with the modules a guest loads.
//!
//! Layout of `<dir>`: `vmlinuz`, `release` (the kernel's release string),
//! `modules/<name>.ko` for every name of [`vm::GUEST_MODULES`] and
//! [`vm::VSOCK_MODULES`] and every module they
//! depend on (read from each module's `depends=`, as the package ships no
//! `modules.dep`), and `modules/order`: their names, dependencies first.

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
    let order = std::fs::read_to_string(dir.join("modules").join(ORDER))
        .map_err(|_| missing("modules/order"))?;
    let mut modules = Vec::new();
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = dir.join("modules").join(format!("{name}.ko"));
        if !plain_name(name) || !path.is_file() {
            return Err(missing(&format!("module {name}")));
        }
        modules.push((name.to_owned(), path));
    }
    for name in vm::GUEST_MODULES {
        if !modules.iter().any(|(n, _)| n == name) {
            return Err(missing(&format!("module {name}")));
        }
    }
    Ok(GuestKernel {
        vmlinuz,
        release,
        modules,
    })
}

/// Whether `kernel` carries the vsock modules ([`vm::VSOCK_MODULES`]) a Firecracker
/// guest needs, or what to do about it.
pub fn has_vsock_modules(kernel: &GuestKernel) -> Result<(), String> {
    for name in vm::VSOCK_MODULES {
        if !kernel.modules.iter().any(|(n, _)| n == name) {
            return Err(format!(
                "the guest kernel has no module {name} (prepared before vsock was \
                 added): run `space vm setup` again"
            ));
        }
    }
    Ok(())
}

/// Prepares the kernel in `dir` from the Debian package file `deb`, or (without one)
/// from [`KERNEL_PACKAGE`]'s kernel fetched with `apt-get download`. `progress` hears
/// each step. Done once: a prepared `dir` is returned as it is.
pub fn setup(
    dir: &Path,
    deb: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<GuestKernel, String> {
    // Ready only with the vsock modules as well (a directory prepared before they
    // were added is made again).
    if let Ok(k) = load(dir).and_then(|k| has_vsock_modules(&k).map(|()| k)) {
        progress(&format!(
            "guest kernel {} ready in {}",
            k.release,
            dir.display()
        ));
        return Ok(k);
    }
    // A directory of an earlier layout (or a half-removed one) is ours to replace.
    if dir.exists() {
        progress(&format!(
            "replacing the incomplete kernel in {}",
            dir.display()
        ));
        crate::substrate::tree::remove_tree(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let parent = dir
        .parent()
        .ok_or_else(|| format!("{} has no parent", dir.display()))?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    // Per setup, also within one process (tests prepare it from several threads).
    static SETUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let work = WorkDir(parent.join(format!(
        ".kernel-{}-{}",
        std::process::id(),
        SETUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )));
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
    let mut depends = std::collections::BTreeMap::new();
    // The vsock modules too (Firecracker's transport, and QEMU's over vhost-vsock).
    let mut wanted: Vec<String> = vm::GUEST_MODULES
        .iter()
        .chain(vm::VSOCK_MODULES)
        .map(|m| (*m).to_owned())
        .collect();
    while let Some(name) = wanted.pop() {
        if depends.contains_key(&name) {
            continue;
        }
        if depends.len() >= MAX_MODULES || !plain_name(&name) {
            return Err(format!(
                "the guest modules' dependencies do not end (at {name})"
            ));
        }
        let found = find_module(&modules_root, &name)
            .ok_or_else(|| format!("the package has no module {name}.ko"))?;
        let bytes = std::fs::read(&found).map_err(|e| e.to_string())?;
        let deps = modinfo_depends(&bytes);
        wanted.extend(deps.iter().cloned());
        depends.insert(name.clone(), deps);
        std::fs::write(out.join("modules").join(format!("{name}.ko")), &bytes)
            .map_err(|e| e.to_string())?;
    }
    let order = load_order(&depends)?;
    std::fs::write(out.join("modules").join(ORDER), order.join("\n") + "\n")
        .map_err(|e| e.to_string())?;
    progress(&format!(
        "guest modules, in load order: {}",
        order.join(" ")
    ));
    std::fs::write(out.join("release"), format!("{release}\n")).map_err(|e| e.to_string())?;
    // Into place in one step: a half-prepared kernel is never taken for one. Another
    // setup of the same directory may have finished first: its kernel is as good.
    if let Err(e) = std::fs::rename(&out, dir) {
        return load(dir).map_err(|_| format!("{}: {e}", dir.display()));
    }
    progress(&format!(
        "guest kernel {release} ready in {}",
        dir.display()
    ));
    load(dir)
}

/// The file naming the modules in load order.
const ORDER: &str = "order";
/// Most modules a guest loads (its list and their dependencies).
const MAX_MODULES: usize = 64;

/// A module name as a file name: `[A-Za-z0-9_-]`, 1 to 64 of them.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The modules a module's `.modinfo` says it needs (`depends=a,b`), from its bytes.
pub fn modinfo_depends(module: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = module.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let rest = &module[at + KEY.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `depends` (each module's dependencies) ordered so that every module comes after
/// what it needs; a cycle is an error.
pub fn load_order(
    depends: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<Vec<String>, String> {
    let mut order: Vec<String> = Vec::new();
    while order.len() < depends.len() {
        let next = depends.iter().find(|(name, deps)| {
            !order.contains(name)
                && deps
                    .iter()
                    .all(|d| order.contains(d) || !depends.contains_key(d))
        });
        match next {
            Some((name, _)) => order.push(name.clone()),
            None => return Err("the guest modules depend on each other in a cycle".into()),
        }
    }
    Ok(order)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_are_read_from_modinfo_and_loaded_first() {
        let module = b"\x7fELF junk\0license=GPL\0depends=virtio_ring,virtio\0name=virtio_blk\0";
        assert_eq!(modinfo_depends(module), ["virtio_ring", "virtio"]);
        assert!(modinfo_depends(b"\0depends=\0name=overlay\0").is_empty());
        assert!(modinfo_depends(b"no modinfo at all").is_empty());
        let mut deps = std::collections::BTreeMap::new();
        deps.insert(
            "virtio_blk".to_owned(),
            vec!["virtio".to_owned(), "virtio_ring".to_owned()],
        );
        deps.insert("virtio".to_owned(), vec!["virtio_ring".to_owned()]);
        deps.insert("virtio_ring".to_owned(), vec![]);
        assert_eq!(
            load_order(&deps).unwrap(),
            ["virtio_ring", "virtio", "virtio_blk"]
        );
        deps.insert("virtio_ring".to_owned(), vec!["virtio_blk".to_owned()]);
        assert!(load_order(&deps).is_err());
    }
}
