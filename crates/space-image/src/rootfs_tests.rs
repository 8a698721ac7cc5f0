use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use std::fs::{self, File};

use super::*;
use crate::oci::host_architecture;
use crate::store::Store;

fn ok<T, E: std::fmt::Display>(r: std::result::Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A header of `kind` with an owner, a mode and a fixed time.
fn header(kind: EntryType, mode: u32, uid: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_mtime(1_700_000_000);
    h.set_size(size);
    h
}

const LONG: &str = "usr/share/a-directory-whose-name-is-long-enough/that-the-path-passes/\
                    the-hundred-bytes-of-a-plain-tar-header/file.txt";

/// A root filesystem as `mmdebstrap … out.tar` writes it: `./`-prefixed names, a
/// usrmerge symlink, a device node, a hard link, a long path, a user's files.
fn rootfs_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let dir = |b: &mut tar::Builder<Vec<u8>>, p: &str, mode, uid| {
        ok(b.append_data(
            &mut header(EntryType::Directory, mode, uid, 0),
            p,
            io::empty(),
        ));
    };
    dir(&mut b, "./", 0o755, 0);
    for d in ["./etc/", "./usr/", "./usr/bin/", "./dev/", "./tmp/"] {
        dir(&mut b, d, 0o755, 0);
    }
    dir(&mut b, "./home/", 0o755, 0);
    dir(&mut b, "./home/user/", 0o750, 1000);
    let file = |b: &mut tar::Builder<Vec<u8>>, p: &str, mode, uid, data: &[u8]| {
        let mut h = header(EntryType::Regular, mode, uid, data.len() as u64);
        ok(b.append_data(&mut h, p, data));
    };
    file(&mut b, "./etc/os-release", 0o644, 0, b"ID=debian\n");
    file(&mut b, "./etc/motd", 0o644, 0, b"welcome\n");
    file(&mut b, "./usr/bin/sh", 0o755, 0, b"#!shell\n");
    file(&mut b, "./home/user/.profile", 0o600, 1000, b"umask 022\n");
    file(&mut b, &format!("./{LONG}"), 0o644, 0, b"long\n");
    let mut h = header(EntryType::Symlink, 0o777, 0, 0);
    ok(b.append_link(&mut h, "./bin", "usr/bin"));
    let mut h = header(EntryType::Link, 0o755, 0, 0);
    ok(b.append_link(&mut h, "./usr/bin/dash", "./usr/bin/sh"));
    let mut h = header(EntryType::Char, 0o666, 0, 0);
    ok(h.set_device_major(1));
    ok(h.set_device_minor(3));
    ok(b.append_data(&mut h, "./dev/null", io::empty()));
    ok(b.into_inner())
}

fn spec() -> ImageSpec {
    ImageSpec::debian(None)
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = ok(tempfile::tempdir());
    let store = ok(Store::open(dir.path().join("images")));
    (dir, store)
}

/// The entries of a gzip layer blob: `path kind size` (whiteouts included as the
/// files they are).
fn entries_of(blob: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(blob));
    for e in ok(a.entries()) {
        let e = ok(e);
        let kind = match e.header().entry_type() {
            EntryType::Directory => "d",
            EntryType::Regular => "f",
            EntryType::Symlink => "l",
            EntryType::Link => "h",
            _ => "?",
        };
        out.push(format!(
            "{} {kind} {}",
            ok(e.path()).display(),
            e.header().entry_size().unwrap_or(0)
        ));
    }
    out
}

#[test]
fn a_root_filesystem_becomes_an_image_the_store_imports_with_its_files() {
    if !is_root() {
        eprintln!("skipped: needs root (the store keeps the layer's owners)");
        return;
    }
    let work = ok(tempfile::tempdir());
    let rootfs = rootfs_tar();
    for format in [LayoutFormat::Tar, LayoutFormat::Dir] {
        let out = work.path().join(format!("image-{format:?}"));
        let (blob, _) = ok(layout_from_rootfs(&rootfs[..], &spec(), &out, format));
        assert_eq!(blob.skipped, 1, "the device node is left out");
        let (_d, store) = store();
        let t = ok(store.import_archive(&out, "debian:bookworm"));
        assert_eq!(t.manifest.layers, vec![blob.record()]);
        assert_eq!(t.manifest.config, spec().defaults);
        assert_eq!(t.manifest.architecture, host_architecture());
        let r = ok(store.resolve("debian:bookworm"));
        let root = &r.lower_dirs[0];
        assert_eq!(ok(fs::read(root.join("etc/os-release"))), b"ID=debian\n");
        assert_eq!(ok(fs::read(root.join(LONG))), b"long\n");
        assert_eq!(ok(fs::read_link(root.join("bin"))), Path::new("usr/bin"));
        let sh = ok(fs::metadata(root.join("usr/bin/sh")));
        assert_eq!(sh.mode() & 0o7777, 0o755);
        let dash = ok(fs::metadata(root.join("usr/bin/dash")));
        assert_eq!(dash.ino(), sh.ino(), "the hard link is one file");
        let home = ok(fs::symlink_metadata(root.join("home/user")));
        assert_eq!((home.uid(), home.mode() & 0o7777), (1000, 0o750));
        assert!(!root.join("dev/null").exists(), "device nodes stay out");
        assert!(root.join("dev").is_dir());
    }
}

