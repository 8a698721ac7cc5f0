//! The link: one reader thread for the shared transport, two threads per stream (one
//! moving the stream's outgoing bytes into frames as credit allows, one moving received
//! bytes into the stream's socket and giving credit back).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::frame::{self, CONTROL, Frame, Kind, MAX_PAYLOAD, WINDOW};

/// Stack of the link's threads: they only move bytes through heap buffers.
const THREAD_STACK: usize = 128 * 1024;
/// Control messages kept unread before the peer is taken for hostile.
const MAX_CONTROL_QUEUED: usize = 8;

/// Why a link refused something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkError {
    /// The link is broken (its transport ended or the peer broke the protocol).
    Dead(String),
    /// `max_streams` streams are open.
    Busy,
    /// This side does not open streams (the guest only accepts them).
    NotOpener,
    /// No control message came in time.
    Timeout,
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dead(why) => write!(f, "link is down: {why}"),
            Self::Busy => write!(f, "too many streams"),
            Self::NotOpener => write!(f, "this side of the link does not open streams"),
            Self::Timeout => write!(f, "no control message in time"),
        }
    }
}

impl std::error::Error for LinkError {}

type Accept = Box<dyn FnMut(UnixStream) + Send>;

/// One side of a link. Dropping it does not stop the link: [`Link::shut`] does (and so
/// does the end of its transport).
#[derive(Clone)]
pub struct Link {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("opener", &self.shared.opener)
            .field("dead", &self.shared.lock_dead().clone())
            .finish_non_exhaustive()
    }
}

struct Shared {
    writer: Mutex<Box<dyn Write + Send>>,
    /// Shuts the transport down (both ways), so the reader ends.
    shutdown: Box<dyn Fn() + Send + Sync>,
    streams: Mutex<HashMap<u32, Arc<Stream>>>,
    next: Mutex<u32>,
    dead: Mutex<Option<String>>,
    /// Whether what ended the link was its transport's end (see
    /// [`Link::ended_by_transport`]); set with `dead`, once.
    transport_ended: AtomicBool,
    opener: bool,
    max_streams: usize,
    accept: Mutex<Option<Accept>>,
    control: Mutex<VecDeque<Vec<u8>>>,
    control_ready: Condvar,
}

struct Stream {
    id: u32,
    /// The link's end of the stream's socket pair.
    ours: UnixStream,
    send: Mutex<Outgoing>,
    send_ready: Condvar,
    recv: Mutex<Recv>,
    recv_ready: Condvar,
    /// Threads of this stream still running (it leaves the table at 0).
    running: AtomicU8,
}

struct Outgoing {
    credit: u32,
    reset: bool,
}

struct Recv {
    buf: VecDeque<u8>,
    /// Bytes the peer may still send before it gets more credit.
    window: u32,
    fin: bool,
    reset: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn lock_dead(&self) -> MutexGuard<'_, Option<String>> {
        lock(&self.dead)
    }

    fn send(&self, f: &Frame) -> io::Result<()> {
        let bytes = f.encode()?;
        let mut w = lock(&self.writer);
        w.write_all(&bytes)?;
        w.flush()
    }

    /// Sends a frame of stream `st` unless it was reset: checked under the writer lock,
    /// which [`Link::reset_streams`] also takes, so nothing of a reset stream goes out
    /// after the reset (a new session may reuse its number). `Ok(false)`: not sent.
    fn send_on(&self, st: &Stream, f: &Frame) -> io::Result<bool> {
        self.send_bytes_on(st, &f.encode()?)
    }

    /// [`Shared::send_on`] for a frame already in its wire form.
    fn send_bytes_on(&self, st: &Stream, bytes: &[u8]) -> io::Result<bool> {
        let mut w = lock(&self.writer);
        if lock(&st.send).reset || lock(&st.recv).reset {
            return Ok(false);
        }
        w.write_all(bytes)?;
        w.flush()?;
        Ok(true)
    }

    /// Ends the link: every stream is reset and the transport shut.
    fn kill(&self, why: String) {
        self.kill_as(why, false);
    }

    /// [`Shared::kill`] for an I/O error of the transport: its end if the error says
    /// so.
    fn kill_io(&self, what: &str, e: &io::Error) {
        self.kill_as(format!("{what}: {e}"), transport_end(e));
    }

    fn kill_as(&self, why: String, transport: bool) {
        {
            let mut dead = self.lock_dead();
            if dead.is_some() {
                return;
            }
            *dead = Some(why);
            self.transport_ended.store(transport, Ordering::SeqCst);
        }
        let streams: Vec<Arc<Stream>> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        for s in streams {
            s.reset_here();
        }
        (self.shutdown)();
        self.control_ready.notify_all();
    }

    fn check_alive(&self) -> Result<(), LinkError> {
        match &*self.lock_dead() {
            Some(why) => Err(LinkError::Dead(why.clone())),
            None => Ok(()),
        }
    }
}

