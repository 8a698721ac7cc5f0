//! Importing images the tests build — an OCI layout directory, the same as a tar, and
//! a `docker save` archive — and checking what a sandbox would see: the template's
//! lower dirs mounted as one overlay (as root, in a private mount namespace).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{Comp, Image, Layer, is_root, overlay_view, tar_dir};
use space_image::{ImageDefaults, Store};

/// Three layers: a base (gzip), one with whiteouts and opaque dirs (zstd), one that
/// repeats a path (plain tar).
fn three_layers() -> Image {
    let base = Layer::new()
        .dir("etc", 0o755)
        .file("etc/os-release", b"ID=test\n", 0o644)
        .dir("bin", 0o755)
        .file("bin/tool", b"#!/bin/sh\necho tool\n", 0o755)
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/su", b"su", 0o4755)
        .dir("usr/lib", 0o755)
        .file("usr/lib/libc.so", b"libc", 0o644)
        .hardlink("usr/lib/libc.so.6", "usr/lib/libc.so")
        .symlink("lib", "usr/lib")
        .file("usr/share/doc/a.txt", b"a", 0o644)
        .file("usr/share/doc/b.txt", b"b", 0o644)
        .file("opt/old/x", b"x", 0o644)
        .file("opt/old/y", b"y", 0o644)
        .file("srv/lower", b"lower", 0o644)
        .dir_owned("home/user", 0o750, 1000, 1000)
        .file_owned("home/user/.profile", b"PS1=$\n", 0o600, 1000, 1000)
        .dir("tmp", 0o1777)
        .fifo("tmp/fifo")
        .tar();
    let changes = Layer::new()
        .whiteout("usr/share/doc/a.txt")
        .opaque("opt/old")
        .file("opt/old/new", b"new", 0o644)
        .file("etc/os-release", b"ID=test2\n", 0o644)
        // A whiteout and a directory of the same name in one layer: the directory
        // stays, the lower one's contents do not.
        .whiteout("srv")
        .dir("srv", 0o755)
        .file("srv/upper", b"upper", 0o644)
        .tar();
    let repeat = Layer::new()
        .file("etc/motd", b"v1", 0o644)
        .file("etc/motd", b"v2", 0o644)
        .tar();
    Image::new(vec![
        (base, Comp::Gzip),
        (changes, Comp::Zstd),
        (repeat, Comp::Plain),
    ])
}

/// What `find` shows of the overlay of `lower_dirs` (top first): one line per entry
/// (`path type mode uid`) and the content of each regular file.
fn check_the_view(lower_dirs: &[PathBuf]) {
    let view = overlay_view(lower_dirs);
    for line in [
        "./etc/os-release=ID=test2",
        "./etc/motd=v2",
        "./usr/share/doc/b.txt=b",
        "./opt/old/new=new",
        "./srv/upper=upper",
        "./usr/bin/su f 4755 0",
        "./home/user d 750 1000",
        "./home/user/.profile f 600 1000",
        "./lib l 777 0",
        "./tmp d 1777 0",
        "./tmp/fifo p 640 0",
        "./bin/tool f 755 0",
    ] {
        assert!(
            view.lines().any(|l| l == line),
            "{line:?} not in the view:\n{view}"
        );
    }
    for gone in [
        "./usr/share/doc/a.txt",
        "./opt/old/x",
        "./opt/old/y",
        "./srv/lower",
    ] {
        assert!(
            !view.lines().any(|l| l.starts_with(&format!("{gone} "))),
            "{gone} is visible:\n{view}"
        );
    }
}

fn check_defaults(config: &ImageDefaults) {
    assert_eq!(
        config.env,
        ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    );
    assert_eq!(config.working_dir.as_deref(), Some("/home/user"));
    assert_eq!(config.user.as_deref(), Some("user"));
    assert_eq!(
        config.entrypoint.as_deref(),
        Some(&["/bin/tool".to_owned()][..])
    );
    assert_eq!(config.cmd.as_deref(), Some(&["--help".to_owned()][..]));
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(dir.path().join("images")).unwrap_or_else(|e| panic!("{e}"));
    (dir, store)
}

fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("{test}: skipped, needs root (whiteouts are device nodes, overlay mounts)");
    true
}

