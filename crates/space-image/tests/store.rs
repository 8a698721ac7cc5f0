//! The store: layers shared between templates, removal and collection, installs from
//! elsewhere, concurrent imports.

mod common;

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{Comp, Image, Layer, blob_files, layer_dirs};
use space_image::{Digest, ImageError, Store};

fn base_layer() -> Vec<u8> {
    Layer::new()
        .dir("etc", 0o755)
        .file("etc/os-release", b"ID=base\n", 0o644)
        .file("usr/bin/tool", b"tool", 0o755)
        .tar()
}

/// An OCI layout of the base layer plus one layer holding `extra`.
fn image_with(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join(extra);
    Image::new(vec![
        (base_layer(), Comp::Gzip),
        (
            Layer::new().file(extra, extra.as_bytes(), 0o644).tar(),
            Comp::Zstd,
        ),
    ])
    .write_oci(&path);
    path
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(dir.path().join("images")).unwrap_or_else(|e| panic!("{e}"));
    (dir, store)
}

fn ok<T>(r: space_image::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_second_import_of_the_same_layers_stores_none_twice() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let a = image_with(tmp.path(), "a");
    let (_d, store) = store();
    let one = ok(store.import_archive(&a, "one"));
    assert_eq!((layer_dirs(store.root()), blob_files(store.root())), (2, 2));
    let base_dir = store
        .root()
        .join("layers")
        .join(one.manifest.layers[0].diff_id.hex());
    let inode = |p: &Path| {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap_or_else(|e| panic!("{e}")))
    };
    let base_inode = inode(&base_dir.join("etc/os-release"));
    // The same image under another name: the same template, nothing new stored.
    let two = ok(store.import_archive(&a, "two:v2"));
    assert_eq!(two.digest, one.digest);
    assert_eq!((layer_dirs(store.root()), blob_files(store.root())), (2, 2));
    // Another image on the same base: one layer more, the base's files the same inodes.
    let b = image_with(tmp.path(), "b");
    let three = ok(store.import_archive(&b, "three"));
    assert_ne!(three.digest, one.digest);
    assert_eq!((layer_dirs(store.root()), blob_files(store.root())), (3, 3));
    assert_eq!(inode(&base_dir.join("etc/os-release")), base_inode);
    let r1 = ok(store.resolve("one"));
    let r3 = ok(store.resolve("three"));
    assert_eq!(r1.lower_dirs.last(), r3.lower_dirs.last());
    let names: Vec<String> = ok(store.list())
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect();
    assert_eq!(names, ["one:latest", "three:latest", "two:v2"]);
}

#[test]
fn remove_refuses_a_template_in_use_and_collects_unreferenced_layers() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d, store) = store();
    let a = ok(store.import_archive(&image_with(tmp.path(), "a"), "a"));
    let b = ok(store.import_archive(&image_with(tmp.path(), "b"), "b"));
    assert_eq!(layer_dirs(store.root()), 3);
    let err = store.remove("a", &|d| *d == a.digest);
    assert!(matches!(err, Err(ImageError::InUse(_))), "{err:?}");
    assert!(
        store.resolve("a").is_ok(),
        "a refused removal removed something"
    );
    let removed = ok(store.remove("a", &|d| *d == b.digest));
    assert_eq!(
        (removed.template, removed.layers, removed.blobs),
        (Some(a.digest), 1, 1)
    );
    assert!(matches!(store.resolve("a"), Err(ImageError::NotFound(_))));
    // b keeps the shared base.
    let r = ok(store.resolve("b"));
    assert!(r.lower_dirs.iter().all(|d| d.is_dir()));
    assert_eq!(layer_dirs(store.root()), 2);
    let removed = ok(store.remove(&b.digest.to_string(), &|_| false));
    assert_eq!((removed.layers, removed.blobs), (2, 2));
    assert_eq!((layer_dirs(store.root()), blob_files(store.root())), (0, 0));
    assert!(ok(store.list()).is_empty());
}