#[test]
fn the_same_root_filesystem_gives_the_same_digests() {
    let work = ok(tempfile::tempdir());
    let rootfs = rootfs_tar();
    let build = |name: &str, spec: &ImageSpec| {
        ok(layout_from_rootfs(
            &rootfs[..],
            spec,
            &work.path().join(name),
            LayoutFormat::Tar,
        ))
    };
    let (a, la) = build("a.tar", &spec());
    let (b, lb) = build("b.tar", &spec());
    assert_eq!(
        (a.digest, a.diff_id, la.manifest),
        (b.digest, b.diff_id, lb.manifest)
    );
    assert_eq!(
        ok(fs::read(work.path().join("a.tar"))),
        ok(fs::read(work.path().join("b.tar")))
    );
    // The time of the build is in the config, not in the layer.
    let (c, lc) = build(
        "c.tar",
        &ImageSpec::debian(Some("2026-01-02T03:04:05Z".into())),
    );
    assert_eq!(c.digest, a.digest);
    assert_ne!(lc.manifest, la.manifest);
    // The diff_id is the tar stream's, the digest the gzip blob's.
    let mut blob = Vec::new();
    let out = ok(layer_from_rootfs(&rootfs[..], &mut blob));
    assert_eq!(out.digest, Digest::of(&blob));
    let mut tar = Vec::new();
    ok(flate2::read::GzDecoder::new(&blob[..]).read_to_end(&mut tar));
    assert_eq!(out.diff_id, Digest::of(&tar));
    assert_eq!(out.size, blob.len() as u64);
}

#[test]
fn blobs_only_import_of_a_built_image_gives_the_stores_digest() {
    let work = ok(tempfile::tempdir());
    let out = work.path().join("image.tar");
    let (blob, _) = ok(layout_from_rootfs(
        &rootfs_tar()[..],
        &spec(),
        &out,
        LayoutFormat::Tar,
    ));
    let manifest = ok(crate::blobs::import_blobs(&out, &work.path().join("blobs")));
    assert_eq!(manifest.layers, vec![blob.record()]);
    if is_root() {
        let (_d, store) = store();
        let t = ok(store.import_archive(&out, "x"));
        assert_eq!(t.digest, manifest.digest());
    }
}

fn refusal(rootfs: Vec<u8>) -> String {
    match layer_from_rootfs(&rootfs[..], io::sink()) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_rootfs_entry_climbing_out_or_named_like_a_whiteout_is_refused() {
    // `..` in a name: the `tar` crate will not write one, so the bytes are set.
    let mut h = header(EntryType::Regular, 0o644, 0, 1);
    h.as_old_mut().name[..13].copy_from_slice(b"etc/../../sha");
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    ok(b.append(&h, &b"x"[..]));
    let e = refusal(ok(b.into_inner()));
    assert!(e.contains("etc/../../sha") && e.contains("`..`"), "{e}");

    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_data(
        &mut header(EntryType::Regular, 0o644, 0, 0),
        "etc/.wh.passwd",
        io::empty(),
    ));
    let e = refusal(ok(b.into_inner()));
    assert!(e.contains(".wh.passwd") && e.contains("whiteout"), "{e}");

    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(EntryType::Link, 0o644, 0, 0);
    h.as_old_mut().name[..6].copy_from_slice(b"shadow");
    h.as_old_mut().linkname[..16].copy_from_slice(b"../../etc/shadow");
    h.set_cksum();
    ok(b.append(&h, io::empty()));
    let e = refusal(ok(b.into_inner()));
    assert!(e.contains("hard link out of the tree"), "{e}");
}

