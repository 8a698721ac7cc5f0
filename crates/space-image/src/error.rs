//! The one error type of the crate: what went wrong, with the entry, path or digest it
//! concerns. The worker maps it to its own errors (and HTTP statuses) at its edge.

use std::io;
use std::path::PathBuf;

/// An import, install, lookup or removal that failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A system call on a file of the store or of the archive failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A layer entry that the unpacker refuses (the whole import is refused).
    #[error("layer {layer}: entry {entry:?} refused: {why}")]
    Refused {
        /// The layer's diff_id (or its position while unknown).
        layer: String,
        /// The entry's path as the tar names it.
        entry: String,
        /// Why.
        why: String,
    },
    /// A layer stream that is not a well-formed tar (or compressed tar).
    #[error("layer {layer}: {why}")]
    Layer {
        /// The layer's diff_id (or its position while unknown).
        layer: String,
        /// What is wrong.
        why: String,
    },
    /// The archive or a JSON document in it is malformed or unsupported.
    #[error("image: {0}")]
    Format(String),
    /// Content whose sha256 is not the one it is named by.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Which content (a blob, a layer's diff_id, a manifest).
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// A bound was passed.
    #[error("{what} exceeds the limit of {limit}")]
    Limit {
        /// What was too large.
        what: String,
        /// The bound.
        limit: u64,
    },
    /// An image, or one of its layers, unpacks to more than its bound (a
    /// decompression bomb, or an image larger than this host takes): nothing past the
    /// bound was written.
    #[error(
        "{what} unpacks to more than {limit} bytes, the limit of {scope}; raise it with \
         {setting} (on the control plane and on every worker)"
    )]
    Unpacked {
        /// The layer (or the image).
        what: String,
        /// The bound, in bytes.
        limit: u64,
        /// Which bound: `one layer` or `one image`.
        scope: &'static str,
        /// The setting that raises it.
        setting: &'static str,
    },
    /// A template name, tag or reference that is not valid.
    #[error("invalid template reference {reference:?}: {why}")]
    InvalidName {
        /// The reference as given.
        reference: String,
        /// Why.
        why: &'static str,
    },
    /// No template of that name, tag or digest.
    #[error("unknown template {0}")]
    NotFound(String),
    /// A template of that name and tag exists, with another digest (templates are
    /// immutable).
    #[error("template {0} exists")]
    Exists(String),
    /// The template is used by a sandbox (or a snapshot) and cannot be removed.
    #[error("template {0} is in use")]
    InUse(String),
}

impl ImageError {
    /// An [`ImageError::Io`].
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            source,
        }
    }

    /// An [`ImageError::Limit`].
    pub(crate) fn limit(what: impl Into<String>, limit: u64) -> Self {
        Self::Limit {
            what: what.into(),
            limit,
        }
    }
}

/// A `Result` with [`ImageError`].
pub type Result<T, E = ImageError> = std::result::Result<T, E>;
