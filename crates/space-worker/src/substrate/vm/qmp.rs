//! A QMP client (QEMU's JSON control socket), blocking: one command at a time, each
//! answer bounded. QEMU runs guest-driven emulation, so its lines are read like any
//! other untrusted input: at most [`MAX_LINE`] bytes, events skipped, a timeout.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Longest QMP line read.
pub const MAX_LINE: usize = 64 * 1024;

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
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg)?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
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
