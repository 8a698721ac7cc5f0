//! The per-tenant quota of live sandboxes, counted with this process's creates
//! under way.

use std::collections::BTreeMap;
use std::sync::Arc;

/// One create counted against its tenant's quota until its sandbox's row exists (or
/// the create failed): dropped then.
pub(super) struct QuotaHold {
    pending: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    tenant: String,
}

impl QuotaHold {
    /// Counts a create of `tenant`; returns the hold and how many others were pending.
    pub(super) fn take(
        pending: &Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
        tenant: &str,
    ) -> (Self, u64) {
        let mut map = pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(tenant.to_owned()).or_insert(0);
        let others = *n;
        *n += 1;
        let hold = Self {
            pending: Arc::clone(pending),
            tenant: tenant.to_owned(),
        };
        (hold, others)
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        let mut map = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.tenant);
            }
        }
    }
}
