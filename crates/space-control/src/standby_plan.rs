//! Which standby sandboxes to start next: pure, so every rule is testable.
//!
//! Standby sandboxes are kept per template (the default, and each template the
//! operator names), per network kind (with a link already, for creates in mode
//! `egress`, or without one) and per worker: each active worker holds its share of a pool, so a
//! burst of claims drains every worker evenly and the refills land where the claims
//! were taken. Refills run while creates run — bounded to a few starts in flight per
//! worker, so they never queue ahead of a burst's own launches — rather than waiting
//! for a quiet moment, which back-to-back creates never leave. While claims are
//! arriving the keeper holds new starts back for a short, bounded time
//! ([`BurstClock::hold_refills`]): on a worker's few cores a refill (a whole create: store writes,
//! a launch, a link) competes with the burst's claims for the CPU, and a pool is
//! made to absorb a burst. A worker whose share has fallen below
//! [`LOW_WATER_DIVISOR`]th is refilled even then.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use space_identity::WorkerId;

/// What tells one pool's standby sandboxes from another's: a create claims only one
/// of its own kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    /// The template as records name it (`default`, or `name:tag@sha256:…`).
    pub template: String,
    /// In network mode `egress`, its link already made (claimed by creates in mode
    /// `egress`); otherwise in mode `none`, with no link (claimed by the others).
    pub linked: bool,
}

impl PoolKey {
    /// The key of `template`'s standby sandboxes without a link.
    pub fn bare(template: impl Into<String>) -> Self {
        Self {
            template: template.into(),
            linked: false,
        }
    }
}

/// A pool: how many standby sandboxes of one kind the active workers keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Its kind.
    pub key: PoolKey,
    /// The pool's size, spread over the active workers.
    pub total: usize,
}

/// A worker as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    /// ID.
    pub id: WorkerId,
    /// Whether it takes new sandboxes (not draining, not dead, not full).
    pub accepts: bool,
    /// Standby sandboxes it holds (running or starting), by kind.
    pub standby: BTreeMap<PoolKey, usize>,
    /// Standby starts under way on it (not yet in its counts).
    pub in_flight: usize,
}

/// A pool the operator asked for: a template by name, and its size over all workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplatePool {
    /// The template's `name[:tag]`.
    pub name: String,
    /// Standby sandboxes of it in all.
    pub total: usize,
}

impl TemplatePool {
    /// Parses `NAME[:TAG]=N` (`--standby-template`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, total) = text
            .rsplit_once('=')
            .ok_or_else(|| format!("{text:?}: expected NAME[:TAG]=N"))?;
        space_image::TemplateRef::parse(name).map_err(|e| format!("{text:?}: {e}"))?;
        let total: usize = total
            .parse()
            .map_err(|_| format!("{text:?}: N must be a number"))?;
        if total > 1000 {
            return Err(format!(
                "{text:?}: at most 1000 standby sandboxes per template"
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            total,
        })
    }
}

/// What the planner needs besides the pools and workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Most standby starts in flight on one worker at once.
    pub per_worker: usize,
    /// Refills are held back ([`BurstClock::hold_refills`]): only a worker below
    /// [`LOW_WATER_DIVISOR`]th of its share of a pool gets starts of it.
    pub holding: bool,
}

/// A claim this recent holds refills back: the burst it belongs to is still arriving.
pub const BURST_QUIET: Duration = Duration::from_millis(100);
/// The longest refills are held back in a row: under claims that never pause, the
/// keeper still starts refills at least this often.
pub const MAX_HOLD: Duration = Duration::from_millis(300);
/// While refills are held back, a worker holding less than its share divided by this
/// is refilled anyway: a burst never drains a pool empty waiting for its end.
pub const LOW_WATER_DIVISOR: usize = 8;

/// When the last claim came and since when refills have been held back for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BurstClock {
    /// The last claim of a standby sandbox.
    pub last_claim: Option<Instant>,
    /// The first keeper step of the hold under way.
    pub held_since: Option<Instant>,
}

impl BurstClock {
    /// A claim at `now`.
    pub fn claimed(&mut self, now: Instant) {
        self.last_claim = Some(now);
    }

    /// Whether the keeper step at `now` holds refills back: a claim came within
    /// [`BURST_QUIET`] and the hold under way (begun now if none is) is younger than
    /// [`MAX_HOLD`]. A step that does not hold ends the hold, so the next burst, or the
    /// rest of this one, starts a new one.
    pub fn hold_refills(&mut self, now: Instant) -> bool {
        let recent = self
            .last_claim
            .is_some_and(|t| now.saturating_duration_since(t) < BURST_QUIET);
        let since = *self.held_since.get_or_insert(now);
        let hold = recent && now.saturating_duration_since(since) < MAX_HOLD;
        if !hold {
            self.held_since = None;
        }
        hold
    }
}

