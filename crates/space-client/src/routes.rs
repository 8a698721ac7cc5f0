//! Route recovery for direct mode (`IDENTITY.md` §4): the cached route of a sandbox,
//! one coalesced resolve after a RefreshRoute, one rebuilt attempt, a Deny surfaced,
//! a worker that refuses connections waited for, and what recovery cost.

use super::*;

impl Client {
    /// Runs `attempt` on the route of `sandbox` with the recovery rules: after a
    /// RefreshRoute one (shared) resolve and one rebuilt attempt; a Deny surfaced and
    /// the route dropped; after a transport failure that allows it, one more try (on a
    /// route resolved afresh when nothing reached the worker).
    pub(crate) async fn on_route<T, F, Fut>(
        &self,
        sandbox: &SandboxId,
        class: OperationClass,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Arc<Grant>) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let (mut route, mut grant) = self.route_for(sandbox).await?;
        let mut recovery = Recovery::new(class);
        let mut refreshed_at: Option<std::time::Instant> = None;
        let mut unreachable = space_http::patience::Patience::new(UNREACHABLE_WAIT);
        loop {
            let outcome = attempt(Arc::clone(&grant)).await;
            if let (Some(t), false) = (refreshed_at, matches!(outcome, Attempt::Refresh(_))) {
                self.rebuilt(t.elapsed());
            }
            match outcome {
                Attempt::Done(result) => return result,
                Attempt::Denied(e) => {
                    self.forget(&route.identity());
                    return Err(e);
                }
                // Nothing reached the worker: it is not listening (restarting, say).
                // Waiting for it is not a retry of the operation: bounded, resolving
                // afresh each time (it may come back under another address).
                // (A stream's refused upgrade connection counts: `NotStarted` is only
                // ever a connection that was not made.)
                Attempt::Failed(_, Progress::NotStarted) if unreachable.patient() => {
                    unreachable.wait().await;
                    self.forget(&route.identity());
                    (route, grant) = self.fresh(sandbox).await?;
                }
                Attempt::Failed(e, progress) => {
                    if recovery.on_transport_failure(progress).is_err() {
                        return Err(e);
                    }
                    if progress == Progress::NotStarted {
                        // Nothing reached the worker. It may have restarted under a new
                        // address: resolve afresh and try once more.
                        self.forget(&route.identity());
                        (route, grant) = self.fresh(sandbox).await?;
                    }
                }
                Attempt::Refresh(body) => {
                    let reason = space_proto::api::refresh_reason(body.as_ref());
                    let used = route.identity();
                    recovery
                        .on_refresh(used.clone(), reason, Progress::NotStarted)
                        .map_err(Error::Route)?;
                    refreshed_at.get_or_insert_with(std::time::Instant::now);
                    let (r, g) = self.repair(sandbox, &used).await?;
                    recovery.on_resolved(&r.identity()).map_err(Error::Route)?;
                    (route, grant) = (r, g);
                }
            }
        }
    }

    // ---- routes -----------------------------------------------------------------------

    /// The cached route of `sandbox`, or a new capability from the edge.
    pub(crate) async fn route_for(
        &self,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<Grant>), Error> {
        let hit = self.inner.routes.lock().ok().and_then(|r| {
            r.get(sandbox, now())
                .map(|e| (e.route.clone(), e.value.clone()))
        });
        match hit {
            Some(hit) => Ok(hit),
            None => self.fresh(sandbox).await,
        }
    }

    /// A new capability, cached until shortly before it expires.
    pub(crate) async fn fresh(&self, sandbox: &SandboxId) -> Result<(Route, Arc<Grant>), Error> {
        let cap = self.authorize(sandbox, false).await?;
        let until = Timestamp::from_unix_secs(cap.expires_at.saturating_sub(RENEW_MARGIN_SECS));
        let (route, grant) = grant_of(cap);
        if let Ok(mut routes) = self.inner.routes.lock() {
            routes.insert(route.clone(), grant.clone(), until, now());
        }
        Ok((route, grant))
    }

    /// After a RefreshRoute on `rejected`: one resolve per sandbox at a time; later
    /// arrivals take the repaired entry.
    pub(crate) async fn repair(
        &self,
        sandbox: &SandboxId,
        rejected: &RouteIdentity,
    ) -> Result<(Route, Arc<Grant>), Error> {
        let lock = match self.inner.resolving.lock() {
            Ok(mut map) => {
                if map.len() > ROUTES {
                    map.retain(|_, l| Arc::strong_count(l) > 1);
                }
                Arc::clone(map.entry(*sandbox).or_default())
            }
            Err(_) => Arc::default(),
        };
        let _one_at_a_time = lock.lock().await;
        if let Ok(routes) = self.inner.routes.lock() {
            if let AfterRefresh::UseCurrent(e) = routes.after_refresh(rejected, now()) {
                return Ok((e.route.clone(), e.value.clone()));
            }
        }
        let cap = self.authorize(sandbox, true).await?;
        let (route, grant) = grant_of(cap);
        if let Ok(mut routes) = self.inner.routes.lock() {
            // Only over the rejected route, keeping its expiry; an entry that expired
            // meanwhile is authorized afresh by the next operation.
            let _ = routes.replace_if_current(rejected, route.clone(), grant.clone(), now());
        }
        Ok((route, grant))
    }

    /// Records one rebuilt attempt's added latency.
    pub(crate) fn rebuilt(&self, added: Duration) {
        if let Ok(mut r) = self.inner.recoveries.lock() {
            r.rebuilt += 1;
            if r.added.len() < Recoveries::KEPT {
                r.added.push(added);
            }
        }
    }

    /// The rebuilt attempts this client made so far and what they added.
    pub fn recoveries(&self) -> Recoveries {
        self.inner
            .recoveries
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    pub(crate) fn forget(&self, route: &RouteIdentity) {
        if let Ok(mut routes) = self.inner.routes.lock() {
            routes.remove_if_current(route);
        }
    }

    /// A capability for the current execution of `sandbox`, from the edge.
    /// `rebuilt`: for the rebuilt attempt after a RefreshRoute.
    pub(crate) async fn authorize(
        &self,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> Result<CapabilityResponse, Error> {
        let h = [("content-type", "application/json")];
        let body = if rebuilt { ACCESS_REBUILT } else { ACCESS };
        let a = self
            .edge(
                Method::POST,
                &format!("/v1/sandboxes/{sandbox}/capabilities"),
                Some(&h),
                Bytes::from_static(body.as_bytes()),
            )
            .await?;
        decode(&a)
    }
}
