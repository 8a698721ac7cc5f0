//! Reading an image without a registry: an OCI image layout (a directory, or a tar of
//! one) or a `docker save` / `podman save` archive (`manifest.json`, possibly beside
//! an OCI layout, as Docker 25 writes it).
//!
//! A tar archive is read once to index its members (offset and size of each file);
//! members are then read in place, never the whole archive into memory. The index is
//! followed to one manifest (a nested index: the host's platform, `linux/amd64` on
//! x86-64, or the only manifest); the manifest and config blobs are read within
//! [`MAX_JSON`] and checked against their digests (and sizes) before they are parsed.
//! Layers are only located here: [`crate::store`] streams and verifies them.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::Deserialize;

use crate::digest::Digest;
use crate::entry::{self, Kind};
use crate::error::{ImageError, Result};
use crate::limits::{MAX_ARCHIVE_MEMBERS, MAX_INDEX_DEPTH, MAX_JSON, MAX_LAYERS};
use crate::manifest::ImageDefaults;

/// An image archive: a directory, or an indexed tar file.
#[derive(Debug)]
pub struct Archive {
    path: PathBuf,
    kind: ArchiveKind,
}

#[derive(Debug)]
enum ArchiveKind {
    Dir(OwnedFd),
    Tar(HashMap<String, Member>),
}

/// A tar member: a file's data, or a link to another member.
#[derive(Debug, Clone)]
enum Member {
    File { offset: u64, size: u64 },
    Link(String),
}

/// One layer to import, as the image names it.
#[derive(Debug, Clone)]
pub struct PlannedLayer {
    /// The archive member holding the blob.
    pub member: String,
    /// The blob's digest, where the image states it (OCI); `docker save`'s legacy
    /// `<id>/layer.tar` members have none (their digest is computed).
    pub digest: Option<Digest>,
    /// The blob's size, where stated.
    pub size: Option<u64>,
    /// The media type, where stated.
    pub media_type: Option<String>,
    /// The config's `diff_id` for it.
    pub diff_id: Digest,
}

/// What an image is made of.
#[derive(Debug, Clone)]
pub struct ImagePlan {
    /// Layers, bottom first.
    pub layers: Vec<PlannedLayer>,
    /// The config's process defaults.
    pub defaults: ImageDefaults,
    /// The config's architecture.
    pub architecture: String,
    /// The config's OS.
    pub os: String,
    /// The config's `created`.
    pub created: Option<String>,
}

fn format(why: impl Into<String>) -> ImageError {
    ImageError::Format(why.into())
}

/// A member name with `./`, empty and leading `/` components dropped; `None` if it
/// climbs with `..`.
fn clean(name: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

impl Archive {
    /// Opens `path`: an OCI layout or `docker save` directory, or a tar of either.
    pub fn open(path: &Path) -> Result<Self> {
        let meta =
            std::fs::metadata(path).map_err(|e| ImageError::io("open image archive", path, e))?;
        let kind = if meta.is_dir() {
            let fd = rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| ImageError::io("open image directory", path, e.into()))?;
            ArchiveKind::Dir(fd)
        } else {
            ArchiveKind::Tar(index_tar(path)?)
        };
        Ok(Self {
            path: path.to_owned(),
            kind,
        })
    }

    /// Whether the archive has the file `name`.
    pub fn has(&self, name: &str) -> bool {
        self.open_member(name).is_ok()
    }

    /// A reader of the member `name` (a file of the directory, resolved inside it).
    pub fn open_member(&self, name: &str) -> Result<Box<dyn Read + Send + '_>> {
        let missing = || format(format!("the archive has no {name:?}"));
        let name = clean(name).ok_or_else(missing)?;
        match &self.kind {
            ArchiveKind::Dir(root) => {
                // Symlinks inside the image directory resolve inside it.
                let fd = rustix::fs::openat2(
                    root,
                    name.as_str(),
                    OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                )
                .map_err(|_| missing())?;
                let file = File::from(fd);
                let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
                if !is_file {
                    return Err(missing());
                }
                Ok(Box::new(file))
            }
            ArchiveKind::Tar(members) => {
                let mut name = name;
                for _ in 0..8 {
                    match members.get(&name) {
                        Some(Member::File { offset, size }) => {
                            let mut f = File::open(&self.path)
                                .map_err(|e| ImageError::io("open image archive", &self.path, e))?;
                            f.seek(SeekFrom::Start(*offset))
                                .map_err(|e| ImageError::io("read image archive", &self.path, e))?;
                            return Ok(Box::new(f.take(*size)));
                        }
                        Some(Member::Link(target)) => name = target.clone(),
                        None => return Err(missing()),
                    }
                }
                Err(format(format!("{name:?}: too many links in the archive")))
            }
        }
    }

    /// The member `name`, at most [`MAX_JSON`] bytes.
    pub fn read_small(&self, name: &str) -> Result<Vec<u8>> {
        let r = self.open_member(name)?;
        read_bounded(r, name)
    }

    /// The blob `digest` of the layout, checked against its digest (and `size`).
    pub fn read_blob(&self, digest: &Digest, size: Option<u64>) -> Result<Vec<u8>> {
        let name = format!("blobs/sha256/{}", digest.hex());
        let bytes = self.read_small(&name)?;
        check_blob(&bytes, digest, size, &name)?;
        Ok(bytes)
    }
}

