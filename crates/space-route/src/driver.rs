//! [`RouteDriver`]: the route cache and the recovery loop of `IDENTITY.md` §4, generic
//! over how a route is resolved ([`Resolver`]) and how an attempt is sent (a closure
//! returning an [`Attempt`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use space_identity::{
    AfterRefresh, OperationClass, Progress, Recovery, RecoveryError, RefreshReason, Route,
    RouteCache, RouteIdentity, SandboxId, Timestamp,
};

use crate::patience::Patience;

/// Per-sandbox resolve locks kept before idle ones are dropped.
const RESOLVING_KEPT: usize = 10_000;

/// A route the control plane resolved, with what the caller presents on it.
#[derive(Debug)]
pub struct Resolved<G> {
    /// The route the capability names.
    pub route: Route,
    /// What an attempt on it is sent with (the capability, the worker's address …).
    pub grant: G,
    /// Until when a fresh resolve may be served from the cache (the capability's
    /// expiry less a margin). A repair keeps the expiry of the entry it replaces.
    pub until: Timestamp,
}

/// What the driver tells its caller, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A RefreshRoute was followed by a repaired route: the rebuilt attempt comes next.
    Rebuilt {
        /// The worker's reason.
        reason: RefreshReason,
    },
    /// A RefreshRoute ended the operation: no (further) rebuilt attempt was allowed.
    RefreshFailed {
        /// The worker's reason.
        reason: RefreshReason,
    },
    /// The worker denied the capability; surfaced, and the route dropped.
    Denied {
        /// The worker's reason code (empty when it named none).
        reason: &'a str,
    },
    /// The rebuilt attempt has an outcome (whatever it is): the latency recovery added,
    /// from the first RefreshRoute.
    RebuiltAttemptEnded {
        /// From the RefreshRoute to the rebuilt attempt's outcome.
        added: Duration,
    },
}

/// Where the routes of one caller come from: the edge asks the control plane in its
/// process (or over HTTP), the SDK asks the edge. The caller's credential lives in the
/// implementor, so nothing else carries it.
pub trait Resolver: Sync {
    /// What an attempt is sent with, cached beside the route.
    type Grant: Send + Sync + 'static;
    /// The operation's error; a recovery that ends is one of them.
    type Error: From<RecoveryError> + Send;

    /// The current execution of `sandbox` with a fresh capability. `rebuilt`: asked
    /// for the rebuilt attempt after a RefreshRoute (the control plane counts it). A
    /// sandbox in a transition is waited for here (bounded) by whoever can see it.
    fn resolve(
        &self,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> impl Future<Output = Result<Resolved<Self::Grant>, Self::Error>> + Send;

    /// Whether a cached grant may serve this caller (the edge: one of its tenant's, or
    /// any for an admin).
    fn may_use(&self, grant: &Self::Grant) -> bool {
        let _ = grant;
        true
    }

    /// How long a worker that refuses connections is waited for, in all.
    fn patience(&self) -> Duration;

    /// Something worth counting happened.
    fn observe(&self, event: Event<'_>) {
        let _ = event;
    }
}

/// What one attempt on a route gave.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// The operation's outcome: an answer, or an error that is not about the route.
    Done(Result<T, E>),
    /// The worker answered RefreshRoute: this route no longer names the execution
    /// serving the sandbox. `answer` is that answer as an error, for a caller that does
    /// not recover (see [`Attempt::settle`]).
    RefreshRoute {
        /// The worker's reason.
        reason: RefreshReason,
        /// The answer, for [`Attempt::settle`].
        answer: E,
    },
    /// The worker denied the capability: `answer` is surfaced, never retried, and the
    /// route dropped.
    Denied {
        /// The worker's reason code.
        reason: String,
        /// What the operation returns (the edge passes the worker's answer on).
        answer: Result<T, E>,
    },
    /// No complete answer. `NotStarted`: nothing reached the worker (the connection
    /// was refused); `Started`: it may have seen the request.
    Failed {
        /// What the operation returns if it may not be tried again.
        error: E,
        /// How far it got.
        progress: Progress,
    },
}

impl<T, E> Attempt<T, E> {
    /// The outcome as final, for an attempt made without recovery (through the edge,
    /// which recovers on its side).
    pub fn settle(self) -> Result<T, E> {
        match self {
            Self::Done(r) | Self::Denied { answer: r, .. } => r,
            Self::RefreshRoute { answer, .. } => Err(answer),
            Self::Failed { error, .. } => Err(error),
        }
    }
}

