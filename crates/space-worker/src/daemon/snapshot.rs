//! A sandbox's writable layer as an archive: what a snapshot holds and what moves a
//! sandbox to another worker.
//!
//! A tar stream of the overlay's upper directory: directories, regular files and
//! symlinks with modes, owners and times; overlayfs whiteouts (0:0 character devices)
//! marked with a `SPACE.whiteout` PAX record (tar readers would unpack them as plain
//! files); and the `trusted.overlay.*` extended attributes (opaque directories) as
//! `SCHILY.xattr` PAX records. Integrity and authenticity come from outside: the
//! control plane signs the archive's BLAKE3 digest, and the receiver checks both
//! before unpacking anything.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Largest archive a worker produces or accepts.
pub const MAX_ARCHIVE: u64 = 1 << 30;

const WHITEOUT_KEY: &str = "SPACE.whiteout";

/// `MAX_ARCHIVE` (or any limit) in words, for errors.
fn size_words(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

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

/// The `trusted.overlay.*` attributes of `path` (without following a symlink).
fn overlay_xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
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
    /// any of it is read.
    planned: u64,
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
        let xattrs = overlay_xattrs(&path);
        let pax: Vec<(String, Vec<u8>)> = xattrs
            .into_iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v))
            .collect();
        // Headers, long names and extension records: a generous bound per entry.
        self.planned += 3 * 512 + rel.as_os_str().len() as u64;
        if self.planned > limit {
            return Err(over_limit(limit, &format!("at /{}", rel.display())));
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
            // Never through a symlink (the tree is the sandbox's).
            let f = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)?;
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
    let sink = Sink {
        out,
        written: 0,
        limit,
        hash: blake3::Hasher::new(),
    };
    let mut p = Packer {
        b: tar::Builder::new(sink),
        planned: 1024,
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
    use std::io::Seek;
    fs::create_dir_all(dir)?;
    let mut f = tempfile_in(dir)?;
    let packed = pack_into(
        upper,
        io::BufWriter::with_capacity(256 << 10, &mut f),
        limit,
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

/// An error about an archive entry that is refused.
fn refused_entry(rel: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "archive entry {:?} refused: {why}",
            rel.display().to_string()
        ),
    )
}

/// `rel` as a path under `dest` whose every component is a plain name, whose parents
/// are real directories under `dest` (created if missing, never through a symlink),
/// and which does not exist yet — unless `dir_ok` and it is a real directory.
///
/// `real_dirs` holds the directories this unpack already checked or made: nothing
/// else changes `dest` meanwhile and no entry may replace one, so each is checked
/// once (a deep layer costs one check per directory, not one per entry and level).
fn place(
    dest: &Path,
    rel: &Path,
    dir_ok: bool,
    real_dirs: &mut std::collections::HashSet<PathBuf>,
) -> io::Result<PathBuf> {
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(refused_entry(
                rel,
                "absolute paths and `.`/`..` components leave the layer",
            )),
        })
        .collect::<io::Result<_>>()?;
    let Some((last, parents)) = names.split_last() else {
        return Err(refused_entry(rel, "empty path"));
    };
    let mut at = dest.to_path_buf();
    // A directory is recorded only once all its parents were: when the entry's
    // parent is known, so are the others.
    let parent_known = real_dirs.contains(&dest.join(parents.iter().collect::<PathBuf>()));
    for name in parents {
        at.push(name);
        if parent_known || real_dirs.contains(&at) {
            continue;
        }
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(refused_entry(
                    rel,
                    "a parent is not a directory (never followed)",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
        real_dirs.insert(at.clone());
    }
    at.push(last);
    match fs::symlink_metadata(&at) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(at),
        Ok(m) if dir_ok && m.file_type().is_dir() => Ok(at),
        Ok(_) => Err(refused_entry(rel, "a second entry for the same path")),
        Err(e) => Err(e),
    }
}