#[test]
fn a_name_removed_while_another_keeps_its_template_removes_no_layer() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d, store) = store();
    let path = image_with(tmp.path(), "a");
    let t = ok(store.import_archive(&path, "a"));
    ok(store.import_archive(&path, "alias"));
    // In use, but "alias" keeps it: the name alone goes.
    let removed = ok(store.remove("a", &|d| *d == t.digest));
    assert_eq!(removed, space_image::Removed::default());
    assert_eq!(ok(store.resolve("alias")).digest, t.digest);
}

#[test]
fn a_name_keeps_its_digest_until_it_is_removed() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d, store) = store();
    ok(store.import_archive(&image_with(tmp.path(), "a"), "name"));
    let err = store.import_archive(&image_with(tmp.path(), "b"), "name");
    assert!(matches!(err, Err(ImageError::Exists(_))), "{err:?}");
}

#[test]
fn a_template_installed_from_another_store_has_every_blob_verified() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d1, source) = store();
    let t = ok(source.import_archive(&image_with(tmp.path(), "a"), "a"));
    let manifest = t.manifest.canonical_json();
    let (_d2, target) = store();
    let from_source = |d: &Digest| {
        source
            .blob_path(d)
            .ok_or_else(|| std::io::Error::other("no such blob"))
            .and_then(File::open)
    };
    // A blob that is not the one named.
    let forged = |_: &Digest| {
        Ok(std::io::Cursor::new(common::compress(
            &base_layer(),
            Comp::Plain,
        )))
    };
    let err = target.install(Some("a"), &manifest, &t.digest, forged);
    assert!(
        matches!(err, Err(ImageError::DigestMismatch { .. })),
        "{err:?}"
    );
    assert_eq!(
        (layer_dirs(target.root()), blob_files(target.root())),
        (0, 0)
    );
    // A manifest that is not the one named.
    let other = Digest::of(b"another manifest");
    let err = target.install(Some("a"), &manifest, &other, from_source);
    assert!(
        matches!(err, Err(ImageError::DigestMismatch { .. })),
        "{err:?}"
    );
    let got = ok(target.install(None, &manifest, &t.digest, from_source));
    assert_eq!(got.digest, t.digest);
    let r = ok(target.resolve(&t.digest.to_string()));
    assert_eq!(
        std::fs::read(r.lower_dirs[0].join("a")).ok(),
        Some(b"a".to_vec())
    );
    let list = ok(target.list());
    assert_eq!((list.len(), list[0].name.is_none()), (1, true));
    // Installed again, nothing is fetched.
    let mut fetched = 0;
    ok(target.install(Some("named"), &manifest, &t.digest, |d| {
        fetched += 1;
        from_source(d)
    }));
    assert_eq!(fetched, 0);
}

#[test]
fn concurrent_imports_of_one_image_unpack_each_layer_once() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = image_with(tmp.path(), "a");
    let (_d, store) = store();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (store, path) = (store.clone(), path.clone());
                s.spawn(move || {
                    store
                        .import_archive(&path, &format!("t{i}"))
                        .map(|t| t.digest)
                })
            })
            .collect();
        let digests: Vec<Digest> = handles
            .into_iter()
            .map(|h| ok(h.join().unwrap_or_else(|_| panic!("an import panicked"))))
            .collect();
        assert!(digests.windows(2).all(|w| w[0] == w[1]));
    });
    assert_eq!((layer_dirs(store.root()), blob_files(store.root())), (2, 2));
}

/// Imports the image at `path` into `source` and installs it into `target` by digest
/// only, as a worker receives a template from the control plane.
fn install_from(source: &Store, target: &Store, path: &Path, name: &str) -> Digest {
    let t = ok(source.import_archive(path, name));
    let from_source = |d: &Digest| {
        source
            .blob_path(d)
            .ok_or_else(|| std::io::Error::other("no such blob"))
            .and_then(File::open)
    };
    ok(target.install(None, &t.manifest.canonical_json(), &t.digest, from_source)).digest
}

