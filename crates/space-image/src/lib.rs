//! SPACE's template store: OCI images imported without a registry and kept as
//! overlayfs lower layers, stored once by content.
//!
//! - [`oci`] reads an image from an OCI image layout (a directory or a tar of one) or
//!   a `docker save` / `podman save` archive: the index is followed to the manifest,
//!   every blob's sha256 is checked as it streams, every layer's `diff_id` against its
//!   decompressed stream, and the image config's defaults are kept.
//! - [`unpack`] writes one layer's tar stream into a new directory without ever
//!   following a link, refusing device nodes, escaping paths and foreign ids, and
//!   translating whiteouts into overlayfs's own.
//! - [`store`] keeps blobs, unpacked layers and named, immutable templates under one
//!   root directory; a template resolves to the lower dirs of a sandbox's overlay.
//!
//! Everything here is blocking I/O (call it from a blocking thread).

pub mod bench;
pub mod blobs;
pub mod decode;
pub mod digest;
pub mod error;
pub mod limits;
pub mod manifest;
pub mod oci;
mod paths;
pub mod rootfs;
pub mod sample;
pub mod store;
pub mod unpack;

mod at;
mod entry;
mod layer;
mod view;

pub use digest::Digest;
pub use error::{ImageError, Result};
pub use limits::ImageLimits;
pub use manifest::{ImageDefaults, LayerRecord, TemplateManifest, TemplateRef};
pub use store::{Removed, Resolved, Store, Swept, Template, TemplateInfo, Trash};
pub use unpack::{UnpackOptions, UnpackStats, unpack, unpack_on};
