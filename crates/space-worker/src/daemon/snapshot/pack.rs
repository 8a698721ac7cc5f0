//! Packing a layer: the tree walked in name order, each file counted at its apparent
//! size before it is read, the archive hashed and bounded as it is written.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{MAX_ARCHIVE, WHITEOUT_KEY, size_words};

/// The error of a layer over `limit`.
fn over_limit(limit: u64, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "the writable layer is over the snapshot size limit of {}: {what}",
            size_words(limit)
        ),
    )
}

/// The overlay attributes an archive carries: what the directory *is* in the merged
/// view (opaque; renamed from a lower path). The others (`origin`, `impure`,
/// `nlink`, `uuid`, …) are file handles and counters of this worker's own filesystem,
/// meaningless anywhere else, and binary.
const CARRIED_XATTRS: &[&str] = &["trusted.overlay.opaque", "trusted.overlay.redirect"];

/// The carried `trusted.overlay.*` attributes of `path` (without following a
/// symlink). A value holding a newline (a renamed directory's path can) is refused:
/// an extended header's records are lines, and a reader that splits them would lose
/// or invent records.
fn overlay_xattrs(path: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let all = all_overlay_xattrs(path);
    let kept: Vec<_> = all
        .into_iter()
        .filter(|(k, _)| CARRIED_XATTRS.contains(&k.as_str()))
        .collect();
    if let Some((k, _)) = kept.iter().find(|(_, v)| v.contains(&b'\n')) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: its {k} holds a newline (a directory renamed from a path with one): it cannot be archived",
                path.display()
            ),
        ));
    }
    Ok(kept)
}

/// Every `trusted.overlay.*` attribute of `path` (without following a symlink).
fn all_overlay_xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names) else {
        return Vec::new();
    };
    names
        .get(..n)
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|name| name.starts_with(b"trusted.overlay."))
        .filter_map(|name| {
            let name = std::str::from_utf8(name).ok()?;
            let mut value = vec![0u8; 4096];
            let len = rustix::fs::lgetxattr(path, name, &mut value).ok()?;
            value.truncate(len);
            Some((name.to_owned(), value))
        })
        .collect()
}

fn header_for(meta: &fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_uid(u64::from(meta.uid()));
    h.set_gid(u64::from(meta.gid()));
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(size);
    h
}

/// What an archive is written into: counts and hashes the bytes, and fails once they
/// would pass the limit (so nothing past it is ever written).
struct Sink<W> {
    out: W,
    written: u64,
    limit: u64,
    hash: blake3::Hasher,
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.limit {
            return Err(over_limit(
                self.limit,
                "the archive grew past it while it was written",
            ));
        }
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// What [`pack_into`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Bytes of the archive.
    pub size: u64,
    /// BLAKE3 of those bytes, lowercase hex.
    pub digest: String,
}

/// Tar bytes an entry of `len` data bytes takes at least (header and padding).
fn entry_bytes(len: u64) -> u64 {
    512 + len.div_ceil(512) * 512
}

struct Packer<W: Write> {
    b: tar::Builder<Sink<W>>,
    /// Bytes the archive takes so far, counting each file at its apparent size before
    /// any of it is read (or, keeping holes, at its data extents).
    planned: u64,
    /// Files with holes go as their data extents ([`super::sparse`]).
    keep_holes: bool,
}

/// Deepest directory a layer may nest: the walk is iterative (a deep tree cannot
/// overflow the worker's stack), and this bounds its bookkeeping.
pub const MAX_DEPTH: usize = 4096;

/// One directory being walked: its path in the layer and its entries, sorted, from
/// `next` on still to visit.
struct Level {
    rel: PathBuf,
    entries: Vec<fs::DirEntry>,
    next: usize,
}

impl Level {
    fn read(root: &Path, rel: PathBuf) -> io::Result<Self> {
        let mut entries: Vec<fs::DirEntry> =
            fs::read_dir(root.join(&rel))?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        Ok(Self {
            rel,
            entries,
            next: 0,
        })
    }
}

