//! The layer archive: round trips, hostile archives, limits.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::*;

#[test]
fn layer_with_files_links_whiteouts_and_opaque_dirs_round_trips() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: whiteouts and trusted xattrs need root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("upper");
    fs::create_dir_all(src.join("root/dir")).unwrap();
    fs::write(src.join("root/dir/file.txt"), b"data").unwrap();
    std::os::unix::fs::symlink("dir/file.txt", src.join("root/link")).unwrap();
    nix::sys::stat::mknod(
        &src.join("root/gone"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::empty(),
        0,
    )
    .unwrap();
    let opaque = rustix::fs::setxattr(
        src.join("root/dir").as_path(),
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    );
    let archive = pack(&src).unwrap();
    let dst = t.path().join("restored");
    unpack(&archive[..], &dst).unwrap();
    assert_eq!(fs::read(dst.join("root/dir/file.txt")).unwrap(), b"data");
    assert_eq!(
        fs::read_link(dst.join("root/link")).unwrap(),
        Path::new("dir/file.txt")
    );
    let gone = fs::symlink_metadata(dst.join("root/gone")).unwrap();
    assert!(
        gone.file_type().is_char_device() && gone.rdev() == 0,
        "whiteout lost"
    );
    if opaque.is_ok() {
        let mut v = [0u8; 8];
        let n = rustix::fs::getxattr(
            dst.join("root/dir").as_path(),
            "trusted.overlay.opaque",
            &mut v,
        )
        .unwrap();
        assert_eq!(&v[..n], b"y");
    }
    // The same tree gives the same archive.
    assert_eq!(digest(&pack(&src).unwrap()), digest(&archive));
}

/// `depth` nested directories `d/d/…` below `root`, made relative to descriptors.
#[test]
fn an_opaque_directory_keeps_its_mark_whatever_binary_overlay_handle_sits_beside_it() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: trusted xattrs need root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("upper");
    fs::create_dir_all(src.join("root/dir")).unwrap();
    let dir = src.join("root/dir");
    let set = |name: &str, value: &[u8]| {
        rustix::fs::setxattr(dir.as_path(), name, value, rustix::fs::XattrFlags::empty())
    };
    // What overlayfs leaves on a copied-up directory: a file handle of the lower
    // inode (binary: any byte, a newline too), next to the opaque mark.
    if set("trusted.overlay.origin", b"\x00\xfb\n=\n\x01\x02").is_err()
        || set("trusted.overlay.opaque", b"y").is_err()
    {
        eprintln!("SKIPPED: this filesystem refuses trusted xattrs");
        return;
    }
    let archive = pack(&src).unwrap();
    let dst = t.path().join("restored");
    unpack(&archive[..], &dst).unwrap();
    let mut v = [0u8; 8];
    let n = rustix::fs::getxattr(
        dst.join("root/dir").as_path(),
        "trusted.overlay.opaque",
        &mut v,
    )
    .expect("the opaque mark was lost: the lower dir's files would come back");
    assert_eq!(&v[..n], b"y");
    // The handle names an inode of this worker's filesystem: never carried.
    assert!(
        rustix::fs::getxattr(
            dst.join("root/dir").as_path(),
            "trusted.overlay.origin",
            &mut [0u8; 64],
        )
        .is_err()
    );
}

#[test]
fn a_malformed_extended_header_refuses_the_archive_rather_than_dropping_what_it_holds() {
    let t = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    // A record whose length runs past its header.
    let mut pax = tar::Header::new_ustar();
    let body = b"99 SCHILY.xattr.trusted.overlay.opaque=y\n";
    pax.set_entry_type(tar::EntryType::XHeader);
    pax.set_size(body.len() as u64);
    pax.set_mode(0o644);
    pax.set_mtime(0);
    pax.set_uid(0);
    pax.set_gid(0);
    b.append_data(&mut pax, "././@PaxHeader", &body[..])
        .unwrap();
    let mut dir = tar::Header::new_ustar();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_size(0);
    dir.set_mode(0o755);
    dir.set_mtime(0);
    dir.set_uid(0);
    dir.set_gid(0);
    b.append_data(&mut dir, "root/dir", std::io::empty())
        .unwrap();
    let archive = b.into_inner().unwrap();
    let err = unpack(&archive[..], &t.path().join("restored")).unwrap_err();
    assert!(err.to_string().contains("extended header"), "{err}");
}

fn nest(root: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(root, flags, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, c"d", flags, Mode::empty()).unwrap();
    }
}

