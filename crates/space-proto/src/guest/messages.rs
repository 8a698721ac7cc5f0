//! Messages of the host ↔ guest hop after framing.
//!
//! A connection starts with [`ClientFrame::Hello`] and the agent's
//! [`AgentBody::HelloAck`]. Then the client sends one [`Request`] at a time; the agent
//! answers with zero or more non-final bodies and exactly one final body
//! ([`AgentBody::is_final`]). While a request runs, the client may send [`Input`]
//! frames for it (stdin, signals, file data, close). Every agent frame names the
//! execution that produced it and the request it answers, so a client can check each
//! answer against the route it used.
//!
//! Variant order is part of the wire format: append, never reorder.

use serde::{Deserialize, Serialize};
use space_identity::ExecutionId;

use super::handshake::{Hello, HelloAck};
use crate::codec::wire;

/// Client-chosen request number, echoed in every answer. `0` is reserved for answers
/// about the connection itself (handshake, protocol errors).
pub type RequestId = u64;

/// The request id of connection-level answers.
pub const CONNECTION: RequestId = 0;

/// Largest data chunk the agent puts in one frame (output, file data, PTY output).
/// Well under [`crate::frame::MAX_FRAME_LEN`] so that an envelope always fits.
pub const MAX_CHUNK: usize = 64 * 1024;

/// Every frame a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientFrame {
    /// Opens the connection; must be first, and only first.
    Hello(Hello),
    /// Starts an operation; only when no other request is running on the connection.
    Request(Request),
    /// Feeds the running request.
    Input(InputFrame),
}

/// One operation with its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in every answer.
    pub id: RequestId,
    /// What to do.
    pub op: Operation,
}

/// Input for a running request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFrame {
    /// The request the input is for. Input for the request that just finished is
    /// dropped silently (it raced with the end); input for any other id is a protocol
    /// error.
    pub id: RequestId,
    /// The input.
    pub input: Input,
}

