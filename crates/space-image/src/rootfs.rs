//! Images made here rather than imported:
//!
//! - [`layer_from_rootfs`] turns a root filesystem tarball (what `mmdebstrap … -`
//!   writes; plain, gzip or zstd) into one OCI layer: gzip-compressed, its blob digest
//!   and `diff_id` computed as it is written. Device nodes are left out (a sandbox's
//!   `/dev` is the jail's own, and the unpacker refuses them), and so are extended
//!   attributes (the unpacker does not apply them either);
//! - [`layer_from_overlay_upper`] turns the archive of an overlay *upper* directory
//!   (the worker's snapshot archive: whiteouts are empty files marked with a
//!   `SPACE.whiteout` PAX record — or 0/0 character devices in a plain tar of the
//!   directory —, opaque directories carry `trusted.overlay.opaque=y` as a
//!   `SCHILY.xattr` record) into an OCI layer with `.wh.NAME` and `.wh..wh..opq`
//!   entries: a sandbox's changes as a layer on top of its template's;
//! - [`write_layout`] writes an OCI image layout (a directory or a tar of one) of such
//!   layers with an image config, which [`crate::store::Store::import_archive`] and
//!   [`crate::blobs::import_blobs`] read like any other.
//!
//! The same input gives the same bytes (gzip without a name or time, tar headers
//! from the entries alone), so the same digests. Every tar extension header read is
//! bounded ([`MAX_PATH`], [`MAX_PAX`]), and so is the number of entries.
//!
//! Blocking I/O (call it from a blocking thread).

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use flate2::write::GzEncoder;
use sha2::{Digest as _, Sha256};
use tar::{EntryType, Header};

use crate::decode;
use crate::digest::Digest;
use crate::entry::pax_records;
use crate::error::{ImageError, Result};
use crate::limits::{MAX_ENTRIES_PER_LAYER, MAX_PATH, MAX_PAX};
use crate::manifest::LayerRecord;

/// The media type of every layer written here.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The PAX record the worker's snapshot archives mark an overlay whiteout with.
pub const SNAPSHOT_WHITEOUT_KEY: &[u8] = b"SPACE.whiteout";
const OVERLAY_XATTR: &[u8] = b"SCHILY.xattr.trusted.overlay.";
const WH: &[u8] = b".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// A layer blob written here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// The sha256 of the gzip blob.
    pub digest: Digest,
    /// The sha256 of its tar stream.
    pub diff_id: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// Entries written (whiteouts included).
    pub entries: u64,
    /// Entries of the input left out (device nodes of a root filesystem).
    pub skipped: u64,
}

impl LayerBlob {
    /// The layer as a template manifest lists it.
    pub fn record(&self) -> LayerRecord {
        LayerRecord {
            digest: self.digest,
            diff_id: self.diff_id,
            size: self.size,
            media_type: LAYER_MEDIA_TYPE.to_owned(),
        }
    }
}

// ---- reading tar entries, bounded, with their PAX records -----------------------

