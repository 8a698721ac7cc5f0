//! The one writer thread: writes waiting together commit in one transaction (each in
//! its own savepoint, so a failing one rolls back alone) and one fsync.

use std::sync::{Mutex, PoisonError, mpsc};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::helpers::sqlite_err;
use crate::error::StoreError;

/// Most writes committed together.
pub(super) const MAX_GROUP: usize = 128;

/// One write waiting for the writer thread.
pub(super) trait WriteJob: Send {
    /// Runs alone, outside any group (it manages its own transaction).
    fn exclusive(&self) -> bool;
    /// Runs the write; whether it succeeded.
    fn run(&mut self, c: &mut Connection) -> bool;
    /// Answers the caller once the group's fate (`commit`) is known.
    fn finish(self: Box<Self>, commit: Result<(), StoreError>);
}

impl std::fmt::Debug for dyn WriteJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteJob")
    }
}

pub(super) struct Job<T, F> {
    pub(super) f: Option<F>,
    pub(super) exclusive: bool,
    pub(super) result: Option<Result<T, StoreError>>,
    pub(super) reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> WriteJob for Job<T, F>
where
    T: Send,
    F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send,
{
    fn exclusive(&self) -> bool {
        self.exclusive
    }

    fn run(&mut self, c: &mut Connection) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)))
            .unwrap_or_else(|_| Err(StoreError::Backend("a database write panicked".into())));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), StoreError>) {
        let answer = match (self.result, commit) {
            (Some(Ok(v)), Ok(())) => Ok(v),
            (Some(Ok(_)), Err(e)) => Err(e),
            (Some(Err(e)), _) => Err(e),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(StoreError::Backend("write was not run".into())),
        };
        let _ = self.reply.send(answer);
    }
}

/// The writer thread: groups waiting writes into one transaction each.
pub(super) fn writer_loop(conn: &Mutex<Connection>, jobs: &mpsc::Receiver<Box<dyn WriteJob>>) {
    let mut pending: Option<Box<dyn WriteJob>> = None;
    loop {
        let first = match pending.take() {
            Some(j) => j,
            None => match jobs.recv() {
                Ok(j) => j,
                // Every store handle is gone.
                Err(_) => return,
            },
        };
        let mut c = conn.lock().unwrap_or_else(PoisonError::into_inner);
        if first.exclusive() {
            let mut job = first;
            job.run(&mut c);
            drop(c);
            job.finish(Ok(()));
            continue;
        }
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(j) if j.exclusive() => {
                    pending = Some(j);
                    break;
                }
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        let commit = run_group(&mut c, &mut group);
        drop(c);
        for job in group {
            job.finish(commit.clone());
        }
    }
}

/// One transaction, one savepoint per write; the commit's outcome.
pub(super) fn run_group(
    c: &mut Connection,
    group: &mut [Box<dyn WriteJob>],
) -> Result<(), StoreError> {
    // Prepared once per connection: these run for every write.
    let run = |c: &Connection, sql: &str| {
        c.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(sqlite_err)
    };
    run(c, "BEGIN IMMEDIATE")?;
    for job in group.iter_mut() {
        let step = run(c, "SAVEPOINT write").and_then(|()| {
            if job.run(c) {
                run(c, "RELEASE write")
            } else {
                run(c, "ROLLBACK TO write").and_then(|()| run(c, "RELEASE write"))
            }
        });
        if let Err(e) = step {
            let _ = c.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    run(c, "COMMIT").inspect_err(|_| {
        let _ = c.execute_batch("ROLLBACK");
    })
}
