//! A QMP client (QEMU's JSON control socket), blocking: one command at a time, each
//! answer bounded. QEMU runs guest-driven emulation, so its lines are read like any
//! other untrusted input: at most [`MAX_LINE`] bytes, events skipped, a timeout.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Longest QMP line read (the console's 64 KiB ring read back, each byte escaped as
/// JSON at worst: six).
pub const MAX_LINE: usize = 512 * 1024;
/// How long a command's answer may take.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// Writes `bytes` with `fd` attached (one `sendmsg`; the rest, if any, plainly).
fn send_with_fd(
    socket: &UnixStream,
    bytes: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    use std::mem::MaybeUninit;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    let sent = sendmsg(
        socket,
        &[io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(io::Error::from)?;
    let mut w = socket;
    w.write_all(&bytes[sent..])
}

/// A connected, capability-negotiated QMP session.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to `path` (waiting up to `wait` for QEMU to create it), reads the
    /// greeting and leaves capability negotiation.
    pub fn connect(path: &Path, wait: Duration) -> io::Result<Self> {
        let deadline = Instant::now() + wait;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        let mut qmp = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        let greeting = qmp.line()?;
        if greeting.get("QMP").is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no QMP greeting",
            ));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments`; its `return` value, or its error as an error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> io::Result<Value> {
        self.execute_with_fd(command, arguments, None)
    }

    /// [`Qmp::execute`], passing `fd` with the command (`SCM_RIGHTS`: how `getfd`
    /// receives a descriptor).
    pub fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> io::Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg)?;
        line.push(b'\n');
        match fd {
            None => self.writer.write_all(&line)?,
            Some(fd) => send_with_fd(&self.writer, &line, fd)?,
        }
        // One deadline for the answer, whatever events come before it.
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("QMP {command}: no answer"),
                ));
            }
            let v = self.line()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(io::Error::other(format!("QMP {command}: {e}")));
            }
            // An event: not the answer.
        }
    }

    /// The guest's run state (`running`, `paused`, …).
    pub fn status(&mut self) -> io::Result<String> {
        let v = self.execute("query-status", None)?;
        Ok(v["status"].as_str().unwrap_or_default().to_owned())
    }

    fn line(&mut self) -> io::Result<Value> {
        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "QMP closed"));
        }
        if n > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "QMP line over the bound",
            ));
        }
        serde_json::from_slice(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}
