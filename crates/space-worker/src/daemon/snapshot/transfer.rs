//! A layer leaving or arriving: the frozen execution's layer packed for a snapshot
//! or a migration, and a received layer kept for the sandbox's next execution here.
//! Both run under the worker's exclusive update lock; neither speaks HTTP.

use std::sync::Arc;

use space_identity::Execution;
use space_proto::api::{SignedUpdate, Update, UpdateAck};

use super::{
    MAX_ARCHIVE, Packed, pack_to_temp, pack_to_temp_keeping_holes, tempfile_in, unpack,
    unpack_keeping_holes,
};
use crate::daemon::launch;
use crate::daemon::state::Worker;
use crate::daemon::updates::{self, UpdateError};

/// Why a layer could not leave or arrive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// Refused as an update is.
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// The layer is over [`MAX_ARCHIVE`].
    #[error("{0}")]
    TooLarge(String),
}

/// Where archives wait on their way in or out (files without a name: nothing is
/// left behind).
fn spool_dir(w: &Worker) -> std::path::PathBuf {
    w.data_dir.join("spool")
}

/// `e` and every error under it, for a message that says why.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut at = e.source();
    while let Some(s) = at {
        text.push_str(": ");
        text.push_str(&s.to_string());
        at = s.source();
    }
    text
}

/// Where a VM's snapshot is written before it is packed (one directory per execution).
fn vm_spool(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("spool").join("vm")
}

/// Removes VM snapshots a worker killed while taking them left behind (a memory file
/// as large as the guest's RAM each): nothing there outlives the worker that wrote it.
pub fn clear_leftovers(data_dir: &std::path::Path) {
    let _ = crate::substrate::tree::remove_tree(&vm_spool(data_dir));
}

/// Freezes the execution the signed `Snapshot` update names and packs its writable
/// layer into an unnamed spool file (the limit enforced while it is written, a file
/// too large for it refused before it is read), rewound for sending.
pub async fn take(
    w: &Arc<Worker>,
    signed: &SignedUpdate,
) -> Result<(std::fs::File, Packed), TransferError> {
    let (sandbox, execution) = match updates::verify(w, signed)? {
        (
            _,
            Update::Snapshot {
                sandbox,
                generation,
                execution_id,
            },
        ) => (
            sandbox,
            Execution {
                generation,
                id: execution_id,
            },
        ),
        _ => return Err(UpdateError::Invalid("not a snapshot update".into()).into()),
    };
    let _applying = w.exclusive("a snapshot").await;
    updates::freeze(w, &sandbox, execution, true).await?;
    w.set_snapshot_frozen(&sandbox, execution.generation, true);
    let Some(handle) = w.slot(&sandbox).and_then(|s| s.record.handle.clone()) else {
        return Err(UpdateError::Conflict("execution has no layer".into()).into());
    };
    let spool = spool_dir(w);
    let vm = w.vm.clone();
    let vm_dir = vm_spool(&w.data_dir).join(handle.key.dir_name());
    let packed = tokio::task::spawn_blocking(move || match vm {
        // A VM's snapshot is its memory, its disk and its machine (see
        // `substrate::vm::snapshot`; Firecracker adds its `vmstate`), packed as a
        // directory of those files.
        Some(vm) => {
            let dir = vm_dir;
            let _ = crate::substrate::tree::remove_tree(&dir);
            let packed = vm
                .snapshot(&handle, &dir)
                .map_err(|e| std::io::Error::other(error_chain(&e)))
                .and_then(|_| {
                    space_http::crash::crash_point("worker.snapshot.vm_written");
                    // The disk image is mostly holes: they stay holes.
                    pack_to_temp_keeping_holes(&dir, &spool, MAX_ARCHIVE)
                });
            let _ = crate::substrate::tree::remove_tree(&dir);
            packed
        }
        None => pack_to_temp(&handle.upper_dir, &spool, MAX_ARCHIVE),
    })
    .await;
    match packed {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            Err(TransferError::TooLarge(e.to_string()))
        }
        Ok(Err(e)) => Err(UpdateError::Internal(format!("archive: {e}")).into()),
        Err(e) => Err(UpdateError::Internal(e.to_string()).into()),
    }
}

