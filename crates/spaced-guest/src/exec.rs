//! Running a process: spawn (with pipes or a PTY), then one event loop that moves
//! bytes between the child and the socket with backpressure in both directions.
//!
//! Memory per running process is bounded by one outgoing frame (at most
//! [`MAX_CHUNK`] of output) and one incoming frame (at most the frame cap of stdin):
//! the child's output is read only when the previous frame has left, and the socket is
//! read only when the previous stdin bytes have reached the child. A child that writes
//! faster than the client reads blocks on its full pipe.
//!
//! With `max_output_bytes` (a non-streaming exec, collected whole by the host), each
//! stream is sent up to that cap ([`OutputCap`]); the rest is still read — the child
//! must not block on a full pipe — and dropped, and `Exited` says which streams were
//! cut.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{Mode, OFlags};
use rustix::termios::Winsize;
use space_proto::frame::FrameReader;
use space_proto::guest::{
    AgentBody, ErrorKind, ExecSpec, ExitOutcome, ExitStatus, Input, MAX_CHUNK, OutputCap, PtySize,
    RequestId, WireError,
};

use crate::accounts;
use crate::agent::Agent;
use crate::conn::{Conn, DontWait, End, Flow, io_error};
use crate::files::resolve;
use crate::sys;

/// `PATH` of the default environment.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long, after the child exits, to wait for its output pipes to close. Background
/// processes that inherited them may keep them open for ever; the exit is reported
/// after this grace with whatever output is buffered by then.
const LINGER: Duration = Duration::from_millis(50);

/// Output read after the grace, at most: a background process flooding the pipe must
/// not keep the request alive.
const DRAIN_LIMIT: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn body(self, data: Vec<u8>) -> AgentBody {
        match self {
            Self::Stdout => AgentBody::Stdout(data),
            Self::Stderr => AgentBody::Stderr(data),
        }
    }
}

/// The caps of a non-streaming exec's streams (`None`: no cap).
struct Caps(Option<[OutputCap; 2]>);

impl Caps {
    fn new(spec: &ExecSpec) -> Self {
        Self(
            spec.max_output_bytes
                .map(|n| [OutputCap::new(n), OutputCap::new(n)]),
        )
    }

    fn slot(stream: Stream) -> usize {
        match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    /// What of `data`, read from `stream`, to send (empty: nothing).
    fn admit(&mut self, stream: Stream, data: &[u8]) -> Vec<u8> {
        match &mut self.0 {
            None => data.to_vec(),
            Some(caps) => {
                let mut out = Vec::new();
                caps[Self::slot(stream)].push(data, &mut out);
                out
            }
        }
    }

    /// `stream` ended: what its cap still held back.
    fn finish(&mut self, stream: Stream) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(caps) = &mut self.0 {
            caps[Self::slot(stream)].finish(&mut out);
        }
        out
    }

    fn truncated(&self, stream: Stream) -> bool {
        self.0
            .as_ref()
            .is_some_and(|caps| caps[Self::slot(stream)].truncated())
    }
}

struct Output {
    fd: OwnedFd,
    stream: Stream,
    open: bool,
}

