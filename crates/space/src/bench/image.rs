//! `space bench image` (issue 16): the import of a 200 MB image into a fresh template
//! store against `tar -xzf` of the same layers into one directory, on the same disk,
//! one run each (`space_image::bench` builds the image: four layers of many small
//! files and one of four large files, random text, gzip). Target: the import ≤ 2 ×
//! `tar -x`. The import verifies every digest and syncs what it wrote before naming
//! it; `tar -x` followed by `sync` is shown as information.
//!
//! The scratch directory is under `$SPACE_BENCH_DIR` (the disk to measure), else the
//! system's temporary directory.

use std::path::PathBuf;

use super::row::Row;

/// The image's size (uncompressed file data).
const SIZE: u64 = 200 << 20;

/// The target ratio to `tar -x`.
const TARGET: f64 = 2.0;

/// The figure.
pub async fn run() -> Result<Vec<Row>, String> {
    tokio::task::spawn_blocking(measure)
        .await
        .map_err(|e| format!("image bench task: {e}"))?
}

fn measure() -> Result<Vec<Row>, String> {
    let base = std::env::var_os("SPACE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("space-bench-image-")
        .tempdir_in(&base)
        .map_err(|e| format!("scratch directory in {}: {e}", base.display()))?;
    eprintln!(
        "image: a {} MiB image, tar -xzf of its layers, then its import into a fresh store, in {}",
        SIZE >> 20,
        base.display()
    );
    let b = space_image::bench::import_vs_tar(scratch.path(), SIZE)?;
    let ratio = b.import_secs / b.tar_secs.max(1e-3);
    let what = format!(
        "import of a {} MB image ({} gzip layers, {} files, {} MB of blobs) vs tar -xzf of its layers",
        b.image_bytes / 1_000_000,
        b.layers,
        b.files,
        b.blob_bytes / 1_000_000
    );
    Ok(vec![
        Row::new(
            "image",
            &what,
            format!("{:.2} s, tar -x {:.2} s", b.import_secs, b.tar_secs),
            "≤ 2 × tar -x",
        )
        .ratio(ratio)
        .pass(ratio <= TARGET),
        Row::new(
            "image",
            "the same import vs tar -xzf then sync (information: the import syncs what it wrote)",
            format!(
                "{:.2} s, tar -x + sync {:.2} s ({:.2} ×)",
                b.import_secs,
                b.tar_sync_secs,
                b.import_secs / b.tar_sync_secs.max(1e-3)
            ),
            "-",
        ),
    ])
}