/// Runs `f` on a thread with the 2 MiB stack of a runtime's blocking threads.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn a_deeply_nested_layer_packs_on_a_small_stack_or_is_refused_never_crashing() {
    let t = tempfile::tempdir().unwrap();
    // Deep, but its paths still fit PATH_MAX: packed and unpacked whole (the
    // recursive walk overflowed a 2 MiB stack at some 1,400 levels).
    let deep = t.path().join("deep");
    fs::create_dir(&deep).unwrap();
    nest(&deep, 1_900);
    let archive = on_small_stack({
        let deep = deep.clone();
        move || pack(&deep)
    })
    .unwrap();
    let dst = t.path().join("restored");
    unpack(&archive[..], &dst).unwrap();
    let mut depth = 0;
    let mut at = dst.clone();
    while at.join("d").is_dir() {
        at.push("d");
        depth += 1;
    }
    assert_eq!(depth, 1_900);
    // Deeper than any path can name: a clear error, and the worker lives on.
    let deeper = t.path().join("deeper");
    fs::create_dir(&deeper).unwrap();
    nest(&deeper, 4_000);
    let refused = on_small_stack(move || pack(&deeper));
    assert!(refused.is_err());
    crate::substrate::tree::remove_tree(&t.path().join("deeper")).unwrap();
}

#[test]
fn links_planted_in_the_layer_are_packed_as_links_never_followed() {
    // The layer is the sandbox's: links to host files and directories, absolute
    // or climbing, must travel as links, and nothing they point at is read.
    let t = tempfile::tempdir().unwrap();
    let host = t.path().join("host");
    fs::create_dir_all(host.join("secrets")).unwrap();
    fs::write(host.join("secrets/key"), b"host secret").unwrap();
    let src = t.path().join("upper");
    fs::create_dir_all(src.join("root")).unwrap();
    std::os::unix::fs::symlink(host.join("secrets/key"), src.join("root/file-link")).unwrap();
    std::os::unix::fs::symlink(host.join("secrets"), src.join("root/dir-link")).unwrap();
    std::os::unix::fs::symlink("../../../../host/secrets", src.join("etc-link")).unwrap();
    let archive = pack(&src).unwrap();
    let text = String::from_utf8_lossy(&archive);
    assert!(
        !text.contains("host secret"),
        "a linked host file was packed"
    );
    let mut entries = Vec::new();
    for e in tar::Archive::new(&archive[..]).entries().unwrap() {
        let e = e.unwrap();
        entries.push((
            e.path().unwrap().display().to_string(),
            e.header().entry_type(),
        ));
    }
    for name in ["root/file-link", "root/dir-link", "etc-link"] {
        assert!(
            entries
                .iter()
                .any(|(p, k)| p == name && *k == tar::EntryType::Symlink),
            "{name} not packed as a link: {entries:?}"
        );
    }
    assert!(
        !entries.iter().any(|(p, _)| p.contains("key")),
        "{entries:?}"
    );
    // And it unpacks as links, nothing outside the destination touched.
    let dst = t.path().join("restored");
    unpack(&archive[..], &dst).unwrap();
    assert_eq!(
        fs::read_link(dst.join("root/file-link")).unwrap(),
        host.join("secrets/key")
    );
    assert_eq!(fs::read_dir(host.join("secrets")).unwrap().count(), 1);
}

#[test]
fn a_write_cut_off_by_the_snapshot_leaves_no_temporary_file_in_the_next_execution() {
    use space_proto::guest::temp_files::temp_name;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("upper");
    fs::create_dir_all(src.join("root/work")).unwrap();
    fs::write(src.join("root/work/notes"), b"kept").unwrap();
    // What an agent frozen mid-write leaves, in two directories.
    let cut = temp_name("notes", 9, 41, 0x0123_4567_89ab_cdef);
    fs::write(src.join("root/work").join(&cut), b"half a wr").unwrap();
    fs::write(src.join("root").join(temp_name("x", 1, 0, 7)), b"").unwrap();
    // A user's files that only look alike, and a directory of that form, stay.
    fs::write(src.join("root/work/.notes.space-tmp.1"), b"mine").unwrap();
    fs::create_dir(src.join("root").join(temp_name("d", 1, 0, 7))).unwrap();
    let archive = pack(&src).unwrap();
    let dst = t.path().join("restored");
    unpack(&archive[..], &dst).unwrap();
    let mut names: Vec<String> = fs::read_dir(dst.join("root/work"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".notes.space-tmp.1", "notes"]);
    assert!(!dst.join("root").join(temp_name("x", 1, 0, 7)).exists());
    assert!(dst.join("root").join(temp_name("d", 1, 0, 7)).is_dir());
    assert_eq!(fs::read(dst.join("root/work/notes")).unwrap(), b"kept");
}