/// A spawned child. Dropping it before the child was reaped kills its process group
/// and reaps it: a request that ends early (client gone, protocol error) leaves no
/// process behind.
struct Running {
    child: Child,
    pgid: Pid,
    pidfd: OwnedFd,
    outputs: Vec<Output>,
    stdin: Option<OwnedFd>,
    pty_master: Option<OwnedFd>,
    reaped: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = killpg(self.pgid, Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Runs `spec` and streams its output as answers to request `id`.
pub(crate) fn run(conn: &mut Conn<'_>, id: RequestId, spec: ExecSpec) -> Flow {
    let mut running = match spawn(conn.agent, &spec) {
        Ok(r) => r,
        Err(Refused::Error(e)) => return conn.send_error(id, e),
        Err(Refused::NotRunnable { code, message }) => {
            return not_runnable(conn, id, &spec, code, &message);
        }
    };
    conn.send(
        id,
        AgentBody::Started {
            pid: running.child.id(),
        },
    )?;
    pump(conn, id, &mut running, &spec)
}

/// Why a process did not start.
enum Refused {
    /// The request cannot be run as given (bad cwd, environment, a failed setup).
    Error(WireError),
    /// The program could not be executed (`execve` failed): answered like a shell
    /// does, with an exit code (127 not found, 126 not executable) and a message.
    NotRunnable { code: i32, message: String },
}

impl From<WireError> for Refused {
    fn from(e: WireError) -> Self {
        Self::Error(e)
    }
}

/// Answers a program that could not be executed as a process that ran and failed:
/// `Started` with pid 0 (no process exists), the message on stderr (on the terminal
/// under a PTY), then `Exited` with `code`. Clients see the same outcome as from a
/// shell (`sh: nope: not found`, 127), whether they collect or stream.
fn not_runnable(
    conn: &mut Conn<'_>,
    id: RequestId,
    spec: &ExecSpec,
    code: i32,
    message: &str,
) -> Flow {
    conn.send(id, AgentBody::Started { pid: 0 })?;
    let line = format!("{message}\n").into_bytes();
    let mut caps = Caps::new(spec);
    let stream = if spec.pty.is_some() {
        Stream::Stdout
    } else {
        Stream::Stderr
    };
    let mut data = caps.admit(stream, &line);
    data.extend(caps.finish(stream));
    if !data.is_empty() {
        conn.send(id, stream.body(data))?;
    }
    conn.send(
        id,
        AgentBody::Exited(ExitStatus {
            outcome: ExitOutcome::Code(code),
            timed_out: false,
            stdout_truncated: caps.truncated(Stream::Stdout),
            stderr_truncated: caps.truncated(Stream::Stderr),
        }),
    )
}

/// The shell's answer to an `execve` of `program` that failed with `e`, or `None` when
/// the failure is not about the program.
fn exec_failure(program: &str, e: &io::Error) -> Option<Refused> {
    let (code, what) = match e.raw_os_error()? {
        libc::ENOENT if program.contains('/') && std::path::Path::new(program).exists() => {
            (127, "cannot run it: its interpreter was not found")
        }
        libc::ENOENT => (127, "command not found"),
        libc::EACCES | libc::EPERM => (126, "permission denied"),
        libc::ENOEXEC => (126, "cannot execute: exec format error"),
        libc::EISDIR => (126, "is a directory"),
        libc::ENOTDIR => (
            127,
            "command not found (a path component is not a directory)",
        ),
        _ => return None,
    };
    Some(Refused::NotRunnable {
        code,
        message: format!("space: {program}: {what}"),
    })
}

fn invalid(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorKind::InvalidArgument, msg)
}

fn spawn(agent: &Agent, spec: &ExecSpec) -> Result<Running, Refused> {
    let Some(program) = spec.argv.first() else {
        return Err(invalid("empty argv").into());
    };
    let identity = accounts::take(spec.user.as_ref())?;
    let home = identity
        .as_ref()
        .map_or(agent.home.clone(), |id| id.home.clone());
    let cwd = match (&spec.cwd, &identity) {
        (Some(c), Some(_)) => home.join(c),
        (Some(c), None) => resolve(agent, c)?,
        (None, Some(id)) => id.default_cwd(),
        (None, None) => agent.home.clone(),
    };
    check_cwd(&cwd)?;
    let mut cmd = Command::new(program);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .current_dir(&cwd);
    if let Some(id) = &identity {
        cmd.env("USER", &id.name).env("LOGNAME", &id.name);
        if let Some(shell) = &id.shell {
            cmd.env("SHELL", shell);
        }
    }
    if spec.pty.is_some() {
        cmd.env("TERM", "xterm-256color");
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(invalid(format!("invalid environment variable {k:?}")).into());
        }
        cmd.env(k, v);
    }
    let spawn_err = |e: io::Error| io_error(&format!("spawn {program}"), &e);
    let pty_master = match spec.pty {
        Some(size) => {
            let (master, slave) = open_pty(size).map_err(|e| io_error("open pty", &e))?;
            if let Some(id) = &identity {
                // The terminal is the account's, as login makes it.
                let _ =
                    rustix::fs::fchown(&slave, Some(rustix::process::Uid::from_raw(id.uid)), None);
            }
            cmd.stdin(Stdio::from(slave.try_clone().map_err(spawn_err)?))
                .stdout(Stdio::from(slave.try_clone().map_err(spawn_err)?))
                .stderr(Stdio::from(slave));
            sys::new_session_with_controlling_tty(&mut cmd);
            Some(master)
        }
        None => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            None
        }
    };
    // After the terminal's session setup (which needs root's right to take the tty).
    if let Some(id) = identity {
        sys::run_as(&mut cmd, id.uid, id.gid, id.groups);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Err(exec_failure(program, &e).unwrap_or_else(|| spawn_err(e).into())),
    };
    // The Command holds the parent's copies of the PTY slave: close them now, or the
    // master would never see the terminal hang up.
    drop(cmd);
    let pgid = Pid::from_raw(child.id() as i32);
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    );
    let pidfd = match pidfd {
        Ok(fd) => fd,
        Err(e) => {
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
            return Err(io_error("pidfd_open", &e.into()).into());
        }
    };
    let mut running = Running {
        pgid,
        pidfd,
        outputs: Vec::new(),
        stdin: None,
        pty_master: None,
        reaped: false,
        child,
    };
    let setup = |running: &mut Running| -> io::Result<()> {
        if let Some(master) = pty_master {
            set_nonblocking(&master)?;
            running.outputs.push(Output {
                fd: master.try_clone()?,
                stream: Stream::Stdout,
                open: true,
            });
            running.stdin = Some(master.try_clone()?);
            running.pty_master = Some(master);
        } else {
            let pipes = (
                running.child.stdin.take(),
                running.child.stdout.take(),
                running.child.stderr.take(),
            );
            if let (Some(i), Some(o), Some(e)) = pipes {
                let (i, o, e) = (OwnedFd::from(i), OwnedFd::from(o), OwnedFd::from(e));
                for fd in [&i, &o, &e] {
                    set_nonblocking(fd)?;
                }
                running.stdin = Some(i);
                running.outputs.push(Output {
                    fd: o,
                    stream: Stream::Stdout,
                    open: true,
                });
                running.outputs.push(Output {
                    fd: e,
                    stream: Stream::Stderr,
                    open: true,
                });
            }
        }
        Ok(())
    };
    setup(&mut running).map_err(|e| Refused::Error(io_error("exec setup", &e)))?;
    Ok(running)
}