/// Routes by sandbox, and the recovery loop that keeps them right. One per edge, one
/// per SDK client; shared by every operation and stream open they make.
#[derive(Debug)]
pub struct RouteDriver<G> {
    routes: Mutex<RouteCache<Arc<G>>>,
    /// One async lock per sandbox, so concurrent refreshes share one resolve.
    resolving: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    capacity: usize,
}

/// Wall-clock now, as the cache counts expiry.
fn now() -> Timestamp {
    Timestamp::from_unix_secs(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

/// A lock that a panicking holder left is still consistent here: every update under
/// it is a single call of the cache.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<G: Send + Sync + 'static> RouteDriver<G> {
    /// A driver caching at most `capacity` sandboxes' routes.
    pub fn new(capacity: usize) -> Self {
        Self {
            routes: Mutex::new(RouteCache::new(capacity)),
            resolving: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// The live cached route of `sandbox`, if `may_use` allows its grant.
    pub fn cached(
        &self,
        sandbox: &SandboxId,
        may_use: impl Fn(&G) -> bool,
    ) -> Option<(Route, Arc<G>)> {
        let routes = lock(&self.routes);
        let e = routes.get(sandbox, now())?;
        may_use(&e.value).then(|| (e.route.clone(), Arc::clone(&e.value)))
    }

    /// The cached route of `sandbox`, or a fresh resolve.
    pub async fn route_for<R: Resolver<Grant = G>>(
        &self,
        resolver: &R,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<G>), R::Error> {
        match self.cached(sandbox, |g| resolver.may_use(g)) {
            Some(hit) => Ok(hit),
            None => self.fresh(resolver, sandbox).await,
        }
    }

    /// A fresh resolve of `sandbox`, cached until its `until`.
    pub async fn fresh<R: Resolver<Grant = G>>(
        &self,
        resolver: &R,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<G>), R::Error> {
        let r = resolver.resolve(sandbox, false).await?;
        let grant = Arc::new(r.grant);
        lock(&self.routes).insert(r.route.clone(), Arc::clone(&grant), r.until, now());
        Ok((r.route, grant))
    }

    /// After a RefreshRoute for `rejected`: one resolve per sandbox at a time (later
    /// arrivals take the entry the first one repaired), the entry replaced only if it
    /// still holds `rejected`, keeping its expiry.
    pub async fn repair<R: Resolver<Grant = G>>(
        &self,
        resolver: &R,
        rejected: &RouteIdentity,
    ) -> Result<(Route, Arc<G>), R::Error> {
        let one = {
            let mut map = lock(&self.resolving);
            if map.len() > RESOLVING_KEPT {
                map.retain(|_, l| Arc::strong_count(l) > 1);
            }
            Arc::clone(map.entry(rejected.sandbox).or_default())
        };
        let _one_at_a_time = one.lock().await;
        if let AfterRefresh::UseCurrent(e) = lock(&self.routes).after_refresh(rejected, now()) {
            if resolver.may_use(&e.value) {
                return Ok((e.route.clone(), Arc::clone(&e.value)));
            }
        }
        let r = resolver.resolve(&rejected.sandbox, true).await?;
        let grant = Arc::new(r.grant);
        // Missing (the entry expired meanwhile) or kept (a newer route won) is fine:
        // this attempt uses what it resolved; the cache keeps the newer truth.
        let _ = lock(&self.routes).replace_if_current(
            rejected,
            r.route.clone(),
            Arc::clone(&grant),
            now(),
        );
        Ok((r.route, grant))
    }

    /// Drops the cached route `route`, if it is still the cached one.
    pub fn forget(&self, route: &RouteIdentity) {
        lock(&self.routes).remove_if_current(route);
    }

    /// Drops whatever route of `sandbox` is cached (it was deleted).
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        let mut routes = lock(&self.routes);
        if let Some(identity) = routes.get(sandbox, now()).map(|e| e.route.identity()) {
            routes.remove_if_current(&identity);
        }
    }

    /// Drops every cached route.
    pub fn clear(&self) {
        *lock(&self.routes) = RouteCache::new(self.capacity);
    }

    /// Runs `attempt` on the route of `sandbox` under the rules of `IDENTITY.md` §4:
    ///
    /// - RefreshRoute → one coalesced resolve ([`RouteDriver::repair`], asked with the
    ///   `rebuilt` flag) and **one** rebuilt attempt for an eligible operation; a second
    ///   RefreshRoute, or a resolve that names the rejected route again, ends it with
    ///   the [`RecoveryError`];
    /// - Deny → its answer, never retried; the route dropped;
    /// - a worker that refuses connections (`Failed` at `NotStarted`) → waited for,
    ///   within [`Resolver::patience`], resolving afresh each time (it may come back
    ///   elsewhere): nothing was sent, so this is no retry of the operation;
    /// - any other transport failure → one retry if the class allows it at that
    ///   progress (on a fresh resolve when nothing reached the worker, on the same
    ///   route otherwise), else the attempt's error. A mutation or stream open cut off
    ///   after it reached the worker is sent again only to the same execution: when
    ///   its worker is then waited for and comes back with another execution (or none
    ///   is named), the operation ends with the error — it may have run.
    pub async fn drive<R, T, F, Fut>(
        &self,
        resolver: &R,
        sandbox: &SandboxId,
        class: OperationClass,
        mut attempt: F,
    ) -> Result<T, R::Error>
    where
        R: Resolver<Grant = G>,
        F: FnMut(Route, Arc<G>) -> Fut,
        Fut: Future<Output = Attempt<T, R::Error>>,
    {
        let (mut route, mut grant) = self.route_for(resolver, sandbox).await?;
        let mut recovery = Recovery::new(class);
        let mut refreshed_at: Option<Instant> = None;
        let mut unreachable = Patience::new(resolver.patience());
        // The route a mutation (or a stream open) was cut off on after it reached the
        // worker: it may have run there, so it is sent again only to that same
        // execution — a worker that restarted and re-adopted it — never to another.
        let mut started_on: Option<RouteIdentity> = None;
        loop {
            let outcome = attempt(route.clone(), Arc::clone(&grant)).await;
            if !matches!(outcome, Attempt::RefreshRoute { .. }) {
                if let Some(t) = refreshed_at.take() {
                    resolver.observe(Event::RebuiltAttemptEnded { added: t.elapsed() });
                }
            }
            match outcome {
                Attempt::Done(result) => return result,
                Attempt::Denied { reason, answer } => {
                    resolver.observe(Event::Denied { reason: &reason });
                    self.forget(&route.identity());
                    return answer;
                }
                Attempt::Failed {
                    progress: Progress::NotStarted,
                    error,
                } if unreachable.patient() => {
                    unreachable.wait().await;
                    self.forget(&route.identity());
                    (route, grant) = self.fresh(resolver, sandbox).await?;
                    if started_on.as_ref().is_some_and(|s| *s != route.identity()) {
                        return Err(error);
                    }
                }
                Attempt::Failed { error, progress } => {
                    if recovery.on_transport_failure(progress).is_err() {
                        return Err(error);
                    }
                    if progress == Progress::Started {
                        if class != OperationClass::Read {
                            started_on = Some(route.identity());
                        }
                        // A connection that broke is often a worker dying: its listening
                        // socket may still take a connection for a moment, which would
                        // break the retry too. After a pause it refuses (and is waited
                        // for) or it is back.
                        if unreachable.patient() {
                            unreachable.wait().await;
                        }
                    }
                    if progress == Progress::NotStarted {
                        // It may have restarted under a new address: resolve afresh.
                        self.forget(&route.identity());
                        (route, grant) = self.fresh(resolver, sandbox).await?;
                        if started_on.as_ref().is_some_and(|s| *s != route.identity()) {
                            return Err(error);
                        }
                    }
                }
                Attempt::RefreshRoute { reason, answer } => {
                    // The operation may have run on the execution it was cut off on:
                    // never sent to the one that replaced it.
                    if started_on.is_some() {
                        resolver.observe(Event::RefreshFailed { reason });
                        return Err(answer);
                    }
                    let used = route.identity();
                    // Admission rejects before forwarding: a RefreshRoute always comes
                    // before the guest saw anything.
                    if let Err(e) = recovery.on_refresh(used.clone(), reason, Progress::NotStarted)
                    {
                        resolver.observe(Event::RefreshFailed { reason });
                        return Err(e.into());
                    }
                    refreshed_at.get_or_insert_with(Instant::now);
                    let (r, g) = self.repair(resolver, &used).await?;
                    if let Err(e) = recovery.on_resolved(&r.identity()) {
                        resolver.observe(Event::RefreshFailed { reason });
                        return Err(e.into());
                    }
                    resolver.observe(Event::Rebuilt { reason });
                    (route, grant) = (r, g);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
