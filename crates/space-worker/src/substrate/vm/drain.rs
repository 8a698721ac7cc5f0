//! A memory snapshot's stream from QEMU into a file of the worker's: QEMU's migration
//! writes into a pipe, a thread of the worker's copies it into the snapshot's file.
//! QEMU never holds a descriptor on the file (an escaped QEMU could keep one, and
//! change or grow the snapshot after the worker took it), and what it sends is
//! bounded in bytes and in time.

use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::substrate::SubstrateError;

/// How long the pipe must stay empty, once the migration ended, before the stream is
/// taken as whole (a QEMU that ended its migration has written all of it; one that
/// keeps its end open sends nothing more that counts).
const QUIET: Duration = Duration::from_millis(50);

/// The copy under way. Dropped without [`Drain::finish`] (the snapshot failed before
/// its migration), it stops at once: nothing more is written into the file after.
pub(super) struct Drain {
    state: Arc<AtomicU8>,
    thread: Option<JoinHandle<Result<u64, SubstrateError>>>,
}

/// The migration goes on: copy what comes.
const RUNNING: u8 = 0;
/// The migration ended: copy what is left, until the stream ends or is quiet.
const ENDED: u8 = 1;
/// Given up: stop now.
const ABANDONED: u8 = 2;

impl Drain {
    /// Copies what arrives on `from` into `to` until the stream ends (or is quiet after
    /// [`Drain::finish`]); more than `most` bytes, or a stream still going at
    /// `deadline`, is an error.
    pub(super) fn start(from: OwnedFd, to: std::fs::File, most: u64, deadline: Instant) -> Self {
        let state = Arc::new(AtomicU8::new(RUNNING));
        let flag = state.clone();
        let thread = std::thread::spawn(move || copy(&from, to, most, deadline, &flag));
        Self {
            state,
            thread: Some(thread),
        }
    }

    /// Says the migration ended (either way) and waits for the copy: the bytes copied.
    pub(super) fn finish(mut self) -> Result<u64, SubstrateError> {
        self.state.store(ENDED, Ordering::Release);
        let Some(thread) = self.thread.take() else {
            return Ok(0);
        };
        thread.join().unwrap_or_else(|_| {
            Err(SubstrateError::io(
                "the memory snapshot",
                io::Error::other("its copy panicked"),
            ))
        })
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.state.store(ABANDONED, Ordering::Release);
            let _ = thread.join();
        }
    }
}

