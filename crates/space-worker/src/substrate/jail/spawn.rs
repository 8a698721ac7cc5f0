//! Spawning `space-jail` with its descriptors in place and its namespaces new.
//!
//! The worker is multithreaded, so between `fork` and `exec` only
//! async-signal-safe calls are allowed: `dup2` and `unshare`, nothing that
//! allocates or takes a lock.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::sched::CloneFlags;

/// Namespaces `space-jail` starts in: its own mounts, network (only loopback),
/// hostname and System V IPC. The PID namespace for its children it makes itself,
/// after forking the helper that creates the sandbox's user namespace (a child
/// forked into a new PID namespace would be its init, and the namespace would die
/// with the helper).
pub const JAIL_NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWIPC);

/// Lowest descriptor number used while handing fds over: above 0–4, so that the
/// `dup2`s into 3 and 4 can never overwrite a source not yet copied.
const HANDOVER_MIN_FD: RawFd = 10;

/// The descriptors `space-jail` gets.
#[derive(Debug)]
pub struct JailFds {
    /// fd 0: read end of the spec pipe.
    pub spec: OwnedFd,
    /// fd 1: write end of the status pipe.
    pub status: OwnedFd,
    /// fd 2: the jail's log file.
    pub log: File,
    /// fd 3: the agent's listening socket.
    pub listener: OwnedFd,
    /// fd 4: read end of the activation pipe.
    pub activation: OwnedFd,
}

/// A close-on-exec duplicate of `fd` numbered at least [`HANDOVER_MIN_FD`].
fn dup_high(fd: &OwnedFd) -> io::Result<OwnedFd> {
    dup_at_least(fd, HANDOVER_MIN_FD)
}

/// A close-on-exec duplicate of `fd` numbered at least `min`.
fn dup_at_least(fd: &OwnedFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid descriptor; no memory involved.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if raw == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by fcntl and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Starts `binary` (space-jail) with `fds` as 0–4, in new namespaces when
/// `new_namespaces` (root; a rootless `space-jail` creates them itself).
///
/// The parent's copies of the descriptors are closed when this returns.
pub fn spawn_jail(binary: &Path, new_namespaces: bool, fds: JailFds) -> io::Result<Child> {
    let listener = dup_high(&fds.listener)?;
    let activation = dup_high(&fds.activation)?;
    let (listener_fd, activation_fd) = (listener.as_raw_fd(), activation.as_raw_fd());
    let mut command = Command::new(binary);
    command
        .env_clear()
        .stdin(Stdio::from(fds.spec))
        .stdout(Stdio::from(fds.status))
        .stderr(Stdio::from(fds.log));
    // SAFETY: the closure runs in the forked child of a multithreaded process and
    // calls only dup2 and unshare (async-signal-safe syscalls; building the error
    // from errno does not allocate). The source fds are ≥ 10, so the targets 3 and
    // 4 never alias a source, and dup2 clears close-on-exec on the targets.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(listener_fd, 3) == -1 || libc::dup2(activation_fd, 4) == -1 {
                return Err(io::Error::last_os_error());
            }
            if new_namespaces {
                nix::sched::unshare(JAIL_NAMESPACES).map_err(io::Error::from)?;
            }
            Ok(())
        });
    }
    let child = command.spawn();
    drop((listener, activation, fds.listener, fds.activation));
    child
}

/// Lowest descriptor number of what a VM's QEMU inherits: above what a worker's
/// early descriptors take, and named by their own numbers (`/proc/self/fd/N`) in
/// QEMU's arguments — no `dup2` in the child that could land on the exec-error pipe
/// `std` made before the fork.
const QEMU_HANDOVER_MIN_FD: RawFd = 64;

/// Close-on-exec copies of `fds` (numbered at least 64) for [`qemu_child`]; their
/// numbers are the ones QEMU will have. Keep them until the command is spawned.
pub fn for_qemu(fds: &[OwnedFd]) -> io::Result<Vec<OwnedFd>> {
    fds.iter()
        .map(|fd| dup_at_least(fd, QEMU_HANDOVER_MIN_FD))
        .collect()
}

/// Makes `command` (a VM's QEMU) inherit exactly `fds` (from [`for_qemu`]) besides
/// its standard streams — every other descriptor above 2 is made close-on-exec in
/// the child, whatever some library of the worker left without the flag — and start
/// in a network namespace of its own (only a loopback, down) when `new_netns`.
pub fn qemu_child(command: &mut Command, fds: &[OwnedFd], new_netns: bool) {
    let keep: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: the closure runs in the forked child of a multithreaded process and
    // calls only close_range, fcntl, unshare and setrlimit (async-signal-safe syscalls; `keep`
    // was built before the fork and is only read; building the error from errno does
    // not allocate).
    unsafe {
        command.pre_exec(move || {
            // Everything above the standard streams close-on-exec (std's own error
            // pipe already is); kernels before 5.11 lack the flag: left as it is.
            let _ = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            for &fd in &keep {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if new_netns {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            }
            no_core_dumps()
        });
    }
}

/// Makes `command` join a cgroup in the child before `exec`: `0` (the calling
/// process) written to each of `procs`, descriptors of the cgroup's `cgroup.procs`
/// files opened before the fork ([`super::cgroup::CgroupSet::procs_files`]). Register
/// it before any drop of the uid (the dropped uid may not write them).
pub(crate) fn join_cgroup(command: &mut Command, procs: Vec<OwnedFd>) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: the closure runs in the forked child and calls only write(2) on
    // descriptors opened before the fork, with a static buffer.
    unsafe {
        command.pre_exec(move || {
            for fd in &procs {
                if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// In a child before `exec`: no core dump, ever (`RLIMIT_CORE` 1, kept across `exec`
/// and inherited): a VMM's memory holds its guest's RAM and what passed through its
/// devices, which a crash must not hand to the host. 1, not 0: the kernel ignores the
/// limit for a `core_pattern` that pipes to a handler, except that a limit of 1
/// aborts the dump; a file dump needs at least a page. Async-signal-safe.
pub(crate) fn no_core_dumps() -> io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 1,
        rlim_max: 1,
    };
    // SAFETY: setrlimit with a valid pointer to a struct on this stack.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
