//! Bodies streamed to and from disk: request bodies read from a file as they are
//! sent ([`FileBody`]), answers and server bodies spooled into a writer under a limit
//! ([`spool_body`]), and a file that hashes what is written to it ([`HashingFile`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
/// Sends `body`'s data to `tx`, failing once it passes `limit` bytes; the bytes sent.
pub(crate) async fn spool_into<B>(
    body: B,
    limit: u64,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> std::io::Result<u64>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut n = 0u64;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| std::io::Error::other(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        n += data.len() as u64;
        if n > limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("the body is over the limit of {limit} bytes"),
            ));
        }
        if tx.send(data).await.is_err() {
            return Err(std::io::Error::other("the writer stopped"));
        }
    }
    Ok(n)
}

/// A writer of chunks into `sink` on a blocking thread, behind a queue of 8.
pub(crate) fn spool<W: std::io::Write + Send + 'static>(
    mut sink: W,
) -> (
    tokio::sync::mpsc::Sender<Bytes>,
    tokio::task::JoinHandle<std::io::Result<W>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let done = tokio::task::spawn_blocking(move || {
        while let Some(chunk) = rx.blocking_recv() {
            sink.write_all(&chunk)?;
        }
        sink.flush()?;
        Ok(sink)
    });
    (tx, done)
}

/// A file being written (buffered) that hashes what goes into it: where a streamed
/// archive lands while its BLAKE3 digest is computed on the way.
#[derive(Debug)]
pub struct HashingFile {
    /// The file, buffered.
    pub out: std::io::BufWriter<std::fs::File>,
    /// BLAKE3 of every byte written so far.
    pub hash: blake3::Hasher,
}

impl HashingFile {
    /// Writing to `file` through a 256 KiB buffer.
    pub fn new(file: std::fs::File) -> Self {
        Self {
            out: std::io::BufWriter::with_capacity(256 << 10, file),
            hash: blake3::Hasher::new(),
        }
    }
}

impl std::io::Write for HashingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Streams a request or answer body into `sink` (on a blocking thread, a bounded queue
/// of chunks between), failing with [`std::io::ErrorKind::FileTooLarge`] once it passes
/// `limit` bytes: what a server does with a large body it has authorized. Returns
/// `sink` and the number of bytes written.
pub async fn spool_body<B, W>(body: B, limit: u64, sink: W) -> std::io::Result<(W, u64)>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
    W: std::io::Write + Send + 'static,
{
    let (tx, done) = spool(sink);
    let n = spool_into(body, limit, &tx).await;
    drop(tx);
    let sink = done.await.map_err(std::io::Error::other)?;
    let n = n?;
    Ok((sink?, n))
}

/// A request body: bytes in hand, or a file read from disk as it is sent.
#[derive(Debug)]
pub enum ReqBody {
    /// Bytes.
    Bytes(Full<Bytes>),
    /// A file.
    File(FileBody),
}

impl ReqBody {
    /// `len` bytes of `file` from its start.
    pub fn file(file: std::fs::File, len: u64) -> Self {
        Self::File(FileBody::new(file, len))
    }

    pub(crate) fn is_file(&self) -> bool {
        matches!(self, Self::File(_))
    }

    /// A copy of a body of bytes (a file body is sent once).
    pub(crate) fn bytes(&self) -> Option<Self> {
        match self {
            Self::Bytes(b) => Some(Self::Bytes(b.clone())),
            Self::File(_) => None,
        }
    }
}

impl From<Bytes> for ReqBody {
    fn from(b: Bytes) -> Self {
        Self::Bytes(Full::new(b))
    }
}

impl hyper::body::Body for ReqBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Self::Bytes(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|never| match never {}))),
            Self::File(f) => Pin::new(f).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Bytes(b) => b.is_end_stream(),
            Self::File(f) => f.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Self::Bytes(b) => b.size_hint(),
            Self::File(f) => f.size_hint(),
        }
    }
}

/// A body of exactly `len` bytes of a file, read on a blocking thread in 256 KiB
/// chunks as they are sent (at most 4 chunks read ahead): a large file goes out
/// without being held in memory. A file shorter than `len` fails the body.
#[derive(Debug)]
pub struct FileBody {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    len: u64,
    sent: u64,
}

impl FileBody {
    /// `len` bytes of `file`, from its start. Must be called within a Tokio runtime.
    pub fn new(file: std::fs::File, len: u64) -> Self {
        use std::os::unix::fs::FileExt;
        const CHUNK: u64 = 256 << 10;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let mut at = 0u64;
            while at < len {
                let want = usize::try_from(CHUNK.min(len - at)).unwrap_or(1 << 18);
                let mut buf = vec![0u8; want];
                let r = match file.read_at(&mut buf, at) {
                    Ok(0) => Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file is shorter than its announced length",
                    )),
                    Ok(n) => {
                        buf.truncate(n);
                        at += n as u64;
                        Ok(Bytes::from(buf))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = r.is_err();
                if tx.blocking_send(r).is_err() || failed {
                    return;
                }
            }
        });
        Self { rx, len, sent: 0 }
    }
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        if self.sent >= self.len {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.sent += b.len() as u64;
                Poll::Ready(Some(Ok(hyper::body::Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => {
                Poll::Ready(Some(Err(std::io::Error::other("the file reader stopped"))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.len
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.len - self.sent)
    }
}
