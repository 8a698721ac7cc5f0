//! The only unsafe code of the agent: adopting inherited file descriptors, the
//! child-side setup of a terminal session between `fork` and `exec`, and signals by
//! number to a process group.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Takes ownership of a descriptor inherited from the launcher (`--listen-fd`,
/// `--activation-fd`), after checking that it is open. Standard streams are refused:
/// adopting them would close them under the agent's own logging.
pub(crate) fn adopt_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is a standard stream"),
        ));
    }
    // SAFETY: `fcntl(F_GETFD)` only reads the descriptor table entry; any integer is a
    // valid argument, and an unused one yields EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (checked above), was handed to this process by
    // its launcher for exactly this use, and nothing else in the process owns it: the
    // agent adopts each inherited descriptor once, at startup, before any thread runs.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets close-on-exec on every descriptor above the standard streams. A launcher (or a
/// test harness) may leak descriptors into the agent; none of them is meant for the
/// processes the agent runs. Descriptors the agent adopts later get it again anyway.
pub(crate) fn close_inherited_on_exec() -> io::Result<()> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: `fcntl(F_GETFD/F_SETFD)` only changes the descriptor's close-on-exec
        // flag; any integer is a valid argument (the directory's own descriptor, closed
        // by now, yields EBADF, which is ignored).
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Makes the child a session leader whose controlling terminal is its stdin (the PTY
/// slave the caller placed there), so that job control, `SIGWINCH` and hang-ups
/// reach it like in a real terminal.
pub(crate) fn new_session_with_controlling_tty(cmd: &mut Command) {
    let setup = || {
        rustix::process::setsid()?;
        // SAFETY: descriptor 0 is the slave, placed there by `Command` before this
        // closure runs, and stays open for the closure's duration.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        rustix::process::ioctl_tiocsctty(stdin)?;
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before `exec` and performs only two
    // raw system calls (`setsid`, `ioctl(TIOCSCTTY)`) through rustix, which neither
    // allocate nor take locks, so it is async-signal-safe; errors are converted to
    // `io::Error` by raw OS code, also without allocating.
    unsafe {
        cmd.pre_exec(setup);
    }
}

/// Makes the child run as `uid`, `gid` with the supplementary `groups` (set in this
/// order, before `exec`). The caller checked beforehand ([`can_act_as`]) that the
/// ids are mapped and the agent may take them.
pub(crate) fn run_as(cmd: &mut Command, uid: u32, gid: u32, groups: Vec<u32>) {
    let setup = move || {
        // SAFETY: raw system calls with integers and a pointer to `groups`, which the
        // closure owns (allocated before the fork); the child has one thread, so the
        // calls change the credentials of the whole process.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before `exec` and makes three raw
    // system calls, which neither allocate nor take locks (async-signal-safe); an
    // error is built from the raw OS code, also without allocating.
    unsafe {
        cmd.pre_exec(setup);
    }
}

/// `setfsuid`/`setfsgid` of the calling thread (raw: per thread); returns the id in
/// force afterwards (the call returns the previous one, so it is asked twice).
fn set_fs_ids(uid: u32, gid: u32) -> (u32, u32) {
    // SAFETY: raw system calls with integer arguments; they change only the calling
    // thread's filesystem ids. `u32::MAX` (-1) asks without changing.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        let u = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        let g = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        (u, g)
    }
}

/// The calling thread's filesystem ids.
fn current_fs_ids() -> (u32, u32) {
    set_fs_ids(u32::MAX, u32::MAX)
}

/// The calling thread's supplementary groups.
fn thread_groups() -> io::Result<Vec<u32>> {
    // SAFETY: getgroups(0, NULL) only returns the count.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0u32; n as usize];
    // SAFETY: the buffer holds `n` gids, as the call was told.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, groups.len(), groups.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

fn set_thread_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: a raw setgroups (this thread only) with a pointer to `groups.len()` gids.
    if unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread acting on files as another account (filesystem ids and
/// supplementary groups of this thread only: the agent's other connections are not
/// affected) until dropped.
#[derive(Debug)]
pub(crate) struct ActingAs {
    groups: Vec<u32>,
    ids: (u32, u32),
}

impl ActingAs {
    /// Acts as `uid`, `gid`, `groups` on files, or says why it cannot.
    pub(crate) fn new(uid: u32, gid: u32, groups: &[u32]) -> io::Result<Self> {
        let ids = current_fs_ids();
        let saved = thread_groups()?;
        set_thread_groups(groups)?;
        let guard = Self { groups: saved, ids };
        if set_fs_ids(uid, gid) != (uid, gid) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(guard)
    }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        set_fs_ids(self.ids.0, self.ids.1);
        let _ = set_thread_groups(&self.groups);
    }
}

/// Whether this thread may take `uid` and `gid` (the ids are mapped in the sandbox's
/// user namespace, and the agent holds `CAP_SETUID`/`CAP_SETGID`): tried on the
/// filesystem ids of this thread, then put back.
pub(crate) fn can_act_as(uid: u32, gid: u32) -> bool {
    let (u, g) = current_fs_ids();
    let ok = set_fs_ids(uid, gid) == (uid, gid);
    set_fs_ids(u, g);
    ok
}

/// Sends signal `n` to the process group `pgid`: any signal of the kernel's, 1 to 64,
/// real-time ones too (which `nix::sys::signal::Signal` does not name). Another
/// number is `EINVAL`, nothing sent.
pub(crate) fn signal_group(pgid: i32, n: i32) -> io::Result<()> {
    if !(1..=64).contains(&n) || pgid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `killpg` takes two integers and touches no memory of this process; a
    // positive group id names a group, never every process (`0` and negatives are
    // refused above).
    if unsafe { libc::killpg(pgid, n) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An IPv4 address as the `sockaddr` the interface and route ioctls take.
fn sockaddr_v4(addr: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sockaddr_in` and `sockaddr` are both 16 bytes of plain data; the
    // kernel reads an AF_INET `sockaddr` as a `sockaddr_in`.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Gives interface `dev` (of the VM's own kernel) the address `addr` with `mask`,
/// brings it up, and routes everything else through `gateway`.
pub(crate) fn configure_ipv4(
    dev: &str,
    addr: std::net::Ipv4Addr,
    mask: std::net::Ipv4Addr,
    gateway: std::net::Ipv4Addr,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let socket = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    let fd = socket.as_raw_fd();
    let name = |req: &mut libc::ifreq| {
        for (dst, src) in req.ifr_name.iter_mut().zip(dev.bytes().chain([0])) {
            *dst = src as libc::c_char;
        }
    };
    let ioctl = |request: libc::c_ulong, arg: *mut libc::c_void| {
        // SAFETY: every request below is given a pointer to the structure its
        // ioctl reads or writes (`ifreq` or `rtentry`), alive across the call.
        if unsafe { libc::ioctl(fd, request as _, arg) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    if dev.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    name(&mut req);
    req.ifr_ifru.ifru_addr = sockaddr_v4(addr);
    ioctl(libc::SIOCSIFADDR, (&raw mut req).cast())?;
    req.ifr_ifru.ifru_netmask = sockaddr_v4(mask);
    ioctl(libc::SIOCSIFNETMASK, (&raw mut req).cast())?;
    ioctl(libc::SIOCGIFFLAGS, (&raw mut req).cast())?;
    // SAFETY: reading the union member SIOCGIFFLAGS just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(libc::SIOCSIFFLAGS, (&raw mut req).cast())?;
    // SAFETY: `rtentry` is plain old data (its device pointer null: any device).
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr_v4(std::net::Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr_v4(std::net::Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr_v4(gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    ioctl(libc::SIOCADDRT, (&raw mut route).cast())
}
