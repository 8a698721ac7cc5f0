//! A Debian image with a working `apt`, made from this host's installed packages: no
//! mirror is contacted, so a test can run apt and dpkg in a sandbox of a template and
//! still send traffic only to hosts it made.
//!
//! - **Packages**: `apt` and every package the host marks `Essential: yes` (what
//!   Debian policy lets maintainer scripts assume: a shell, coreutils, tar, sed, grep,
//!   dpkg, …), and the closure of their `Pre-Depends` and `Depends` over what is
//!   installed (`dpkg-query`; of each group of alternatives, the first one installed,
//!   by name or by `Provides`). [`closure()`] is that choice, pure.
//! - **Files**: those `dpkg-query -L` lists, as they are on the host's disk (owner,
//!   mode, time, contents, hard links kept), less the documentation Debian's slim
//!   images leave out too (manuals, info, translations, `/usr/share/doc` but its
//!   copyright files). Each goes where its parent directory really is, so a merged-
//!   `/usr` host gives a merged-`/usr` image (`/bin` is the host's link to `usr/bin`).
//! - **The dpkg database** holds exactly those packages: their paragraphs of
//!   `/var/lib/dpkg/status`, their `info/` files, the diversions and trigger interests
//!   that are theirs; no alternatives (the host's choices are not part of any package)
//!   and no stat overrides.
//! - **Accounts**: `root`, `_apt` (apt's download sandbox), `nobody`, and every host
//!   account and group that owns one of the files, as the host numbers them (member
//!   lists dropped). The platform keeps an image's own `/etc/passwd`.
//! - **No sources**: a test writes the `sources.list` it wants.
//!
//! The image is an OCI layout tar made by `space_image::rootfs` (what `space template
//! import` reads), cached under the target directory by a digest of everything that
//! went into it (each entry's path, kind, owner, mode, size and time; the bytes of
//! what is written here), so another run on the same host reuses it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, Metadata};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use space_image::rootfs::{self, ImageSpec, LayoutFormat};

mod closure;

use closure::QUERY_FORMAT;
pub use closure::{Installed, closure, parse_installed};

/// Changes whenever what this module writes changes: part of the cache key.
const FORMAT: &str = "space-testkit debian image 1";

/// Where the host's documentation is, none of which the image has.
const LEFT_OUT: &[&str] = &[
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
];

/// The accounts every image has (`_apt` drops apt's downloads to itself).
const ACCOUNTS: &[&str] = &["root", "_apt", "nobody"];
const GROUPS: &[&str] = &["root", "nogroup"];

const DPKG: &str = "var/lib/dpkg";

/// The time of every directory (theirs on the host change with what else they hold)
/// and of every file written here.
const DIR_TIME: i64 = 1_700_000_000;

/// What this host lacks to build the image, if anything.
pub fn missing() -> Option<String> {
    let tools: Vec<&str> = ["dpkg-query", "dpkg"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    if !tools.is_empty() {
        return Some(format!("{} on PATH (a Debian host)", tools.join(", ")));
    }
    if !Path::new("/var/lib/dpkg/status").is_file() {
        return Some("dpkg's database at /var/lib/dpkg".into());
    }
    let apt = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Abbrev}", "apt"])
        .output();
    match apt {
        Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "ii" => None,
        _ => Some("apt installed (dpkg-query -W apt)".into()),
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// The image built (or found in the cache).
#[derive(Debug, Clone)]
pub struct DebianImage {
    /// Its OCI image layout tar.
    pub layout: PathBuf,
    /// The packages in it (`name:arch`), sorted.
    pub packages: Vec<String>,
    /// Entries of its root filesystem.
    pub entries: usize,
    /// Bytes of its files.
    pub bytes: u64,
    /// How long building it took; `None` when it came from the cache.
    pub built_in: Option<Duration>,
}

/// The image with apt (see the module), built once per test process and cached under
/// the target directory. Panics with what failed (call [`missing`] first).
pub fn with_apt() -> DebianImage {
    static IMAGE: OnceLock<DebianImage> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let cache = crate::bin::profile_dir()
                .parent()
                .expect("target dir above the profile")
                .join("space-testkit");
            build(&["apt"], &cache).unwrap_or_else(|e| panic!("the Debian image with apt: {e}"))
        })
        .clone()
}

/// What an entry of the root filesystem is made of.
#[derive(Debug)]
enum Source {
    /// The host's entry at the same path (`/` + the entry's), as `lstat` saw it.
    Host(Metadata),
    /// A file written here (`None`: a directory), root's, with this mode.
    Made(u32, Option<Vec<u8>>),
}

