//! Length-prefixed frames: a `u32` big-endian body length, then the body.
//!
//! The length is checked against [`MAX_FRAME_LEN`] before anything is allocated, so a
//! peer announcing 4 GiB costs the reader four bytes, not memory.

use std::io::{self, Read, Write};

/// Largest frame body either side accepts (1 MiB).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the stream between two frames: the normal end of a connection.
    #[error("connection closed")]
    Closed,
    /// The stream ended inside a frame.
    #[error("connection closed inside a frame")]
    Truncated,
    /// The announced (or offered) body length is over [`MAX_FRAME_LEN`].
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(u64),
    /// The transport failed.
    #[error("transport: {0}")]
    Io(#[from] io::Error),
}

impl FrameError {
    /// Whether the peer broke the framing rules (as opposed to the transport failing or
    /// the connection ending).
    pub fn is_peer_fault(&self) -> bool {
        matches!(self, Self::TooLarge(_))
    }
}

/// Checks a body length against the cap.
fn check_len(len: u64) -> Result<usize, FrameError> {
    if len > MAX_FRAME_LEN as u64 {
        Err(FrameError::TooLarge(len))
    } else {
        Ok(len as usize)
    }
}

/// Writes one frame. The body is refused before anything is written if it is over the
/// cap, so a writer can never produce a frame its peer must reject.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> Result<(), FrameError> {
    let len = check_len(body.len() as u64)?;
    // One buffer, one write: small frames then leave in one segment and concurrent
    // writers (if any) cannot interleave a header with another frame's body.
    let mut buf = Vec::with_capacity(HEADER_LEN + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Builds a frame (header and body) in memory, for writers that send it piecewise.
pub fn frame_bytes(body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let len = check_len(body.len() as u64)?;
    let mut buf = Vec::with_capacity(HEADER_LEN + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    buf.extend_from_slice(body);
    Ok(buf)
}

/// Reads one frame body, blocking until it is complete.
///
/// A clean end of stream before the first header byte is [`FrameError::Closed`]; an end
/// anywhere else is [`FrameError::Truncated`].
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let mut have = 0;
    while have < HEADER_LEN {
        have += header_progress(have, r.read(&mut header[have..]))?;
    }
    let mut body = vec![0u8; check_len(u32::from_be_bytes(header).into())?];
    r.read_exact(&mut body).map_err(body_error)?;
    Ok(body)
}

/// What one read into a frame's header brought (0 after an interruption), or why the
/// frame cannot be read.
fn header_progress(have: usize, read: io::Result<usize>) -> Result<usize, FrameError> {
    match read {
        Ok(0) if have == 0 => Err(FrameError::Closed),
        Ok(0) => Err(FrameError::Truncated),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// A failed read of a frame's body: an end of stream there is a truncated frame.
fn body_error(e: io::Error) -> FrameError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    }
}

/// [`read_frame`] on an asynchronous stream.
#[cfg(feature = "tokio")]
pub async fn read_frame_async(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<Vec<u8>, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; HEADER_LEN];
    let mut have = 0;
    while have < HEADER_LEN {
        have += header_progress(have, r.read(&mut header[have..]).await)?;
    }
    let mut body = vec![0u8; check_len(u32::from_be_bytes(header).into())?];
    r.read_exact(&mut body).await.map_err(body_error)?;
    Ok(body)
}

/// An incremental frame reader for event loops: it is fed from a non-blocking source
/// and never reads past the end of the frame it is assembling, so the bytes of the next
/// frame stay in the socket for whoever reads after it.
#[derive(Debug, Default)]
pub struct FrameReader {
    header: [u8; HEADER_LEN],
    have_header: usize,
    body: Vec<u8>,
    want_body: usize,
}

impl FrameReader {
    /// A reader waiting for a frame header.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether no part of a frame has been read yet.
    pub fn is_idle(&self) -> bool {
        self.have_header == 0
    }

    /// Reads as much of the current frame as `r` yields without blocking.
    ///
    /// Returns `Ok(Some(body))` when a frame is complete, `Ok(None)` when `r` reported
    /// `WouldBlock` first. A source at end of stream yields [`FrameError::Closed`]
    /// (between frames) or [`FrameError::Truncated`].
    pub fn poll_read(&mut self, r: &mut impl Read) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            if self.have_header < HEADER_LEN {
                match r.read(&mut self.header[self.have_header..]) {
                    Ok(0) if self.have_header == 0 => return Err(FrameError::Closed),
                    Ok(0) => return Err(FrameError::Truncated),
                    Ok(n) => self.have_header += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
                if self.have_header == HEADER_LEN {
                    self.want_body = check_len(u32::from_be_bytes(self.header).into())?;
                    self.body = Vec::with_capacity(self.want_body);
                }
                continue;
            }
            if self.body.len() == self.want_body {
                self.have_header = 0;
                return Ok(Some(std::mem::take(&mut self.body)));
            }
            let start = self.body.len();
            self.body.resize(self.want_body, 0);
            let res = r.read(&mut self.body[start..]);
            let got = *res.as_ref().unwrap_or(&0);
            self.body.truncate(start + got);
            match res {
                Ok(0) => return Err(FrameError::Truncated),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that yields its bytes a few at a time and then `WouldBlock`, like a
    /// socket drained faster than the peer writes.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
        blocked: bool,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.blocked {
                self.blocked = false;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.blocked = true;
            let n = buf.len().min(self.step).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn frame_round_trips_through_a_buffer() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        write_frame(&mut buf, b"").unwrap();
        assert_eq!(&buf[..4], &5u32.to_be_bytes());
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), b"hello");
        assert_eq!(read_frame(&mut r).unwrap(), b"");
        assert!(matches!(read_frame(&mut r), Err(FrameError::Closed)));
    }

    #[test]
    fn oversized_length_is_refused_before_reading_the_body() {
        let mut buf = ((MAX_FRAME_LEN + 1) as u32).to_be_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        let err = read_frame(&mut &buf[..]).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge(n) if n == MAX_FRAME_LEN as u64 + 1));
        assert!(err.is_peer_fault());
        let huge = u32::MAX.to_be_bytes();
        assert!(matches!(
            FrameReader::new().poll_read(&mut &huge[..]),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn writer_refuses_a_body_over_the_cap() {
        let mut out = Vec::new();
        let body = vec![0u8; MAX_FRAME_LEN + 1];
        assert!(matches!(
            write_frame(&mut out, &body),
            Err(FrameError::TooLarge(_))
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn end_of_stream_inside_a_frame_is_truncation() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        for cut in 1..buf.len() {
            assert!(matches!(
                read_frame(&mut &buf[..cut]),
                Err(FrameError::Truncated)
            ));
        }
    }

    #[test]
    fn incremental_reader_assembles_frames_without_reading_past_them() {
        let mut data = Vec::new();
        write_frame(&mut data, b"first frame").unwrap();
        write_frame(&mut data, b"second").unwrap();
        let mut src = Trickle {
            data,
            pos: 0,
            step: 3,
            blocked: false,
        };
        let mut reader = FrameReader::new();
        let mut frames = Vec::new();
        while frames.len() < 2 {
            if let Some(f) = reader.poll_read(&mut src).unwrap() {
                frames.push(f);
                assert!(reader.is_idle());
            }
        }
        assert_eq!(frames, [b"first frame".to_vec(), b"second".to_vec()]);
        assert!(matches!(reader.poll_read(&mut src), Ok(None)));
        assert!(matches!(
            reader.poll_read(&mut src),
            Err(FrameError::Closed)
        ));
    }
}