/// Operations the agent performs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// Run a process: `Started`, `Stdout`/`Stderr` chunks, then `Exited`.
    Exec(ExecSpec),
    /// Read a file: `FileData` chunks, then `ReadEnd`.
    ReadFile {
        /// Absolute, or relative to the agent's home.
        path: String,
        /// Byte offset to start at.
        offset: u64,
        /// Stop after this many bytes (`ReadEnd::truncated` tells if more existed).
        max_bytes: u64,
    },
    /// Replace a file atomically with the data of the `Input::Data` frames that follow,
    /// up to `Input::End`: `Written` once the new content is durable.
    WriteFile {
        /// Absolute, or relative to the agent's home.
        path: String,
        /// Permission bits of a new file; an existing file keeps its mode when `None`.
        mode: Option<u32>,
        /// Create missing parent directories (mode 0755, owned like the file).
        parents: bool,
        /// Write as this account of the sandbox (its permissions apply; the file and
        /// the directories made for it are its own); the agent's root when `None`.
        user: Option<Account>,
    },
    /// List a directory: `Entries` batches, then `Done`.
    List {
        /// The directory.
        path: String,
    },
    /// Describe a path without following a final symlink: `Stat`.
    Stat {
        /// The path.
        path: String,
    },
    /// Create a directory (mode 0755, and its missing parents too when `parents`):
    /// `Made`, which says whether this call made it. A directory already there is
    /// `Made { created: false }` with `parents`, `AlreadyExists` without; anything
    /// else already there is `AlreadyExists`.
    Mkdir {
        /// The directory.
        path: String,
        /// Create missing parents, and succeed if it already exists.
        parents: bool,
        /// Make it as this account of the sandbox (its permissions apply; what is
        /// made is its own); the agent's root when `None`.
        user: Option<Account>,
    },
    /// Remove a file or directory: `Done`.
    Remove {
        /// The path.
        path: String,
        /// Remove a directory with its contents.
        recursive: bool,
    },
    /// Rename (replacing an existing file at `to`): `Done`.
    Rename {
        /// Current path.
        from: String,
        /// New path.
        to: String,
        /// Rename as this account of the sandbox (its permissions apply); the agent's
        /// root when `None`.
        user: Option<Account>,
    },
    /// Watch a directory: `WatchStarted`, `WatchEvent`s, and `WatchEnded` after the
    /// client sends `Input::Close`.
    Watch {
        /// The directory.
        path: String,
        /// Also watch subdirectories, including ones created later.
        recursive: bool,
    },
    /// Read bytes of a file, any size: `FileOpened` (the size of the file opened, from
    /// its descriptor, and the span `range` resolves to within it), the span's
    /// `FileData` chunks, then `ReadEnd`. `ReadEnd::bytes` short of the span, or
    /// `truncated` (the span reached the end seen at open and the file has grown
    /// since), means the file changed while it was read.
    ReadRange {
        /// Absolute, or relative to the agent's home.
        path: String,
        /// The bytes wanted.
        range: ByteRange,
    },
    /// Stream a directory as a tar archive (regular files, directories and symlinks,
    /// with modes and mtimes; anything else is left out): `FileData` chunks, then
    /// `ReadEnd`.
    ReadTree {
        /// The directory.
        path: String,
    },
    /// Unpack the tar archive carried by the `Input::Data` frames that follow, up to
    /// `Input::End`, into a directory (made, with its parents, if missing): `Written`
    /// (the archive's bytes). Entries that are absolute, climb out with `..`, pass
    /// through a symlink, or are devices are refused, and nothing is written through
    /// a symlink.
    WriteTree {
        /// The directory.
        path: String,
        /// Unpack as this account of the sandbox; the agent's root when `None`.
        user: Option<Account>,
    },
    // New variants go last: the binary encoding numbers variants in order, and an
    // agent of an earlier build (an adopted jail) must read the ones it knows.
    /// Do `op` as this account of the sandbox (its permissions apply to every path the
    /// operation opens): `op` is one of `ReadFile`, `ReadRange`, `List`, `Stat` and
    /// `Remove`, answered as it is; anything else (a nested `AsUser` too) is
    /// `InvalidArgument`. The operations that make files name their account
    /// themselves.
    AsUser {
        /// The account.
        user: Account,
        /// What it does.
        op: Box<Operation>,
    },
    /// Connect to `port` on the sandbox's own loopback (`127.0.0.1`, from inside the
    /// sandbox: a service port of a sandbox whose network the worker cannot enter, a
    /// VM's) and hand this connection over to it: `PortConnected` (final), after
    /// which the connection carries the port's bytes both ways, unframed, until both
    /// sides have closed it; `Error(PortClosed)` when nothing accepts on the port.
    ConnectPort {
        /// The port.
        port: u16,
    },
}

/// An account of the sandbox, as its `/etc/passwd` names it, or a bare uid.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Account {
    /// A user name, looked up in the sandbox's `/etc/passwd`.
    Name(String),
    /// A numeric uid: its `/etc/passwd` entry when there is one, else group = uid and
    /// home `/`.
    Uid(u32),
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Uid(u) => write!(f, "{u}"),
        }
    }
}

/// Which bytes of a file a [`Operation::ReadRange`] wants: the forms of an HTTP
/// `Range: bytes=` header with one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ByteRange {
    /// The whole file.
    All,
    /// From this offset to the end (`bytes=a-`).
    From(u64),
    /// `first..=last` (`bytes=a-b`); `last` past the end means the end.
    Span {
        /// First byte.
        first: u64,
        /// Last byte, inclusive.
        last: u64,
    },
    /// The last this many bytes (`bytes=-n`).
    Last(u64),
}

impl ByteRange {
    /// The `(start, len)` this range selects in a file of `size` bytes, or `None` when
    /// it selects nothing there (HTTP 416). [`ByteRange::All`] always resolves, to
    /// `(0, size)`.
    pub fn resolve(self, size: u64) -> Option<(u64, u64)> {
        match self {
            Self::All => Some((0, size)),
            Self::From(a) if a < size => Some((a, size - a)),
            Self::Span { first, last } if first <= last && first < size => {
                Some((first, last.min(size - 1) - first + 1))
            }
            Self::Last(n) if n > 0 && size > 0 => {
                let n = n.min(size);
                Some((size - n, n))
            }
            _ => None,
        }
    }

