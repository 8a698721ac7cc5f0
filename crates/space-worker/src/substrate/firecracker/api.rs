//! Firecracker's API: HTTP/1.1 with JSON bodies over the process's Unix socket, one
//! request per connection, every read bounded and the whole call (connect, request,
//! answer) within one deadline.
//!
//! The socket is in the execution's Firecracker directory, which the VM's uid owns: a
//! VMM could put a link there to another VM's API socket (or any socket root can
//! reach). So the socket is opened without following a link (the directory
//! `O_DIRECTORY|O_NOFOLLOW`, the socket `O_PATH|O_NOFOLLOW` and checked to be one),
//! connected through its descriptor (`/proc/self/fd/N`), and its peer must be the
//! recorded Firecracker process (`SO_PEERCRED`/`SO_PEERPIDFD`, its start time) before
//! any request is written.

use std::io::{Read, Write};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode, OFlags};

/// Longest an answer's head may be.
const MAX_HEAD: usize = 16 * 1024;
/// Longest an answer's body may be (instance info and errors are small).
const MAX_BODY: usize = 64 * 1024;

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be reached, or the connection failed.
    #[error("firecracker API socket: {0}")]
    Io(#[from] std::io::Error),
    /// Firecracker answered something that is not HTTP as it speaks it.
    #[error("firecracker API answer: {0}")]
    Malformed(String),
    /// Firecracker refused the request: its status and `fault_message`.
    #[error("firecracker refused {what}: {status} {message}")]
    Refused {
        /// The request (method and path).
        what: String,
        /// The HTTP status.
        status: u16,
        /// Firecracker's `fault_message` (or the body).
        message: String,
    },
}

/// One answer: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (at most [`MAX_BODY`] bytes).
    pub body: Vec<u8>,
}

/// The Firecracker process an API socket must be served by: its PID and start time
/// (`/proc/PID/stat` field 22), as recorded when the worker started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Its PID.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
}

/// A client of one Firecracker process's API socket.
#[derive(Debug, Clone)]
pub struct Api {
    socket: std::path::PathBuf,
    timeout: Duration,
    by: Served,
}

impl Api {
    /// The API at `socket`, served by process `by`, each call (connect, request and
    /// answer together) bounded by `timeout`.
    pub fn new(socket: &Path, timeout: Duration, by: Served) -> Self {
        Self {
            socket: socket.to_path_buf(),
            timeout,
            by,
        }
    }

    /// The same API with another bound per call.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            timeout,
            ..self.clone()
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A connection to the socket, never through a link, whose peer is the recorded
    /// Firecracker process; within `deadline` (a full backlog is waited out, not
    /// blocked on).
    fn connect(&self, deadline: Instant) -> Result<UnixStream, ApiError> {
        let unsafe_path = |why: &str| {
            ApiError::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{}: {why}", self.socket.display()),
            ))
        };
        let (Some(dir), Some(name)) = (self.socket.parent(), self.socket.file_name()) else {
            return Err(unsafe_path("no directory and name"));
        };
        let dir = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ApiError::Io(e.into()))?;
        let sock: OwnedFd = rustix::fs::openat(
            &dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ApiError::Io(e.into()))?;
        let st = rustix::fs::fstat(&sock).map_err(|e| ApiError::Io(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
            return Err(unsafe_path("not a socket (a link, or another file)"));
        }
        let by_fd = format!("/proc/self/fd/{}", sock.as_raw_fd());
        let addr =
            rustix::net::SocketAddrUnix::new(by_fd.as_str()).map_err(|e| ApiError::Io(e.into()))?;
        let fd = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| ApiError::Io(e.into()))?;
        loop {
            match rustix::net::connect(&fd, &addr) {
                Ok(()) => break,
                // A Unix socket's full backlog: EAGAIN, tried again until the deadline.
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    left(deadline)?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(ApiError::Io(e.into())),
            }
        }
        let stream = UnixStream::from(fd);
        stream.set_nonblocking(false)?;
        self.check_peer(&stream)?;
        Ok(stream)
    }

    /// The connection's peer is the recorded process.
    fn check_peer(&self, stream: &UnixStream) -> Result<(), ApiError> {
        let refused = |why: String| {
            ApiError::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not served by Firecracker (PID {}): {why}",
                    self.socket.display(),
                    self.by.pid
                ),
            ))
        };
        let (cred, live) =
            space_peer::peer_process(stream.as_fd()).map_err(|e| refused(e.to_string()))?;
        if cred.pid != self.by.pid
            || live.identity.pid != self.by.pid
            || live.identity.start_time != self.by.start_time
        {
            return Err(refused(format!("its peer is PID {}", cred.pid)));
        }
        Ok(())
    }

    /// `method path` with `body` (JSON) on a new connection: the answer, whatever its
    /// status.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        // Only the methods and plain paths this driver sends: nothing of a request
        // line can come from elsewhere.
        let plain = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic());
        if !matches!(method, "GET" | "PUT" | "PATCH") || !path.starts_with('/') || !plain(path) {
            return Err(ApiError::Malformed(format!("request {method} {path:?}")));
        }
        let deadline = Instant::now() + self.timeout;
        let stream = self.connect(deadline)?;
        let mut s = Bounded {
            stream: &stream,
            deadline,
        };
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n"
        );
        if !body.is_empty() {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        s.write_all(request.as_bytes())?;
        read_answer(&mut s)
    }

    /// [`Api::call`] that must answer 2xx: its body.
    pub fn ok(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Vec<u8>, ApiError> {
        let a = self.call(method, path, body)?;
        if (200..300).contains(&a.status) {
            return Ok(a.body);
        }
        Err(ApiError::Refused {
            what: format!("{method} {path}"),
            status: a.status,
            message: fault_message(&a.body),
        })
    }

    /// `PUT path body`, which must succeed.
    pub fn put(&self, path: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        self.ok("PUT", path, Some(body)).map(drop)
    }

    /// `PATCH path body`, which must succeed.
    pub fn patch(&self, path: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        self.ok("PATCH", path, Some(body)).map(drop)
    }

    /// `GET /`: the instance's `state` (`Not started`, `Running`, `Paused`).
    pub fn state(&self) -> Result<String, ApiError> {
        let body = self.ok("GET", "/", None)?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::Malformed(format!("instance info: {e}")))?;
        v["state"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Malformed("instance info without a state".into()))
    }
}

