//! The content-addressed template store under one root directory (the worker's
//! `<data>/images`):
//!
//! ```text
//! blobs/sha256/<hex>             layer blobs, compressed as imported
//! layers/<chain id hex>/         an unpacked layer: an overlayfs lower dir
//! layers/<chain id hex>.json     the blobs verified to give it, its size
//! templates/manifests/<hex>.json our manifests, by template digest
//! templates/names/<name>:<tag>   a name → {digest, imported}
//! locks/<chain id hex>           the flock of one layer's unpack
//! lock                           the store's flock (shared: imports; exclusive: rm)
//! tmp/                           spooled blobs and staging dirs, renamed into place
//! ```
//!
//! Every file is written to `tmp/`, fsynced and renamed; a layer is unpacked into a
//! staging directory, synced (`syncfs`) and renamed. A template is immutable: a name
//! once given keeps its digest until it is removed.
//!
//! An unpacked layer is named by its chain ID (the bottom layer's is its `diff_id`):
//! it is unpacked over the layers below it, and a path through one of their links
//! lands where the link leads. Stores written before kept upper layers under their
//! `diff_id`; such a directory is kept while a template that has the layer is (a
//! sandbox may run on it), and the template resolves only once its layers are there
//! under their chain IDs (the worker reports it missing and is sent it again).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::layer::{self, Wanted};
use crate::limits::{ImageLimits, MAX_JSON};
use crate::manifest::LayerRecord;
use crate::manifest::{ImageDefaults, SCHEMA, TemplateManifest, TemplateRef};
use crate::oci::{self, Archive};
use crate::paths::{Paths, lock_file, read_json, try_lock_file, write_atomic, write_json_atomic};
use crate::unpack::UnpackOptions;

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    paths: Paths,
    options: UnpackOptions,
    limits: ImageLimits,
}

/// A template as imported or installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Its name, if it was given one.
    pub name: Option<TemplateRef>,
    /// Its digest.
    pub digest: Digest,
    /// Its manifest.
    pub manifest: TemplateManifest,
}

/// A line of [`Store::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateInfo {
    /// The name (`None`: a template installed by digest only).
    pub name: Option<TemplateRef>,
    /// The digest.
    pub digest: Digest,
    /// Blobs plus unpacked file data, in bytes (layers shared with other templates
    /// are counted in each).
    pub size: u64,
    /// How many layers.
    pub layers: usize,
    /// When it was imported or installed here (Unix seconds).
    pub created: u64,
    /// When the image says it was built.
    pub image_created: Option<String>,
}

/// A template ready to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The template's digest.
    pub digest: Digest,
    /// The unpacked layers, top first (`lowerdir=` order).
    pub lower_dirs: Vec<PathBuf>,
    /// The image's process defaults.
    pub config: ImageDefaults,
    /// The whole manifest.
    pub manifest: TemplateManifest,
}

/// What a [`Store::retain`] removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// The templates it removed.
    pub templates: Vec<Digest>,
    /// Unpacked layers no template referenced any more.
    pub layers: usize,
    /// Blobs no template referenced any more.
    pub blobs: usize,
    /// The removed layers' files, deleted when it is dropped.
    pub trash: Trash,
}

/// Layers taken out of the store (moved into its `tmp/`), deleted when this is
/// dropped: outside the store's lock, so that a large tree holds no import up.
#[derive(Debug, Default)]
pub struct Trash(Vec<tempfile::TempDir>);