    /// The range of an HTTP `Range` header value: `bytes=a-b`, `bytes=a-` or
    /// `bytes=-n`. `None` for anything else (another unit, several ranges, garbage,
    /// `a > b`): a server ignores such a header and answers the whole file.
    pub fn parse_header(value: &str) -> Option<Self> {
        let spec = value.trim().strip_prefix("bytes=")?.trim();
        let (a, b) = spec.split_once('-')?;
        let num = |s: &str| -> Option<u64> {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        match (a.trim().is_empty(), b.trim().is_empty()) {
            (true, false) => Some(Self::Last(num(b)?)),
            (false, true) => Some(Self::From(num(a)?)),
            (false, false) => {
                let (first, last) = (num(a)?, num(b)?);
                (first <= last).then_some(Self::Span { first, last })
            }
            (true, true) => None,
        }
    }
}

/// How to run a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments; the program is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Variables added to (and overriding) the agent's minimal default environment.
    pub env: Vec<(String, String)>,
    /// Working directory; the agent's home when `None`.
    pub cwd: Option<String>,
    /// `Some(bytes)`: the child's stdin gets these bytes and is then closed. `None`:
    /// stdin stays open for `Input::Stdin` until `Input::CloseStdin`.
    #[serde(with = "wire::opt_bytes")]
    pub stdin: Option<Vec<u8>>,
    /// Kill the process group after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Run under a new pseudo-terminal of this size (stdout and stderr merge into
    /// `Stdout`).
    pub pty: Option<PtySize>,
    /// Cap each output stream at this many bytes of its JSON encoding (see
    /// [`super::OutputCap`]): output past it is read and dropped, and `Exited` says so.
    /// `None`: no cap (streaming).
    pub max_output_bytes: Option<u64>,
    /// Run as this account of the sandbox (its groups, `HOME`, `USER`, `LOGNAME`,
    /// `SHELL`, and its home as the default working directory); the agent's root when
    /// `None`.
    pub user: Option<Account>,
}

/// Terminal size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Input frames for a running request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// Bytes for the process's stdin (or terminal).
    Stdin(#[serde(with = "wire::bytes")] Vec<u8>),
    /// Close the process's stdin (no effect under a PTY).
    CloseStdin,
    /// Resize the process's terminal.
    Resize(PtySize),
    /// Send a signal to the process group.
    Signal(i32),
    /// A chunk of a file being written.
    Data(#[serde(with = "wire::bytes")] Vec<u8>),
    /// The file being written is complete.
    End,
    /// Stop a watch.
    Close,
}

/// Every frame the agent sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentFrame {
    /// The execution whose agent produced this frame.
    #[serde(with = "wire::execution_id")]
    pub execution_id: ExecutionId,
    /// The request answered, or [`CONNECTION`].
    pub request_id: RequestId,
    /// The answer.
    pub body: AgentBody,
}

/// Answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentBody {
    /// Handshake answer (final, request [`CONNECTION`]).
    HelloAck(HelloAck),
    /// The operation failed (final). On request [`CONNECTION`], the agent closes the
    /// connection after it.
    Error(WireError),
    /// The process started.
    Started {
        /// Its PID (inside the sandbox), which is also its process group.
        pid: u32,
    },
    /// Process output.
    Stdout(#[serde(with = "wire::bytes")] Vec<u8>),
    /// Process error output.
    Stderr(#[serde(with = "wire::bytes")] Vec<u8>),
    /// The process ended (final).
    Exited(ExitStatus),
    /// A chunk of a file being read.
    FileData(#[serde(with = "wire::bytes")] Vec<u8>),
    /// A file read ended (final).
    ReadEnd {
        /// Bytes sent.
        bytes: u64,
        /// Whether the read stopped at `max_bytes` with data left.
        truncated: bool,
    },
    /// A file write is durable (final).
    Written {
        /// Bytes written.
        bytes: u64,
    },
    /// A batch of directory entries.
    Entries(Vec<DirEntry>),
    /// A path's description (final); boxed, as the largest body by far (the wire form
    /// is the same).
    Stat(Box<FileStat>),
    /// The operation succeeded (final).
    Done,
    /// The watch is in place: events from now on are reported.
    WatchStarted,
    /// Something changed under a watched directory.
    WatchEvent(WatchEvent),
    /// The watch stopped (final).
    WatchEnded {
        /// Why.
        reason: WatchEndReason,
    },
    /// A ranged read opened its file: its size (from the open descriptor) and the
    /// `(start, len)` its range selects, `None` when the range selects nothing (then
    /// `ReadEnd` follows at once).
    FileOpened {
        /// Size of the file when it was opened.
        size: u64,
        /// The span to be sent.
        range: Option<(u64, u64)>,
    },
    /// A directory asked for by `Mkdir` is there (final).
    Made {
        /// Whether this request made it (`false`: a directory was already there).
        created: bool,
    },
    /// `ConnectPort` connected (final): from the byte after this frame the
    /// connection is the port's.
    PortConnected,
}

impl AgentBody {
    /// Whether this body ends its request.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::HelloAck(_)
                | Self::Error(_)
                | Self::Exited(_)
                | Self::ReadEnd { .. }
                | Self::Written { .. }
                | Self::Stat(_)
                | Self::Done
                | Self::WatchEnded { .. }
                | Self::Made { .. }
                | Self::PortConnected
        )
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code or killing signal.
    pub outcome: ExitOutcome,
    /// Whether the agent killed it for exceeding `timeout_ms`.
    pub timed_out: bool,
    /// Whether stdout went past `max_output_bytes` (the rest was dropped).
    pub stdout_truncated: bool,
    /// Whether stderr went past `max_output_bytes` (the rest was dropped).
    pub stderr_truncated: bool,
}

/// Exit code or killing signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitOutcome {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// Kinds of filesystem objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (never followed by stat and list).
    Symlink,
    /// Anything else: socket, FIFO, device.
    Other,
}

/// One entry of a directory listing (a symlink described, not followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name (non-UTF-8 bytes replaced by U+FFFD).
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner (uid in the sandbox).
    pub uid: u32,
    /// Group (gid in the sandbox).
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd` (empty when it names none).
    pub owner: String,
    /// The group's name in the sandbox's `/etc/group` (empty when it names none).
    pub group: String,
    /// Modification time, seconds since the Unix epoch.
    pub modified_secs: i64,
    /// Nanoseconds part of the modification time.
    pub modified_nanos: u32,
    /// Target of a symlink.
    pub symlink_target: Option<String>,
}

/// Description of a path (a final symlink described, not followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path described: the one asked for, joined to the agent's home when it is
    /// relative (not otherwise normalised; non-UTF-8 bytes replaced by U+FFFD).
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner (uid in the sandbox).
    pub uid: u32,
    /// Group (gid in the sandbox).
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd` (empty when it names none).
    pub owner: String,
    /// The group's name in the sandbox's `/etc/group` (empty when it names none).
    pub group: String,
    /// Modification time, seconds since the Unix epoch.
    pub modified_secs: i64,
    /// Nanoseconds part of the modification time.
    pub modified_nanos: u32,
    /// Target of a symlink.
    pub symlink_target: Option<String>,
}

/// A change under a watched directory. Paths are relative to the watched directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEvent {
    /// A file or directory appeared (created, or moved in).
    Created {
        /// Relative path.
        path: String,
        /// Whether it is a directory.
        dir: bool,
    },
    /// A file's content changed.
    Modified {
        /// Relative path.
        path: String,
    },
    /// A file or directory disappeared (removed, or moved out).
    Removed {
        /// Relative path.
        path: String,
        /// Whether it was a directory.
        dir: bool,
    },
    /// Renamed within the watched tree.
    Renamed {
        /// Old relative path.
        from: String,
        /// New relative path.
        to: String,
    },
    /// The kernel dropped events (its queue overflowed while the client read slowly);
    /// the client should rescan.
    Overflow,
}

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEndReason {
    /// The client sent `Input::Close`.
    Closed,
    /// The watched directory was removed or moved away.
    RootGone,
}