/// The time left until `deadline`, or a timeout.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the firecracker API call took too long",
            )
        })
}

/// A connection whose every read and write gets only the time left to the call: a
/// VMM answering a byte at a time cannot stretch a call past its deadline.
struct Bounded<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(left(self.deadline)?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(left(self.deadline)?))?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Firecracker's error text: `fault_message` of a JSON body, else the body itself
/// (bounded, lossy).
pub fn fault_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["fault_message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&body[..body.len().min(512)])
                .trim()
                .to_owned()
        })
}

/// Reads one answer: a status line, headers, and a body of `Content-Length` bytes (or
/// up to the end of the connection without one). Chunked answers are refused: the API
/// does not send them.
pub fn read_answer(r: &mut impl Read) -> Result<Answer, ApiError> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(ApiError::Malformed(format!("a head over {MAX_HEAD} bytes")));
        }
        let mut chunk = [0u8; 4096];
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Err(ApiError::Malformed(
                "the connection ended in the head".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ApiError::Malformed("a head that is not text".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next(), parts.next());
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(ApiError::Malformed(format!("status line {status_line:?}")));
    }
    let status: u16 = code
        .and_then(|c| c.parse().ok())
        .filter(|c| (100..600).contains(c))
        .ok_or_else(|| ApiError::Malformed(format!("status line {status_line:?}")))?;
    let mut length: Option<usize> = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ApiError::Malformed(format!("header line {line:?}")));
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ApiError::Malformed(format!("transfer-encoding {value}")));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| ApiError::Malformed(format!("content-length {value:?}")))?;
            if length.replace(n).is_some_and(|m| m != n) {
                return Err(ApiError::Malformed("two content-lengths".into()));
            }
        }
    }
    let mut body = buf.split_off(head_end + 4);
    match length {
        Some(n) if n > MAX_BODY => {
            return Err(ApiError::Malformed(format!("a body of {n} bytes")));
        }
        Some(n) => {
            if body.len() > n {
                return Err(ApiError::Malformed("more bytes than content-length".into()));
            }
            let mut rest = vec![0u8; n - body.len()];
            r.read_exact(&mut rest)?;
            body.extend_from_slice(&rest);
        }
        // 204 and other bodiless answers: nothing follows.
        None if status == 204 || status == 304 || status < 200 => body.clear(),
        None => {
            r.take((MAX_BODY + 1 - body.len().min(MAX_BODY)) as u64)
                .read_to_end(&mut body)?;
            if body.len() > MAX_BODY {
                return Err(ApiError::Malformed(format!("a body over {MAX_BODY} bytes")));
            }
        }
    }
    Ok(Answer { status, body })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process, which serves the tests' listeners.
    fn this_process() -> Served {
        let me = space_peer::LiveProcess::open(std::process::id()).unwrap();
        Served {
            pid: me.identity.pid,
            start_time: me.identity.start_time,
        }
    }

    /// A listener that reads a request and answers 204 to every connection; how many it got.
    fn server(
        listener: std::os::unix::net::UnixListener,
    ) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = count.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { return };
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 204 \r\n\r\n");
            }
        });
        count
    }

    #[test]
    fn an_api_socket_replaced_by_a_link_to_another_listener_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Another VM's API socket (or any socket root can reach), served by a process
        // that passes the peer check: only the link itself stands in the way.
        let other = dir.path().join("other.sock");
        let reached = server(std::os::unix::net::UnixListener::bind(&other).unwrap());
        let fc = dir.path().join("fc-1");
        std::fs::create_dir(&fc).unwrap();
        std::os::unix::fs::symlink(&other, fc.join("api.sock")).unwrap();
        let api = Api::new(&fc.join("api.sock"), Duration::from_secs(5), this_process());
        let err = api
            .patch("/vm", &serde_json::json!({"state": "Paused"}))
            .unwrap_err();
        assert!(err.to_string().contains("not a socket"), "{err}");
        // The directory itself a link: refused too.
        std::os::unix::fs::symlink(&fc, dir.path().join("fc-2")).unwrap();
        std::fs::remove_file(fc.join("api.sock")).unwrap();
        let _own = server(std::os::unix::net::UnixListener::bind(fc.join("api.sock")).unwrap());
        let via = Api::new(
            &dir.path().join("fc-2/api.sock"),
            Duration::from_secs(5),
            this_process(),
        );
        assert!(via.state().is_err());
        assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The real socket, by its real path: reached.
        Api::new(&fc.join("api.sock"), Duration::from_secs(5), this_process())
            .ok("GET", "/", None)
            .unwrap();
    }

    #[test]
    fn an_api_socket_served_by_another_process_than_the_recorded_one_gets_no_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { return };
                let mut buf = [0u8; 256];
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let n = s.read(&mut buf).unwrap_or(0);
                g.lock().unwrap().extend_from_slice(&buf[..n]);
                let _ = s.write_all(b"HTTP/1.1 204 \r\n\r\n");
            }
        });
        // The recorded Firecracker is another process (a child of this test).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let recorded = space_peer::LiveProcess::open(child.id()).unwrap().identity;
        let api = Api::new(
            &path,
            Duration::from_secs(5),
            Served {
                pid: recorded.pid,
                start_time: recorded.start_time,
            },
        );
        let err = api
            .patch("/vm", &serde_json::json!({"state": "Resumed"}))
            .unwrap_err();
        assert!(
            err.to_string().contains("not served by Firecracker"),
            "{err}"
        );
        // This process with another start time (a reused PID): refused too.
        let reused = Served {
            start_time: this_process().start_time + 1,
            ..this_process()
        };
        assert!(
            Api::new(&path, Duration::from_secs(5), reused)
                .state()
                .is_err()
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(got.lock().unwrap().is_empty(), "a request was sent");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn an_answer_trickled_a_byte_at_a_time_ends_at_the_calls_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            // Every read gets a byte well within a per-read timeout, without end.
            for b in b"HTTP/1.1 200 OK\r\nX: "
                .iter()
                .chain(std::iter::repeat(&b'a'))
            {
                if s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let started = Instant::now();
        let err = Api::new(&path, Duration::from_millis(500), this_process())
            .state()
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, ApiError::Io(_)), "{err}");
    }

    fn answer(bytes: &[u8]) -> Result<Answer, ApiError> {
        read_answer(&mut std::io::Cursor::new(bytes.to_vec()))
    }

    #[test]
    fn a_no_content_answer_and_a_json_answer_are_read_whole() {
        let a =
            answer(b"HTTP/1.1 204 \r\nServer: Firecracker API\r\nConnection: keep-alive\r\n\r\n")
                .unwrap();
        assert_eq!((a.status, a.body.len()), (204, 0));
        let a = answer(
            b"HTTP/1.1 400 \r\nContent-Type: application/json\r\nContent-Length: 31\r\n\r\n{\"fault_message\":\"bad drive\"}  ",
        )
        .unwrap();
        assert_eq!(a.status, 400);
        assert_eq!(fault_message(&a.body), "bad drive");
    }

    #[test]
    fn hostile_answers_are_refused_not_buffered_without_end() {
        let big_head = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &vec![b'a'; 20_000]].concat();
        assert!(matches!(answer(&big_head), Err(ApiError::Malformed(_))));
        let big_body = b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n";
        assert!(matches!(answer(big_body), Err(ApiError::Malformed(_))));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert!(matches!(answer(chunked), Err(ApiError::Malformed(_))));
        let two = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab";
        assert!(matches!(answer(two), Err(ApiError::Malformed(_))));
        assert!(matches!(
            answer(b"SSH-2.0\r\n\r\n"),
            Err(ApiError::Malformed(_))
        ));
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
        assert!(matches!(answer(short), Err(ApiError::Io(_))));
    }

    #[test]
    fn a_call_writes_one_json_request_and_reads_its_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while find(&got, b"}").is_none() {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 204 \r\n\r\n").unwrap();
            String::from_utf8(got).unwrap()
        });
        let api = Api::new(&path, Duration::from_secs(5), this_process());
        api.put(
            "/actions",
            &serde_json::json!({"action_type": "InstanceStart"}),
        )
        .unwrap();
        let request = server.join().unwrap();
        assert!(
            request.starts_with("PUT /actions HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("Content-Type: application/json\r\n"));
        assert!(request.contains("Content-Length: 31\r\n"), "{request}");
        assert!(request.ends_with("\r\n\r\n{\"action_type\":\"InstanceStart\"}"));
    }
}
