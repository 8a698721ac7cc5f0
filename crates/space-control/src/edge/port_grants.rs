//! Service-port capabilities the edge keeps for reuse (a leaf of `edge`: the edge
//! holds one; `ports` fills and reads it).

use space_identity::{Protocol, SandboxId};

/// Service-port capabilities kept for reuse, at most this many.
const PORT_GRANTS: usize = 10_000;

/// Renew a kept service-port capability this long before it expires.
const GRANT_MARGIN_SECS: u64 = 10;

/// Service-port capabilities the edge issued, by sandbox, port and protocol: opening
/// a tunnel costs a capability only when none is kept (a client that opens a
/// connection per request, as HTTP/1.0 ones do, would otherwise pay store reads and
/// a signature every time). Dropped when a worker refuses one.
#[derive(Debug, Default)]
pub(crate) struct PortGrants {
    kept: std::sync::Mutex<
        std::collections::HashMap<(SandboxId, u16, Protocol), space_proto::api::CapabilityResponse>,
    >,
}

impl PortGrants {
    pub(super) fn get(
        &self,
        key: &(SandboxId, u16, Protocol),
    ) -> Option<space_proto::api::CapabilityResponse> {
        let kept = self.kept.lock().ok()?;
        let cap = kept.get(key)?;
        (cap.expires_at > crate::now_secs() + GRANT_MARGIN_SECS).then(|| cap.clone())
    }

    pub(super) fn put(
        &self,
        key: (SandboxId, u16, Protocol),
        cap: space_proto::api::CapabilityResponse,
    ) {
        if let Ok(mut kept) = self.kept.lock() {
            if kept.len() >= PORT_GRANTS {
                kept.clear();
            }
            kept.insert(key, cap);
        }
    }

    pub(super) fn forget(&self, key: &(SandboxId, u16, Protocol)) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.remove(key);
        }
    }

    pub(crate) fn clear(&self) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.clear();
        }
    }
}
