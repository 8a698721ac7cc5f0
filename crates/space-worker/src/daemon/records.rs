//! The worker's durable runtime records: what it has installed (or retired) for each
//! sandbox it hosts, its key bundle and its enrollment. SQLite with `synchronous=FULL`:
//! a write returns only once it is on disk, so an acknowledgement sent after it never
//! promises more than a crash leaves.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Condvar, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use space_identity::{Execution, ExecutionId, Generation, SandboxId, Substrate};
use space_peer::ProcessIdentity;

use crate::substrate::SandboxHandle;

/// Where a recorded execution is in its life on this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// Installed, launching.
    Starting,
    /// Serving.
    Running,
    /// Frozen in place.
    Paused,
    /// Retired: a tombstone.
    Retired,
    /// Failed to start, or lost in a crash.
    Failed,
}

impl RecordState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Retired => "retired",
            Self::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "paused" => Self::Paused,
            "retired" => Self::Retired,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// The recorded bridge of an execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeRecord {
    /// Its socket.
    pub socket: std::path::PathBuf,
    /// Its process as launched.
    pub process: ProcessIdentity,
}

/// One execution as this worker recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// Sandbox.
    pub sandbox: SandboxId,
    /// Generation.
    pub generation: Generation,
    /// Execution ID.
    pub execution_id: ExecutionId,
    /// Substrate.
    pub substrate: Substrate,
    /// Activation attempt.
    pub activation: u32,
    /// State.
    pub state: RecordState,
    /// The activation secret (never leaves the worker and the agent).
    pub secret: [u8; 32],
    /// What the substrate launched.
    pub handle: Option<SandboxHandle>,
    /// The bridge.
    pub bridge: Option<BridgeRecord>,
    /// The sandbox's environment, for every process.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The sandbox's exposed service ports (trusted state netgtw compares with).
    #[serde(default)]
    pub ports: Vec<space_proto::api::ports::ExposedPort>,
    /// The sandbox's network policy (mode `egress`: the execution has a link and
    /// rules).
    #[serde(default)]
    pub network: space_proto::api::Policy,
    /// What processes run with unless a request says otherwise (an image template's
    /// working directory and user; nothing for the default template).
    #[serde(default)]
    pub defaults: ProcessDefaults,
    /// The template it runs on, as its install named it (`default`, or pinned by
    /// digest): its layers are this execution's lower dirs, which the template sweep
    /// keeps. `None` in records from before it was kept (the sweep then keeps all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Unix seconds of the last change.
    pub updated_at: i64,
}

/// An image's process defaults, kept with the execution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDefaults {
    /// Working directory of a process whose request names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Account of a process whose request names none (`name` or uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ProcessDefaults {
    /// The working directory a request asked for, else the image's.
    pub fn cwd_or(&self, asked: Option<String>) -> Option<String> {
        asked.or_else(|| self.cwd.clone())
    }

    /// The account a request asked for, else the image's.
    pub fn user_or(
        &self,
        asked: Option<space_proto::api::User>,
    ) -> Option<space_proto::guest::Account> {
        asked
            .or_else(|| self.user.as_deref().map(space_proto::api::User::parse))
            .map(Into::into)
    }
}

impl ExecutionRecord {
    /// Which execution this is: its generation and ID.
    pub fn execution(&self) -> Execution {
        Execution {
            generation: self.generation,
            id: self.execution_id,
        }
    }
}

