//! One layer into the store: its blob streamed once — hashed, spooled to a temp file
//! and decompressed into the unpacker at the same time, within its budget of unpacked
//! bytes — then checked (blob digest and size, `diff_id`) before the blob and the
//! unpacked directory are renamed into place. An unpacked layer is named by its chain
//! ID (what it unpacks to depends on the layers below it: a path through one of their
//! symbolic links lands where the link leads), and unpacked once: an exclusive `flock`
//! per chain ID serialises concurrent requests, and whoever comes second finds it done.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};

use serde::{Deserialize, Serialize};

use crate::decode::{self, Bounded, Compression};
use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use crate::limits::LayerBudget;
use crate::manifest::LayerRecord;
use crate::paths::{Paths, lock_file, sync_dir, write_json_atomic};
use crate::unpack::{UnpackOptions, unpack_on};

/// What is known of a layer beside its directory (`layers/<chain id>.json`): the blobs
/// verified to decompress to it and what it holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LayerInfo {
    pub diff_id: Digest,
    /// Blobs (compressed forms) checked to decompress to this layer.
    pub blobs: Vec<Digest>,
    /// Bytes of file data unpacked.
    pub bytes: u64,
    /// Tar entries applied.
    pub entries: u64,
    /// Bytes of its tar stream (what counts against the bounds of unpacked bytes);
    /// records from before the bounds lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tar_bytes: Option<u64>,
}

impl LayerInfo {
    /// What the layer unpacked from, as the bounds count it.
    pub(crate) fn unpacked(&self) -> u64 {
        self.tar_bytes.unwrap_or(self.bytes)
    }
}

/// The layer a caller wants, as the image (or a manifest from elsewhere) states it.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    /// Names the layer in errors.
    pub label: String,
    pub digest: Option<Digest>,
    pub size: Option<u64>,
    pub media_type: Option<String>,
    pub diff_id: Digest,
    /// Its chain ID (the name of its unpacked directory).
    pub chain: Digest,
    /// The chain IDs of the layers below it, top first (unpacked already).
    pub lowers: Vec<Digest>,
    /// What it may unpack to.
    pub budget: LayerBudget,
    /// Read and hash the blob even when the store has it (an archive must show it
    /// holds the blob it names; a peer's blob is only fetched when missing).
    pub verify_known: bool,
}

/// Reads `layers/<chain hex>.json` if the layer is complete (its directory and its
/// record are both there). Read-only: a directory without its record may be a commit
/// in progress; [`ensure`] removes it under the layer's lock.
pub(crate) fn info(paths: &Paths, chain: &Digest) -> Result<Option<LayerInfo>> {
    let dir = paths.layer_dir(chain);
    let record = paths.layer_record(chain);
    match std::fs::read(&record) {
        Ok(bytes) if dir.is_dir() => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ImageError::Format(format!("{}: {e}", record.display()))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::io("read layer record", record, e)),
    }
}

/// Makes sure the layer `want` is unpacked in the store, reading its blob from
/// `open` only if needed; also gives what it unpacked from (its tar stream's bytes).
pub(crate) fn ensure<'r>(
    paths: &Paths,
    want: &Wanted,
    options: &UnpackOptions,
    open: &mut dyn FnMut() -> Result<Box<dyn Read + 'r>>,
) -> Result<(LayerRecord, u64)> {
    let _lock = lock_file(&paths.layer_lock(&want.chain), true)?;
    let known = info(paths, &want.chain)?;
    let dir = paths.layer_dir(&want.chain);
    if known.is_none() && dir.exists() {
        // A crash between the rename of the layer and the write of its record.
        std::fs::remove_dir_all(&dir)
            .map_err(|e| ImageError::io("remove incomplete layer", &dir, e))?;
    }
    if let Some(info) = &known {
        if info.diff_id != want.diff_id {
            return Err(ImageError::Format(format!(
                "layer {}: the store's layer {} holds diff_id {}",
                want.label, want.chain, info.diff_id
            )));
        }
        // The same image counts the same wherever its layers were unpacked first.
        if info.unpacked() > want.budget.bytes {
            return Err(want.budget.exceeded(&want.label));
        }
        let done = |d| record(paths, want, d, None).map(|r| (r, info.unpacked()));
        if let Some(d) = want
            .digest
            .filter(|&d| !want.verify_known && has_blob(paths, info, d))
        {
            return done(d);
        }
        if want.verify_known || want.digest.is_none() {
            let (d, size, _) = HashingReader::new(open()?)
                .finish()
                .map_err(|e| read_error(want, e))?;
            check_blob(want, d, size)?;
            if has_blob(paths, info, d) {
                return done(d);
            }
        }
    }
    stream(paths, want, options, known, open()?)
}

fn has_blob(paths: &Paths, info: &LayerInfo, d: Digest) -> bool {
    info.blobs.contains(&d) && paths.blob(&d).is_file()
}

fn read_error(want: &Wanted, e: io::Error) -> ImageError {
    ImageError::Layer {
        layer: want.label.clone(),
        why: format!("read: {e}"),
    }
}

fn check_blob(want: &Wanted, actual: Digest, size: u64) -> Result<()> {
    if let Some(expected) = want.digest.filter(|&d| d != actual) {
        return Err(ImageError::DigestMismatch {
            what: format!("layer blob {}", want.label),
            expected: expected.to_string(),
            actual: actual.to_string(),
        });
    }
    if let Some(expected) = want.size.filter(|&s| s != size) {
        return Err(ImageError::Format(format!(
            "layer blob {}: {size} bytes, its descriptor says {expected}",
            want.label
        )));
    }
    Ok(())
}

