//! The import benchmark's workload (`space bench image`): an image of about `total`
//! bytes — layers of many small files and one of a few large ones, random text,
//! gzip — written as an OCI layout, then unpacked twice on the same disk: with
//! `tar -xzf` of each layer into one directory, and imported into a fresh store.
//! The page cache is flushed (`sync`) before each, so neither pays for the other's
//! writes.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::Digest;
use crate::store::Store;

/// What one run measured.
#[derive(Debug, Clone)]
pub struct ImportBench {
    /// Uncompressed bytes of file data.
    pub image_bytes: u64,
    /// Compressed bytes of the layer blobs.
    pub blob_bytes: u64,
    /// Layers.
    pub layers: usize,
    /// Files.
    pub files: u64,
    /// `tar -xzf` of every layer, seconds.
    pub tar_secs: f64,
    /// The store's import, seconds.
    pub import_secs: f64,
    /// The import's `syncfs` and fsyncs included: `tar -xzf` followed by `sync`.
    pub tar_sync_secs: f64,
}

/// A xorshift64* generator: random enough for file contents, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` bytes of random words (compresses about 1.6:1 with gzip, like binaries
    /// and text of a real image).
    fn text(&mut self, n: usize) -> Vec<u8> {
        const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz \n_./0";
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            let mut r = self.next();
            for _ in 0..12 {
                v.push(ALPHABET[(r & 31) as usize]);
                r >>= 5;
            }
        }
        v.truncate(n);
        v
    }
}

/// One layer's tar, its file count and data bytes.
fn layer(rng: &mut Rng, bytes: u64, large: bool, index: usize) -> (Vec<u8>, u64, u64) {
    let mut b = tar::Builder::new(Vec::new());
    let (mut written, mut files) = (0u64, 0u64);
    while written < bytes {
        let size = if large {
            bytes.div_ceil(4).min(bytes - written)
        } else {
            (1024 + rng.next() % (48 << 10)).min(bytes - written)
        };
        let path = format!("l{index}/d{:02}/f{files:06}", files % 64);
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        let data = rng.text(size as usize);
        // No directory entries: both unpackers create parents as needed.
        if b.append_data(&mut h, &path, &data[..]).is_err() {
            break;
        }
        written += size;
        files += 1;
    }
    (b.into_inner().unwrap_or_default(), files, written)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<Vec<u8>, String> {
    let bytes = serde_json::to_vec(v).map_err(|e| e.to_string())?;
    fs::write(path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes)
}

/// Builds the image under `scratch/image`, then measures both unpacks under
/// `scratch` (one run each).
pub fn import_vs_tar(scratch: &Path, total: u64) -> Result<ImportBench, String> {
    let image = scratch.join("image");
    let blobs = image.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(|e| format!("{}: {e}", blobs.display()))?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Four layers of small files (70 %), one of four large files.
    let plan = [
        (0.175, false),
        (0.175, false),
        (0.175, false),
        (0.175, false),
        (0.3, true),
    ];
    let (mut descriptors, mut diff_ids, mut blob_paths) = (Vec::new(), Vec::new(), Vec::new());
    let (mut image_bytes, mut blob_bytes, mut files) = (0, 0, 0);
    for (i, (share, large)) in plan.iter().enumerate() {
        let (tar, n, bytes) = layer(&mut rng, (total as f64 * share) as u64, *large, i);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).map_err(|e| e.to_string())?;
        let blob = gz.finish().map_err(|e| e.to_string())?;
        let digest = Digest::of(&blob);
        let path = blobs.join(digest.hex());
        fs::write(&path, &blob).map_err(|e| format!("{}: {e}", path.display()))?;
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest.to_string(),
            "size": blob.len(),
        }));
        diff_ids.push(Digest::of(&tar).to_string());
        blob_paths.push(path);
        (image_bytes, blob_bytes, files) = (
            image_bytes + bytes,
            blob_bytes + blob.len() as u64,
            files + n,
        );
    }
    let config = serde_json::json!({
        "architecture": crate::oci::host_architecture(),
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let tmp = image.join("config.json");
    let config = write_json(&tmp, &config)?;
    let cd = Digest::of(&config);
    fs::rename(&tmp, blobs.join(cd.hex())).map_err(|e| e.to_string())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cd.to_string(), "size": config.len()},
        "layers": descriptors,
    });
    let tmp = image.join("manifest.json");
    let manifest = write_json(&tmp, &manifest)?;
    let md = Digest::of(&manifest);
    fs::rename(&tmp, blobs.join(md.hex())).map_err(|e| e.to_string())?;
    write_json(
        &image.join("index.json"),
        &serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md.to_string(), "size": manifest.len()}]}),
    )?;
    fs::write(
        image.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .map_err(|e| e.to_string())?;

    let tar_dir = scratch.join("tar-x");
    fs::create_dir(&tar_dir).map_err(|e| e.to_string())?;
    rustix::fs::sync();
    let t = Instant::now();
    for blob in &blob_paths {
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(blob)
            .arg("-C")
            .arg(&tar_dir)
            .status()
            .map_err(|e| format!("tar: {e}"))?;
        if !status.success() {
            return Err(format!("tar -xzf {}: {status}", blob.display()));
        }
    }
    let tar_secs = t.elapsed().as_secs_f64();
    rustix::fs::sync();
    let tar_sync_secs = t.elapsed().as_secs_f64();

    let store = Store::open(scratch.join("store")).map_err(|e| e.to_string())?;
    rustix::fs::sync();
    let t = Instant::now();
    store
        .import_archive(&image, "bench")
        .map_err(|e| format!("import: {e}"))?;
    let import_secs = t.elapsed().as_secs_f64();
    File::open(scratch).map_err(|e| e.to_string())?;
    Ok(ImportBench {
        image_bytes,
        blob_bytes,
        layers: plan.len(),
        files,
        tar_secs,
        import_secs,
        tar_sync_secs,
    })
}