#[test]
fn a_compressed_root_filesystem_is_read_as_well() {
    let plain = rootfs_tar();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    ok(gz.write_all(&plain));
    let gz = ok(gz.finish());
    let a = ok(layer_from_rootfs(&plain[..], io::sink()));
    let b = ok(layer_from_rootfs(&gz[..], io::sink()));
    assert_eq!(a, b);
}

// ---- the writable layer as a layer ------------------------------------------------

/// An upper directory's archive as the worker's snapshot writes it: a whiteout is an
/// empty file with a `SPACE.whiteout` record, an opaque directory carries its xattr.
fn upper_archive() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_data(
        &mut header(EntryType::Directory, 0o755, 0, 0),
        "etc",
        io::empty(),
    ));
    ok(b.append_pax_extensions([(
        std::str::from_utf8(SNAPSHOT_WHITEOUT_KEY).unwrap_or(""),
        &b"1"[..],
    )]));
    ok(b.append_data(
        &mut header(EntryType::Regular, 0, 0, 0),
        "etc/motd",
        io::empty(),
    ));
    ok(b.append_pax_extensions([("SCHILY.xattr.trusted.overlay.opaque", &b"y"[..])]));
    ok(b.append_data(
        &mut header(EntryType::Directory, 0o750, 1000, 0),
        "home/user",
        io::empty(),
    ));
    let mut h = header(EntryType::Regular, 0o600, 1000, 4);
    ok(b.append_data(&mut h, "home/user/new", &b"new\n"[..]));
    let mut h = header(EntryType::Regular, 0o644, 0, 3);
    ok(b.append_data(&mut h, "greeting", &b"hi\n"[..]));
    // A plain tar of the directory shows a whiteout as the 0/0 device it is.
    let mut h = header(EntryType::Char, 0, 0, 0);
    ok(h.set_device_major(0));
    ok(h.set_device_minor(0));
    ok(b.append_data(&mut h, "usr/bin/dash", io::empty()));
    ok(b.into_inner())
}

#[test]
fn an_upper_archive_becomes_a_layer_with_oci_whiteouts_and_opaque_markers() {
    let mut blob = Vec::new();
    let layer = ok(layer_from_overlay_upper(&upper_archive()[..], &mut blob));
    assert_eq!(layer.digest, Digest::of(&blob));
    let entries = entries_of(&blob);
    for want in [
        "etc d 0",
        "etc/.wh.motd f 0",
        "home/user d 0",
        "home/user/.wh..wh..opq f 0",
        "home/user/new f 4",
        "greeting f 3",
        "usr/bin/.wh.dash f 0",
    ] {
        assert!(
            entries.iter().any(|e| e == want),
            "{want:?} not in {entries:?}"
        );
    }
    assert!(
        !entries.iter().any(|e| e.starts_with("etc/motd")),
        "{entries:?}"
    );
}