/// A typed error with a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct WireError {
    /// The class of failure, for programs.
    pub kind: ErrorKind,
    /// Details, for people.
    pub message: String,
}

impl WireError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Classes of failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// No such file, directory or program.
    NotFound,
    /// Not allowed.
    PermissionDenied,
    /// A directory where a file was expected.
    IsADirectory,
    /// A file where a directory was expected.
    NotADirectory,
    /// The target exists.
    AlreadyExists,
    /// The request is malformed or its arguments are out of range.
    InvalidArgument,
    /// Any other I/O failure.
    Io,
    /// The client's protocol version is not the agent's.
    UnsupportedVersion,
    /// The peer broke the protocol (garbage, oversized frame, out-of-order message).
    Protocol,
    /// The agent refuses more connections for now.
    Busy,
    /// The sandbox's disk (its disk limit) or a file size limit is full.
    NoSpace,
    /// The account named is not in the sandbox's `/etc/passwd`.
    UnknownUser,
    /// Nothing accepts connections on the port asked for.
    PortClosed,
}

impl ErrorKind {
    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::PermissionDenied => "permission_denied",
            Self::IsADirectory => "is_a_directory",
            Self::NotADirectory => "not_a_directory",
            Self::AlreadyExists => "already_exists",
            Self::InvalidArgument => "invalid_argument",
            Self::Io => "io",
            Self::UnsupportedVersion => "unsupported_version",
            Self::Protocol => "protocol",
            Self::Busy => "busy",
            Self::NoSpace => "no_space",
            Self::UnknownUser => "unknown_user",
            Self::PortClosed => "port_closed",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Operation {
    /// This operation as `user` ([`Operation::AsUser`]); itself when `None`.
    pub fn as_user(self, user: Option<Account>) -> Self {
        match user {
            Some(user) => Operation::AsUser {
                user,
                op: Box::new(self),
            },
            None => self,
        }
    }
}

#[cfg(test)]
mod range_tests {
    use super::ByteRange;

    #[test]
    fn ranges_resolve_like_http_byte_ranges() {
        use ByteRange::*;
        assert_eq!(All.resolve(0), Some((0, 0)));
        assert_eq!(All.resolve(10), Some((0, 10)));
        assert_eq!(From(3).resolve(10), Some((3, 7)));
        assert_eq!(From(10).resolve(10), None);
        assert_eq!(Span { first: 2, last: 4 }.resolve(10), Some((2, 3)));
        assert_eq!(Span { first: 2, last: 99 }.resolve(10), Some((2, 8)));
        assert_eq!(
            Span {
                first: 10,
                last: 12
            }
            .resolve(10),
            None
        );
        assert_eq!(Last(3).resolve(10), Some((7, 3)));
        assert_eq!(Last(30).resolve(10), Some((0, 10)));
        assert_eq!(Last(0).resolve(10), None);
        assert_eq!(Last(5).resolve(0), None);
    }

    #[test]
    fn range_headers_parse_one_range_and_nothing_else() {
        use ByteRange::*;
        assert_eq!(
            ByteRange::parse_header("bytes=0-99"),
            Some(Span { first: 0, last: 99 })
        );
        assert_eq!(ByteRange::parse_header("bytes=5-"), Some(From(5)));
        assert_eq!(ByteRange::parse_header("bytes=-7"), Some(Last(7)));
        for bad in [
            "bytes=5-2",
            "bytes=-",
            "bytes=0-1,3-4",
            "items=0-1",
            "bytes=a-b",
            "bytes=+1-2",
            "",
        ] {
            assert_eq!(ByteRange::parse_header(bad), None, "{bad}");
        }
    }
}
