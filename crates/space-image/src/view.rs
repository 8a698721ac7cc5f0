//! The root filesystem a layer is unpacked onto, as overlayfs will show it: the layer
//! being unpacked on top of the layers below it (unpacked already), looked up name by
//! name without following anything.
//!
//! An entry's path is resolved in it the way `tar -x` run in a chroot of that root
//! resolves it (the OCI image spec's "applying changesets": a layer is extracted onto
//! the root its lower layers make): a symbolic link met on the way — of this layer or
//! of one below — is read and its target resolved in the same root, an absolute target
//! from the root's top, `..` never above it, at most [`MAX_LINKS`] links per path.
//! Whatever a link says, the result is a path of directory names in the root, and the
//! entry is written there *in the layer being unpacked*: no link is ever handed to the
//! kernel to follow, so nothing can lead out of the layer (every lookup is a `statat`
//! with `AT_SYMLINK_NOFOLLOW` or an `openat` with `O_NOFOLLOW` on a directory of a
//! layer). With usrmerge bases (`lib -> usr/lib`), a layer's `lib/x.so` lands in
//! `usr/lib/x.so` instead of a real `lib` directory that would hide the base's link
//! (and every library behind it) in the overlay.
//!
//! Overlay semantics of the lookup, top layer first: a whiteout (a character device
//! 0/0) hides the name and everything below; a directory merges with the directories
//! of that name below it until an opaque one (`trusted.overlay.opaque=y`) or a
//! non-directory stops it; a non-directory on top hides everything below.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{FileType, Mode};

use crate::at::{self, DIR};
use crate::limits::MAX_PATH;

/// The most symbolic links one path may go through (Linux's `MAXSYMLINKS`).
pub(crate) const MAX_LINKS: usize = 40;

/// The most names one path's resolution may look up (a layer's directory each): a
/// path of the deepest a name allows, through every link it may go through, takes
/// far fewer; `..` after `..` through links would otherwise cost the square of it.
pub(crate) const MAX_LOOKUPS_PER_PATH: u64 = 8192;

/// The layers of the root, top first: the first is the layer being unpacked.
pub(crate) struct Stack {
    roots: Vec<OwnedFd>,
    /// Names looked up in a layer so far, and the most allowed (see
    /// [`crate::limits::MAX_LOOKUPS_PER_LAYER`]).
    looked_up: std::cell::Cell<u64>,
    max_lookups: u64,
}

/// A directory of the merged root: its directory in each layer (by position) that
/// shows through it, `None` where a layer has none or is hidden.
pub(crate) struct MergedDir(Vec<Option<OwnedFd>>);

impl MergedDir {
    /// The directory of the first layer below the top that shows through (where a
    /// directory created in the top layer takes its owner, mode and mtime from).
    pub(crate) fn below_top(&self) -> Option<BorrowedFd<'_>> {
        self.0.iter().skip(1).flatten().next().map(AsFd::as_fd)
    }
}

/// What a name is in the merged root.
pub(crate) enum Found {
    /// Nothing (or a whiteout hides it).
    Missing,
    /// A directory.
    Dir(MergedDir),
    /// A symbolic link, and its target.
    Symlink(Vec<u8>),
    /// Anything else (a regular file, a FIFO).
    Other,
}

/// Why a path does not resolve to a directory of the root.
#[derive(Debug)]
pub(crate) enum Unresolved {
    /// It goes through more than [`MAX_LINKS`] symbolic links.
    TooManyLinks,
    /// Its resolution looks up more than [`MAX_LOOKUPS_PER_PATH`] names, or the
    /// layer's more than their bound altogether.
    TooCostly,
    /// A component (the path up to it given) is neither a directory nor a link.
    NotADirectory(Vec<u8>),
    /// What it resolves to is longer than [`MAX_PATH`] (links can make a path far
    /// deeper than its entry's name; a tree that deep is refused, as any path is).
    TooLong,
    /// A lookup failed.
    Io(io::Error),
}

impl From<io::Error> for Unresolved {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<rustix::io::Errno> for Unresolved {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(e.into())
    }
}

fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    let mut v = [0u8; 2];
    // Unprivileged, `trusted.*` reads as absent (and such a store has no opaque mark).
    rustix::fs::fgetxattr(dir, "trusted.overlay.opaque", &mut v).is_ok_and(|n| v[..n] == *b"y")
}

impl Stack {
    /// The stack of `top` (the layer being unpacked) over `lowers` (top first), whose
    /// resolutions may look up `max_lookups` names altogether.
    pub(crate) fn new(top: &OwnedFd, lowers: Vec<OwnedFd>, max_lookups: u64) -> io::Result<Self> {
        let mut roots = Vec::with_capacity(lowers.len() + 1);
        roots.push(rustix::io::fcntl_dupfd_cloexec(top, 0)?);
        roots.extend(lowers);
        Ok(Self {
            roots,
            looked_up: std::cell::Cell::new(0),
            max_lookups,
        })
    }