/// What `find` shows of the overlay of `lower_dirs` (top first).
fn overlay_view(lower_dirs: &[PathBuf]) -> String {
    let mnt = ok(tempfile::tempdir());
    let lower = lower_dirs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let script = format!(
        "set -e; mount -t overlay overlay -o ro,lowerdir={lower} {m}; cd {m}; \
         find . -mindepth 1 -printf '%p %y %m %U\\n' | sort",
        m = mnt.path().display()
    );
    let out = ok(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output());
    assert!(
        out.status.success(),
        "overlay: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_committed_layer_over_its_base_hides_what_was_removed_through_an_overlay() {
    if !is_root() {
        eprintln!("skipped: needs root (whiteouts are device nodes, overlay mounts)");
        return;
    }
    let work = ok(tempfile::tempdir());
    let base_path = work.path().join("base.layer");
    let base = ok(layer_from_rootfs(
        &rootfs_tar()[..],
        ok(File::create(&base_path)),
    ));
    let top_path = work.path().join("top.layer");
    let top = ok(layer_from_overlay_upper(
        &upper_archive()[..],
        ok(File::create(&top_path)),
    ));
    let out = work.path().join("image");
    ok(write_layout(
        &[(base, base_path), (top, top_path)],
        &spec(),
        &out,
        LayoutFormat::Dir,
    ));
    let (_d, store) = store();
    ok(store.import_archive(&out, "built"));
    let r = ok(store.resolve("built"));
    assert_eq!(r.lower_dirs.len(), 2);
    // The top layer holds overlay whiteouts, unpacked from the OCI ones.
    let wh = ok(fs::symlink_metadata(r.lower_dirs[0].join("etc/motd")));
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    let view = overlay_view(&r.lower_dirs);
    for line in [
        "./greeting f 644 0",
        "./home/user/new f 600 1000",
        "./usr/bin/sh f 755 0",
    ] {
        assert!(view.lines().any(|l| l == line), "{line:?} not in\n{view}");
    }
    for gone in ["./etc/motd", "./usr/bin/dash", "./home/user/.profile"] {
        assert!(
            !view.lines().any(|l| l.starts_with(&format!("{gone} "))),
            "{gone} is visible:\n{view}"
        );
    }
    assert!(
        view.lines().any(|l| l == "./etc/os-release f 644 0"),
        "{view}"
    );
}

fn upper_refusal(archive: Vec<u8>) -> String {
    match layer_from_overlay_upper(&archive[..], io::sink()) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_renamed_directory_a_device_or_a_whiteout_name_in_the_upper_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_pax_extensions([("SCHILY.xattr.trusted.overlay.redirect", &b"/old"[..])]));
    ok(b.append_data(
        &mut header(EntryType::Directory, 0o755, 0, 0),
        "new",
        io::empty(),
    ));
    let e = upper_refusal(ok(b.into_inner()));
    assert!(
        e.contains("\"new\"") && e.contains("trusted.overlay.redirect"),
        "{e}"
    );

    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(EntryType::Char, 0o600, 0, 0);
    ok(h.set_device_major(1));
    ok(h.set_device_minor(1));
    ok(b.append_data(&mut h, "mem", io::empty()));
    let e = upper_refusal(ok(b.into_inner()));
    assert!(e.contains("\"mem\"") && e.contains("device node"), "{e}");

    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(EntryType::Regular, 0o644, 0, 0);
    ok(b.append_data(&mut h, "tmp/.wh.etc", io::empty()));
    let e = upper_refusal(ok(b.into_inner()));
    assert!(
        e.contains(".wh.etc") && e.contains("marks a whiteout"),
        "{e}"
    );

    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_pax_extensions([(
        std::str::from_utf8(SNAPSHOT_WHITEOUT_KEY).unwrap_or(""),
        &b"1"[..],
    )]));
    let mut h = header(EntryType::Regular, 0o644, 0, 2);
    ok(b.append_data(&mut h, "x", &b"xx"[..]));
    let e = upper_refusal(ok(b.into_inner()));
    assert!(e.contains("holds no data"), "{e}");
}

#[test]
fn a_pax_header_past_its_bound_is_refused_before_it_is_read() {
    let big = vec![b'a'; (MAX_PAX + 1) as usize];
    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_pax_extensions([("SCHILY.xattr.user.big", &big[..])]));
    ok(b.append_data(
        &mut header(EntryType::Regular, 0o644, 0, 0),
        "f",
        io::empty(),
    ));
    let e = upper_refusal(ok(b.into_inner()));
    assert!(e.contains("PAX header") && e.contains("limit"), "{e}");
}

#[test]
fn a_binary_xattr_with_a_newline_in_its_value_is_read_by_its_length() {
    // overlayfs's `origin` is a file handle: any byte, a newline too.
    let origin: &[u8] = b"\x00\xfb\n\x01=\n 7 x\n";
    let mut b = tar::Builder::new(Vec::new());
    ok(b.append_pax_extensions([("SCHILY.xattr.trusted.overlay.origin", origin)]));
    ok(b.append_data(
        &mut header(EntryType::Directory, 0o755, 0, 0),
        "etc",
        io::empty(),
    ));
    ok(b.append_pax_extensions([
        ("SCHILY.xattr.trusted.overlay.origin", origin),
        (
            std::str::from_utf8(SNAPSHOT_WHITEOUT_KEY).unwrap_or(""),
            &b"1"[..],
        ),
    ]));
    ok(b.append_data(
        &mut header(EntryType::Regular, 0, 0, 0),
        "etc/motd",
        io::empty(),
    ));
    let mut blob = Vec::new();
    ok(layer_from_overlay_upper(&ok(b.into_inner())[..], &mut blob));
    let entries = entries_of(&blob);
    assert_eq!(entries, ["etc d 0", "etc/.wh.motd f 0"]);
}

#[test]
fn pax_records_of_a_wrong_length_are_refused() {
    assert!(pax_records(b"20 SPACE.whiteout=1\n").is_ok());
    for bad in [
        &b"21 SPACE.whiteout=1\n"[..],
        b"19 SPACE.whiteout=1\n",
        b"x SPACE=1\n",
        b"9 nokey\n",
    ] {
        assert!(
            pax_records(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}
