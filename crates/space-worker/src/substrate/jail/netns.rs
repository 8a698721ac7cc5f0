//! Sockets inside a jail's network namespace, for netgtw: the sandbox keeps only its
//! loopback, and the worker reaches a port on it with a socket *created* in that
//! namespace (a socket stays in the namespace it was created in, whichever thread
//! connects it later). Likewise the NETLINK_ROUTE socket egress configures a
//! sandbox's link with ([`route_socket_in`]).
//!
//! Entering a namespace changes the calling thread, so it is done on one dedicated
//! thread that does nothing else: no other work of the worker can ever run in a
//! sandbox's namespace. The namespace is named through a pidfd of the jail's init
//! opened *before* its start time is compared with the recorded one, so a reused PID
//! can never lead into another sandbox's (or the host's) namespace.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::process::{Pid, PidfdFlags, pidfd_open};
use rustix::thread::{
    LinkNameSpaceType, ThreadNameSpaceType, move_into_link_name_space, move_into_thread_name_spaces,
};

use crate::substrate::SubstrateError;
use crate::substrate::process::{ProcessIdentity, read_stat};

type Reply = mpsc::SyncSender<Result<OwnedFd, SubstrateError>>;

/// What the dedicated thread is asked to make.
enum Job {
    /// A TCP socket in the namespace of this init.
    Tcp(ProcessIdentity),
    /// A NETLINK_ROUTE socket in this open network namespace.
    Route(OwnedFd),
}

/// The dedicated thread's queue.
fn opener() -> &'static Mutex<mpsc::Sender<(Job, Reply)>> {
    static OPENER: OnceLock<Mutex<mpsc::Sender<(Job, Reply)>>> = OnceLock::new();
    OPENER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Job, Reply)>();
        let spawned = std::thread::Builder::new()
            .name("space-netns".into())
            .spawn(move || {
                for (job, reply) in rx {
                    let made = match job {
                        Job::Tcp(init) => socket_in(&init),
                        Job::Route(netns) => route_socket_on_thread(netns.as_fd()),
                    };
                    let _ = reply.send(made);
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
    ask(Job::Tcp(*init))
}

/// A NETLINK_ROUTE socket (close-on-exec, not bound) in the network namespace `netns`
/// — an open `/proc/PID/ns/net` the caller has checked names the sandbox's (egress
/// opens it through the init's pidfd). Blocking (a round trip to the dedicated
/// thread): call it off the async runtime.
pub fn route_socket_in(netns: BorrowedFd<'_>) -> Result<OwnedFd, SubstrateError> {
    let netns = netns.try_clone_to_owned().map_err(|e| SubstrateError::Io {
        context: "duplicate the network namespace's descriptor".into(),
        source: e,
    })?;
    ask(Job::Route(netns))
}

/// Runs `job` on the dedicated thread.
fn ask(job: Job) -> Result<OwnedFd, SubstrateError> {
    let (reply, answer) = mpsc::sync_channel(1);
    let sent = opener()
        .lock()
        .map_err(|_| SubstrateError::Unsupported("network-namespace thread poisoned".into()))?
        .send((job, reply));
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

/// On the dedicated thread: enter the namespace `netns` and create the socket.
fn route_socket_on_thread(netns: BorrowedFd<'_>) -> Result<OwnedFd, SubstrateError> {
    let io = |context: &str, e: rustix::io::Errno| SubstrateError::Io {
        context: context.to_owned(),
        source: std::io::Error::from(e),
    };
    move_into_link_name_space(netns, Some(LinkNameSpaceType::Network))
        .map_err(|e| io("enter the sandbox's network namespace", e))?;
    rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| {
        io(
            "create a netlink socket in the sandbox's network namespace",
            e,
        )
    })
}
