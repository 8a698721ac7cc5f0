//! Files of any size, streamed both ways: a read goes into an [`AsyncWrite`] as it
//! arrives, a write comes from an [`AsyncRead`] (or a local file) as it is sent,
//! neither held whole in memory. The byte count of a read is checked against the
//! answer's `Content-Length`: a body that ends short is an error, never a shorter
//! file. A `Range` read returns exactly the bytes asked for, with where they sit.
//!
//! Recovery is the same as for every operation ([`Client`]'s rules): a read is
//! repeated on a new route only before any byte of it was taken; a write's body waits
//! behind `Expect: 100-continue` until the worker has admitted it, so a RefreshRoute
//! from admission hands the body back untouched for the one rebuilt attempt, and a
//! write that started is never repeated.

use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use space_http::CallError;
use space_http::stream::{self, StreamBody, StreamedAnswer};
use space_identity::{OperationClass, Progress, SandboxId};
pub use space_proto::guest::ByteRange;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{
    Answer, Attempt, Client, Error, Grant, api_error, files, idempotency_key, refused,
    wrong_execution,
};

/// Largest file [`Client::read_file`] returns in memory (256 MiB); a larger one is
/// refused with `413 too_large` before its body is read. Stream larger files with
/// [`Client::read_file_to`].
pub const READ_FILE_MAX: u64 = 256 << 20;

/// Largest error answer read.
const MAX_ERROR: usize = 64 << 10;

/// Where the bytes of a ranged read sit in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeRead {
    /// First byte sent.
    pub start: u64,
    /// Bytes sent.
    pub len: u64,
    /// Size of the whole file.
    pub size: u64,
}

impl Client {
    /// Describes `path` (a final symlink described, not followed): `404 not_found`
    /// when nothing is there.
    pub async fn stat_file(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<space_proto::api::FileInfo, Error> {
        let a = self
            .operate(
                id,
                Method::GET,
                &files(id, "files/stat", path),
                None,
                Bytes::new(),
                OperationClass::Read,
            )
            .await?;
        super::decode(&a)
    }

    /// Makes the directory `path` and its missing parents: whether this call made it
    /// (`false`: a directory was already there; anything else there is `409
    /// already_exists`).
    pub async fn make_dir(&self, id: &SandboxId, path: &str) -> Result<bool, Error> {
        let a = self
            .operate(
                id,
                Method::POST,
                &files(id, "files/mkdir", path),
                None,
                Bytes::new(),
                super::mutation(),
            )
            .await?;
        super::decode::<space_proto::api::MkdirResponse>(&a).map(|m| m.created)
    }

    /// Renames `from` to `to` (a file at `to` is replaced): `404 not_found` when
    /// `from` is missing.
    pub async fn rename_file(&self, id: &SandboxId, from: &str, to: &str) -> Result<(), Error> {
        let body = space_proto::api::RenameRequest {
            from: from.into(),
            to: to.into(),
        };
        let body = serde_json::to_vec(&body).map_err(|e| Error::Decode(e.to_string()))?;
        self.operate(
            id,
            Method::POST,
            &format!("/v1/sandboxes/{id}/files/rename"),
            Some("application/json"),
            Bytes::from(body),
            super::mutation(),
        )
        .await
        .map(drop)
    }

    /// Streams the file at `path` into `sink`; returns the bytes written, which are
    /// the file's size (a body that ends short of its `Content-Length` is an error).
    pub async fn read_file_to<W>(
        &self,
        id: &SandboxId,
        path: &str,
        sink: &mut W,
    ) -> Result<u64, Error>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let a = self.open_read(id, path, None).await?;
        copy_body(a, sink).await
    }

