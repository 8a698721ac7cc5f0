//! The jails' logs: each jail writes its stderr (`space-jail`'s errors, the agent's
//! log) into a pipe, and one thread of the worker copies every pipe into that jail's
//! `jail.log` on the host, up to a byte limit.
//!
//! No host file descriptor enters a jail this way: a workload that reached the
//! agent's descriptors would find a pipe, not a writable host file it could grow
//! without bound or seek in. The thread waits on all pipes at once (epoll), so an
//! idle sandbox costs a descriptor and an entry, not a thread.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::event::epoll;

/// Largest `jail.log`: past it, output is read and dropped, and one line says so.
pub const MAX_LOG_BYTES: u64 = 1 << 20;

/// Reads of one pipe per wake-up of the thread (64 KiB each).
const READS_PER_WAKE: usize = 16;

struct Entry {
    pipe: File,
    log: File,
    written: u64,
    truncated: bool,
}

/// The collecting thread and its pipes.
#[derive(Debug, Clone)]
pub struct LogCollector {
    inner: Arc<Inner>,
}

struct Inner {
    epoll: OwnedFd,
    entries: Mutex<HashMap<i32, Entry>>,
    limit: u64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogCollector")
            .field("limit", &self.limit)
            .finish()
    }
}

impl LogCollector {
    /// Starts the thread; logs are cut at `limit` bytes.
    pub fn start(limit: u64) -> std::io::Result<Self> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let inner = Arc::new(Inner {
            epoll,
            entries: Mutex::new(HashMap::new()),
            limit,
        });
        let worker = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("jail-logs".into())
            .spawn(move || worker.run())?;
        Ok(Self { inner })
    }

    /// A new pipe whose output goes to `log`: returns the write end for the jail.
    pub fn attach(&self, log: File) -> std::io::Result<OwnedFd> {
        let (read, write) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        // The jail's end blocks like an ordinary stderr.
        rustix::fs::fcntl_setfl(&write, rustix::fs::OFlags::empty())?;
        let raw = read.as_raw_fd();
        let written = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut entries = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.insert(
            raw,
            Entry {
                pipe: File::from(read),
                log,
                written,
                truncated: false,
            },
        );
        let pipe_fd = entries.get(&raw).map(|e| e.pipe.as_fd());
        if let Some(fd) = pipe_fd {
            epoll::add(
                &self.inner.epoll,
                fd,
                epoll::EventData::new_u64(raw as u64),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )?;
        }
        Ok(write)
    }

    /// Pipes still open (a jail holds their write end).
    pub fn open_pipes(&self) -> usize {
        self.inner
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

impl Inner {
    fn run(&self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            events.clear();
            if epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                None,
            )
            .is_err()
            {
                continue;
            }
            for event in &events {
                let raw = event.data.u64() as i32;
                self.drain(raw, &mut buf);
            }
        }
    }

    /// Copies what `raw`'s pipe holds, at most [`READS_PER_WAKE`] reads (epoll is
    /// level-triggered: a pipe with more comes back on the next wait, after the others,
    /// so one busy jail cannot starve the rest or hold up new launches); forgets the
    /// pipe at end of file.
    fn drain(&self, raw: i32, buf: &mut [u8]) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = entries.get_mut(&raw) else {
            return;
        };
        for _ in 0..READS_PER_WAKE {
            match entry.pipe.read(buf) {
                Ok(0) => {
                    let _ = epoll::delete(&self.epoll, entry.pipe.as_fd());
                    entries.remove(&raw);
                    return;
                }
                Ok(n) => {
                    let room = self.limit.saturating_sub(entry.written);
                    let keep = (n as u64).min(room) as usize;
                    if keep > 0 && entry.log.write_all(&buf[..keep]).is_ok() {
                        entry.written += keep as u64;
                    }
                    if keep < n && !entry.truncated {
                        entry.truncated = true;
                        let _ = writeln!(
                            entry.log,
                            "\n[space: jail log truncated at {} bytes]",
                            self.limit
                        );
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_until(mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_flood_on_the_log_pipe_stops_at_the_limit_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jail.log");
        let collector = LogCollector::start(4096).unwrap();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut w = File::from(collector.attach(log).unwrap());
        for _ in 0..64 {
            w.write_all(&[b'x'; 1024]).unwrap();
        }
        drop(w);
        wait_until(|| collector.open_pipes() == 0);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&"x".repeat(4096)));
        assert!(text.contains("jail log truncated at 4096 bytes"));
        assert!(text.len() < 4096 + 100);
    }
}