/// The root filesystem: paths relative to `/`, parents before children.
type Tree = BTreeMap<PathBuf, Source>;

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("{program} {args:?}: not UTF-8"))
}

/// The packages (`name:arch`, sorted) of `roots` and the essential ones, and the
/// root filesystem of the image.
fn collect(roots: &[&str]) -> Result<(Vec<String>, Tree), String> {
    let native = run("dpkg", &["--print-architecture"])?.trim().to_owned();
    let installed = parse_installed(&run("dpkg-query", &["-W", "-f", QUERY_FORMAT])?);
    let mut wanted: Vec<&str> = roots.to_vec();
    wanted.extend(
        installed
            .iter()
            .filter(|p| p.essential)
            .map(|p| p.name.as_str()),
    );
    let chosen: Vec<&Installed> = closure(&installed, &wanted, &native)?
        .into_iter()
        .map(|i| &installed[i])
        .collect();
    let mut tree = Tree::new();
    let mut args = vec!["-L".to_owned()];
    args.extend(chosen.iter().map(|p| p.query_name()));
    let listed = run(
        "dpkg-query",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    for line in listed.lines().filter(|l| l.starts_with('/')) {
        place(&mut tree, Path::new(line)).map_err(|e| format!("{line}: {e}"))?;
    }
    database(&mut tree, &chosen).map_err(|e| format!("the dpkg database: {e}"))?;
    accounts(&mut tree).map_err(|e| format!("the accounts: {e}"))?;
    if !tree.contains_key(Path::new("etc/nsswitch.conf")) {
        // What libc-bin's postinst installs: files first, then DNS.
        let conf = fs::read("/usr/share/libc-bin/nsswitch.conf").unwrap_or_else(|_| {
            b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".to_vec()
        });
        tree.insert("etc/nsswitch.conf".into(), Source::Made(0o644, Some(conf)));
    }
    let mut keys: Vec<String> = chosen.iter().map(|p| p.key()).collect();
    keys.sort();
    Ok((keys, tree))
}

/// Builds the image of `roots` and the essential packages into `cache` (or finds it
/// there).
fn build(roots: &[&str], cache: &Path) -> Result<DebianImage, String> {
    let started = Instant::now();
    let (packages, tree) = collect(roots)?;
    let layout = cache.join(format!("debian-apt-{}.tar", digest(&tree)));
    let bytes = tree
        .values()
        .map(|s| match s {
            Source::Host(m) if m.is_file() => m.len(),
            Source::Made(_, Some(b)) => b.len() as u64,
            _ => 0,
        })
        .sum();
    let mut image = DebianImage {
        layout: layout.clone(),
        packages,
        entries: tree.len(),
        bytes,
        built_in: None,
    };
    if layout.is_file() {
        return Ok(image);
    }
    fs::create_dir_all(cache).map_err(|e| format!("create {}: {e}", cache.display()))?;
    let work = tempfile::tempdir_in(cache).map_err(|e| format!("a work dir: {e}"))?;
    let tar = work.path().join("rootfs.tar");
    write_tar(&tree, &tar).map_err(|e| format!("write the root filesystem: {e}"))?;
    let out = work.path().join("layout.tar");
    let from = File::open(&tar).map_err(|e| format!("open the root filesystem: {e}"))?;
    rootfs::layout_from_rootfs(from, &ImageSpec::debian(None), &out, LayoutFormat::Tar)
        .map_err(|e| format!("make the image layout: {e}"))?;
    // Another test process may have won the race: its layout is the same bytes.
    fs::rename(&out, &layout).map_err(|e| format!("keep {}: {e}", layout.display()))?;
    // Images of what the host had before are not used again.
    for old in fs::read_dir(cache).into_iter().flatten().flatten() {
        let name = old.file_name().to_string_lossy().into_owned();
        if name.starts_with("debian-apt-") && name.ends_with(".tar") && old.path() != layout {
            let _ = fs::remove_file(old.path());
        }
    }
    image.built_in = Some(started.elapsed());
    Ok(image)
}

/// Whether a (relative) path is documentation the image leaves out.
fn left_out(path: &Path) -> bool {
    LEFT_OUT.iter().any(|d| path.starts_with(d))
        && !(path.starts_with("usr/share/doc") && path.file_name() == Some("copyright".as_ref()))
}

/// Adds the host's entry `listed` (absolute) to `tree` where its parent really is,
/// with the directories above it. Absent entries (left out on the host too) are
/// skipped, and so are sockets and devices.
fn place(tree: &mut Tree, listed: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (listed.parent(), listed.file_name()) else {
        return Ok(()); // `/.`, the root itself
    };
    if name == "." {
        return Ok(());
    }
    let Ok(parent) = fs::canonicalize(parent) else {
        return Ok(());
    };
    let host = parent.join(name);
    let Ok(meta) = fs::symlink_metadata(&host) else {
        return Ok(());
    };
    let t = meta.file_type();
    if !(t.is_dir() || t.is_file() || t.is_symlink() || t.is_fifo()) {
        return Ok(());
    }
    let relative: PathBuf = host
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    if left_out(&relative) {
        return Ok(());
    }
    for above in relative.ancestors().skip(1) {
        if above.as_os_str().is_empty() || tree.contains_key(above) {
            continue;
        }
        let m = fs::symlink_metadata(Path::new("/").join(above))?;
        tree.insert(above.to_owned(), Source::Host(m));
    }
    tree.insert(relative, Source::Host(meta));
    Ok(())
}

/// Adds the host's file `/path` as it is.
fn host_file(tree: &mut Tree, path: &str) -> io::Result<()> {
    let meta = fs::symlink_metadata(Path::new("/").join(path))?;
    tree.insert(path.into(), Source::Host(meta));
    Ok(())
}

fn made_dir(tree: &mut Tree, path: &str, mode: u32) {
    tree.entry(path.into()).or_insert(Source::Made(mode, None));
}

fn made_file(tree: &mut Tree, path: &str, body: Vec<u8>) {
    tree.insert(path.into(), Source::Made(0o644, Some(body)));
}

/// The dpkg database of `chosen` (see the module).
fn database(tree: &mut Tree, chosen: &[&Installed]) -> io::Result<()> {
    let keys: BTreeSet<String> = chosen.iter().map(|p| p.key()).collect();
    let names: BTreeSet<&str> = chosen.iter().map(|p| p.name.as_str()).collect();
    for dir in [
        "",
        "/info",
        "/updates",
        "/triggers",
        "/alternatives",
        "/parts",
    ] {
        made_dir(tree, &format!("{DPKG}{dir}"), 0o755);
    }
    // Status paragraphs: `Package:` and `Architecture:` name them.
    let status = fs::read_to_string(format!("/{DPKG}/status"))?;
    let mut kept = String::new();
    for paragraph in status.split("\n\n") {
        let field = |f: &str| {
            paragraph
                .lines()
                .find_map(|l| l.strip_prefix(f))
                .map(str::trim)
        };
        if let (Some(name), Some(arch)) = (field("Package:"), field("Architecture:"))
            && keys.contains(&format!("{name}:{arch}"))
        {
            kept.push_str(paragraph.trim_end_matches('\n'));
            kept.push_str("\n\n");
        }
    }
    made_file(tree, &format!("{DPKG}/status"), kept.into_bytes());
    made_file(tree, &format!("{DPKG}/available"), Vec::new());
    made_file(tree, &format!("{DPKG}/statoverride"), Vec::new());
    // Diversions: triples of lines (from, to, the diverting package).
    let diversions = fs::read_to_string(format!("/{DPKG}/diversions")).unwrap_or_default();
    let lines: Vec<&str> = diversions.lines().collect();
    let theirs: String = lines
        .chunks(3)
        .filter(|t| t.len() == 3 && names.contains(t[2]))
        .map(|t| format!("{}\n{}\n{}\n", t[0], t[1], t[2]))
        .collect();
    made_file(tree, &format!("{DPKG}/diversions"), theirs.into_bytes());
    // Trigger interests: `File` lines are `path package[/noawait]`, a named
    // trigger's file lists `package[/noawait]`.
    let interested = |who: &str| {
        let pkg = who.split('/').next().unwrap_or("");
        names.contains(pkg.split(':').next().unwrap_or(""))
    };
    for entry in fs::read_dir(format!("/{DPKG}/triggers"))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "Lock" | "Unincorp") || !entry.path().is_file() {
            continue;
        }
        let text = fs::read_to_string(entry.path())?;
        let theirs: String = text
            .lines()
            .filter(|l| interested(l.rsplit(' ').next().unwrap_or("")))
            .map(|l| format!("{l}\n"))
            .collect();
        if !theirs.is_empty() || name == "File" {
            made_file(
                tree,
                &format!("{DPKG}/triggers/{name}"),
                theirs.into_bytes(),
            );
        }
    }
    made_file(tree, &format!("{DPKG}/triggers/Unincorp"), Vec::new());
    // info/: `<package>.<what>`, or `<package>:<arch>.<what>` (Multi-Arch: same).
    let stems: BTreeSet<String> = chosen
        .iter()
        .flat_map(|p| [p.name.clone(), p.key()])
        .collect();
    for entry in fs::read_dir(format!("/{DPKG}/info"))?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let ours = file == "format"
            || file
                .rsplit_once('.')
                .is_some_and(|(stem, _)| stems.contains(stem));
        if ours {
            host_file(tree, &format!("{DPKG}/info/{file}"))?;
        }
    }
    Ok(())
}

