//! Who is at the other end of a socket.
//!
//! SPACE's worker verifies that a connection to a sandbox's bridge reaches the bridge
//! process it launched, and the bridge verifies that its transport reaches the jail
//! (or VMM) process of the execution it serves (`IDENTITY.md` §5). This crate holds
//! the pieces both sides use: a process's identity as recorded at launch
//! ([`ProcessIdentity`]), the identity of a socket's peer ([`peer_process`]), checks on
//! socket directories and paths, and the kernel's socket table as evidence that a
//! listening socket belongs to a given process.

mod fds;
mod path;
mod peer;
mod process;
mod socktable;

pub use fds::{MAX_FDS, fd_holding_file, process_holds_socket};
pub use path::{bind_listener, check_socket_path, check_vmm_socket_path, prepare_socket_dir};
pub use peer::{PeerCred, peer_process, peer_process_listened_as};
pub use process::{FileId, LiveProcess, ProcessIdentity};
pub use socktable::{listening_unix_inode, listening_unix_inode_of, process_listens_at};

/// Why a peer or a socket path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The process does not exist (or exited while being read).
    #[error("process {0} does not exist")]
    NoSuchProcess(u32),
    /// `/proc` held something unreadable.
    #[error("unreadable /proc/PID/{0}")]
    Proc(&'static str),
    /// The peer is another process than the recorded one.
    #[error("peer process differs from the record: {what}")]
    Mismatch {
        /// The first property that differs.
        what: &'static str,
    },
    /// The peer runs under another uid than allowed.
    #[error("peer uid {got} is not {expected}")]
    WrongUid {
        /// Allowed uid.
        expected: u32,
        /// The peer's.
        got: u32,
    },
    /// A socket path or its directory is unsafe (symlink, wrong owner or mode, not a
    /// socket).
    #[error("unsafe socket path: {0}")]
    UnsafePath(String),
    /// The kernel's socket table does not show the expected listener.
    #[error("socket table: {0}")]
    SocketTable(&'static str),
    /// The process does not hold the file it must (a VMM without its vhost device).
    #[error("open files: {0}")]
    NotHeld(&'static str),
    /// A system call failed.
    #[error("{what}: {errno}")]
    Sys {
        /// Which call.
        what: &'static str,
        /// The error number.
        errno: i32,
    },
}

impl PeerError {
    pub(crate) fn sys(what: &'static str, e: impl Into<std::io::Error>) -> Self {
        Self::Sys {
            what,
            errno: e.into().raw_os_error().unwrap_or(0),
        }
    }
}
