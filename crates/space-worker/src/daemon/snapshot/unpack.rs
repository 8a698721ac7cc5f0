//! Unpacking a layer into a new directory: plain names only, nothing followed,
//! nothing but directories, files, symlinks and whiteouts.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::WHITEOUT_KEY;

/// An error about an archive entry that is refused.
fn refused_entry(rel: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "archive entry {:?} refused: {why}",
            rel.display().to_string()
        ),
    )
}

/// `rel` as a path under `dest` whose every component is a plain name, whose parents
/// are real directories under `dest` (created if missing, never through a symlink),
/// and which does not exist yet — unless `dir_ok` and it is a real directory.
///
/// `real_dirs` holds the directories this unpack already checked or made: nothing
/// else changes `dest` meanwhile and no entry may replace one, so each is checked
/// once (a deep layer costs one check per directory, not one per entry and level).
fn place(
    dest: &Path,
    rel: &Path,
    dir_ok: bool,
    real_dirs: &mut std::collections::HashSet<PathBuf>,
) -> io::Result<PathBuf> {
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(refused_entry(
                rel,
                "absolute paths and `.`/`..` components leave the layer",
            )),
        })
        .collect::<io::Result<_>>()?;
    let Some((last, parents)) = names.split_last() else {
        return Err(refused_entry(rel, "empty path"));
    };
    let mut at = dest.to_path_buf();
    // A directory is recorded only once all its parents were: when the entry's
    // parent is known, so are the others.
    let parent_known = real_dirs.contains(&dest.join(parents.iter().collect::<PathBuf>()));
    for name in parents {
        at.push(name);
        if parent_known || real_dirs.contains(&at) {
            continue;
        }
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(refused_entry(
                    rel,
                    "a parent is not a directory (never followed)",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
        real_dirs.insert(at.clone());
    }
    at.push(last);
    match fs::symlink_metadata(&at) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(at),
        Ok(m) if dir_ok && m.file_type().is_dir() => Ok(at),
        Ok(_) => Err(refused_entry(rel, "a second entry for the same path")),
        Err(e) => Err(e),
    }
}

/// Unpacks an archive made by [`pack`] into `dest`, which must not exist: a new
/// directory is filled, so nothing outside it can be touched. The archive's contents
/// are the sandbox's, so only directories, regular files, symlinks and whiteouts are
/// accepted (no hard links, devices, FIFOs or sparse entries), every path must be
/// made of plain names, and no symlink is followed: an entry below a symlink an
/// earlier entry made, or over an existing path, is refused.
pub fn unpack<R: Read>(archive: R, dest: &Path) -> io::Result<()> {
    unpack_tree(archive, dest, false)
}

/// [`unpack`], also accepting files with holes ([`super::sparse`]; what
/// [`super::pack_to_temp_keeping_holes`] makes, for a VM's snapshot): written at their
/// extents, holes kept.
pub fn unpack_keeping_holes<R: Read>(archive: R, dest: &Path) -> io::Result<()> {
    unpack_tree(archive, dest, true)
}

fn unpack_tree<R: Read>(archive: R, dest: &Path, keep_holes: bool) -> io::Result<()> {
    fs::create_dir(dest)?;
    let mut real_dirs = std::collections::HashSet::new();
    let mut a = tar::Archive::new(archive);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_preserve_mtime(true);
    a.set_overwrite(false);
    for entry in a.entries()? {
        let mut entry = entry?;
        let mut whiteout = false;
        let mut sparse: Option<Vec<u8>> = None;
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        for x in entry.pax_extensions()?.into_iter().flatten() {
            // Our own archives hold well-formed records only: one that does not parse
            // is a damaged archive, refused rather than read without what it held
            // (an opaque mark lost would bring a lower dir's files back).
            let x = x.map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a malformed extended header in the layer archive: {e}"),
                )
            })?;
            if x.key_bytes() == WHITEOUT_KEY.as_bytes() {
                whiteout = true;
            } else if x.key_bytes() == super::sparse::SPARSE_KEY.as_bytes() {
                sparse = Some(x.value_bytes().to_vec());
            } else if let Some(name) = x.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                if name.starts_with("trusted.overlay.") {
                    xattrs.push((name.to_owned(), x.value_bytes().to_vec()));
                }
            }
        }
        let rel = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        if let Some(map) = sparse {
            if !keep_holes {
                return Err(refused_entry(&rel, "sparse entries are refused here"));
            }
            if kind != tar::EntryType::Regular || whiteout {
                return Err(refused_entry(&rel, "only a regular file can have holes"));
            }
            let (real, extents) = super::sparse::decode_map(&map, entry.size())?;
            let at = place(dest, &rel, false, &mut real_dirs)?;
            let (mode, uid, gid, mtime) = {
                let h = entry.header();
                (h.mode()?, h.uid()?, h.gid()?, h.mtime()?)
            };
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&at)?;
            super::sparse::write_extents(&mut entry, &file, real, &extents)?;
            std::os::unix::fs::fchown(&file, u32::try_from(uid).ok(), u32::try_from(gid).ok())?;
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))?;
            file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime))?;
            continue;
        }
        if whiteout {
            if kind != tar::EntryType::Regular || entry.size() != 0 {
                return Err(refused_entry(&rel, "a whiteout holds no data"));
            }
            let at = place(dest, &rel, false, &mut real_dirs)?;
            nix::sys::stat::mknod(
                &at,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::empty(),
                0,
            )
            .map_err(io::Error::from)?;
            continue;
        }
        let at = match kind {
            tar::EntryType::Directory => place(dest, &rel, true, &mut real_dirs)?,
            tar::EntryType::Regular | tar::EntryType::Symlink => {
                place(dest, &rel, false, &mut real_dirs)?
            }
            tar::EntryType::Link => return Err(refused_entry(&rel, "hard links are refused")),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refused_entry(
                    &rel,
                    "device nodes other than whiteouts are refused",
                ));
            }
            other => {
                return Err(refused_entry(
                    &rel,
                    &format!("entries of type {other:?} are refused"),
                ));
            }
        };
        // `place` made sure `at` is new (or a real directory) under real directories;
        // tar creates files with O_EXCL and symlinks without following anything.
        entry.unpack(&at)?;
        if kind == tar::EntryType::Directory {
            real_dirs.insert(at.clone());
        }
        for (name, value) in xattrs {
            rustix::fs::lsetxattr(
                at.as_path(),
                name.as_str(),
                &value,
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(io::Error::from)?;
        }
    }
    Ok(())
}
