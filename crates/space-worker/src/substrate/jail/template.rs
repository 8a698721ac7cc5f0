//! The default template: the host's system directories, read-only.
//!
//! Copying `/usr` per data dir would cost seconds and gigabytes, so the template
//! is a tiny lower dir holding the skeleton (empty mount points, the host's
//! `/bin → usr/bin`-style links) plus a list of host directories the jail binds
//! read-only over it, and the host's CA certificates (`/etc/ssl/certs`). Nothing else
//! of the host (the rest of `/etc`, `/root`, `/home`, `/var`, the data dir) is in it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use space_jail::spec::{Accounts, BindMount};

use crate::substrate::SubstrateError;

/// Host system directories the default template takes: each is either bound
/// read-only (a directory) or recreated (a symlink such as `/bin → usr/bin`).
pub const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Empty directories of the skeleton, with their modes.
const SKELETON_DIRS: &[(&str, u32)] = &[
    ("etc", 0o755),
    ("proc", 0o555),
    ("dev", 0o755),
    ("tmp", 0o1777),
    ("root", 0o700),
    ("home", 0o755),
    ("run", 0o755),
    ("mnt", 0o755),
    ("var", 0o755),
    ("var/tmp", 0o1777),
];

/// A resolved template: the overlay's lower dirs and the binds over them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The overlay's read-only lower dirs, top first.
    pub lower_dirs: Vec<PathBuf>,
    /// Host directories bound read-only inside.
    pub read_only_binds: Vec<BindMount>,
    /// Directories of those binds hidden inside (under an empty read-only tmpfs).
    pub masked_dirs: Vec<PathBuf>,
    /// Whose accounts `/etc` keeps.
    pub accounts: Accounts,
}

/// Whether the executable at `path` is statically linked (an ELF without a
/// `PT_INTERP` program header): only such an agent runs in an image's root, whatever
/// loader and libraries the image has. Unreadable or not an ELF: `false`.
pub fn is_static(path: &Path) -> bool {
    let Ok(bytes) = read_head(path, 64 * 1024) else {
        return false;
    };
    elf_has_no_interpreter(&bytes).unwrap_or(false)
}

