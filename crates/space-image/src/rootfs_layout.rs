//! The image layout of layers written by [`super`]: an image config (the process
//! defaults of an [`ImageSpec`]), a manifest and an index, as a directory or a tar.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

use super::{LAYER_MEDIA_TYPE, LayerBlob, layer_from_rootfs};
use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::limits::MAX_LAYERS;
use crate::manifest::ImageDefaults;
use crate::oci::host_architecture;

const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// What an image made here says of itself besides its layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The architecture (OCI's names: `amd64`, `arm64`, …).
    pub architecture: String,
    /// When it was built (RFC 3339), if it is to say so (the digests then depend on
    /// it).
    pub created: Option<String>,
    /// The defaults of its processes.
    pub defaults: ImageDefaults,
}

/// The `PATH` of a Debian system.
pub const DEBIAN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ImageSpec {
    /// A Debian system built for this host: `PATH` and `LANG=C.UTF-8`, working in
    /// `/root`, `bash` as its command.
    pub fn debian(created: Option<String>) -> Self {
        Self {
            architecture: host_architecture().to_owned(),
            created,
            defaults: ImageDefaults {
                env: vec![format!("PATH={DEBIAN_PATH}"), "LANG=C.UTF-8".to_owned()],
                working_dir: Some("/root".to_owned()),
                user: None,
                entrypoint: None,
                cmd: Some(vec!["/bin/bash".to_owned()]),
            },
        }
    }
}

/// An image layout as a directory, or as a tar of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutFormat {
    /// A directory (`oci-layout`, `index.json`, `blobs/sha256/…`).
    Dir,
    /// A tar of that directory (what `POST /v1/templates` takes).
    Tar,
}

/// A layout written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The image manifest's digest.
    pub manifest: Digest,
    /// The image config's digest.
    pub config: Digest,
}

/// The config, manifest and index of an image of `layers` (bottom first).
fn documents(layers: &[LayerBlob], spec: &ImageSpec) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let d = &spec.defaults;
    let mut process = serde_json::Map::new();
    process.insert("Env".into(), serde_json::json!(d.env));
    if let Some(w) = &d.working_dir {
        process.insert("WorkingDir".into(), serde_json::json!(w));
    }
    if let Some(u) = &d.user {
        process.insert("User".into(), serde_json::json!(u));
    }
    if let Some(e) = &d.entrypoint {
        process.insert("Entrypoint".into(), serde_json::json!(e));
    }
    if let Some(c) = &d.cmd {
        process.insert("Cmd".into(), serde_json::json!(c));
    }
    let mut config = serde_json::json!({
        "architecture": spec.architecture,
        "os": "linux",
        "config": process,
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.to_string()).collect::<Vec<_>>(),
        },
    });
    if let Some(c) = &spec.created {
        config["created"] = serde_json::json!(c);
    }
    let config = serde_json::to_vec(&config).unwrap_or_default();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": Digest::of(&config).to_string(),
            "size": config.len(),
        },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": LAYER_MEDIA_TYPE,
            "digest": l.digest.to_string(),
            "size": l.size,
        })).collect::<Vec<_>>(),
    }))
    .unwrap_or_default();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": Digest::of(&manifest).to_string(),
            "size": manifest.len(),
            "platform": {"architecture": spec.architecture, "os": "linux"},
        }],
    }))
    .unwrap_or_default();
    (config, manifest, index)
}

const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

fn io_err(what: &'static str, path: &Path, e: io::Error) -> ImageError {
    ImageError::io(what, path, e)
}