fn check_blob(bytes: &[u8], digest: &Digest, size: Option<u64>, what: &str) -> Result<()> {
    let actual = Digest::of(bytes);
    if actual != *digest {
        return Err(ImageError::DigestMismatch {
            what: what.to_owned(),
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    if let Some(size) = size.filter(|&s| s != bytes.len() as u64) {
        return Err(format(format!(
            "{what}: {} bytes, its descriptor says {size}",
            bytes.len()
        )));
    }
    Ok(())
}

/// Reads `r` to its end, refusing more than [`MAX_JSON`] bytes.
pub fn read_bounded(r: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(MAX_JSON + 1)
        .read_to_end(&mut v)
        .map_err(|e| format(format!("{what}: {e}")))?;
    if v.len() as u64 > MAX_JSON {
        return Err(ImageError::limit(format!("{what} (JSON)"), MAX_JSON));
    }
    Ok(v)
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| format(format!("{what}: {e}")))
}

/// Indexes the members of the tar file `path`.
fn index_tar(path: &Path) -> Result<HashMap<String, Member>> {
    let file = File::open(path).map_err(|e| ImageError::io("open image archive", path, e))?;
    let mut head = [0u8; 4];
    let n = (&file)
        .take(4)
        .read(&mut head)
        .map_err(|e| ImageError::io("read image archive", path, e))?;
    if head[..n].starts_with(&[0x1f, 0x8b]) || head[..n].starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(format(
            "a compressed image archive: decompress it first (`docker save` writes a plain tar)",
        ));
    }
    let file = File::open(path).map_err(|e| ImageError::io("open image archive", path, e))?;
    let mut members = HashMap::new();
    let label = path.display().to_string();
    entry::for_each(
        io::BufReader::new(file),
        &label,
        MAX_ARCHIVE_MEMBERS as u64,
        |m, e| {
            let Some(name) = std::str::from_utf8(&m.path).ok().and_then(clean) else {
                return Ok(());
            };
            let member = match m.kind {
                Kind::File => Member::File {
                    offset: e.raw_file_position(),
                    size: m.size,
                },
                // Links resolve relative to the link's directory (symlinks) or to
                // the archive's root (hard links).
                Kind::Symlink => {
                    let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                    let target = String::from_utf8_lossy(&m.link);
                    match clean(&format!("{dir}/{target}")) {
                        Some(t) => Member::Link(t),
                        None => return Ok(()),
                    }
                }
                Kind::HardLink => match clean(&String::from_utf8_lossy(&m.link)) {
                    Some(t) => Member::Link(t),
                    None => return Ok(()),
                },
                _ => return Ok(()),
            };
            members.insert(name, member);
            Ok(())
        },
    )
    .map_err(|e| format(format!("not a tar archive: {e}")))?;
    Ok(members)
}

// ---- OCI image layout -------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    digest: String,
    size: Option<u64>,
    platform: Option<Platform>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The layer media types imported (the compression is told by magic bytes anyway).
pub const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// The platform an image is chosen for: the host's, as OCI names architectures.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn parse_digest(s: &str, what: &str) -> Result<Digest> {
    s.parse().map_err(|_| {
        format(format!(
            "{what}: {s:?} is not a sha256 digest (the only one read)"
        ))
    })
}

