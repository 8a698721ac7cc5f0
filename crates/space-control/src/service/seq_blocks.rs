//! Update sequence numbers reserved ahead: a block of a worker's numbers reserved
//! durably in one store write, handed out in memory while it is fresh
//! (`ControlPlane::take_update_seqs`).

/// Update sequence numbers reserved in one store write for the updates that follow.
pub(crate) const SEQ_BLOCK: u64 = 128;

/// How long numbers reserved ahead may still be signed. Far below what makes a number
/// unsafe to sign late: a worker forgets the numbers of updates issued
/// `SEEN_UPDATES_KEPT_SECS` (90 s) before its clock, the highest of them becoming its
/// floor, and a number reserved after ours was issued after our reservation; ours,
/// signed within this time of it, is refused by its age (60 s plus 15 s of skew) before
/// any such later number can be forgotten.
pub(crate) const SEQ_BLOCK_LIFETIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Every worker's block, each behind a lock of its own (held across a reservation,
/// a store write, so that the updates waiting meanwhile take from the new block).
#[derive(Debug, Default)]
pub(crate) struct SeqBlocks {
    by_worker: std::sync::Mutex<
        std::collections::HashMap<
            space_identity::WorkerId,
            std::sync::Arc<tokio::sync::Mutex<Option<SeqBlock>>>,
        >,
    >,
}

impl SeqBlocks {
    /// `worker`'s block and its lock (made on first use; a worker's entry is a few
    /// dozen bytes, and workers are few).
    pub(crate) fn of(
        &self,
        worker: &space_identity::WorkerId,
    ) -> std::sync::Arc<tokio::sync::Mutex<Option<SeqBlock>>> {
        let mut map = self
            .by_worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::sync::Arc::clone(map.entry(worker.clone()).or_default())
    }
}

/// Numbers of one worker's update sequence reserved durably and not signed yet:
/// `next..end`, reserved at `reserved`.
#[derive(Debug)]
pub(crate) struct SeqBlock {
    next: u64,
    end: u64,
    reserved: std::time::Instant,
}

impl SeqBlock {
    /// Numbers `next..end`, reserved at `reserved`.
    pub(crate) fn new(next: u64, end: u64, reserved: std::time::Instant) -> Self {
        Self {
            next,
            end,
            reserved,
        }
    }

    /// `n` consecutive numbers from the block (the first), if it holds them and is
    /// young enough to sign them.
    pub(crate) fn take(&mut self, n: u64, now: std::time::Instant) -> Option<u64> {
        let fresh = now.saturating_duration_since(self.reserved) < SEQ_BLOCK_LIFETIME;
        (fresh && self.end - self.next >= n).then(|| {
            let first = self.next;
            self.next += n;
            first
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_hands_out_each_number_once_and_nothing_once_stale_or_short() {
        let t0 = std::time::Instant::now();
        let mut b = SeqBlock {
            next: 10,
            end: 42,
            reserved: t0,
        };
        assert_eq!(b.take(1, t0), Some(10));
        assert_eq!(b.take(3, t0), Some(11));
        assert_eq!(b.take(1, t0), Some(14));
        // Short: more than is left is not taken (and what is left stays).
        assert_eq!(b.take(28, t0), None);
        assert_eq!(b.take(27, t0), Some(15));
        assert_eq!(b.take(1, t0), None);
        // Stale: nothing, however much is left.
        let mut old = SeqBlock {
            next: 1,
            end: 33,
            reserved: t0,
        };
        assert_eq!(old.take(1, t0 + SEQ_BLOCK_LIFETIME), None);
    }
}