impl<W: Write> Packer<W> {
    /// Archives the tree below `root`, depth first, each directory before its
    /// entries, in name order (the same tree gives the same archive). Iterative: the
    /// layer is the sandbox's, and it may nest as deep as it likes.
    fn add_tree(&mut self, root: &Path) -> io::Result<()> {
        let mut stack = vec![Level::read(root, PathBuf::new())?];
        while let Some(level) = stack.last_mut() {
            let Some(e) = level.entries.get(level.next) else {
                stack.pop();
                continue;
            };
            level.next += 1;
            let rel = level.rel.join(e.file_name());
            if self.add_entry(root, &rel)? {
                if stack.len() >= MAX_DEPTH {
                    return Err(io::Error::other(format!(
                        "the writable layer nests deeper than {MAX_DEPTH} directories (at /{})",
                        rel.display()
                    )));
                }
                stack.push(Level::read(root, rel)?);
            }
        }
        Ok(())
    }

    /// Archives one entry; `true` when it is a directory whose entries come next.
    fn add_entry(&mut self, root: &Path, rel: &Path) -> io::Result<bool> {
        let limit = self.b.get_ref().limit;
        let path = root.join(rel);
        let meta = fs::symlink_metadata(&path)?;
        let ft = meta.file_type();
        // The temporary file of a write the snapshot cut off: that write was never
        // acknowledged (its client retries it on the next execution).
        if ft.is_file()
            && rel
                .file_name()
                .is_some_and(|n| space_proto::guest::temp_files::is_temp_name(n.as_encoded_bytes()))
        {
            return Ok(false);
        }
        let xattrs = overlay_xattrs(&path)?;
        let pax: Vec<(String, Vec<u8>)> = xattrs
            .into_iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v))
            .collect();
        // Headers, long names and extension records: a generous bound per entry.
        self.planned += 3 * 512 + rel.as_os_str().len() as u64;
        if self.planned > limit {
            return Err(over_limit(limit, &format!("at /{}", rel.display())));
        }
        // Keeping holes, a file with some goes as its data extents.
        let extents = match ft.is_file() && self.keep_holes && meta.blocks() * 512 < meta.len() {
            true => {
                let f = open_file(&path)?;
                super::sparse::data_extents(&f, meta.len())?.map(|e| (f, e))
            }
            false => None,
        };
        if let Some((f, extents)) = extents {
            let data: u64 = extents.iter().map(|(_, l)| l).sum();
            let map = super::sparse::encode_map(meta.len(), &extents);
            self.planned += entry_bytes(data) + entry_bytes(map.len() as u64 + 64);
            if self.planned > limit {
                return Err(over_limit(
                    limit,
                    &format!("/{} holds {}", rel.display(), size_words(data)),
                ));
            }
            let mut records: Vec<(&str, &[u8])> = pax
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            records.push((super::sparse::SPARSE_KEY, map.as_bytes()));
            self.b.append_pax_extensions(records)?;
            let mut h = header_for(&meta, tar::EntryType::Regular, data);
            self.b
                .append_data(&mut h, rel, super::sparse::ExtentReader::new(f, extents))?;
            return Ok(false);
        }
        if ft.is_file() {
            // A sparse file counts at its apparent size: refused before a byte of
            // it is read, however few blocks it really holds.
            self.planned += entry_bytes(meta.len());
            if self.planned > limit {
                return Err(over_limit(
                    limit,
                    &format!(
                        "/{} is {} (sparse files count at their apparent size)",
                        rel.display(),
                        size_words(meta.len())
                    ),
                ));
            }
        }
        if ft.is_char_device() && meta.rdev() == 0 {
            self.b.append_pax_extensions([(WHITEOUT_KEY, &b"1"[..])])?;
            let mut h = header_for(&meta, tar::EntryType::Regular, 0);
            self.b.append_data(&mut h, rel, io::empty())?;
            return Ok(false);
        }
        if !pax.is_empty() {
            self.b
                .append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        if ft.is_dir() {
            let mut h = header_for(&meta, tar::EntryType::Directory, 0);
            self.b.append_data(&mut h, rel, io::empty())?;
            return Ok(true);
        }
        if ft.is_file() {
            let f = open_file(&path)?;
            let mut h = header_for(&meta, tar::EntryType::Regular, meta.len());
            // Exactly the size in the header, whatever the file holds now.
            self.b
                .append_data(&mut h, rel, ExactLen::new(f, meta.len()))?;
        } else if ft.is_symlink() {
            let mut h = header_for(&meta, tar::EntryType::Symlink, 0);
            self.b.append_link(&mut h, rel, fs::read_link(&path)?)?;
        }
        // Sockets, FIFOs and other devices do not survive a snapshot.
        Ok(false)
    }
}