fn read_head(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    fs::File::open(path)?.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// `Some(true)` for a 64-bit little-endian ELF whose program headers (all within
/// `bytes`) hold no `PT_INTERP`; `None` if `bytes` is not such an ELF.
fn elf_has_no_interpreter(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    // ELFCLASS64, ELFDATA2LSB.
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    if phentsize < 4 {
        return None;
    }
    for i in 0..phnum {
        if u32_at(phoff.checked_add(i.checked_mul(phentsize)?)?)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// What the default template hides of the host's system directories: `/usr/local`
/// holds what the host's administrator installed (tools, credentials such as an
/// `npmrc`), not the distribution.
pub const MASKED_DIRS: &[&str] = &["/usr/local"];

/// What to do with each system directory of `host_root`.
enum Entry {
    Bind(PathBuf),
    Link(PathBuf),
}

fn system_entries(host_root: &Path) -> Vec<(&'static str, Entry)> {
    SYSTEM_DIRS
        .iter()
        .filter_map(|&name| {
            let path = host_root.join(name);
            let meta = fs::symlink_metadata(&path).ok()?;
            if meta.file_type().is_symlink() {
                fs::read_link(&path)
                    .ok()
                    .map(|target| (name, Entry::Link(target)))
            } else if meta.is_dir() {
                Some((name, Entry::Bind(path)))
            } else {
                None
            }
        })
        .collect()
}

/// The host's CA certificates, bound read-only where programs look for them (TLS
/// needs them once a sandbox has a network; the rest of `/etc` stays the host's).
pub const CA_DIR: &str = "etc/ssl/certs";

/// The binds the default template needs on this host (cheap: a few `lstat`s).
pub fn default_binds(host_root: &Path) -> Vec<BindMount> {
    let mut binds: Vec<BindMount> = system_entries(host_root)
        .into_iter()
        .filter_map(|(name, entry)| match entry {
            Entry::Bind(source) => Some(BindMount {
                source,
                target: Path::new("/").join(name),
            }),
            Entry::Link(_) => None,
        })
        .collect();
    let ca = host_root.join(CA_DIR);
    if fs::symlink_metadata(&ca).is_ok_and(|m| m.is_dir()) {
        binds.push(BindMount {
            source: ca,
            target: Path::new("/").join(CA_DIR),
        });
    }
    binds
}

/// Writes the skeleton for `host_root`'s layout into the (new, empty) `dest`.
pub fn write_skeleton(host_root: &Path, dest: &Path) -> io::Result<()> {
    for (name, entry) in system_entries(host_root) {
        match entry {
            Entry::Bind(_) => fs::DirBuilder::new().mode(0o755).create(dest.join(name))?,
            Entry::Link(target) => symlink(target, dest.join(name))?,
        }
    }
    for &(name, mode) in SKELETON_DIRS {
        let dir = dest.join(name);
        fs::DirBuilder::new().recursive(true).create(&dir)?;
        // Set explicitly: the umask would strip the sticky and write bits.
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Ensures `<data>/templates/default` exists and returns the default template.
///
/// Built into a private temporary directory and renamed into place, so that
/// concurrent launches never see a half-built skeleton.
pub fn ensure_default(data_dir: &Path) -> Result<Template, SubstrateError> {
    let host_root = Path::new("/");
    let templates = data_dir.join("templates");
    let lower_dir = templates.join("default");
    if !lower_dir.is_dir() {
        fs::create_dir_all(&templates)
            .map_err(|e| SubstrateError::io(format!("create {}", templates.display()), e))?;
        let unique = format!(
            ".default.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "");
        let staging = templates.join(unique);
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir(&staging)
            .and_then(|()| write_skeleton(host_root, &staging))
            .map_err(|e| SubstrateError::io("build default template", e))?;
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))
            .map_err(|e| SubstrateError::io("build default template", e))?;
        if fs::rename(&staging, &lower_dir).is_err() {
            // Another launch won the race; its skeleton is identical.
            let _ = fs::remove_dir_all(&staging);
        }
    }
    Ok(Template {
        lower_dirs: vec![lower_dir],
        read_only_binds: default_binds(host_root),
        masked_dirs: MASKED_DIRS.iter().map(PathBuf::from).collect(),
        accounts: Accounts::Synthesized,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_program_is_told_from_a_static_one() {
        // The test binary itself is dynamically linked (cargo's default).
        let me = std::env::current_exe().unwrap();
        assert!(!is_static(&me));
        assert!(!is_static(Path::new("/nonexistent")));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(!is_static(&script));
        // A minimal static ELF: the header and one PT_LOAD program header.
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(elf_has_no_interpreter(&elf), Some(true));
        // The same with its program header turned into PT_INTERP.
        elf[0x40..0x44].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(elf_has_no_interpreter(&elf), Some(false));
        // Program headers past the end: not an ELF this can judge.
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&9u16.to_le_bytes());
        assert_eq!(elf_has_no_interpreter(&elf), None);
    }

    #[test]
    fn skeleton_follows_the_hosts_symlink_layout_and_binds_only_real_dirs() {
        let host = tempfile::tempdir().unwrap();
        fs::create_dir_all(host.path().join("usr/bin")).unwrap();
        fs::create_dir_all(host.path().join("lib64")).unwrap();
        symlink("usr/bin", host.path().join("bin")).unwrap();
        fs::create_dir_all(host.path().join("etc")).unwrap();
        fs::write(host.path().join("etc/shadow"), "root:secret").unwrap();
        fs::create_dir_all(host.path().join("root")).unwrap();

        let dest = tempfile::tempdir().unwrap();
        write_skeleton(host.path(), dest.path()).unwrap();
        assert_eq!(
            fs::read_link(dest.path().join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert!(dest.path().join("usr").is_dir());
        assert_eq!(fs::read_dir(dest.path().join("usr")).unwrap().count(), 0);
        assert!(!dest.path().join("etc/shadow").exists());
        assert_eq!(fs::read_dir(dest.path().join("root")).unwrap().count(), 0);
        let tmp_mode = fs::metadata(dest.path().join("tmp"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(tmp_mode & 0o7777, 0o1777);

        let binds = default_binds(host.path());
        let targets: Vec<_> = binds.iter().map(|b| b.target.clone()).collect();
        assert_eq!(targets, [PathBuf::from("/usr"), PathBuf::from("/lib64")]);
    }
}
