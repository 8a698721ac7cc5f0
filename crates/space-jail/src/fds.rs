//! The file descriptors of the calling convention (see the crate docs' table), shared
//! by the launcher, the init and the probe agent.

use std::io::Write;

use crate::spec::StatusEvent;

/// The agent's listening socket, by calling convention.
pub const LISTEN_FD: i32 = 3;
/// The read end of the activation pipe, by calling convention.
pub const ACTIVATION_FD: i32 = 4;

/// Writes one status event on fd 1. A failed write means the worker is gone; the
/// jail then carries on and the worker's sweep removes it, so errors are ignored.
pub(crate) fn send_status(event: &StatusEvent) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(event.to_line().as_bytes());
    let _ = out.flush();
}