/// `/etc/passwd` and `/etc/group`: [`ACCOUNTS`], [`GROUPS`] and the host's owners of
/// the tree's entries, without passwords or member lists.
fn accounts(tree: &mut Tree) -> io::Result<()> {
    let (mut uids, mut gids) = (BTreeSet::new(), BTreeSet::new());
    for s in tree.values() {
        if let Source::Host(m) = s {
            uids.insert(m.uid());
            gids.insert(m.gid());
        }
    }
    let passwd = fs::read_to_string("/etc/passwd")?;
    let mut users = String::new();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        let [name, _, uid, gid, gecos, home, shell] = f[..] else {
            continue;
        };
        let owner = uid.parse().is_ok_and(|u: u32| uids.contains(&u));
        if owner || ACCOUNTS.contains(&name) {
            users.push_str(&format!("{name}:x:{uid}:{gid}:{gecos}:{home}:{shell}\n"));
            gids.extend(gid.parse::<u32>().ok());
        }
    }
    let group = fs::read_to_string("/etc/group")?;
    let mut groups = String::new();
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        let [name, _, gid, _] = f[..] else { continue };
        if gid.parse().is_ok_and(|g: u32| gids.contains(&g)) || GROUPS.contains(&name) {
            groups.push_str(&format!("{name}:x:{gid}:\n"));
        }
    }
    for name in ACCOUNTS {
        if !users.lines().any(|l| l.starts_with(&format!("{name}:"))) {
            return Err(io::Error::other(format!("the host has no account {name}")));
        }
    }
    made_file(tree, "etc/passwd", users.into_bytes());
    made_file(tree, "etc/group", groups.into_bytes());
    Ok(())
}

