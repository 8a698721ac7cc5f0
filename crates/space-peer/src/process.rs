//! The identity of a process: PID, start time, executable (device + inode of the file
//! it runs, not its path), effective uid/gid, and — where the kernel has pidfs — the
//! pidfd inode, which no other process will ever have.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use crate::PeerError;

/// Device and inode of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The file a path names (following symlinks).
    pub fn of_path(path: &std::path::Path) -> std::io::Result<Self> {
        let m = fs::metadata(path)?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// What a worker records about a process it launched, and what it compares a peer
/// against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProcessIdentity {
    /// PID in the reader's PID namespace.
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22): with the PID it
    /// tells a process from a later one that reused the PID.
    pub start_time: u64,
    /// The executable file.
    pub exe: FileId,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Inode of a pidfd for the process on pidfs (Linux ≥ 6.9): unique for the boot.
    pub pidfs_ino: Option<u64>,
}

/// A process that was alive when its identity was read, with a pidfd that keeps
/// naming it (never a later process with the same PID).
#[derive(Debug)]
pub struct LiveProcess {
    /// Its identity.
    pub identity: ProcessIdentity,
    /// A pidfd for it.
    pub pidfd: OwnedFd,
}

const PIDFS_MAGIC: i64 = 0x5049_4446;

impl LiveProcess {
    /// Reads the identity of `pid`. The pidfd is opened first and checked for liveness
    /// after reading `/proc`, so what was read belongs to the process the pidfd names.
    pub fn open(pid: u32) -> Result<Self, PeerError> {
        let raw = i32::try_from(pid).map_err(|_| PeerError::NoSuchProcess(pid))?;
        let p = Pid::from_raw(raw).ok_or(PeerError::NoSuchProcess(pid))?;
        let pidfd =
            pidfd_open(p, PidfdFlags::empty()).map_err(|_| PeerError::NoSuchProcess(pid))?;
        Self::with_pidfd(pid, pidfd)
    }

    /// Like [`LiveProcess::open`] with a pidfd obtained elsewhere (e.g. `SO_PEERPIDFD`).
    pub fn with_pidfd(pid: u32, pidfd: OwnedFd) -> Result<Self, PeerError> {
        let identity = read_identity(pid, &pidfd)?;
        if !is_alive(&pidfd) {
            return Err(PeerError::NoSuchProcess(pid));
        }
        Ok(Self { identity, pidfd })
    }

    /// Whether the process is still running.
    pub fn is_alive(&self) -> bool {
        is_alive(&self.pidfd)
    }

    /// A duplicate of the process's descriptor `fd` — the same open file, not the file
    /// opened again (`pidfd_getfd`: needs the right to ptrace it) — and only if that
    /// open file is `file` (its device and inode, by `fstat` of the duplicate against
    /// `stat` of the path): what `/proc/PID/fd` showed by name is checked by identity.
    pub fn take_fd_of(&self, fd: u32, file: &std::path::Path) -> Result<OwnedFd, PeerError> {
        let fd = i32::try_from(fd).map_err(|_| PeerError::Proc("fd: out of range"))?;
        let got = rustix::process::pidfd_getfd(
            &self.pidfd,
            fd,
            rustix::process::PidfdGetfdFlags::empty(),
        )
        .map_err(|_| PeerError::Proc("pidfd_getfd refused"))?;
        let held = rustix::fs::fstat(&got).map_err(|_| PeerError::Proc("fstat"))?;
        let named = rustix::fs::stat(file).map_err(|_| PeerError::Proc("stat"))?;
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino) {
            return Err(PeerError::NotHeld(
                "the descriptor is another file than it is named",
            ));
        }
        Ok(got)
    }
}

/// A pidfd becomes readable when its process exits.
fn is_alive(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(0))
}

fn read_identity(pid: u32, pidfd: &OwnedFd) -> Result<ProcessIdentity, PeerError> {
    let proc = format!("/proc/{pid}");
    let gone = |_| PeerError::NoSuchProcess(pid);
    let stat = fs::read_to_string(format!("{proc}/stat")).map_err(gone)?;
    let start_time = parse_start_time(&stat).ok_or(PeerError::Proc("stat"))?;
    let status = fs::read_to_string(format!("{proc}/status")).map_err(gone)?;
    let uid = parse_status_id(&status, "Uid:").ok_or(PeerError::Proc("status"))?;
    let gid = parse_status_id(&status, "Gid:").ok_or(PeerError::Proc("status"))?;
    let exe = FileId::of_path(std::path::Path::new(&format!("{proc}/exe"))).map_err(gone)?;
    Ok(ProcessIdentity {
        pid,
        start_time,
        exe,
        uid,
        gid,
        pidfs_ino: pidfs_inode(pidfd),
    })
}

fn pidfs_inode(pidfd: &OwnedFd) -> Option<u64> {
    let fs = rustix::fs::fstatfs(pidfd.as_fd()).ok()?;
    if fs.f_type != PIDFS_MAGIC {
        return None;
    }
    rustix::fs::fstat(pidfd.as_fd()).ok().map(|s| s.st_ino)
}

/// Field 22 of `/proc/PID/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after the *last* `)`.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; field 22 is the 20th.
    after.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The effective ID (second column) of a `Uid:` or `Gid:` line.
fn parse_status_id(status: &str, key: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

impl ProcessIdentity {
    /// Compares `self` (what was recorded) with `actual` (what a socket's peer is).
    /// The first differing property is named in the error.
    pub fn verify(&self, actual: &ProcessIdentity) -> Result<(), PeerError> {
        let mismatch = |what| Err(PeerError::Mismatch { what });
        if self.pid != actual.pid {
            return mismatch("pid");
        }
        if self.start_time != actual.start_time {
            return mismatch("start_time");
        }
        if self.exe != actual.exe {
            return mismatch("executable");
        }
        if self.uid != actual.uid || self.gid != actual.gid {
            return mismatch("uid");
        }
        if let (Some(a), Some(b)) = (self.pidfs_ino, actual.pidfs_ino) {
            if a != b {
                return mismatch("pidfd");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_after_the_last_parenthesis() {
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("1 (x) S"), None);
    }

    #[test]
    fn own_process_identity_is_read_and_verifies_against_itself() {
        let me = LiveProcess::open(std::process::id()).unwrap();
        assert!(me.is_alive());
        assert_eq!(me.identity.uid, rustix::process::geteuid().as_raw());
        assert_eq!(
            me.identity.exe,
            FileId::of_path(&std::env::current_exe().unwrap()).unwrap()
        );
        let again = LiveProcess::open(std::process::id()).unwrap();
        assert_eq!(me.identity.verify(&again.identity), Ok(()));
    }

    #[test]
    fn exited_process_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let live = LiveProcess::open(child.id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!live.is_alive());
    }

    #[test]
    fn identities_differ_in_start_time_or_pid_between_processes() {
        let mut a = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let ia = LiveProcess::open(a.id()).unwrap().identity;
        let mut forged = ia;
        forged.start_time += 1;
        assert_eq!(
            forged.verify(&ia),
            Err(PeerError::Mismatch { what: "start_time" })
        );
        let mut other_exe = ia;
        other_exe.exe.ino ^= 1;
        assert_eq!(
            other_exe.verify(&ia),
            Err(PeerError::Mismatch { what: "executable" })
        );
        a.kill().unwrap();
        a.wait().unwrap();
    }
}
