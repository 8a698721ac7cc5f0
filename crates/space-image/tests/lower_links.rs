//! Entries under a symbolic link of a layer below: resolved in the root the layers
//! make (as `tar -x` in a chroot of it), written in the layer being unpacked, never
//! through the link on the host — and never as a real directory that would hide the
//! lower layer's link in the overlay.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{Comp, Image, Layer, is_root, layer_dirs, overlay_view};
use space_image::{ImageError, Store};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(dir.path().join("images")).unwrap_or_else(|e| panic!("{e}"));
    (dir, store)
}

/// An OCI layout of `layers` (bottom first) in `dir/name`.
fn layout(dir: &Path, name: &str, layers: Vec<Vec<u8>>) -> PathBuf {
    let path = dir.join(name);
    Image::new(layers.into_iter().map(|t| (t, Comp::Gzip)).collect()).write_oci(&path);
    path
}

/// A usrmerge base: `lib -> usr/lib`, `bin -> /usr/bin`, `usr/lib` mode 0750.
fn usrmerge_base() -> Vec<u8> {
    Layer::new()
        .dir("usr", 0o755)
        .dir("usr/lib", 0o750)
        .file("usr/lib/libc.so.6", b"libc", 0o644)
        .dir("usr/bin", 0o755)
        .file("usr/bin/sh", b"sh", 0o755)
        .symlink("lib", "usr/lib")
        .symlink("bin", "/usr/bin")
        .tar()
}

fn import(store: &Store, image: &Path, name: &str) -> space_image::Resolved {
    store
        .import_archive(image, name)
        .unwrap_or_else(|e| panic!("import: {e}"));
    store
        .resolve(name)
        .unwrap_or_else(|e| panic!("resolve: {e}"))
}

#[test]
fn a_file_under_a_lower_layers_usrmerge_link_lands_behind_the_link() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The upper layer names its files by the links' paths, with no parent entries.
    let top = Layer::new()
        .file("lib/libextra.so", b"extra", 0o644)
        .file("bin/tool", b"tool", 0o755)
        .dir("lib/x86_64-linux-gnu", 0o755)
        .file("lib/x86_64-linux-gnu/libz.so", b"z", 0o644)
        .tar();
    let image = layout(tmp.path(), "usrmerge", vec![usrmerge_base(), top]);
    let (_d, store) = store();
    let r = import(&store, &image, "usrmerge");
    let upper = &r.lower_dirs[0];
    assert!(
        std::fs::symlink_metadata(upper.join("lib")).is_err()
            && std::fs::symlink_metadata(upper.join("bin")).is_err(),
        "the upper layer made real directories where the base has links"
    );
    for (path, content) in [
        ("usr/lib/libextra.so", &b"extra"[..]),
        ("usr/bin/tool", b"tool"),
        ("usr/lib/x86_64-linux-gnu/libz.so", b"z"),
    ] {
        assert_eq!(
            std::fs::read(upper.join(path)).ok().as_deref(),
            Some(content),
            "{path}"
        );
    }
    // The directory made behind the link keeps the base's mode and mtime.
    let m = std::fs::metadata(upper.join("usr/lib")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o750, 1_700_000_000));
    if !is_root() {
        eprintln!("overlay view: skipped, needs root");
        return;
    }
    let view = overlay_view(&r.lower_dirs);
    for line in [
        "./lib l 777 0",
        "./bin l 777 0",
        "./usr/lib d 750 0",
        "./usr/lib/libc.so.6=libc",
        "./usr/lib/libextra.so=extra",
        "./usr/lib/x86_64-linux-gnu/libz.so=z",
        "./usr/bin/sh=sh",
        "./usr/bin/tool=tool",
    ] {
        assert!(
            view.lines().any(|l| l == line),
            "{line:?} not in the view:\n{view}"
        );
    }
}

