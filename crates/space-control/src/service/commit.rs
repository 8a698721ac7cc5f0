//! A sandbox's changes committed as a new template (`POST /v1/sandboxes/{id}/commit`,
//! what `space template build --run` does after each step): the sandbox is frozen and
//! its writable layer archived as for a snapshot, thawed again at once, and the
//! archive — overlay whiteouts and opaque directories — rewritten as an OCI layer
//! (`.wh.` entries, gzip) into the blob store; the new template is the sandbox's
//! template's layers plus that one, with the same process defaults, bound to the name
//! asked for. Sandboxes of the host-directories `default` have no layers to build on
//! and are refused.

use std::path::PathBuf;

use space_image::blobs;
use space_image::manifest::{SCHEMA, TemplateManifest};
use space_image::rootfs;
use space_image::{ImageError, TemplateRef};
use space_proto::api::templates::TemplateView;
use space_store::{SandboxRecord, SandboxState, TemplateRecord};

use super::plane::ControlPlane;
use super::templates::pinned_digest;
use crate::error::ControlError;
use crate::now_secs;

fn internal(what: &str, e: impl std::fmt::Display) -> ControlError {
    ControlError::Internal(format!("{what}: {e}"))
}

fn layer_error(e: ImageError) -> ControlError {
    match e {
        ImageError::Io { .. } => internal("commit", e),
        // The sandbox's own files cannot be said in a layer (a renamed directory, a
        // name beginning `.wh.`, …): the caller's to change.
        other => ControlError::Conflict(format!(
            "the sandbox's changes cannot be committed: {other}"
        )),
    }
}

/// The manifest of `base` with `layer` on top, made `created`.
pub(crate) fn committed_manifest(
    base: &TemplateManifest,
    layer: space_image::LayerRecord,
    created: String,
) -> Result<TemplateManifest, ControlError> {
    let mut layers = base.layers.clone();
    layers.push(layer);
    let m = TemplateManifest {
        schema: SCHEMA,
        architecture: base.architecture.clone(),
        os: base.os.clone(),
        created: Some(created),
        config: base.config.clone(),
        layers,
    };
    m.validate()
        .map_err(|e| ControlError::Conflict(format!("cannot commit: {e}")))?;
    Ok(m)
}

impl ControlPlane {
    /// Commits the changes of sandbox `s` (running or paused) as the template
    /// `reference` (`name[:tag]`); answers the new template.
    pub async fn commit_sandbox(
        &self,
        s: &SandboxRecord,
        reference: &str,
    ) -> Result<TemplateView, ControlError> {
        let name =
            TemplateRef::parse(reference).map_err(|e| ControlError::BadRequest(e.to_string()))?;
        let Some(base_digest) = pinned_digest(&s.template) else {
            return Err(ControlError::Conflict(
                "the sandbox runs on the host's directories (the `default` template): there \
                 are no image layers to commit its changes onto; create it from an image \
                 template"
                    .into(),
            ));
        };
        let base = self
            .store
            .template_by_digest(base_digest)
            .await?
            .ok_or_else(|| {
                ControlError::Conflict(format!(
                    "the sandbox's template {base_digest} is no longer kept here"
                ))
            })?;
        let base_manifest: TemplateManifest = serde_json::from_str(&base.manifest)
            .map_err(|e| internal("stored template manifest", e))?;
        let before = s.state;
        if !matches!(before, SandboxState::Running | SandboxState::Paused) {
            return Err(ControlError::Conflict(format!(
                "the sandbox is {}",
                before.as_str()
            )));
        }
        let archive_path = self.commit_spool_path()?;
        {
            let _busy = self.transition(s.id)?;
            let src = self.running_execution(&s.id).await?;
            self.store
                .set_sandbox_state(&s.id, SandboxState::Migrating, Some(before))
                .await?;
            let taken = self
                .take_snapshot(s, &src, Some(archive_path.clone()))
                .await;
            // Thawed (and `before` again) as soon as its layer is archived: the
            // conversion below needs only the archive.
            self.abandon(s, &src, before).await;
            if let Err(e) = taken {
                let _ = std::fs::remove_file(&archive_path);
                return Err(e);
            }
        }
        let blob_root = self.template_dir().join("blobs");
        let from = archive_path.clone();
        let converted = tokio::task::spawn_blocking(move || {
            let r = convert(&from, &blob_root);
            let _ = std::fs::remove_file(&from);
            r
        })
        .await
        .map_err(|e| internal("commit task", e))??;
        let manifest = committed_manifest(
            &base_manifest,
            converted.record(),
            space_proto::api::rfc3339(now_secs()),
        )?;
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
        tracing::info!(sandbox = %s.id, template = %name, digest = %record.digest,
            layer = %converted.digest, layer_bytes = converted.size, "sandbox committed as a template");
        self.template(&name.to_string()).await
    }