/// Each active worker's share of a pool of `total`: `total / n`, the first
/// `total % n` workers (by ID) one more, so the shares add up to `total`.
fn shares(total: usize, accepting: &[&WorkerView]) -> Vec<usize> {
    let n = accepting.len();
    if n == 0 {
        return Vec::new();
    }
    (0..n)
        .map(|i| total / n + usize::from(i < total % n))
        .collect()
}

/// The standby starts to begin now, `(worker, kind)`, at most
/// [`Bounds::per_worker`] in flight per worker: for every pool, each accepting
/// worker below its share gets starts, the worker furthest below its share first,
/// pools taking turns so that one template's refill does not starve another's.
pub fn next_starts(
    pools: &[Pool],
    workers: &[WorkerView],
    bounds: Bounds,
) -> Vec<(WorkerId, PoolKey)> {
    let mut accepting: Vec<&WorkerView> = workers.iter().filter(|w| w.accepts).collect();
    accepting.sort_by(|a, b| a.id.cmp(&b.id));
    // Deficits per (worker index, pool index).
    let mut deficit: Vec<Vec<usize>> = vec![vec![0; pools.len()]; accepting.len()];
    for (p, pool) in pools.iter().enumerate() {
        for (w, share) in shares(pool.total, &accepting).into_iter().enumerate() {
            let have = accepting[w].standby.get(&pool.key).copied().unwrap_or(0);
            let low = have.saturating_mul(LOW_WATER_DIVISOR) < share;
            deficit[w][p] = match bounds.holding && !low {
                true => 0,
                false => share.saturating_sub(have),
            };
        }
    }
    let mut room: Vec<usize> = accepting
        .iter()
        .map(|w| bounds.per_worker.saturating_sub(w.in_flight))
        .collect();
    let mut out = Vec::new();
    loop {
        let mut progressed = false;
        for (p, pool) in pools.iter().enumerate() {
            // The worker with room that lacks the most of this pool.
            let best = (0..accepting.len())
                .filter(|&w| room[w] > 0 && deficit[w][p] > 0)
                .max_by(|&a, &b| deficit[a][p].cmp(&deficit[b][p]).then(b.cmp(&a)));
            if let Some(w) = best {
                out.push((accepting[w].id.clone(), pool.key.clone()));
                deficit[w][p] -= 1;
                room[w] -= 1;
                progressed = true;
            }
        }
        if !progressed {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: &str, standby: &[(&str, usize)], in_flight: usize) -> WorkerView {
        WorkerView {
            id: id.parse().unwrap(),
            accepts: true,
            standby: standby
                .iter()
                .map(|(t, n)| (PoolKey::bare(*t), *n))
                .collect(),
            in_flight,
        }
    }

    fn pool(template: &str, total: usize) -> Pool {
        Pool {
            key: PoolKey::bare(template),
            total,
        }
    }

    fn count(starts: &[(WorkerId, PoolKey)], w: &str, t: &str) -> usize {
        starts
            .iter()
            .filter(|(id, k)| id.as_str() == w && k.template == t && !k.linked)
            .count()
    }

    #[test]
    fn linked_and_bare_pools_of_one_template_are_kept_apart() {
        let linked = PoolKey {
            template: "default".into(),
            linked: true,
        };
        // w1 holds its share of bare sandboxes and none with a link: only linked
        // starts, though the template is the same.
        let mut w1 = worker("w1", &[("default", 4)], 0);
        w1.standby.insert(linked.clone(), 1);
        let pools = [
            pool("default", 4),
            Pool {
                key: linked.clone(),
                total: 4,
            },
        ];
        let starts = next_starts(
            &pools,
            &[w1],
            Bounds {
                per_worker: 8,
                holding: false,
            },
        );
        assert_eq!(count(&starts, "w1", "default"), 0);
        assert_eq!(
            starts.iter().filter(|(_, k)| *k == linked).count(),
            3,
            "{starts:?}"
        );
    }

    #[test]
    fn a_pool_is_split_evenly_and_the_emptier_worker_is_refilled_first() {
        // One worker drained by claims, the other full: every start goes to the drained one.
        let workers = [
            worker("w1", &[("default", 0)], 0),
            worker("w2", &[("default", 16)], 0),
        ];
        let starts = next_starts(
            &[pool("default", 32)],
            &workers,
            Bounds {
                per_worker: 4,
                holding: false,
            },
        );
        assert_eq!(count(&starts, "w1", "default"), 4);
        assert_eq!(count(&starts, "w2", "default"), 0);
        // An odd pool: 17 over two workers is 9 + 8, never 17 + 0.
        let empty = [worker("w1", &[], 0), worker("w2", &[], 0)];
        let starts = next_starts(
            &[pool("default", 17)],
            &empty,
            Bounds {
                per_worker: 100,
                holding: false,
            },
        );
        assert_eq!(
            (
                count(&starts, "w1", "default"),
                count(&starts, "w2", "default")
            ),
            (9, 8)
        );
    }

    #[test]
    fn starts_in_flight_bound_the_refill_per_worker() {
        let workers = [worker("w1", &[], 2), worker("w2", &[], 0)];
        let starts = next_starts(
            &[pool("default", 32)],
            &workers,
            Bounds {
                per_worker: 2,
                holding: false,
            },
        );
        assert_eq!(count(&starts, "w1", "default"), 0);
        assert_eq!(count(&starts, "w2", "default"), 2);
    }

    #[test]
    fn pools_take_turns_and_a_full_pool_starts_nothing() {
        let workers = [worker("w1", &[("a", 0), ("b", 0)], 0)];
        let starts = next_starts(
            &[pool("a", 8), pool("b", 8)],
            &workers,
            Bounds {
                per_worker: 2,
                holding: false,
            },
        );
        assert_eq!(
            (count(&starts, "w1", "a"), count(&starts, "w1", "b")),
            (1, 1)
        );
        let full = [worker("w1", &[("a", 8)], 0)];
        assert!(
            next_starts(
                &[pool("a", 8)],
                &full,
                Bounds {
                    per_worker: 2,
                    holding: false
                }
            )
            .is_empty()
        );
    }

    #[test]
    fn a_worker_that_takes_no_sandboxes_gets_no_share() {
        let mut draining = worker("w1", &[], 0);
        draining.accepts = false;
        let workers = [draining, worker("w2", &[], 0)];
        let starts = next_starts(
            &[pool("default", 4)],
            &workers,
            Bounds {
                per_worker: 8,
                holding: false,
            },
        );
        assert_eq!(count(&starts, "w1", "default"), 0);
        assert_eq!(count(&starts, "w2", "default"), 4);
        assert!(
            next_starts(
                &[pool("default", 4)],
                &[],
                Bounds {
                    per_worker: 8,
                    holding: false
                }
            )
            .is_empty()
        );
    }

    #[test]
    fn refills_wait_while_a_burst_of_claims_arrives_but_never_long_and_never_past_low_water() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut clock = BurstClock::default();
        // No claim yet: nothing held.
        assert!(!clock.hold_refills(t0));
        // Claims arriving: held, step after step...
        clock.claimed(ms(10));
        assert!(clock.hold_refills(ms(20)));
        clock.claimed(ms(60));
        assert!(clock.hold_refills(ms(70)));
        // ...until the claims pause for BURST_QUIET.
        assert!(!clock.hold_refills(ms(60) + BURST_QUIET));
        // Claims that never pause hold refills back at most MAX_HOLD in a row; the
        // step after that one holds again (a new hold).
        let mut steady = BurstClock::default();
        let mut held = Vec::new();
        for step in 0..20u64 {
            steady.claimed(ms(step * 50));
            held.push(steady.hold_refills(ms(step * 50 + 1)));
        }
        let longest = held.split(|h| !h).map(<[bool]>::len).max().unwrap_or(0);
        // Steps 50 ms apart: six held (250 ms), the seventh refills, and so on.
        assert!(longest as u128 * 50 <= MAX_HOLD.as_millis(), "{held:?}");
        assert_eq!(held.iter().filter(|h| !**h).count(), 2, "{held:?}");

        // While held, a pool above low water on a worker gets no start; below it, the
        // whole deficit.
        let workers = [
            worker("w1", &[("default", 10)], 0),
            worker("w2", &[("default", 1)], 0),
        ];
        let holding = Bounds {
            per_worker: 64,
            holding: true,
        };
        let starts = next_starts(&[pool("default", 32)], &workers, holding);
        assert_eq!(count(&starts, "w1", "default"), 0);
        assert_eq!(count(&starts, "w2", "default"), 15);
        let free = Bounds {
            holding: false,
            ..holding
        };
        let starts = next_starts(&[pool("default", 32)], &workers, free);
        assert_eq!(count(&starts, "w1", "default"), 6);
        assert_eq!(count(&starts, "w2", "default"), 15);
    }

    #[test]
    fn a_standby_template_pool_is_name_equals_count() {
        assert_eq!(
            TemplatePool::parse("python:3.12=8").unwrap(),
            TemplatePool {
                name: "python:3.12".into(),
                total: 8
            }
        );
        assert!(TemplatePool::parse("python").is_err());
        assert!(TemplatePool::parse("Python=2").is_err());
        assert!(TemplatePool::parse("python=many").is_err());
        assert!(TemplatePool::parse("python=1001").is_err());
    }
}
