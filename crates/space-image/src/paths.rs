//! Where a template store keeps what (`blobs/`, `layers/`, `templates/`, `locks/`,
//! `tmp/`), its locks, and its atomic, synced writes.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::manifest::TemplateRef;
use crate::oci;

/// The store's paths.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub(crate) root: PathBuf,
}

impl Paths {
    pub(crate) fn blobs(&self) -> PathBuf {
        self.root.join("blobs/sha256")
    }
    pub(crate) fn blob(&self, d: &Digest) -> PathBuf {
        self.blobs().join(d.hex())
    }
    pub(crate) fn layers(&self) -> PathBuf {
        self.root.join("layers")
    }
    pub(crate) fn layer_dir(&self, d: &Digest) -> PathBuf {
        self.layers().join(d.hex())
    }
    pub(crate) fn layer_record(&self, d: &Digest) -> PathBuf {
        self.layers().join(format!("{}.json", d.hex()))
    }
    pub(crate) fn layer_lock(&self, d: &Digest) -> PathBuf {
        self.root.join("locks").join(d.hex())
    }
    pub(crate) fn manifests(&self) -> PathBuf {
        self.root.join("templates/manifests")
    }
    pub(crate) fn manifest(&self, d: &Digest) -> PathBuf {
        self.manifests().join(format!("{}.json", d.hex()))
    }
    pub(crate) fn names(&self) -> PathBuf {
        self.root.join("templates/names")
    }
    pub(crate) fn name(&self, r: &TemplateRef) -> PathBuf {
        self.names().join(r.to_string())
    }
    pub(crate) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
}

/// Opens (creating) `path` and flocks it, exclusive or shared; the lock lasts as long
/// as the file.
pub(crate) fn lock_file(path: &Path, exclusive: bool) -> Result<File> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| ImageError::io("open lock", path, e))?;
    let op = if exclusive {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::LockShared
    };
    rustix::fs::flock(&f, op).map_err(|e| ImageError::io("lock", path, e.into()))?;
    Ok(f)
}

/// [`lock_file`] exclusively without waiting: `None` while another holds it.
pub(crate) fn try_lock_file(path: &Path) -> Result<Option<File>> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| ImageError::io("open lock", path, e))?;
    match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(ImageError::io("lock", path, e.into())),
    }
}

/// Writes `value` as JSON to `target` through a synced temp file.
pub(crate) fn write_json_atomic(
    paths: &Paths,
    target: &Path,
    value: &impl Serialize,
) -> Result<()> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    write_atomic(paths, target, &bytes)
}

pub(crate) fn write_atomic(paths: &Paths, target: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = paths.tmp();
    let mut f =
        tempfile::NamedTempFile::new_in(&tmp).map_err(|e| ImageError::io("write", &tmp, e))?;
    io::Write::write_all(&mut f, bytes).map_err(|e| ImageError::io("write", target, e))?;
    f.as_file()
        .sync_all()
        .map_err(|e| ImageError::io("sync", target, e))?;
    f.persist(target)
        .map_err(|e| ImageError::io("rename", target, e.error))?;
    if let Some(dir) = target.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let f = File::open(path).map_err(|e| ImageError::io("open", path, e))?;
    let bytes = oci::read_bounded(f, &path.display().to_string())?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ImageError::Format(format!("{}: {e}", path.display())))
}

/// fsyncs the directory `dir` (a rename in it reaches the disk).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ImageError::io("sync directory", dir, e))
}
