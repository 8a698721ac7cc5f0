//! `space-jail probe-agent`: the smallest agent that honours the agent calling
//! convention (listener on fd 3, activation on fd 4). Tests and benchmarks start it
//! as the jail's agent to run shell commands inside a real jail before the real
//! agent (`spaced-guest`) exists, and to measure the jail without the agent's cost.
//!
//! Protocol, one request per connection: the client sends one line, either a shell
//! command (run as `/bin/sh -c LINE`, stdin `/dev/null`) or `@activation`; the agent
//! answers one JSON object `{"exit_code", "stdout", "stderr"}` and closes. Output
//! is lossily decoded as UTF-8. Requests are served one at a time.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::fds::{ACTIVATION_FD, LISTEN_FD};
use crate::sys;

/// The request line that returns the activation bytes instead of running a command.
pub const ACTIVATION_REQUEST: &str = "@activation";

/// The answer to one request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeReply {
    /// Exit code of `/bin/sh`, or `128 + signal` when it was killed.
    pub exit_code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs the probe agent until its listener fails; returns the exit code.
pub fn run() -> i32 {
    let (Some(listener), Some(activation)) = (
        sys::take_inherited_fd(LISTEN_FD),
        sys::take_inherited_fd(ACTIVATION_FD),
    ) else {
        eprintln!("probe-agent: fds 3 (listener) and 4 (activation) must be open");
        return 2;
    };
    let mut activation_bytes = Vec::new();
    if let Err(e) = std::fs::File::from(activation).read_to_end(&mut activation_bytes) {
        eprintln!("probe-agent: reading activation: {e}");
        return 1;
    }
    let activation = String::from_utf8_lossy(&activation_bytes).into_owned();
    let listener = UnixListener::from(listener);
    loop {
        match listener.accept() {
            Ok((stream, _)) => serve(stream, &activation),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("probe-agent: accept: {e}");
                return 1;
            }
        }
    }
}

fn serve(stream: UnixStream, activation: &str) {
    let mut line = String::new();
    // A client that connects and leaves (a liveness or credentials check) sent
    // no request: there is nothing to run.
    if !matches!(BufReader::new(&stream).read_line(&mut line), Ok(n) if n > 0) {
        return;
    }
    let line = line.trim_end_matches('\n');
    let reply = if line == ACTIVATION_REQUEST {
        ProbeReply {
            exit_code: 0,
            stdout: activation.to_owned(),
            stderr: String::new(),
        }
    } else {
        run_shell(line)
    };
    let mut stream = stream;
    let body = serde_json::to_vec(&reply).unwrap_or_default();
    let _ = stream.write_all(&body);
}

fn run_shell(command: &str) -> ProbeReply {
    let output = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(out) => ProbeReply {
            exit_code: out
                .status
                .code()
                .or_else(|| out.status.signal().map(|s| 128 + s))
                .unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Err(e) => ProbeReply {
            exit_code: -1,
            stdout: String::new(),
            stderr: e.to_string(),
        },
    }
}
