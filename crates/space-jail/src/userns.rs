//! The sandbox's user namespace when the worker runs as root: the sandbox's uid 0 ..
//! `count` map to an unprivileged host range of its own, so no per-user kernel limit
//! (inotify instances, pending signals, message queues, pipe pages) is shared with
//! host root or with another sandbox, and a process that escaped every other layer
//! would still be a nobody on the host.
//!
//! Files keep canonical ids on disk (0 .. `count`, as without a namespace): the
//! template and the writable layer reach the overlay through *idmapped* mounts built
//! with this namespace, so the same layer serves any range, a snapshot moves between
//! workers unchanged, and the shared template stays read-only and owned by "root".
//!
//! The namespace is made before anything else by a short-lived child (a process
//! cannot write its own map to a foreign range), and only the init enters it, after
//! `pivot_root`, when nothing of the host is reachable any more.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::spec::UserNamespace;
use crate::sys::{self, Forked};

/// Makes a user namespace with `map` and returns a descriptor of it.
pub fn create(map: &UserNamespace) -> io::Result<OwnedFd> {
    let (go_read, go_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (ready_read, ready_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    match sys::fork()? {
        Forked::Child => {
            drop((go_write, ready_read));
            // Owned by the range's first id, not by host root: the kernel charges what
            // the namespace's users hold (inotify instances, pending signals, message
            // queues, processes) to its owner too, so a root-owned namespace would
            // spend host root's per-user budget.
            let ok = become_owner(map).is_ok()
                && nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = File::from(ready_write).write_all(if ok { b"1" } else { b"0" });
            // Wait until the parent holds the namespace, then go.
            let _ = File::from(go_read).read(&mut [0u8; 1]);
            sys::exit_now(0)
        }
        Forked::Parent(pid) => {
            drop((go_read, ready_write));
            let result = (|| {
                let mut answer = [0u8; 1];
                File::from(ready_read).read_exact(&mut answer)?;
                if answer != *b"1" {
                    return Err(io::Error::other("unshare(CLONE_NEWUSER) failed"));
                }
                let line = |inner: u32, host: u32| format!("{inner} {host} {}\n", map.count);
                std::fs::write(format!("/proc/{pid}/uid_map"), line(0, map.host_uid))?;
                std::fs::write(format!("/proc/{pid}/gid_map"), line(0, map.host_gid))?;
                File::open(format!("/proc/{pid}/ns/user")).map(OwnedFd::from)
            })();
            drop(go_write);
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            result
        }
    }
}

/// In the helper: drops every supplementary group and becomes the range's first id.
fn become_owner(map: &UserNamespace) -> io::Result<()> {
    // SAFETY: setgroups with an empty list, setresgid/setresuid with integers.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(map.host_gid, map.host_gid, map.host_gid) != 0
            || libc::setresuid(map.host_uid, map.host_uid, map.host_uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs `f` with the filesystem ids set to the sandbox's root (`host_uid`,
/// `host_gid`) and every permitted capability effective, then restores both.
///
/// Overlayfs records its mounter's credentials and creates its work directories
/// and copied-up files with them: through idmapped layers those ids must be mapped,
/// or every write fails with `EOVERFLOW`.
pub fn with_fs_ids<T>(map: &UserNamespace, f: impl FnOnce() -> T) -> io::Result<T> {
    // SAFETY: setfsuid/setfsgid take integers and cannot fail in a way that matters
    // here (they return the previous value); capabilities are re-raised below.
    unsafe {
        libc::setfsgid(map.host_gid);
        libc::setfsuid(map.host_uid);
    }
    let result = sys::raise_permitted_capabilities().map(|()| f());
    // SAFETY: as above, back to root's ids.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(0);
    }
    sys::raise_permitted_capabilities()?;
    result
}

/// Enters the namespace `userns` and becomes its root (host `host_uid`), without
/// supplementary groups of the host.
pub fn enter(userns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setgroups with an empty list; setns with a namespace descriptor we own;
    // setresgid/setresuid with integers. The process is single-threaded.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setresgid(0, 0, 0) != 0 || libc::setresuid(0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
