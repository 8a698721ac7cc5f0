//! Migrations and snapshots: the source freezes and archives the writable layer, the
//! archive streams through a file here (hashed as it arrives), the target checks the
//! signed digest and size and unpacks it, and the next execution starts there.

use space_identity::{Generation, SandboxId, WorkerId};
use space_proto::api::Update;
use space_store::{ExecutionRecord, SandboxRecord, SandboxState};

use super::plane::ControlPlane;
use crate::error::ControlError;

impl ControlPlane {
    /// Moves a sandbox to `target` as a new execution (next generation, new execution
    /// ID, fresh activation secret): the source is frozen and its writable layer
    /// archived; the archive's digest is signed and the layer handed to the target,
    /// which checks it before unpacking; the new execution is installed and
    /// acknowledged running before any capability names it; only then is the source
    /// retired (it keeps a tombstone). On failure the source is thawed and stays.
    pub async fn migrate(&self, s: &SandboxRecord, target: &WorkerId) -> Result<(), ControlError> {
        let before = s.state;
        if !matches!(before, SandboxState::Running | SandboxState::Paused) {
            return Err(ControlError::Conflict(format!(
                "the sandbox is {}",
                before.as_str()
            )));
        }
        let src = self.running_execution(&s.id).await?;
        if src.worker == *target {
            return Err(ControlError::Conflict(format!(
                "the sandbox already runs on {target}"
            )));
        }
        self.place(Some(target), None, src.substrate).await?;
        let _busy = self.transition(s.id)?;
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(before))
            .await?;
        match self.move_execution(s, &src, target).await {
            Ok(()) => {
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(SandboxState::Migrating))
                    .await?;
                Ok(())
            }
            Err(e) => {
                self.abandon(s, &src, before).await;
                Err(e)
            }
        }
    }

    /// After a failed snapshot or migration: the source was frozen for the snapshot
    /// and carries on as it was (`before`). If it cannot be thawed now (its worker is
    /// down), the sandbox stays `migrating` and the reconciler finishes the job later.
    pub(super) async fn abandon(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        before: SandboxState,
    ) {
        let mut thawed = before != SandboxState::Running;
        if !thawed {
            if let Ok(w) = self.store.get_worker(&src.worker).await {
                let thaw = Update::Unfreeze {
                    sandbox: s.id,
                    generation: src.generation,
                    execution_id: src.execution_id,
                };
                thawed = self.deliver(&w, thaw).await.is_ok();
            }
        }
        if thawed {
            let _ = self
                .store
                .set_sandbox_state(&s.id, before, Some(SandboxState::Migrating))
                .await;
        }
    }

    pub(super) async fn move_execution(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        target: &WorkerId,
    ) -> Result<(), ControlError> {
        let archive = self.take_snapshot(s, src, None).await?;
        self.restore(s, src, target, archive).await
    }

    /// Freezes `src` on its worker and streams its writable layer into a file in the
    /// snapshot directory (`keep_as`, or a temporary one removed when the archive is
    /// dropped), hashed as it arrives: no archive is ever held in memory.
    pub(super) async fn take_snapshot(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        keep_as: Option<std::path::PathBuf>,
    ) -> Result<Archive, ControlError> {
        let sw = self.store.get_worker(&src.worker).await?;
        // The sandbox is `migrating` already: no resolve names `src` any more, and the
        // rebuilt attempts that were resolved to it arrive before it is frozen.
        self.arrivals
            .let_rebuilt_attempts_arrive(&s.id, src.generation)
            .await;
        self.step(&s.id, format!("freezing and archiving on {}", sw.id))
            .await;
        let snapshot = self
            .sign_update(
                &sw.id,
                Update::Snapshot {
                    sandbox: s.id,
                    generation: src.generation,
                    execution_id: src.execution_id,
                },
            )
            .await?;
        let dir = self.snapshot_dir.clone();
        let (file, path) = tokio::task::spawn_blocking(move || Archive::create(&dir, &s_id_tmp()))
            .await
            .map_err(|e| ControlError::Internal(e.to_string()))?
            .map_err(|e| ControlError::Internal(format!("snapshot spool: {e}")))?;
        let mut archive = Archive {
            file: file
                .try_clone()
                .map_err(|e| ControlError::Internal(e.to_string()))?,
            path: Some(path),
            size: 0,
            digest: String::new(),
        };
        let sink = space_http::HashingFile::new(file);
        let (sink, size) = self.fetch_layer(&sw, &snapshot, sink).await?;
        let file = sink
            .out
            .into_inner()
            .map_err(|e| ControlError::Internal(format!("snapshot spool: {}", e.error())))?;
        archive.size = size;
        archive.digest = sink.hash.finalize().to_hex().to_string();
        let synced = tokio::task::spawn_blocking(move || file.sync_all()).await;
        if !matches!(synced, Ok(Ok(()))) {
            return Err(ControlError::Internal(
                "snapshot spool: fsync failed".into(),
            ));
        }
        if let Some(keep) = keep_as {
            archive.keep_as(keep)?;
        }
        Ok(archive)
    }

    /// Hands `archive` to `target` under a signed digest, starts the next execution
    /// there, and retires `src` once that one runs.
    pub(super) async fn restore(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        target: &WorkerId,
        archive: Archive,
    ) -> Result<(), ControlError> {
        let tw = self.store.get_worker(target).await?;
        // The digest signed for the target is the one of the bytes on disk here.
        let layer = self
            .sign_update(
                &tw.id,
                Update::Layer {
                    sandbox: s.id,
                    digest: archive.digest.clone(),
                    size: archive.size,
                },
            )
            .await?;
        self.step(
            &s.id,
            format!("transferring {} to {}", mib(archive.size as usize), tw.id),
        )
        .await;
        let body = archive
            .file
            .try_clone()
            .map_err(|e| ControlError::Internal(e.to_string()))?;
        self.send_layer(&tw, &layer, body, archive.size).await?;
        self.step(&s.id, format!("starting the new execution on {}", tw.id))
            .await;
        self.start_execution(s, &tw).await?;
        self.step(
            &s.id,
            format!("retiring the old execution on {}", src.worker),
        )
        .await;
        let src = self.store.get_execution(&s.id, src.generation).await?;
        self.retire(&src).await
    }

    /// Takes a snapshot: the execution is frozen, its writable layer archived and kept
    /// by the control plane with its digest; the sandbox is `paused`. A later
    /// `resume` on a worker restores it there as a new execution (after checking the
    /// digest); `resume` in place thaws the same execution and drops the snapshot.
    pub async fn snapshot(&self, s: &SandboxRecord) -> Result<serde_json::Value, ControlError> {
        if !matches!(s.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ControlError::Conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let _busy = self.transition(s.id)?;
        let src = self.running_execution(&s.id).await?;
        // `migrating` while the snapshot is taken: a crash before it is stored leaves
        // a state the reconciler finishes (thawed and running again).
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(s.state))
            .await?;
        match self.store_snapshot(s, &src).await {
            Ok(taken) => {
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Paused, Some(SandboxState::Migrating))
                    .await?;
                Ok(taken)
            }
            Err(e) => {
                self.abandon(s, &src, s.state).await;
                Err(e)
            }
        }
    }

    /// Takes the snapshot of `src` and keeps it (file fsynced, then its generation,
    /// digest and size recorded).
    pub(super) async fn store_snapshot(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
    ) -> Result<serde_json::Value, ControlError> {
        self.step(&s.id, "receiving and storing the archive".to_owned())
            .await;
        // Streamed to disk, fsynced, then renamed to its place.
        let archive = self
            .take_snapshot(s, src, Some(self.snapshot_path(&s.id)))
            .await?;
        let (digest, size) = (archive.digest.clone(), archive.size);
        self.store
            .kv_set(
                &snapshot_key(&s.id),
                &format!("{} {digest} {size}", src.generation),
            )
            .await?;
        Ok(serde_json::json!({"generation": src.generation, "digest": digest, "size": size}))
    }

    pub(super) fn snapshot_path(&self, sandbox: &SandboxId) -> std::path::PathBuf {
        self.snapshot_dir.join(format!("{sandbox}.tar"))
    }

    /// Restores the stored snapshot of a paused sandbox on `target` as a new
    /// execution. The archive must still have the digest recorded when it was taken:
    /// a tampered or truncated snapshot is refused and nothing changes.
    pub async fn resume_from_snapshot(
        &self,
        s: &SandboxRecord,
        target: &WorkerId,
    ) -> Result<(), ControlError> {
        if s.state != SandboxState::Paused {
            return Err(ControlError::Conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let src = self.running_execution(&s.id).await?;
        let recorded = self.store.kv_get(&snapshot_key(&s.id)).await?;
        let Some((generation, digest)) = recorded.as_deref().and_then(|v| {
            let mut f = v.split(' ');
            Some((Generation(f.next()?.parse().ok()?), f.next()?.to_owned()))
        }) else {
            // No snapshot was taken: on its own worker the paused execution simply
            // thaws; elsewhere a snapshot is taken now and moved.
            if src.worker == *target {
                return self.resume(s).await;
            }
            return self.migrate(s, target).await;
        };
        if generation != src.generation {
            return Err(ControlError::Conflict(
                "the stored snapshot is of an older execution".into(),
            ));
        }
        // A snapshot is restored only by the substrate that took it.
        self.place(Some(target), None, src.substrate).await?;
        let archive = Archive::open_kept(self.snapshot_path(&s.id))
            .await
            .map_err(|e| ControlError::Internal(format!("reading the snapshot: {e}")))?;
        if archive.digest != digest {
            return Err(ControlError::SnapshotCorrupt);
        }
        let _busy = self.transition(s.id)?;
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(SandboxState::Paused))
            .await?;
        match self.restore(s, &src, target, archive).await {
            Ok(()) => {
                self.forget_snapshot(&s.id).await;
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(SandboxState::Migrating))
                    .await?;
                Ok(())
            }
            Err(e) => {
                let _ = self
                    .store
                    .set_sandbox_state(&s.id, SandboxState::Paused, Some(SandboxState::Migrating))
                    .await;
                Err(e)
            }
        }
    }

    /// Drops a stored snapshot (it no longer matches a running sandbox).
    pub async fn forget_snapshot(&self, sandbox: &SandboxId) {
        let _ = tokio::fs::remove_file(self.snapshot_path(sandbox)).await;
        let _ = self.store.kv_set(&snapshot_key(sandbox), "").await;
    }
}