fn tmp_entries(store_root: &Path) -> usize {
    std::fs::read_dir(store_root.join("tmp")).map_or(0, Iterator::count)
}

#[test]
fn retain_removes_the_templates_not_kept_and_only_the_layers_no_other_uses() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d1, source) = store();
    let (_d2, worker) = store();
    let a = install_from(&source, &worker, &image_with(tmp.path(), "a"), "a");
    let b = install_from(&source, &worker, &image_with(tmp.path(), "b"), "b");
    assert_eq!(layer_dirs(worker.root()), 3);
    let later = SystemTime::now() + Duration::from_secs(5);
    let swept = ok(worker.retain(&HashSet::from([a]), later))
        .unwrap_or_else(|| panic!("the store was busy"));
    assert_eq!(
        (swept.templates, swept.layers, swept.blobs),
        (vec![b], 1, 1)
    );
    assert!(matches!(
        worker.resolve(&b.to_string()),
        Err(ImageError::NotFound(_))
    ));
    // a keeps the shared base, and every layer of its own.
    let r = ok(worker.resolve(&a.to_string()));
    assert!(
        r.lower_dirs
            .iter()
            .all(|d| d.join("etc").exists() || d.join("a").is_file())
    );
    assert_eq!(
        (layer_dirs(worker.root()), blob_files(worker.root())),
        (2, 2)
    );
    // Out of the store at once, its files deleted with the trash.
    assert_eq!(tmp_entries(worker.root()), 1);
    drop(swept.trash);
    assert_eq!(
        tmp_entries(worker.root()),
        0,
        "a removed layer was left in tmp/"
    );
    let swept =
        ok(worker.retain(&HashSet::new(), later)).unwrap_or_else(|| panic!("the store was busy"));
    assert_eq!(
        (swept.templates, swept.layers, swept.blobs),
        (vec![a], 2, 2)
    );
    assert_eq!(
        (layer_dirs(worker.root()), blob_files(worker.root())),
        (0, 0)
    );
}

#[test]
fn retain_keeps_templates_installed_after_its_list_and_named_ones() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d1, source) = store();
    let (_d2, worker) = store();
    let before = SystemTime::now() - Duration::from_secs(5);
    let a = install_from(&source, &worker, &image_with(tmp.path(), "a"), "a");
    let named = ok(worker.import_archive(&image_with(tmp.path(), "n"), "named"));
    // Installed after the list was made: it may be what the list is too old to name.
    let swept =
        ok(worker.retain(&HashSet::new(), before)).unwrap_or_else(|| panic!("the store was busy"));
    assert_eq!(
        (swept.templates.len(), swept.layers, swept.blobs),
        (0, 0, 0)
    );
    let later = SystemTime::now() + Duration::from_secs(5);
    let swept =
        ok(worker.retain(&HashSet::new(), later)).unwrap_or_else(|| panic!("the store was busy"));
    assert_eq!(swept.templates, vec![a]);
    // A name is removed by `remove`, never by a list.
    assert_eq!(ok(worker.resolve("named")).digest, named.digest);
}

#[test]
fn retain_while_an_import_holds_the_store_waits_for_nothing_and_removes_nothing() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_d1, source) = store();
    let (_d2, worker) = store();
    let a = install_from(&source, &worker, &image_with(tmp.path(), "a"), "a");
    // An import under way holds the store's lock shared for as long as it unpacks.
    let lock = File::open(worker.root().join("lock")).unwrap_or_else(|e| panic!("{e}"));
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared)
        .unwrap_or_else(|e| panic!("{e}"));
    let later = SystemTime::now() + Duration::from_secs(5);
    assert!(ok(worker.retain(&HashSet::new(), later)).is_none());
    assert!(worker.resolve(&a.to_string()).is_ok());
    drop(lock);
    let swept = ok(worker.retain(&HashSet::new(), later));
    assert_eq!(swept.map(|s| s.templates), Some(vec![a]));
}
