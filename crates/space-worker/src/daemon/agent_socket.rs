//! The worker's end of a verified agent connection, watched by the runtime for
//! readability only.
//!
//! A Unix stream socket signals "writable" to its writer every time its peer consumes
//! data. A socket registered for both directions (as `tokio::net::UnixStream` is) thus
//! wakes the worker when the agent *reads* a request, before the agent has answered:
//! the worker runs, finds nothing to do and sleeps again, two context switches per
//! operation for nothing (seen in a scheduler trace of P3, one CPU: the agent was
//! preempted by that wake on every request). Requests are small and the socket's
//! buffer takes them at once, so this socket writes without waiting and registers for
//! writability only while a write finds the buffer full (a large file being written),
//! through a duplicate descriptor that is dropped again after the next write that did
//! not have to wait.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A non-blocking agent connection driven by the runtime.
#[derive(Debug)]
pub struct AgentSocket {
    io: AsyncFd<UnixStream>,
    /// Registered for writability while writes wait for room.
    writable: Option<AsyncFd<OwnedFd>>,
}

impl AgentSocket {
    /// `stream`, made non-blocking and registered with the current runtime.
    pub fn new(stream: UnixStream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(Self {
            io: register(stream, Interest::READABLE)?,
            writable: None,
        })
    }

    /// The connection as a blocking-mode-agnostic stream again, out of the runtime's
    /// registration (a pooled connection handed to a stream, which drives it as a
    /// `tokio` stream of its own). Holds no buffered bytes: nothing is lost.
    pub fn into_std(self) -> UnixStream {
        self.io.into_inner()
    }

    /// Whether a writability registration is held (tests).
    pub fn waits_for_room(&self) -> bool {
        self.writable.is_some()
    }
}

/// Registers `fd` with the current runtime for `interest`.
// `with_interest` is deprecated because a type could change the descriptor it reports
// while registered; `UnixStream` and `OwnedFd` own theirs until dropped, so it is sound
// here, and it keeps this crate free of `unsafe`.
#[allow(deprecated)]
fn register<T: std::os::fd::AsRawFd>(fd: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    AsyncFd::with_interest(fd, interest)
}

impl AsyncRead for AgentSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let mut guard = ready!(this.io.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|io| io.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for AgentSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.writable.is_none() {
            match this.io.get_ref().write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let dup = this.io.get_ref().as_fd().try_clone_to_owned()?;
                    this.writable = Some(register(dup, Interest::WRITABLE)?);
                }
                other => return Poll::Ready(other),
            }
        }
        let Some(writable) = &this.writable else {
            return Poll::Ready(Err(io::ErrorKind::WouldBlock.into()));
        };
        loop {
            let mut guard = ready!(writable.poll_write_ready(cx))?;
            match guard.try_io(|_| this.io.get_ref().write(buf)) {
                Ok(result) => {
                    // Room again: stop watching for it (the registration would wake
                    // this worker at every read of the agent).
                    if result.is_ok() {
                        this.writable = None;
                    }
                    return Poll::Ready(result);
                }
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.io.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_and_writes_both_ways_and_waits_for_room_only_while_the_buffer_is_full() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let mut s = AgentSocket::new(ours).expect("socket");
        // A write larger than the socket's buffer waits for the peer to read.
        let big = vec![5u8; 4 << 20];
        let reader = std::thread::spawn(move || {
            let mut theirs = theirs;
            let mut got = vec![0u8; 4 << 20];
            theirs.read_exact(&mut got).expect("read");
            assert!(got.iter().all(|&b| b == 5));
            theirs.write_all(b"answer").expect("write");
            theirs
        });
        s.write_all(&big).await.expect("write all");
        let mut answer = [0u8; 6];
        s.read_exact(&mut answer).await.expect("answer");
        assert_eq!(&answer, b"answer");
        let mut theirs = reader.join().expect("reader");
        // Small writes go straight out; the registration for room is gone.
        s.write_all(b"ping").await.expect("ping");
        assert!(!s.waits_for_room());
        let mut ping = [0u8; 4];
        theirs.read_exact(&mut ping).expect("ping");
        assert_eq!(&ping, b"ping");
        // End of stream reads as zero bytes.
        drop(theirs);
        assert_eq!(s.read(&mut [0u8; 8]).await.expect("eof"), 0);
    }
}
