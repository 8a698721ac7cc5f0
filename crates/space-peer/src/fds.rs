//! What a process holds open: its `/proc/PID/fd` links, each read with `readlink`
//! only (never followed), at most a bounded number of them.

use std::fs;
use std::path::Path;

use crate::PeerError;

/// Most descriptors of a process looked at: a process holding more is refused rather
/// than read without end.
pub const MAX_FDS: usize = 65_536;

/// Whether process `pid` holds a descriptor whose `/proc/PID/fd` link reads `want`,
/// looking at most at `max` of them (more: an error).
fn holds_link(pid: u32, want: &std::ffi::OsStr, max: usize) -> Result<bool, PeerError> {
    Ok(fd_linked_to(pid, want, max)?.is_some())
}

/// The first descriptor of process `pid` whose `/proc/PID/fd` link reads `want`,
/// looking at most at `max` of them (more: an error).
fn fd_linked_to(pid: u32, want: &std::ffi::OsStr, max: usize) -> Result<Option<u32>, PeerError> {
    let dir = fs::read_dir(format!("/proc/{pid}/fd")).map_err(|_| PeerError::NoSuchProcess(pid))?;
    for (seen, entry) in dir.enumerate() {
        if seen >= max {
            return Err(PeerError::Proc("fd: too many descriptors"));
        }
        let Ok(entry) = entry else { continue };
        if fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == want) {
            if let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                return Ok(Some(n));
            }
        }
    }
    Ok(None)
}

/// A descriptor of process `pid` whose link reads `file` (an absolute path: a device
/// such as `/dev/vhost-vsock`; a deleted file's reads `… (deleted)`), at most
/// [`MAX_FDS`] looked at.
pub fn fd_holding_file(pid: u32, file: &Path) -> Result<Option<u32>, PeerError> {
    fd_linked_to(pid, file.as_os_str(), MAX_FDS)
}

/// Whether process `pid` holds socket `inode` among its open files.
pub fn process_holds_socket(pid: u32, inode: u64) -> Result<bool, PeerError> {
    holds_link(pid, format!("socket:[{inode}]").as_ref(), MAX_FDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_holds_a_file_only_while_it_has_it_open() {
        let t = tempfile::tempdir().unwrap();
        let device = t.path().join("vhost-vsock");
        std::fs::write(&device, b"").unwrap();
        // A child with the file as its stdin holds it; one without does not.
        let mut holder = std::process::Command::new("sleep")
            .arg("5")
            .stdin(std::fs::File::open(&device).unwrap())
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(fd_holding_file(holder.id(), &device).unwrap().is_some());
        assert!(fd_holding_file(other.id(), &device).unwrap().is_none());
        // Another name of the same directory is not it.
        assert!(
            fd_holding_file(holder.id(), &t.path().join("vhost-net"))
                .unwrap()
                .is_none()
        );
        for c in [&mut holder, &mut other] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(
            fd_holding_file(holder.id(), &device),
            Err(PeerError::NoSuchProcess(holder.id()))
        );
    }

    #[test]
    fn a_process_with_more_descriptors_than_the_bound_is_refused() {
        let me = std::process::id();
        assert!(holds_link(me, "nothing".as_ref(), 1).is_err());
        assert!(!holds_link(me, "nothing".as_ref(), MAX_FDS).unwrap());
    }
}
