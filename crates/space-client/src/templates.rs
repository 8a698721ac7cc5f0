//! Templates (through the edge): import an image archive (admin only; streamed, never
//! held in memory), list, read and remove them. A directory is an OCI image layout,
//! sent as a tar made on the fly (links kept as links, never followed).

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::Method;
use hyper::body::Frame;
use space_http::stream;
pub use space_proto::api::templates::{TemplateConfig, TemplateList, TemplateView};

use super::{Answer, Client, Error, decode, encode_query};

/// An image archive being sent: its bytes as a body and, for a file, its length (a
/// directory's tar is sent chunked, its length unknown ahead); [`ImageArchive::sent`]
/// counts the bytes handed to the connection so far.
pub struct ImageArchive {
    body: stream::StreamBody,
    len: Option<u64>,
    sent: Arc<AtomicU64>,
}

impl std::fmt::Debug for ImageArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageArchive")
            .field("len", &self.len)
            .field("sent", &self.sent.load(Ordering::Relaxed))
            .finish()
    }
}

/// How long an import may take to answer (it verifies every layer once received).
const IMPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// A body that counts the bytes of its frames.
struct Counted<B> {
    inner: B,
    sent: Arc<AtomicU64>,
}

impl<B> hyper::body::Body for Counted<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The chunks a blocking writer sends, as a body; a writer's error fails the body
/// (the upload is cut, never taken as complete).
struct Chunks(tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data)))
    }
}

/// The writer side of [`Chunks`] (on a blocking thread).
struct ChunkWriter(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl std::io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ImageArchive {
    /// Opens `path`: a file (an OCI layout's tar or a `docker save` archive) is sent
    /// as is; a directory (an OCI layout) is packed into a tar as it is sent, its
    /// symlinks kept as links.
    pub async fn open(path: &Path) -> Result<Self, Error> {
        let bad = |e: std::io::Error| Error::Stream(format!("{}: {e}", path.display()));
        let meta = tokio::fs::metadata(path).await.map_err(bad)?;
        let sent = Arc::new(AtomicU64::new(0));
        if !meta.is_dir() {
            let file = tokio::fs::File::open(path).await.map_err(bad)?;
            let body = stream::reader_body(file, Some(meta.len()));
            return Ok(Self {
                body: stream::boxed(Counted {
                    inner: body,
                    sent: Arc::clone(&sent),
                }),
                len: Some(meta.len()),
                sent,
            });
        }
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let dir = path.to_owned();
        tokio::task::spawn_blocking(move || {
            let out = std::io::BufWriter::with_capacity(256 << 10, ChunkWriter(tx.clone()));
            let mut b = tar::Builder::new(out);
            b.follow_symlinks(false);
            let packed = b
                .append_dir_all(".", &dir)
                .and_then(|()| b.into_inner())
                .and_then(|mut out| std::io::Write::flush(&mut out));
            if let Err(e) = packed {
                let _ = tx.blocking_send(Err(std::io::Error::other(format!(
                    "packing {}: {e}",
                    dir.display()
                ))));
            }
        });
        Ok(Self {
            body: stream::boxed(Counted {
                inner: Chunks(rx),
                sent: Arc::clone(&sent),
            }),
            len: None,
            sent,
        })
    }

    /// Bytes handed to the connection so far.
    pub fn sent(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.sent)
    }

    /// The archive's length, when known ahead.
    pub fn known_len(&self) -> Option<u64> {
        self.len
    }
}

impl Client {
    /// Imports the image archive at `path` (a file or an OCI layout directory) as the
    /// template `name` (`name[:tag]`; admin only).
    pub async fn import_template(&self, name: &str, path: &Path) -> Result<TemplateView, Error> {
        let archive = ImageArchive::open(path).await?;
        self.import_template_from(name, archive).await
    }

    /// Imports the image archive `archive` as the template `name` (streamed; admin
    /// only). A name another image holds is `409 conflict`; a bad archive `400`.
    pub async fn import_template_from(
        &self,
        name: &str,
        archive: ImageArchive,
    ) -> Result<TemplateView, Error> {
        let url = format!(
            "{}/v1/templates/import?name={}",
            self.inner.url,
            encode_query(name)
        );
        let len = archive.len.map(|n| n.to_string());
        let mut h = vec![
            ("authorization", self.inner.bearer.as_str()),
            ("content-type", "application/x-tar"),
        ];
        if let Some(len) = &len {
            h.push(("content-length", len.as_str()));
        }
        let sent = stream::send(Method::POST, &url, &h, archive.body, None, IMPORT_TIMEOUT).await?;
        let status = sent.status;
        let headers = sent.headers.clone();
        let body = sent.small_body(1 << 20).await;
        let a = Answer {
            status,
            headers,
            body,
        };
        if !a.status.is_success() {
            return Err(super::api_error(&a));
        }
        decode(&a)
    }

    /// Every template.
    pub async fn templates(&self) -> Result<TemplateList, Error> {
        decode(
            &self
                .edge(Method::GET, "/v1/templates", None, Bytes::new())
                .await?,
        )
    }

    /// The template `name` (`name[:tag]`).
    pub async fn template(&self, name: &str) -> Result<TemplateView, Error> {
        let path = format!("/v1/templates/{}", encode_query(name));
        decode(&self.edge(Method::GET, &path, None, Bytes::new()).await?)
    }

    /// Removes the template `name` (admin only); `409 template_in_use` while
    /// sandboxes that are not stopped were made from it.
    pub async fn remove_template(&self, name: &str) -> Result<(), Error> {
        let path = format!("/v1/templates/{}", encode_query(name));
        self.edge(Method::DELETE, &path, None, Bytes::new()).await?;
        Ok(())
    }
}
