//! The identity of a connected Unix socket's peer.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::net::sockopt::socket_peercred;

use crate::PeerError;
use crate::process::LiveProcess;

/// Credentials the kernel recorded for a socket's peer (at `connect` or `listen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// PID, translated into this process's PID namespace.
    pub pid: u32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
}

/// The live process at the other end of `sock`, identified through `SO_PEERCRED` and,
/// where the kernel has it, `SO_PEERPIDFD` (which cannot name a later process that
/// reused the PID). The uid the kernel recorded must match what `/proc` shows.
pub fn peer_process(sock: BorrowedFd<'_>) -> Result<(PeerCred, LiveProcess), PeerError> {
    peer_process_with(sock, None)
}

/// [`peer_process`] for a peer that listened on the socket before it dropped to
/// another uid (QEMU with `-runas`): the uid the kernel recorded at `listen` may be
/// `listened_as` instead of the one `/proc` shows now. The process itself is still
/// the one the kernel recorded (its pidfd where the kernel has them).
pub fn peer_process_listened_as(
    sock: BorrowedFd<'_>,
    listened_as: u32,
) -> Result<(PeerCred, LiveProcess), PeerError> {
    peer_process_with(sock, Some(listened_as))
}

fn peer_process_with(
    sock: BorrowedFd<'_>,
    listened_as: Option<u32>,
) -> Result<(PeerCred, LiveProcess), PeerError> {
    let cred = socket_peercred(sock).map_err(|e| PeerError::sys("SO_PEERCRED", e))?;
    let cred = PeerCred {
        pid: u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(0),
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
    };
    let live = match peer_pidfd(sock) {
        Some(pidfd) => {
            let live = LiveProcess::with_pidfd(cred.pid, pidfd)?;
            // /proc/PID must describe the process the peer pidfd names.
            let by_pid = LiveProcess::open(cred.pid)?;
            if live.identity.pidfs_ino != by_pid.identity.pidfs_ino {
                return Err(PeerError::Mismatch { what: "pidfd" });
            }
            live
        }
        None => LiveProcess::open(cred.pid)?,
    };
    if live.identity.uid != cred.uid && listened_as != Some(cred.uid) {
        return Err(PeerError::Mismatch { what: "uid" });
    }
    Ok((cred, live))
}

/// `SO_PEERPIDFD` (Linux ≥ 6.5); `None` where the kernel lacks it.
#[allow(unsafe_code)]
fn peer_pidfd(sock: BorrowedFd<'_>) -> Option<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` and `len` are valid for writes of the sizes passed; the kernel
    // writes at most `len` bytes into `fd` and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return None;
    }
    // SAFETY: on success the kernel returned a new pidfd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn peer_of_a_socketpair_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let (cred, live) = peer_process(a.as_fd()).unwrap();
        assert_eq!(cred.pid, std::process::id());
        assert_eq!(live.identity.pid, std::process::id());
    }

    #[test]
    fn peer_of_a_connection_is_the_process_that_listened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let _l = UnixListener::bind(&path).unwrap();
        let c = UnixStream::connect(&path).unwrap();
        let (cred, _) = peer_process(c.as_fd()).unwrap();
        assert_eq!(cred.pid, std::process::id());
    }
}
