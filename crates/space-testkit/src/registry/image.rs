//! Images the test registry serves, built in memory: tar layers (gzip-compressed),
//! an image config and a manifest, OCI or Docker schema 2 media types.

use std::io::Write as _;

use sha2::{Digest as _, Sha256};

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// A layer's tar, entry by entry (fixed owner and time: reproducible).
pub struct LayerBuilder(tar::Builder<Vec<u8>>);

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LayerBuilder")
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    /// A regular file.
    pub fn file(mut self, path: &str, body: &[u8], mode: u32) -> Self {
        let mut h = header(tar::EntryType::Regular, body.len() as u64, mode);
        self.0.append_data(&mut h, path, body).expect("tar file");
        self
    }

    /// A directory.
    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        let mut h = header(tar::EntryType::Directory, 0, mode);
        self.0
            .append_data(&mut h, path, std::io::empty())
            .expect("tar dir");
        self
    }

    /// A symbolic link.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Symlink, 0, 0o777);
        self.0.append_link(&mut h, path, target).expect("tar link");
        self
    }

    /// The tar's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("tar end")
    }
}

/// A blob and its digest.
#[derive(Debug, Clone)]
pub struct Blob {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>`.
    pub digest: String,
}

impl Blob {
    /// `bytes` as a blob.
    pub fn of(bytes: Vec<u8>) -> Self {
        let digest = sha256(&bytes);
        Self { bytes, digest }
    }
}

/// An image: config, gzip layers, manifest.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// The image config.
    pub config: Blob,
    /// The compressed layers, bottom first.
    pub layers: Vec<Blob>,
    /// The manifest.
    pub manifest: Blob,
    /// The manifest's media type.
    pub media_type: String,
    /// The config's architecture.
    pub architecture: String,
}

/// Which media types an image uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaTypes {
    /// OCI's.
    Oci,
    /// Docker schema 2's.
    Docker,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip end")
}

impl TestImage {
    /// An image of `layers` (tars, compressed here) for `linux/<architecture>`.
    pub fn build(architecture: &str, types: MediaTypes, layers: Vec<Vec<u8>>) -> Self {
        let (manifest_type, config_type, layer_type) = match types {
            MediaTypes::Oci => (
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.config.v1+json",
                "application/vnd.oci.image.layer.v1.tar+gzip",
            ),
            MediaTypes::Docker => (
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.docker.container.image.v1+json",
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
            ),
        };
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
        let layers: Vec<Blob> = layers.iter().map(|l| Blob::of(gzip(l))).collect();
        let config = serde_json::json!({
            "architecture": architecture,
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = Blob::of(config.to_string().into_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": config.digest, "size": config.bytes.len()},
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": layer_type, "digest": l.digest, "size": l.bytes.len(),
            })).collect::<Vec<_>>(),
        });
        Self {
            config,
            layers,
            manifest: Blob::of(manifest.to_string().into_bytes()),
            media_type: manifest_type.to_owned(),
            architecture: architecture.to_owned(),
        }
    }

    /// A small image for the host's architecture: one layer with `/hello.txt`
    /// (`hello from the registry`), `/etc/os-release` and an executable `/bin/tool`.
    pub fn small() -> Self {
        Self::small_for(
            space_image::oci::host_architecture(),
            "hello from the registry\n",
        )
    }

    /// [`Self::small`] for `architecture`, `/hello.txt` holding `hello`.
    pub fn small_for(architecture: &str, hello: &str) -> Self {
        let layer = LayerBuilder::new()
            .dir("etc", 0o755)
            .file("etc/os-release", b"ID=registrytest\n", 0o644)
            .file("hello.txt", hello.as_bytes(), 0o644)
            .dir("bin", 0o755)
            .file("bin/tool", b"#!/bin/sh\necho tool\n", 0o755)
            .finish();
        Self::build(architecture, MediaTypes::Oci, vec![layer])
    }

    /// The manifest with `edit` applied to its JSON (its digest recomputed).
    pub fn with_manifest(mut self, edit: impl FnOnce(&mut serde_json::Value)) -> Self {
        let mut m: serde_json::Value =
            serde_json::from_slice(&self.manifest.bytes).expect("manifest JSON");
        edit(&mut m);
        self.manifest = Blob::of(m.to_string().into_bytes());
        self
    }
}