    /// Streams the bytes `range` selects of the file at `path` into `sink`. A range
    /// that selects nothing is `416 range_not_satisfiable`.
    pub async fn read_file_range_to<W>(
        &self,
        id: &SandboxId,
        path: &str,
        range: ByteRange,
        sink: &mut W,
    ) -> Result<RangeRead, Error>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let header = match range {
            ByteRange::All => None,
            ByteRange::From(a) => Some(format!("bytes={a}-")),
            ByteRange::Span { first, last } => Some(format!("bytes={first}-{last}")),
            ByteRange::Last(n) => Some(format!("bytes=-{n}")),
        };
        let a = self.open_read(id, path, header.as_deref()).await?;
        let shape = match a.status {
            StatusCode::PARTIAL_CONTENT => content_range(&a)?,
            _ => {
                let len = a.content_length().unwrap_or(0);
                RangeRead {
                    start: 0,
                    len,
                    size: len,
                }
            }
        };
        let n = copy_body(a, sink).await?;
        Ok(RangeRead { len: n, ..shape })
    }

    /// The file at `path` in memory, at most [`READ_FILE_MAX`] bytes (a larger file
    /// is refused with `413 too_large`, never cut).
    pub(crate) async fn read_file_bounded(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<Bytes, Error> {
        let a = self.open_read(id, path, None).await?;
        let len = a.content_length().unwrap_or(0);
        if len > READ_FILE_MAX {
            return Err(Error::Api {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "too_large".into(),
                message: format!(
                    "the file is {len} bytes, more than read_file returns ({READ_FILE_MAX}); \
                     stream it with read_file_to"
                ),
                reason: None,
            });
        }
        let mut out = Vec::with_capacity(len as usize);
        copy_body(a, &mut out).await?;
        Ok(Bytes::from(out))
    }

    /// [`Client::write_file_from`] with `options`: the mode to set, whether missing
    /// parents are made, the account to write as.
    pub async fn write_file_with<R>(
        &self,
        id: &SandboxId,
        path: &str,
        source: R,
        len: u64,
        options: &WriteOptions,
    ) -> Result<u64, Error>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let body = stream::reader_body(source, Some(len));
        let pq = options.query(files(id, "files", path), true);
        self.put_body(id, pq, body, "application/octet-stream")
            .await?;
        Ok(len)
    }

    /// Unpacks the tar archive read from `source` (to its end, streamed) into the
    /// directory `dir` of the sandbox (made if missing), as `user` when given. The
    /// agent refuses entries that are absolute, climb out with `..`, pass through a
    /// symlink or are devices (`400 invalid_argument`; entries before it stay).
    pub async fn write_tree_from<R>(
        &self,
        id: &SandboxId,
        dir: &str,
        source: R,
        user: Option<&space_proto::api::User>,
    ) -> Result<(), Error>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let options = WriteOptions {
            user: user.cloned(),
            ..WriteOptions::default()
        };
        let pq = options.query(files(id, "files/tar", dir), false);
        self.put_body(
            id,
            pq,
            stream::reader_body(source, None),
            "application/x-tar",
        )
        .await
    }

    /// Streams the directory `dir` of the sandbox as a tar archive into `sink`
    /// (regular files, directories, symlinks as links, modes, mtimes). The archive is
    /// the sandbox's: unpack it with `space_tree::unpack`, which never writes outside
    /// its target. Returns the archive's size; a body cut short is an error.
    pub async fn read_tree_to<W>(
        &self,
        id: &SandboxId,
        dir: &str,
        sink: &mut W,
    ) -> Result<u64, Error>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let a = self
            .open_read_at(id, files(id, "files/tar", dir), None)
            .await?;
        copy_body(a, sink).await
    }

    /// Streams `len` bytes of `source` into the file at `path` (replacing it; missing
    /// parents are made). The file changes only once all of it arrived: a source
    /// that fails or ends early leaves the old file (or none) in place. Returns `len`.
    pub async fn write_file_from<R>(
        &self,
        id: &SandboxId,
        path: &str,
        source: R,
        len: u64,
    ) -> Result<u64, Error>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let body = stream::reader_body(source, Some(len));
        self.write_body(id, path, body).await?;
        Ok(len)
    }

    /// Streams all of `source`, up to its end, into the file at `path` (a length not
    /// known ahead: sent chunked). The file changes only once all of it arrived.
    pub async fn write_file_from_reader<R>(
        &self,
        id: &SandboxId,
        path: &str,
        source: R,
    ) -> Result<(), Error>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        self.write_body(id, path, stream::reader_body(source, None))
            .await
    }

    /// Streams the local file `local` into the file at `path`; returns its size.
    pub async fn write_file_from_path(
        &self,
        id: &SandboxId,
        path: &str,
        local: &Path,
    ) -> Result<u64, Error> {
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|e| Error::Stream(format!("{}: {e}", local.display())))?;
        let len = file
            .metadata()
            .await
            .map_err(|e| Error::Stream(format!("{}: {e}", local.display())))?
            .len();
        self.write_file_from(id, path, file, len).await
    }

    /// A read's answer head (a success), through the edge or from the worker with
    /// recovery; its body still to be read.
    async fn open_read(
        &self,
        id: &SandboxId,
        path: &str,
        range: Option<&str>,
    ) -> Result<StreamedAnswer, Error> {
        self.open_read_at(id, files(id, "files", path), range).await
    }

    /// A read's answer head at `pq` (see [`Client::open_read`]).
    async fn open_read_at(
        &self,
        id: &SandboxId,
        pq: String,
        range: Option<&str>,
    ) -> Result<StreamedAnswer, Error> {
        let timeout = READ_HEAD_TIMEOUT;
        if !self.inner.direct {
            let mut h = vec![("authorization", self.inner.bearer.as_str())];
            if let Some(r) = range {
                h.push(("range", r));
            }
            let url = format!("{}{pq}", self.inner.url);
            let a = stream::send(Method::GET, &url, &h, stream::empty(), None, timeout).await?;
            return success(a).await;
        }
        let pq = &pq;
        self.on_route(id, OperationClass::Read, |grant| async move {
            let mut h = vec![("authorization", grant.authorization.as_str())];
            if let Some(r) = range {
                h.push(("range", r));
            }
            let url = format!("{}{pq}", grant.worker_url);
            let sent = stream::send(Method::GET, &url, &h, stream::empty(), None, timeout).await;
            attempt(sent, Some(&grant)).await
        })
        .await
    }

    /// A write of `body` (through the edge, or to the worker with recovery: the body
    /// waits behind a gate until the worker asks for it).
    async fn write_body(&self, id: &SandboxId, path: &str, body: StreamBody) -> Result<(), Error> {
        let pq = files(id, "files", path);
        self.put_body(id, pq, body, "application/octet-stream")
            .await
    }

    /// A `PUT` of `body` at `pq`, with recovery as [`Client::write_body`].
    async fn put_body(
        &self,
        id: &SandboxId,
        pq: String,
        body: StreamBody,
        content_type: &'static str,
    ) -> Result<(), Error> {
        let key = idempotency_key();
        let slot = Arc::new(Mutex::new(Some(body)));
        let timeout = UPLOAD_TIMEOUT;
        let direct = self.inner.direct;
        let attempt_on = |authorization: String, base: String, grant: Option<Arc<Grant>>| {
            let (slot, key, pq) = (Arc::clone(&slot), key.clone(), pq.clone());
            async move {
                let Some(body) = slot.lock().ok().and_then(|mut s| s.take()) else {
                    return Attempt::Done(Err(Error::Stream(
                        "the upload started on a route that changed; the file was not \
                         replaced (a write is all or nothing): send it again"
                            .into(),
                    )));
                };
                let (body, gate) = stream::gated(body);
                let h = [
                    ("authorization", authorization.as_str()),
                    ("content-type", content_type),
                    ("idempotency-key", key.as_str()),
                ];
                let url = format!("{base}{pq}");
                let sent =
                    stream::send(Method::PUT, &url, &h, body, Some(gate.clone()), timeout).await;
                let back = gate.take_back();
                let untouched = back.is_some();
                if let Ok(mut s) = slot.lock() {
                    *s = back;
                }
                match sent {
                    // Bytes of the body left: never repeated.
                    Err(e) if !untouched => Attempt::Done(Err(Error::Transport(e))),
                    sent => attempt(sent, grant.as_deref()).await,
                }
            }
        };
        let a = if direct {
            self.on_route(
                id,
                OperationClass::Mutation {
                    idempotency_key: true,
                },
                |grant| {
                    let (a, u) = (grant.authorization.clone(), grant.worker_url.clone());
                    attempt_on(a, u, Some(grant))
                },
            )
            .await?
        } else {
            // The edge recovers on its side; whatever it answers is final here.
            attempt_on(self.inner.bearer.clone(), self.inner.url.clone(), None)
                .await
                .settle()?
        };
        // The answer (204) has no body to speak of.
        drop(a);
        Ok(())
    }
}