/// Opens a file of the tree for reading, never through a symlink (the tree is the
/// sandbox's).
fn open_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// A reader of exactly `len` bytes: `inner`'s, cut or padded with zeros.
struct ExactLen<R> {
    inner: R,
    left: u64,
    ended: bool,
}

impl<R: Read> ExactLen<R> {
    fn new(inner: R, len: u64) -> Self {
        Self {
            inner,
            left: len,
            ended: false,
        }
    }
}

impl<R: Read> Read for ExactLen<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        let n = if self.ended {
            0
        } else {
            self.inner.read(&mut buf[..want])?
        };
        let n = if n == 0 {
            self.ended = true;
            buf[..want].fill(0);
            want
        } else {
            n
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// Archives the directory tree at `upper` (which must not change meanwhile: the
/// execution is frozen) into `out`, streaming: at most one read buffer of a file is
/// in memory at a time. Fails, naming the limit, before the archive would pass
/// `limit` bytes; a file too large for it is refused before any of it is read.
pub fn pack_into<W: Write>(upper: &Path, out: W, limit: u64) -> io::Result<Packed> {
    pack_tree(upper, out, limit, false)
}

fn pack_tree<W: Write>(upper: &Path, out: W, limit: u64, keep_holes: bool) -> io::Result<Packed> {
    let sink = Sink {
        out,
        written: 0,
        limit,
        hash: blake3::Hasher::new(),
    };
    let mut p = Packer {
        b: tar::Builder::new(sink),
        planned: 1024,
        keep_holes,
    };
    p.b.mode(tar::HeaderMode::Complete);
    p.add_tree(upper)?;
    let mut sink = p.b.into_inner()?;
    sink.flush()?;
    Ok(Packed {
        size: sink.written,
        digest: sink.hash.finalize().to_hex().to_string(),
    })
}

/// [`pack_into`] a new file in `dir` that has no name (unlinked as soon as it is
/// made, so nothing is left behind whatever happens), rewound for reading.
pub fn pack_to_temp(upper: &Path, dir: &Path, limit: u64) -> io::Result<(fs::File, Packed)> {
    pack_tree_to_temp(upper, dir, limit, false)
}

/// [`pack_to_temp`], files with holes as their data extents ([`super::sparse`]): for
/// a VM's snapshot, whose disk image is mostly holes. Only
/// [`super::unpack_keeping_holes`] reads such an archive.
pub fn pack_to_temp_keeping_holes(
    upper: &Path,
    dir: &Path,
    limit: u64,
) -> io::Result<(fs::File, Packed)> {
    pack_tree_to_temp(upper, dir, limit, true)
}

fn pack_tree_to_temp(
    upper: &Path,
    dir: &Path,
    limit: u64,
    keep_holes: bool,
) -> io::Result<(fs::File, Packed)> {
    use std::io::Seek;
    fs::create_dir_all(dir)?;
    let mut f = tempfile_in(dir)?;
    let packed = pack_tree(
        upper,
        io::BufWriter::with_capacity(256 << 10, &mut f),
        limit,
        keep_holes,
    )?;
    f.sync_data()?;
    f.seek(io::SeekFrom::Start(0))?;
    Ok((f, packed))
}

/// A new, already unlinked, private file in `dir`.
pub fn tempfile_in(dir: &Path) -> io::Result<fs::File> {
    fs::create_dir_all(dir)?;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)
}

/// Archives `upper` in memory (tests and small layers).
pub fn pack(upper: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    pack_into(upper, &mut out, MAX_ARCHIVE)?;
    Ok(out)
}
