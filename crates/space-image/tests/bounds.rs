//! Decompression bombs: small gzip and zstd layers of zeros that unpack to far more
//! than the bound the test sets. The import stops at the bound — on a worker's store
//! and on the control plane's blob import alike — with an error naming the bound and
//! how to raise it, and keeps nothing.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::{Comp, Image, Layer, blob_files, layer_dirs};
use space_image::limits::{MAX_IMAGE_BYTES_VAR, MAX_LAYER_BYTES_VAR};
use space_image::{ImageError, ImageLimits, Store};

/// 8 MiB of zeros: a few KiB compressed.
const BOMB: u64 = 8 << 20;

/// The bounds the tests set: 1 MiB a layer, 3 MiB an image.
const LIMITS: ImageLimits = ImageLimits {
    max_image_bytes: 3 << 20,
    max_layer_bytes: 1 << 20,
};

/// A layer of one file of `n` zero bytes.
fn zeros(n: u64) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(n);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_data(&mut h, "zeros", std::io::repeat(0).take(n))
        .unwrap_or_else(|e| panic!("{e}"));
    b.into_inner().unwrap_or_else(|e| panic!("{e}"))
}

fn layout(dir: &Path, layers: Vec<(Vec<u8>, Comp)>) -> PathBuf {
    let image = Image::new(layers);
    for (_, blob, _) in &image.layers {
        assert!(
            blob.len() < (LIMITS.max_layer_bytes / 8) as usize,
            "not a bomb"
        );
    }
    let path = dir.join("image");
    image.write_oci(&path);
    path
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(dir.path().join("images"))
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(LIMITS);
    (dir, store)
}

fn tmp_entries(store_root: &Path) -> usize {
    std::fs::read_dir(store_root.join("tmp"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// Imports `image` into a bounded store, expecting the bound; nothing is kept.
fn refused(image: &Path) -> ImageError {
    let (_d, store) = store();
    let err = match store.import_archive(image, "bomb") {
        Ok(t) => panic!("a bomb was imported: {t:?}"),
        Err(e) => e,
    };
    assert_eq!(layer_dirs(store.root()), 0, "a layer was kept");
    assert_eq!(blob_files(store.root()), 0, "a blob was kept");
    assert_eq!(tmp_entries(store.root()), 0, "a staging file was left");
    err
}

fn assert_layer_bound(err: &ImageError) {
    let msg = err.to_string();
    assert!(
        matches!(err, ImageError::Unpacked { scope: "one layer", limit, .. } if *limit == LIMITS.max_layer_bytes),
        "{msg}"
    );
    assert!(
        msg.contains(MAX_LAYER_BYTES_VAR) && msg.contains("1048576"),
        "{msg}"
    );
}

#[test]
fn a_gzip_bomb_layer_stops_at_the_layer_bound_and_nothing_is_kept() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = layout(tmp.path(), vec![(zeros(BOMB), Comp::Gzip)]);
    assert_layer_bound(&refused(&image));
}

#[test]
fn a_zstd_bomb_layer_stops_at_the_layer_bound_and_nothing_is_kept() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = layout(tmp.path(), vec![(zeros(BOMB), Comp::Zstd)]);
    assert_layer_bound(&refused(&image));
}

#[test]
fn zeros_after_the_end_of_a_layers_tar_count_against_its_bound() {
    // A valid tar, then 8 MiB of zeros the tar reader never asks for: the diff_id
    // hashes them all the same, within the bound.
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut tar = Layer::new().file("f", b"small", 0o644).tar();
    tar.resize(tar.len() + BOMB as usize, 0);
    let image = layout(tmp.path(), vec![(tar, Comp::Gzip)]);
    assert_layer_bound(&refused(&image));
}

#[test]
fn layers_within_their_bound_that_pass_the_images_together_are_refused() {
    // Three layers of 900 KiB: each below 1 MiB, 2.7 MiB together (< 3 MiB) pass; a
    // fourth passes the image's bound.
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let layer = |name: &str| {
        let mut l = Layer::new();
        l.file(name, &vec![0u8; 900 << 10], 0o644);
        (l.tar(), Comp::Zstd)
    };
    let three = layout(tmp.path(), vec![layer("a"), layer("b"), layer("c")]);
    let (_d, store) = store();
    store
        .import_archive(&three, "three")
        .unwrap_or_else(|e| panic!("three layers within the bounds: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let four = layout(
        dir.path(),
        vec![layer("a"), layer("b"), layer("c"), layer("d")],
    );
    // The same store: the first three layers are there already, and count all the same.
    let err = match store.import_archive(&four, "four") {
        Ok(t) => panic!("imported past the image's bound: {t:?}"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            ImageError::Unpacked {
                scope: "one image",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains(MAX_IMAGE_BYTES_VAR) && msg.contains("3145728") && msg.contains("4 of 4"),
        "{msg}"
    );
}

#[test]
fn the_control_planes_blob_import_stops_a_bomb_at_the_bound_and_keeps_no_blob() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for c in [Comp::Gzip, Comp::Zstd] {
        let dir = tmp.path().join(format!("{c:?}"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let image = layout(&dir, vec![(zeros(BOMB), c)]);
        let blobs = dir.join("blobs");
        let err = match space_image::blobs::import_blobs_bounded(&image, &blobs, &LIMITS) {
            Ok(m) => panic!("{c:?}: a bomb was imported: {m:?}"),
            Err(e) => e,
        };
        assert_layer_bound(&err);
        let kept = std::fs::read_dir(blobs.join("sha256")).map_or(0, Iterator::count);
        let spooled = std::fs::read_dir(blobs.join("tmp")).map_or(0, Iterator::count);
        assert_eq!((kept, spooled), (0, 0), "{c:?}: a blob was kept");
    }
}

#[test]
fn sparse_entries_are_refused_so_no_file_claims_more_than_its_bytes() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let header = |kind: tar::EntryType| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    };
    // A PAX sparse map claiming 100 GiB of holes for a file of no data.
    let mut pax = tar::Builder::new(Vec::new());
    pax.append_pax_extensions([
        ("GNU.sparse.size", &b"107374182400"[..]),
        ("GNU.sparse.map", &b"107374182399,0"[..]),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    pax.append_data(&mut header(tar::EntryType::Regular), "holes", &[][..])
        .unwrap_or_else(|e| panic!("{e}"));
    // An old GNU sparse entry.
    let mut gnu = tar::Builder::new(Vec::new());
    gnu.append_data(&mut header(tar::EntryType::GNUSparse), "holes", &[][..])
        .unwrap_or_else(|e| panic!("{e}"));
    for (name, layer) in [("pax", pax), ("gnu", gnu)] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let tar = layer.into_inner().unwrap_or_else(|e| panic!("{e}"));
        let image = layout(&dir, vec![(tar, Comp::Gzip)]);
        let msg = refused(&image).to_string();
        assert!(
            msg.contains("sparse files are refused") || msg.contains("unsupported tar entry type"),
            "{name}: {msg}"
        );
    }
}
