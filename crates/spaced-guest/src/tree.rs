//! Directories in and out as tar streams ([`space_tree`]): `ReadTree` packs a
//! directory into `FileData` chunks as it walks it, `WriteTree` unpacks the
//! `Input::Data` frames as they arrive. Neither holds more than a chunk of the
//! archive; the sandbox's disk limit bounds what an unpack can write.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;

use space_proto::guest::{Account, AgentBody, ErrorKind, Input, MAX_CHUNK, RequestId, WireError};
use space_tree::{Limits, TreeError};

use crate::conn::{Conn, End, Flow, io_error};
use crate::files::{as_account, make_dirs, resolve, write_error};

/// The archive written into `FileData` frames of request `id`, one chunk at a time.
struct Frames<'c, 'a> {
    conn: &'c mut Conn<'a>,
    id: RequestId,
    buf: Vec<u8>,
    sent: u64,
    gone: Option<End>,
}

impl Frames<'_, '_> {
    fn push(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(MAX_CHUNK));
        self.sent += chunk.len() as u64;
        self.conn
            .queue(self.id, AgentBody::FileData(chunk))
            .map_err(|end| {
                self.gone = Some(end);
                io::Error::from(io::ErrorKind::BrokenPipe)
            })
    }
}

impl Write for Frames<'_, '_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(MAX_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == MAX_CHUNK {
            self.push()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

/// The error answer for a failed pack or unpack of `path`.
fn tree_error(path: &str, e: &TreeError) -> WireError {
    match e {
        TreeError::Io { error, .. } | TreeError::Archive(error)
            if error.raw_os_error().is_some() =>
        {
            let w = write_error(path, error);
            WireError::new(w.kind, format!("{path}: {e}"))
        }
        TreeError::Io { error, .. } => io_error(&format!("{path}: {e}"), error),
        _ => WireError::new(ErrorKind::InvalidArgument, format!("{path}: {e}")),
    }
}

/// Streams the directory `path` as a tar archive.
pub(crate) fn read(conn: &mut Conn<'_>, id: RequestId, path: &str) -> Flow {
    let dir = match resolve(conn.agent, path).and_then(|p| {
        std::fs::File::open(&p)
            .and_then(|f| {
                if f.metadata()?.is_dir() {
                    Ok(f)
                } else {
                    Err(io::Error::from_raw_os_error(libc::ENOTDIR))
                }
            })
            .map_err(|e| io_error(&format!("read {path}"), &e))
    }) {
        Ok(d) => d,
        Err(e) => return conn.send_error(id, e),
    };
    let mut out = Frames {
        conn,
        id,
        buf: Vec::with_capacity(MAX_CHUNK),
        sent: 0,
        gone: None,
    };
    let packed = space_tree::pack(dir.as_fd(), &mut out, space_tree::DEFAULT_MAX_ENTRIES);
    if let Some(end) = out.gone.take() {
        return Err(end);
    }
    let sent = out.sent;
    match packed {
        Ok(_) => conn.send(
            id,
            AgentBody::ReadEnd {
                bytes: sent,
                truncated: false,
            },
        ),
        Err(e) => conn.send_error(id, tree_error(path, &e)),
    }
}

/// The archive read from the `Input::Data` frames of request `id` up to `Input::End`.
struct Inputs<'c, 'a> {
    conn: &'c mut Conn<'a>,
    id: RequestId,
    chunk: Vec<u8>,
    pos: usize,
    ended: bool,
    failed: Option<End>,
}

impl Read for Inputs<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.ended {
                return Ok(0);
            }
            match self.conn.read_input(self.id) {
                Ok(Input::Data(d)) => {
                    self.chunk = d;
                    self.pos = 0;
                }
                Ok(Input::End) => self.ended = true,
                Ok(other) => {
                    let end = self.conn.refuse(
                        ErrorKind::Protocol,
                        format!("{other:?} during a directory upload"),
                    );
                    self.failed = Some(end);
                    return Err(io::Error::from(io::ErrorKind::BrokenPipe));
                }
                Err(end) => {
                    self.failed = Some(end);
                    return Err(io::Error::from(io::ErrorKind::BrokenPipe));
                }
            }
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Unpacks the archive that follows into the directory `path` (made with its parents
/// if missing), as `user` when given.
pub(crate) fn write(
    conn: &mut Conn<'_>,
    id: RequestId,
    path: &str,
    user: Option<&Account>,
) -> Flow {
    let acting = as_account(user);
    let target = acting.as_ref().map_err(Clone::clone).and_then(|_| {
        let p = resolve(conn.agent, path)?;
        let err = |e: io::Error| io_error(&format!("write {path}"), &e);
        make_dirs(&p).map_err(err)?;
        space_tree::open_dir(&p).map_err(|e| tree_error(path, &e))
    });
    let mut input = Inputs {
        conn,
        id,
        chunk: Vec::new(),
        pos: 0,
        ended: false,
        failed: None,
    };
    let answer = match &target {
        Ok(dir) => space_tree::unpack(&mut input, dir.as_fd(), Limits::default())
            .map_err(|e| tree_error(path, &e)),
        Err(e) => Err(e.clone()),
    };
    if let Some(end) = input.failed.take() {
        return Err(end);
    }
    // The client sends the whole archive before it reads the answer: the rest of a
    // refused one is read and dropped.
    let mut sink = [0u8; 8192];
    while !input.ended {
        if input.read(&mut sink).is_err() {
            return Err(input.failed.take().unwrap_or(End::Gone));
        }
    }
    drop(target);
    drop(acting);
    match answer {
        Ok(summary) => conn.send(
            id,
            AgentBody::Written {
                bytes: summary.bytes,
            },
        ),
        Err(e) => conn.send_error(id, e),
    }
}
