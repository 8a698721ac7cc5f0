//! Rebuilt attempts reach the execution they were resolved to. A rebuilt attempt — the
//! one retry after a RefreshRoute — that finds its new execution already frozen for
//! the next migration waits for that execution's retirement and then fails: it may
//! not be rebuilt twice (IDENTITY §4). Sandboxes migrated back to back lost 3 of
//! 1,000,008 operations that way. So a freeze for a snapshot or a migration first
//! lets the rebuilt attempts resolved to the execution it freezes arrive: it starts
//! [`ARRIVAL_GRACE`] after the last capability issued for one (at most four
//! graces in all). The sandbox is `migrating` meanwhile, so resolves
//! made during the wait name the next execution, never this one.

use std::collections::HashMap;
use std::time::Duration;

use space_identity::{Generation, SandboxId};
use space_proto::api::CapabilityResponse;
use tokio::time::Instant;

/// How long after its capability was issued a rebuilt attempt is given to arrive at
/// its worker before that execution is frozen (`SPACE_REBUILT_ARRIVAL_MS` sets it).
pub const ARRIVAL_GRACE: Duration = Duration::from_millis(250);

/// The largest grace `SPACE_REBUILT_ARRIVAL_MS` may set.
const MAX_ARRIVAL_GRACE: Duration = Duration::from_secs(5);

/// The longest a freeze waits for rebuilt attempts, however many keep coming, in
/// graces.
const MAX_ARRIVAL_WAIT_GRACES: u32 = 4;

/// Sandboxes remembered at most; older entries (long past their grace) go first.
const REMEMBERED: usize = 10_000;

/// When a freeze of `generation` may start: `last` is the newest rebuilt issuance
/// recorded for the sandbox (its generation and instant), `now` the time now. Pure.
pub(crate) fn arrival_wait(
    last: Option<(Generation, Instant)>,
    generation: Generation,
    now: Instant,
    grace: Duration,
) -> Duration {
    match last {
        Some((g, at)) if g == generation => (at + grace).saturating_duration_since(now),
        _ => Duration::ZERO,
    }
}

/// The newest rebuilt issuance per sandbox, in this process.
#[derive(Debug)]
pub(crate) struct Arrivals {
    grace: Duration,
    last: std::sync::Mutex<HashMap<SandboxId, (Generation, Instant)>>,
}

impl Arrivals {
    /// With the grace of `SPACE_REBUILT_ARRIVAL_MS` (default [`ARRIVAL_GRACE`]).
    pub(crate) fn from_env() -> Self {
        let grace = std::env::var("SPACE_REBUILT_ARRIVAL_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(ARRIVAL_GRACE, Duration::from_millis)
            .min(MAX_ARRIVAL_GRACE);
        Self::with_grace(grace)
    }

    fn with_grace(grace: Duration) -> Self {
        Self {
            grace,
            last: std::sync::Mutex::default(),
        }
    }

    fn note(&self, sandbox: SandboxId, generation: Generation, now: Instant) {
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if last.len() >= REMEMBERED {
            let grace = self.grace;
            last.retain(|_, (_, at)| now.saturating_duration_since(*at) < grace);
        }
        // Still full of entries within their grace: a new sandbox is not remembered
        // (its freeze then does not wait) rather than the map growing without bound.
        if last.len() < REMEMBERED || last.contains_key(&sandbox) {
            last.insert(sandbox, (generation, now));
        }
    }

    fn get(&self, sandbox: &SandboxId) -> Option<(Generation, Instant)> {
        self.last.lock().ok()?.get(sandbox).copied()
    }

    /// Records that `cap` was issued for a rebuilt attempt (see the module).
    pub(crate) fn note_rebuilt(&self, cap: &CapabilityResponse) {
        self.note(cap.route.sandbox, cap.route.generation, Instant::now());
    }

    /// Waits, before `generation` of `sandbox` is frozen, for the rebuilt attempts
    /// resolved to it to arrive (see the module). Returns how long it waited.
    pub(crate) async fn let_rebuilt_attempts_arrive(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
    ) -> Duration {
        let start = Instant::now();
        let grace = self.grace;
        loop {
            let now = Instant::now();
            let left = (grace * MAX_ARRIVAL_WAIT_GRACES).saturating_sub(now - start);
            let wait = arrival_wait(self.get(sandbox), generation, now, grace).min(left);
            if wait.is_zero() {
                return now - start;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_right_after_a_rebuilt_issuance_waits_out_the_grace() {
        let t = Instant::now();
        let last = Some((Generation(7), t));
        let grace = Duration::from_millis(250);
        assert_eq!(arrival_wait(last, Generation(7), t, grace), grace);
        assert_eq!(
            arrival_wait(last, Generation(7), t + Duration::from_millis(100), grace),
            Duration::from_millis(150)
        );
    }

    #[test]
    fn a_freeze_after_the_grace_or_of_another_generation_does_not_wait() {
        let t = Instant::now();
        let grace = Duration::from_millis(250);
        assert_eq!(
            arrival_wait(Some((Generation(7), t)), Generation(7), t + grace, grace),
            Duration::ZERO
        );
        assert_eq!(
            arrival_wait(
                Some((Generation(7), t)),
                Generation(7),
                t + 2 * grace,
                grace
            ),
            Duration::ZERO
        );
        assert_eq!(
            arrival_wait(Some((Generation(6), t)), Generation(7), t, grace),
            Duration::ZERO
        );
        assert_eq!(arrival_wait(None, Generation(7), t, grace), Duration::ZERO);
    }

    #[test]
    fn the_remembered_sandboxes_are_bounded() {
        let a = Arrivals::with_grace(ARRIVAL_GRACE);
        let t = Instant::now();
        for n in 0..REMEMBERED as u64 {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&n.to_le_bytes());
            a.note(SandboxId::from_bytes(id), Generation(1), t);
        }
        // Full of entries within their grace: a new one is not kept.
        a.note(SandboxId::from_bytes([0xfe; 16]), Generation(1), t);
        assert_eq!(a.last.lock().unwrap().len(), REMEMBERED);
        let later = t + ARRIVAL_GRACE;
        a.note(SandboxId::from_bytes([0xff; 16]), Generation(1), later);
        assert_eq!(a.last.lock().unwrap().len(), 1);
    }
}
