//! Templates. A put runs on the writer thread in its own savepoint: the insert and
//! the read of the binding it found are one write, nothing gets in between.

use super::*;
use crate::templates::{self as t, TemplateRecord};

impl SqliteStore {
    /// See [`crate::Store::put_template`].
    pub async fn put_template(&self, record: &TemplateRecord) -> Result<bool, StoreError> {
        let size = t::check(record)?;
        let record = record.clone();
        self.call(move |c| {
            let r = &record;
            let params: Params = &[
                &r.name,
                &r.tag,
                &r.digest,
                &r.manifest,
                &size,
                &r.created_at,
            ];
            if exec(c, t::INSERT, params)? == 1 {
                return Ok(true);
            }
            match query_one(c, &t::by_name(), &[&r.name, &r.tag], |row| t::row(row))? {
                Some(stored) => t::put_outcome(r, &stored),
                None => Err(t::put_gave_up(r)),
            }
        })
        .await
    }

    /// See [`crate::Store::template`].
    pub async fn template(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        let (name, tag) = (name.to_owned(), tag.to_owned());
        self.read(move |c| query_one(c, &t::by_name(), &[&name, &tag], |r| t::row(r)))
            .await
    }

    /// See [`crate::Store::template_by_digest`].
    pub async fn template_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        let digest = digest.to_owned();
        self.read(move |c| query_one(c, &t::by_digest(), &[&digest], |r| t::row(r)))
            .await
    }

    /// See [`crate::Store::list_templates`].
    pub async fn list_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        self.read(move |c| query_all(c, &t::all(), &[], |r| t::row(r)))
            .await
    }

    /// See [`crate::Store::delete_template`].
    pub async fn delete_template(&self, name: &str, tag: &str) -> Result<bool, StoreError> {
        let (name, tag) = (name.to_owned(), tag.to_owned());
        self.call(move |c| Ok(exec(c, t::DELETE, &[&name, &tag])? > 0))
            .await
    }

    /// See [`crate::Store::count_live_sandboxes_with_template`].
    pub async fn count_live_sandboxes_with_template(
        &self,
        digest: &str,
    ) -> Result<u64, StoreError> {
        let pattern = t::digest_pattern(digest)?;
        self.read(move |c| {
            let n =
                query_one(c, t::COUNT_LIVE_WITH_DIGEST, &[&pattern], |r| r.int(0))?.unwrap_or(0);
            u64::try_from(n).map_err(|_| StoreError::Backend(format!("negative count {n}")))
        })
        .await
    }
}
