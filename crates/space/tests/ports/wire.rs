//! Hand-written HTTP/1.1 over a raw `TcpStream` to the edge: the tests choose the
//! `Host` header, keep a connection alive across requests, and see exactly when the
//! edge closes it. Every read is bounded.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest a response head may be.
const MAX_HEAD: usize = 64 * 1024;
/// Longest a response body may be.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long one read may block unless a test says otherwise.
const READ_LIMIT: Duration = Duration::from_secs(30);

/// A response as read off the wire.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The `error` code of an error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }

    /// Whether the server said it closes the connection after this answer.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?} {}", self.status, self.headers, self.text())
    }
}

/// One client connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(READ_LIMIT)).expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            reader: BufReader::new(stream),
        }
    }

    /// Writes `bytes` as they are.
    pub fn write(&mut self, bytes: &[u8]) {
        self.reader
            .get_mut()
            .write_all(bytes)
            .expect("write to the edge");
    }

    /// Sends `method target` with `Host: host`, `headers` and no body; reads the answer.
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        host: &str,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        if method == "POST" {
            head.push_str("Content-Length: 0\r\n");
        }
        head.push_str("\r\n");
        self.write(head.as_bytes());
        self.read_answer(method == "CONNECT")
    }

    /// `GET path`.
    pub fn get(&mut self, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.request("GET", path, host, headers)
    }

    fn line(&mut self, budget: &mut usize) -> String {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(*budget as u64 + 1)
            .read_until(b'\n', &mut line)
            .expect("read a response line");
        assert!(n > 0, "the connection closed before a whole response head");
        assert!(n <= *budget, "response head over {MAX_HEAD} bytes");
        *budget -= n;
        String::from_utf8_lossy(&line).trim_end().to_owned()
    }

    /// Reads one answer; `connect` for the answer to a CONNECT (whose 2xx has no body).
    pub fn read_answer(&mut self, connect: bool) -> Answer {
        let mut budget = MAX_HEAD;
        let status_line = self.line(&mut budget);
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a status line: {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = self.line(&mut budget);
            if line.is_empty() {
                break;
            }
            let (n, v) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("not a header line: {line:?}"));
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        let mut answer = Answer {
            status,
            headers,
            body: Vec::new(),
        };
        if status < 200 || status == 204 || status == 304 || (connect && status < 300) {
            return answer;
        }
        if answer
            .header("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"))
        {
            answer.body = self.chunked();
        } else if let Some(n) = answer.header("content-length") {
            let n: usize = n.parse().expect("a content-length");
            assert!(n <= MAX_BODY, "body of {n} bytes");
            let mut body = vec![0; n];
            self.reader.read_exact(&mut body).expect("read the body");
            answer.body = body;
        } else {
            let mut body = Vec::new();
            (&mut self.reader)
                .take(MAX_BODY as u64)
                .read_to_end(&mut body)
                .expect("read the body to its end");
            answer.body = body;
        }
        answer
    }

    fn chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let mut budget = MAX_HEAD;
            let size_line = self.line(&mut budget);
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or_else(|_| panic!("not a chunk size: {size_line:?}"));
            if size == 0 {
                while !self.line(&mut budget).is_empty() {}
                return body;
            }
            assert!(
                body.len() + size <= MAX_BODY,
                "chunked body over {MAX_BODY}"
            );
            let start = body.len();
            body.resize(start + size, 0);
            self.reader
                .read_exact(&mut body[start..])
                .expect("read a chunk");
            let end = self.line(&mut budget);
            assert!(end.is_empty(), "chunk not followed by CRLF: {end:?}");
        }
    }

    /// Reads exactly `n` bytes (a tunnel's).
    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        self.reader.read_exact(&mut out).expect("read tunnel bytes");
        out
    }

    /// Waits up to `limit` for the peer to end the connection (EOF or reset); when it
    /// ended, `Ok(when)`; `Err` with what came instead (bytes, or nothing in time).
    pub fn ended_within(&mut self, limit: Duration) -> Result<Instant, String> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(limit))
            .expect("timeout");
        let mut byte = [0u8; 1];
        let result = match self.reader.read(&mut byte) {
            Ok(0) => Ok(Instant::now()),
            Ok(_) => Err(format!("a byte came instead: {:?}", byte[0] as char)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(format!("still open after {limit:?}"))
            }
            Err(_) => Ok(Instant::now()),
        };
        let _ = self.reader.get_ref().set_read_timeout(Some(READ_LIMIT));
        result
    }
}
