//! The OCI image layout a pull writes (`oci-layout`, `blobs/sha256/<hex>`, and
//! `index.json` last, naming the one manifest pulled): what `space_image`'s importer
//! reads. A blob streams to `<hex>.partial` while its sha256 and byte count are
//! checked, and becomes `<hex>` only when both are right; a partial file is removed
//! whatever stops it. Blob file names come from parsed digests only (64 lowercase
//! hex digits), never from a registry's text.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use space_image::Digest;
use tokio::io::AsyncWriteExt as _;

use crate::error::{RegistryError, Result};
use crate::http::Answer;

/// The layout being written.
#[derive(Debug)]
pub(crate) struct Layout {
    root: PathBuf,
    blobs: PathBuf,
}

/// Removes a partial blob unless it was completed.
struct Partial {
    path: PathBuf,
    done: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The descriptor of the manifest the layout's index names.
#[derive(Debug, Clone)]
pub(crate) struct ManifestEntry<'a> {
    pub(crate) media_type: &'a str,
    pub(crate) digest: Digest,
    pub(crate) size: u64,
    /// `org.opencontainers.image.ref.name` (the tag pulled).
    pub(crate) ref_name: Option<&'a str>,
}

impl Layout {
    /// A layout in the directory `root` (made if missing).
    pub(crate) fn create(root: &Path) -> Result<Self> {
        let blobs = root.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| RegistryError::io(&blobs, e))?;
        Ok(Self {
            root: root.to_owned(),
            blobs,
        })
    }

    /// Where the blob `digest` is.
    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    /// Whether the blob `digest` is complete here.
    pub(crate) fn has(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Streams `answer`'s body into the blob `digest`: refused if it has more or fewer
    /// bytes than `size` (a longer one as soon as the extra byte comes) or another
    /// digest; `received` is told the byte count as it grows.
    pub(crate) async fn receive(
        &self,
        mut answer: Answer,
        digest: &Digest,
        size: u64,
        what: &str,
        received: &mut (dyn FnMut(u64) + Send),
    ) -> Result<()> {
        let wrong = |why| RegistryError::Size {
            what: what.to_owned(),
            why,
            size,
        };
        match answer.content_length() {
            Some(n) if n > size => return Err(wrong("more bytes")),
            Some(n) if n < size => return Err(wrong("fewer bytes")),
            _ => {}
        }
        let path = self.blob_path(digest);
        let partial_path = self.blobs.join(format!("{}.partial", digest.hex()));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial_path)
            .await
            .map_err(|e| RegistryError::io(&partial_path, e))?;
        let mut partial = Partial {
            path: partial_path.clone(),
            done: false,
        };
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let mut hasher = Sha256::new();
        let mut got: u64 = 0;
        while let Some(chunk) = answer.chunk().await? {
            got += chunk.len() as u64;
            if got > size {
                return Err(wrong("more bytes"));
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|e| RegistryError::io(&partial_path, e))?;
            received(got);
        }
        if got < size {
            return Err(wrong("fewer bytes"));
        }
        let actual = Digest(hasher.finalize().into());
        if actual != *digest {
            return Err(RegistryError::Digest {
                what: what.to_owned(),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        out.flush()
            .await
            .map_err(|e| RegistryError::io(&partial_path, e))?;
        drop(out);
        tokio::fs::rename(&partial_path, &path)
            .await
            .map_err(|e| RegistryError::io(&path, e))?;
        partial.done = true;
        Ok(())
    }

    /// Writes `bytes`, whose digest is `digest` (checked by the caller), as a blob.
    pub(crate) fn write_blob(&self, digest: &Digest, bytes: &[u8]) -> Result<()> {
        let path = self.blob_path(digest);
        std::fs::write(&path, bytes).map_err(|e| RegistryError::io(&path, e))
    }

    /// Writes `oci-layout` and then `index.json` naming `manifest`: the layout is
    /// complete.
    pub(crate) fn finish(&self, manifest: &ManifestEntry<'_>) -> Result<()> {
        let write = |name: &str, value: serde_json::Value| {
            let path = self.root.join(name);
            std::fs::write(&path, value.to_string()).map_err(|e| RegistryError::io(&path, e))
        };
        write(
            "oci-layout",
            serde_json::json!({"imageLayoutVersion": "1.0.0"}),
        )?;
        let mut entry = serde_json::json!({
            "mediaType": manifest.media_type,
            "digest": manifest.digest.to_string(),
            "size": manifest.size,
        });
        if let Some(tag) = manifest.ref_name {
            entry["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        }
        write(
            "index.json",
            serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [entry],
            }),
        )
    }
}
