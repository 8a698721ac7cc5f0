//! Sockets inside a jail's network namespace, for netgtw: the sandbox keeps only its
//! loopback, and the worker reaches a port on it with a socket *created* in that
//! namespace (a socket stays in the namespace it was created in, whichever thread
//! connects it later).
//!
//! Entering a namespace changes the calling thread, so it is done on one dedicated
//! thread that does nothing else: no other work of the worker can ever run in a
//! sandbox's namespace. The namespace is named through a pidfd of the jail's init
//! opened *before* its start time is compared with the recorded one, so a reused PID
//! can never lead into another sandbox's (or the host's) namespace.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::process::{Pid, PidfdFlags, pidfd_open};
use rustix::thread::{ThreadNameSpaceType, move_into_thread_name_spaces};

use crate::substrate::SubstrateError;
use crate::substrate::process::{ProcessIdentity, read_stat};

type Reply = mpsc::SyncSender<Result<OwnedFd, SubstrateError>>;

/// The dedicated thread's queue.
fn opener() -> &'static Mutex<mpsc::Sender<(ProcessIdentity, Reply)>> {
    static OPENER: OnceLock<Mutex<mpsc::Sender<(ProcessIdentity, Reply)>>> = OnceLock::new();
    OPENER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(ProcessIdentity, Reply)>();
        let spawned = std::thread::Builder::new()
            .name("space-netns".into())
            .spawn(move || {
                for (init, reply) in rx {
                    let _ = reply.send(socket_in(&init));
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the network-namespace thread");
        }
        Mutex::new(tx)
    })
}

/// A TCP socket (IPv4, non-blocking, close-on-exec, not connected) in the network
/// namespace of the process `init` — which must still be the very process recorded.
/// Blocking (a round trip to the dedicated thread): call it off the async runtime.
pub fn tcp_socket_in(init: &ProcessIdentity) -> Result<OwnedFd, SubstrateError> {
    let (reply, answer) = mpsc::sync_channel(1);
    let sent = opener()
        .lock()
        .map_err(|_| SubstrateError::Unsupported("network-namespace thread poisoned".into()))?
        .send((*init, reply));
    if sent.is_err() {
        return Err(SubstrateError::Unsupported(
            "the network-namespace thread is gone".into(),
        ));
    }
    answer.recv().map_err(|_| {
        SubstrateError::Unsupported("the network-namespace thread did not answer".into())
    })?
}

/// On the dedicated thread: enter `init`'s network namespace and create the socket.
fn socket_in(init: &ProcessIdentity) -> Result<OwnedFd, SubstrateError> {
    let io = |context: &str, e: rustix::io::Errno| SubstrateError::Io {
        context: context.to_owned(),
        source: std::io::Error::from(e),
    };
    let pid = Pid::from_raw(init.pid).ok_or(SubstrateError::NotRunning)?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|_| SubstrateError::NotRunning)?;
    // The pidfd names whatever held the PID when it was opened: it is the recorded
    // init only if that one is still there now (same start time, not a zombie).
    match read_stat(init.pid) {
        Ok(s) if s.start_time == init.start_time && s.state != 'Z' => {}
        _ => return Err(SubstrateError::NotRunning),
    }
    move_into_thread_name_spaces(pidfd.as_fd(), ThreadNameSpaceType::NETWORK).map_err(|e| {
        if e == rustix::io::Errno::PERM {
            SubstrateError::Unsupported(
                "service ports need a worker that may enter its sandboxes' network namespaces (root; a rootless worker cannot)".into(),
            )
        } else {
            io("enter the sandbox's network namespace", e)
        }
    })?;
    rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io("create a socket in the sandbox's network namespace", e))
}
