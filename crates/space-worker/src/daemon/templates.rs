//! Templates on this worker: what an install's `template` names (the host-dirs
//! default, or an image of the worker's store pinned by digest), and a template
//! arriving from the control plane (`POST /internal/v1/templates`, see
//! [`space_proto::api::Update::Template`]).
//!
//! The worker never fetches a template itself: an install of one it lacks is refused
//! with `template_missing`, the control plane sends it, then installs again. Every
//! blob is verified against the manifest as it is unpacked, and the manifest against
//! the signed digest, so what reaches a sandbox's lower dirs is exactly what was
//! imported.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use space_image::{Digest, ImageDefaults, ImageError};
use space_proto::api::Update;

use super::records::RecordState;
use super::state::Worker;
use crate::substrate::TemplateSpec;

/// The largest template archive a worker receives (the control plane's import bound
/// plus the archive's headers).
pub const MAX_TEMPLATE_ARCHIVE: u64 = 9 << 30;

/// The member of a template archive holding the manifest (the first).
pub const MANIFEST_MEMBER: &str = "manifest.json";

/// The template `reference` of an install names: `None` for the default (host
/// directories), else the pinned digest. A record's template is `default`,
/// `sha256:<hex>`, or `name:tag@sha256:<hex>` (the name is for people; the digest
/// decides).
pub fn pinned_digest(reference: &str) -> Result<Option<Digest>, String> {
    if reference == "default" {
        return Ok(None);
    }
    let digest = match reference.rsplit_once('@') {
        Some((_, d)) => d,
        None => reference,
    };
    digest.parse().map(Some).map_err(|_| {
        format!(
            "template {:?} is neither `default` nor pinned by a sha256 digest",
            reference.chars().take(200).collect::<String>()
        )
    })
}

/// What a sandbox of an image runs with unless a request says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// The image's environment, under the sandbox's own.
    pub env: Vec<(String, String)>,
    /// The image's working directory.
    pub cwd: Option<String>,
    /// The image's user (`name`, `uid`, `name:group`: the part before `:`).
    pub user: Option<String>,
}

impl Defaults {
    fn of(config: &ImageDefaults) -> Self {
        Self {
            env: config
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cwd: config.working_dir.clone().filter(|d| d.starts_with('/')),
            user: config
                .user
                .as_deref()
                .map(|u| u.split(':').next().unwrap_or(u).to_owned())
                .filter(|u| !u.is_empty()),
        }
    }
}

/// The substrate's template for `reference` and the image's defaults; an image this
/// worker lacks is a conflict starting `template_missing` (the control plane sends it
/// and installs again).
pub fn resolve(w: &Worker, reference: &str) -> Result<(TemplateSpec, Defaults), TemplateError> {
    let Some(digest) = pinned_digest(reference).map_err(TemplateError::Invalid)? else {
        return Ok((TemplateSpec::Default, Defaults::default()));
    };
    match w.images.resolve(&digest.to_string()) {
        Ok(r) => Ok((
            TemplateSpec::Image {
                digest: digest.to_string(),
                lower_dirs: r.lower_dirs,
            },
            Defaults::of(&r.config),
        )),
        Err(e) if is_missing(&e) => Err(TemplateError::Missing(format!(
            "template_missing: template {digest} is not on this worker"
        ))),
        Err(e) => Err(TemplateError::Internal(format!("template {digest}: {e}"))),
    }
}

fn is_missing(e: &ImageError) -> bool {
    match e {
        ImageError::NotFound(_) => true,
        ImageError::Io { source, .. } => source.kind() == io::ErrorKind::NotFound,
        _ => false,
    }
}

/// What a verified `Template` update promises: the template's digest and the
/// archive's length (the update already verified by the caller).
pub fn expect(update: Update) -> Result<(Digest, u64), TemplateError> {
    let (digest, size) = match update {
        Update::Template { digest, size } => (digest, size),
        _ => return Err(TemplateError::Invalid("not a template update".into())),
    };
    let digest: Digest = digest
        .parse()
        .map_err(|_| TemplateError::Invalid(format!("template digest {digest:?}")))?;
    if size > MAX_TEMPLATE_ARCHIVE {
        return Err(TemplateError::Invalid(format!(
            "the template archive is {size} bytes, over the limit of {MAX_TEMPLATE_ARCHIVE}"
        )));
    }
    Ok((digest, size))
}