/// What a [`Store::remove`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// The template's manifest, if no name kept it.
    pub template: Option<Digest>,
    /// Unpacked layers no template referenced any more.
    pub layers: usize,
    /// Blobs no template referenced any more.
    pub blobs: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameRecord {
    digest: Digest,
    imported: u64,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Store {
    /// Opens the store at `root`, creating its directories (private: `0700`).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let paths = Paths { root: root.into() };
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        for dir in [
            paths.blobs(),
            paths.layers(),
            paths.manifests(),
            paths.names(),
            paths.root.join("locks"),
            paths.tmp(),
        ] {
            b.create(&dir)
                .map_err(|e| ImageError::io("create store directory", &dir, e))?;
        }
        let store = Self {
            paths,
            options: UnpackOptions::default(),
            limits: ImageLimits::default(),
        };
        store.clean_tmp()?;
        Ok(store)
    }

    /// With uids and gids of layers bounded by `id_limit` (the sandbox id range size;
    /// 65,536 by default).
    pub fn with_id_limit(mut self, id_limit: u64) -> Self {
        self.options.id_limit = id_limit;
        self
    }

    /// With `limits` on what an image's layers unpack to (16 GiB by default).
    pub fn with_limits(mut self, limits: ImageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.paths.root
    }

    /// Leftovers of crashed imports, removed when no other user of the store is busy.
    fn clean_tmp(&self) -> Result<()> {
        let path = self.paths.root.join("lock");
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ImageError::io("open lock", &path, e))?;
        if rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(());
        }
        let tmp = self.paths.tmp();
        for e in fs::read_dir(&tmp).map_err(|e| ImageError::io("read", &tmp, e))? {
            let p = e.map_err(|e| ImageError::io("read", &tmp, e))?.path();
            let r = if p.is_dir() && !p.is_symlink() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            r.map_err(|e| ImageError::io("remove leftover", &p, e))?;
        }
        Ok(())
    }

    fn lock(&self, exclusive: bool) -> Result<File> {
        lock_file(&self.paths.root.join("lock"), exclusive)
    }

    /// Imports the image at `path` (an OCI image layout directory or tar, or a
    /// `docker save` / `podman save` archive) as the template `name` (`name[:tag]`).
    pub fn import_archive(&self, path: &Path, name: &str) -> Result<Template> {
        let name = TemplateRef::parse(name)?;
        let archive = Archive::open(path)?;
        let plan = oci::read_image(&archive)?;
        let _lock = self.lock(false)?;
        let mut layers = Vec::with_capacity(plan.layers.len());
        let mut stack = Stacking::default();
        for (i, l) in plan.layers.iter().enumerate() {
            let want = Wanted {
                label: format!("{} ({} of {})", l.diff_id, i + 1, plan.layers.len()),
                digest: l.digest,
                size: l.size,
                media_type: l.media_type.clone(),
                diff_id: l.diff_id,
                chain: stack.chain(&l.diff_id),
                lowers: stack.lowers(),
                budget: self.limits.next_layer(stack.unpacked),
                verify_known: true,
            };
            let mut open = || archive.open_member(&l.member).map(|r| r as Box<dyn Read>);
            let got = layer::ensure(&self.paths, &want, &self.options, &mut open)?;
            layers.push(stack.push(&want, got));
        }
        let manifest = TemplateManifest {
            schema: SCHEMA,
            architecture: plan.architecture,
            os: plan.os,
            created: plan.created,
            config: plan.defaults,
            layers,
        };
        self.commit(Some(name), manifest)
    }

    /// Installs a template that arrives from elsewhere (another worker, the control
    /// plane): `manifest` is its JSON, which must have the digest `expected`; each
    /// blob the store lacks is read from `blob_source` and verified (digest, size,
    /// diff_id) as it is unpacked.
    pub fn install<R: Read>(
        &self,
        name: Option<&str>,
        manifest: &[u8],
        expected: &Digest,
        mut blob_source: impl FnMut(&Digest) -> io::Result<R>,
    ) -> Result<Template> {
        let name = name.map(TemplateRef::parse).transpose()?;
        if manifest.len() as u64 > MAX_JSON {
            return Err(ImageError::limit("a template manifest (JSON)", MAX_JSON));
        }
        let manifest: TemplateManifest = serde_json::from_slice(manifest)
            .map_err(|e| ImageError::Format(format!("template manifest: {e}")))?;
        manifest.validate()?;
        let actual = manifest.digest();
        if actual != *expected {
            return Err(ImageError::DigestMismatch {
                what: "template manifest".into(),
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        let _lock = self.lock(false)?;
        let mut stack = Stacking::default();
        for (i, l) in manifest.layers.iter().enumerate() {
            let want = Wanted {
                label: format!("{} ({} of {})", l.diff_id, i + 1, manifest.layers.len()),
                digest: Some(l.digest),
                size: Some(l.size),
                media_type: Some(l.media_type.clone()),
                diff_id: l.diff_id,
                chain: stack.chain(&l.diff_id),
                lowers: stack.lowers(),
                budget: self.limits.next_layer(stack.unpacked),
                verify_known: false,
            };
            let mut open = || {
                blob_source(&l.digest)
                    .map(|r| Box::new(r) as Box<dyn Read>)
                    .map_err(|e| ImageError::Layer {
                        layer: want.label.clone(),
                        why: format!("fetch blob {}: {e}", l.digest),
                    })
            };
            let got = layer::ensure(&self.paths, &want, &self.options, &mut open)?;
            let got = stack.push(&want, got);
            if got != *l {
                return Err(ImageError::Format(format!(
                    "layer {}: stored as {got:?}, the manifest says {l:?}",
                    want.label
                )));
            }
        }
        self.commit(name, manifest)
    }

    /// Writes the manifest and the name (under the shared lock).
    fn commit(&self, name: Option<TemplateRef>, manifest: TemplateManifest) -> Result<Template> {
        let digest = manifest.digest();
        let mpath = self.paths.manifest(&digest);
        if !mpath.is_file() {
            write_atomic(&self.paths, &mpath, &manifest.canonical_json())?;
        }
        if let Some(name) = &name {
            let npath = self.paths.name(name);
            // One name at a time: two imports of the same new name must not both win.
            let _guard = lock_file(&self.paths.root.join("names.lock"), true)?;
            match read_json::<NameRecord>(&npath) {
                Ok(r) if r.digest == digest => {}
                Ok(r) => {
                    return Err(ImageError::Exists(format!(
                        "{name} (digest {}); remove it first or choose another tag",
                        r.digest
                    )));
                }
                Err(_) if !npath.exists() => {
                    let record = NameRecord {
                        digest,
                        imported: now(),
                    };
                    write_json_atomic(&self.paths, &npath, &record)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Template {
            name,
            digest,
            manifest,
        })
    }

    /// Every template: one line per name, and one per template known by digest only.
    pub fn list(&self) -> Result<Vec<TemplateInfo>> {
        let names = self.names()?;
        let mut out = Vec::new();
        let mut named = std::collections::HashSet::new();
        for (name, record) in names {
            named.insert(record.digest);
            out.push(self.info(Some(name), record.digest, record.imported)?);
        }
        for digest in self.manifest_digests()? {
            if !named.contains(&digest) {
                let created = fs::metadata(self.paths.manifest(&digest))
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                out.push(self.info(None, digest, created)?);
            }
        }
        Ok(out)
    }

    fn info(
        &self,
        name: Option<TemplateRef>,
        digest: Digest,
        created: u64,
    ) -> Result<TemplateInfo> {
        let m = self.manifest(&digest)?;
        let mut size = 0;
        for (l, chain) in m.layers.iter().zip(m.chain_ids()) {
            size += l.size;
            if let Some(info) = layer::info(&self.paths, &chain)? {
                size += info.bytes;
            }
        }
        Ok(TemplateInfo {
            name,
            digest,
            size,
            layers: m.layers.len(),
            created,
            image_created: m.created,
        })
    }

    fn names(&self) -> Result<Vec<(TemplateRef, NameRecord)>> {
        let dir = self.paths.names();
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(|e| ImageError::io("read", &dir, e))? {
            let e = e.map_err(|e| ImageError::io("read", &dir, e))?;
            let Some(r) = e
                .file_name()
                .to_str()
                .and_then(|n| TemplateRef::parse(n).ok())
            else {
                continue;
            };
            out.push((r, read_json(&e.path())?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn manifest_digests(&self) -> Result<Vec<Digest>> {
        let dir = self.paths.manifests();
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(|e| ImageError::io("read", &dir, e))? {
            let e = e.map_err(|e| ImageError::io("read", &dir, e))?;
            if let Some(d) = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(Digest::from_hex)
            {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The manifest of the template `digest`.
    pub fn manifest(&self, digest: &Digest) -> Result<TemplateManifest> {
        let path = self.paths.manifest(digest);
        if !path.is_file() {
            return Err(ImageError::NotFound(digest.to_string()));
        }
        read_json(&path)
    }

    /// The digest `reference` (`name[:tag]` or `sha256:<hex>`) names.
    pub fn digest_of(&self, reference: &str) -> Result<Digest> {
        if reference.starts_with("sha256:") {
            return reference.parse().map_err(|_| ImageError::InvalidName {
                reference: reference.chars().take(300).collect(),
                why: "not a sha256 digest",
            });
        }
        let name = TemplateRef::parse(reference)?;
        let path = self.paths.name(&name);
        if !path.is_file() {
            return Err(ImageError::NotFound(name.to_string()));
        }
        Ok(read_json::<NameRecord>(&path)?.digest)
    }

    /// The template `reference` names, ready to mount.
    pub fn resolve(&self, reference: &str) -> Result<Resolved> {
        let digest = self.digest_of(reference)?;
        let manifest = self.manifest(&digest)?;
        let mut lower_dirs = Vec::with_capacity(manifest.layers.len());
        for (l, chain) in manifest.layers.iter().zip(manifest.chain_ids()).rev() {
            if layer::info(&self.paths, &chain)?.is_none() {
                // Missing, not broken: whoever sent the template sends it again.
                return Err(ImageError::NotFound(format!(
                    "{digest} (its layer {} is not unpacked here)",
                    l.diff_id
                )));
            }
            lower_dirs.push(self.paths.layer_dir(&chain));
        }
        Ok(Resolved {
            digest,
            lower_dirs,
            config: manifest.config.clone(),
            manifest,
        })
    }

    /// The stored blob `digest`, to send elsewhere.
    pub fn blob_path(&self, digest: &Digest) -> Option<PathBuf> {
        Some(self.paths.blob(digest)).filter(|p| p.is_file())
    }

    /// Removes the name `reference` (or, given a digest, the template and every name
    /// of it). The template's manifest goes once no name is left, refused while
    /// `in_use` says a sandbox or a snapshot uses it; then every layer and blob that
    /// no template references any more is deleted.
    pub fn remove(&self, reference: &str, in_use: &dyn Fn(&Digest) -> bool) -> Result<Removed> {
        let lock = self.lock(true)?;
        let digest = self.digest_of(reference)?;
        if !self.paths.manifest(&digest).is_file() {
            return Err(ImageError::NotFound(reference.to_owned()));
        }
        let names = self.names()?;
        // The one name to remove, or (`None`) every name of the digest.
        let only = if reference.starts_with("sha256:") {
            None
        } else {
            Some(TemplateRef::parse(reference)?)
        };
        let doomed: Vec<&TemplateRef> = names
            .iter()
            .filter(|(n, r)| r.digest == digest && only.as_ref().is_none_or(|o| o == n))
            .map(|(n, _)| n)
            .collect();
        let kept = names.iter().filter(|(_, r)| r.digest == digest).count() - doomed.len();
        let goes = kept == 0;
        if goes && in_use(&digest) {
            return Err(ImageError::InUse(reference.to_owned()));
        }
        for n in doomed {
            let p = self.paths.name(n);
            fs::remove_file(&p).map_err(|e| ImageError::io("remove name", &p, e))?;
        }
        let mut removed = Removed::default();
        if goes {
            let p = self.paths.manifest(&digest);
            fs::remove_file(&p).map_err(|e| ImageError::io("remove manifest", &p, e))?;
            removed.template = Some(digest);
        }
        let gone = self.collect()?;
        removed.layers = gone.layers;
        removed.blobs = gone.blobs;
        drop(lock);
        // The trees are deleted out of the lock (imports wait for none of it).
        drop(gone.trash);
        Ok(removed)
    }

    /// Removes every template known here by digest only (installed from elsewhere:
    /// a worker's, sent by the control plane) that `keep` does not list and that was
    /// installed before `installed_before`, then every layer and blob no template left
    /// references. Named templates stay (they go with [`Store::remove`]). The caller
    /// puts into `keep` every template a sandbox runs on: its layers are that
    /// sandbox's lower dirs, and nothing here can tell. The removed layers' files go
    /// when the result's [`Swept::trash`] is dropped. `None`, having done nothing,
    /// while an import or an install is under way (it would wait for it, and whoever
    /// waits for the sweep with it): the next sweep does it.
    pub fn retain(
        &self,
        keep: &std::collections::HashSet<Digest>,
        installed_before: SystemTime,
    ) -> Result<Option<Swept>> {
        let Some(lock) = try_lock_file(&self.paths.root.join("lock"))? else {
            return Ok(None);
        };
        let mut swept = Swept::default();
        for digest in self.unkept(keep, installed_before)? {
            let p = self.paths.manifest(&digest);
            fs::remove_file(&p).map_err(|e| ImageError::io("remove manifest", &p, e))?;
            swept.templates.push(digest);
        }
        let gone = self.collect()?;
        swept.layers = gone.layers;
        swept.blobs = gone.blobs;
        swept.trash = gone.trash;
        drop(lock);
        Ok(Some(swept))
    }

    /// The templates [`Store::retain`] would remove (read only: whether a sweep has
    /// anything to do, before it waits for a lock).
    pub fn unkept(
        &self,
        keep: &std::collections::HashSet<Digest>,
        installed_before: SystemTime,
    ) -> Result<Vec<Digest>> {
        let named: std::collections::HashSet<Digest> =
            self.names()?.into_iter().map(|(_, r)| r.digest).collect();
        let mut out = Vec::new();
        for digest in self.manifest_digests()? {
            if keep.contains(&digest) || named.contains(&digest) {
                continue;
            }
            let p = self.paths.manifest(&digest);
            let installed = match fs::symlink_metadata(&p).and_then(|m| m.modified()) {
                Ok(t) => t,
                // Removed meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ImageError::io("stat manifest", &p, e)),
            };
            if installed < installed_before {
                out.push(digest);
            }
        }
        Ok(out)
    }

    /// Moves out of sight the layers, and deletes the blobs, that no manifest
    /// references (under the exclusive lock); the moved trees are deleted when the
    /// result is dropped.
    fn collect(&self) -> Result<Collected> {
        let mut layers = std::collections::HashSet::new();
        let mut blobs = std::collections::HashSet::new();
        for d in self.manifest_digests()? {
            let m = self.manifest(&d)?;
            layers.extend(m.chain_ids());
            for l in m.layers {
                // A store's older name of an upper layer (see the module's doc).
                layers.insert(l.diff_id);
                blobs.insert(l.digest);
            }
        }
        let mut out = Collected::default();
        let ldir = self.paths.layers();
        for e in fs::read_dir(&ldir).map_err(|e| ImageError::io("read", &ldir, e))? {
            let e = e.map_err(|e| ImageError::io("read", &ldir, e))?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(d) = Digest::from_hex(name.strip_suffix(".json").unwrap_or(name)) else {
                continue;
            };
            if layers.contains(&d) {
                continue;
            }
            let p = e.path();
            if name.ends_with(".json") {
                fs::remove_file(&p).map_err(|e| ImageError::io("remove layer record", &p, e))?;
                continue;
            }
            // Out of sight first (a directory of its own in tmp/), deleted later.
            let tmp = self.paths.tmp();
            let trash = tempfile::Builder::new()
                .prefix("gc-")
                .tempdir_in(&tmp)
                .map_err(|e| ImageError::io("remove layer", &tmp, e))?;
            fs::rename(&p, trash.path().join(name))
                .map_err(|e| ImageError::io("remove layer", &p, e))?;
            out.trash.0.push(trash);
            let _ = fs::remove_file(self.paths.layer_lock(&d));
            out.layers += 1;
        }
        let bdir = self.paths.blobs();
        for e in fs::read_dir(&bdir).map_err(|e| ImageError::io("read", &bdir, e))? {
            let e = e.map_err(|e| ImageError::io("read", &bdir, e))?;
            let keep = e
                .file_name()
                .to_str()
                .and_then(Digest::from_hex)
                .is_none_or(|d| blobs.contains(&d));
            if !keep {
                let p = e.path();
                fs::remove_file(&p).map_err(|e| ImageError::io("remove blob", &p, e))?;
                out.blobs += 1;
            }
        }
        Ok(out)
    }
}

/// What [`Store::collect`] took away: counts, and the layers' trees.
#[derive(Default)]
struct Collected {
    layers: usize,
    blobs: usize,
    trash: Trash,
}

/// The layers of an image being stacked, bottom first: their chain IDs and what they
/// unpacked to so far.
#[derive(Default)]
struct Stacking {
    chains: Vec<Digest>,
    unpacked: u64,
}

impl Stacking {
    /// The chain ID of the next layer, `diff_id`.
    fn chain(&self, diff_id: &Digest) -> Digest {
        Digest::chain(self.chains.last(), diff_id)
    }

    /// The chain IDs of the layers so far, top first.
    fn lowers(&self) -> Vec<Digest> {
        self.chains.iter().rev().copied().collect()
    }

    /// Adds the layer `want` became (its record and unpacked bytes).
    fn push(&mut self, want: &Wanted, (record, unpacked): (LayerRecord, u64)) -> LayerRecord {
        self.chains.push(want.chain);
        self.unpacked = self.unpacked.saturating_add(unpacked);
        record
    }
}
