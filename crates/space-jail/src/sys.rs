//! The few system calls that need `unsafe`: fork, exec by descriptor, descriptor
//! plumbing, capability sets and bringing up loopback. Each is a thin wrapper
//! with its invariants stated where it is called.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Result of [`fork`].
#[derive(Debug)]
pub enum Forked {
    /// In the parent; the child's PID as the parent sees it.
    Parent(i32),
    /// In the child.
    Child,
}

/// `fork(2)`.
///
/// Only called from `space-jail`, which is single-threaded, so the child may
/// allocate and run arbitrary code.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: space-jail never starts a thread (no tokio, no std::thread), so the
    // child inherits no lock held by another thread and may do anything.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(Forked::Parent(child.as_raw())),
        Ok(nix::unistd::ForkResult::Child) => Ok(Forked::Child),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Takes ownership of a descriptor handed over by number (the jail's fds 3 and 4).
///
/// Returns `None` when `fd` is not open, so that a misconfigured launch fails with
/// a clear error instead of closing someone else's descriptor later.
pub fn take_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: by the launch protocol nothing else in this process owns fds 3/4:
    // they were placed there by the worker before exec and are never wrapped twice.
    is_open(fd).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether descriptor number `fd` is open in this process.
pub fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only queries the flags of a descriptor number.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// `dup2(src, dst)`: makes `dst` a copy of `src`, without close-on-exec.
pub fn dup2(src: BorrowedFd<'_>, dst: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on a valid source descriptor; `dst` is one of the fixed numbers
    // (0–4) of the agent's calling convention, which no Rust object owns there.
    if unsafe { libc::dup2(src.as_raw_fd(), dst) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec, so the agent inherits
/// exactly its calling convention (0–4) whatever this process had open.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags; no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`: runs the file opened before
/// `pivot_root`. Returns only on failure.
pub fn exec_fd(fd: BorrowedFd<'_>, argv: &[CString], envp: &[CString]) -> io::Error {
    let err = nix::unistd::execveat(fd, c"", argv, envp, nix::fcntl::AtFlags::AT_EMPTY_PATH);
    match err {
        Err(e) => io::Error::from(e),
        Ok(never) => match never {},
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Drops every capability but `keep` (none: every one) from every set of the
/// calling thread: the bounding set (so no exec can gain another), ambient
/// (cleared), then effective and permitted become exactly `keep` and inheritable
/// empty.
pub fn keep_only_capabilities(keep: &[u32]) -> io::Result<()> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        // 63 covers every capability a future kernel may add; unknown ones give EINVAL.
        .unwrap_or(63);
    for cap in (0..=last).filter(|c| !keep.contains(c)) {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc == -1 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err);
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    for &cap in keep.iter().filter(|c| **c < 64) {
        let d = &mut data[(cap / 32) as usize];
        d.effective |= 1 << (cap % 32);
        d.permitted |= 1 << (cap % 32);
    }
    // SAFETY: capset reads one header and two data structs (version 3 layout),
    // both alive for the duration of the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes every permitted capability effective again (changing the filesystem uid
/// away from 0 clears the file capabilities from the effective set).
pub fn raise_permitted_capabilities() -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs (version 3 layout) that live across the call.
    if unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    for d in &mut data {
        d.effective = d.permitted;
    }
    // SAFETY: capset reads the header and the two data structs, alive across the call.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_DUMPABLE, 0)`: the process's memory, descriptors and `/proc` files
/// are then out of reach of every process without `CAP_SYS_PTRACE` over it, even one
/// of the same uid. Reset by `execve`, so each program sets it for itself.
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets `IFF_UP` on `lo` in the current network namespace (new namespaces start
/// with it down, so even 127.0.0.1 would be unreachable).
pub fn bring_up_loopback() -> io::Result<()> {
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS writes the flags into `req`, which lives across the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: reading the union member SIOCGIFFLAGS just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads `req`, which lives across the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the calling process at once, without running destructors or atexit
/// handlers: used in forked children whose parent owns the buffers.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}