/// Unpacks an archive made by [`pack`] into `dest`, which must not exist: a new
/// directory is filled, so nothing outside it can be touched. The archive's contents
/// are the sandbox's, so only directories, regular files, symlinks and whiteouts are
/// accepted (no hard links, devices, FIFOs or sparse entries), every path must be
/// made of plain names, and no symlink is followed: an entry below a symlink an
/// earlier entry made, or over an existing path, is refused.
pub fn unpack<R: Read>(archive: R, dest: &Path) -> io::Result<()> {
    fs::create_dir(dest)?;
    let mut real_dirs = std::collections::HashSet::new();
    let mut a = tar::Archive::new(archive);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_preserve_mtime(true);
    a.set_overwrite(false);
    for entry in a.entries()? {
        let mut entry = entry?;
        let mut whiteout = false;
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        for x in entry
            .pax_extensions()?
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            if x.key_bytes() == WHITEOUT_KEY.as_bytes() {
                whiteout = true;
            } else if let Some(name) = x.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                if name.starts_with("trusted.overlay.") {
                    xattrs.push((name.to_owned(), x.value_bytes().to_vec()));
                }
            }
        }
        let rel = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        if whiteout {
            if kind != tar::EntryType::Regular || entry.size() != 0 {
                return Err(refused_entry(&rel, "a whiteout holds no data"));
            }
            let at = place(dest, &rel, false, &mut real_dirs)?;
            nix::sys::stat::mknod(
                &at,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::empty(),
                0,
            )
            .map_err(io::Error::from)?;
            continue;
        }
        let at = match kind {
            tar::EntryType::Directory => place(dest, &rel, true, &mut real_dirs)?,
            tar::EntryType::Regular | tar::EntryType::Symlink => {
                place(dest, &rel, false, &mut real_dirs)?
            }
            tar::EntryType::Link => return Err(refused_entry(&rel, "hard links are refused")),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refused_entry(
                    &rel,
                    "device nodes other than whiteouts are refused",
                ));
            }
            other => {
                return Err(refused_entry(
                    &rel,
                    &format!("entries of type {other:?} are refused"),
                ));
            }
        };
        // `place` made sure `at` is new (or a real directory) under real directories;
        // tar creates files with O_EXCL and symlinks without following anything.
        entry.unpack(&at)?;
        if kind == tar::EntryType::Directory {
            real_dirs.insert(at.clone());
        }
        for (name, value) in xattrs {
            rustix::fs::lsetxattr(
                at.as_path(),
                name.as_str(),
                &value,
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(io::Error::from)?;
        }
    }
    Ok(())
}