/// A name for a snapshot file being received.
pub(super) fn s_id_tmp() -> String {
    let r: [u8; 8] = crate::random_bytes();
    format!(
        ".incoming-{}",
        r.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// An archive of a writable layer on the control plane's disk.
pub(super) struct Archive {
    /// Open for reading from the start.
    file: std::fs::File,
    /// Removed when dropped (a temporary file); `None` once kept.
    path: Option<std::path::PathBuf>,
    size: u64,
    /// BLAKE3 of its bytes, lowercase hex.
    digest: String,
}

impl Archive {
    /// A new file `name` in `dir` (created 0700), mode 0600.
    fn create(
        dir: &std::path::Path,
        name: &str,
    ) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok((f, path))
    }

    /// Renames the file to `to` (it is no longer removed when dropped).
    fn keep_as(&mut self, to: std::path::PathBuf) -> Result<(), ControlError> {
        if let Some(from) = self.path.take() {
            if let Err(e) = std::fs::rename(&from, &to) {
                let _ = std::fs::remove_file(&from);
                return Err(ControlError::Internal(format!("storing the snapshot: {e}")));
            }
        }
        Ok(())
    }

    /// A kept archive, hashed by reading it through (never whole in memory).
    async fn open_kept(path: std::path::PathBuf) -> std::io::Result<Self> {
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            let mut hash = blake3::Hasher::new();
            let size = std::io::copy(&mut file, &mut hash)?;
            Ok(Self {
                file,
                path: None,
                size,
                digest: hash.finalize().to_hex().to_string(),
            })
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub(super) fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The kv key recording a stored snapshot: "generation digest size".
pub(super) fn snapshot_key(sandbox: &SandboxId) -> String {
    format!("snapshot:{sandbox}")
}