impl Stream {
    /// Abandons the stream on this side: both threads end, the app sees it close.
    fn reset_here(&self) {
        lock(&self.send).reset = true;
        lock(&self.recv).reset = true;
        self.send_ready.notify_all();
        self.recv_ready.notify_all();
        let _ = self.ours.shutdown(Shutdown::Both);
    }
}

impl Link {
    /// Starts a link over a transport read by `reader` and written by `writer`;
    /// `shutdown` shuts the transport both ways. The host is the `opener` (it opens
    /// streams with [`Link::open`]); the guest passes `accept`, called with the
    /// application end of every stream the host opens.
    pub fn start(
        reader: Box<dyn Read + Send>,
        writer: Box<dyn Write + Send>,
        shutdown: Box<dyn Fn() + Send + Sync>,
        opener: bool,
        max_streams: usize,
        accept: Option<Accept>,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            shutdown,
            streams: Mutex::new(HashMap::new()),
            next: Mutex::new(1),
            dead: Mutex::new(None),
            transport_ended: AtomicBool::new(false),
            opener,
            max_streams,
            accept: Mutex::new(accept),
            control: Mutex::new(VecDeque::new()),
            control_ready: Condvar::new(),
        });
        let reading = Arc::clone(&shared);
        thread::Builder::new()
            .name("mux-read".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                // Whatever ends the reader — a panic too — ends the link.
                let (why, transport) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        read_loop(&reading, reader)
                    }))
                    .unwrap_or_else(|_| ("the link's reader panicked".into(), false));
                reading.kill_as(why, transport);
            })?;
        Ok(Self { shared })
    }

    /// Starts a link over a Unix stream (the host's connection to QEMU's socket).
    pub fn over_unix(
        transport: UnixStream,
        opener: bool,
        max_streams: usize,
        accept: Option<Accept>,
    ) -> io::Result<Self> {
        let reader = transport.try_clone()?;
        let writer = transport.try_clone()?;
        Self::start(
            Box::new(reader),
            Box::new(writer),
            Box::new(move || {
                let _ = transport.shutdown(Shutdown::Both);
            }),
            opener,
            max_streams,
            accept,
        )
    }

    /// Opens a stream (host only): the application end of its socket pair.
    pub fn open(&self) -> Result<UnixStream, LinkError> {
        let s = &self.shared;
        if !s.opener {
            return Err(LinkError::NotOpener);
        }
        s.check_alive()?;
        let (app, id, stream) = {
            let mut streams = lock(&s.streams);
            if streams.len() >= s.max_streams {
                return Err(LinkError::Busy);
            }
            let mut next = lock(&s.next);
            // Never a live number, never 0 (the link's own).
            let id = loop {
                let id = *next;
                *next = next.wrapping_add(1).max(1);
                if !streams.contains_key(&id) {
                    break id;
                }
            };
            let (app, stream) = new_stream(id).map_err(|e| LinkError::Dead(e.to_string()))?;
            streams.insert(id, Arc::clone(&stream));
            (app, id, stream)
        };
        if let Err(e) = s.send(&Frame::bare(id, Kind::Open)) {
            s.kill_io("write", &e);
            return Err(LinkError::Dead(e.to_string()));
        }
        spawn_stream(s, stream).map_err(|e| LinkError::Dead(e.to_string()))?;
        Ok(app)
    }

    /// Sends a control message (at most [`MAX_PAYLOAD`] bytes).
    pub fn send_control(&self, msg: &[u8]) -> Result<(), LinkError> {
        self.shared.check_alive()?;
        if msg.len() > MAX_PAYLOAD {
            return Err(LinkError::Dead(
                "control message over the frame bound".into(),
            ));
        }
        self.shared
            .send(&Frame {
                stream: CONTROL,
                kind: Kind::Control,
                payload: msg.to_vec(),
            })
            .map_err(|e| LinkError::Dead(e.to_string()))
    }

    /// The next control message, waiting at most `wait`.
    pub fn recv_control(&self, wait: Duration) -> Result<Vec<u8>, LinkError> {
        let s = &self.shared;
        let deadline = Instant::now() + wait;
        let mut q = lock(&s.control);
        loop {
            if let Some(m) = q.pop_front() {
                return Ok(m);
            }
            s.check_alive()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LinkError::Timeout);
            }
            q = s
                .control_ready
                .wait_timeout(q, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Sets (or replaces) the function given every stream the peer opens.
    pub fn set_accept(&self, accept: Accept) {
        *lock(&self.shared.accept) = Some(accept);
    }

    /// Resets every open stream (both ways) and keeps the link: a new session on the
    /// same transport (the guest's answer to a new activation) starts with none.
    pub fn reset_streams(&self) {
        // Under the writer lock: no frame of an old stream goes out after this.
        let _writing = lock(&self.shared.writer);
        let streams: Vec<Arc<Stream>> =
            lock(&self.shared.streams).drain().map(|(_, s)| s).collect();
        for s in streams {
            s.reset_here();
        }
    }

    /// Why the link is down, or `None` while it is up.
    pub fn dead(&self) -> Option<String> {
        self.shared.lock_dead().clone()
    }

    /// Whether the link is down because its transport ended (end of file, a reset, a
    /// broken pipe: what a VMM resetting the connection looks like), rather than
    /// because the peer broke the protocol, a write timed out, or this side shut it.
    pub fn ended_by_transport(&self) -> bool {
        self.shared.lock_dead().is_some() && self.shared.transport_ended.load(Ordering::SeqCst)
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        lock(&self.shared.streams).len()
    }

    /// Ends the link: every stream is reset, the transport shut.
    pub fn shut(&self, why: &str) {
        self.shared.kill(why.to_owned());
    }
}

