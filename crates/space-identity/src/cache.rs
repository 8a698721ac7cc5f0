//! A receiver's cache of verified tokens.
//!
//! Only the signature work is cached. On every request the time rules, purpose,
//! access and the identity comparison run again against the current record, so a
//! cached token for execution N is refused the moment N+1 is installed.

use std::collections::HashMap;

use crate::capability::Claims;
use crate::comparator::{InstalledIdentity, Operation, check_time, compare, verify_capability};
use crate::ids::WorkerId;
use crate::keys::InstalledKeys;
use crate::time::Timestamp;
use crate::verdict::{DenyReason, Verdict};
use crate::{CLOCK_SKEW_SECS, MAX_CAPABILITY_BYTES};

#[derive(Debug)]
struct Entry {
    claims: Claims,
    /// The token's expiry plus skew, or its key's `not_after` if earlier.
    valid_until: Timestamp,
}

/// Verified tokens keyed by the BLAKE3 hash of their bytes, bounded in entries, each
/// entry valid only until the token's expiry plus skew, and all dropped when the
/// installed key bundle changes (so a removed key stops verifying at once).
#[derive(Debug)]
pub struct VerifiedTokenCache {
    entries: HashMap<[u8; 32], Entry>,
    capacity: usize,
    bundle_version: u64,
}

impl VerifiedTokenCache {
    /// A cache holding at most `capacity` tokens (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::with_capacity(capacity.clamp(1, 4096)),
            capacity: capacity.max(1),
            bundle_version: 0,
        }
    }

    /// Number of cached tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Verifies `token` (from cache when its bytes were verified before under the same
    /// key bundle) and returns its claims. Time is always re-checked.
    pub fn verify_capability(
        &mut self,
        token: &[u8],
        keys: &InstalledKeys,
        now: Timestamp,
    ) -> Result<Claims, DenyReason> {
        self.claims_for(token, keys, now).cloned()
    }

    /// The whole comparator with the signature work cached.
    pub fn admit(
        &mut self,
        token: &[u8],
        keys: &InstalledKeys,
        now: Timestamp,
        op: &Operation<'_>,
        this_worker: &WorkerId,
        installed: Option<&InstalledIdentity>,
    ) -> Verdict {
        match self.claims_for(token, keys, now) {
            Ok(claims) => compare(claims, op, this_worker, installed),
            Err(reason) => reason.into(),
        }
    }

    fn claims_for(
        &mut self,
        token: &[u8],
        keys: &InstalledKeys,
        now: Timestamp,
    ) -> Result<&Claims, DenyReason> {
        // The size cap comes before any work, hashing included.
        if token.len() > MAX_CAPABILITY_BYTES {
            return Err(DenyReason::Oversized);
        }
        if keys.version() != self.bundle_version {
            self.entries.clear();
            self.bundle_version = keys.version();
        }
        let hash = *blake3::hash(token).as_bytes();
        let fresh = matches!(self.entries.get(&hash), Some(e) if now <= e.valid_until);
        if fresh {
            let entry = &self.entries[&hash];
            check_time(&entry.claims, now)?;
            return Ok(&entry.claims);
        }
        self.entries.remove(&hash);
        let claims = verify_capability(token, keys, now)?;
        let key_not_after = keys.get(&claims.key_id).map_or(now, |k| k.not_after);
        let valid_until = claims
            .expires_at
            .plus_secs(CLOCK_SKEW_SECS)
            .min(key_not_after);
        self.make_room(now);
        let entry = self
            .entries
            .entry(hash)
            .insert_entry(Entry {
                claims,
                valid_until,
            })
            .into_mut();
        Ok(&entry.claims)
    }

    fn make_room(&mut self, now: Timestamp) {
        if self.entries.len() < self.capacity {
            return;
        }
        // Sweep expired entries, then evict arbitrary ones down to 7/8 of capacity, so
        // the O(n) sweep is paid once per capacity/8 inserts. Only verified tokens are
        // ever inserted, so an arbitrary victim is fine: the bound is what matters.
        self.entries.retain(|_, e| now <= e.valid_until);
        let target = self.capacity - self.capacity.div_ceil(8);
        let excess = self.entries.len().saturating_sub(target);
        if excess > 0 {
            let victims: Vec<[u8; 32]> = self.entries.keys().take(excess).copied().collect();
            for v in victims {
                self.entries.remove(&v);
            }
        }
    }
}
