//! One daemon per data directory: an exclusive, non-blocking `flock` on a lock file
//! in it, held for the life of the process.
//!
//! Two `space up` (or two workers) on one data directory would share keys, records
//! and sockets and take over each other's workers; the second start is refused at
//! once, before it writes anything, with a message naming the running one (its pid,
//! URL and age are written into the lock file by the holder). The kernel drops a
//! `flock` when its holder dies, however it dies: a lock file left by a killed
//! process locks nothing. The descriptor is close-on-exec, so the workers `space up`
//! starts do not inherit (and keep) the lock.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Largest holder record read back from a lock file (it is a few lines).
const MAX_RECORD: u64 = 4096;

/// A held lock on a data directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    what: String,
    started: u64,
}

impl DirLock {
    /// Locks `dir/name` for `what` (the daemon, for the holder record: "space up",
    /// "space worker w1"), or says who holds it. `dir` must exist (and be private:
    /// the caller checks it first). The file is opened without following a symlink,
    /// created 0600 if absent.
    pub fn acquire(dir: &Path, name: &str, what: &str) -> Result<Self, String> {
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| format!("lock file {}: {e}", path.display()))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                return Err(format!(
                    "another {} is using {} (lock file {}); stop it first",
                    describe_holder(&mut file),
                    dir.display(),
                    path.display()
                ));
            }
            Err(e) => return Err(format!("lock file {}: {e}", path.display())),
        }
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let lock = Self {
            file,
            path,
            what: what.to_owned(),
            started,
        };
        lock.record(None)?;
        Ok(lock)
    }

    /// Rewrites the holder record: this process, its start, and `url` once it listens.
    pub fn record(&self, url: Option<&str>) -> Result<(), String> {
        let mut text = format!(
            "what={}\npid={}\nstarted={}\n",
            self.what,
            std::process::id(),
            self.started
        );
        if let Some(u) = url {
            text.push_str(&format!("url={u}\n"));
        }
        let mut f = &self.file;
        f.set_len(0)
            .and_then(|()| f.rewind())
            .and_then(|()| f.write_all(text.as_bytes()))
            .map_err(|e| format!("lock file {}: {e}", self.path.display()))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// "`space up` (pid N, listening on URL, started 12 s ago)" from a holder's record;
/// what is missing (a holder that has not written it yet) is left out.
fn describe_holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.take(MAX_RECORD).read_to_string(&mut text);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let what = field("what").unwrap_or("process");
    let mut parts = Vec::new();
    if let Some(pid) = field("pid") {
        parts.push(format!("pid {pid}"));
    }
    if let Some(url) = field("url") {
        parts.push(format!("listening on {url}"));
    }
    if let Some(started) = field("started").and_then(|s| s.parse::<u64>().ok()) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        parts.push(format!("started {} s ago", now.saturating_sub(started)));
    }
    if parts.is_empty() {
        format!("`{what}`")
    } else {
        format!("`{what}` ({})", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "x.lock", "space up").unwrap();
        first.record(Some("http://127.0.0.1:1")).unwrap();
        let err = DirLock::acquire(dir.path(), "x.lock", "space up").unwrap_err();
        assert!(
            err.contains(&format!("pid {}", std::process::id()))
                && err.contains("listening on http://127.0.0.1:1")
                && err.contains("`space up`"),
            "{err}"
        );
        drop(first);
        DirLock::acquire(dir.path(), "x.lock", "space up").expect("free again once dropped");
    }

    #[test]
    fn a_lock_file_that_is_a_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("x.lock")).unwrap();
        assert!(DirLock::acquire(dir.path(), "x.lock", "space up").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn the_lock_descriptor_is_not_inherited_by_children() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path(), "x.lock", "space up").unwrap();
        let fd = lock.file.as_raw_fd();
        let flags = rustix::io::fcntl_getfd(&lock.file).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "fd {fd}");
    }
}