/// The plan of the image in `archive`.
pub fn read_image(archive: &Archive) -> Result<ImagePlan> {
    if archive.has("index.json") {
        read_oci(archive)
    } else if archive.has("manifest.json") {
        read_docker(archive)
    } else {
        Err(format(
            "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
        ))
    }
}

fn read_oci(archive: &Archive) -> Result<ImagePlan> {
    let index_bytes = archive.read_small("index.json")?;
    let mut index: Index = parse(&index_bytes, "index.json")?;
    for depth in 0..=MAX_INDEX_DEPTH {
        let chosen = choose(index.manifests)?;
        let digest = parse_digest(&chosen.digest, "index.json")?;
        let blob = archive.read_blob(&digest, chosen.size)?;
        let media = chosen
            .media_type
            .clone()
            .or_else(|| sniff_media_type(&blob));
        let is_index = media.as_deref().is_some_and(|m| INDEX_TYPES.contains(&m));
        if is_index {
            if depth == MAX_INDEX_DEPTH {
                break;
            }
            index = parse(&blob, "nested index")?;
            continue;
        }
        if let Some(m) = media.as_deref().filter(|m| !MANIFEST_TYPES.contains(m)) {
            return Err(format(format!("unsupported manifest media type {m:?}")));
        }
        let manifest: Manifest = parse(&blob, "manifest")?;
        if let Some(m) = manifest.media_type.as_deref() {
            if !MANIFEST_TYPES.contains(&m) {
                return Err(format(format!("unsupported manifest media type {m:?}")));
            }
        }
        return plan_from_manifest(archive, manifest);
    }
    Err(ImageError::limit(
        "the nesting of image indexes",
        MAX_INDEX_DEPTH as u64,
    ))
}

/// An index or a manifest, told by its fields when no media type says.
fn sniff_media_type(blob: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let p: Probe = serde_json::from_slice(blob).ok()?;
    p.media_type.or_else(|| {
        Some(
            if p.manifests.is_some() {
                INDEX_TYPES[0]
            } else {
                MANIFEST_TYPES[0]
            }
            .to_owned(),
        )
    })
}

/// The manifest of an index to import: the host's platform, or the only one.
fn choose(manifests: Vec<Descriptor>) -> Result<Descriptor> {
    // Build attestations (buildx) are manifests too; they are not the image.
    let mut candidates: Vec<Descriptor> = manifests
        .into_iter()
        .filter(|d| {
            d.annotations
                .get("vnd.docker.reference.type")
                .map(String::as_str)
                != Some("attestation-manifest")
                && d.platform.as_ref().is_none_or(|p| p.os != "unknown")
        })
        .collect();
    if candidates.len() == 1 {
        return Ok(candidates.remove(0));
    }
    let arch = host_architecture();
    let listed: Vec<String> = candidates
        .iter()
        .map(|d| {
            d.platform.as_ref().map_or_else(
                || "no platform".to_owned(),
                |p| format!("{}/{}", p.os, p.architecture),
            )
        })
        .collect();
    match candidates.iter().position(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == arch)
    }) {
        Some(i) => Ok(candidates.remove(i)),
        None if candidates.is_empty() => Err(format("the image index lists no manifest")),
        None => Err(format(format!(
            "the image index has no manifest for linux/{arch} (it has: {})",
            listed.join(", ")
        ))),
    }
}