#[test]
fn one_layer_over_two_bases_is_unpacked_once_for_each() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let top = || Layer::new().file("lib/x", b"x", 0o644).tar();
    let real_lib = Layer::new()
        .dir("lib", 0o755)
        .file("lib/y", b"y", 0o644)
        .tar();
    let linked = layout(tmp.path(), "linked", vec![usrmerge_base(), top()]);
    let plain = layout(tmp.path(), "plain", vec![real_lib, top()]);
    let (_d, store) = store();
    let a = import(&store, &linked, "linked");
    let b = import(&store, &plain, "plain");
    // The same diff_id, two directories: what it unpacks to depends on its base.
    assert_ne!(a.lower_dirs[0], b.lower_dirs[0]);
    assert_eq!(layer_dirs(store.root()), 4);
    assert!(a.lower_dirs[0].join("usr/lib/x").is_file());
    assert!(!a.lower_dirs[0].join("lib").exists());
    assert!(b.lower_dirs[0].join("lib/x").is_file());
    assert!(!b.lower_dirs[0].join("usr").exists());
}

#[test]
fn a_lower_link_to_a_host_directory_resolves_in_the_image_never_on_the_host() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let host = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let host_path = host.path().display().to_string();
    let base = Layer::new()
        .symlink("conf", &host_path)
        .symlink("up", "../../../../..")
        .tar();
    let top = Layer::new()
        .file("conf/pwned", b"pwned", 0o644)
        .file("up/escaped", b"escaped", 0o644)
        .tar();
    let image = layout(tmp.path(), "links", vec![base, top]);
    let (_d, store) = store();
    let r = import(&store, &image, "links");
    assert_eq!(
        std::fs::read_dir(host.path()).map(Iterator::count).ok(),
        Some(0),
        "the host directory behind the link was written"
    );
    let upper = &r.lower_dirs[0];
    let inside = upper.join(host_path.trim_start_matches('/')).join("pwned");
    assert_eq!(std::fs::read(&inside).ok(), Some(b"pwned".to_vec()));
    // `..` stops at the image's root.
    assert_eq!(
        std::fs::read(upper.join("escaped")).ok(),
        Some(b"escaped".to_vec())
    );
    // The links themselves are the base's, untouched.
    assert_eq!(
        std::fs::read_link(r.lower_dirs[1].join("conf")).ok(),
        Some(PathBuf::from(&host_path))
    );
}

#[test]
fn a_path_through_a_loop_of_lower_links_refuses_the_layer() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let base = Layer::new().symlink("a", "b").symlink("b", "/a").tar();
    let top = Layer::new().file("a/x", b"", 0o644).tar();
    let image = layout(tmp.path(), "loop", vec![base, top]);
    let (_d, store) = store();
    let err = match store.import_archive(&image, "loop") {
        Ok(t) => panic!("imported: {t:?}"),
        Err(e) => e,
    };
    assert!(matches!(err, ImageError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("more than 40 symbolic links"),
        "{err}"
    );
}

#[test]
fn a_hard_link_through_a_lower_link_links_the_file_behind_it() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let top = Layer::new()
        .file("lib/a.so", b"a", 0o644)
        .hardlink("lib/b.so", "lib/a.so")
        .tar();
    let image = layout(tmp.path(), "hardlink", vec![usrmerge_base(), top]);
    let (_d, store) = store();
    let r = import(&store, &image, "hardlink");
    let ino = |p: &str| {
        std::fs::metadata(r.lower_dirs[0].join(p))
            .map(|m| m.ino())
            .ok()
    };
    assert!(ino("usr/lib/a.so").is_some());
    assert_eq!(ino("usr/lib/a.so"), ino("usr/lib/b.so"));
}

#[test]
fn a_file_under_a_directory_this_layer_whited_out_makes_it_opaque() {
    if !is_root() {
        eprintln!("skipped: whiteouts need root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let base = Layer::new()
        .dir("cache", 0o755)
        .file("cache/old", b"old", 0o644)
        .dir("usr", 0o755)
        .tar();
    // `.wh.cache`, then `cache/new` with no entry for `cache` itself.
    let top = Layer::new()
        .whiteout("cache")
        .file("cache/new", b"new", 0o644)
        .tar();
    let image = layout(tmp.path(), "whited", vec![base, top]);
    let (_d, store) = store();
    let r = import(&store, &image, "whited");
    let view = overlay_view(&r.lower_dirs);
    assert!(view.lines().any(|l| l == "./cache/new=new"), "{view}");
    assert!(!view.contains("./cache/old"), "{view}");
}