/// One tar member, its long names and PAX records applied.
struct RawEntry {
    path: Vec<u8>,
    link: Vec<u8>,
    kind: EntryType,
    uid: u64,
    gid: u64,
    mode: u32,
    mtime: u64,
    size: u64,
    device: (u32, u32),
    pax: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RawEntry {
    fn shown(&self) -> String {
        String::from_utf8_lossy(&self.path)
            .chars()
            .take(300)
            .collect()
    }

    fn pax(&self, key: &[u8]) -> Option<&[u8]> {
        self.pax
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
}

fn refused(what: &str, e: &RawEntry, why: impl Into<String>) -> ImageError {
    ImageError::Refused {
        layer: what.to_owned(),
        entry: e.shown(),
        why: why.into(),
    }
}

/// Calls `each` with every member of the tar stream `r` (`what` names it in errors).
fn for_each_entry<R: Read>(
    r: R,
    what: &str,
    mut each: impl FnMut(RawEntry, &mut dyn Read) -> Result<()>,
) -> Result<()> {
    let bad = |why: String| ImageError::Layer {
        layer: what.to_owned(),
        why,
    };
    let mut archive = tar::Archive::new(r);
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar stream: {e}")))?
        .raw(true);
    let (mut long_name, mut long_link, mut pax) = (None, None, None::<Vec<u8>>);
    let mut count = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("not a tar stream: {e}")))?;
        count += 1;
        if count > MAX_ENTRIES_PER_LAYER {
            return Err(ImageError::limit(
                format!("{what}: the number of tar entries"),
                MAX_ENTRIES_PER_LAYER,
            ));
        }
        let header = entry.header().clone();
        let size = header
            .entry_size()
            .map_err(|e| bad(format!("entry size: {e}")))?;
        let mut ext = |limit: u64, name: &str| -> Result<Vec<u8>> {
            if size > limit {
                return Err(ImageError::limit(format!("{what}: a {name}"), limit));
            }
            let mut v = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut v)
                .map_err(|e| bad(format!("{name}: {e}")))?;
            Ok(v)
        };
        let kind = header.entry_type();
        match kind {
            EntryType::GNULongName => {
                long_name = Some(trim_nul(ext(MAX_PATH as u64 + 1, "long name")?));
                continue;
            }
            EntryType::GNULongLink => {
                long_link = Some(trim_nul(ext(MAX_PATH as u64 + 1, "long link name")?));
                continue;
            }
            EntryType::XHeader => {
                pax = Some(ext(MAX_PAX, "PAX header")?);
                continue;
            }
            EntryType::XGlobalHeader => continue,
            _ => {}
        }
        let mut e = RawEntry {
            path: long_name
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned()),
            link: long_link
                .take()
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned()))
                .unwrap_or_default(),
            kind,
            uid: header.uid().map_err(|e| bad(format!("uid: {e}")))?,
            gid: header.gid().map_err(|e| bad(format!("gid: {e}")))?,
            mode: header.mode().map_err(|e| bad(format!("mode: {e}")))?,
            mtime: header.mtime().unwrap_or(0),
            size,
            device: (
                header.device_major().ok().flatten().unwrap_or(0),
                header.device_minor().ok().flatten().unwrap_or(0),
            ),
            pax: Vec::new(),
        };
        if let Some(records) = pax.take() {
            for (key, value) in
                pax_records(&records).map_err(|why| bad(format!("PAX header: {why}")))?
            {
                let number = || {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.split('.').next())
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| {
                            bad(format!(
                                "PAX {:?}: not a number",
                                String::from_utf8_lossy(key)
                            ))
                        })
                };
                match key {
                    b"path" => e.path = value.to_vec(),
                    b"linkpath" => e.link = value.to_vec(),
                    b"uid" => e.uid = number()?,
                    b"gid" => e.gid = number()?,
                    b"mtime" => e.mtime = number()?,
                    b"size" if number()? != size => {
                        return Err(refused(what, &e, "a PAX size differing from its header's"));
                    }
                    _ if key.starts_with(b"GNU.sparse") => {
                        return Err(refused(what, &e, "sparse files are refused"));
                    }
                    _ => e.pax.push((key.to_vec(), value.to_vec())),
                }
            }
        }
        if e.path.len() > MAX_PATH || e.link.len() > MAX_PATH {
            return Err(ImageError::limit(
                format!("{what}: a path or link target's length"),
                MAX_PATH as u64,
            ));
        }
        each(e, &mut entry)?;
    }
    if long_name.is_some() || long_link.is_some() || pax.is_some() {
        return Err(bad("an extension header describes no member".to_owned()));
    }
    Ok(())
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// `path` without empty, `.` and leading `/` components; `None` if it has a `..`.
fn relative(path: &[u8]) -> Option<Vec<u8>> {
    let mut out: Vec<&[u8]> = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            c => out.push(c),
        }
    }
    Some(out.join(&b'/'))
}