/// Writes an OCI image layout of `layers` (bottom first: each blob and the file it
/// is in) with the config of `spec` at `out`, which must not exist: a directory or
/// a tar file, as `format` says.
pub fn write_layout(
    layers: &[(LayerBlob, PathBuf)],
    spec: &ImageSpec,
    out: &Path,
    format: LayoutFormat,
) -> Result<Layout> {
    if layers.is_empty() {
        return Err(ImageError::Format("an image with no layer".into()));
    }
    if layers.len() > MAX_LAYERS {
        return Err(ImageError::limit("the number of layers", MAX_LAYERS as u64));
    }
    let blobs: Vec<LayerBlob> = layers.iter().map(|(b, _)| b.clone()).collect();
    let (config, manifest, index) = documents(&blobs, spec);
    let layout = Layout {
        manifest: Digest::of(&manifest),
        config: Digest::of(&config),
    };
    let small = [
        ("oci-layout".to_owned(), OCI_LAYOUT),
        ("index.json".to_owned(), &index[..]),
        (format!("blobs/sha256/{}", layout.config.hex()), &config[..]),
        (
            format!("blobs/sha256/{}", layout.manifest.hex()),
            &manifest[..],
        ),
    ];
    let check = |blob: &LayerBlob, path: &Path| -> Result<File> {
        let f = File::open(path).map_err(|e| io_err("open layer blob", path, e))?;
        let len = f
            .metadata()
            .map_err(|e| io_err("stat layer blob", path, e))?
            .len();
        if len != blob.size {
            return Err(ImageError::Format(format!(
                "layer blob {}: {len} bytes in {}, {} expected",
                blob.digest,
                path.display(),
                blob.size
            )));
        }
        Ok(f)
    };
    match format {
        LayoutFormat::Dir => {
            fs::create_dir(out).map_err(|e| io_err("create image layout", out, e))?;
            let sha = out.join("blobs/sha256");
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&sha)
                .map_err(|e| io_err("create image layout", &sha, e))?;
            for (name, bytes) in small {
                let p = out.join(name);
                fs::write(&p, bytes).map_err(|e| io_err("write image layout", &p, e))?;
            }
            for (blob, path) in layers {
                let mut from = check(blob, path)?;
                let p = sha.join(blob.digest.hex());
                let mut to = File::create(&p).map_err(|e| io_err("write image layout", &p, e))?;
                io::copy(&mut from, &mut to).map_err(|e| io_err("copy layer blob", &p, e))?;
            }
        }
        LayoutFormat::Tar => {
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out)
                .map_err(|e| io_err("create image layout", out, e))?;
            let mut tar = tar::Builder::new(io::BufWriter::with_capacity(256 << 10, file));
            tar.mode(tar::HeaderMode::Deterministic);
            let header = |kind: EntryType, mode: u32, size: u64| {
                let mut h = Header::new_ustar();
                h.set_entry_type(kind);
                h.set_mode(mode);
                h.set_size(size);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(0);
                h
            };
            let terr = |e: io::Error| io_err("write image layout", out, e);
            for dir in ["blobs/", "blobs/sha256/"] {
                tar.append_data(
                    &mut header(EntryType::Directory, 0o755, 0),
                    dir,
                    io::empty(),
                )
                .map_err(terr)?;
            }
            for (name, bytes) in small {
                let mut h = header(EntryType::Regular, 0o644, bytes.len() as u64);
                tar.append_data(&mut h, name, bytes).map_err(terr)?;
            }
            for (blob, path) in layers {
                let from = check(blob, path)?;
                let mut h = header(EntryType::Regular, 0o644, blob.size);
                let name = format!("blobs/sha256/{}", blob.digest.hex());
                tar.append_data(&mut h, name, from.take(blob.size))
                    .map_err(terr)?;
            }
            let mut w = tar.into_inner().map_err(terr)?;
            w.flush().map_err(terr)?;
            w.get_ref().sync_all().map_err(terr)?;
        }
    }
    Ok(layout)
}

/// [`layer_from_rootfs`] and [`write_layout`]: the single-layer image of the root
/// filesystem `rootfs` at `out` (its layer spooled beside it meanwhile).
pub fn layout_from_rootfs(
    rootfs: impl Read,
    spec: &ImageSpec,
    out: &Path,
    format: LayoutFormat,
) -> Result<(LayerBlob, Layout)> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let spool = tempfile::NamedTempFile::new_in(dir).map_err(|e| io_err("spool layer", dir, e))?;
    let blob = layer_from_rootfs(
        rootfs,
        io::BufWriter::with_capacity(256 << 10, spool.as_file()),
    )?;
    let layout = write_layout(
        &[(blob.clone(), spool.path().to_owned())],
        spec,
        out,
        format,
    )?;
    Ok((blob, layout))
}