/// How an upload writes: [`Client::write_file_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Permission bits to set (at most `0o7777`); `None`: an existing file keeps its
    /// mode, a new one gets `0644`.
    pub mode: Option<u32>,
    /// Make missing parent directories (0755, owned like the file); `false`: a
    /// missing parent is `404 not_found`.
    pub mkdir: bool,
    /// Write as this account of the sandbox; its root when `None`.
    pub user: Option<space_proto::api::User>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            mode: None,
            mkdir: true,
            user: None,
        }
    }
}

impl WriteOptions {
    /// `pq` with these options' query parameters (`file`: mode and mkdir too).
    fn query(&self, mut pq: String, file: bool) -> String {
        if file {
            if let Some(m) = self.mode {
                pq.push_str(&format!("&mode={m:o}"));
            }
            if !self.mkdir {
                pq.push_str("&mkdir=0");
            }
        }
        if let Some(u) = &self.user {
            pq.push_str(&format!("&user={}", crate::encode_query(&u.as_query())));
        }
        pq
    }
}

/// Longest wait for a read's answer head.
const READ_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Longest wait for an upload's answer, which comes once all of it was written.
const UPLOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// One attempt's outcome for [`Client::on_route`]; with `grant` (direct mode), an
/// answer from another execution than the route's is dropped.
async fn attempt(
    sent: Result<StreamedAnswer, CallError>,
    grant: Option<&Grant>,
) -> Attempt<StreamedAnswer> {
    match sent {
        Ok(a) => {
            let head = Answer {
                status: a.status,
                headers: a.headers.clone(),
                body: Bytes::new(),
            };
            match a.status {
                StatusCode::MISDIRECTED_REQUEST | StatusCode::FORBIDDEN => {
                    let answer = small(a).await;
                    refused(&answer).unwrap_or_else(|| Attempt::Done(Err(api_error(&answer))))
                }
                _ if grant.and_then(|g| wrong_execution(&head, g)).is_some() => {
                    let g = grant.expect("checked");
                    Attempt::Done(Err(Error::WrongExecution {
                        expected: g.execution.clone(),
                        got: wrong_execution(&head, g).unwrap_or_default(),
                    }))
                }
                s if s.is_success() => Attempt::Done(Ok(a)),
                _ => Attempt::Done(Err(api_error(&small(a).await))),
            }
        }
        Err(e) => {
            let progress = match e {
                CallError::Connect(_) => Progress::NotStarted,
                _ => Progress::Started,
            };
            Attempt::Failed {
                error: Error::Transport(e),
                progress,
            }
        }
    }
}