/// A digest of everything that makes the image, in hex (the cache key).
fn digest(tree: &Tree) -> String {
    let mut h = blake3::Hasher::new();
    h.update(FORMAT.as_bytes());
    for (path, source) in tree {
        h.update(path.as_os_str().as_bytes());
        h.update(b"\0");
        match source {
            Source::Host(m) => {
                let link = fs::read_link(Path::new("/").join(path)).unwrap_or_default();
                // A directory's time changes with what else it holds (`/tmp`).
                let (time, nanos) = if m.is_dir() {
                    (DIR_TIME, 0)
                } else {
                    (m.mtime(), m.mtime_nsec())
                };
                let line = format!(
                    "{:o} {} {} {} {time} {nanos} {}\0",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.len(),
                    m.ino()
                );
                h.update(line.as_bytes());
                h.update(link.as_os_str().as_bytes());
            }
            Source::Made(mode, body) => {
                h.update(format!("made {mode:o}\0").as_bytes());
                h.update(body.as_deref().unwrap_or(b"(dir)"));
            }
        }
        h.update(b"\0");
    }
    h.finalize().to_hex()[..32].to_owned()
}

fn header(kind: tar::EntryType, mode: u32, uid: u32, gid: u32, mtime: i64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode & 0o7777);
    h.set_uid(u64::from(uid));
    h.set_gid(u64::from(gid));
    h.set_mtime(u64::try_from(mtime).unwrap_or(0));
    h.set_size(0);
    h
}

