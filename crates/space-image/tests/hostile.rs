//! Hostile images: each test builds a layer (or an archive) that attacks the host or
//! the store and checks that the import is refused — or the entry neutralised — and
//! that nothing outside the store was touched.

mod common;

use std::path::Path;

use common::{Comp, Image, Layer, blob_files, is_root, layer_dirs, one_layer_image};
use space_image::{Digest, ImageError, Store};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(dir.path().join("images")).unwrap_or_else(|e| panic!("{e}"));
    (dir, store)
}

/// Imports `image` into a fresh store and gives the error (panics on success); the
/// store has no layer, blob or template afterwards.
fn refused(image: &Path) -> ImageError {
    let (_d, store) = store();
    let err = match store.import_archive(image, "hostile") {
        Ok(t) => panic!("a hostile image was imported: {t:?}"),
        Err(e) => e,
    };
    assert_eq!(layer_dirs(store.root()), 0, "a layer was kept");
    assert_eq!(blob_files(store.root()), 0, "a blob was kept");
    assert!(store.list().is_ok_and(|l| l.is_empty()));
    err
}

fn unique(name: &str) -> String {
    format!(
        "{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    )
    .replace(['(', ')'], "")
}

/// Removes a host file a failed defence let through (also when the test fails).
struct HostFile(std::path::PathBuf);

impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The directory of the only layer of `t`.
fn only_layer(store: &Store, t: &space_image::Template) -> std::path::PathBuf {
    store
        .root()
        .join("layers")
        .join(t.manifest.layers[0].diff_id.hex())
}

#[test]
fn a_symlink_to_root_then_a_file_through_it_lands_in_the_layer_and_the_host_untouched() {
    // `evil -> /` resolves in the image's root, as in a chroot: `evil/etc/x` is the
    // image's `/etc/x`, written into the layer, never the host's.
    let victim = format!("etc/{}", unique("space-pwned"));
    let host = HostFile(Path::new("/").join(&victim));
    let (_t, image) = one_layer_image(Layer::new().symlink("evil", "/").file(
        &format!("evil/{victim}"),
        b"pwned",
        0o644,
    ));
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "through-root")
        .unwrap_or_else(|e| panic!("import: {e}"));
    assert!(
        !host.0.exists(),
        "the host's {} was written",
        host.0.display()
    );
    let dir = only_layer(&store, &t);
    assert_eq!(
        std::fs::read(dir.join(&victim)).ok(),
        Some(b"pwned".to_vec())
    );
    assert_eq!(std::fs::read_link(dir.join("evil")).ok(), Some("/".into()));
}

#[test]
fn a_directory_replaced_by_a_symlink_to_a_host_path_keeps_later_entries_in_the_layer() {
    // `a` is a directory when `a/first` is written, a link to a host directory when
    // `a/second` is: that lands at the host directory's path *in the layer*.
    let target = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let link = target.path().display().to_string();
    let (_t, image) = one_layer_image(
        Layer::new()
            .dir("a", 0o755)
            .file("a/first", b"1", 0o644)
            .symlink("a", &link)
            .file("a/second", b"2", 0o644),
    );
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "replaced")
        .unwrap_or_else(|e| panic!("import: {e}"));
    assert!(
        !target.path().join("second").exists(),
        "a file was written through the symlink on the host"
    );
    let dir = only_layer(&store, &t);
    let inside = dir.join(link.trim_start_matches('/')).join("second");
    assert_eq!(std::fs::read(&inside).ok(), Some(b"2".to_vec()));
    assert!(
        !dir.join("a/first").exists(),
        "the replaced directory is gone"
    );
}

#[test]
fn a_path_through_a_symlink_loop_or_a_file_is_refused() {
    let (_t, image) = one_layer_image(
        Layer::new()
            .symlink("loop", "loop/x")
            .file("loop/y", b"", 0o644),
    );
    let err = refused(&image);
    assert!(
        err.to_string().contains("more than 40 symbolic links"),
        "{err}"
    );
    let (_t, image) = one_layer_image(
        Layer::new()
            .file("plain", b"", 0o644)
            .symlink("to-plain", "plain")
            .file("to-plain/y", b"", 0o644),
    );
    let err = refused(&image);
    assert!(
        err.to_string().contains("\"plain\", not a directory"),
        "{err}"
    );
}

#[test]
fn a_symlink_pointing_outside_is_kept_as_a_link_and_never_followed() {
    let (_t, image) = one_layer_image(
        Layer::new()
            .symlink("etc-of-host", "/etc")
            .symlink("up", "../../../../.."),
    );
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "links")
        .unwrap_or_else(|e| panic!("import: {e}"));
    let dir = store
        .root()
        .join("layers")
        .join(t.manifest.layers[0].diff_id.hex());
    assert_eq!(
        std::fs::read_link(dir.join("etc-of-host")).ok(),
        Some("/etc".into())
    );
    assert_eq!(
        std::fs::read_link(dir.join("up")).ok(),
        Some("../../../../..".into())
    );
}

