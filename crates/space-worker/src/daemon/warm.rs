//! The warm pool: jails and bridges launched ahead of demand, so that creating a
//! sandbox costs an activation (renames, hostname, two pipe writes) instead of a
//! launch. See [`crate::substrate::jail::warm`] for what a warm jail is and why it
//! serves nothing before its activation.
//!
//! One background thread keeps `target` entries ready. It launches one at a time, and
//! only after [`QUIET`] without a take, so refilling never competes with a burst of
//! creates for the CPU. Entries are ephemeral: the pool empties on shutdown, and a
//! worker that crashed finds its warm jails unrecorded, so the startup sweep removes
//! them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::substrate::jail::JailDriver;
use crate::substrate::{AgentCommand, Limits, SubstrateError};

pub use super::launch::Warm;
use super::launch::{Binaries, WarmBridge};

/// How long after the last take the pool waits before launching again.
pub const QUIET: Duration = Duration::from_millis(300);

/// How long the pool waits after a failed launch before trying again.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Shared {
    ready: Vec<Warm>,
    last_take: Option<Instant>,
}

/// Warm jails of one worker.
#[derive(Debug)]
pub struct WarmPool {
    target: usize,
    limits: Limits,
    shared: Mutex<Shared>,
    wake: Condvar,
    stopping: AtomicBool,
    refill: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl WarmPool {
    /// A pool keeping `target` entries with `limits`; [`WarmPool::start`] fills it.
    pub fn new(target: usize, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            target,
            limits,
            shared: Mutex::new(Shared {
                ready: Vec::new(),
                last_take: None,
            }),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            refill: Mutex::new(None),
        })
    }

    /// The limits every entry has.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Entries ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().map(|s| s.ready.len()).unwrap_or(0)
    }

    /// Starts the refill thread.
    pub fn start(
        self: &Arc<Self>,
        jail: Arc<JailDriver>,
        bins: Binaries,
        data_dir: std::path::PathBuf,
    ) {
        if self.target == 0 {
            return;
        }
        let pool = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("warm-pool".into())
            .spawn(move || pool.refill(&jail, &bins, &data_dir));
        match spawned {
            Ok(handle) => {
                if let Ok(mut slot) = self.refill.lock() {
                    *slot = Some(handle);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot start the warm pool"),
        }
    }

    /// An entry with `limits`, if one is ready.
    pub fn take(&self, limits: &Limits) -> Option<Warm> {
        if *limits != self.limits {
            return None;
        }
        let mut shared = self.shared.lock().ok()?;
        shared.last_take = Some(Instant::now());
        let warm = shared.ready.pop();
        drop(shared);
        self.wake.notify_all();
        warm
    }

    /// Stops refilling (waiting for a launch under way, so that it leaves nothing
    /// behind) and destroys every ready entry. Blocking.
    pub fn shutdown(&self, jail: &JailDriver) {
        {
            // Under the lock the refill thread checks `stopping` with: no lost wake-up.
            let _shared = self.shared.lock();
            self.stopping.store(true, Ordering::SeqCst);
            self.wake.notify_all();
        }
        let refill = self.refill.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = refill {
            let _ = handle.join();
        }
        let drained: Vec<Warm> = self
            .shared
            .lock()
            .map(|mut s| std::mem::take(&mut s.ready))
            .unwrap_or_default();
        for w in drained {
            discard(jail, w);
        }
    }

    fn refill(&self, jail: &JailDriver, bins: &Binaries, data_dir: &std::path::Path) {
        loop {
            {
                let Ok(mut shared) = self.shared.lock() else {
                    return;
                };
                loop {
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    let quiet_for = shared.last_take.map(|t| t.elapsed()).unwrap_or(QUIET);
                    if shared.ready.len() < self.target && quiet_for >= QUIET {
                        break;
                    }
                    let wait = if shared.ready.len() < self.target {
                        QUIET - quiet_for
                    } else {
                        Duration::from_secs(3600)
                    };
                    shared = match self.wake.wait_timeout(shared, wait) {
                        Ok((s, _)) => s,
                        Err(_) => return,
                    };
                }
            }
            match launch_one(jail, bins, data_dir, self.limits) {
                Ok(w) => {
                    let Ok(mut shared) = self.shared.lock() else {
                        discard(jail, w);
                        return;
                    };
                    if self.stopping.load(Ordering::SeqCst) {
                        drop(shared);
                        discard(jail, w);
                        return;
                    }
                    shared.ready.push(w);
                }
                Err(Some(SubstrateError::Unsupported(why))) => {
                    tracing::info!(reason = %why, "warm pool disabled");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = ?e, "warm launch failed; retrying later");
                    std::thread::sleep(RETRY);
                }
            }
        }
    }
}

/// Launches one entry; `Err(None)` when the bridge failed (the jail is destroyed).
fn launch_one(
    jail: &JailDriver,
    bins: &Binaries,
    data_dir: &std::path::Path,
    limits: Limits,
) -> Result<Warm, Option<SubstrateError>> {
    let warm_jail = jail
        .prelaunch(data_dir, limits, AgentCommand::spaced_guest(&bins.agent))
        .map_err(Some)?;
    match WarmBridge::spawn(bins) {
        Ok(bridge) => Ok(Warm {
            jail: warm_jail,
            bridge,
        }),
        Err(e) => {
            tracing::warn!(error = %e, "warm bridge failed to start");
            jail.discard(warm_jail);
            Err(None)
        }
    }
}

/// Destroys an entry that will not be used.
pub fn discard(jail: &JailDriver, w: Warm) {
    w.bridge.discard();
    jail.discard(w.jail);
}