fn check_cwd(cwd: &PathBuf) -> Result<(), WireError> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(WireError::new(
            ErrorKind::NotADirectory,
            format!("cwd {}: not a directory", cwd.display()),
        )),
        Err(e) => Err(io_error(&format!("cwd {}", cwd.display()), &e)),
    }
}

fn winsize(size: PtySize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a PTY pair with both ends close-on-exec from the start, so a process spawned
/// by another connection at the same moment cannot inherit this one's terminal.
fn open_pty(size: PtySize) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(&master, winsize(size))?;
    Ok((master, slave))
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
    Ok(())
}

/// Bytes waiting to go somewhere, with how much of them already went.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    pos: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn set(&mut self, buf: Vec<u8>) {
        self.buf = buf;
        self.pos = 0;
    }

    fn clear(&mut self) {
        self.buf = Vec::new();
        self.pos = 0;
    }
}

/// Where each polled descriptor sits in the poll set of one iteration.
#[derive(Default)]
struct Slots {
    socket: Option<usize>,
    stdin: Option<usize>,
    pidfd: Option<usize>,
    outputs: Vec<(usize, usize)>,
}

fn pump(conn: &mut Conn<'_>, id: RequestId, r: &mut Running, spec: &ExecSpec) -> Flow {
    let is_pty = spec.pty.is_some();
    let deadline = spec
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let mut outbox = Pending::default();
    let mut stdin = Pending::default();
    let mut close_stdin_after = false;
    if let Some(bytes) = &spec.stdin {
        stdin.set(bytes.clone());
        close_stdin_after = !is_pty;
    }
    if stdin.is_empty() && close_stdin_after {
        r.stdin = None;
    }
    let mut inbox = FrameReader::new();
    let mut status: Option<std::process::ExitStatus> = None;
    let mut exited_at = Instant::now();
    let mut timed_out = false;
    let mut readbuf = vec![0u8; MAX_CHUNK];
    let mut rotate = 0usize;
    let mut caps = Caps::new(spec);

    loop {
        if let Some(st) = status {
            let outputs_done = r.outputs.iter().all(|o| !o.open);
            if outbox.is_empty() && (outputs_done || exited_at.elapsed() >= LINGER) {
                drain(conn, id, r, &mut readbuf, &mut caps)?;
                let outcome = match (st.code(), st.signal()) {
                    (Some(c), _) => ExitOutcome::Code(c),
                    (None, Some(s)) => ExitOutcome::Signal(s),
                    (None, None) => ExitOutcome::Code(-1),
                };
                return conn.send(
                    id,
                    AgentBody::Exited(ExitStatus {
                        outcome,
                        timed_out,
                        stdout_truncated: caps.truncated(Stream::Stdout),
                        stderr_truncated: caps.truncated(Stream::Stderr),
                    }),
                );
            }
        }

        // One poll set per iteration: what we wait for depends on what is pending.
        let mut slots = Slots::default();
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(5);
        let mut sock_events = PollFlags::empty();
        if stdin.is_empty() {
            sock_events |= PollFlags::IN;
        }
        if !outbox.is_empty() {
            sock_events |= PollFlags::OUT;
        }
        slots.socket = Some(fds.len());
        fds.push(PollFd::new(&conn.stream, sock_events));
        if let (false, Some(fd)) = (stdin.is_empty(), &r.stdin) {
            slots.stdin = Some(fds.len());
            fds.push(PollFd::new(fd, PollFlags::OUT));
        }
        if status.is_none() {
            slots.pidfd = Some(fds.len());
            fds.push(PollFd::new(&r.pidfd, PollFlags::IN));
        }
        if outbox.is_empty() {
            let n = r.outputs.len();
            for k in 0..n {
                let i = (k + rotate) % n;
                if r.outputs[i].open {
                    slots.outputs.push((fds.len(), i));
                    fds.push(PollFd::new(&r.outputs[i].fd, PollFlags::IN));
                }
            }
            rotate = rotate.wrapping_add(1);
        }
        let now = Instant::now();
        let mut wait: Option<Duration> = None;
        if let (false, Some(d)) = (timed_out, deadline) {
            wait = Some(d.saturating_duration_since(now));
        }
        if status.is_some() && outbox.is_empty() {
            let left = LINGER.saturating_sub(exited_at.elapsed());
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
        let ts = wait.map(|w| Timespec {
            tv_sec: w.as_secs() as i64,
            tv_nsec: i64::from(w.subsec_nanos()),
        });
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) => {}
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(_) => return Err(End::Gone),
        }
        let revents = |slot: Option<usize>| slot.map_or(PollFlags::empty(), |i| fds[i].revents());
        let sock = revents(slots.socket);
        let stdin_ready = revents(slots.stdin);
        let exited = !revents(slots.pidfd).is_empty();
        let ready_output = slots
            .outputs
            .iter()
            .find(|(slot, _)| !fds[*slot].revents().is_empty())
            .map(|&(_, i)| i);
        drop(fds);

        if deadline.is_some_and(|d| Instant::now() >= d) && !timed_out && status.is_none() {
            timed_out = true;
            let _ = killpg(r.pgid, Signal::SIGKILL);
        }
        if exited {
            if let Ok(Some(st)) = r.child.try_wait() {
                status = Some(st);
                r.reaped = true;
                exited_at = Instant::now();
            }
        }
        if sock.contains(PollFlags::OUT)
            || (!outbox.is_empty() && sock.intersects(PollFlags::ERR | PollFlags::HUP))
        {
            flush(conn, &mut outbox)?;
        }
        if sock.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            if !stdin.is_empty() && !sock.contains(PollFlags::IN) {
                return Err(End::Gone);
            }
            read_inputs(
                conn,
                id,
                &mut inbox,
                r,
                &mut stdin,
                &mut close_stdin_after,
                is_pty,
            )?;
        }
        if !stdin_ready.is_empty() {
            write_stdin(r, &mut stdin, &mut close_stdin_after);
        }
        if let Some(i) = ready_output {
            let stream = r.outputs[i].stream;
            let data = match read_output(&r.outputs[i].fd, &mut readbuf) {
                // Past its cap, a stream's bytes are dropped here.
                Chunk::Data(n) => caps.admit(stream, &readbuf[..n]),
                Chunk::Nothing => Vec::new(),
                Chunk::End => {
                    r.outputs[i].open = false;
                    caps.finish(stream)
                }
            };
            if !data.is_empty() {
                outbox.set(conn.frame(id, stream.body(data)));
                // Most of the time the socket has room: skip a poll round trip.
                flush(conn, &mut outbox)?;
            }
        }
    }
}