#[test]
fn archive_entries_cannot_leave_the_destination() {
    let t = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(1);
    h.set_mode(0o644);
    // tar's own path setter refuses "..", so write the name bytes directly.
    let name = b"../escaped";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let archive = b.into_inner().unwrap();
    assert!(unpack(&archive[..], &t.path().join("dest")).is_err());
    assert!(!t.path().join("escaped").exists());
}

/// An archive of `entries` (type, path, link target, data), paths written raw.
fn hostile(entries: &[(tar::EntryType, &str, &str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, link, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn refused(archive: &[u8], dest: &Path, says: &str) {
    let e = unpack(archive, dest).expect_err("a hostile archive was unpacked");
    assert!(e.to_string().contains(says), "{e}");
}

#[test]
fn a_file_below_a_symlink_the_archive_made_is_refused_not_written_outside() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let archive = hostile(&[
        (tar::EntryType::Symlink, "a", outside.to_str().unwrap(), b""),
        (tar::EntryType::Regular, "a/x", "", b"planted"),
    ]);
    refused(&archive, &t.path().join("dest"), "never followed");
    assert!(
        !outside.join("x").exists(),
        "a file was written through the symlink"
    );
    // Nor over the symlink itself (the same path twice).
    let archive = hostile(&[
        (
            tar::EntryType::Symlink,
            "b",
            outside.join("y").to_str().unwrap(),
            b"",
        ),
        (tar::EntryType::Regular, "b", "", b"planted"),
    ]);
    refused(&archive, &t.path().join("dest2"), "same path");
    assert!(!outside.join("y").exists());
}

#[test]
fn hard_links_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let secret = t.path().join("secret");
    fs::write(&secret, b"host").unwrap();
    let archive = hostile(&[(tar::EntryType::Link, "l", secret.to_str().unwrap(), b"")]);
    refused(&archive, &t.path().join("dest"), "hard links");
    let archive = hostile(&[
        (tar::EntryType::Regular, "f", "", b"x"),
        (tar::EntryType::Link, "l", "f", b""),
    ]);
    refused(&archive, &t.path().join("dest2"), "hard links");
}

#[test]
fn device_nodes_and_fifos_are_refused() {
    let t = tempfile::tempdir().unwrap();
    for (i, kind) in [
        tar::EntryType::Char,
        tar::EntryType::Block,
        tar::EntryType::Fifo,
    ]
    .into_iter()
    .enumerate()
    {
        let dest = t.path().join(format!("dest{i}"));
        refused(&hostile(&[(kind, "mem", "", b"")]), &dest, "refused");
        assert!(!dest.join("mem").exists());
    }
}

#[test]
fn absolute_and_dotted_paths_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let abs = t.path().join("abs");
    for (i, path) in [abs.to_str().unwrap(), "a/../../x", "./../x"]
        .into_iter()
        .enumerate()
    {
        let archive = hostile(&[(tar::EntryType::Regular, path, "", b"x")]);
        assert!(
            unpack(&archive[..], &t.path().join(format!("d{i}"))).is_err(),
            "{path}"
        );
    }
    assert!(!abs.exists());
    assert!(!t.path().join("x").exists());
}

/// Peak RSS of this process (VmHWM), bytes.
fn peak_rss() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// A writer that only counts.
#[derive(Default)]
struct Count(u64);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_50_gib_sparse_file_is_refused_by_its_apparent_size_before_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(upper.join("root")).unwrap();
    fs::write(upper.join("root/small"), b"x").unwrap();
    let big = fs::File::create(upper.join("root/big")).unwrap();
    big.set_len(50 << 30).unwrap();
    let before = peak_rss();
    let mut out = Count::default();
    let e = pack_into(&upper, &mut out, MAX_ARCHIVE).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    let msg = e.to_string();
    assert!(
        msg.contains("1 GiB") && msg.contains("/root/big") && msg.contains("50 GiB"),
        "{msg}"
    );
    assert!(
        out.0 < 1 << 20,
        "{} bytes written before the refusal",
        out.0
    );
    let growth = peak_rss().saturating_sub(before);
    assert!(growth < 32 << 20, "peak RSS grew {growth} bytes");
}