    /// A new path for a commit's archive, in `<data>/templates/spool` (0700).
    fn commit_spool_path(&self) -> Result<PathBuf, ControlError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.template_dir().join("spool");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| internal("template spool", e))?;
        let r: [u8; 8] = crate::random_bytes();
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        Ok(dir.join(format!("commit-{hex}.tar")))
    }
}

/// The OCI layer of the upper archive at `archive`, kept in `blob_root` (written to
/// `blob_root/tmp`, synced, renamed to its digest).
fn convert(
    archive: &std::path::Path,
    blob_root: &std::path::Path,
) -> Result<rootfs::LayerBlob, ControlError> {
    use std::os::unix::fs::DirBuilderExt;
    let tmp = blob_root.join("tmp");
    let sha = blob_root.join("sha256");
    for d in [&tmp, &sha] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(|e| internal("blob store", e))?;
    }
    let input = std::fs::File::open(archive).map_err(|e| internal("commit archive", e))?;
    let spool = tempfile::NamedTempFile::new_in(&tmp).map_err(|e| internal("blob spool", e))?;
    let layer = {
        let out = std::io::BufWriter::with_capacity(256 << 10, spool.as_file());
        rootfs::layer_from_overlay_upper(std::io::BufReader::with_capacity(256 << 10, input), out)
            .map_err(layer_error)?
    };
    spool
        .as_file()
        .sync_all()
        .map_err(|e| internal("blob spool", e))?;
    let target = blobs::blob_path(blob_root, &layer.digest);
    if !target.is_file() {
        spool
            .persist(&target)
            .map_err(|e| internal("store blob", e.error))?;
        std::fs::File::open(&sha)
            .and_then(|d| d.sync_all())
            .map_err(|e| internal("sync blob store", e))?;
    }
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use space_image::{Digest, ImageDefaults, LayerRecord};

    use super::*;

    fn layer(n: u8) -> LayerRecord {
        LayerRecord {
            digest: Digest::of(&[n]),
            diff_id: Digest::of(&[n, n]),
            size: u64::from(n),
            media_type: rootfs::LAYER_MEDIA_TYPE.into(),
        }
    }

    #[test]
    fn a_commit_is_its_base_with_one_layer_on_top_and_the_same_defaults() {
        let base = TemplateManifest {
            schema: SCHEMA,
            architecture: "amd64".into(),
            os: "linux".into(),
            created: None,
            config: ImageDefaults {
                env: vec!["PATH=/bin".into()],
                ..Default::default()
            },
            layers: vec![layer(1), layer(2)],
        };
        let m = committed_manifest(&base, layer(3), "2026-01-01T00:00:00Z".into())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.layers, vec![layer(1), layer(2), layer(3)]);
        assert_eq!(m.config, base.config);
        assert_ne!(m.digest(), base.digest());
    }

    #[test]
    fn a_commit_past_the_layer_bound_is_refused() {
        let base = TemplateManifest {
            schema: SCHEMA,
            architecture: "amd64".into(),
            os: "linux".into(),
            created: None,
            config: ImageDefaults::default(),
            layers: (0..128).map(|i| layer(i as u8)).collect(),
        };
        let e = committed_manifest(&base, layer(200), "t".into()).map(|_| ());
        assert!(
            matches!(&e, Err(ControlError::Conflict(m)) if m.contains("number of layers")),
            "{e:?}"
        );
    }
}
