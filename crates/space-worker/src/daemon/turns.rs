//! Who holds, or waits for, a sandbox's turn to apply an update — so that exclusive
//! work (a snapshot, a layer transfer, a key bundle, a sweep) kept waiting names what
//! it waits for.
//!
//! Every [`super::state::Worker::lock_sandbox`] notes its caller's source location
//! and sandbox here from the moment it asks until its turn is dropped;
//! [`super::state::Worker::exclusive`] lists the notes in a warning every
//! [`WARN_EVERY`] it is still waiting. Bounded by the updates under way (one note
//! each), removed by the turn's own drop, also when its future is cancelled.

use space_identity::SandboxId;
use std::collections::HashMap;
use std::panic::Location;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often exclusive work that is still waiting says so.
pub const WARN_EVERY: Duration = Duration::from_secs(5);

/// The notes listed in one warning at most.
const LISTED: usize = 16;

/// Where one update of a sandbox stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for exclusive work to end (the update lock, shared).
    Shared,
    /// Waiting behind an earlier update of the same sandbox.
    Queued,
    /// Holding the sandbox's turn.
    Holding,
}

#[derive(Debug)]
struct Note {
    sandbox: SandboxId,
    at: &'static Location<'static>,
    since: Instant,
    stage: Stage,
}

/// The notes of the turns under way.
#[derive(Debug, Default)]
pub struct Turns {
    next: std::sync::atomic::AtomicU64,
    notes: Mutex<HashMap<u64, Note>>,
}

impl Turns {
    fn notes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Note>> {
        self.notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a caller at `at` asking for `sandbox`'s turn; the note goes with the
    /// returned handle.
    pub fn note(&self, sandbox: SandboxId, at: &'static Location<'static>) -> Noted<'_> {
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.notes().insert(
            key,
            Note {
                sandbox,
                at,
                since: Instant::now(),
                stage: Stage::Shared,
            },
        );
        Noted { turns: self, key }
    }

    /// One line per note, those holding a turn first, longest first; at most
    /// [`LISTED`], then how many more.
    pub fn describe(&self) -> String {
        let notes = self.notes();
        let mut all: Vec<&Note> = notes.values().collect();
        all.sort_by_key(|n| (n.stage != Stage::Holding, n.since));
        let now = Instant::now();
        let mut out: Vec<String> = all
            .iter()
            .take(LISTED)
            .map(|n| {
                format!(
                    "{} {:?} for {:?} at {}:{}",
                    n.sandbox,
                    n.stage,
                    now.saturating_duration_since(n.since),
                    n.at.file(),
                    n.at.line()
                )
            })
            .collect();
        if all.len() > LISTED {
            out.push(format!("and {} more", all.len() - LISTED));
        }
        if out.is_empty() {
            "none".to_owned()
        } else {
            out.join("; ")
        }
    }

    /// How many notes are held (for tests).
    pub fn len(&self) -> usize {
        self.notes().len()
    }

    /// Whether no turn is noted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A note of one turn, removed when dropped.
#[derive(Debug)]
pub struct Noted<'a> {
    turns: &'a Turns,
    key: u64,
}

impl Noted<'_> {
    /// Moves the note on to `stage`.
    pub fn stage(&self, stage: Stage) {
        if let Some(n) = self.turns.notes().get_mut(&self.key) {
            n.stage = stage;
            n.since = Instant::now();
        }
    }
}

impl Drop for Noted<'_> {
    fn drop(&mut self) {
        self.turns.notes().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_names_its_sandbox_stage_and_caller_and_goes_with_its_handle() {
        let turns = Turns::default();
        assert_eq!(turns.describe(), "none");
        let a = SandboxId::from_bytes([1; 16]);
        let b = SandboxId::from_bytes([2; 16]);
        let first = turns.note(a, Location::caller());
        first.stage(Stage::Holding);
        let second = turns.note(b, Location::caller());
        second.stage(Stage::Queued);
        let said = turns.describe();
        let (held, queued) = said.split_once("; ").expect("two notes");
        assert!(held.starts_with(&format!("{a} Holding for ")), "{said}");
        assert!(held.contains("turns.rs:"), "{said}");
        assert!(queued.starts_with(&format!("{b} Queued for ")), "{said}");
        drop(first);
        assert_eq!(turns.len(), 1);
        drop(second);
        assert!(turns.is_empty());
    }

    #[test]
    fn a_long_list_is_cut_and_says_how_many_more() {
        let turns = Turns::default();
        let held: Vec<_> = (0..LISTED + 3)
            .map(|i| turns.note(SandboxId::from_bytes([i as u8; 16]), Location::caller()))
            .collect();
        assert!(
            turns.describe().ends_with("and 3 more"),
            "{}",
            turns.describe()
        );
        drop(held);
        assert!(turns.is_empty());
    }
}