/// A layer this worker agreed to receive: what the signed `Layer` update names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The sandbox whose next execution starts from it.
    pub sandbox: space_identity::SandboxId,
    /// BLAKE3 of the archive, lowercase hex.
    pub digest: String,
    /// Bytes of the archive.
    pub size: u64,
}

/// Verifies a signed `Layer` update before a byte of its archive is read, and the
/// size it signs against [`MAX_ARCHIVE`].
pub fn expect(w: &Worker, signed: &SignedUpdate) -> Result<Expected, TransferError> {
    let expected = match updates::verify(w, signed)? {
        (
            _,
            Update::Layer {
                sandbox,
                digest,
                size,
            },
        ) => Expected {
            sandbox,
            digest,
            size,
        },
        _ => return Err(UpdateError::Invalid("not a layer update".into()).into()),
    };
    if expected.size > MAX_ARCHIVE {
        return Err(TransferError::TooLarge(format!(
            "the layer is {} bytes, over the limit of {MAX_ARCHIVE} bytes",
            expected.size
        )));
    }
    Ok(expected)
}

/// A new unnamed file to receive an archive into.
pub fn spool_file(w: &Worker) -> Result<std::fs::File, UpdateError> {
    tempfile_in(&spool_dir(w)).map_err(|e| UpdateError::Internal(format!("spool: {e}")))
}

/// Unpacks the received archive in `file` (its digest `got`, checked by the caller
/// against the signed one) into a fresh directory and keeps it as `sandbox`'s layer,
/// replacing any kept before.
pub async fn keep(
    w: &Arc<Worker>,
    sandbox: space_identity::SandboxId,
    mut file: std::fs::File,
    got: &str,
) -> Result<UpdateAck, UpdateError> {
    let _applying = w.exclusive("a received layer").await;
    let dest = launch::kept_layer(&w.data_dir, &sandbox);
    let incoming = dest.with_extension(format!("incoming-{}", got.get(..12).unwrap_or("x")));
    let vm = w.vm.is_some();
    let result = tokio::task::spawn_blocking(move || {
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0))?;
        let _ = crate::substrate::tree::remove_tree(&incoming);
        if let Some(parent) = incoming.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // A kept layer is a sandbox disk with the layer as `upper/` (a subvolume on
        // the disk volume: see `substrate::jail::disk`).
        let upper = crate::substrate::jail::disk::new_layer(&incoming, None)
            .map_err(std::io::Error::other)?;
        // A VM worker receives VM snapshots, whose disk image keeps its holes.
        let unpacked = match vm {
            true => unpack_keeping_holes(std::io::BufReader::new(file), &upper),
            false => unpack(std::io::BufReader::new(file), &upper),
        };
        if let Err(e) = unpacked {
            let _ = crate::substrate::tree::remove_tree(&incoming);
            return Err(e);
        }
        if vm {
            // Marked outside the layer: only this makes the VM driver restore it.
            std::fs::write(
                incoming.join(crate::substrate::vm::snapshot::RECEIVED_MARK),
                b"",
            )?;
        }
        let _ = crate::substrate::tree::remove_tree(&dest);
        std::fs::rename(&incoming, &dest)
    })
    .await;
    match result {
        Ok(Ok(())) => Ok(UpdateAck {
            state: space_proto::api::AckState::Installed,
            message: None,
            warm_ready: None,
            bundle_version: w
                .keys
                .read()
                .ok()
                .and_then(|k| k.as_ref().map(|k| k.version()))
                .unwrap_or(0),
        }),
        Ok(Err(e)) => Err(UpdateError::Invalid(format!("unpack: {e}"))),
        Err(e) => Err(UpdateError::Internal(e.to_string())),
    }
}