/// Why a template could not be used or received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// Not a valid reference, update or archive.
    #[error("{0}")]
    Invalid(String),
    /// This worker does not hold it (`template_missing: …`).
    #[error("{0}")]
    Missing(String),
    /// Its archive does not hold what its manifest says.
    #[error("{0}")]
    Refused(String),
    /// The store failed.
    #[error("{0}")]
    Internal(String),
}

/// Installs the template `digest` from the received archive `file` (rewound) into
/// the worker's store; layers it already holds are not unpacked again.
pub async fn receive(w: &Arc<Worker>, digest: Digest, file: File) -> Result<(), TemplateError> {
    let store = w.images.clone();
    let done = tokio::task::spawn_blocking(move || install_archive(&store, &digest, file)).await;
    match done {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(TemplateError::Refused(format!("template: {e}"))),
        Err(e) => Err(TemplateError::Internal(format!("template task: {e}"))),
    }
}

/// How long before its time of asking a template must have arrived for a sync's list
/// to judge it (a template received while the list was being made may be what the
/// list is too old to name).
const SETTLED_SECS: u64 = 2;

/// Drops from this worker's store every template the control plane's list `keep`
/// (from the sync asked for at `asked_at`, worker time) does not name, that arrived
/// before then and that no execution here runs on — and every layer and blob no
/// template left uses. A live execution recorded before records named their template
/// keeps every template (nothing tells which layers it runs on). Returns the digests
/// removed.
pub async fn sweep(
    w: &Arc<Worker>,
    keep: &[String],
    asked_at: u64,
) -> Result<Vec<Digest>, TemplateError> {
    if keep.len() > space_proto::api::MAX_KEPT_TEMPLATES {
        return Err(TemplateError::Invalid(format!(
            "a list of {} templates to keep; at most {}",
            keep.len(),
            space_proto::api::MAX_KEPT_TEMPLATES
        )));
    }
    let mut kept = keep
        .iter()
        .map(|d| {
            d.parse::<Digest>().map_err(|_| {
                TemplateError::Invalid(format!(
                    "template to keep {:?} is not a digest",
                    d.chars().take(80).collect::<String>()
                ))
            })
        })
        .collect::<Result<std::collections::HashSet<_>, _>>()?;
    let before = UNIX_EPOCH + Duration::from_secs(asked_at.saturating_sub(SETTLED_SECS));
    let blocking =
        |e: tokio::task::JoinError| TemplateError::Internal(format!("template sweep: {e}"));
    let failed = |e: ImageError| TemplateError::Internal(format!("template sweep: {e}"));
    // Nothing to remove, no lock taken (the common case, every resync): updates are
    // not held up for a sweep that has nothing to do.
    let Some(in_use) = used_by_executions(w)? else {
        return Ok(Vec::new());
    };
    let store = w.images.clone();
    let mut candidates = kept.clone();
    candidates.extend(in_use);
    let unkept = tokio::task::spawn_blocking(move || store.unkept(&candidates, before))
        .await
        .map_err(blocking)?
        .map_err(failed)?;
    if unkept.is_empty() {
        return Ok(Vec::new());
    }
    let swept = {
        // No install between the look at the records and the removal: an install
        // resolves its template, records it, then launches on its layers.
        let _applying = w.exclusive("the template sweep").await;
        let Some(in_use) = used_by_executions(w)? else {
            return Ok(Vec::new());
        };
        kept.extend(in_use);
        let store = w.images.clone();
        let swept = tokio::task::spawn_blocking(move || store.retain(&kept, before))
            .await
            .map_err(blocking)?
            .map_err(failed)?;
        let Some(swept) = swept else {
            tracing::debug!("template sweep put off: a template is being installed");
            return Ok(Vec::new());
        };
        swept
    };
    // The removed layers' files are deleted with nothing waiting for it (what a stop
    // cuts short stays in the store's tmp/, which its next start empties).
    let space_image::Swept {
        templates,
        layers,
        blobs,
        trash,
    } = swept;
    drop(tokio::task::spawn_blocking(move || drop(trash)));
    if !templates.is_empty() || layers > 0 || blobs > 0 {
        tracing::info!(
            templates = templates.len(),
            layers,
            blobs,
            "removed templates the control plane no longer has"
        );
    }
    Ok(templates)
}

