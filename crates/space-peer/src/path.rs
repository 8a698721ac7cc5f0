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

/// Checks the path of a socket a VMM bound itself after dropping to its own uid
/// (Firecracker's hybrid vsock socket): the socket's directory is owned by this
/// process's effective uid or by `vmm_uid`, with no access for group or others, and
/// sits in a directory that passes [`prepare_socket_dir`]'s checks (so nobody but this
/// uid and the VMM's can reach or replace it); the path itself is a socket, not a
/// symlink.
pub fn check_vmm_socket_path(path: &Path, vmm_uid: u32) -> Result<(), PeerError> {
    let dir = path
        .parent()
        .ok_or_else(|| unsafe_path(path, "no parent directory"))?;
    let outer = dir
        .parent()
        .ok_or_else(|| unsafe_path(dir, "no parent directory"))?;
    check_socket_dir(outer)?;
    let m = fs::symlink_metadata(dir).map_err(|e| unsafe_path(dir, &e.to_string()))?;
    if !m.file_type().is_dir() {
        return Err(unsafe_path(dir, "not a directory (or a symlink)"));
    }
    if m.uid() != rustix::process::geteuid().as_raw() && m.uid() != vmm_uid {
        return Err(unsafe_path(dir, "owned by neither this uid nor the VMM's"));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(unsafe_path(dir, "accessible to group or others"));
    }
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

    #[test]
    fn a_vmm_socket_directory_of_another_uid_or_open_to_others_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let run = t.path().join("run");
        prepare_socket_dir(&run).unwrap();
        let vmm = run.join("fc-1");
        prepare_socket_dir(&vmm).unwrap();
        let sock = vmm.join("v.sock");
        let _l = UnixListener::bind(&sock).unwrap();
        let me = rustix::process::geteuid().as_raw();
        assert!(check_vmm_socket_path(&sock, me).is_ok());
        // Owned by this uid: fine whatever uid the VMM has.
        assert!(check_vmm_socket_path(&sock, me.wrapping_add(1)).is_ok());
        fs::set_permissions(&vmm, fs::Permissions::from_mode(0o750)).unwrap();
        assert!(check_vmm_socket_path(&sock, me).is_err());
        fs::set_permissions(&vmm, fs::Permissions::from_mode(0o700)).unwrap();
        // The outer directory open to others: refused.
        fs::set_permissions(&run, fs::Permissions::from_mode(0o711)).unwrap();
        assert!(check_vmm_socket_path(&sock, me).is_err());
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        // A symlink at the socket's place, or not a socket.
        std::os::unix::fs::symlink(&sock, vmm.join("link")).unwrap();
        assert!(check_vmm_socket_path(&vmm.join("link"), me).is_err());
        fs::write(vmm.join("file"), b"x").unwrap();
        assert!(check_vmm_socket_path(&vmm.join("file"), me).is_err());
    }
}
