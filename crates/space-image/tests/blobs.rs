//! Blobs only, as the control plane keeps templates: the same manifest (so the same
//! digest) as the worker's unpacking import, every layer verified, and the bundle a
//! worker takes, of exactly the announced length.

mod common;

use std::fs;
use std::io::Read;

use common::{Comp, Image, Layer, is_root, tar_dir};
use space_image::blobs::{self, bundle_size, import_blobs, write_bundle};
use space_image::{Digest, ImageError, Store};

fn two_layers() -> Image {
    let base = Layer::new()
        .dir("etc", 0o755)
        .file("etc/os-release", b"ID=blobs\n", 0o644)
        .file("bin/tool", b"#!/bin/sh\n", 0o755)
        .tar();
    let top = Layer::new()
        .whiteout("bin/tool")
        .file("etc/motd", b"hello", 0o644)
        .tar();
    Image::new(vec![(base, Comp::Gzip), (top, Comp::Zstd)])
}

fn files_in(dir: &std::path::Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn blobs_only_give_the_same_manifest_and_digest_as_the_unpacking_import() {
    if !is_root() {
        eprintln!("skipped: the unpacking import runs as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = two_layers();
    let oci = dir.path().join("oci");
    image.write_oci(&oci);
    let save = dir.path().join("save.tar");
    image.write_docker_save(&save);
    for archive in [&oci, &save] {
        let store = Store::open(dir.path().join(format!(
            "store-{}",
            archive.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        )))
        .unwrap_or_else(|e| panic!("{e}"));
        let unpacked = store
            .import_archive(archive, "t:1")
            .unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join(format!(
            "blobs-{}",
            archive.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        ));
        let manifest = import_blobs(archive, &root).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(manifest, unpacked.manifest, "{}", archive.display());
        assert_eq!(manifest.digest(), unpacked.digest);
        for l in &manifest.layers {
            let kept =
                fs::read(blobs::blob_path(&root, &l.digest)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(Digest::of(&kept), l.digest);
            assert_eq!(kept.len() as u64, l.size);
        }
        // Nothing was unpacked: blobs and an empty spool directory only.
        assert_eq!(files_in(&root.join("sha256")), 2);
        assert_eq!(files_in(&root.join("tmp")), 0);
    }
}

#[test]
fn an_import_of_a_kept_blob_writes_nothing_new_and_gives_the_same_manifest() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let oci = dir.path().join("oci");
    two_layers().write_oci(&oci);
    let tarred = dir.path().join("oci.tar");
    tar_dir(&oci, &tarred);
    let root = dir.path().join("blobs");
    let first = import_blobs(&oci, &root).unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<_> = first
        .layers
        .iter()
        .map(|l| {
            fs::metadata(blobs::blob_path(&root, &l.digest))
                .and_then(|m| m.modified())
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let second = import_blobs(&tarred, &root).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.digest(), second.digest());
    for (l, t) in second.layers.iter().zip(before) {
        let now = fs::metadata(blobs::blob_path(&root, &l.digest))
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(now, t, "a kept blob was written again");
    }
}

#[test]
fn a_layer_whose_tar_stream_is_not_its_diff_id_is_refused_and_nothing_is_kept() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut image = two_layers();
    // The config names another tar stream for the top layer.
    image.config["rootfs"]["diff_ids"][1] = serde_json::json!(Digest::of(b"another").to_string());
    let oci = dir.path().join("oci");
    image.write_oci(&oci);
    let root = dir.path().join("blobs");
    match import_blobs(&oci, &root) {
        Err(ImageError::DigestMismatch { what, .. }) => assert!(what.contains("diff_id"), "{what}"),
        other => panic!("accepted or wrong error: {other:?}"),
    }
    // The base layer was fine and is kept; the refused one is not.
    assert_eq!(files_in(&root.join("sha256")), 1);
    assert_eq!(files_in(&root.join("tmp")), 0);
}

#[test]
fn a_blob_that_is_not_its_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = two_layers();
    let oci = dir.path().join("oci");
    image.write_oci(&oci);
    // Corrupt the base blob in place (its name, the manifest's digest, stays).
    let base = Digest::of(&image.layers[0].1);
    let path = oci.join("blobs/sha256").join(base.hex());
    let mut bytes = fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    let err = import_blobs(&oci, &dir.path().join("blobs")).err();
    assert!(
        matches!(
            err,
            Some(ImageError::DigestMismatch { .. } | ImageError::Layer { .. })
        ),
        "{err:?}"
    );
    assert_eq!(files_in(&dir.path().join("blobs/sha256")), 0);
}

#[test]
fn the_bundle_is_the_manifest_then_every_blob_and_exactly_its_announced_length() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let save = dir.path().join("save.tar");
    two_layers().write_docker_save(&save);
    let root = dir.path().join("blobs");
    let manifest = import_blobs(&save, &root).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    let n = write_bundle(&manifest, &root, &mut out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, out.len() as u64);
    assert_eq!(n, bundle_size(&manifest));

    let mut archive = tar::Archive::new(&out[..]);
    let mut names = Vec::new();
    for (i, entry) in archive
        .entries()
        .unwrap_or_else(|e| panic!("{e}"))
        .enumerate()
    {
        let mut entry = entry.unwrap_or_else(|e| panic!("{e}"));
        let name = entry
            .path()
            .unwrap_or_else(|e| panic!("{e}"))
            .display()
            .to_string();
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .unwrap_or_else(|e| panic!("{e}"));
        if i == 0 {
            assert_eq!(data, manifest.canonical_json());
        } else {
            let l = &manifest.layers[i - 1];
            assert_eq!(Digest::of(&data), l.digest);
        }
        names.push(name);
    }
    let mut expected = vec![blobs::BUNDLE_MANIFEST.to_owned()];
    expected.extend(
        manifest
            .layers
            .iter()
            .map(|l| format!("blobs/sha256/{}", l.digest.hex())),
    );
    assert_eq!(names, expected);
}

#[test]
fn a_bundle_of_a_blob_of_another_size_than_its_manifest_says_fails() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let oci = dir.path().join("oci");
    two_layers().write_oci(&oci);
    let root = dir.path().join("blobs");
    let manifest = import_blobs(&oci, &root).unwrap_or_else(|e| panic!("{e}"));
    let path = blobs::blob_path(&root, &manifest.layers[1].digest);
    fs::write(&path, b"short").unwrap_or_else(|e| panic!("{e}"));
    assert!(write_bundle(&manifest, &root, std::io::sink()).is_err());
}

#[test]
fn unreferenced_blobs_are_removed_and_referenced_ones_kept() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let oci = dir.path().join("oci");
    two_layers().write_oci(&oci);
    let root = dir.path().join("blobs");
    let manifest = import_blobs(&oci, &root).unwrap_or_else(|e| panic!("{e}"));
    let keep = [manifest.layers[0].digest];
    assert_eq!(
        blobs::remove_unreferenced(&root, &keep).unwrap_or_else(|e| panic!("{e}")),
        1
    );
    assert!(blobs::blob_path(&root, &keep[0]).is_file());
    assert!(!blobs::blob_path(&root, &manifest.layers[1].digest).exists());
}