fn media_type(want: &Wanted, c: Compression) -> String {
    want.media_type.clone().unwrap_or_else(|| {
        match c {
            Compression::None => "application/vnd.oci.image.layer.v1.tar",
            Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
        .to_owned()
    })
}

fn record(
    paths: &Paths,
    want: &Wanted,
    digest: Digest,
    c: Option<Compression>,
) -> Result<LayerRecord> {
    let blob = paths.blob(&digest);
    let size = std::fs::metadata(&blob)
        .map_err(|e| ImageError::io("stat blob", &blob, e))?
        .len();
    let c = match c {
        Some(c) => c,
        None => {
            let mut f = BufReader::new(
                File::open(&blob).map_err(|e| ImageError::io("open blob", &blob, e))?,
            );
            decode::detect(&mut f).map_err(|e| ImageError::io("read blob", &blob, e))?
        }
    };
    Ok(LayerRecord {
        digest,
        diff_id: want.diff_id,
        size,
        media_type: media_type(want, c),
    })
}

/// Copies what is read into `out` as well (a blob's spool as it streams).
pub(crate) struct Tee<'a, R> {
    pub(crate) inner: R,
    pub(crate) out: Option<&'a mut File>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(out) = self.out.as_mut() {
            out.write_all(&buf[..n])?;
        }
        Ok(n)
    }
}

/// Streams the blob: spooled (unless the store has it), decompressed (within the
/// layer's budget), hashed and unpacked (unless the layer is there) over the layers
/// below in one pass, then checked and committed.
fn stream(
    paths: &Paths,
    want: &Wanted,
    options: &UnpackOptions,
    known: Option<LayerInfo>,
    blob: Box<dyn Read + '_>,
) -> Result<(LayerRecord, u64)> {
    let tmp = paths.tmp();
    let have_blob = want.digest.is_some_and(|d| paths.blob(&d).is_file());
    let mut spool = if have_blob {
        None
    } else {
        Some(
            tempfile::NamedTempFile::new_in(&tmp)
                .map_err(|e| ImageError::io("spool blob", &tmp, e))?,
        )
    };
    let staging = if known.is_none() {
        Some(
            tempfile::Builder::new()
                .prefix("layer-")
                .tempdir_in(&tmp)
                .map_err(|e| ImageError::io("create staging directory", &tmp, e))?,
        )
    } else {
        None
    };
    let lowers: Vec<_> = want.lowers.iter().map(|c| paths.layer_dir(c)).collect();
    let over = Cell::new(false);
    // Past the budget, whatever error the tar reader or the unpacker made of it.
    let bound = |e: ImageError| {
        if over.get() {
            want.budget.exceeded(&want.label)
        } else {
            e
        }
    };
    let mut blob = HashingReader::new(blob);
    let (compression, diff_id, tar_bytes, stats) = {
        let tee = Tee {
            inner: &mut blob,
            out: spool.as_mut().map(|f| f.as_file_mut()),
        };
        let mut buffered = decode::buffered(tee);
        let compression = decode::detect(&mut buffered).map_err(|e| read_error(want, e))?;
        let decoder = decode::decompress(buffered).map_err(|e| read_error(want, e))?;
        let mut tar = HashingReader::new(Bounded::new(decoder, want.budget.bytes, &over));
        let stats = match &staging {
            Some(dir) => Some(
                unpack_on(&want.label, &mut tar, dir.path(), &lowers, options).map_err(bound)?,
            ),
            None => None,
        };
        let (diff_id, tar_bytes, _) = tar.finish().map_err(|e| bound(read_error(want, e)))?;
        (compression, diff_id, tar_bytes, stats)
    };
    let (digest, size, _) = blob.finish().map_err(|e| read_error(want, e))?;
    check_blob(want, digest, size)?;
    if diff_id != want.diff_id {
        return Err(ImageError::DigestMismatch {
            what: format!("layer {} (diff_id of its tar stream)", want.label),
            expected: want.diff_id.to_string(),
            actual: diff_id.to_string(),
        });
    }
    if let Some(spool) = spool {
        let target = paths.blob(&digest);
        spool
            .as_file()
            .sync_all()
            .map_err(|e| ImageError::io("sync blob", &target, e))?;
        spool
            .persist(&target)
            .map_err(|e| ImageError::io("store blob", &target, e.error))?;
        sync_dir(&paths.blobs())?;
    }
    let info = match (staging, stats, known) {
        (Some(dir), Some(stats), _) => {
            let target = paths.layer_dir(&want.chain);
            let fd =
                File::open(dir.path()).map_err(|e| ImageError::io("open layer", dir.path(), e))?;
            // The unpacked files reach the disk before the layer is named.
            rustix::fs::syncfs(&fd)
                .map_err(|e| ImageError::io("sync layer", dir.path(), e.into()))?;
            std::fs::rename(dir.path(), &target)
                .map_err(|e| ImageError::io("store layer", &target, e))?;
            LayerInfo {
                diff_id: want.diff_id,
                blobs: vec![digest],
                bytes: stats.bytes,
                entries: stats.entries,
                tar_bytes: Some(tar_bytes),
            }
        }
        (_, _, Some(mut info)) => {
            if !info.blobs.contains(&digest) {
                info.blobs.push(digest);
            }
            info.tar_bytes.get_or_insert(tar_bytes);
            info
        }
        _ => {
            return Err(ImageError::Format(
                "layer neither unpacked nor known".into(),
            ));
        }
    };
    write_json_atomic(paths, &paths.layer_record(&want.chain), &info)?;
    record(paths, want, digest, Some(compression)).map(|r| (r, tar_bytes))
}
