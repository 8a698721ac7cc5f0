//! Socket directories and paths that another user or a symlink cannot redirect.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::PeerError;

fn unsafe_path(path: &Path, why: &str) -> PeerError {
    PeerError::UnsafePath(format!("{}: {why}", path.display()))
}

/// Creates `dir` (mode 0700) if missing and checks that it is a real directory owned
/// by this process's effective uid with no access for group or others.
pub fn prepare_socket_dir(dir: &Path) -> Result<(), PeerError> {
    match fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(unsafe_path(dir, &e.to_string())),
    }
    check_socket_dir(dir)
}

fn check_socket_dir(dir: &Path) -> Result<(), PeerError> {
    let m = fs::symlink_metadata(dir).map_err(|e| unsafe_path(dir, &e.to_string()))?;
    if !m.file_type().is_dir() {
        return Err(unsafe_path(dir, "not a directory (or a symlink)"));
    }
    if m.uid() != rustix::process::geteuid().as_raw() {
        return Err(unsafe_path(dir, "owned by another user"));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(unsafe_path(dir, "accessible to group or others"));
    }
    Ok(())
}

/// Checks a socket path before connecting: its directory passes
/// [`prepare_socket_dir`]'s checks and the path itself is a socket, not a symlink.
pub fn check_socket_path(path: &Path) -> Result<(), PeerError> {
    let dir = path
        .parent()
        .ok_or_else(|| unsafe_path(path, "no parent directory"))?;
    check_socket_dir(dir)?;
    let m = fs::symlink_metadata(path).map_err(|e| unsafe_path(path, &e.to_string()))?;
    if m.file_type().is_symlink() {
        return Err(unsafe_path(path, "a symlink"));
    }
    if !m.file_type().is_socket() {
        return Err(unsafe_path(path, "not a socket"));
    }
    Ok(())
}

/// Binds a listener at `path` inside a checked socket directory, replacing a stale
/// socket file but never following or replacing anything else.
pub fn bind_listener(path: &Path) -> Result<UnixListener, PeerError> {
    let dir = path
        .parent()
        .ok_or_else(|| unsafe_path(path, "no parent directory"))?;
    prepare_socket_dir(dir)?;
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            fs::remove_file(path).map_err(|e| unsafe_path(path, &e.to_string()))?;
        }
        Ok(_) => return Err(unsafe_path(path, "exists and is not a socket")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(unsafe_path(path, &e.to_string())),
    }
    UnixListener::bind(path).map_err(|e| PeerError::sys("bind", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_dir_open_to_others_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        prepare_socket_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            check_socket_path(&dir.join("s")),
            Err(PeerError::UnsafePath(_))
        ));
    }

    #[test]
    fn symlink_at_the_socket_path_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        prepare_socket_dir(&dir).unwrap();
        let real = bind_listener(&dir.join("real")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        assert!(check_socket_path(&dir.join("real")).is_ok());
        assert!(matches!(
            check_socket_path(&dir.join("link")),
            Err(PeerError::UnsafePath(_))
        ));
        assert!(matches!(
            bind_listener(&dir.join("link")),
            Err(PeerError::UnsafePath(_))
        ));
        drop(real);
    }

    #[test]
    fn symlinked_socket_dir_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        prepare_socket_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, t.path().join("alias")).unwrap();
        assert!(matches!(
            prepare_socket_dir(&t.path().join("alias")),
            Err(PeerError::UnsafePath(_))
        ));
    }

    #[test]
    fn regular_file_at_the_socket_path_is_never_replaced() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        prepare_socket_dir(&dir).unwrap();
        fs::write(dir.join("s"), b"keep").unwrap();
        assert!(bind_listener(&dir.join("s")).is_err());
        assert_eq!(fs::read(dir.join("s")).unwrap(), b"keep");
    }
}