/// The last component of a relative path, and its parent (`""` at the root).
fn split_name(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

// ---- writing a layer ---------------------------------------------------------------

/// Hashes and counts what is written through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    fn finish(self) -> (Digest, u64, W) {
        (
            Digest(self.hasher.finalize().into()),
            self.count,
            self.inner,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

type Blob<W> = HashingWriter<GzEncoder<HashingWriter<W>>>;

/// A layer being written: tar, hashed (`diff_id`), gzip, hashed (digest).
struct LayerWriter<W: Write> {
    tar: tar::Builder<Blob<W>>,
    entries: u64,
}

fn write_error(e: io::Error) -> ImageError {
    ImageError::Format(format!("write the layer: {e}"))
}

impl<W: Write> LayerWriter<W> {
    fn new(out: W) -> Self {
        let gz = GzEncoder::new(HashingWriter::new(out), flate2::Compression::new(6));
        let mut tar = tar::Builder::new(HashingWriter::new(gz));
        tar.mode(tar::HeaderMode::Deterministic);
        Self { tar, entries: 0 }
    }

    fn header(kind: EntryType, e: &RawEntry, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(e.mode & 0o7777);
        h.set_uid(e.uid);
        h.set_gid(e.gid);
        h.set_mtime(e.mtime);
        h.set_size(size);
        h
    }

    /// An entry of `kind` at `path`: data for files, a target for links.
    fn put(
        &mut self,
        kind: EntryType,
        e: &RawEntry,
        path: &[u8],
        data: &mut dyn Read,
    ) -> Result<()> {
        let name = Path::new(OsStr::from_bytes(path));
        match kind {
            EntryType::Symlink | EntryType::Link => {
                let mut h = Self::header(kind, e, 0);
                let target = if kind == EntryType::Link {
                    relative(&e.link).unwrap_or_default()
                } else {
                    e.link.clone()
                };
                self.tar
                    .append_link(&mut h, name, Path::new(OsStr::from_bytes(&target)))
                    .map_err(write_error)?;
            }
            EntryType::Regular => {
                let mut h = Self::header(kind, e, e.size);
                self.tar
                    .append_data(&mut h, name, data.take(e.size))
                    .map_err(write_error)?;
            }
            _ => {
                let mut h = Self::header(kind, e, 0);
                self.tar
                    .append_data(&mut h, name, io::empty())
                    .map_err(write_error)?;
            }
        }
        self.entries += 1;
        Ok(())
    }

    /// An empty regular file (a whiteout or an opaque marker), owned by root.
    fn marker(&mut self, path: &[u8], mtime: u64) -> Result<()> {
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        h.set_size(0);
        self.tar
            .append_data(&mut h, Path::new(OsStr::from_bytes(path)), io::empty())
            .map_err(write_error)?;
        self.entries += 1;
        Ok(())
    }

    fn finish(self, skipped: u64) -> Result<(LayerBlob, W)> {
        let entries = self.entries;
        let tar = self.tar.into_inner().map_err(write_error)?;
        let (diff_id, _, gz) = tar.finish();
        let blob = gz.finish().map_err(write_error)?;
        let (digest, size, mut out) = blob.finish();
        out.flush().map_err(write_error)?;
        Ok((
            LayerBlob {
                digest,
                diff_id,
                size,
                entries,
                skipped,
            },
            out,
        ))
    }
}

/// Writes the OCI layer of the root filesystem tarball `rootfs` (plain, gzip or zstd)
/// into `out`. Device nodes are left out (counted in [`LayerBlob::skipped`]); a path
/// with a `..` component, a name beginning `.wh.` (OCI layers reserve those for
/// whiteouts) and entry types other than files, directories, links and FIFOs are
/// refused, naming the entry.
pub fn layer_from_rootfs(rootfs: impl Read, out: impl Write) -> Result<LayerBlob> {
    const WHAT: &str = "root filesystem";
    let stream = decode::decompress(decode::buffered(rootfs)).map_err(|e| ImageError::Layer {
        layer: WHAT.to_owned(),
        why: format!("read: {e}"),
    })?;
    let mut w = LayerWriter::new(out);
    let mut skipped = 0u64;
    for_each_entry(stream, WHAT, |e, data| {
        let Some(path) = relative(&e.path) else {
            return Err(refused(WHAT, &e, "its path has a `..` component"));
        };
        // The root itself: a layer's root is 0755 root:root as unpacked.
        if path.is_empty() {
            return Ok(());
        }
        if path.split(|&b| b == b'/').any(|c| c.starts_with(WH)) {
            return Err(refused(
                WHAT,
                &e,
                "a name beginning `.wh.` (an OCI whiteout)",
            ));
        }
        match e.kind {
            EntryType::Char | EntryType::Block => {
                skipped += 1;
                Ok(())
            }
            EntryType::Regular | EntryType::Continuous => {
                w.put(EntryType::Regular, &e, &path, data)
            }
            EntryType::Link if relative(&e.link).is_none_or(|t| t.is_empty()) => {
                Err(refused(WHAT, &e, "a hard link out of the tree"))
            }
            k @ (EntryType::Directory | EntryType::Symlink | EntryType::Link | EntryType::Fifo) => {
                w.put(k, &e, &path, data)
            }
            other => Err(refused(
                WHAT,
                &e,
                format!("unsupported tar entry type {:?}", other.as_byte() as char),
            )),
        }
    })?;
    Ok(w.finish(skipped)?.0)
}

/// Writes the OCI layer of `archive`, the tar of an overlay upper directory (the
/// worker's snapshot archive), into `out`: a whiteout becomes `.wh.NAME` beside
/// where `NAME` was, an opaque directory gets a `.wh..wh..opq` entry. Refused, naming
/// the entry: a path with `..`, a name beginning `.wh.` (it would read as a
/// whiteout), a device node other than a whiteout, and a directory renamed or a file
/// copied up metadata-only (`trusted.overlay.redirect`, `.metacopy`: an OCI layer
/// cannot say either).
pub fn layer_from_overlay_upper(archive: impl Read, out: impl Write) -> Result<LayerBlob> {
    const WHAT: &str = "writable layer";
    let mut w = LayerWriter::new(out);
    for_each_entry(archive, WHAT, |e, data| {
        let Some(path) = relative(&e.path) else {
            return Err(refused(WHAT, &e, "its path has a `..` component"));
        };
        if path.is_empty() {
            return Ok(());
        }
        if path.split(|&b| b == b'/').any(|c| c.starts_with(WH)) {
            return Err(refused(
                WHAT,
                &e,
                "a name beginning `.wh.` cannot be a file of an OCI layer (it marks a whiteout)",
            ));
        }
        let (parent, name) = split_name(&path);
        let whiteout = e.pax(SNAPSHOT_WHITEOUT_KEY).is_some()
            || (e.kind == EntryType::Char && e.device == (0, 0));
        if whiteout {
            if e.size != 0 {
                return Err(refused(WHAT, &e, "a whiteout holds no data"));
            }
            return w.marker(&join(parent, &[WH, name].concat()), e.mtime);
        }
        let mut opaque = false;
        for (key, value) in &e.pax {
            match key.strip_prefix(OVERLAY_XATTR) {
                Some(b"opaque") => opaque = value == b"y",
                Some(x @ (b"redirect" | b"metacopy")) => {
                    return Err(refused(
                        WHAT,
                        &e,
                        format!(
                            "trusted.overlay.{} (a renamed directory or a metadata-only copy) \
                             cannot be said in an OCI layer",
                            String::from_utf8_lossy(x)
                        ),
                    ));
                }
                _ => {}
            }
        }
        match e.kind {
            EntryType::Directory => {
                w.put(EntryType::Directory, &e, &path, data)?;
                if opaque {
                    w.marker(&join(&path, OPAQUE.as_bytes()), e.mtime)?;
                }
                Ok(())
            }
            EntryType::Regular | EntryType::Continuous => {
                w.put(EntryType::Regular, &e, &path, data)
            }
            EntryType::Link if relative(&e.link).is_none_or(|t| t.is_empty()) => {
                Err(refused(WHAT, &e, "a hard link out of the tree"))
            }
            k @ (EntryType::Symlink | EntryType::Link | EntryType::Fifo) => {
                w.put(k, &e, &path, data)
            }
            EntryType::Char | EntryType::Block => {
                Err(refused(WHAT, &e, "a device node other than a whiteout"))
            }
            other => Err(refused(
                WHAT,
                &e,
                format!("unsupported tar entry type {:?}", other.as_byte() as char),
            )),
        }
    })?;
    Ok(w.finish(0)?.0)
}

// ---- the image layout (`rootfs_layout.rs`) ------------------------------------------

#[path = "rootfs_layout.rs"]
mod layout;
pub use layout::{DEBIAN_PATH, ImageSpec, Layout, LayoutFormat, layout_from_rootfs, write_layout};

#[cfg(test)]
#[path = "rootfs_tests.rs"]
mod tests;