#[test]
fn an_archive_is_never_written_past_the_limit() {
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(&upper).unwrap();
    for i in 0..10 {
        fs::write(upper.join(format!("f{i}")), vec![7u8; 20 << 10]).unwrap();
    }
    let limit = 100 << 10;
    let mut out = Count::default();
    let e = pack_into(&upper, &mut out, limit).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
    assert!(
        out.0 <= limit,
        "{} bytes written past the limit of {limit}",
        out.0
    );
    // Under the limit the same tree packs, with the digest of the bytes written.
    let mut bytes = Vec::new();
    let packed = pack_into(&upper, &mut bytes, 1 << 20).unwrap();
    assert_eq!(packed.size, bytes.len() as u64);
    assert_eq!(packed.digest, digest(&bytes));
    // And a spooled archive unpacks from its file.
    let (file, p) = pack_to_temp(&upper, &t.path().join("spool"), 1 << 20).unwrap();
    assert_eq!(p, packed);
    unpack(io::BufReader::new(file), &t.path().join("restored")).unwrap();
    assert_eq!(
        fs::read(t.path().join("restored/f3")).unwrap(),
        vec![7u8; 20 << 10]
    );
    assert_eq!(
        fs::read_dir(t.path().join("spool")).unwrap().count(),
        0,
        "a spool file was left"
    );
}

/// A 2 GiB file with data at three places and holes between.
fn file_with_holes(path: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::create(path).unwrap();
    f.set_len(2 << 30).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(&vec![9u8; 300 << 10], 1 << 30).unwrap();
    f.write_all_at(b"tail", (2 << 30) - 4).unwrap();
    drop(f);
    let mut p = fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o640);
    fs::set_permissions(path, p).unwrap();
}

#[test]
fn a_file_with_holes_keeps_them_through_an_archive_made_to_keep_them() {
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(&upper).unwrap();
    file_with_holes(&upper.join("disk.img"));
    // Far under the apparent 2 GiB: only the data goes.
    let (file, packed) =
        pack_to_temp_keeping_holes(&upper, &t.path().join("spool"), 4 << 20).unwrap();
    assert!(
        packed.size < 1 << 20,
        "the archive is {} bytes",
        packed.size
    );
    let restored = t.path().join("restored");
    unpack_keeping_holes(io::BufReader::new(file), &restored).unwrap();
    let disk = restored.join("disk.img");
    let meta = fs::metadata(&disk).unwrap();
    assert_eq!(meta.len(), 2 << 30);
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert!(
        meta.blocks() * 512 < 4 << 20,
        "the holes were filled: {} blocks",
        meta.blocks()
    );
    let f = fs::File::open(&disk).unwrap();
    let mut buf = [0u8; 4];
    for (at, want) in [
        (0, *b"head"),
        ((2 << 30) - 4, *b"tail"),
        ((1 << 30) + 4096, [9; 4]),
        (4096, [0; 4]),
    ] {
        f.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(buf, want, "at {at}");
    }
    // Without keeping holes the same file is refused by its apparent size.
    let e = pack_to_temp(&upper, &t.path().join("spool"), 4 << 20).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
}

#[test]
fn an_archive_with_holes_is_refused_by_an_unpack_not_told_to_keep_them() {
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(&upper).unwrap();
    file_with_holes(&upper.join("disk.img"));
    let (file, _) = pack_to_temp_keeping_holes(&upper, &t.path().join("spool"), 4 << 20).unwrap();
    // Read as plain data, its extents would be another file: refused, not guessed.
    let e = unpack(io::BufReader::new(file), &t.path().join("restored")).unwrap_err();
    assert!(
        e.to_string().contains("sparse entries are refused here"),
        "{e}"
    );
}

#[test]
fn a_disk_image_keeps_its_bytes_and_holes_through_an_archive_made_to_keep_them() {
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(&upper).unwrap();
    let image = upper.join("upper.ext4");
    fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let made = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-J", "size=4"])
        .arg(&image)
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: needs mkfs.ext4 (e2fsprogs)");
        return;
    }
    let (file, packed) =
        pack_to_temp_keeping_holes(&upper, &t.path().join("spool"), MAX_ARCHIVE).unwrap();
    assert!(
        packed.size < 64 << 20,
        "the archive is {} bytes",
        packed.size
    );
    let restored = t.path().join("restored");
    unpack_keeping_holes(io::BufReader::new(file), &restored).unwrap();
    let (a, b) = (
        fs::read(&image).unwrap(),
        fs::read(restored.join("upper.ext4")).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    let first = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first, None, "the images differ from byte {first:?}");
}
