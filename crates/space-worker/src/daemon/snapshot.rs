//! A sandbox's writable layer as an archive: what a snapshot holds and what moves a
//! sandbox to another worker.
//!
//! A tar stream of the overlay's upper directory: directories, regular files and
//! symlinks with modes, owners and times; overlayfs whiteouts (0:0 character devices)
//! marked with a `SPACE.whiteout` PAX record (tar readers would unpack them as plain
//! files); and the `trusted.overlay.*` extended attributes (opaque directories) as
//! `SCHILY.xattr` PAX records. Integrity and authenticity come from outside: the
//! control plane signs the archive's BLAKE3 digest, and the receiver checks both
//! before unpacking anything.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Largest archive a worker produces or accepts.
pub const MAX_ARCHIVE: u64 = 1 << 30;

const WHITEOUT_KEY: &str = "SPACE.whiteout";

/// The `trusted.overlay.*` attributes of `path` (without following a symlink).
fn overlay_xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names) else {
        return Vec::new();
    };
    names
        .get(..n)
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|name| name.starts_with(b"trusted.overlay."))
        .filter_map(|name| {
            let name = std::str::from_utf8(name).ok()?;
            let mut value = vec![0u8; 4096];
            let len = rustix::fs::lgetxattr(path, name, &mut value).ok()?;
            value.truncate(len);
            Some((name.to_owned(), value))
        })
        .collect()
}

fn header_for(meta: &fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_uid(u64::from(meta.uid()));
    h.set_gid(u64::from(meta.gid()));
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(size);
    h
}

fn add_tree(b: &mut tar::Builder<Vec<u8>>, root: &Path, rel: &Path) -> io::Result<()> {
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = rel.join(e.file_name());
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path)?;
        let ft = meta.file_type();
        let xattrs = overlay_xattrs(&path);
        let pax: Vec<(String, Vec<u8>)> = xattrs
            .into_iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v))
            .collect();
        if ft.is_char_device() && meta.rdev() == 0 {
            b.append_pax_extensions([(WHITEOUT_KEY, &b"1"[..])])?;
            let mut h = header_for(&meta, tar::EntryType::Regular, 0);
            b.append_data(&mut h, &rel, io::empty())?;
            continue;
        }
        if !pax.is_empty() {
            b.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        if ft.is_dir() {
            let mut h = header_for(&meta, tar::EntryType::Directory, 0);
            b.append_data(&mut h, &rel, io::empty())?;
            add_tree(b, root, &rel)?;
        } else if ft.is_file() {
            let mut h = header_for(&meta, tar::EntryType::Regular, meta.len());
            b.append_data(&mut h, &rel, fs::File::open(&path)?)?;
        } else if ft.is_symlink() {
            let mut h = header_for(&meta, tar::EntryType::Symlink, 0);
            b.append_link(&mut h, &rel, fs::read_link(&path)?)?;
        }
        // Sockets, FIFOs and other devices do not survive a snapshot.
    }
    Ok(())
}

/// Archives the directory tree at `upper` (which must not change meanwhile: the
/// execution is frozen).
pub fn pack(upper: &Path) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Complete);
    add_tree(&mut b, upper, Path::new(""))?;
    let out = b.into_inner()?;
    if out.len() as u64 > MAX_ARCHIVE {
        return Err(io::Error::other(
            "writable layer over the snapshot size limit",
        ));
    }
    Ok(out)
}

/// Unpacks an archive made by [`pack`] into `dest`, which must not exist: a new
/// directory is filled, so nothing outside it can be touched.
pub fn unpack(archive: &[u8], dest: &Path) -> io::Result<()> {
    fs::create_dir(dest)?;
    let mut a = tar::Archive::new(archive);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_preserve_mtime(true);
    a.set_overwrite(false);
    for entry in a.entries()? {
        let mut entry = entry?;
        let mut whiteout = false;
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        for x in entry
            .pax_extensions()?
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            if x.key_bytes() == WHITEOUT_KEY.as_bytes() {
                whiteout = true;
            } else if let Some(name) = x.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                if name.starts_with("trusted.overlay.") {
                    xattrs.push((name.to_owned(), x.value_bytes().to_vec()));
                }
            }
        }
        if whiteout {
            let rel = entry.path()?.into_owned();
            if rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(io::Error::other("whiteout path leaves the layer"));
            }
            let mut sink = Vec::new();
            entry.read_to_end(&mut sink)?;
            nix::sys::stat::mknod(
                &dest.join(rel),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::empty(),
                0,
            )
            .map_err(io::Error::from)?;
            continue;
        }
        // `unpack_in` refuses paths that climb out of `dest` (also through symlinks).
        let rel = entry.path()?.into_owned();
        if !entry.unpack_in(dest)? {
            return Err(io::Error::other("archive entry leaves the layer"));
        }
        for (name, value) in xattrs {
            rustix::fs::lsetxattr(
                dest.join(&rel).as_path(),
                name.as_str(),
                &value,
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(io::Error::from)?;
        }
    }
    Ok(())
}

