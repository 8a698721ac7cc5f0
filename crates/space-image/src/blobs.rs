//! Templates as blobs only, for a control plane that publishes templates to workers
//! without unpacking them (it may run unprivileged, and the worker unpacks the same
//! layers once anyway):
//!
//! - [`import_blobs`] reads an image archive (as [`crate::store::Store::import_archive`]
//!   does), copies each layer blob into `blob_root/sha256/<hex>` — verified by its
//!   sha256, its size and its `diff_id` (decompressed while hashing) — and builds the
//!   same [`TemplateManifest`], so the same digest;
//! - [`write_bundle`] writes what a worker's store takes in one request (the body of
//!   `Update::Template`): a tar whose first member is `manifest.json` (the manifest's
//!   canonical JSON), then `blobs/sha256/<hex>` for every layer in the manifest's
//!   order; [`bundle_size`] is its exact length, known before a byte is written.
//!
//! Blocking I/O (call it from a blocking thread).

use std::cell::Cell;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::decode::{self, Bounded, Compression};
use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use crate::layer::Tee;
use crate::limits::{ImageLimits, LayerBudget};
use crate::manifest::{LayerRecord, SCHEMA, TemplateManifest};
use crate::oci::{self, Archive, PlannedLayer};

/// The bundle's first member.
pub const BUNDLE_MANIFEST: &str = "manifest.json";

/// A tar block.
const BLOCK: u64 = 512;

/// Where blob `digest` is kept under `blob_root`.
pub fn blob_path(blob_root: &Path, digest: &Digest) -> PathBuf {
    blob_root.join("sha256").join(digest.hex())
}

fn io_err(what: &'static str, path: &Path, e: io::Error) -> ImageError {
    ImageError::Io {
        what,
        path: path.to_owned(),
        source: e,
    }
}

/// Imports the blobs of the image at `archive` (an OCI layout directory or tar, or a
/// `docker save` / `podman save` archive) into `blob_root`, verifying every layer,
/// and returns the template's manifest. A blob already kept is not written again
/// (the archive's copy is verified all the same). The default [`ImageLimits`] bound
/// what the layers decompress to.
pub fn import_blobs(archive: &Path, blob_root: &Path) -> Result<TemplateManifest> {
    import_blobs_bounded(archive, blob_root, &ImageLimits::default())
}

/// [`import_blobs`] with `limits` on what each layer, and the image, decompress to
/// while they are hashed: a decompression bomb stops at the bound (an
/// [`ImageError::Unpacked`] naming it), having cost no more than the bound's reading.
pub fn import_blobs_bounded(
    archive: &Path,
    blob_root: &Path,
    limits: &ImageLimits,
) -> Result<TemplateManifest> {
    let source = Archive::open(archive)?;
    let plan = oci::read_image(&source)?;
    let blobs = blob_root.join("sha256");
    let tmp = blob_root.join("tmp");
    let mut b = fs::DirBuilder::new();
    b.recursive(true).mode(0o700);
    for dir in [&blobs, &tmp] {
        b.create(dir)
            .map_err(|e| io_err("create blob directory", dir, e))?;
    }
    let n = plan.layers.len();
    let mut layers = Vec::with_capacity(n);
    let mut unpacked = 0u64;
    for (i, l) in plan.layers.iter().enumerate() {
        let label = format!("{} ({} of {n})", l.diff_id, i + 1);
        let member = source.open_member(&l.member)?;
        let budget = limits.next_layer(unpacked);
        let (record, tar_bytes) = copy_layer(l, &label, member, blob_root, &tmp, budget)?;
        unpacked += tar_bytes;
        layers.push(record);
    }
    let manifest = TemplateManifest {
        schema: SCHEMA,
        architecture: plan.architecture,
        os: plan.os,
        created: plan.created,
        config: plan.defaults,
        layers,
    };
    manifest.validate()?;
    Ok(manifest)
}

