//! Images built by the tests themselves: layers written entry by entry with the `tar`
//! crate (hostile ones with raw header bytes), compressed with gzip or zstd, and laid
//! out as an OCI image layout (directory or tar) or a `docker save` archive.

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use space_image::Digest;
use tar::{EntryType, Header};

/// How a test layer is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comp {
    Plain,
    Gzip,
    Zstd,
}

/// A layer being written.
pub struct Layer {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: EntryType, path: &[u8], size: u64, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    set_raw_path(&mut h, path);
    h
}

/// Writes `path` into the header's name field as it is (no checks: hostile names).
fn set_raw_path(h: &mut Header, path: &[u8]) {
    let name = &mut h.as_old_mut().name;
    assert!(
        path.len() < name.len(),
        "test path too long for a plain header"
    );
    name.fill(0);
    name[..path.len()].copy_from_slice(path);
}

fn set_raw_link(h: &mut Header, target: &[u8]) {
    let link = &mut h.as_old_mut().linkname;
    assert!(
        target.len() < link.len(),
        "test link too long for a plain header"
    );
    link.fill(0);
    link[..target.len()].copy_from_slice(target);
}

impl Layer {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    fn put(&mut self, mut h: Header, data: &[u8]) -> &mut Self {
        h.set_cksum();
        self.tar
            .append(&h, data)
            .unwrap_or_else(|e| panic!("append: {e}"));
        self
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.put(header(EntryType::Directory, path.as_bytes(), 0, mode), b"")
    }

    pub fn file(&mut self, path: &str, data: &[u8], mode: u32) -> &mut Self {
        self.file_owned(path, data, mode, 0, 0)
    }

    pub fn file_owned(
        &mut self,
        path: &str,
        data: &[u8],
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> &mut Self {
        let mut h = header(EntryType::Regular, path.as_bytes(), data.len() as u64, mode);
        h.set_uid(uid);
        h.set_gid(gid);
        self.put(h, data)
    }

    pub fn dir_owned(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> &mut Self {
        let mut h = header(EntryType::Directory, path.as_bytes(), 0, mode);
        h.set_uid(uid);
        h.set_gid(gid);
        self.put(h, b"")
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        let mut h = header(EntryType::Symlink, path.as_bytes(), 0, 0o777);
        set_raw_link(&mut h, target.as_bytes());
        self.put(h, b"")
    }

    pub fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        let mut h = header(EntryType::Link, path.as_bytes(), 0, 0o644);
        set_raw_link(&mut h, target.as_bytes());
        self.put(h, b"")
    }

    pub fn fifo(&mut self, path: &str) -> &mut Self {
        self.put(header(EntryType::Fifo, path.as_bytes(), 0, 0o640), b"")
    }

    pub fn char_device(&mut self, path: &str, major: u32, minor: u32) -> &mut Self {
        let mut h = header(EntryType::Char, path.as_bytes(), 0, 0o666);
        h.set_device_major(major).unwrap_or_else(|e| panic!("{e}"));
        h.set_device_minor(minor).unwrap_or_else(|e| panic!("{e}"));
        self.put(h, b"")
    }

    /// `.wh.NAME` beside `path`'s name.
    pub fn whiteout(&mut self, path: &str) -> &mut Self {
        let (dir, name) = path.rsplit_once('/').map_or(("", path), |(d, n)| (d, n));
        let wh = if dir.is_empty() {
            format!(".wh.{name}")
        } else {
            format!("{dir}/.wh.{name}")
        };
        self.file(&wh, b"", 0o644)
    }

    /// `DIR/.wh..wh..opq`.
    pub fn opaque(&mut self, dir: &str) -> &mut Self {
        self.file(&format!("{dir}/.wh..wh..opq"), b"", 0o644)
    }

    /// A GNU long-name header claiming `size` bytes (followed by that many).
    pub fn long_name(&mut self, size: usize) -> &mut Self {
        let name = vec![b'a'; size];
        self.put(
            header(EntryType::GNULongName, b"././@LongLink", size as u64, 0o644),
            &name,
        )
    }

    /// The uncompressed tar stream.
    pub fn tar(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.tar, tar::Builder::new(Vec::new()));
        b.into_inner().unwrap_or_else(|e| panic!("finish tar: {e}"))
    }
}