/// What a read of an output descriptor found.
enum Chunk {
    Data(usize),
    /// Nothing right now (a spurious wake-up).
    Nothing,
    /// End of stream, or EIO: every holder of the PTY slave closed it.
    End,
}

fn read_output(fd: &OwnedFd, buf: &mut [u8]) -> Chunk {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(0) => return Chunk::End,
            Ok(n) => return Chunk::Data(n),
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) if e == rustix::io::Errno::AGAIN => return Chunk::Nothing,
            Err(_) => return Chunk::End,
        }
    }
}

fn flush(conn: &mut Conn<'_>, outbox: &mut Pending) -> Flow {
    use std::io::Write;
    while !outbox.is_empty() {
        match DontWait(&conn.stream).write(&outbox.buf[outbox.pos..]) {
            Ok(n) => outbox.pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(End::Gone),
        }
    }
    outbox.clear();
    Ok(())
}

fn read_inputs(
    conn: &mut Conn<'_>,
    id: RequestId,
    inbox: &mut FrameReader,
    r: &mut Running,
    stdin: &mut Pending,
    close_stdin_after: &mut bool,
    is_pty: bool,
) -> Flow {
    // Stop after a stdin chunk: the next is read only once this one reached the child.
    while stdin.is_empty() {
        let body = match inbox.poll_read(&mut DontWait(&conn.stream)) {
            Ok(Some(body)) => body,
            Ok(None) => return Ok(()),
            Err(e) => return Err(conn.frame_failed(e)),
        };
        let frame = conn.decode(&body)?;
        let Some(input) = conn.input_for(Some(id), frame)? else {
            continue;
        };
        match input {
            Input::Stdin(bytes) => {
                if r.stdin.is_some() && !*close_stdin_after {
                    stdin.set(bytes);
                }
            }
            Input::CloseStdin => {
                if !is_pty {
                    r.stdin = None;
                }
            }
            Input::Resize(size) => {
                if let Some(m) = &r.pty_master {
                    let _ = rustix::termios::tcsetwinsize(m, winsize(size));
                }
            }
            Input::Signal(n) => {
                // A number that is no signal is ignored: the process runs on, as it
                // would had the signal been blocked.
                let _ = crate::sys::signal_group(r.pgid.as_raw(), n);
            }
            other @ (Input::Data(_) | Input::End | Input::Close) => {
                return Err(conn.refuse(
                    ErrorKind::Protocol,
                    format!("{other:?} is not input for a process"),
                ));
            }
        }
    }
    Ok(())
}

