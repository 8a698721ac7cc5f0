//! Templates the control plane publishes: a `name:tag` bound to one digest, written
//! once (a template is immutable: the same name with another digest is refused until
//! it is removed), with its manifest and the bytes of its blobs. Shared by both
//! backends: the record, its SQL, its row decoder and its outcome rules.

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::rows::{Cols, to_sql_int};

/// A named template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRecord {
    /// `[a-z0-9._-]`, at most 128 (the caller parses it).
    pub name: String,
    /// The same alphabet and length.
    pub tag: String,
    /// `sha256:<64 lowercase hex>`: the digest of `manifest`.
    pub digest: String,
    /// The template manifest's canonical JSON.
    pub manifest: String,
    /// Bytes of its blobs, together.
    pub size: u64,
    /// Unix seconds it was imported.
    pub created_at: i64,
}

impl TemplateRecord {
    /// `name:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }
}

/// Columns of `templates`, in the order [`row`] reads them.
pub(crate) const COLUMNS: &str = "name, tag, digest, manifest, size, created_at";

/// A new binding; an existing `(name, tag)` is left alone (changed 0), and the caller
/// then reads which digest holds it.
pub(crate) const INSERT: &str = "INSERT INTO templates (name, tag, digest, manifest, size, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name, tag) DO NOTHING";
pub(crate) const DELETE: &str = "DELETE FROM templates WHERE name = $1 AND tag = $2";

/// Live sandboxes whose template is pinned to the digest `$1` is the end of: their
/// `template` is `NAME:TAG@<digest>`, so the pattern is `%@<digest>` (a digest holds
/// no `%` or `_`).
pub(crate) const COUNT_LIVE_WITH_DIGEST: &str =
    "SELECT COUNT(*) FROM sandboxes WHERE state <> 'stopped' AND template LIKE $1";

pub(crate) fn by_name() -> String {
    crate::sql::select(COLUMNS, "templates", "WHERE name = $1 AND tag = $2")
}

pub(crate) fn by_digest() -> String {
    crate::sql::select(
        COLUMNS,
        "templates",
        "WHERE digest = $1 ORDER BY name, tag LIMIT 1",
    )
}

pub(crate) fn all() -> String {
    crate::sql::select(COLUMNS, "templates", "ORDER BY name, tag")
}

pub(crate) fn row(r: &impl Cols) -> Result<TemplateRecord, StoreError> {
    let size = r.int(4)?;
    Ok(TemplateRecord {
        name: r.text(0)?,
        tag: r.text(1)?,
        digest: r.text(2)?,
        manifest: r.text(3)?,
        size: u64::try_from(size)
            .map_err(|_| StoreError::Backend(format!("stored template size {size}")))?,
        created_at: r.int(5)?,
    })
}

/// The pattern of [`COUNT_LIVE_WITH_DIGEST`] for `digest`.
pub(crate) fn digest_pattern(digest: &str) -> Result<String, StoreError> {
    check_digest(digest)?;
    Ok(format!("%@{digest}"))
}

/// Refuses a record the caller should never have built: an empty or overlong name
/// or tag, a digest that is not `sha256:<64 lowercase hex>`. Returns its size as
/// the database stores it.
pub(crate) fn check(t: &TemplateRecord) -> Result<i64, StoreError> {
    for (what, part) in [("name", &t.name), ("tag", &t.tag)] {
        if part.is_empty() || part.len() > 128 || part.contains([':', '@', '%']) {
            return Err(StoreError::Backend(format!(
                "template {what} {part:?} is empty, longer than 128 bytes or holds ':', '@' or '%'"
            )));
        }
    }
    check_digest(&t.digest)?;
    to_sql_int("template size", t.size)
}

fn check_digest(digest: &str) -> Result<(), StoreError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(StoreError::Backend(format!(
            "template digest {digest:?} is not sha256:<64 lowercase hex digits>"
        )))
    }
}

/// What a put that found `(name, tag)` taken answers: the same digest is the same
/// template (no change); another is a conflict.
pub(crate) fn put_outcome(
    wanted: &TemplateRecord,
    stored: &TemplateRecord,
) -> Result<bool, StoreError> {
    if stored.digest == wanted.digest {
        Ok(false)
    } else {
        Err(StoreError::Conflict(format!(
            "template {} is {}: remove it first or choose another tag",
            wanted.reference(),
            stored.digest
        )))
    }
}

/// A put whose row kept vanishing between the insert and the read.
pub(crate) fn put_gave_up(t: &TemplateRecord) -> StoreError {
    StoreError::Conflict(format!(
        "template {} kept changing while it was imported",
        t.reference()
    ))
}
