//! Templates published by the control plane: imported from an image archive into its
//! blob store (`<data>/templates/blobs`, never unpacked here: the control plane may
//! run unprivileged, and a worker unpacks the layers it needs once), named in the
//! store (`name:tag` → digest, immutable), listed and removed; a create pins the
//! digest in the sandbox's record (`NAME:TAG@sha256:<hex>`), and an install a
//! worker refuses for a template it lacks (`409 template_missing…`) is answered by
//! pushing the template there (`POST /internal/v1/templates`, signed) and retrying
//! the install once. Templates are pushed on demand only, never ahead of a create.

use std::path::{Path, PathBuf};

use space_image::blobs;
use space_image::{TemplateManifest, TemplateRef};
use space_proto::api::templates::{TemplateConfig, TemplateList, TemplateView};
use space_proto::api::{ErrorBody, InstallExecution, Update, UpdateAck};
use space_store::{TemplateRecord, WorkerRecord};

use super::plane::ControlPlane;
use crate::error::ControlError;
use crate::now_secs;

pub use super::plane::DEFAULT_TEMPLATE;

/// The prefix of a worker's refusal of an install whose template it lacks.
pub const TEMPLATE_MISSING: &str = "template_missing";

/// The digest a sandbox's `template` is pinned to (`NAME:TAG@sha256:<hex>`); `None`
/// for `default`.
pub fn pinned_digest(template: &str) -> Option<&str> {
    template.rsplit_once('@').map(|(_, d)| d)
}

/// Whether a worker's answer refuses an install for a template it lacks.
fn is_template_missing(status: axum::http::StatusCode, body: &[u8]) -> bool {
    status == axum::http::StatusCode::CONFLICT
        && serde_json::from_slice::<ErrorBody>(body)
            .is_ok_and(|b| b.message.starts_with(TEMPLATE_MISSING))
}

fn image_error(e: space_image::ImageError) -> ControlError {
    use space_image::ImageError as E;
    match e {
        E::Io { .. } => ControlError::Internal(format!("template store: {e}")),
        E::Limit { .. } | E::Unpacked { .. } => ControlError::TooLarge(e.to_string()),
        other => ControlError::BadRequest(other.to_string()),
    }
}

fn blocking_failed(e: tokio::task::JoinError) -> ControlError {
    ControlError::Internal(format!("template task: {e}"))
}

/// The API view of a stored template.
fn view_of(t: &TemplateRecord) -> Result<TemplateView, ControlError> {
    let m = manifest_of(t)?;
    Ok(TemplateView {
        name: t.name.clone(),
        tag: t.tag.clone(),
        digest: t.digest.clone(),
        layers: m.layers.len() as u32,
        size: t.size,
        created: space_proto::api::rfc3339(t.created_at.max(0) as u64),
        config: TemplateConfig {
            env: m.config.env,
            working_dir: m.config.working_dir,
            user: m.config.user,
            entrypoint: m.config.entrypoint,
            cmd: m.config.cmd,
        },
    })
}

fn manifest_of(t: &TemplateRecord) -> Result<TemplateManifest, ControlError> {
    serde_json::from_str(&t.manifest).map_err(|e| {
        ControlError::Internal(format!(
            "stored manifest of template {}: {e}",
            t.reference()
        ))
    })
}

fn parse_ref(reference: &str) -> Result<TemplateRef, ControlError> {
    TemplateRef::parse(reference).map_err(|e| ControlError::BadRequest(e.to_string()))
}

impl ControlPlane {
    /// Where templates are kept: `<data>/templates` (beside `snapshots`).
    pub fn template_dir(&self) -> PathBuf {
        self.snapshot_dir
            .parent()
            .map_or_else(|| PathBuf::from("templates"), |d| d.join("templates"))
    }

    fn blob_root(&self) -> PathBuf {
        self.template_dir().join("blobs")
    }