/// The root filesystem `tree` as a tar (`./` names, as mmdebstrap writes) at `out`.
fn write_tar(tree: &Tree, out: &Path) -> io::Result<()> {
    let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, File::create(out)?));
    let mut root = header(tar::EntryType::Directory, 0o755, 0, 0, DIR_TIME);
    b.append_data(&mut root, "./", io::empty())?;
    // A file's other names are hard links to the first one written.
    let mut first: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for (path, source) in tree {
        let name = Path::new(".").join(path);
        let m = match source {
            Source::Made(mode, None) => {
                let mut h = header(tar::EntryType::Directory, *mode, 0, 0, DIR_TIME);
                b.append_data(&mut h, &name, io::empty())?;
                continue;
            }
            Source::Made(mode, Some(body)) => {
                let mut h = header(tar::EntryType::Regular, *mode, 0, 0, DIR_TIME);
                h.set_size(body.len() as u64);
                b.append_data(&mut h, &name, &body[..])?;
                continue;
            }
            Source::Host(m) => m,
        };
        let host = Path::new("/").join(path);
        let at = |kind| header(kind, m.mode(), m.uid(), m.gid(), m.mtime());
        let t = m.file_type();
        if t.is_dir() {
            let mut h = header(
                tar::EntryType::Directory,
                m.mode(),
                m.uid(),
                m.gid(),
                DIR_TIME,
            );
            b.append_data(&mut h, &name, io::empty())?;
        } else if t.is_symlink() {
            let target = fs::read_link(&host)?;
            b.append_link(&mut at(tar::EntryType::Symlink), &name, target)?;
        } else if t.is_fifo() {
            b.append_data(&mut at(tar::EntryType::Fifo), &name, io::empty())?;
        } else if let Some(target) = (m.nlink() > 1)
            .then(|| first.get(&(m.dev(), m.ino())))
            .flatten()
        {
            b.append_link(&mut at(tar::EntryType::Link), &name, target)?;
        } else {
            let mut f = File::open(&host)?;
            if f.metadata()?.len() != m.len() {
                return Err(io::Error::other(format!(
                    "{} changed while the image was made",
                    host.display()
                )));
            }
            let mut h = at(tar::EntryType::Regular);
            h.set_size(m.len());
            b.append_data(&mut h, &name, (&mut f).take(m.len()))?;
            if m.nlink() > 1 {
                first.insert((m.dev(), m.ino()), name);
            }
        }
    }
    b.into_inner()?.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's tree, where this host has apt.
    fn host_tree() -> Option<(Vec<String>, Tree)> {
        if let Some(what) = missing() {
            eprintln!("SKIPPED: needs {what}");
            return None;
        }
        Some(collect(&["apt"]).unwrap())
    }

    fn made(tree: &Tree, path: &str) -> String {
        match tree.get(Path::new(path)) {
            Some(Source::Made(_, Some(body))) => String::from_utf8_lossy(body).into_owned(),
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn the_hosts_tree_has_apt_dpkg_a_shell_and_a_database_of_exactly_its_packages() {
        let Some((packages, tree)) = host_tree() else {
            return;
        };
        for p in ["apt:", "dpkg:", "dash:", "libc6:", "tar:", "coreutils:"] {
            assert!(
                packages.iter().any(|k| k.starts_with(p)),
                "{p} in {packages:?}"
            );
        }
        for f in [
            "usr/bin/apt-get",
            "usr/bin/dpkg",
            "usr/lib/apt/methods/http",
        ] {
            assert!(
                matches!(tree.get(Path::new(f)), Some(Source::Host(m)) if m.is_file()),
                "{f}"
            );
        }
        // The database lists exactly the packages, installed.
        let status = made(&tree, "var/lib/dpkg/status");
        let mut listed: Vec<String> = status
            .split("\n\n")
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                let field = |f: &str| p.lines().find_map(|l| l.strip_prefix(f)).unwrap().trim();
                assert_eq!(field("Status:"), "install ok installed", "{p}");
                format!("{}:{}", field("Package:"), field("Architecture:"))
            })
            .collect();
        listed.sort();
        assert_eq!(listed, packages);
        assert!(tree.contains_key(Path::new("var/lib/dpkg/info/apt.list")));
        // apt's sandbox account, and nothing that points at a mirror.
        assert!(
            made(&tree, "etc/passwd")
                .lines()
                .any(|l| l.starts_with("_apt:x:"))
        );
        for p in tree.keys() {
            let p = p.to_string_lossy();
            assert!(
                !(p.starts_with("etc/apt/sources.list") && p.ends_with(".list")
                    || p.ends_with(".sources")),
                "a source in the image: {p}"
            );
            assert!(!p.starts_with("usr/share/man/"), "{p}");
        }
    }

    #[test]
    fn documentation_is_left_out_but_copyright_files() {
        assert!(left_out(Path::new("usr/share/man/man1/ls.1.gz")));
        assert!(left_out(Path::new("usr/share/doc/apt/changelog.gz")));
        assert!(!left_out(Path::new("usr/share/doc/apt/copyright")));
        assert!(!left_out(Path::new("usr/share/docutils")));
        assert!(!left_out(Path::new("usr/bin/apt")));
    }
}
