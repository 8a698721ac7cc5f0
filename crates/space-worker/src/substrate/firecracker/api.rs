//! Firecracker's API: HTTP/1.1 with JSON bodies over the process's Unix socket, one
//! request per connection, every read bounded and timed.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

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

/// A client of one Firecracker process's API socket.
#[derive(Debug, Clone)]
pub struct Api {
    socket: std::path::PathBuf,
    timeout: Duration,
}

impl Api {
    /// The API at `socket`, each call bounded by `timeout`.
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_path_buf(),
            timeout,
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
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
        let mut s = UnixStream::connect(&self.socket)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
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
        let api = Api::new(&path, Duration::from_secs(5));
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