fn new_stream(id: u32) -> io::Result<(UnixStream, Arc<Stream>)> {
    let (app, ours) = UnixStream::pair()?;
    Ok((
        app,
        Arc::new(Stream {
            id,
            ours,
            send: Mutex::new(Outgoing {
                credit: WINDOW,
                reset: false,
            }),
            send_ready: Condvar::new(),
            recv: Mutex::new(Recv {
                buf: VecDeque::new(),
                window: WINDOW,
                fin: false,
                reset: false,
            }),
            recv_ready: Condvar::new(),
            running: AtomicU8::new(2),
        }),
    ))
}

/// Starts a stream's two threads.
fn spawn_stream(shared: &Arc<Shared>, stream: Arc<Stream>) -> io::Result<()> {
    for outbound in [true, false] {
        let (sh, st) = (Arc::clone(shared), Arc::clone(&stream));
        let spawned = thread::Builder::new()
            .name(if outbound { "mux-out" } else { "mux-in" }.into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                if outbound {
                    pump_out(&sh, &st);
                } else {
                    pump_in(&sh, &st);
                }
                if st.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let mut streams = lock(&sh.streams);
                    if streams.get(&st.id).is_some_and(|s| Arc::ptr_eq(s, &st)) {
                        streams.remove(&st.id);
                    }
                }
            });
        if let Err(e) = spawned {
            let _ = shared.send_on(&stream, &Frame::bare(stream.id, Kind::Reset));
            stream.reset_here();
            let mut streams = lock(&shared.streams);
            if streams
                .get(&stream.id)
                .is_some_and(|s| Arc::ptr_eq(s, &stream))
            {
                streams.remove(&stream.id);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The stream's outgoing bytes, as the peer's credit allows: never more read from the
/// socket than may be sent. EOF becomes `Fin`, an error `Reset`.
fn pump_out(shared: &Shared, st: &Stream) {
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        let credit = {
            let mut send = lock(&st.send);
            while send.credit == 0 && !send.reset {
                send = st
                    .send_ready
                    .wait(send)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if send.reset {
                return;
            }
            send.credit
        };
        let room = (credit as usize).min(MAX_PAYLOAD);
        let n = match (&st.ours).read(&mut buf[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = shared.send_on(st, &Frame::bare(st.id, Kind::Reset));
                st.reset_here();
                return;
            }
        };
        if n == 0 {
            if let Err(e) = shared.send_on(st, &Frame::bare(st.id, Kind::Fin)) {
                shared.kill_io("write", &e);
            }
            return;
        }
        lock(&st.send).credit -= n as u32;
        let sent = frame::wire(st.id, Kind::Data, &buf[..n])
            .and_then(|data| shared.send_bytes_on(st, &data));
        match sent {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                shared.kill_io("write", &e);
                return;
            }
        }
    }
}

/// Received bytes into the stream's socket; credit goes back as they are written.
fn pump_in(shared: &Shared, st: &Stream) {
    let mut chunk = Vec::with_capacity(MAX_PAYLOAD);
    loop {
        {
            let mut recv = lock(&st.recv);
            while recv.buf.is_empty() && !recv.fin && !recv.reset {
                recv = st
                    .recv_ready
                    .wait(recv)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if recv.reset {
                let _ = st.ours.shutdown(Shutdown::Both);
                return;
            }
            if recv.buf.is_empty() {
                // Fin, and everything before it delivered.
                let _ = st.ours.shutdown(Shutdown::Write);
                return;
            }
            let n = recv.buf.len().min(MAX_PAYLOAD);
            chunk.clear();
            chunk.extend(recv.buf.drain(..n));
        }
        if (&st.ours).write_all(&chunk).is_err() {
            // The application closed its end: the peer stops sending.
            let _ = shared.send_on(st, &Frame::bare(st.id, Kind::Reset));
            st.reset_here();
            return;
        }
        let n = chunk.len() as u32;
        lock(&st.recv).window += n;
        match shared.send_on(st, &Frame::credit(st.id, n)) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                shared.kill_io("write", &e);
                return;
            }
        }
    }
}

