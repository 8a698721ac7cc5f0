//! Standby sandboxes: sandboxes started ahead of demand, owned by [`STANDBY_TENANT`]
//! until a create claims one, kept per template (the host-directories `default`, and
//! each template the operator names with `--standby-template NAME=N`), per network
//! kind (`--standby-egress N` keeps sandboxes of the default template with their link
//! made, for creates in mode `egress`: making a link is the one step of such a create
//! that the kernel serialises) and spread evenly over the active workers
//! ([`crate::standby_plan`]).
//!
//! The keeper refills while creates run: every tick it starts what the plan says,
//! at most [`STARTS_PER_WORKER`] in flight per worker, each on the worker it was
//! planned for, so a burst of claims is refilled where it drained the pool without
//! the refills queueing ahead of the burst's own launches.

use std::sync::Arc;

use space_identity::WorkerId;
use space_proto::api::CreateSandbox;
use space_proto::api::{NetworkMode, Policy};
use space_store::{SandboxState, WorkerState};

use super::plane::{ControlPlane, DEFAULT_TEMPLATE, STANDBY_TENANT};
use crate::auth::Caller;
use crate::error::ControlError;
use crate::standby_plan::{self, Bounds, Pool, PoolKey, TemplatePool, WorkerView};

/// Most standby starts in flight on one worker at once.
pub const STARTS_PER_WORKER: usize = 2;

/// How long a worker gets no standby start after one failed there.
const FAILED_START_BACKOFF: std::time::Duration = std::time::Duration::from_secs(2);