fn write_stdin(r: &mut Running, stdin: &mut Pending, close_after: &mut bool) {
    let Some(fd) = &r.stdin else {
        stdin.clear();
        return;
    };
    while !stdin.is_empty() {
        match rustix::io::write(fd, &stdin.buf[stdin.pos..]) {
            Ok(n) => stdin.pos += n,
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) if e == rustix::io::Errno::AGAIN => return,
            // EPIPE: the child closed its stdin; what it did not read is dropped.
            Err(_) => {
                r.stdin = None;
                stdin.clear();
                return;
            }
        }
    }
    stdin.clear();
    if *close_after {
        r.stdin = None;
    }
}

/// After the grace period, sends what the outputs hold right now (up to a limit), and
/// what the caps held back.
fn drain(
    conn: &mut Conn<'_>,
    id: RequestId,
    r: &mut Running,
    buf: &mut [u8],
    caps: &mut Caps,
) -> Flow {
    let mut budget = DRAIN_LIMIT;
    for i in 0..r.outputs.len() {
        let stream = r.outputs[i].stream;
        while r.outputs[i].open && budget > 0 {
            match rustix::io::read(r.outputs[i].fd.as_fd(), &mut *buf) {
                Ok(0) | Err(_) => r.outputs[i].open = false,
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    let data = caps.admit(stream, &buf[..n]);
                    if !data.is_empty() {
                        conn.send(id, stream.body(data))?;
                    }
                }
            }
        }
        let held = caps.finish(stream);
        if !held.is_empty() {
            conn.send(id, stream.body(held))?;
        }
    }
    Ok(())
}
