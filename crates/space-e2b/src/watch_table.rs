//! The polled watchers (`CreateWatcher` … `RemoveWatcher`): per id, the execution
//! they watch for, their queued events (bounded) and the task that fills them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use space_identity::{ExecutionId, SandboxId};

use crate::connect::{Code, RpcError};

/// Events a polled watcher queues at most.
pub const MAX_QUEUED: usize = 10_000;

/// Bytes of events (as JSON) a polled watcher queues at most.
pub const MAX_QUEUED_BYTES: usize = 256 << 10;

/// Polled watchers per execution at most.
pub const MAX_WATCHERS: usize = 64;

/// Polled watchers of every sandbox together at most.
pub const MAX_ALL_WATCHERS: usize = 1024;

/// A polled watcher nobody asked for events for this long is closed.
pub const IDLE: Duration = Duration::from_secs(600);

/// How often idle and ended watchers are looked for.
pub const REAP_EVERY: Duration = Duration::from_secs(60);

/// The polled watchers.
#[derive(Debug, Default)]
pub struct Table {
    pub(crate) by_id: Mutex<HashMap<String, Entry>>,
}

/// A watcher, or a place taken for one being opened.
#[derive(Debug)]
pub(crate) struct Entry {
    sandbox: SandboxId,
    execution: ExecutionId,
    pub(crate) watcher: Option<Arc<Watcher>>,
    /// When the place was taken (one whose create never finished is dropped).
    at: Instant,
}

#[derive(Debug)]
pub(crate) struct Watcher {
    pub(crate) state: Mutex<Queued>,
    pub(crate) task: tokio::task::AbortHandle,
}

#[derive(Debug, Default)]
pub(crate) struct Queued {
    pub(crate) events: VecDeque<Value>,
    /// Bytes of `events` as JSON.
    pub(crate) bytes: usize,
    /// Events were lost (the queue was full, or the watch told of an overflow).
    pub(crate) lost: bool,
    /// The watch ended (its directory went, or its execution was replaced).
    pub(crate) ended: Option<RpcError>,
    /// Its end was told (the watcher is dropped at the next reap).
    pub(crate) told: bool,
    pub(crate) polled: Option<Instant>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Table {
    fn get(&self, ctx: (SandboxId, ExecutionId), id: &str) -> Result<Arc<Watcher>, RpcError> {
        let t = lock(&self.by_id);
        t.get(id)
            .filter(|e| e.sandbox == ctx.0 && e.execution == ctx.1)
            .and_then(|e| e.watcher.clone())
            .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id} not found")))
    }

    /// The events queued since the last call (or the watch's end, once they are out).
    pub(crate) fn take(
        &self,
        ctx: (SandboxId, ExecutionId),
        id: &str,
    ) -> Result<Vec<Value>, RpcError> {
        let w = self.get(ctx, id)?;
        let mut q = lock(&w.state);
        q.polled = Some(Instant::now());
        if q.lost {
            q.lost = false;
            q.events.clear();
            q.bytes = 0;
            return Err(RpcError::new(
                Code::DataLoss,
                format!(
                    "watcher {id} lost events: more than {MAX_QUEUED} (or {} KiB) were queued between polls",
                    MAX_QUEUED_BYTES >> 10
                ),
            ));
        }
        if q.events.is_empty() {
            if let Some(e) = q.ended.clone() {
                q.told = true;
                return Err(e);
            }
        }
        q.bytes = 0;
        Ok(q.events.drain(..).collect())
    }

    pub(crate) fn remove(&self, ctx: (SandboxId, ExecutionId), id: &str) -> Result<(), RpcError> {
        self.get(ctx, id)?;
        lock(&self.by_id).remove(id);
        Ok(())
    }

    /// Closes every watcher of `sandbox` (it was deleted).
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        lock(&self.by_id).retain(|_, e| e.sandbox != *sandbox);
    }

    /// Drops watchers idle past [`IDLE`], and those whose end was told.
    pub fn reap(&self) {
        lock(&self.by_id).retain(|_, e| match &e.watcher {
            None => e.at.elapsed() < REAP_EVERY,
            Some(w) => {
                let q = lock(&w.state);
                !q.told && q.polled.is_none_or(|p| p.elapsed() < IDLE)
            }
        });
    }

    /// Takes a place for a watcher of `ctx`'s execution, within the bounds.
    pub(crate) fn reserve(&self, ctx: (SandboxId, ExecutionId), id: &str) -> Result<(), RpcError> {
        self.reap();
        let mut t = lock(&self.by_id);
        if t.len() >= MAX_ALL_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_ALL_WATCHERS} watchers are kept: try again later"),
            ));
        }
        let mine = t
            .values()
            .filter(|e| e.sandbox == ctx.0 && e.execution == ctx.1)
            .count();
        if mine >= MAX_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_WATCHERS} watchers per sandbox: remove one first"),
            ));
        }
        t.insert(
            id.to_owned(),
            Entry {
                sandbox: ctx.0,
                execution: ctx.1,
                watcher: None,
                at: Instant::now(),
            },
        );
        Ok(())
    }
}