impl ControlPlane {
    /// How many standby sandboxes of the default template this control plane keeps.
    pub fn standby_target(&self) -> usize {
        self.standby_target
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how many standby sandboxes of the default template to keep (0: none;
    /// existing ones stay until claimed).
    pub fn set_standby_target(&self, n: usize) {
        self.standby_target
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many standby sandboxes of the default template this control plane keeps
    /// with a link made (`--standby-egress`).
    pub fn standby_egress_target(&self) -> usize {
        self.standby_egress_target
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how many standby sandboxes of the default template to keep with a link
    /// made, for creates in mode `egress` (0: none; existing ones stay until claimed).
    pub fn set_standby_egress_target(&self, n: usize) {
        self.standby_egress_target
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the pools of image templates (`--standby-template`).
    pub fn set_standby_templates(&self, pools: Vec<TemplatePool>) {
        *self
            .standby_templates
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pools;
    }

    /// Whether a create of this kind (its template as records name it, and whether
    /// it asks for mode `egress`) may claim a standby sandbox: it has a pool.
    pub(super) fn has_standby_pool(&self, key: &PoolKey) -> bool {
        self.standby_pinned
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .is_some_and(|&total| total > 0)
    }

    /// The policy a standby sandbox of a pool is started with (a claim gives it its
    /// own). Without a link: mode `none`. With one: the default policy when the
    /// default mode is `egress`, else [`held_link_policy`].
    fn standby_policy(&self, linked: bool) -> Policy {
        let default = self.default_network();
        match (linked, default.mode) {
            (false, _) => Policy::none(),
            (true, NetworkMode::Egress) => default,
            (true, NetworkMode::None) => held_link_policy(),
        }
    }

    /// The pools, their templates pinned as records name them (a named template not
    /// imported yet has no pool), each with the name a create of it uses.
    async fn pools(&self) -> Vec<(Pool, String)> {
        // `--standby N` is the pool of the default template, whichever that is now
        // (`space up --default-template debian` makes it `debian-default` once
        // imported); the host directories until it resolves.
        let default = self.default_template();
        let default_pinned = match self.pin_template(&default).await {
            Ok(t) => (t, default),
            Err(_) => (DEFAULT_TEMPLATE.to_owned(), DEFAULT_TEMPLATE.to_owned()),
        };
        // `--standby` and the image pools are of the default mode; `--standby-egress`
        // is of the default template with a link (the same kind as `--standby` when
        // the default mode is `egress`: the two add up).
        let linked = self.default_network().mode == NetworkMode::Egress;
        let mut pools = vec![
            (
                Pool {
                    key: PoolKey {
                        template: default_pinned.0.clone(),
                        linked,
                    },
                    total: self.standby_target(),
                },
                default_pinned.1.clone(),
            ),
            (
                Pool {
                    key: PoolKey {
                        template: default_pinned.0,
                        linked: true,
                    },
                    total: self.standby_egress_target(),
                },
                default_pinned.1,
            ),
        ];
        let named = self
            .standby_templates
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for p in named {
            match self.pin_template(&p.name).await {
                Ok(template) => {
                    pools.push((
                        Pool {
                            key: PoolKey { template, linked },
                            total: p.total,
                        },
                        p.name,
                    ));
                }
                Err(e) => {
                    tracing::debug!(template = %p.name, error = %e, "no standby pool yet");
                }
            }
        }
        // Pools of one kind are one pool.
        let mut merged: Vec<(Pool, String)> = Vec::with_capacity(pools.len());
        for (pool, name) in pools {
            match merged.iter_mut().find(|(m, _)| m.key == pool.key) {
                Some((m, _)) => m.total += pool.total,
                None => merged.push((pool, name)),
            }
        }
        *self
            .standby_pinned
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = merged
            .iter()
            .map(|(p, _)| (p.key.clone(), p.total))
            .collect();
        merged.retain(|(p, _)| p.total > 0);
        merged
    }

    /// One step of the standby keeper: the starts [`standby_plan::next_starts`] plans
    /// for the pools, begun in the background (through the normal create path:
    /// placement on the planned worker, warm jail, acknowledged install). Returns the
    /// starts begun, to wait for if the caller wants to.
    ///
    /// While claims are arriving, refills are held back a short, bounded time
    /// ([`standby_plan::BurstClock::hold_refills`]) unless `hold_nothing` is set.
    pub async fn keep_standby(
        self: &Arc<Self>,
        hold_nothing: bool,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, ControlError> {
        let pools = self.pools().await;
        let standby = self.store.count_standby_by_worker(STANDBY_TENANT).await?;
        let ready = self
            .store
            .list_sandboxes(STANDBY_TENANT)
            .await?
            .iter()
            .filter(|s| s.state == SandboxState::Running)
            .count();
        self.metrics
            .standby_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
        self.metrics.standby_by_worker.clear();
        for c in &standby {
            self.metrics
                .standby_by_worker
                .get_or_create(&crate::metrics::StandbyLabels {
                    worker: c.worker.to_string(),
                    template: c.template.clone(),
                    network: mode_label(c.mode).to_owned(),
                })
                .set(i64::try_from(c.n).unwrap_or(i64::MAX));
        }
        if pools.is_empty() {
            return Ok(Vec::new());
        }
        let in_flight = self
            .standby_in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let resting: Vec<WorkerId> = {
            let mut backoff = self
                .standby_backoff
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            backoff.retain(|_, until| *until > std::time::Instant::now());
            backoff.keys().cloned().collect()
        };
        // Standby sandboxes run where a create of the default substrate goes.
        let substrate = self.default_substrate();
        let workers: Vec<WorkerView> = self
            .store
            .list_workers()
            .await?
            .into_iter()
            .filter(|w| w.substrate == substrate)
            .map(|w| WorkerView {
                accepts: w.state == WorkerState::Active && !resting.contains(&w.id),
                standby: standby
                    .iter()
                    .filter(|c| c.worker == w.id)
                    .map(|c| {
                        let key = PoolKey {
                            template: c.template.clone(),
                            linked: c.mode == NetworkMode::Egress,
                        };
                        (key, usize::try_from(c.n).unwrap_or(usize::MAX))
                    })
                    .collect(),
                in_flight: in_flight.get(&w.id).copied().unwrap_or(0),
                id: w.id,
            })
            .collect();
        let plan_pools: Vec<Pool> = pools.iter().map(|(p, _)| p.clone()).collect();
        let starts = standby_plan::next_starts(
            &plan_pools,
            &workers,
            Bounds {
                per_worker: STARTS_PER_WORKER,
                holding: !hold_nothing
                    && self
                        .standby_burst
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .hold_refills(std::time::Instant::now()),
            },
        );
        Ok(starts
            .into_iter()
            .map(|(worker, key)| {
                let name = pools
                    .iter()
                    .find(|(p, _)| p.key == key)
                    .map(|(_, name)| name.clone())
                    .unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
                let network = self.standby_policy(key.linked);
                self.begin_standby(worker, name, network)
            })
            .collect())
    }

    /// One keeper step that holds nothing back, waited for: how many standby
    /// sandboxes it started (tests).
    pub async fn keep_standby_now(self: &Arc<Self>) -> Result<usize, ControlError> {
        let started = self.keep_standby(true).await?;
        let n = started.len();
        for task in started {
            task.await
                .map_err(|e| ControlError::Internal(format!("standby start: {e}")))?;
        }
        Ok(n)
    }

    /// Starts one standby sandbox of `template` with `network` on `worker` in the
    /// background, counted in flight until its create returns.
    fn begin_standby(
        self: &Arc<Self>,
        worker: WorkerId,
        template: String,
        network: Policy,
    ) -> tokio::task::JoinHandle<()> {
        *self
            .standby_in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(worker.clone())
            .or_default() += 1;
        let cp = Arc::clone(self);
        tokio::spawn(async move {
            let caller = Caller {
                tenant: STANDBY_TENANT.into(),
                key_id: "standby".into(),
                admin: false,
            };
            let req = CreateSandbox {
                template: Some(template.clone()),
                worker: Some(worker.clone()),
                network: Some(network),
                ..Default::default()
            };
            if let Err(e) = cp.create_sandbox(&caller, req).await {
                tracing::warn!(%worker, %template, error = %e, "standby sandbox failed to start");
                // No storm of starts at a worker that refuses them (or is gone).
                cp.standby_backoff
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(
                        worker.clone(),
                        std::time::Instant::now() + FAILED_START_BACKOFF,
                    );
            }
            let mut in_flight = cp
                .standby_in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = in_flight.get_mut(&worker) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    in_flight.remove(&worker);
                }
            }
        })
    }

    /// Standby starts under way now, in all.
    pub fn standby_starting(&self) -> usize {
        self.standby_in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .sum()
    }
}

/// The policy of a standby sandbox with a link while the default mode is `none`: mode
/// `egress` allowing one name that never resolves (`.invalid`, RFC 6761), so nothing
/// leaves it before a claim gives it its own policy; and since it names no address, a
/// claim's names-only policy changes nothing in the worker's table.
pub fn held_link_policy() -> Policy {
    Policy::parse(NetworkMode::Egress, &["standby.invalid"], &[] as &[&str])
        .unwrap_or_else(|_| Policy::none())
}

/// A network mode as a metric label.
fn mode_label(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::None => "none",
        NetworkMode::Egress => "egress",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_link_lets_nothing_out_and_names_no_address() {
        let p = held_link_policy();
        assert_eq!(p.mode, NetworkMode::Egress);
        // Only names: a claim's names-only policy then changes no rule of the table.
        assert_eq!(p.allowed_networks().count(), 0);
        assert_eq!(p.allow().len(), 1);
        // A name under `.invalid` never resolves (RFC 6761): nothing is reached.
        let name = p.allow()[0].to_string();
        assert!(name.ends_with(".invalid"), "{name}");
        assert!(p.deny().is_empty());
    }
}