/// BLAKE3 of `bytes`, lowercase hex.
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
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
        unpack(&archive, &dst).unwrap();
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
        assert!(unpack(&archive, &t.path().join("dest")).is_err());
        assert!(!t.path().join("escaped").exists());
    }
}

/// HTTP side: `POST /internal/v1/snapshot` and `POST /internal/v1/layers`.
pub mod http {
    use std::sync::Arc;

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use space_proto::api::{SignedUpdate, Update, UpdateAck};

    use crate::daemon::launch;
    use crate::daemon::state::Worker;
    use crate::daemon::updates::{self, UpdateError};

    fn fail(e: UpdateError) -> Response {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
        (
            status,
            axum::Json(serde_json::json!({"error": "update_refused", "message": e.message})),
        )
            .into_response()
    }

    fn refused(status: u16, message: impl Into<String>) -> Response {
        fail(UpdateError {
            status,
            message: message.into(),
        })
    }

    /// Freezes the execution the signed update names and answers with its writable
    /// layer; header `space-snapshot-digest` holds the BLAKE3 digest.
    pub async fn snapshot(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
        let Ok(signed) = serde_json::from_slice::<SignedUpdate>(&body) else {
            return refused(400, "invalid signed update");
        };
        let (sandbox, generation, execution_id) = match updates::verify(&w, &signed) {
            Ok((
                _,
                Update::Snapshot {
                    sandbox,
                    generation,
                    execution_id,
                },
            )) => (sandbox, generation, execution_id),
            Ok(_) => return refused(400, "not a snapshot update"),
            Err(e) => return fail(e),
        };
        let _applying = w.update_lock.write().await;
        if let Err(e) = updates::freeze(&w, &sandbox, generation, execution_id, true).await {
            return fail(e);
        }
        let Some(upper) = w
            .slot(&sandbox)
            .and_then(|s| s.record.handle.as_ref().map(|h| h.upper_dir.clone()))
        else {
            return refused(409, "execution has no layer");
        };
        match tokio::task::spawn_blocking(move || super::pack(&upper)).await {
            Ok(Ok(archive)) => {
                let digest = super::digest(&archive);
                (
                    [
                        (header::CONTENT_TYPE, "application/x-tar".to_owned()),
                        (
                            header::HeaderName::from_static("space-snapshot-digest"),
                            digest,
                        ),
                    ],
                    archive,
                )
                    .into_response()
            }
            Ok(Err(e)) => refused(500, format!("archive: {e}")),
            Err(e) => refused(500, e.to_string()),
        }
    }

    /// Receives a sandbox's writable layer for its next execution here. The signed
    /// update names the archive's digest and size; anything else is refused before a
    /// byte is unpacked.
    pub async fn layer(State(w): State<Arc<Worker>>, headers: HeaderMap, body: Bytes) -> Response {
        let signed: Option<SignedUpdate> = headers
            .get("space-update")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| B64.decode(v).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        let Some(signed) = signed else {
            return refused(400, "header space-update must hold a signed layer update");
        };
        let (sandbox, digest, size) = match updates::verify(&w, &signed) {
            Ok((
                _,
                Update::Layer {
                    sandbox,
                    digest,
                    size,
                },
            )) => (sandbox, digest, size),
            Ok(_) => return refused(400, "not a layer update"),
            Err(e) => return fail(e),
        };
        if body.len() as u64 != size || super::digest(&body) != digest {
            return refused(
                403,
                "the archive is not the one the control plane signed (tampered or truncated)",
            );
        }
        let _applying = w.update_lock.write().await;
        let dest = launch::kept_layer(&w.data_dir, &sandbox);
        let incoming = dest.with_extension(format!(
            "incoming-{}",
            super::digest(&body).get(..12).unwrap_or("x")
        ));
        let result = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&incoming);
            if let Some(parent) = incoming.parent() {
                std::fs::create_dir_all(parent)?;
            }
            super::unpack(&body, &incoming)?;
            let _ = std::fs::remove_dir_all(&dest);
            std::fs::rename(&incoming, &dest)
        })
        .await;
        match result {
            Ok(Ok(())) => axum::Json(UpdateAck {
                state: "installed".into(),
                message: None,
                warm_ready: None,
                bundle_version: w
                    .keys
                    .read()
                    .ok()
                    .and_then(|k| k.as_ref().map(|k| k.version()))
                    .unwrap_or(0),
            })
            .into_response(),
            Ok(Err(e)) => refused(400, format!("unpack: {e}")),
            Err(e) => refused(500, e.to_string()),
        }
    }
}