/// BLAKE3 of `bytes`, lowercase hex.
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_with_files_links_whiteouts_and_opaque_dirs_round_trips() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: whiteouts and trusted xattrs need root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("upper");
        fs::create_dir_all(src.join("root/dir")).unwrap();
        fs::write(src.join("root/dir/file.txt"), b"data").unwrap();
        std::os::unix::fs::symlink("dir/file.txt", src.join("root/link")).unwrap();
        nix::sys::stat::mknod(
            &src.join("root/gone"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .unwrap();
        let opaque = rustix::fs::setxattr(
            src.join("root/dir").as_path(),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        );
        let archive = pack(&src).unwrap();
        let dst = t.path().join("restored");
        unpack(&archive[..], &dst).unwrap();
        assert_eq!(fs::read(dst.join("root/dir/file.txt")).unwrap(), b"data");
        assert_eq!(
            fs::read_link(dst.join("root/link")).unwrap(),
            Path::new("dir/file.txt")
        );
        let gone = fs::symlink_metadata(dst.join("root/gone")).unwrap();
        assert!(
            gone.file_type().is_char_device() && gone.rdev() == 0,
            "whiteout lost"
        );
        if opaque.is_ok() {
            let mut v = [0u8; 8];
            let n = rustix::fs::getxattr(
                dst.join("root/dir").as_path(),
                "trusted.overlay.opaque",
                &mut v,
            )
            .unwrap();
            assert_eq!(&v[..n], b"y");
        }
        // The same tree gives the same archive.
        assert_eq!(digest(&pack(&src).unwrap()), digest(&archive));
    }

    /// `depth` nested directories `d/d/…` below `root`, made relative to descriptors.
    fn nest(root: &Path, depth: usize) {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut dir = rustix::fs::open(root, flags, Mode::empty()).unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).unwrap();
            dir = rustix::fs::openat(&dir, c"d", flags, Mode::empty()).unwrap();
        }
    }

    /// Runs `f` on a thread with the 2 MiB stack of a runtime's blocking threads.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_deeply_nested_layer_packs_on_a_small_stack_or_is_refused_never_crashing() {
        let t = tempfile::tempdir().unwrap();
        // Deep, but its paths still fit PATH_MAX: packed and unpacked whole (the
        // recursive walk overflowed a 2 MiB stack at some 1,400 levels).
        let deep = t.path().join("deep");
        fs::create_dir(&deep).unwrap();
        nest(&deep, 1_900);
        let archive = on_small_stack({
            let deep = deep.clone();
            move || pack(&deep)
        })
        .unwrap();
        let dst = t.path().join("restored");
        unpack(&archive[..], &dst).unwrap();
        let mut depth = 0;
        let mut at = dst.clone();
        while at.join("d").is_dir() {
            at.push("d");
            depth += 1;
        }
        assert_eq!(depth, 1_900);
        // Deeper than any path can name: a clear error, and the worker lives on.
        let deeper = t.path().join("deeper");
        fs::create_dir(&deeper).unwrap();
        nest(&deeper, 4_000);
        let refused = on_small_stack(move || pack(&deeper));
        assert!(refused.is_err());
        crate::substrate::tree::remove_tree(&t.path().join("deeper")).unwrap();
    }

    #[test]
    fn links_planted_in_the_layer_are_packed_as_links_never_followed() {
        // The layer is the sandbox's: links to host files and directories, absolute
        // or climbing, must travel as links, and nothing they point at is read.
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        fs::create_dir_all(host.join("secrets")).unwrap();
        fs::write(host.join("secrets/key"), b"host secret").unwrap();
        let src = t.path().join("upper");
        fs::create_dir_all(src.join("root")).unwrap();
        std::os::unix::fs::symlink(host.join("secrets/key"), src.join("root/file-link")).unwrap();
        std::os::unix::fs::symlink(host.join("secrets"), src.join("root/dir-link")).unwrap();
        std::os::unix::fs::symlink("../../../../host/secrets", src.join("etc-link")).unwrap();
        let archive = pack(&src).unwrap();
        let text = String::from_utf8_lossy(&archive);
        assert!(
            !text.contains("host secret"),
            "a linked host file was packed"
        );
        let mut entries = Vec::new();
        for e in tar::Archive::new(&archive[..]).entries().unwrap() {
            let e = e.unwrap();
            entries.push((
                e.path().unwrap().display().to_string(),
                e.header().entry_type(),
            ));
        }
        for name in ["root/file-link", "root/dir-link", "etc-link"] {
            assert!(
                entries
                    .iter()
                    .any(|(p, k)| p == name && *k == tar::EntryType::Symlink),
                "{name} not packed as a link: {entries:?}"
            );
        }
        assert!(
            !entries.iter().any(|(p, _)| p.contains("key")),
            "{entries:?}"
        );
        // And it unpacks as links, nothing outside the destination touched.
        let dst = t.path().join("restored");
        unpack(&archive[..], &dst).unwrap();
        assert_eq!(
            fs::read_link(dst.join("root/file-link")).unwrap(),
            host.join("secrets/key")
        );
        assert_eq!(fs::read_dir(host.join("secrets")).unwrap().count(), 1);
    }

    #[test]
    fn a_write_cut_off_by_the_snapshot_leaves_no_temporary_file_in_the_next_execution() {
        use space_proto::guest::temp_files::temp_name;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("upper");
        fs::create_dir_all(src.join("root/work")).unwrap();
        fs::write(src.join("root/work/notes"), b"kept").unwrap();
        // What an agent frozen mid-write leaves, in two directories.
        let cut = temp_name("notes", 9, 41, 0x0123_4567_89ab_cdef);
        fs::write(src.join("root/work").join(&cut), b"half a wr").unwrap();
        fs::write(src.join("root").join(temp_name("x", 1, 0, 7)), b"").unwrap();
        // A user's files that only look alike, and a directory of that form, stay.
        fs::write(src.join("root/work/.notes.space-tmp.1"), b"mine").unwrap();
        fs::create_dir(src.join("root").join(temp_name("d", 1, 0, 7))).unwrap();
        let archive = pack(&src).unwrap();
        let dst = t.path().join("restored");
        unpack(&archive[..], &dst).unwrap();
        let mut names: Vec<String> = fs::read_dir(dst.join("root/work"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".notes.space-tmp.1", "notes"]);
        assert!(!dst.join("root").join(temp_name("x", 1, 0, 7)).exists());
        assert!(dst.join("root").join(temp_name("d", 1, 0, 7)).is_dir());
        assert_eq!(fs::read(dst.join("root/work/notes")).unwrap(), b"kept");
    }

    #[test]
    fn archive_entries_cannot_leave_the_destination() {
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        h.set_mode(0o644);
        // tar's own path setter refuses "..", so write the name bytes directly.
        let name = b"../escaped";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let archive = b.into_inner().unwrap();
        assert!(unpack(&archive[..], &t.path().join("dest")).is_err());
        assert!(!t.path().join("escaped").exists());
    }

    /// An archive of `entries` (type, path, link target, data), paths written raw.
    fn hostile(entries: &[(tar::EntryType, &str, &str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (kind, path, link, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
            }
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn refused(archive: &[u8], dest: &Path, says: &str) {
        let e = unpack(archive, dest).expect_err("a hostile archive was unpacked");
        assert!(e.to_string().contains(says), "{e}");
    }

    #[test]
    fn a_file_below_a_symlink_the_archive_made_is_refused_not_written_outside() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let archive = hostile(&[
            (tar::EntryType::Symlink, "a", outside.to_str().unwrap(), b""),
            (tar::EntryType::Regular, "a/x", "", b"planted"),
        ]);
        refused(&archive, &t.path().join("dest"), "never followed");
        assert!(
            !outside.join("x").exists(),
            "a file was written through the symlink"
        );
        // Nor over the symlink itself (the same path twice).
        let archive = hostile(&[
            (
                tar::EntryType::Symlink,
                "b",
                outside.join("y").to_str().unwrap(),
                b"",
            ),
            (tar::EntryType::Regular, "b", "", b"planted"),
        ]);
        refused(&archive, &t.path().join("dest2"), "same path");
        assert!(!outside.join("y").exists());
    }

    #[test]
    fn hard_links_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        fs::write(&secret, b"host").unwrap();
        let archive = hostile(&[(tar::EntryType::Link, "l", secret.to_str().unwrap(), b"")]);
        refused(&archive, &t.path().join("dest"), "hard links");
        let archive = hostile(&[
            (tar::EntryType::Regular, "f", "", b"x"),
            (tar::EntryType::Link, "l", "f", b""),
        ]);
        refused(&archive, &t.path().join("dest2"), "hard links");
    }

    #[test]
    fn device_nodes_and_fifos_are_refused() {
        let t = tempfile::tempdir().unwrap();
        for (i, kind) in [
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
        ]
        .into_iter()
        .enumerate()
        {
            let dest = t.path().join(format!("dest{i}"));
            refused(&hostile(&[(kind, "mem", "", b"")]), &dest, "refused");
            assert!(!dest.join("mem").exists());
        }
    }

    #[test]
    fn absolute_and_dotted_paths_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let abs = t.path().join("abs");
        for (i, path) in [abs.to_str().unwrap(), "a/../../x", "./../x"]
            .into_iter()
            .enumerate()
        {
            let archive = hostile(&[(tar::EntryType::Regular, path, "", b"x")]);
            assert!(
                unpack(&archive[..], &t.path().join(format!("d{i}"))).is_err(),
                "{path}"
            );
        }
        assert!(!abs.exists());
        assert!(!t.path().join("x").exists());
    }

    /// Peak RSS of this process (VmHWM), bytes.
    fn peak_rss() -> u64 {
        let status = fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }

    /// A writer that only counts.
    #[derive(Default)]
    struct Count(u64);

    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_50_gib_sparse_file_is_refused_by_its_apparent_size_before_it_is_read() {
        let t = tempfile::tempdir().unwrap();
        let upper = t.path().join("upper");
        fs::create_dir_all(upper.join("root")).unwrap();
        fs::write(upper.join("root/small"), b"x").unwrap();
        let big = fs::File::create(upper.join("root/big")).unwrap();
        big.set_len(50 << 30).unwrap();
        let before = peak_rss();
        let mut out = Count::default();
        let e = pack_into(&upper, &mut out, MAX_ARCHIVE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        let msg = e.to_string();
        assert!(
            msg.contains("1 GiB") && msg.contains("/root/big") && msg.contains("50 GiB"),
            "{msg}"
        );
        assert!(
            out.0 < 1 << 20,
            "{} bytes written before the refusal",
            out.0
        );
        let growth = peak_rss().saturating_sub(before);
        assert!(growth < 32 << 20, "peak RSS grew {growth} bytes");
    }

    #[test]
    fn an_archive_is_never_written_past_the_limit() {
        let t = tempfile::tempdir().unwrap();
        let upper = t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        for i in 0..10 {
            fs::write(upper.join(format!("f{i}")), vec![7u8; 20 << 10]).unwrap();
        }
        let limit = 100 << 10;
        let mut out = Count::default();
        let e = pack_into(&upper, &mut out, limit).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
        assert!(
            out.0 <= limit,
            "{} bytes written past the limit of {limit}",
            out.0
        );
        // Under the limit the same tree packs, with the digest of the bytes written.
        let mut bytes = Vec::new();
        let packed = pack_into(&upper, &mut bytes, 1 << 20).unwrap();
        assert_eq!(packed.size, bytes.len() as u64);
        assert_eq!(packed.digest, digest(&bytes));
        // And a spooled archive unpacks from its file.
        let (file, p) = pack_to_temp(&upper, &t.path().join("spool"), 1 << 20).unwrap();
        assert_eq!(p, packed);
        unpack(io::BufReader::new(file), &t.path().join("restored")).unwrap();
        assert_eq!(
            fs::read(t.path().join("restored/f3")).unwrap(),
            vec![7u8; 20 << 10]
        );
        assert_eq!(
            fs::read_dir(t.path().join("spool")).unwrap().count(),
            0,
            "a spool file was left"
        );
    }
}

/// HTTP side: `POST /internal/v1/snapshot` and `POST /internal/v1/layers`.
pub mod http;
