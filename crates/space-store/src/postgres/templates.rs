//! Templates. A put is an insert that leaves a taken binding alone, then a read of
//! it: a binding deleted in between is inserted on the next try.

use super::*;
use crate::templates::{self as t, TemplateRecord};

impl PgStore {
    /// See [`crate::Store::put_template`].
    pub async fn put_template(&self, r: &TemplateRecord) -> Result<bool, StoreError> {
        let size = t::check(r)?;
        let params: Params = &[
            &r.name,
            &r.tag,
            &r.digest,
            &r.manifest,
            &size,
            &r.created_at,
        ];
        for _ in 0..outcomes::UPSERT_ATTEMPTS {
            if self.exec(t::INSERT, params).await? == 1 {
                return Ok(true);
            }
            if let Some(stored) = self.one(&t::by_name(), &[&r.name, &r.tag], t::row).await? {
                return t::put_outcome(r, &stored);
            }
        }
        Err(t::put_gave_up(r))
    }

    /// See [`crate::Store::template`].
    pub async fn template(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        self.one(&t::by_name(), &[&name, &tag], t::row).await
    }

    /// See [`crate::Store::template_by_digest`].
    pub async fn template_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        self.one(&t::by_digest(), &[&digest], t::row).await
    }

    /// See [`crate::Store::list_templates`].
    pub async fn list_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        self.all(&t::all(), &[], t::row).await
    }

    /// See [`crate::Store::delete_template`].
    pub async fn delete_template(&self, name: &str, tag: &str) -> Result<bool, StoreError> {
        Ok(self.exec(t::DELETE, &[&name, &tag]).await? > 0)
    }

    /// See [`crate::Store::count_live_sandboxes_with_template`].
    pub async fn count_live_sandboxes_with_template(
        &self,
        digest: &str,
    ) -> Result<u64, StoreError> {
        let pattern = t::digest_pattern(digest)?;
        let n = self
            .one(t::COUNT_LIVE_WITH_DIGEST, &[&pattern], |r| r.int(0))
            .await?
            .unwrap_or(0);
        u64::try_from(n).map_err(|_| StoreError::Backend(format!("negative count {n}")))
    }
}