#[test]
fn an_absolute_path_lands_inside_the_layer() {
    let name = unique("space-absolute");
    let (_t, image) = one_layer_image(Layer::new().file(&format!("/tmp/{name}"), b"in", 0o644));
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "absolute")
        .unwrap_or_else(|e| panic!("import: {e}"));
    assert!(
        !Path::new("/tmp").join(&name).exists(),
        "the host's /tmp was written"
    );
    let dir = store
        .root()
        .join("layers")
        .join(t.manifest.layers[0].diff_id.hex());
    assert_eq!(
        std::fs::read(dir.join("tmp").join(&name)).ok(),
        Some(b"in".to_vec())
    );
}

#[test]
fn a_dotdot_path_that_climbs_out_of_the_layer_is_refused() {
    let name = unique("space-climb");
    let (t, image) = one_layer_image(Layer::new().dir("a", 0o755).file(
        &format!("a/../../../{name}"),
        b"out",
        0o644,
    ));
    let err = refused(&image);
    assert!(matches!(err, ImageError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("climbs out"), "{err}");
    assert!(!t.path().join(&name).exists());
    // `..` that stays inside is only a path.
    let (_t2, image) = one_layer_image(Layer::new().dir("a", 0o755).file("a/../b", b"b", 0o644));
    let (_d, store) = store();
    let t = store
        .import_archive(&image, "inside")
        .unwrap_or_else(|e| panic!("import: {e}"));
    let dir = store
        .root()
        .join("layers")
        .join(t.manifest.layers[0].diff_id.hex());
    assert_eq!(std::fs::read(dir.join("b")).ok(), Some(b"b".to_vec()));
}

#[test]
fn a_hard_link_to_etc_shadow_is_refused() {
    let (_t, image) = one_layer_image(Layer::new().hardlink("shadow", "/etc/shadow"));
    let err = refused(&image);
    assert!(matches!(err, ImageError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("not a file of this layer"),
        "{err}"
    );
    let (_t, image) = one_layer_image(Layer::new().hardlink("shadow", "../../../../etc/shadow"));
    assert!(refused(&image).to_string().contains("climbs out"));
}

#[test]
fn a_hard_link_through_a_symlink_of_the_layer_is_refused() {
    let (_t, image) = one_layer_image(
        Layer::new()
            .symlink("etc", "/etc")
            .hardlink("shadow", "etc/shadow"),
    );
    let err = refused(&image);
    assert!(err.to_string().contains("hard link target"), "{err}");
}

#[test]
fn a_character_device_is_refused() {
    let (_t, image) = one_layer_image(Layer::new().dir("dev", 0o755).char_device("dev/mem", 1, 1));
    let err = refused(&image);
    assert!(matches!(err, ImageError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("device nodes are refused"),
        "{err}"
    );
}

#[test]
fn an_owner_outside_the_sandbox_id_range_is_refused() {
    let (_t, image) = one_layer_image(Layer::new().file_owned("f", b"", 0o644, 65_536, 0));
    let err = refused(&image);
    assert!(
        err.to_string().contains("outside the sandbox id range"),
        "{err}"
    );
    let (_t, image) = one_layer_image(Layer::new().dir_owned("d", 0o755, 0, 1 << 20));
    assert!(
        refused(&image)
            .to_string()
            .contains("outside the sandbox id range")
    );
}

#[test]
fn a_blob_whose_digest_does_not_match_is_refused() {
    let (t, image) = one_layer_image(Layer::new().file("f", b"genuine", 0o644));
    // The blob the manifest names, with other content (a valid layer all the same).
    let manifest = std::fs::read(image.join("index.json")).unwrap_or_default();
    let index: serde_json::Value = serde_json::from_slice(&manifest).unwrap_or_default();
    let md: Digest = index["manifests"][0]["digest"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no manifest digest"));
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(image.join("blobs/sha256").join(md.hex())).unwrap_or_default(),
    )
    .unwrap_or_default();
    let layer: Digest = m["layers"][0]["digest"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no layer digest"));
    // The same tar stream (its diff_id matches) in another blob: only the blob's
    // digest tells.
    let tar = Layer::new().file("f", b"genuine", 0o644).tar();
    let other = common::compress(&tar, Comp::Zstd);
    std::fs::write(image.join("blobs/sha256").join(layer.hex()), &other)
        .unwrap_or_else(|e| panic!("{e}"));
    let err = refused(&image);
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("layer blob"), "{err}");
    drop(t);
}

#[test]
fn a_layer_whose_diff_id_does_not_match_is_refused() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut image = Image::new(vec![(
        Layer::new().file("f", b"x", 0o644).tar(),
        Comp::Zstd,
    )]);
    image.config["rootfs"]["diff_ids"][0] = Digest::of(b"another tar").to_string().into();
    let dir = tmp.path().join("layout");
    image.write_oci(&dir);
    let err = refused(&dir);
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("diff_id"), "{err}");
}

#[test]
fn an_oversized_json_is_refused() {
    let (_t, image) = one_layer_image(&mut Layer::new());
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(image.join("index.json")).unwrap_or_default())
            .unwrap_or_default();
    index["annotations"] = serde_json::json!({"padding": "x".repeat(5 << 20)});
    std::fs::write(
        image.join("index.json"),
        serde_json::to_vec(&index).unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let err = refused(&image);
    assert!(matches!(err, ImageError::Limit { .. }), "{err}");
    assert!(err.to_string().contains("index.json"), "{err}");
}

#[test]
fn a_long_name_past_the_path_limit_is_refused_before_it_is_read() {
    let (_t, image) = one_layer_image(Layer::new().long_name(64 << 10).file("x", b"", 0o644));
    let err = refused(&image);
    assert!(matches!(err, ImageError::Limit { .. }), "{err}");
    assert!(err.to_string().contains("long name"), "{err}");
}

#[test]
fn whiteouts_need_root_and_say_so() {
    if is_root() {
        eprintln!("whiteouts_need_root_and_say_so: skipped as root (whiteouts are allowed)");
        return;
    }
    let (_t, image) = one_layer_image(Layer::new().whiteout("gone"));
    let err = refused(&image);
    assert!(err.to_string().contains("whiteouts need root"), "{err}");
}

#[test]
fn a_path_that_links_make_longer_than_path_max_is_refused() {
    // `x` is a link to a path 3,001 bytes long; `x/e/e/…/f` (1,205 bytes) resolves
    // to more than 4,096: links chained this way would make trees of any depth.
    let deep = format!("{}d", "d/".repeat(1500));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_link(&mut h, "x", &deep)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    let name = format!("x/{}e/f", "e/".repeat(600));
    b.append_data(&mut h, &name, &[][..])
        .unwrap_or_else(|e| panic!("{e}"));
    let tar = b.into_inner().unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = tmp.path().join("image");
    Image::new(vec![(tar, Comp::Gzip)]).write_oci(&image);
    let err = refused(&image);
    assert!(
        err.to_string().contains("resolves to more than 4096 bytes"),
        "{err}"
    );
}

#[test]
fn a_path_whose_links_take_too_many_lookups_to_resolve_is_refused() {
    // `up` leads 150 directories down and 150 back up: each `..` looks the path up
    // again from the root, so the one path costs 11,000 lookups.
    let deep = "a/".repeat(150);
    let header = |kind: tar::EntryType, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    };
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(
        &mut header(tar::EntryType::Directory, 0o755),
        &deep,
        &[][..],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let target = format!("{deep}{}", "../".repeat(150));
    b.append_link(&mut header(tar::EntryType::Symlink, 0o777), "up", &target)
        .unwrap_or_else(|e| panic!("{e}"));
    b.append_data(&mut header(tar::EntryType::Regular, 0o644), "up/f", &[][..])
        .unwrap_or_else(|e| panic!("{e}"));
    let tar = b.into_inner().unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = tmp.path().join("image");
    Image::new(vec![(tar, Comp::Gzip)]).write_oci(&image);
    let err = refused(&image);
    assert!(err.to_string().contains("too many names"), "{err}");
}

#[test]
fn a_layer_whose_entries_all_go_through_links_stops_at_its_lookup_bound() {
    // Each entry under a link of its own: every one is resolved from the root (two
    // names looked up: its link, and where it leads). With a bound of 10 lookups the
    // sixth entry passes it.
    let mut layer = Layer::new();
    layer.dir("real", 0o755);
    for i in 0..20 {
        layer.symlink(&format!("l{i}"), "real");
        layer.file(&format!("l{i}/f{i}"), b"", 0o644);
    }
    let tar = layer.tar();
    let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = space_image::UnpackOptions {
        max_lookups: 10,
        ..Default::default()
    };
    let err = match space_image::unpack("test", &tar[..], dest.path(), &options) {
        Ok(s) => panic!("unpacked past the bound: {s:?}"),
        Err(e) => e,
    };
    assert!(err.to_string().contains("10 for the layer"), "{err}");
    assert!(err.to_string().contains("l5/f5"), "{err}");
    // With the default bound, the same layer unpacks, every file behind its link.
    let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    space_image::unpack("test", &tar[..], dest.path(), &Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(dest.path().join("real/f19").is_file());
}