/// One layer's blob: streamed once — spooled (unless kept already), hashed, and
/// decompressed into a hash of its tar stream (within `budget`) — then checked and
/// renamed into place. Also gives the tar stream's length.
fn copy_layer(
    l: &PlannedLayer,
    label: &str,
    member: Box<dyn Read + Send + '_>,
    blob_root: &Path,
    tmp: &Path,
    budget: LayerBudget,
) -> Result<(LayerRecord, u64)> {
    let over = Cell::new(false);
    let read_error = |e: io::Error| {
        if over.get() {
            return budget.exceeded(label);
        }
        ImageError::Layer {
            layer: label.to_owned(),
            why: format!("read: {e}"),
        }
    };
    let kept = l.digest.is_some_and(|d| blob_path(blob_root, &d).is_file());
    let mut spool = if kept {
        None
    } else {
        Some(tempfile::NamedTempFile::new_in(tmp).map_err(|e| io_err("spool blob", tmp, e))?)
    };
    let mut blob = HashingReader::new(Tee {
        inner: member,
        out: spool.as_mut().map(|f| f.as_file_mut()),
    });
    let (compression, diff_id, tar_bytes) = {
        let mut buffered = decode::buffered(&mut blob);
        let compression = decode::detect(&mut buffered).map_err(read_error)?;
        let decoder = decode::decompress(buffered).map_err(read_error)?;
        let bounded = Bounded::new(decoder, budget.bytes, &over);
        let (diff_id, tar_bytes, _) = HashingReader::new(bounded).finish().map_err(read_error)?;
        (compression, diff_id, tar_bytes)
    };
    // What the decompressor left unread is part of the blob too.
    let (digest, size, _) = blob.finish().map_err(read_error)?;
    if let Some(expected) = l.digest.filter(|&d| d != digest) {
        return Err(ImageError::DigestMismatch {
            what: format!("layer blob {label}"),
            expected: expected.to_string(),
            actual: digest.to_string(),
        });
    }
    if let Some(expected) = l.size.filter(|&s| s != size) {
        return Err(ImageError::Format(format!(
            "layer blob {label}: {size} bytes, its descriptor says {expected}"
        )));
    }
    if diff_id != l.diff_id {
        return Err(ImageError::DigestMismatch {
            what: format!("layer {label} (diff_id of its tar stream)"),
            expected: l.diff_id.to_string(),
            actual: diff_id.to_string(),
        });
    }
    let target = blob_path(blob_root, &digest);
    if let Some(spool) = spool.filter(|_| !target.is_file()) {
        spool
            .as_file()
            .sync_all()
            .map_err(|e| io_err("sync blob", &target, e))?;
        spool
            .persist(&target)
            .map_err(|e| io_err("store blob", &target, e.error))?;
        let dir = blob_root.join("sha256");
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("sync directory", &dir, e))?;
    }
    let record = LayerRecord {
        digest,
        diff_id: l.diff_id,
        size,
        media_type: l.media_type.clone().unwrap_or_else(|| {
            match compression {
                Compression::None => "application/vnd.oci.image.layer.v1.tar",
                Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
                Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
            }
            .to_owned()
        }),
    };
    Ok((record, tar_bytes))
}

/// A member's length in the archive: its header and its data padded to a block.
fn member_len(size: u64) -> u64 {
    BLOCK + size.div_ceil(BLOCK) * BLOCK
}

/// The exact length of the bundle [`write_bundle`] writes for `manifest`.
pub fn bundle_size(manifest: &TemplateManifest) -> u64 {
    let json = manifest.canonical_json().len() as u64;
    // The archive ends with two zero blocks.
    member_len(json)
        + manifest
            .layers
            .iter()
            .map(|l| member_len(l.size))
            .sum::<u64>()
        + 2 * BLOCK
}

fn header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(0o600);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// Writes the bundle of `manifest` (its blobs read from `blob_root`) into `out`;
/// returns its length ([`bundle_size`]). A blob missing or of another size than the
/// manifest says fails the write.
pub fn write_bundle(manifest: &TemplateManifest, blob_root: &Path, out: impl Write) -> Result<u64> {
    let mut counted = Counted { inner: out, n: 0 };
    {
        let mut b = tar::Builder::new(&mut counted);
        b.mode(tar::HeaderMode::Deterministic);
        let json = manifest.canonical_json();
        let mut h = header(json.len() as u64);
        b.append_data(&mut h, BUNDLE_MANIFEST, &json[..])
            .map_err(|e| ImageError::Format(format!("write the bundle: {e}")))?;
        for l in &manifest.layers {
            let path = blob_path(blob_root, &l.digest);
            let f = File::open(&path).map_err(|e| io_err("open blob", &path, e))?;
            let len = f
                .metadata()
                .map_err(|e| io_err("stat blob", &path, e))?
                .len();
            if len != l.size {
                return Err(ImageError::Format(format!(
                    "blob {}: {len} bytes kept, the manifest says {}",
                    l.digest, l.size
                )));
            }
            let mut h = header(l.size);
            let name = format!("blobs/sha256/{}", l.digest.hex());
            b.append_data(&mut h, &name, f.take(l.size))
                .map_err(|e| io_err("write blob into the bundle", &path, e))?;
        }
        b.finish()
            .map_err(|e| ImageError::Format(format!("write the bundle: {e}")))?;
    }
    counted
        .flush()
        .map_err(|e| ImageError::Format(format!("write the bundle: {e}")))?;
    Ok(counted.n)
}

/// Counts what is written through it.
struct Counted<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Removes every blob under `blob_root` that none of `keep` names; how many went.
pub fn remove_unreferenced(blob_root: &Path, keep: &[Digest]) -> Result<usize> {
    let dir = blob_root.join("sha256");
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("read", &dir, e)),
    };
    let mut removed = 0;
    for e in entries {
        let e = e.map_err(|e| io_err("read", &dir, e))?;
        let Some(d) = e.file_name().to_str().and_then(Digest::from_hex) else {
            continue;
        };
        if !keep.contains(&d) {
            let p = e.path();
            fs::remove_file(&p).map_err(|e| io_err("remove blob", &p, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_takes_its_header_and_its_data_padded_to_a_block() {
        assert_eq!(member_len(0), 512);
        assert_eq!(member_len(1), 1024);
        assert_eq!(member_len(512), 1024);
        assert_eq!(member_len(513), 1536);
    }
}