#[test]
fn an_oci_layout_directory_imports_with_its_whiteouts_opaque_dirs_and_defaults() {
    if skip_unless_root("oci layout directory") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = tmp.path().join("layout");
    three_layers().write_oci(&image);
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "test-image:1.0")
        .unwrap_or_else(|e| panic!("import: {e}"));
    assert_eq!(t.manifest.layers.len(), 3);
    let media: Vec<&str> = t
        .manifest
        .layers
        .iter()
        .map(|l| l.media_type.as_str())
        .collect();
    assert_eq!(
        media,
        [
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar+zstd",
            "application/vnd.oci.image.layer.v1.tar",
        ]
    );
    let r = store
        .resolve("test-image:1.0")
        .unwrap_or_else(|e| panic!("resolve: {e}"));
    assert_eq!(r.digest, t.digest);
    assert_eq!(
        store.resolve(&t.digest.to_string()).map(|x| x.digest).ok(),
        Some(t.digest)
    );
    // Top first, each named by its chain ID (the bottom one's is its diff_id).
    let expected: Vec<PathBuf> = t
        .manifest
        .chain_ids()
        .iter()
        .rev()
        .map(|c| store.root().join("layers").join(c.hex()))
        .collect();
    assert_eq!(t.manifest.chain_ids()[0], t.manifest.layers[0].diff_id);
    assert_eq!(r.lower_dirs, expected);
    check_defaults(&r.config);
    check_the_view(&r.lower_dirs);
    // A hard link of the layer is one inode.
    let base = &r.lower_dirs[2];
    let ino = |p: &str| {
        std::fs::symlink_metadata(base.join(p))
            .map(|m| m.ino())
            .ok()
    };
    assert_eq!(ino("usr/lib/libc.so"), ino("usr/lib/libc.so.6"));
    assert_eq!(
        std::fs::read_link(base.join("lib")).ok(),
        Some(PathBuf::from("usr/lib"))
    );
}

#[test]
fn an_oci_layout_tar_imports_the_same_template_as_its_directory() {
    if skip_unless_root("oci layout tar") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().join("layout");
    three_layers().write_oci(&dir);
    let tar = tmp.path().join("layout.tar");
    tar_dir(&dir, &tar);
    let (_d, store) = store();
    let from_tar = store
        .import_archive(&tar, "from-tar")
        .unwrap_or_else(|e| panic!("import tar: {e}"));
    let from_dir = store
        .import_archive(&dir, "from-dir")
        .unwrap_or_else(|e| panic!("import dir: {e}"));
    assert_eq!(from_tar.digest, from_dir.digest);
    let r = store
        .resolve("from-tar")
        .unwrap_or_else(|e| panic!("resolve: {e}"));
    check_defaults(&r.config);
    check_the_view(&r.lower_dirs);
}

#[test]
fn a_docker_save_archive_imports_with_its_config_defaults() {
    if skip_unless_root("docker save") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let archive = tmp.path().join("saved.tar");
    three_layers().write_docker_save(&archive);
    let (_d, store) = store();
    let t = store
        .import_archive(&archive, "saved")
        .unwrap_or_else(|e| panic!("import: {e}"));
    // docker save layers are plain tar: blob digest = diff_id.
    for l in &t.manifest.layers {
        assert_eq!(l.digest, l.diff_id);
        assert_eq!(l.media_type, "application/vnd.oci.image.layer.v1.tar");
    }
    let r = store
        .resolve("saved:latest")
        .unwrap_or_else(|e| panic!("resolve: {e}"));
    check_defaults(&r.config);
    check_the_view(&r.lower_dirs);
    assert_eq!(r.manifest.created.as_deref(), Some("2026-01-02T03:04:05Z"));
}

#[test]
fn an_index_of_several_platforms_imports_the_hosts_and_refuses_when_none_fits() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().join("layout");
    let image = Image::new(vec![(
        Layer::new().file("hello", b"hi", 0o644).tar(),
        Comp::Gzip,
    )]);
    image.write_oci(&dir);
    let index_of = |arches: &[&str]| {
        let manifest = image.manifest_bytes();
        let d = space_image::Digest::of(&manifest);
        let manifests: Vec<_> = arches
            .iter()
            .map(|a| {
                serde_json::json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": d.to_string(),
                    "size": manifest.len(),
                    "platform": {"os": "linux", "architecture": a},
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": manifests}))
            .unwrap_or_default()
    };
    let host = space_image::oci::host_architecture();
    std::fs::write(
        dir.join("index.json"),
        index_of(&["s390x", host, "riscv64"]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (_d, store) = store();
    store
        .import_archive(&dir, "multi")
        .unwrap_or_else(|e| panic!("import: {e}"));
    std::fs::write(dir.join("index.json"), index_of(&["s390x", "riscv64"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let err = store
        .import_archive(&dir, "other")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("no manifest for linux/"), "{err}");
    assert!(err.contains("linux/s390x, linux/riscv64"), "{err}");
}

/// Not root: a layer without whiteouts still imports (owners are the caller's).
#[test]
fn a_layer_without_whiteouts_imports_and_lists() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().join("layout");
    Image::new(vec![(
        Layer::new()
            .dir("etc", 0o755)
            .file("etc/hostname", b"box", 0o644)
            .tar(),
        Comp::Zstd,
    )])
    .write_oci(&dir);
    let (_d, store) = store();
    let t = store
        .import_archive(&dir, "plain")
        .unwrap_or_else(|e| panic!("import: {e}"));
    let list = store.list().unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].digest, t.digest);
    assert_eq!(list[0].layers, 1);
    assert_eq!(
        list[0].name.as_ref().map(|n| n.to_string()).as_deref(),
        Some("plain:latest")
    );
    assert!(
        list[0].size >= 3 + t.manifest.layers[0].size,
        "{:?}",
        list[0]
    );
    let r = store.resolve("plain").unwrap_or_else(|e| panic!("{e}"));
    let content = std::fs::read(Path::new(&r.lower_dirs[0]).join("etc/hostname")).ok();
    assert_eq!(content.as_deref(), Some(&b"box"[..]));
}
