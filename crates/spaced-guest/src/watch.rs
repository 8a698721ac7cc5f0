//! Directory watches through inotify.
//!
//! Events are sent with blocking writes: while a client reads slowly, events wait in
//! the kernel's inotify queue (bounded by `max_queued_events`), and an overflow is
//! reported as [`WatchEvent::Overflow`] rather than buffered here.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use rustix::event::{PollFd, PollFlags};
use space_proto::frame::FrameReader;
use space_proto::guest::{
    AgentBody, ErrorKind, Input, RequestId, WatchEndReason, WatchEvent, WireError,
};

use crate::conn::{Conn, DontWait, End, Flow, io_error};
use crate::files::resolve;

/// Directories one watch may cover; a deeper tree is refused rather than half-watched.
const MAX_WATCHES: usize = 8192;

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW
}

struct Watcher {
    inotify: Inotify,
    root: PathBuf,
    recursive: bool,
    /// Watched directories, by descriptor, as paths relative to the root.
    dirs: HashMap<WatchDescriptor, String>,
    root_wd: WatchDescriptor,
    /// A MOVED_FROM still waiting for its MOVED_TO (cookie, path, is_dir).
    moved_from: Option<(u32, String, bool)>,
}

/// How long a MOVED_FROM waits for its MOVED_TO when a read split the pair.
const MOVE_PAIR_WAIT_MS: u8 = 10;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('/'))
}

impl Watcher {
    fn new(root: &Path, recursive: bool) -> nix::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        let root_wd = inotify.add_watch(root, mask())?;
        let mut w = Self {
            inotify,
            root: root.to_owned(),
            recursive,
            dirs: HashMap::from([(root_wd, String::new())]),
            root_wd,
            moved_from: None,
        };
        if recursive {
            w.add_subtree("", None)?;
        }
        Ok(w)
    }

    /// Watches every directory below `rel` (which is already watched). With `found`,
    /// also reports what is inside as created: entries made before the watch existed
    /// would otherwise go unseen. (An entry made in between may be reported twice.)
    fn add_subtree(
        &mut self,
        rel: &str,
        mut found: Option<&mut Vec<WatchEvent>>,
    ) -> nix::Result<()> {
        let mut stack = vec![rel.to_owned()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(self.root.join(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = join(&dir, &name);
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if let Some(out) = found.as_deref_mut() {
                    out.push(WatchEvent::Created {
                        path: child.clone(),
                        dir: is_dir,
                    });
                }
                if is_dir {
                    if self.dirs.len() >= MAX_WATCHES {
                        return Err(nix::Error::ENOSPC);
                    }
                    // The directory may vanish between listing and watching.
                    if let Ok(wd) = self.inotify.add_watch(&self.root.join(&child), mask()) {
                        self.dirs.insert(wd, child.clone());
                        stack.push(child);
                    }
                }
            }
        }
        Ok(())
    }

    fn forget_subtree(&mut self, prefix: &str) {
        let gone: Vec<WatchDescriptor> = self
            .dirs
            .iter()
            .filter(|(_, p)| under(p, prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            let _ = self.inotify.rm_watch(wd);
            self.dirs.remove(&wd);
        }
    }

    fn rename_subtree(&mut self, from: &str, to: &str) {
        for p in self.dirs.values_mut() {
            if under(p, from) {
                *p = format!("{to}{}", &p[from.len()..]);
            }
        }
    }

    /// Turns one batch of kernel events into watch events; `true` when the root is gone.
    ///
    /// A move within the tree is a MOVED_FROM and a MOVED_TO with one cookie, next to
    /// each other; a MOVED_FROM alone means the entry left the tree. A MOVED_FROM at the
    /// end of a batch stays pending: the caller waits briefly for the next batch and
    /// calls [`Watcher::flush_move`] if nothing comes.
    fn translate(&mut self, events: Vec<InotifyEvent>, out: &mut Vec<WatchEvent>) -> bool {
        let mut root_gone = false;
        let mut moved_from = self.moved_from.take();
        for ev in events {
            let m = ev.mask;
            if m.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                out.push(WatchEvent::Overflow);
                continue;
            }
            if m.contains(AddWatchFlags::IN_IGNORED) {
                self.dirs.remove(&ev.wd);
                root_gone |= ev.wd == self.root_wd;
                continue;
            }
            if m.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF) {
                root_gone |= ev.wd == self.root_wd;
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd), ev.name.as_ref()) else {
                continue;
            };
            let path = join(dir, &name.to_string_lossy());
            let is_dir = m.contains(AddWatchFlags::IN_ISDIR);
            let pairs = m.contains(AddWatchFlags::IN_MOVED_TO)
                && moved_from.as_ref().is_some_and(|(c, _, _)| *c == ev.cookie);
            if !pairs {
                if let Some((_, from, was_dir)) = moved_from.take() {
                    self.left_tree(from, was_dir, out);
                }
            }
            if m.contains(AddWatchFlags::IN_CREATE) {
                out.push(WatchEvent::Created {
                    path: path.clone(),
                    dir: is_dir,
                });
                self.entered_tree(&path, is_dir, out);
            } else if m.contains(AddWatchFlags::IN_MODIFY) {
                // Large writes arrive as many modifications: report one per batch.
                let same =
                    matches!(out.last(), Some(WatchEvent::Modified { path: p }) if *p == path);
                if !same {
                    out.push(WatchEvent::Modified { path });
                }
            } else if m.contains(AddWatchFlags::IN_DELETE) {
                out.push(WatchEvent::Removed { path, dir: is_dir });
            } else if m.contains(AddWatchFlags::IN_MOVED_FROM) {
                moved_from = Some((ev.cookie, path, is_dir));
            } else if m.contains(AddWatchFlags::IN_MOVED_TO) {
                if let Some((_, from, _)) = moved_from.take().filter(|_| pairs) {
                    if is_dir {
                        self.rename_subtree(&from, &path);
                    }
                    out.push(WatchEvent::Renamed { from, to: path });
                } else {
                    out.push(WatchEvent::Created {
                        path: path.clone(),
                        dir: is_dir,
                    });
                    self.entered_tree(&path, is_dir, out);
                }
            }
        }
        self.moved_from = moved_from;
        if root_gone {
            self.flush_move(out);
        }
        root_gone
    }

    /// Reports a pending MOVED_FROM as a removal: its MOVED_TO did not come.
    fn flush_move(&mut self, out: &mut Vec<WatchEvent>) {
        if let Some((_, from, was_dir)) = self.moved_from.take() {
            self.left_tree(from, was_dir, out);
        }
    }

    fn entered_tree(&mut self, path: &str, is_dir: bool, out: &mut Vec<WatchEvent>) {
        if !(is_dir && self.recursive) {
            return;
        }
        if let Ok(wd) = self.inotify.add_watch(&self.root.join(path), mask()) {
            self.dirs.insert(wd, path.to_owned());
            // Over the watch limit the new subtree is only partly watched; the client
            // learns of it through the overflow event.
            if self.add_subtree(path, Some(out)).is_err() {
                out.push(WatchEvent::Overflow);
            }
        }
    }

    fn left_tree(&mut self, path: String, was_dir: bool, out: &mut Vec<WatchEvent>) {
        if was_dir {
            self.forget_subtree(&path);
        }
        out.push(WatchEvent::Removed { path, dir: was_dir });
    }
}