fn plan_from_manifest(archive: &Archive, manifest: Manifest) -> Result<ImagePlan> {
    let config_digest = parse_digest(&manifest.config.digest, "manifest config")?;
    let config = archive.read_blob(&config_digest, manifest.config.size)?;
    let config = parse_config(&config)?;
    if manifest.layers.len() != config.diff_ids.len() {
        return Err(format(format!(
            "the manifest lists {} layers, the config {} diff_ids",
            manifest.layers.len(),
            config.diff_ids.len()
        )));
    }
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (d, diff_id) in manifest.layers.into_iter().zip(&config.diff_ids) {
        let digest = parse_digest(&d.digest, "manifest layer")?;
        let media = d.media_type.unwrap_or_default();
        if !LAYER_TYPES.contains(&media.as_str()) {
            return Err(format(format!("unsupported layer media type {media:?}")));
        }
        layers.push(PlannedLayer {
            member: format!("blobs/sha256/{}", digest.hex()),
            digest: Some(digest),
            size: d.size,
            media_type: Some(media),
            diff_id: *diff_id,
        });
    }
    Ok(config.into_plan(layers))
}

// ---- docker save ------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn read_docker(archive: &Archive) -> Result<ImagePlan> {
    let bytes = archive.read_small("manifest.json")?;
    let mut entries: Vec<DockerEntry> = parse(&bytes, "manifest.json")?;
    if entries.len() != 1 {
        return Err(format(format!(
            "manifest.json lists {} images; save one image per archive",
            entries.len()
        )));
    }
    let entry = entries.remove(0);
    let config = archive.read_small(&entry.config)?;
    // `<hex>.json` (legacy) or `blobs/sha256/<hex>`: the name is the config's digest.
    if let Some(d) = digest_in_name(&entry.config) {
        check_blob(&config, &d, None, &entry.config)?;
    }
    let config = parse_config(&config)?;
    if entry.layers.len() != config.diff_ids.len() {
        return Err(format(format!(
            "manifest.json lists {} layers, the config {} diff_ids",
            entry.layers.len(),
            config.diff_ids.len()
        )));
    }
    let layers = entry
        .layers
        .into_iter()
        .zip(&config.diff_ids)
        .map(|(member, diff_id)| PlannedLayer {
            digest: member
                .strip_prefix("blobs/sha256/")
                .and_then(Digest::from_hex),
            member,
            size: None,
            media_type: None,
            diff_id: *diff_id,
        })
        .collect();
    Ok(config.into_plan(layers))
}

/// The digest a member's name states: `blobs/sha256/<hex>` or `<hex>.json`.
fn digest_in_name(name: &str) -> Option<Digest> {
    let base = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json"))?;
    Digest::from_hex(base)
}

// ---- the image config -------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    created: Option<String>,
    #[serde(default)]
    config: Option<ProcessConfig>,
    rootfs: RootFs,
}

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

struct Config {
    architecture: String,
    os: String,
    created: Option<String>,
    defaults: ImageDefaults,
    diff_ids: Vec<Digest>,
}

impl Config {
    fn into_plan(self, layers: Vec<PlannedLayer>) -> ImagePlan {
        ImagePlan {
            layers,
            defaults: self.defaults,
            architecture: self.architecture,
            os: self.os,
            created: self.created,
        }
    }
}

fn parse_config(bytes: &[u8]) -> Result<Config> {
    let c: ConfigFile = parse(bytes, "image config")?;
    if c.rootfs.kind != "layers" {
        return Err(format(format!(
            "image config: rootfs type {:?}",
            c.rootfs.kind
        )));
    }
    if c.os != "linux" {
        return Err(format(format!("image config: os {:?}, not linux", c.os)));
    }
    if c.rootfs.diff_ids.is_empty() {
        return Err(format("image config: no layer"));
    }
    if c.rootfs.diff_ids.len() > MAX_LAYERS {
        return Err(ImageError::limit("the number of layers", MAX_LAYERS as u64));
    }
    let diff_ids = c
        .rootfs
        .diff_ids
        .iter()
        .map(|d| parse_digest(d, "image config diff_id"))
        .collect::<Result<_>>()?;
    let p = c.config.unwrap_or_default();
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(Config {
        architecture: c.architecture,
        os: c.os,
        created: c.created,
        defaults: ImageDefaults {
            env: p.env.unwrap_or_default(),
            working_dir: non_empty(p.working_dir),
            user: non_empty(p.user),
            entrypoint: p.entrypoint,
            cmd: p.cmd,
        },
        diff_ids,
    })
}
