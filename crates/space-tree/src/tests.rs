use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use super::*;

/// A hand-made archive: each entry with the exact name, type, mode and content the
/// test wants, names the `tar` builder would refuse (`..`, absolute) included.
/// One entry of [`archive`]: name, type, mode, content, link target.
type Entry<'a> = (&'a str, tar::EntryType, u32, &'a [u8], Option<&'a str>);

fn archive(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, mode, data, link) in entries {
        let mut h = tar::Header::new_old();
        {
            let old = h.as_old_mut();
            old.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                old.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
        }
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn unpack_into(dir: &Path, bytes: &[u8], limits: Limits) -> Result<Summary, TreeError> {
    let root = open_dir(dir).unwrap();
    unpack(bytes, root.as_fd(), limits)
}

#[test]
fn a_tree_packed_and_unpacked_keeps_files_modes_mtimes_and_symlinks() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir_all(s.join("a/b")).unwrap();
    std::fs::write(s.join("a/b/run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(s.join("a/b/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(s.join("secret"), b"x").unwrap();
    std::fs::set_permissions(s.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink("a/b/run.sh", s.join("link")).unwrap();
    symlink("/etc/passwd", s.join("abs-link")).unwrap();
    std::fs::set_permissions(s.join("a"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let mut tar = Vec::new();
    let packed = pack(open_dir(s).unwrap().as_fd(), &mut tar, 100).unwrap();
    assert_eq!(packed.entries, 6);

    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    let got = unpack_into(d, &tar, Limits::default()).unwrap();
    assert_eq!(got.entries, 6);
    assert_eq!(
        std::fs::read(d.join("a/b/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    let mode = |p: &str| std::fs::symlink_metadata(d.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("a/b/run.sh"), 0o755);
    assert_eq!(mode("secret"), 0o600);
    assert_eq!(mode("a"), 0o750);
    assert_eq!(
        std::fs::read_link(d.join("link")).unwrap(),
        Path::new("a/b/run.sh")
    );
    assert_eq!(
        std::fs::read_link(d.join("abs-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    let mtime = |root: &Path, p: &str| std::fs::symlink_metadata(root.join(p)).unwrap().mtime();
    assert_eq!(mtime(d, "secret"), mtime(s, "secret"));
    assert_eq!(mtime(d, "a"), mtime(s, "a"));
}

#[test]
fn an_entry_climbing_out_with_dotdot_is_refused_and_nothing_lands_outside() {
    let base = tempfile::tempdir().unwrap();
    let inside = base.path().join("inside");
    std::fs::create_dir(&inside).unwrap();
    let tar = archive(&[("../x", tar::EntryType::Regular, 0o644, b"escaped", None)]);
    let err = unpack_into(&inside, &tar, Limits::default()).unwrap_err();
    assert!(matches!(err, TreeError::Refused { .. }), "{err}");
    assert!(!base.path().join("x").exists());
}

#[test]
fn an_absolute_entry_is_refused() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let name = format!("{}/planted", outside.path().display());
    let tar = archive(&[(&name, tar::EntryType::Regular, 0o644, b"x", None)]);
    let err = unpack_into(dst.path(), &tar, Limits::default()).unwrap_err();
    assert!(err.to_string().contains("absolute"), "{err}");
    assert!(!outside.path().join("planted").exists());
}

#[test]
fn a_file_under_a_symlink_the_archive_made_is_refused_and_the_link_target_is_untouched() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().display().to_string();
    let tar = archive(&[
        ("link", tar::EntryType::Symlink, 0o777, b"", Some(&target)),
        ("link/file", tar::EntryType::Regular, 0o644, b"pwned", None),
    ]);
    let err = unpack_into(dst.path(), &tar, Limits::default()).unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn a_symlink_already_at_a_files_name_is_replaced_not_followed() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), b"original").unwrap();
    symlink(outside.path().join("victim"), dst.path().join("f")).unwrap();
    let tar = archive(&[("f", tar::EntryType::Regular, 0o644, b"new", None)]);
    unpack_into(dst.path(), &tar, Limits::default()).unwrap();
    assert_eq!(
        std::fs::read(outside.path().join("victim")).unwrap(),
        b"original"
    );
    assert_eq!(std::fs::read(dst.path().join("f")).unwrap(), b"new");
    assert!(
        std::fs::symlink_metadata(dst.path().join("f"))
            .unwrap()
            .is_file()
    );
}

#[test]
fn a_symlinked_directory_planted_in_the_target_does_not_redirect_writes() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), dst.path().join("d")).unwrap();
    let tar = archive(&[("d/file", tar::EntryType::Regular, 0o644, b"x", None)]);
    let err = unpack_into(dst.path(), &tar, Limits::default()).unwrap_err();
    assert!(matches!(err, TreeError::Refused { .. }), "{err}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn device_nodes_and_fifos_are_refused() {
    for kind in [
        tar::EntryType::Char,
        tar::EntryType::Block,
        tar::EntryType::Fifo,
    ] {
        let dst = tempfile::tempdir().unwrap();
        let tar = archive(&[("dev", kind, 0o666, b"", None)]);
        let err = unpack_into(dst.path(), &tar, Limits::default()).unwrap_err();
        assert!(matches!(err, TreeError::Refused { .. }), "{kind:?}: {err}");
        assert!(!dst.path().join("dev").exists());
    }
}

#[test]
fn setuid_bits_are_stripped_when_asked_and_kept_otherwise() {
    let tar = archive(&[("s", tar::EntryType::Regular, 0o4755, b"x", None)]);
    let strip = Limits {
        strip_special_bits: true,
        ..Limits::default()
    };
    let dst = tempfile::tempdir().unwrap();
    unpack_into(dst.path(), &tar, strip).unwrap();
    let mode = std::fs::metadata(dst.path().join("s")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    let dst = tempfile::tempdir().unwrap();
    unpack_into(dst.path(), &tar, Limits::default()).unwrap();
    let mode = std::fs::metadata(dst.path().join("s")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o4755);
}

#[test]
fn an_archive_past_the_entry_bound_is_refused() {
    let tar = archive(&[
        ("a", tar::EntryType::Regular, 0o644, b"", None),
        ("b", tar::EntryType::Regular, 0o644, b"", None),
        ("c", tar::EntryType::Regular, 0o644, b"", None),
    ]);
    let dst = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_entries: 2,
        ..Limits::default()
    };
    let err = unpack_into(dst.path(), &tar, limits).unwrap_err();
    assert!(matches!(err, TreeError::TooManyEntries(2)), "{err}");
}

#[test]
fn a_hard_link_may_only_name_a_file_inside_the_target() {
    let dst = tempfile::tempdir().unwrap();
    let tar = archive(&[
        ("f", tar::EntryType::Regular, 0o644, b"data", None),
        ("g", tar::EntryType::Link, 0o644, b"", Some("f")),
    ]);
    unpack_into(dst.path(), &tar, Limits::default()).unwrap();
    assert_eq!(std::fs::read(dst.path().join("g")).unwrap(), b"data");
    let tar = archive(&[(
        "h",
        tar::EntryType::Link,
        0o644,
        b"",
        Some("../../etc/passwd"),
    )]);
    let err = unpack_into(dst.path(), &tar, Limits::default()).unwrap_err();
    assert!(matches!(err, TreeError::Refused { .. }), "{err}");
}

#[test]
fn names_are_checked_component_by_component() {
    assert_eq!(
        components(b"./a//b/./c").unwrap(),
        [b"a" as &[u8], b"b", b"c"]
    );
    assert!(components(b"").unwrap().is_empty());
    assert!(components(b"a/../b").is_err());
    assert!(components(b"/a").is_err());
    assert!(components(b"a\0b").is_err());
    assert!(components(&[b'a'; MAX_PATH + 1]).is_err());
    assert!(components(&[b'a'; MAX_COMPONENT + 1]).is_err());
}