fn copy(
    from: &OwnedFd,
    mut to: std::fs::File,
    most: u64,
    deadline: Instant,
    state: &AtomicU8,
) -> Result<u64, SubstrateError> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let quiet = Timespec {
        tv_sec: 0,
        tv_nsec: QUIET.as_nanos() as _,
    };
    loop {
        if state.load(Ordering::Acquire) == ABANDONED {
            return Err(SubstrateError::io(
                "the memory snapshot",
                io::Error::other("given up before its migration"),
            ));
        }
        if Instant::now() > deadline {
            return Err(SubstrateError::Timeout(
                "the memory snapshot's stream".into(),
            ));
        }
        let mut fds = [PollFd::new(from, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&quiet)) {
            Ok(0) => {
                if state.load(Ordering::Acquire) == ENDED {
                    break;
                }
                continue;
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(SubstrateError::io("the memory snapshot's pipe", e.into())),
        }
        let n = match rustix::io::read(from, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            Err(e) => return Err(SubstrateError::io("the memory snapshot's pipe", e.into())),
        };
        total += n as u64;
        if total > most {
            return Err(SubstrateError::InvalidSpec(format!(
                "QEMU's memory snapshot runs past the {most} bytes it can be"
            )));
        }
        to.write_all(&buf[..n])
            .map_err(|e| SubstrateError::io("write the memory snapshot", e))?;
    }
    to.sync_all()
        .map_err(|e| SubstrateError::io("write the memory snapshot", e))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;
    use std::sync::atomic::AtomicBool;

    fn pipe() -> (OwnedFd, OwnedFd) {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
    }

    /// A writer sending a byte every `every` into `w` until told to stop (or the pipe
    /// closes): a QEMU that does not end its stream.
    fn trickle(w: OwnedFd, every: Duration) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let writer = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                if rustix::io::write(w.as_fd(), b"x").is_err() {
                    break;
                }
                std::thread::sleep(every);
            }
        });
        (stop, writer)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn a_stream_is_copied_whole_to_its_end() {
        let t = tempfile::tempdir().unwrap();
        let (r, w) = pipe();
        let file = std::fs::File::create(t.path().join("memory")).unwrap();
        let drain = Drain::start(r, file, 8 << 20, later());
        let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let writer = std::thread::spawn(move || {
            let mut w = std::fs::File::from(w);
            w.write_all(&data).unwrap();
            data
        });
        let data = writer.join().unwrap();
        assert_eq!(drain.finish().unwrap(), data.len() as u64);
        assert_eq!(std::fs::read(t.path().join("memory")).unwrap(), data);
    }

    #[test]
    fn a_qemu_that_keeps_its_end_open_after_the_migration_cannot_add_to_the_snapshot() {
        let t = tempfile::tempdir().unwrap();
        let (r, w) = pipe();
        let file = std::fs::File::create(t.path().join("memory")).unwrap();
        let drain = Drain::start(r, file, 8 << 20, later());
        rustix::io::write(w.as_fd(), b"state").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // The migration ended; the writer keeps its end and is quiet: the copy ends.
        assert_eq!(drain.finish().unwrap(), 5);
        // What it writes afterwards reaches no file (the read end is gone).
        assert!(rustix::io::write(w.as_fd(), b"more").is_err());
        assert_eq!(std::fs::read(t.path().join("memory")).unwrap(), b"state");
    }

    #[test]
    fn a_stream_longer_than_the_guest_can_have_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (r, w) = pipe();
        let file = std::fs::File::create(t.path().join("memory")).unwrap();
        let drain = Drain::start(r, file, 1 << 20, later());
        // An escaped QEMU sending without end.
        let writer = std::thread::spawn(move || {
            let mut w = std::fs::File::from(w);
            let chunk = vec![7u8; 64 << 10];
            while w.write_all(&chunk).is_ok() {}
        });
        let err = drain.finish().unwrap_err();
        assert!(err.to_string().contains("runs past"), "{err}");
        writer.join().unwrap();
        assert!(std::fs::metadata(t.path().join("memory")).unwrap().len() <= 1 << 20);
    }

    #[test]
    fn a_drain_given_up_before_the_migration_stops_at_once_and_writes_no_more() {
        let t = tempfile::tempdir().unwrap();
        let (r, w) = pipe();
        let file = std::fs::File::create(t.path().join("memory")).unwrap();
        let drain = Drain::start(r, file, 1 << 30, later());
        // The snapshot failed (its descriptor refused); a QEMU that got the pipe all
        // the same goes on sending.
        let (stop, writer) = trickle(w, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(100));
        let dropped = Instant::now();
        drop(drain);
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the drop waited"
        );
        let len = std::fs::metadata(t.path().join("memory")).unwrap().len();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            std::fs::metadata(t.path().join("memory")).unwrap().len(),
            len,
            "written into after it was given up"
        );
        stop.store(true, Ordering::Release);
        writer.join().unwrap();
    }

    #[test]
    fn a_stream_still_going_at_its_deadline_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (r, w) = pipe();
        let file = std::fs::File::create(t.path().join("memory")).unwrap();
        let drain = Drain::start(
            r,
            file,
            1 << 30,
            Instant::now() + Duration::from_millis(300),
        );
        // One byte at a time, never ending (the migration not ended either).
        let (stop, writer) = trickle(w, Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(600));
        let err = drain.finish().unwrap_err();
        stop.store(true, Ordering::Release);
        writer.join().unwrap();
        assert!(matches!(err, SubstrateError::Timeout(_)), "{err}");
    }
}
