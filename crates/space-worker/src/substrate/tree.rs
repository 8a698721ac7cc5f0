//! Removing a directory tree the sandbox shaped, however deep it nests.
//!
//! A sandbox can nest directories without limit (`mkdir a; cd a` in a loop): the
//! standard library's `remove_dir_all` recurses once per level and overflows a
//! thread's stack (2 MiB on a runtime's blocking threads) at some ten thousand levels,
//! which aborts the whole worker. [`remove_tree`] walks iteratively with one open
//! directory at a time, goes back up through `..`, and never follows a link: entries
//! are removed with `unlinkat`, directories opened `O_NOFOLLOW`. Nothing of the
//! sandbox should run while its tree is removed; should something still move a
//! directory of it elsewhere during the walk (`fc/a/b` renamed into `/var/tmp`), every
//! `..` is checked to be the directory the walk came down from (device and inode), and
//! the walk stops instead of climbing into another tree.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

fn open_dir<Fd: std::os::fd::AsFd>(at: Fd, name: &CString) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        name.as_c_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn dev_ino(dir: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(dir)?;
    Ok((st.st_dev, st.st_ino))
}

/// Removes what `dir` holds except directories; returns the name of one directory
/// left in it, if any.
fn clear_files(dir: &OwnedFd) -> io::Result<Option<CString>> {
    // A fresh open file description: listing restarts from the beginning.
    let listing = open_dir(dir, &CString::from(c"."))?;
    let entries = rustix::fs::Dir::read_from(&listing)?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))?,
            kind => kind,
        };
        if kind == FileType::Directory {
            return Ok(Some(name.to_owned()));
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// Removes `path` and everything below it (nothing if it does not exist; a link or
/// file at `path` itself is unlinked, never followed).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    remove_tree_with(path, |_| {})
}

/// [`remove_tree`], calling `descended` with the depth after each step down (the
/// tests move directories there, as a live process could).
fn remove_tree_with(path: &Path, mut descended: impl FnMut(usize)) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return fs::remove_file(path),
        Ok(_) => {}
    }
    let top = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    let mut current = open_dir(rustix::fs::CWD, &top)?;
    // The names from `path` down to `current`, each with the directory it is in.
    let mut below: Vec<(CString, (u64, u64))> = Vec::new();
    loop {
        if let Some(sub) = clear_files(&current)? {
            let here = dev_ino(&current)?;
            current = open_dir(&current, &sub)?;
            below.push((sub, here));
            descended(below.len());
            continue;
        }
        let Some((name, came_from)) = below.pop() else {
            break;
        };
        let parent = open_dir(&current, &CString::from(c".."))?;
        if dev_ino(&parent)? != came_from {
            return Err(io::Error::other(
                "a directory of the tree was moved during its removal: stopped",
            ));
        }
        drop(current);
        rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::REMOVEDIR)?;
        current = parent;
    }
    drop(current);
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Rootless jails leave directories that only root inside could enter (overlayfs's
/// `work/work` is mode 000); they belong to this user, so it can open them up.
pub(crate) fn make_removable(dir: &Path) {
    // Iterative: the tree is the sandbox's and may nest deeper than a stack allows
    // (a path past PATH_MAX just stops the walk there).
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(meta) = fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        if meta.permissions().mode() & 0o700 != 0o700 {
            let _ = fs::set_permissions(
                &dir,
                fs::Permissions::from_mode(meta.permissions().mode() | 0o700),
            );
        }
        if let Ok(entries) = fs::read_dir(&dir) {
            todo.extend(entries.flatten().map(|e| e.path()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Makes `depth` nested directories `d/d/d/…` below `root` (relative to
    /// descriptors: the path would be longer than `PATH_MAX`), a file in the deepest.
    fn nest(root: &Path, depth: usize) {
        let mut dir = open_dir(
            rustix::fs::CWD,
            &CString::new(root.as_os_str().as_bytes()).unwrap(),
        )
        .unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).unwrap();
            dir = open_dir(&dir, &CString::from(c"d")).unwrap();
        }
        let f = rustix::fs::openat(
            &dir,
            c"leaf",
            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        drop(f);
    }

    #[test]
    fn a_tree_nested_far_deeper_than_a_stack_allows_is_removed_on_a_small_stack() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("layer");
        fs::create_dir(&root).unwrap();
        nest(&root, 30_000);
        // The blocking threads of a runtime have 2 MiB stacks; std's recursive
        // remove_dir_all overflows one at some 15,000 levels.
        let removed = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn({
                let root = root.clone();
                move || remove_tree(&root)
            })
            .unwrap()
            .join()
            .unwrap();
        removed.unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_directory_moved_out_of_the_tree_during_the_walk_stops_it_outside_untouched() {
        // What a live VMM could do to its tree while it is removed: `fc/a/b` renamed
        // into another directory (`/var/tmp`, same filesystem) once the walk is below
        // it. Climbing `..` from there would reach that directory and clear it.
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("var-tmp");
        fs::create_dir_all(outside.join("keep")).unwrap();
        fs::write(outside.join("keep/file"), "host").unwrap();
        let root = t.path().join("fc");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        let err = remove_tree_with(&root, |depth| {
            if depth == 3 {
                fs::rename(root.join("a/b"), outside.join("b")).unwrap();
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("moved"), "{err}");
        assert_eq!(
            fs::read_to_string(outside.join("keep/file")).unwrap(),
            "host"
        );
        assert!(root.join("a").exists());
    }

    #[test]
    fn links_in_the_tree_are_removed_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir_all(outside.join("keep")).unwrap();
        fs::write(outside.join("keep/file"), "host").unwrap();
        let root = t.path().join("layer");
        fs::create_dir_all(root.join("a/b")).unwrap();
        symlink(&outside, root.join("a/to-dir")).unwrap();
        symlink(outside.join("keep/file"), root.join("a/b/to-file")).unwrap();
        fs::write(root.join("a/b/own"), "mine").unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(
            fs::read_to_string(outside.join("keep/file")).unwrap(),
            "host"
        );
        // A link at the top itself is unlinked, not followed.
        symlink(&outside, t.path().join("top-link")).unwrap();
        remove_tree(&t.path().join("top-link")).unwrap();
        assert!(outside.join("keep/file").exists());
        remove_tree(&t.path().join("absent")).unwrap();
    }
}