/// Reads frames until the transport ends or the peer breaks the protocol; the reason,
/// and whether it was the transport's end.
fn read_loop(shared: &Arc<Shared>, mut reader: Box<dyn Read + Send>) -> (String, bool) {
    loop {
        let f = match frame::read_frame(&mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => return ("the transport ended".into(), true),
            Err(e) => return (format!("read: {e}"), transport_end(&e)),
        };
        if let Err(why) = handle(shared, f) {
            return (why, false);
        }
    }
}

/// Whether `e` is the transport's end (end of file, also inside a frame; a reset; a
/// broken pipe), not a malformed frame, a timeout or a local failure.
fn transport_end(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

/// One received frame; `Err` ends the link.
fn handle(shared: &Arc<Shared>, f: Frame) -> Result<(), String> {
    if shared.lock_dead().is_some() {
        return Err("the link is down".into());
    }
    let stream = |id: u32| lock(&shared.streams).get(&id).cloned();
    match f.kind {
        Kind::Control => {
            let mut q = lock(&shared.control);
            if q.len() >= MAX_CONTROL_QUEUED {
                return Err("control messages not read".into());
            }
            q.push_back(f.payload);
            shared.control_ready.notify_all();
        }
        Kind::Open => {
            if shared.opener {
                return Err("the peer opened a stream (only this side opens)".into());
            }
            let full = {
                let streams = lock(&shared.streams);
                if streams.contains_key(&f.stream) {
                    return Err(format!("stream {} opened twice", f.stream));
                }
                streams.len() >= shared.max_streams
            };
            if full {
                shared
                    .send(&Frame::bare(f.stream, Kind::Reset))
                    .map_err(|e| format!("write: {e}"))?;
                return Ok(());
            }
            let (app, st) = new_stream(f.stream).map_err(|e| e.to_string())?;
            lock(&shared.streams).insert(f.stream, Arc::clone(&st));
            spawn_stream(shared, st).map_err(|e| e.to_string())?;
            match lock(&shared.accept).as_mut() {
                Some(accept) => accept(app),
                None => drop(app),
            }
        }
        Kind::Data => {
            // A stream this side already reset: the bytes in flight are dropped.
            let Some(st) = stream(f.stream) else {
                return Ok(());
            };
            let mut recv = lock(&st.recv);
            if recv.reset {
                return Ok(());
            }
            if recv.fin {
                return Err(format!("data after fin on stream {}", f.stream));
            }
            let n = f.payload.len() as u32;
            if n > recv.window {
                return Err(format!("stream {} sent past its credit", f.stream));
            }
            recv.window -= n;
            recv.buf.extend(f.payload);
            st.recv_ready.notify_all();
        }
        Kind::Fin => {
            if let Some(st) = stream(f.stream) {
                lock(&st.recv).fin = true;
                st.recv_ready.notify_all();
            }
        }
        Kind::Reset => {
            if let Some(st) = stream(f.stream) {
                st.reset_here();
            }
        }
        Kind::Credit => {
            let n = f.credit_value().ok_or("bad credit")?;
            if let Some(st) = stream(f.stream) {
                let mut send = lock(&st.send);
                send.credit = send
                    .credit
                    .checked_add(n)
                    .filter(|&c| c <= WINDOW)
                    .ok_or_else(|| format!("stream {} credited past its window", f.stream))?;
                st.send_ready.notify_all();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