/// The templates live executions here run on (their layers are those executions'
/// lower dirs); `None` when one was recorded before records named their template
/// (it may run on any).
fn used_by_executions(w: &Worker) -> Result<Option<Vec<Digest>>, TemplateError> {
    let records = w
        .records
        .all()
        .map_err(|e| TemplateError::Internal(format!("records: {e}")))?;
    let mut used = Vec::new();
    for r in records.iter().filter(|r| {
        matches!(
            r.state,
            RecordState::Starting | RecordState::Running | RecordState::Paused
        )
    }) {
        let Some(template) = &r.template else {
            tracing::info!(sandbox = %r.sandbox, "template sweep skipped: an execution recorded without its template runs here");
            return Ok(None);
        };
        if let Ok(Some(d)) = pinned_digest(template) {
            used.push(d);
        }
    }
    Ok(Some(used))
}

/// One member of the archive: where its bytes are in the file.
struct Member {
    offset: u64,
    size: u64,
}

/// Reads the archive's index (manifest first, then `blobs/sha256/<hex>`), then
/// installs the manifest with each blob read from its place in the file.
fn install_archive(
    store: &space_image::Store,
    digest: &Digest,
    mut file: File,
) -> Result<(), String> {
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut manifest = Vec::new();
    let mut blobs: std::collections::HashMap<Digest, Member> = Default::default();
    {
        let mut archive = tar::Archive::new(&mut file);
        let entries = archive.entries().map_err(|e| format!("archive: {e}"))?;
        for (i, entry) in entries.enumerate() {
            let mut entry = entry.map_err(|e| format!("archive: {e}"))?;
            if i > space_image::limits::MAX_LAYERS {
                return Err("the archive has more members than a template has layers".into());
            }
            let path = entry.path().map_err(|e| format!("archive: {e}"))?;
            let name = path.to_string_lossy().into_owned();
            if i == 0 {
                if name != MANIFEST_MEMBER {
                    return Err(format!(
                        "the archive's first member is {name:?}, not {MANIFEST_MEMBER}"
                    ));
                }
                if entry.size() > space_image::limits::MAX_JSON {
                    return Err("the template manifest is over its bound".into());
                }
                entry
                    .by_ref()
                    .take(space_image::limits::MAX_JSON)
                    .read_to_end(&mut manifest)
                    .map_err(|e| format!("manifest: {e}"))?;
                continue;
            }
            let blob = name
                .strip_prefix("blobs/sha256/")
                .and_then(Digest::from_hex)
                .ok_or_else(|| format!("unexpected member {name:?} in the template archive"))?;
            let member = Member {
                offset: entry.raw_file_position(),
                size: entry.size(),
            };
            blobs.insert(blob, member);
        }
    }
    if manifest.is_empty() {
        return Err("the archive holds no manifest".into());
    }
    let source = |blob: &Digest| -> io::Result<std::io::Take<File>> {
        let member = blobs.get(blob).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("blob {blob} is not in the archive"),
            )
        })?;
        let mut f = file.try_clone()?;
        f.seek(SeekFrom::Start(member.offset))?;
        Ok(f.take(member.size))
    };
    store
        .install(None, &manifest, digest, source)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample image's bundle as the control plane sends it, and its digest; `None`
    /// (with why) where this host cannot make it.
    fn bundle(dir: &std::path::Path) -> Option<(Vec<u8>, Digest)> {
        let busybox = std::path::Path::new("/bin/busybox");
        if !rustix::process::geteuid().is_root() || !busybox.exists() {
            eprintln!("SKIPPED: needs root (whiteouts) and /bin/busybox (busybox-static)");
            return None;
        }
        let archive = dir.join("image.tar");
        space_image::sample::write_docker_save(&archive, busybox).unwrap();
        let blobs = dir.join("control-blobs");
        let manifest = space_image::blobs::import_blobs(&archive, &blobs).unwrap();
        let mut out = Vec::new();
        space_image::blobs::write_bundle(&manifest, &blobs, &mut out).unwrap();
        Some((out, manifest.digest()))
    }

    fn file_of(bytes: &[u8], dir: &std::path::Path) -> File {
        let path = dir.join("received");
        std::fs::write(&path, bytes).unwrap();
        File::open(path).unwrap()
    }

    #[test]
    fn a_bundle_from_the_control_plane_installs_and_resolves_to_its_layers() {
        let dir = tempfile::tempdir().unwrap();
        let Some((bytes, digest)) = bundle(dir.path()) else {
            return;
        };
        let store = space_image::Store::open(dir.path().join("images")).unwrap();
        install_archive(&store, &digest, file_of(&bytes, dir.path())).unwrap();
        let r = store.resolve(&digest.to_string()).unwrap();
        assert_eq!(r.lower_dirs.len(), 2);
        assert!(r.lower_dirs[1].join("bin/busybox").is_file());
    }

    #[test]
    fn a_bundle_that_is_not_the_signed_template_is_refused_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let Some((bytes, digest)) = bundle(dir.path()) else {
            return;
        };
        let store = space_image::Store::open(dir.path().join("images")).unwrap();
        // Signed for another template.
        let other = Digest::of(b"another manifest");
        let err = install_archive(&store, &other, file_of(&bytes, dir.path())).unwrap_err();
        assert!(err.contains("digest"), "{err}");
        // A byte of the last blob changed: its digest no longer matches its manifest.
        let mut tampered = bytes.clone();
        let at = tampered.len() - 1024 - 600;
        tampered[at] ^= 0x55;
        let err = install_archive(&store, &digest, file_of(&tampered, dir.path())).unwrap_err();
        assert!(err.contains("sha256"), "{err}");
        assert!(
            store.resolve(&digest.to_string()).is_err(),
            "a template was kept"
        );
        // A first member that is not the manifest.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_data(&mut h, "blobs/sha256/00", &b"{}"[..])
            .unwrap();
        let odd = b.into_inner().unwrap();
        let err = install_archive(&store, &digest, file_of(&odd, dir.path())).unwrap_err();
        assert!(err.contains("first member"), "{err}");
    }

    /// The sample image with `content` standing in for its busybox, installed into
    /// `w`'s store by digest as the control plane sends it; `None` without root (the
    /// sample has whiteouts).
    fn install_sample(w: &Worker, dir: &std::path::Path, content: &[u8]) -> Option<Digest> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (the sample image has whiteouts)");
            return None;
        }
        let tag = Digest::of(content).hex();
        let stand_in = dir.join(format!("busybox-{tag}"));
        std::fs::write(&stand_in, content).unwrap();
        let archive = dir.join(format!("image-{tag}.tar"));
        space_image::sample::write_docker_save(&archive, &stand_in).unwrap();
        let blobs = dir.join("control-blobs");
        let manifest = space_image::blobs::import_blobs(&archive, &blobs).unwrap();
        let mut bundle = Vec::new();
        space_image::blobs::write_bundle(&manifest, &blobs, &mut bundle).unwrap();
        let digest = manifest.digest();
        install_archive(&w.images, &digest, file_of(&bundle, dir)).unwrap();
        Some(digest)
    }

    /// Sandbox `n`'s execution recorded in `state`, on `template`.
    fn execution(
        n: u8,
        state: RecordState,
        template: Option<String>,
    ) -> super::super::records::ExecutionRecord {
        super::super::records::ExecutionRecord {
            sandbox: space_identity::SandboxId::from_bytes([n; 16]),
            generation: space_identity::Generation(1),
            execution_id: space_identity::ExecutionId::from_bytes([n; 16]),
            substrate: space_identity::Substrate::Jail,
            activation: 1,
            state,
            secret: [7; 32],
            handle: None,
            bridge: None,
            env: Default::default(),
            ports: Vec::new(),
            network: space_proto::api::Policy::none(),
            defaults: Default::default(),
            template,
            updated_at: 100,
        }
    }

    fn now() -> u64 {
        super::super::state::now_secs()
    }

    #[tokio::test]
    async fn a_sync_list_removes_the_templates_it_does_not_name_unless_an_execution_runs_on_one() {
        let data = tempfile::tempdir().unwrap();
        let w = crate::daemon::node_api::tests::bare_worker(&data, "tsweep");
        let Some(a) = install_sample(&w, data.path(), b"a") else {
            return;
        };
        let (b, c) = (
            install_sample(&w, data.path(), b"b").unwrap(),
            install_sample(&w, data.path(), b"c").unwrap(),
        );
        let b_layers = w.images.resolve(&b.to_string()).unwrap().lower_dirs;
        // c is what a sandbox runs on; the list (asked for after all three arrived)
        // names a only.
        w.records
            .put(&execution(
                1,
                RecordState::Running,
                Some(format!("c:1@{c}")),
            ))
            .unwrap();
        let asked = now() + 5;
        let removed = sweep(&w, &[a.to_string()], asked).await.unwrap();
        assert_eq!(removed, [b]);
        assert!(b_layers.iter().all(|d| !d.exists()), "b's layers were kept");
        assert!(matches!(
            w.images.resolve(&b.to_string()),
            Err(ImageError::NotFound(_))
        ));
        let c_layers = w.images.resolve(&c.to_string()).unwrap().lower_dirs;
        assert!(
            c_layers.iter().all(|d| d.is_dir()),
            "a running sandbox's layers went"
        );
        assert!(w.images.resolve(&a.to_string()).is_ok());
        // Its execution retired, c goes with the next list.
        w.records
            .put(&execution(
                1,
                RecordState::Retired,
                Some(format!("c:1@{c}")),
            ))
            .unwrap();
        assert_eq!(sweep(&w, &[a.to_string()], asked).await.unwrap(), [c]);
        // A template that arrived after the list was asked for is not the list's to
        // judge.
        let d = install_sample(&w, data.path(), b"d").unwrap();
        let asked_before = now() - 10;
        assert!(sweep(&w, &[], asked_before).await.unwrap().is_empty());
        assert!(w.images.resolve(&d.to_string()).is_ok());
    }

    /// `update` signed by `anchor` for the test worker, number `seq`.
    fn signed(
        anchor: &space_identity::BundleSigner,
        seq: u64,
        update: Update,
    ) -> space_proto::api::SignedUpdate {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let body = serde_json::to_vec(&space_proto::api::UpdateBody {
            worker: space_testkit::worker("w1"),
            issued_at: now(),
            seq,
            update,
        })
        .unwrap();
        space_proto::api::SignedUpdate {
            signature: b64.encode(anchor.sign_update(&body)),
            body: b64.encode(&body),
        }
    }

    #[tokio::test]
    async fn a_resync_removes_what_its_signed_list_does_not_name_and_a_forged_list_nothing() {
        let data = tempfile::tempdir().unwrap();
        let w = crate::daemon::node_api::tests::bare_worker(&data, "tsweep-sync");
        let keys = space_testkit::TestKeys::new();
        crate::daemon::node_api::tests::enroll(&w, &keys, &[space_identity::Purpose::Control]);
        let Some(a) = install_sample(&w, data.path(), b"a") else {
            return;
        };
        let b = install_sample(&w, data.path(), b"b").unwrap();
        let list = |anchor: &space_identity::BundleSigner, seq| {
            vec![signed(
                anchor,
                seq,
                Update::Templates {
                    keep: vec![a.to_string()],
                },
            )]
        };
        let asked = i64::try_from(now()).unwrap() + 5;
        // Signed by another anchor: refused whole, nothing removed.
        let forger = space_identity::BundleSigner::from_seed([9; 32]);
        super::super::sync::resync(&w, list(&forger, 1), asked).await;
        assert!(
            w.images.resolve(&b.to_string()).is_ok(),
            "a forged list removed b"
        );
        super::super::sync::resync(&w, list(&keys.anchor, 2), asked).await;
        assert!(matches!(
            w.images.resolve(&b.to_string()),
            Err(ImageError::NotFound(_))
        ));
        assert!(w.images.resolve(&a.to_string()).is_ok());
    }

    #[tokio::test]
    async fn a_live_execution_recorded_without_its_template_keeps_every_template() {
        let data = tempfile::tempdir().unwrap();
        let w = crate::daemon::node_api::tests::bare_worker(&data, "tsweep-old");
        let Some(a) = install_sample(&w, data.path(), b"a") else {
            return;
        };
        // Recorded before records named their template: it may run on a.
        w.records
            .put(&execution(2, RecordState::Paused, None))
            .unwrap();
        assert!(sweep(&w, &[], now() + 5).await.unwrap().is_empty());
        assert!(w.images.resolve(&a.to_string()).is_ok());
    }

    #[tokio::test]
    async fn a_templates_list_on_its_own_or_naming_no_digest_is_refused_and_removes_nothing() {
        let data = tempfile::tempdir().unwrap();
        let w = crate::daemon::node_api::tests::bare_worker(&data, "tsweep-bad");
        let alone =
            crate::daemon::updates::apply(&w, Vec::new(), Update::Templates { keep: Vec::new() })
                .await;
        assert!(
            matches!(&alone, Err(crate::daemon::updates::UpdateError::Invalid(m)) if m.contains("with a sync")),
            "{alone:?}"
        );
        let installed = install_sample(&w, data.path(), b"a");
        let bad = sweep(&w, &["sha256:nothex".into()], now() + 5).await;
        assert!(matches!(bad, Err(TemplateError::Invalid(_))), "{bad:?}");
        if let Some(a) = installed {
            assert!(
                w.images.resolve(&a.to_string()).is_ok(),
                "a bad list removed a template"
            );
        }
    }

    #[test]
    fn a_bundle_whose_layer_unpacks_past_the_workers_bound_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        // 8 MiB of zeros: a layer blob of a few KiB.
        let mut rootfs = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(8 << 20);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        rootfs
            .append_data(&mut h, "zeros", io::repeat(0).take(8 << 20))
            .unwrap();
        let rootfs = rootfs.into_inner().unwrap();
        let image = dir.path().join("bomb");
        let spec = space_image::rootfs::ImageSpec::debian(None);
        let dir_format = space_image::rootfs::LayoutFormat::Dir;
        space_image::rootfs::layout_from_rootfs(&rootfs[..], &spec, &image, dir_format).unwrap();
        // The control plane's bounds hold it; this worker's do not.
        let blobs = dir.path().join("control-blobs");
        let manifest = space_image::blobs::import_blobs(&image, &blobs).unwrap();
        let mut bundle = Vec::new();
        space_image::blobs::write_bundle(&manifest, &blobs, &mut bundle).unwrap();
        assert!(bundle.len() < 1 << 20, "{} bytes", bundle.len());
        let store = space_image::Store::open(dir.path().join("images"))
            .unwrap()
            .with_limits(space_image::ImageLimits {
                max_layer_bytes: 1 << 20,
                max_image_bytes: 1 << 30,
            });
        let digest = manifest.digest();
        let err = install_archive(&store, &digest, file_of(&bundle, dir.path())).unwrap_err();
        assert!(
            err.contains("SPACE_TEMPLATE_MAX_LAYER_BYTES") && err.contains("1048576"),
            "{err}"
        );
        assert!(store.resolve(&digest.to_string()).is_err());
        let layers = std::fs::read_dir(store.root().join("layers"))
            .unwrap()
            .count();
        assert_eq!(layers, 0, "a layer was kept");
    }

    #[test]
    fn an_installs_template_is_the_default_or_pinned_by_its_digest() {
        let hex = "ab".repeat(32);
        assert_eq!(pinned_digest("default").unwrap(), None);
        let d = pinned_digest(&format!("sha256:{hex}")).unwrap().unwrap();
        assert_eq!(d.hex(), hex);
        assert_eq!(
            pinned_digest(&format!("python:3.12@sha256:{hex}")).unwrap(),
            Some(d)
        );
        // A bare name is never resolved on a worker: the control plane pins it.
        assert!(pinned_digest("python:3.12").is_err());
        assert!(pinned_digest("sha256:nothex").is_err());
    }

    #[test]
    fn an_images_defaults_keep_what_a_process_can_use() {
        let config = ImageDefaults {
            env: vec![
                "PATH=/usr/local/bin:/usr/bin".into(),
                "EMPTY=".into(),
                "=nokey".into(),
                "NOEQUALS".into(),
            ],
            working_dir: Some("relative".into()),
            user: Some("app:staff".into()),
            entrypoint: None,
            cmd: Some(vec!["python3".into()]),
        };
        let d = Defaults::of(&config);
        assert_eq!(
            d.env,
            [
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin".to_owned()),
                ("EMPTY".to_owned(), String::new())
            ]
        );
        assert_eq!(d.cwd, None);
        assert_eq!(d.user.as_deref(), Some("app"));
    }
}