/// Watches `path` and streams events until the client sends `Input::Close`.
pub(crate) fn run(conn: &mut Conn<'_>, id: RequestId, path: &str, recursive: bool) -> Flow {
    let root = match resolve(conn.agent, path) {
        Ok(p) => p,
        Err(e) => return conn.send_error(id, e),
    };
    let mut watcher = match Watcher::new(&root, recursive) {
        Ok(w) => w,
        Err(nix::Error::ENOSPC) => {
            return conn.send_error(
                id,
                WireError::new(ErrorKind::Io, format!("watch {path}: too many directories")),
            );
        }
        Err(e) => return conn.send_error(id, io_error(&format!("watch {path}"), &e.into())),
    };
    conn.send(id, AgentBody::WatchStarted)?;
    let mut inbox = FrameReader::new();
    let mut events = Vec::new();
    loop {
        let (sock, ino) = {
            let mut fds = [
                PollFd::new(&conn.stream, PollFlags::IN),
                PollFd::from_borrowed_fd(watcher.inotify.as_fd(), PollFlags::IN),
            ];
            let pair_wait = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(MOVE_PAIR_WAIT_MS) * 1_000_000,
            };
            let timeout = watcher.moved_from.is_some().then_some(&pair_wait);
            match rustix::event::poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(e) if e == rustix::io::Errno::INTR => continue,
                Err(_) => return Err(End::Gone),
            }
            (fds[0].revents(), fds[1].revents())
        };
        if sock.is_empty() && ino.is_empty() {
            // The wait for the second half of a move ran out.
            watcher.flush_move(&mut events);
            for ev in events.drain(..) {
                conn.send(id, AgentBody::WatchEvent(ev))?;
            }
            continue;
        }
        if !sock.is_empty() {
            loop {
                let body = match inbox.poll_read(&mut DontWait(&conn.stream)) {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(e) => return Err(conn.frame_failed(e)),
                };
                let frame = conn.decode(&body)?;
                match conn.input_for(Some(id), frame)? {
                    Some(Input::Close) => {
                        watcher.flush_move(&mut events);
                        for ev in events.drain(..) {
                            conn.send(id, AgentBody::WatchEvent(ev))?;
                        }
                        let reason = WatchEndReason::Closed;
                        return conn.send(id, AgentBody::WatchEnded { reason });
                    }
                    Some(other) => {
                        return Err(conn.refuse(
                            ErrorKind::Protocol,
                            format!("{other:?} is not input for a watch"),
                        ));
                    }
                    None => {}
                }
            }
        }
        if !ino.is_empty() {
            let batch = match watcher.inotify.read_events() {
                Ok(b) => b,
                Err(nix::Error::EAGAIN | nix::Error::EINTR) => continue,
                Err(e) => return conn.send_error(id, io_error("watch", &e.into())),
            };
            let root_gone = watcher.translate(batch, &mut events);
            for ev in events.drain(..) {
                conn.send(id, AgentBody::WatchEvent(ev))?;
            }
            if root_gone {
                let reason = WatchEndReason::RootGone;
                return conn.send(id, AgentBody::WatchEnded { reason });
            }
        }
    }
}