    /// Whether there are layers below the top one.
    pub(crate) fn has_lowers(&self) -> bool {
        self.roots.len() > 1
    }

    /// The root directory.
    pub(crate) fn root(&self) -> io::Result<MergedDir> {
        self.roots
            .iter()
            .map(|r| {
                rustix::io::fcntl_dupfd_cloexec(r, 0)
                    .map(Some)
                    .map_err(io::Error::from)
            })
            .collect::<io::Result<_>>()
            .map(MergedDir)
    }

    fn none(&self) -> MergedDir {
        MergedDir(self.roots.iter().map(|_| None).collect())
    }

    /// What `name` is in the merged directory `dir`.
    pub(crate) fn lookup(&self, dir: &MergedDir, name: &[u8]) -> Result<Found, Unresolved> {
        let mut dirs: Vec<Option<OwnedFd>> = self.roots.iter().map(|_| None).collect();
        let mut merged = false;
        for (i, fd) in dir.0.iter().enumerate() {
            let Some(fd) = fd else { continue };
            let n = self.looked_up.get() + 1;
            if n > self.max_lookups {
                return Err(Unresolved::TooCostly);
            }
            self.looked_up.set(n);
            match at::kind_of(fd.as_fd(), name)? {
                None => {}
                Some((k, rdev)) if at::is_whiteout(k, rdev) => break,
                Some((FileType::Directory, _)) => {
                    let sub = rustix::fs::openat(fd, name, DIR, Mode::empty())?;
                    let opaque = is_opaque(sub.as_fd());
                    dirs[i] = Some(sub);
                    merged = true;
                    if opaque {
                        break;
                    }
                }
                // Below a directory of a layer above, a non-directory is hidden.
                Some(_) if merged => break,
                Some((FileType::Symlink, _)) => {
                    let target = rustix::fs::readlinkat(fd, name, Vec::new())?;
                    return Ok(Found::Symlink(target.into_bytes()));
                }
                Some(_) => return Ok(Found::Other),
            }
        }
        Ok(if merged {
            Found::Dir(MergedDir(dirs))
        } else {
            Found::Missing
        })
    }

    /// The merged directory at `path` (names [`Self::resolve`] gave: directories, or
    /// missing ones).
    pub(crate) fn at(&self, path: &[Vec<u8>]) -> Result<MergedDir, Unresolved> {
        let mut here = self.root()?;
        for (i, c) in path.iter().enumerate() {
            here = match self.lookup(&here, c)? {
                Found::Dir(d) => d,
                Found::Missing => self.none(),
                Found::Symlink(_) | Found::Other => {
                    return Err(Unresolved::NotADirectory(path[..=i].join(&b'/')));
                }
            };
        }
        Ok(here)
    }

    /// Resolves `path` (normal components) in the merged root, following its links
    /// there: the path of the directory it names, as names of directories of the root
    /// (or of ones to create).
    pub(crate) fn resolve(&self, path: &[&[u8]]) -> Result<Vec<Vec<u8>>, Unresolved> {
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(path.len());
        let mut todo: VecDeque<Vec<u8>> = path.iter().map(|c| c.to_vec()).collect();
        let mut here = self.root()?;
        let mut links = 0;
        let start = self.looked_up.get();
        // The length of `out` joined with `/`.
        let mut len = 0usize;
        while let Some(c) = todo.pop_front() {
            if self.looked_up.get() - start > MAX_LOOKUPS_PER_PATH {
                return Err(Unresolved::TooCostly);
            }
            match c.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    if let Some(gone) = out.pop() {
                        len = len.saturating_sub(gone.len() + 1);
                    }
                    here = self.at(&out)?;
                    continue;
                }
                _ => {}
            }
            let found = self.lookup(&here, &c)?;
            if matches!(found, Found::Dir(_) | Found::Missing) {
                len += c.len() + usize::from(!out.is_empty());
                if len > MAX_PATH {
                    return Err(Unresolved::TooLong);
                }
            }
            match found {
                Found::Dir(d) => {
                    out.push(c);
                    here = d;
                }
                Found::Missing => {
                    out.push(c);
                    here = self.none();
                }
                Found::Symlink(target) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Unresolved::TooManyLinks);
                    }
                    if target.starts_with(b"/") {
                        out.clear();
                        len = 0;
                    }
                    for t in target.split(|&b| b == b'/').rev() {
                        todo.push_front(t.to_vec());
                    }
                    here = self.at(&out)?;
                }
                Found::Other => {
                    out.push(c);
                    return Err(Unresolved::NotADirectory(out.join(&b'/')));
                }
            }
        }
        Ok(out)
    }
}
