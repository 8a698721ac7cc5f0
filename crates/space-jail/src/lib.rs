//! `space-jail`: builds one sandbox's jail and becomes its init.
//!
//! The worker spawns the `space-jail` binary in fresh mount, PID, network, UTS and
//! IPC namespaces with this calling convention:
//!
//! | fd | what |
//! |---|---|
//! | 0 | the [`spec::JailSpec`] as JSON, read to EOF (the worker closes its end only after putting this process into the sandbox's cgroups) |
//! | 1 | the status pipe: one [`spec::StatusEvent`] JSON line per step, closed when the agent is ready |
//! | 2 | the jail's log (and the agent's stdout/stderr) |
//! | 3 | the agent's listening Unix socket |
//! | 4 | the read end of the agent's activation pipe |
//!
//! The process builds the root filesystem ([`rootfs`]), opens the agent binary,
//! forks the init (PID 1 of the new PID namespace), reports the init's host PID and
//! exits. The init ([`init`]) finishes the jail (`/proc`, `pivot_root`, hostname,
//! loopback), hardens itself and the agent (no capabilities, `no_new_privs`, the
//! [`seccomp_profile`]), starts the agent with fds 3 and 4 and reaps until the agent
//! exits. Std only and single-threaded, so that forking is always sound.
//!
//! The same binary carries [`probe_agent`], a minimal stand-in agent for tests and
//! benchmarks (`space-jail probe-agent`).

mod error;
mod fds;
pub mod init;
pub mod launcher;
pub mod mounts;
pub mod probe_agent;
pub mod rootfs;
pub mod seccomp_profile;
pub mod spec;
mod sys;
pub mod userns;

pub use error::JailError;
pub use fds::{ACTIVATION_FD, LISTEN_FD};
pub use sys::bring_up_loopback;

/// Entry point of the `space-jail` binary; returns the process exit code.
pub fn main_entry() -> i32 {
    let mut args = std::env::args_os().skip(1);
    match args.next() {
        None => launcher::run(),
        Some(arg) if arg == "probe-agent" => probe_agent::run(),
        Some(arg) => {
            eprintln!(
                "space-jail: unknown argument {arg:?}; usage: space-jail (spec on stdin) | space-jail probe-agent"
            );
            2
        }
    }
}
