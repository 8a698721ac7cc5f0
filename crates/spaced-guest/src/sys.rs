//! The only unsafe code of the agent: adopting inherited file descriptors, and the
//! child-side setup of a terminal session between `fork` and `exec`.

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