/// A success, or the error its answer says.
async fn success(a: StreamedAnswer) -> Result<StreamedAnswer, Error> {
    if a.status.is_success() {
        Ok(a)
    } else {
        Err(api_error(&small(a).await))
    }
}

/// An answer read whole (an error's, at most 64 KiB).
async fn small(a: StreamedAnswer) -> Answer {
    let (status, headers) = (a.status, a.headers.clone());
    let body = a.small_body(MAX_ERROR).await;
    Answer {
        status,
        headers,
        body,
    }
}

/// Where a 206's bytes sit (`Content-Range: bytes a-b/size`).
fn content_range(a: &StreamedAnswer) -> Result<RangeRead, Error> {
    let bad = || Error::Decode("a 206 answer without a valid Content-Range".into());
    let v = a
        .headers
        .get(hyper::header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(bad)?;
    let (span, size) = v
        .strip_prefix("bytes ")
        .and_then(|r| r.split_once('/'))
        .ok_or_else(bad)?;
    let (first, last) = span.split_once('-').ok_or_else(bad)?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let (first, last, size) = (num(first)?, num(last)?, num(size)?);
    if last < first {
        return Err(bad());
    }
    Ok(RangeRead {
        start: first,
        len: last - first + 1,
        size,
    })
}

/// Copies a success's body into `sink`, checking the count against its
/// `Content-Length`; flushes `sink` at the end.
async fn copy_body<W>(a: StreamedAnswer, sink: &mut W) -> Result<u64, Error>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    let expected = a.content_length();
    let mut body = a.body;
    let mut got = 0u64;
    while let Some(frame) =
        std::future::poll_fn(|cx| hyper::body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
            .await
    {
        let frame = frame.map_err(|e| {
            Error::Stream(format!(
                "the file's body ended after {got} of {} bytes: {e}",
                expected.map_or_else(|| "?".into(), |n| n.to_string())
            ))
        })?;
        if let Ok(data) = frame.into_data() {
            got += data.len() as u64;
            sink.write_all(&data)
                .await
                .map_err(|e| Error::Stream(format!("writing the file: {e}")))?;
        }
    }
    sink.flush()
        .await
        .map_err(|e| Error::Stream(format!("writing the file: {e}")))?;
    match expected {
        Some(n) if n != got => Err(Error::Stream(format!(
            "short read: {got} of {n} bytes arrived"
        ))),
        _ => Ok(got),
    }
}
