//! The guest's disks: each layer of the template rendered once to a read-only ext4
//! image (shared by every VM of a template with that layer), and a per-sandbox ext4 image, sparse, of the disk limit's
//! size, for its writable layer. Both made with `mkfs.ext4` (`-d` copies a tree into
//! the image without mounting it; it stores links as links, never following one).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::substrate::{SubstrateError, TemplateSpec};

/// Renders under way in this process, numbering their temporary files.
static RENDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Room beyond the template's own bytes (ext4 metadata, inode tables).
const ROOT_SLACK: u64 = 64 << 20;

/// The read-only images of `template`'s layers under `images`, top first, each
/// rendered once if missing: an image template's layer by its directory's name (the
/// layer's chain ID, so templates sharing a layer share its image), a directory
/// template by a hash of its path.
pub fn layer_images(
    images: &Path,
    template: &TemplateSpec,
) -> Result<Vec<PathBuf>, SubstrateError> {
    let layers: Vec<(String, PathBuf)> = match template {
        TemplateSpec::Default => {
            return Err(SubstrateError::Unsupported(
                "a VM sandbox needs an image template (the host-directories default \
                 cannot be a guest's root)"
                    .into(),
            ));
        }
        TemplateSpec::Directory {
            lower_dir,
            read_only_binds,
        } => {
            if !read_only_binds.is_empty() {
                return Err(SubstrateError::Unsupported(
                    "a VM sandbox cannot bind host directories".into(),
                ));
            }
            let path = lower_dir.to_string_lossy();
            let key = blake3::hash(path.as_bytes()).to_hex()[..32].to_owned();
            vec![(format!("dir-{key}"), lower_dir.clone())]
        }
        TemplateSpec::Image { lower_dirs, .. } => lower_dirs
            .iter()
            .map(|d| {
                let name: String = d
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                (format!("layer-{name}"), d.clone())
            })
            .collect(),
    };
    if layers.is_empty() || layers.len() > space_proto::vm::MAX_LAYERS {
        return Err(SubstrateError::Unsupported(format!(
            "a VM sandbox's template has 1 to {} layers; this one has {}",
            space_proto::vm::MAX_LAYERS,
            layers.len()
        )));
    }
    std::fs::create_dir_all(images).map_err(super::super::io_err("the VM images directory"))?;
    layers
        .iter()
        .map(|(key, dir)| layer_image(images, key, dir))
        .collect()
}

/// The image of one layer directory, `<images>/<key>.ext4`, rendered if missing.
fn layer_image(images: &Path, key: &str, layer: &Path) -> Result<PathBuf, SubstrateError> {
    let image = images.join(format!("{key}.ext4"));
    // Read-only to everyone whatever the worker's umask: a QEMU dropped to a VM's uid
    // reopens its images (through the descriptors it was given) at a migration's end.
    let readable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o444))
            .map_err(super::super::io_err("a VM layer image's mode"))
    };
    if std::fs::symlink_metadata(&image).is_ok_and(|m| m.is_file()) {
        readable(&image)?;
        return Ok(image);
    }
    let size = tree_bytes(layer)? + ROOT_SLACK;
    // Per call (two first launches of one template may render it at once; the
    // second rename replaces the first's identical image).
    let tmp = images.join(format!(
        ".{key}.{}.{}.tmp",
        std::process::id(),
        RENDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let made = make_ext4(&tmp, size, "space-layer", Some(layer));
    if let Err(e) = made.and_then(|()| readable(&tmp)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &image).map_err(super::super::io_err("a VM layer image"))?;
    Ok(image)
}

/// A fresh writable disk of `bytes` at `path`.
pub fn upper_image(path: &Path, bytes: u64) -> Result<(), SubstrateError> {
    make_ext4(path, bytes, "space-upper", None)
}

fn make_ext4(
    path: &Path,
    bytes: u64,
    label: &str,
    from: Option<&Path>,
) -> Result<(), SubstrateError> {
    let file = std::fs::File::create(path).map_err(super::super::io_err("a VM disk image"))?;
    // Whole MiB: mkfs counts in blocks.
    let bytes = bytes.div_ceil(1 << 20) << 20;
    file.set_len(bytes)
        .map_err(super::super::io_err("a VM disk image"))?;
    drop(file);
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-m", "0", "-L", label, "-J", "size=4"]);
    if let Some(dir) = from {
        cmd.arg("-d").arg(dir);
    }
    cmd.arg(path);
    let out = cmd
        .output()
        .map_err(super::super::io_err("run mkfs.ext4 (e2fsprogs)"))?;
    if !out.status.success() {
        return Err(SubstrateError::Unsupported(format!(
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Bytes a tree takes (files' lengths rounded to 4 KiB, plus a block per entry);
/// links are not followed.
fn tree_bytes(root: &Path) -> Result<u64, SubstrateError> {
    let mut total = 0u64;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).map_err(super::super::io_err("read the template"))?;
        for e in entries.flatten() {
            let meta = std::fs::symlink_metadata(e.path())
                .map_err(super::super::io_err("read the template"))?;
            total += meta.len().div_ceil(4096) * 4096 + 4096;
            if meta.is_dir() {
                dirs.push(e.path());
            }
        }
    }
    Ok(total)
}