/// Why a record operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// SQLite failed.
    #[error("runtime records: {0}")]
    Db(#[from] rusqlite::Error),
    /// A stored value did not decode.
    #[error("runtime records: corrupt {0}")]
    Corrupt(&'static str),
    /// The group commit this write was part of failed.
    #[error("runtime records: {0}")]
    Group(String),
    /// The file could not be created or is not private.
    #[error("runtime records: {0}")]
    Io(String),
}

/// The records database.
///
/// [`Records::put`] and [`Records::claim_updates`] commit in groups: concurrent
/// writes of either kind (installs of several sandboxes at once, a burst of updates
/// whose numbers are claimed while earlier ones record what they did) share one
/// transaction and one fsync. The first write to arrive while no commit is under way
/// leads: it writes every one waiting, each in a savepoint of its own (one that fails
/// rolls back alone), commits, and wakes the others; each returns only once its own
/// write is on disk.
#[derive(Debug)]
pub struct Records {
    conn: Mutex<Connection>,
    group: Mutex<Group>,
    committed: Condvar,
}

/// A write waiting for its group's commit.
#[derive(Debug)]
enum Pending {
    /// A record: sandbox, generation, body, state.
    Put(String, i64, String, &'static str),
    /// Update numbers with their `issued_at`, and the caller's clock.
    Claim(Vec<(u64, u64)>, u64),
}

/// What a write of the group came to (the error's text: shared by the group when the
/// commit fails).
#[derive(Debug)]
enum Outcome {
    Put(Result<(), String>),
    Claim(Result<Vec<Claim>, String>),
}

#[derive(Debug, Default)]
struct Group {
    /// Writes waiting for a leader, by ticket.
    waiting: Vec<(u64, Pending)>,
    next: u64,
    leading: bool,
    /// Outcomes not yet collected by their writer.
    outcomes: HashMap<u64, Outcome>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS executions (
    sandbox TEXT NOT NULL,
    generation INTEGER NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (sandbox, generation)
);
CREATE TABLE IF NOT EXISTS generations (
    sandbox TEXT PRIMARY KEY,
    max_generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS seen_updates (
    seq INTEGER PRIMARY KEY,
    issued_at INTEGER NOT NULL
);
";

/// What [`Records::claim_updates`] found for one update sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Never seen: recorded now (durably), the update may be applied.
    Fresh,
    /// Applied (or refused after its claim) before: a replay.
    Replayed,
    /// At or below the floor of numbers forgotten with their age: as old as updates
    /// refused by their `issued_at`, so refused too.
    BelowFloor,
}

/// Seen sequence numbers are forgotten once their `issued_at` is this much older than
/// the worker's clock: by then an update as old is refused by its age, and the
/// highest number forgotten becomes the floor below which every number is refused.
pub const SEEN_UPDATES_KEPT_SECS: u64 =
    space_proto::api::UPDATE_MAX_AGE_SECS + 2 * space_proto::api::UPDATE_CLOCK_SKEW_SECS;

impl Records {
    /// Opens (creating) the records at `path`.
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        // 0600 before SQLite writes a byte (its -wal/-shm files take the database's
        // mode): the records hold the worker's credential and activation secrets.
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|e| RecordError::Io(format!("{}: {e}", path.display())))?;
            let mode = f
                .metadata()
                .map_err(|e| RecordError::Io(format!("{}: {e}", path.display())))?
                .permissions()
                .mode()
                & 0o777;
            if mode & 0o077 != 0 {
                return Err(RecordError::Io(format!(
                    "{} is open to group or others (mode {mode:04o}): run `chmod 600 {}`",
                    path.display(),
                    path.display()
                )));
            }
        }
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
            group: Mutex::new(Group::default()),
            committed: Condvar::new(),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, RecordError>,
    ) -> Result<T, RecordError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        f(&conn)
    }

    /// Highest generation ever recorded for `sandbox` ([`Generation::NONE`] if none).
    /// Never decreases,
    /// even when tombstones are pruned, so a replayed install of an old generation is
    /// refused forever.
    pub fn max_generation(&self, sandbox: &SandboxId) -> Result<Generation, RecordError> {
        self.with(|c| {
            let v: Option<i64> = c
                .prepare_cached("SELECT max_generation FROM generations WHERE sandbox = ?1")?
                .query_row(params![sandbox.to_string()], |r| r.get(0))
                .optional()?;
            Ok(v.map_or(Generation::NONE, |g| Generation(g as u64)))
        })
    }

    /// Writes `record` (insert or replace) and raises the sandbox's max generation,
    /// durably, in one transaction.
    pub fn put(&self, record: &ExecutionRecord) -> Result<(), RecordError> {
        let body = serde_json::to_string(record).map_err(|_| RecordError::Corrupt("record"))?;
        let pending = Pending::Put(
            record.sandbox.to_string(),
            record.generation.get() as i64,
            body,
            record.state.as_str(),
        );
        match self.commit_in_group(pending) {
            Outcome::Put(r) => r.map_err(RecordError::Group),
            Outcome::Claim(_) => Err(RecordError::Group("a put answered as a claim".into())),
        }
    }

    /// Waits for `pending`'s group to commit (leading it when no commit is under way)
    /// and returns its outcome.
    fn commit_in_group(&self, pending: Pending) -> Outcome {
        let mut group = self.group.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = group.next;
        group.next += 1;
        group.waiting.push((ticket, pending));
        loop {
            if let Some(outcome) = group.outcomes.remove(&ticket) {
                return outcome;
            }
            if group.leading {
                group = self
                    .committed
                    .wait(group)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Lead: every write waiting (this one included) in one transaction.
            group.leading = true;
            let batch = std::mem::take(&mut group.waiting);
            drop(group);
            let outcomes = self.with(|c| Self::write_group(c, &batch));
            group = self.group.lock().unwrap_or_else(|e| e.into_inner());
            match outcomes {
                Ok(all) => {
                    for ((t, _), outcome) in batch.iter().zip(all) {
                        group.outcomes.insert(*t, outcome);
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    for (t, p) in &batch {
                        let failed = match p {
                            Pending::Put(..) => Outcome::Put(Err(e.clone())),
                            Pending::Claim(..) => Outcome::Claim(Err(e.clone())),
                        };
                        group.outcomes.insert(*t, failed);
                    }
                }
            }
            group.leading = false;
            self.committed.notify_all();
        }
    }

    /// One group's transaction: each write in a savepoint of its own, so one that
    /// fails (a number out of range) is rolled back alone and the others committed;
    /// each claim in its turn as if alone (its numbers, then the forgetting its clock
    /// allows), so the outcomes are those of one transaction per write.
    fn write_group(c: &Connection, batch: &[(u64, Pending)]) -> Result<Vec<Outcome>, RecordError> {
        let mut tx = c.unchecked_transaction()?;
        let mut out = Vec::with_capacity(batch.len());
        for (_, pending) in batch {
            let sp = tx.savepoint()?;
            let done = match pending {
                Pending::Put(sandbox, generation, body, state) => {
                    Self::put_in(&sp, sandbox, *generation, body, state).map(|()| None)
                }
                Pending::Claim(seqs, now) => Self::claim_in(&sp, seqs, *now).map(Some),
            };
            match done {
                Ok(claims) => {
                    sp.commit()?;
                    out.push(match claims {
                        None => Outcome::Put(Ok(())),
                        Some(c) => Outcome::Claim(Ok(c)),
                    });
                }
                Err(e) => {
                    drop(sp);
                    out.push(match pending {
                        Pending::Put(..) => Outcome::Put(Err(e.to_string())),
                        Pending::Claim(..) => Outcome::Claim(Err(e.to_string())),
                    });
                }
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// One put of the group, inside its transaction.
    fn put_in(
        tx: &Connection,
        sandbox: &str,
        generation: i64,
        body: &str,
        state: &str,
    ) -> Result<(), RecordError> {
        tx.prepare_cached(
            "INSERT INTO executions (sandbox, generation, body, state) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (sandbox, generation) DO UPDATE SET body = excluded.body, state = excluded.state",
        )?
        .execute(params![sandbox, generation, body, state])?;
        tx.prepare_cached(
            "INSERT INTO generations (sandbox, max_generation) VALUES (?1, ?2)
             ON CONFLICT (sandbox) DO UPDATE SET max_generation = MAX(max_generation, excluded.max_generation)",
        )?
        .execute(params![sandbox, generation])?;
        Ok(())
    }

    /// Every recorded execution.
    pub fn all(&self) -> Result<Vec<ExecutionRecord>, RecordError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT body, state FROM executions ORDER BY sandbox, generation")?;
            let rows =
                stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (body, state) = row?;
                let mut rec: ExecutionRecord =
                    serde_json::from_str(&body).map_err(|_| RecordError::Corrupt("record"))?;
                rec.state = RecordState::parse(&state).ok_or(RecordError::Corrupt("state"))?;
                out.push(rec);
            }
            Ok(out)
        })
    }

    /// One recorded execution.
    pub fn get(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
    ) -> Result<Option<ExecutionRecord>, RecordError> {
        self.with(|c| {
            let row: Option<(String, String)> = c
                .prepare_cached(
                    "SELECT body, state FROM executions WHERE sandbox = ?1 AND generation = ?2",
                )?
                .query_row(params![sandbox.to_string(), generation.get() as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let Some((body, state)) = row else {
                return Ok(None);
            };
            let mut rec: ExecutionRecord =
                serde_json::from_str(&body).map_err(|_| RecordError::Corrupt("record"))?;
            rec.state = RecordState::parse(&state).ok_or(RecordError::Corrupt("state"))?;
            Ok(Some(rec))
        })
    }

    /// Drops tombstones and failures older than `before` (the max generation stays).
    pub fn prune(&self, before: i64) -> Result<usize, RecordError> {
        let all = self.all()?;
        self.with(|c| {
            let mut n = 0;
            for r in all {
                if matches!(r.state, RecordState::Retired | RecordState::Failed)
                    && r.updated_at < before
                {
                    n += c.execute(
                        "DELETE FROM executions WHERE sandbox = ?1 AND generation = ?2",
                        params![r.sandbox.to_string(), r.generation.get() as i64],
                    )?;
                }
            }
            Ok(n)
        })
    }

    /// Claims update sequence numbers, with their `issued_at`, in one transaction
    /// (one fsync): each number is applied at most once, ever. Numbers whose
    /// `issued_at` is older than `now` − [`SEEN_UPDATES_KEPT_SECS`] are forgotten in the
    /// same transaction and the highest of them becomes the floor (never lowered):
    /// the table stays as small as the updates of the last two minutes, and a
    /// forgotten number can still not come back. A claim returns only once durable.
    pub fn claim_updates(&self, seqs: &[(u64, u64)], now: u64) -> Result<Vec<Claim>, RecordError> {
        match self.commit_in_group(Pending::Claim(seqs.to_vec(), now)) {
            Outcome::Claim(r) => r.map_err(RecordError::Group),
            Outcome::Put(_) => Err(RecordError::Group("a claim answered as a put".into())),
        }
    }

    /// One claim of [`Records::claim_updates`] inside the group's transaction.
    fn claim_in(tx: &Connection, seqs: &[(u64, u64)], now: u64) -> Result<Vec<Claim>, RecordError> {
        let as_i64 = |v: u64| i64::try_from(v).map_err(|_| RecordError::Corrupt("sequence"));
        {
            let floor: i64 = tx
                .query_row(
                    "SELECT value FROM settings WHERE name = 'update_seq_floor'",
                    [],
                    |r| r.get::<_, Vec<u8>>(0),
                )
                .optional()?
                .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
                .unwrap_or(0);
            let mut out = Vec::with_capacity(seqs.len());
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO seen_updates (seq, issued_at) VALUES (?1, ?2) ON CONFLICT (seq) DO NOTHING",
                )?;
                for &(seq, issued_at) in seqs {
                    let seq = as_i64(seq)?;
                    if seq <= floor {
                        out.push(Claim::BelowFloor);
                    } else if insert.execute(params![seq, as_i64(issued_at)?])? == 0 {
                        out.push(Claim::Replayed);
                    } else {
                        out.push(Claim::Fresh);
                    }
                }
            }
            let horizon = as_i64(now.saturating_sub(SEEN_UPDATES_KEPT_SECS))?;
            let forgotten: Option<i64> = tx.query_row(
                "SELECT MAX(seq) FROM seen_updates WHERE issued_at < ?1",
                params![horizon],
                |r| r.get(0),
            )?;
            if let Some(top) = forgotten.filter(|t| *t > floor) {
                tx.execute(
                    "INSERT INTO settings (name, value) VALUES ('update_seq_floor', ?1)
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    params![top.to_string().into_bytes()],
                )?;
            }
            if forgotten.is_some() {
                tx.execute(
                    "DELETE FROM seen_updates WHERE issued_at < ?1 OR seq <= ?2",
                    params![horizon, forgotten.unwrap_or(0).max(floor)],
                )?;
            }
            Ok(out)
        }
    }

    /// Sequence numbers remembered (for tests and metrics).
    pub fn seen_updates(&self) -> Result<u64, RecordError> {
        self.with(|c| {
            let n: i64 = c.query_row("SELECT COUNT(*) FROM seen_updates", [], |r| r.get(0))?;
            Ok(n as u64)
        })
    }

    /// A setting.
    pub fn setting(&self, name: &str) -> Result<Option<Vec<u8>>, RecordError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT value FROM settings WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    /// Stores a setting durably.
    pub fn set_setting(&self, name: &str, value: &[u8]) -> Result<(), RecordError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO settings (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                params![name, value],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(generation: u64, state: RecordState) -> ExecutionRecord {
        ExecutionRecord {
            sandbox: SandboxId::from_bytes([1; 16]),
            generation: Generation(generation),
            execution_id: ExecutionId::from_bytes([generation as u8; 16]),
            substrate: Substrate::Jail,
            activation: 1,
            state,
            secret: [7; 32],
            handle: None,
            bridge: None,
            env: Default::default(),
            ports: Vec::new(),
            network: space_proto::api::Policy::none(),
            defaults: Default::default(),
            template: None,
            updated_at: 100,
        }
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.db");
        {
            let r = Records::open(&path).unwrap();
            r.put(&rec(3, RecordState::Running)).unwrap();
            r.set_setting("credential", b"abc").unwrap();
        }
        let r = Records::open(&path).unwrap();
        assert_eq!(r.all().unwrap(), vec![rec(3, RecordState::Running)]);
        assert_eq!(
            r.setting("credential").unwrap().as_deref(),
            Some(&b"abc"[..])
        );
    }

    #[test]
    fn one_record_is_read_by_its_sandbox_and_generation() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::open(&dir.path().join("r.db")).unwrap();
        r.put(&rec(2, RecordState::Retired)).unwrap();
        r.put(&rec(3, RecordState::Running)).unwrap();
        let sandbox = SandboxId::from_bytes([1; 16]);
        assert_eq!(
            r.get(&sandbox, Generation(3)).unwrap(),
            Some(rec(3, RecordState::Running))
        );
        assert_eq!(
            r.get(&sandbox, Generation(2)).unwrap(),
            Some(rec(2, RecordState::Retired))
        );
        assert_eq!(r.get(&sandbox, Generation(4)).unwrap(), None);
        assert_eq!(
            r.get(&SandboxId::from_bytes([9; 16]), Generation(3))
                .unwrap(),
            None
        );
    }

    #[test]
    fn max_generation_never_decreases_even_after_pruning() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::open(&dir.path().join("r.db")).unwrap();
        r.put(&rec(5, RecordState::Retired)).unwrap();
        r.put(&rec(2, RecordState::Retired)).unwrap();
        assert_eq!(
            r.max_generation(&SandboxId::from_bytes([1; 16])).unwrap(),
            Generation(5)
        );
        assert_eq!(r.prune(1_000).unwrap(), 2);
        assert!(r.all().unwrap().is_empty());
        assert_eq!(
            r.max_generation(&SandboxId::from_bytes([1; 16])).unwrap(),
            Generation(5)
        );
    }

    #[test]
    fn a_claimed_update_sequence_is_refused_again_also_after_reopening_and_after_forgetting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let now = 10_000;
        {
            let r = Records::open(&path).unwrap();
            assert_eq!(
                r.claim_updates(&[(5, now), (7, now), (5, now)], now)
                    .unwrap(),
                vec![Claim::Fresh, Claim::Fresh, Claim::Replayed]
            );
            // Out of order is fine, once.
            assert_eq!(
                r.claim_updates(&[(6, now)], now).unwrap(),
                vec![Claim::Fresh]
            );
        }
        let r = Records::open(&path).unwrap();
        assert_eq!(
            r.claim_updates(&[(6, now), (7, now)], now).unwrap(),
            vec![Claim::Replayed, Claim::Replayed]
        );
        // Two minutes on, the old numbers are forgotten, and the floor refuses them.
        let later = now + SEEN_UPDATES_KEPT_SECS + 1;
        assert_eq!(
            r.claim_updates(&[(9, later)], later).unwrap(),
            vec![Claim::Fresh]
        );
        assert_eq!(r.seen_updates().unwrap(), 1);
        assert_eq!(
            r.claim_updates(&[(5, later), (7, later), (8, later)], later)
                .unwrap(),
            vec![Claim::BelowFloor, Claim::BelowFloor, Claim::Fresh]
        );
    }

    #[test]
    fn concurrent_claims_of_one_number_admit_it_once_and_a_bad_claim_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let r = std::sync::Arc::new(Records::open(&dir.path().join("r.db")).unwrap());
        let now = 10_000;
        // 16 threads claim 42 (and a number of their own) at once: grouped into as
        // few transactions as they meet in, 42 is fresh for exactly one of them.
        let threads: Vec<_> = (0..16u64)
            .map(|i| {
                let r = std::sync::Arc::clone(&r);
                std::thread::spawn(move || r.claim_updates(&[(42, now), (100 + i, now)], now))
            })
            .collect();
        let mut fresh_42 = 0;
        for t in threads {
            let claims = t.join().unwrap().unwrap();
            assert_eq!(claims[1], Claim::Fresh);
            fresh_42 += usize::from(claims[0] == Claim::Fresh);
            assert!(matches!(claims[0], Claim::Fresh | Claim::Replayed));
        }
        assert_eq!(fresh_42, 1);
        assert_eq!(r.seen_updates().unwrap(), 17);
        // A number the database cannot hold fails its own claim, not the others'.
        let (bad, good) = std::thread::scope(|s| {
            let bad = s.spawn(|| r.claim_updates(&[(u64::MAX, now)], now));
            let good = s.spawn(|| r.claim_updates(&[(7, now)], now));
            (bad.join().unwrap(), good.join().unwrap())
        });
        assert!(bad.is_err());
        assert_eq!(good.unwrap(), vec![Claim::Fresh]);
        assert_eq!(
            r.claim_updates(&[(7, now)], now).unwrap(),
            vec![Claim::Replayed]
        );
    }

    #[test]
    fn concurrent_puts_are_each_durable_when_they_return() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let r = std::sync::Arc::new(Records::open(&path).unwrap());
        let threads: Vec<_> = (0..16u8)
            .map(|t| {
                let (r, path) = (std::sync::Arc::clone(&r), path.clone());
                std::thread::spawn(move || {
                    for g in 1..=10u64 {
                        let mut one = rec(g, RecordState::Running);
                        one.sandbox = SandboxId::from_bytes([t; 16]);
                        r.put(&one).unwrap();
                        // Returned: another connection (a restarted worker) sees it.
                        let other = Records::open(&path).unwrap();
                        assert_eq!(other.max_generation(&one.sandbox).unwrap(), Generation(g));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let all = Records::open(&path).unwrap().all().unwrap();
        assert_eq!(all.len(), 160);
    }

    #[test]
    fn puts_and_claims_at_once_share_commits_and_each_is_durable_when_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let r = std::sync::Arc::new(Records::open(&path).unwrap());
        let now = 1_700_000_000;
        let threads: Vec<_> = (0..12u8)
            .map(|t| {
                let (r, path) = (std::sync::Arc::clone(&r), path.clone());
                std::thread::spawn(move || {
                    for g in 1..=8u64 {
                        // An update's number claimed, then the record of what it did,
                        // while the other threads do the same: both kinds in groups.
                        let seq = u64::from(t) * 100 + g;
                        assert_eq!(r.claim_updates(&[(seq, now)], now).unwrap(), [Claim::Fresh]);
                        let mut one = rec(g, RecordState::Running);
                        one.sandbox = SandboxId::from_bytes([t; 16]);
                        r.put(&one).unwrap();
                        let other = Records::open(&path).unwrap();
                        assert_eq!(other.max_generation(&one.sandbox).unwrap(), Generation(g));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(r);
        // Every claim that returned is on disk: each number is a replay now.
        let again = Records::open(&path).unwrap();
        assert_eq!(again.all().unwrap().len(), 96);
        assert_eq!(again.seen_updates().unwrap(), 96);
        let seqs: Vec<(u64, u64)> = (0..12u64)
            .flat_map(|t| (1..=8).map(move |g| (t * 100 + g, now)))
            .collect();
        assert!(
            again
                .claim_updates(&seqs, now)
                .unwrap()
                .iter()
                .all(|c| *c == Claim::Replayed)
        );
    }
}
