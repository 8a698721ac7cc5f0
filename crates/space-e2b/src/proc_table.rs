//! The E2B process table: the processes started through the front, per execution
//! and pid, each with its input queue and the calls following its output.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use serde_json::Value;
use space_identity::{ExecutionId, SandboxId};
use tokio::sync::mpsc;

use crate::connect::{Code, RpcError};

/// Processes tracked per execution at most.
pub const MAX_PROCESSES: usize = 1024;

/// Calls following one process at most.
pub(crate) const MAX_FOLLOWERS: usize = 64;

/// Events queued per follower before the command is held back.
pub(crate) const FOLLOWER_QUEUE: usize = 64;

/// Input messages queued per process (each at most a `SendInput`'s bytes).
pub(crate) const INPUT_QUEUE: usize = 4;

/// How long a `SendInput` waits for room in its process's input queue (stdin the
/// command does not read) before it is refused.
pub(crate) const INPUT_WAIT: Duration = Duration::from_secs(10);

/// How long one follower may hold a process's output back before it is cut off.
pub(crate) const FOLLOWER_STALL: Duration = Duration::from_secs(30);

/// The processes of one execution, by pid.
type Processes = HashMap<u32, Arc<Proc>>;

/// The table of every execution's processes.
#[derive(Debug, Default)]
pub struct Table {
    by_execution: Mutex<HashMap<(SandboxId, ExecutionId), Processes>>,
}

impl Table {
    pub(crate) fn insert(
        &self,
        key: (SandboxId, ExecutionId),
        p: Arc<Proc>,
    ) -> Result<(), RpcError> {
        let mut t = self
            .by_execution
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let procs = t.entry(key).or_default();
        if procs.len() >= MAX_PROCESSES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_PROCESSES} processes are tracked per sandbox"),
            ));
        }
        procs.insert(p.pid, p);
        Ok(())
    }

    /// Forgets `p` (and not a later process that took its pid).
    pub(crate) fn remove(&self, key: &(SandboxId, ExecutionId), p: &Arc<Proc>) {
        if let Ok(mut t) = self.by_execution.lock() {
            if let Some(procs) = t.get_mut(key) {
                if procs.get(&p.pid).is_some_and(|x| Arc::ptr_eq(x, p)) {
                    procs.remove(&p.pid);
                }
                if procs.is_empty() {
                    t.remove(key);
                }
            }
        }
    }

    pub(crate) fn find(
        &self,
        key: &(SandboxId, ExecutionId),
        sel: &Selector,
    ) -> Result<Arc<Proc>, RpcError> {
        let t = self
            .by_execution
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let procs = t.get(key);
        let found = match sel {
            Selector::Pid(pid) => procs.and_then(|p| p.get(pid)).cloned(),
            Selector::Tag(tag) => procs.and_then(|p| {
                p.values()
                    .find(|x| x.tag.as_deref() == Some(tag.as_str()))
                    .cloned()
            }),
        };
        found.ok_or_else(|| RpcError::new(Code::NotFound, format!("process {sel} not found")))
    }

    pub(crate) fn list(&self, key: &(SandboxId, ExecutionId)) -> Vec<Arc<Proc>> {
        self.by_execution
            .lock()
            .map(|t| {
                t.get(key)
                    .map(|p| p.values().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// Forgets every process of `sandbox` (it was deleted: their streams end).
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        if let Ok(mut t) = self.by_execution.lock() {
            t.retain(|(s, _), _| s != sandbox);
        }
    }
}

/// One process.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) pid: u32,
    pub(crate) tag: Option<String>,
    /// Its `ProcessConfig`, as `List` shows it.
    pub(crate) config: Value,
    /// Under a terminal.
    pub(crate) pty: bool,
    pub(crate) input: mpsc::Sender<Control>,
    pub(crate) followers: Mutex<Vec<mpsc::Sender<Event>>>,
}

impl Proc {
    pub(crate) fn follow(&self) -> Result<mpsc::Receiver<Event>, RpcError> {
        let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE);
        let mut f = self
            .followers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.retain(|t| !t.is_closed());
        if f.len() >= MAX_FOLLOWERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_FOLLOWERS} calls follow one process"),
            ));
        }
        f.push(tx);
        Ok(rx)
    }

    pub(crate) async fn control(&self, c: Control) -> Result<(), RpcError> {
        match tokio::time::timeout(INPUT_WAIT, self.input.send(c)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(RpcError::new(
                Code::NotFound,
                format!("process {} has ended", self.pid),
            )),
            Err(_) => Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "process {} has not read its input for {} s",
                    self.pid,
                    INPUT_WAIT.as_secs()
                ),
            )),
        }
    }
}

/// What goes down a process's stream.
#[derive(Debug)]
pub(crate) enum Control {
    Stdin(Vec<u8>),
    CloseStdin,
    Signal(i32),
    Resize { rows: u16, cols: u16 },
}

/// What a follower is told.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// Output: `stdout`, `stderr` or `pty` (envd's names).
    Data {
        stream: &'static str,
        bytes: Bytes,
    },
    End(Result<Value, RpcError>),
}

/// How a call names a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selector {
    Pid(u32),
    Tag(String),
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pid(p) => write!(f, "with pid {p}"),
            Self::Tag(t) => write!(f, "with tag {t:?}"),
        }
    }
}

/// Hands `e` to every follower still there, in order: a slow one holds the command's
/// output back (like a pipe) for up to [`FOLLOWER_STALL`], and is then cut off (its
/// call ends saying so) rather than hold it for ever.
pub(crate) async fn publish(p: &Proc, e: Event) {
    let followers: Vec<mpsc::Sender<Event>> = p
        .followers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut gone = false;
    for f in &followers {
        match tokio::time::timeout(FOLLOWER_STALL, f.send(e.clone())).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => gone = true,
            Err(_) => {
                // Cut off: dropping its sender ends its call.
                if let Ok(mut all) = p.followers.lock() {
                    all.retain(|x| !x.same_channel(f));
                }
            }
        }
    }
    if gone {
        if let Ok(mut f) = p.followers.lock() {
            f.retain(|t| !t.is_closed());
        }
    }
}
