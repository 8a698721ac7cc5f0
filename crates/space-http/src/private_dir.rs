//! Data directories that hold secrets (the trust-anchor and signing-key seeds, the
//! enrollment secret, API keys, worker credentials, activation secrets, tenants' files):
//! created 0700, and refused when anyone but their owner can read or write them.
//!
//! Nothing is ever loosened or tightened silently: a directory or secret file that
//! group or others can reach means someone else may already have read it, so the
//! daemon stops with a message naming the path and the fix.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// The umask every daemon sets first: files and directories it (and SQLite, for the
/// `-wal`, `-shm` and `-journal` files it creates itself) makes are its owner's only,
/// from the first byte.
pub const DAEMON_UMASK: u32 = 0o077;

/// Sets the process umask to [`DAEMON_UMASK`]; returns the previous one.
pub fn restrict_umask() -> u32 {
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(DAEMON_UMASK)).bits()
}

/// Creates `dir` (and missing parents) with mode 0700 if absent, then checks it with
/// [`check_private_dir`].
pub fn ensure_private_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    check_private_dir(dir)
}

/// Refuses a directory that is not a directory, not owned by this process's user, or
/// that group or others may read, write or enter.
pub fn check_private_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "data directory {} is not a directory (a symlink or a file)",
            dir.display()
        ));
    }
    check_owner(dir, &meta)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "data directory {} is open to group or others (mode {mode:04o}); it holds \
             secrets and must be its owner's only: run `chmod 700 {}`",
            dir.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Refuses a secret file that exists and that group or others may read or write, or
/// that another user owns. An absent file is fine (it will be created 0600).
pub fn check_secret_file(path: &Path) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if !meta.is_file() {
        return Err(format!(
            "secret file {} is not a regular file (a symlink or a directory)",
            path.display()
        ));
    }
    check_owner(path, &meta)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "secret file {} is open to group or others (mode {mode:04o}): run `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// [`check_secret_file`] for a SQLite database and the files SQLite keeps beside it.
pub fn check_database_files(db: &Path) -> Result<(), String> {
    check_secret_file(db)?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        check_secret_file(Path::new(&name))?;
    }
    Ok(())
}

fn check_owner(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "{} is owned by uid {}, not by this process's uid {me}: it holds secrets only \
             its owner may read (run `chown {me} {}`)",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_created_0700_and_a_world_readable_one_is_refused_by_name() {
        let t = tempfile_dir();
        let dir = t.join("data/inner");
        ensure_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&dir).unwrap_err();
        assert!(e.contains(&dir.display().to_string()), "{e}");
        assert!(e.contains("chmod 700"), "{e}");
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn a_group_readable_database_or_wal_is_refused_and_an_absent_one_is_fine() {
        let t = tempfile_dir();
        let db = t.join("control.db");
        check_database_files(&db).unwrap();
        std::fs::write(&db, b"").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
        check_database_files(&db).unwrap();
        let wal = t.join("control.db-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = check_database_files(&db).unwrap_err();
        assert!(
            e.contains("control.db-wal") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::remove_dir_all(&t).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!(
            "space-private-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}
