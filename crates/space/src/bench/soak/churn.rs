//! The churner: migrates sandboxes to the other worker and pauses/resumes them in
//! place, back to back, round robin; and, when asked, kills a worker now and then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use space_client::Client;
use space_identity::{SandboxId, WorkerId};

use super::timeline::Timeline;

/// What the churner did.
#[derive(Debug, Default)]
pub struct Churned {
    /// Migrations that completed.
    pub migrations: AtomicU64,
    /// Pause + resume pairs that completed.
    pub pauses: AtomicU64,
    /// Workers killed.
    pub kills: AtomicU64,
    /// Lifecycle calls that failed, by message.
    pub errors: Mutex<BTreeMap<String, u64>>,
}

impl Churned {
    fn error(&self, what: String) {
        if let Ok(mut e) = self.errors.lock() {
            if e.len() < 30 || e.contains_key(&what) {
                *e.entry(what).or_default() += 1;
            }
        }
    }

    /// Failed lifecycle calls.
    pub fn failed(&self) -> u64 {
        self.errors.lock().map(|e| e.values().sum()).unwrap_or(0)
    }
}

/// The current execution of `sbx`, as the control plane reports it.
pub async fn execution_of(admin: &Client, sbx: &SandboxId) -> Option<(String, WorkerId)> {
    let s = admin.sandbox(sbx).await.ok()?;
    let e = s.execution?;
    Some((e.execution_id.to_string(), e.worker))
}

/// How often [`watch`] looks at every sandbox's execution.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// Until `stop`, looks at every sandbox's current execution every [`WATCH_EVERY`] and
/// enters a new one in the timeline (current from the look before it: it was
/// acknowledged in between), so that executions nobody here started — a restart
/// after an agent or a worker died, the reconciler's — are known when answers name
/// them.
pub async fn watch(
    admin: Client,
    sandboxes: Arc<Vec<SandboxId>>,
    timeline: Arc<Timeline>,
    stop: Arc<AtomicBool>,
) {
    let mut looked = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(WATCH_EVERY).await;
        let now = Instant::now();
        for sbx in sandboxes.iter() {
            if let Some((exe, _)) = execution_of(&admin, sbx).await {
                timeline.seen(&sbx.to_string(), &exe, looked);
            }
        }
        looked = now;
    }
}

/// Churns until `stop`: of every four transitions, three are migrations and one a
/// pause followed by a resume.
pub async fn run(
    admin: Client,
    sandboxes: Arc<Vec<SandboxId>>,
    workers: Vec<WorkerId>,
    timeline: Arc<Timeline>,
    churned: Arc<Churned>,
    stop: Arc<AtomicBool>,
) {
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let sbx = sandboxes[i % sandboxes.len()];
        i += 1;
        let Some((_, at)) = execution_of(&admin, &sbx).await else {
            churned.error(format!("{sbx}: no execution"));
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let began = Instant::now();
        if i % 4 == 0 {
            let paused = admin.pause(&sbx).await;
            let resumed = admin.resume(&sbx, None).await;
            match (paused, resumed) {
                (Ok(_), Ok(_)) => {
                    churned.pauses.fetch_add(1, Ordering::Relaxed);
                }
                (Err(e), _) | (_, Err(e)) => churned.error(format!("pause/resume: {e}")),
            }
        } else {
            let Some(target) = workers.iter().find(|w| **w != at).cloned() else {
                return;
            };
            match admin.migrate(&sbx, &target).await {
                Ok(_) => {
                    churned.migrations.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    churned.error(format!("migrate: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let ended = Instant::now();
        if let Some((exe, _)) = execution_of(&admin, &sbx).await {
            timeline.moved(&sbx.to_string(), &exe, began, ended);
        }
    }
}

/// Kills a worker with SIGKILL every `every` (round robin), until `stop`; `space up`
/// restarts it. After each, the timeline learns the executions the restart left.
pub async fn kill_workers(
    platform: Arc<crate::bench::platform::Platform>,
    admin: Client,
    sandboxes: Arc<Vec<SandboxId>>,
    timeline: Arc<Timeline>,
    churned: Arc<Churned>,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    let mut n = 0usize;
    loop {
        tokio::time::sleep(every).await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let id = platform.workers[n % platform.workers.len()].clone();
        n += 1;
        let began = Instant::now();
        let Some(pid) = platform.worker_pid(&id) else {
            churned.error(format!("kill: no process for {id}"));
            continue;
        };
        // SAFETY: kill(2) of a process of the platform this benchmark started.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        churned.kills.fetch_add(1, Ordering::Relaxed);
        // Wait until a new process of it runs and the workers are active again.
        let deadline = Instant::now() + Duration::from_secs(60);
        while platform.worker_pid(&id).is_none_or(|p| p == pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Err(e) = platform
            .wait_for_workers(platform.workers.len(), Duration::from_secs(60))
            .await
        {
            churned.error(format!("after killing {id}: {e}"));
        }
        let ended = Instant::now();
        for sbx in sandboxes.iter() {
            if let Some((exe, _)) = execution_of(&admin, sbx).await {
                timeline.moved(&sbx.to_string(), &exe, began, ended);
            }
        }
    }
}