pub fn compress(tar: &[u8], c: Comp) -> Vec<u8> {
    match c {
        Comp::Plain => tar.to_vec(),
        Comp::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar).unwrap_or_else(|e| panic!("{e}"));
            gz.finish().unwrap_or_else(|e| panic!("{e}"))
        }
        Comp::Zstd => {
            ruzstd::encoding::compress_to_vec(tar, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

fn media_type(c: Comp) -> &'static str {
    match c {
        Comp::Plain => "application/vnd.oci.image.layer.v1.tar",
        Comp::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        Comp::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

/// A built image: its layers (tar, blob, compression) and config.
pub struct Image {
    pub layers: Vec<(Vec<u8>, Vec<u8>, Comp)>,
    pub config: serde_json::Value,
}

/// The defaults the test images carry.
pub fn process_config() -> serde_json::Value {
    serde_json::json!({
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
        "WorkingDir": "/home/user",
        "User": "user",
        "Entrypoint": ["/bin/tool"],
        "Cmd": ["--help"]
    })
}

impl Image {
    pub fn new(layers: Vec<(Vec<u8>, Comp)>) -> Self {
        let layers: Vec<_> = layers
            .into_iter()
            .map(|(tar, c)| {
                let blob = compress(&tar, c);
                (tar, blob, c)
            })
            .collect();
        let diff_ids: Vec<String> = layers
            .iter()
            .map(|(t, _, _)| Digest::of(t).to_string())
            .collect();
        let config = serde_json::json!({
            "architecture": space_image::oci::host_architecture(),
            "os": "linux",
            "created": "2026-01-02T03:04:05Z",
            "config": process_config(),
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        Self { layers, config }
    }

    pub fn config_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.config).unwrap_or_default()
    }

    /// The OCI manifest (as JSON bytes) of this image.
    pub fn manifest_bytes(&self) -> Vec<u8> {
        let config = self.config_bytes();
        let layers: Vec<_> = self
            .layers
            .iter()
            .map(|(_, blob, c)| {
                serde_json::json!({
                    "mediaType": media_type(*c),
                    "digest": Digest::of(blob).to_string(),
                    "size": blob.len(),
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": Digest::of(&config).to_string(),
                "size": config.len(),
            },
            "layers": layers,
        }))
        .unwrap_or_default()
    }

    /// Writes an OCI image layout at `dir` (an index naming one manifest).
    pub fn write_oci(&self, dir: &Path) {
        let blobs = dir.join("blobs/sha256");
        fs::create_dir_all(&blobs).unwrap_or_else(|e| panic!("{e}"));
        let put = |bytes: &[u8]| {
            let d = Digest::of(bytes);
            fs::write(blobs.join(d.hex()), bytes).unwrap_or_else(|e| panic!("{e}"));
            d
        };
        for (_, blob, _) in &self.layers {
            put(blob);
        }
        put(&self.config_bytes());
        let manifest = self.manifest_bytes();
        let md = put(&manifest);
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": md.to_string(),
                "size": manifest.len(),
                "annotations": {"org.opencontainers.image.ref.name": "latest"},
            }],
        });
        fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&index).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Writes a legacy `docker save` archive at `path`: `manifest.json`, the config as
    /// `<hex>.json`, each layer (uncompressed) as `<n>/layer.tar`.
    pub fn write_docker_save(&self, path: &Path) {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            h.set_entry_type(EntryType::Regular);
            b.append_data(&mut h, name, data)
                .unwrap_or_else(|e| panic!("{e}"));
        };
        let config = self.config_bytes();
        let config_name = format!("{}.json", Digest::of(&config).hex());
        add(&config_name, &config);
        let mut layers = Vec::new();
        for (i, (tar, _, _)) in self.layers.iter().enumerate() {
            let name = format!("{:064x}/layer.tar", i + 1);
            add(&name, tar);
            layers.push(name);
        }
        let manifest = serde_json::json!([{
            "Config": config_name,
            "RepoTags": ["test:latest"],
            "Layers": layers,
        }]);
        add(
            "manifest.json",
            &serde_json::to_vec(&manifest).unwrap_or_default(),
        );
        fs::write(path, b.into_inner().unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A tar of the directory `dir` (an OCI layout) at `out`.
pub fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(fs::File::create(out).unwrap_or_else(|e| panic!("{e}")));
    b.append_dir_all(".", dir).unwrap_or_else(|e| panic!("{e}"));
    b.into_inner().unwrap_or_else(|e| panic!("{e}"));
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A single-layer OCI layout of `layer` (gzip) in a new temp dir.
pub fn one_layer_image(layer: &mut Layer) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = Image::new(vec![(layer.tar(), Comp::Gzip)]);
    let path = dir.path().join("image");
    image.write_oci(&path);
    (dir, path)
}

/// The directories under `root/layers` (unpacked layers).
pub fn layer_dirs(store_root: &Path) -> usize {
    fs::read_dir(store_root.join("layers"))
        .unwrap_or_else(|e| panic!("{e}"))
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count()
}

/// The files under `root/blobs/sha256`.
pub fn blob_files(store_root: &Path) -> usize {
    fs::read_dir(store_root.join("blobs/sha256"))
        .unwrap_or_else(|e| panic!("{e}"))
        .count()
}

/// What a read-only overlay of `lower_dirs` (top first) shows, mounted in a private
/// mount namespace (root only): `PATH TYPE MODE UID` of every entry, then
/// `PATH=CONTENT` of every regular file.
pub fn overlay_view(lower_dirs: &[PathBuf]) -> String {
    let mnt = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let lower = lower_dirs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    // A private mount namespace: the mount goes away with the child.
    let script = format!(
        "set -e; mount -t overlay overlay -o ro,lowerdir={lower} {m}; cd {m}; \
         find . -mindepth 1 -printf '%p %y %m %U\\n' | sort; \
         for f in $(find . -type f | sort); do printf '%s=%s\\n' \"$f\" \"$(cat $f)\"; done",
        m = mnt.path().display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap_or_else(|e| panic!("unshare: {e}"));
    assert!(
        out.status.success(),
        "overlay mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