    /// The largest image archive an import takes.
    pub fn max_template_bytes(&self) -> u64 {
        self.max_template_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the largest image archive an import takes (tests choose a small one).
    pub fn set_max_template_bytes(&self, n: u64) {
        self.max_template_bytes
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// A new spool file for an upload, in `<data>/templates/spool` (0700, the file
    /// 0600, removed when dropped).
    pub async fn template_spool(&self) -> Result<tempfile::NamedTempFile, ControlError> {
        let dir = self.template_dir().join("spool");
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)?;
            tempfile::Builder::new().prefix("import-").tempfile_in(&dir)
        })
        .await
        .map_err(blocking_failed)?
        .map_err(|e| ControlError::Internal(format!("template spool: {e}")))
    }

    /// Imports the image archive at `archive` as `reference` (`name[:tag]`): its
    /// blobs verified into the blob store (each layer decompressed within the limits'
    /// [`templates`](crate::limits::LimitsPolicy::templates) bounds: 413 past them),
    /// its manifest bound to the name.
    pub async fn import_template(
        &self,
        reference: &str,
        archive: &Path,
    ) -> Result<TemplateView, ControlError> {
        let name = parse_ref(reference)?;
        let (archive, root) = (archive.to_owned(), self.blob_root());
        let limits = self.limits_policy().templates;
        let manifest = tokio::task::spawn_blocking(move || {
            blobs::import_blobs_bounded(&archive, &root, &limits)
        })
        .await
        .map_err(blocking_failed)?
        .map_err(image_error)?;
        let record = TemplateRecord {
            name: name.name.clone(),
            tag: name.tag.clone(),
            digest: manifest.digest().to_string(),
            manifest: String::from_utf8_lossy(&manifest.canonical_json()).into_owned(),
            size: manifest.blob_bytes(),
            created_at: now_secs() as i64,
        };
        match self.store.put_template(&record).await {
            Ok(_) => {}
            Err(space_store::StoreError::Conflict(m)) => return Err(ControlError::Conflict(m)),
            Err(e) => return Err(e.into()),
        }
        tracing::info!(template = %name, digest = %record.digest, layers = manifest.layers.len(), "template imported");
        // A second import of the same digest keeps the first import's time.
        let stored = self
            .store
            .template(&name.name, &name.tag)
            .await?
            .unwrap_or(record);
        view_of(&stored)
    }

    /// Every template.
    pub async fn templates(&self) -> Result<TemplateList, ControlError> {
        let templates = self
            .store
            .list_templates()
            .await?
            .iter()
            .map(view_of)
            .collect::<Result<_, _>>()?;
        Ok(TemplateList { templates })
    }

    /// The template `reference` names (`name[:tag]`); 404 when none.
    pub async fn template(&self, reference: &str) -> Result<TemplateView, ControlError> {
        view_of(&self.template_record(reference).await?)
    }

    async fn template_record(&self, reference: &str) -> Result<TemplateRecord, ControlError> {
        let r = parse_ref(reference)?;
        self.store
            .template(&r.name, &r.tag)
            .await?
            .ok_or(ControlError::NotFound("template"))
    }

    /// Removes the name `reference`: refused (`409 template_in_use`) while live
    /// sandboxes are pinned to its digest and no other name keeps it; then every
    /// blob no template references any more is deleted.
    pub async fn remove_template(&self, reference: &str) -> Result<(), ControlError> {
        let t = self.template_record(reference).await?;
        let others = self
            .store
            .list_templates()
            .await?
            .into_iter()
            .any(|o| o.digest == t.digest && (o.name != t.name || o.tag != t.tag));
        if !others {
            let live = self
                .store
                .count_live_sandboxes_with_template(&t.digest)
                .await?;
            if live > 0 {
                return Err(ControlError::TemplateInUse {
                    template: t.reference(),
                    live,
                });
            }
        }
        self.store.delete_template(&t.name, &t.tag).await?;
        let mut keep = Vec::new();
        for o in self.store.list_templates().await? {
            keep.extend(manifest_of(&o)?.layers.iter().map(|l| l.digest));
        }
        let root = self.blob_root();
        let removed = tokio::task::spawn_blocking(move || blobs::remove_unreferenced(&root, &keep))
            .await
            .map_err(blocking_failed)?
            .map_err(image_error)?;
        tracing::info!(template = %t.reference(), digest = %t.digest, blobs_removed = removed, "template removed");
        Ok(())
    }

    /// The update of a worker's sync that names every template kept here: the worker
    /// removes what it received before asking that the list does not name (and that
    /// no execution of its own runs on).
    pub(super) async fn templates_to_keep(&self) -> Result<Update, ControlError> {
        let mut keep: Vec<String> = self
            .store
            .list_templates()
            .await?
            .into_iter()
            .map(|t| t.digest)
            .collect();
        keep.sort();
        keep.dedup();
        if keep.len() > space_proto::api::MAX_KEPT_TEMPLATES {
            return Err(ControlError::Internal(format!(
                "{} templates: more than a worker's sync lists",
                keep.len()
            )));
        }
        Ok(Update::Templates { keep })
    }

    /// What a create's `template` becomes in the sandbox's record: `default` as is,
    /// a name pinned to its digest (`NAME:TAG@sha256:<hex>`); an unknown name is
    /// `400 unknown template "x"`.
    pub(super) async fn pin_template(&self, requested: &str) -> Result<String, ControlError> {
        if requested == DEFAULT_TEMPLATE {
            return Ok(requested.to_owned());
        }
        let unknown = || ControlError::BadRequest(format!("unknown template {requested:?}"));
        let r = TemplateRef::parse(requested).map_err(|_| unknown())?;
        let t = self
            .store
            .template(&r.name, &r.tag)
            .await?
            .ok_or_else(unknown)?;
        Ok(format!("{}@{}", t.reference(), t.digest))
    }

    /// Delivers an install; a worker that lacks its template (`409 template_missing`)
    /// is sent the template, then the install once more.
    pub(super) async fn deliver_install(
        &self,
        w: &WorkerRecord,
        install: InstallExecution,
    ) -> Result<UpdateAck, ControlError> {
        let answer = self
            .deliver_answer(w, Update::Install(install.clone()))
            .await?;
        let (status, body) = match answer {
            Ok(ack) => return Ok(ack),
            Err(refusal) => refusal,
        };
        let Some(digest) =
            pinned_digest(&install.template).filter(|_| is_template_missing(status, &body))
        else {
            return Err(super::channel::refused(w, status, &body));
        };
        match self.push_template(w, digest).await {
            Ok(()) => self.metrics.template_pushed("ok"),
            Err(e) => {
                self.metrics.template_pushed("failed");
                return Err(e);
            }
        }
        match self.deliver_answer(w, Update::Install(install)).await? {
            Ok(ack) => Ok(ack),
            Err((status, body)) => Err(super::channel::refused(w, status, &body)),
        }
    }

    /// Sends the template `digest` to `w` (`POST /internal/v1/templates`): its
    /// bundle is written to a spool file first (its length is signed before a byte
    /// is sent).
    async fn push_template(&self, w: &WorkerRecord, digest: &str) -> Result<(), ControlError> {
        let t = self
            .store
            .template_by_digest(digest)
            .await?
            .ok_or_else(|| {
                ControlError::Conflict(format!(
                    "worker {} lacks template {digest}, and no template of that digest is kept here any more",
                    w.id
                ))
            })?;
        let manifest = manifest_of(&t)?;
        if manifest.digest().to_string() != t.digest {
            return Err(ControlError::Internal(format!(
                "the stored manifest of template {} is not its digest",
                t.reference()
            )));
        }
        let spool = self.template_spool().await?;
        let root = self.blob_root();
        let file = spool
            .as_file()
            .try_clone()
            .map_err(|e| ControlError::Internal(format!("template spool: {e}")))?;
        let size = tokio::task::spawn_blocking(move || -> Result<u64, ControlError> {
            let mut out = std::io::BufWriter::with_capacity(256 << 10, file);
            let n = blobs::write_bundle(&manifest, &root, &mut out).map_err(image_error)?;
            out.into_inner()
                .map_err(|e| ControlError::Internal(format!("template spool: {}", e.error())))?;
            Ok(n)
        })
        .await
        .map_err(blocking_failed)??;
        let update = self
            .sign_update(
                &w.id,
                Update::Template {
                    digest: t.digest.clone(),
                    size,
                },
            )
            .await?;
        let body = spool
            .reopen()
            .map_err(|e| ControlError::Internal(format!("template spool: {e}")))?;
        tracing::info!(worker = %w.id, template = %t.reference(), digest = %t.digest, size, "sending a template the worker lacks");
        self.send_template(w, &update, body, size).await
    }
}

#[cfg(test)]
mod tests {
    use space_image::Digest;

    use super::*;

    #[test]
    fn a_pinned_template_names_its_digest_and_default_none() {
        let d = Digest::of(b"m").to_string();
        assert_eq!(pinned_digest(&format!("py:3.12@{d}")), Some(d.as_str()));
        assert_eq!(pinned_digest(DEFAULT_TEMPLATE), None);
    }

    #[test]
    fn only_a_conflict_whose_message_says_template_missing_asks_for_a_push() {
        use axum::http::StatusCode;
        let body = |m: &str| {
            serde_json::to_vec(&serde_json::json!({"error": "update_refused", "message": m}))
                .unwrap_or_default()
        };
        assert!(is_template_missing(
            StatusCode::CONFLICT,
            &body("template_missing: sha256:…")
        ));
        assert!(!is_template_missing(
            StatusCode::CONFLICT,
            &body("replay of update 7")
        ));
        assert!(!is_template_missing(
            StatusCode::BAD_REQUEST,
            &body("template_missing")
        ));
        assert!(!is_template_missing(
            StatusCode::CONFLICT,
            b"template_missing"
        ));
    }
}
