//! Route recovery for the edge and the SDK (`IDENTITY.md` §4), as pure decisions.
//!
//! The async parts (the resolve call, coalescing waiters) live in the callers; what
//! must be right is here: which route a cache may hold after a rejection, and whether
//! an operation may be tried again.

use std::collections::HashMap;
use std::fmt;

use crate::ids::{Route, RouteIdentity, SandboxId};
use crate::time::Timestamp;
use crate::verdict::{DenyReason, RefreshReason};

/// A cached route with whatever the caller attaches (a capability, say), and the expiry
/// of the caller's authorization it was resolved under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedRoute<V> {
    /// The selected route.
    pub route: Route,
    /// Caller data for this route.
    pub value: V,
    /// Until when the caller's authorization holds. Route repair never extends it.
    pub authorized_until: Timestamp,
}

/// Outcome of [`RouteCache::replace_if_current`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// The entry held the rejected route and now holds the new one.
    Replaced,
    /// The entry holds another route than the rejected one (a newer repair won); it was
    /// kept.
    KeptCurrent,
    /// No live entry: nothing to repair (a fresh authorization must insert one).
    Missing,
    /// The new route has the rejected identity: refused.
    SameRoute,
}

/// What to do after a RefreshRoute for `rejected`.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterRefresh<'a, V> {
    /// Another operation already repaired the entry: use it, no resolve needed.
    UseCurrent(&'a CachedRoute<V>),
    /// Resolve the current execution from the control plane.
    Resolve,
}

/// Routes by sandbox, bounded in entries, replaced only by compare-and-swap on the
/// rejected route's identity.
#[derive(Debug)]
pub struct RouteCache<V> {
    entries: HashMap<SandboxId, CachedRoute<V>>,
    capacity: usize,
}

impl<V> RouteCache<V> {
    /// A cache of at most `capacity` sandboxes (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The live entry for `sandbox`.
    pub fn get(&self, sandbox: &SandboxId, now: Timestamp) -> Option<&CachedRoute<V>> {
        self.entries
            .get(sandbox)
            .filter(|e| now <= e.authorized_until)
    }

    /// Number of entries (live or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stores a route resolved under a fresh authorization of the caller.
    pub fn insert(&mut self, route: Route, value: V, authorized_until: Timestamp, now: Timestamp) {
        let sandbox = route.sandbox;
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&sandbox) {
            self.entries.retain(|_, e| now <= e.authorized_until);
            if self.entries.len() >= self.capacity {
                if let Some(victim) = self.entries.keys().next().copied() {
                    self.entries.remove(&victim);
                }
            }
        }
        self.entries.insert(
            sandbox,
            CachedRoute {
                route,
                value,
                authorized_until,
            },
        );
    }

    /// After a RefreshRoute for `rejected`: use an entry someone else already repaired,
    /// or resolve.
    pub fn after_refresh(&self, rejected: &RouteIdentity, now: Timestamp) -> AfterRefresh<'_, V> {
        match self.get(&rejected.sandbox, now) {
            Some(e) if !e.route.has_identity(rejected) => AfterRefresh::UseCurrent(e),
            _ => AfterRefresh::Resolve,
        }
    }

    /// Replaces the entry only if it still holds `rejected`, keeping the original
    /// authorization expiry: route repair is not renewal.
    pub fn replace_if_current(
        &mut self,
        rejected: &RouteIdentity,
        route: Route,
        value: V,
        now: Timestamp,
    ) -> Replacement {
        if route.sandbox != rejected.sandbox || route.has_identity(rejected) {
            return Replacement::SameRoute;
        }
        match self.entries.get_mut(&rejected.sandbox) {
            Some(e) if now <= e.authorized_until => {
                if e.route.has_identity(rejected) {
                    e.route = route;
                    e.value = value;
                    Replacement::Replaced
                } else {
                    Replacement::KeptCurrent
                }
            }
            _ => Replacement::Missing,
        }
    }

    /// Removes the entry only if it still holds `rejected` (after a Deny, say).
    pub fn remove_if_current(&mut self, rejected: &RouteIdentity) -> bool {
        let current = self
            .entries
            .get(&rejected.sandbox)
            .is_some_and(|e| e.route.has_identity(rejected));
        if current {
            self.entries.remove(&rejected.sandbox);
        }
        current
    }
}

/// How an operation may be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationClass {
    /// Idempotent reads: read, stat, list.
    Read,
    /// Opening a stream (terminal, watch, streaming exec).
    StreamOpen,
    /// Non-idempotent: exec, write, remove, mkdir, rename.
    Mutation {
        /// Whether the request carries an idempotency key that the worker deduplicates.
        idempotency_key: bool,
    },
}

/// How far an attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Rejected or failed before anything reached the guest (admission rejects before
    /// forwarding, so a RefreshRoute verdict is always this).
    NotStarted,
    /// The guest may have started it.
    Started,
}

impl OperationClass {
    /// Whether a RefreshRoute at `progress` allows one rebuilt attempt on a new route.
    pub fn eligible_for_rebuilt_attempt(self, progress: Progress) -> bool {
        match (self, progress) {
            (_, Progress::NotStarted) => true,
            // Reading again from the current execution is still one consistent read.
            (Self::Read, Progress::Started) => true,
            // A started mutation may have taken effect at the old execution; the new
            // execution's worker cannot deduplicate it. A started stream is ended, not
            // silently reattached.
            (Self::StreamOpen | Self::Mutation { .. }, Progress::Started) => false,
        }
    }

    /// Whether a transport failure at `progress` allows one retry on the same route.
    pub fn retryable_after_transport_failure(self, progress: Progress) -> bool {
        match (self, progress) {
            (_, Progress::NotStarted) | (Self::Read, Progress::Started) => true,
            (Self::Mutation { idempotency_key }, Progress::Started) => idempotency_key,
            (Self::StreamOpen, Progress::Started) => false,
        }
    }
}

/// The next step for an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Resolve the current route (or take a repaired cache entry), then call
    /// [`Recovery::on_resolved`] and make the rebuilt attempt.
    Resolve {
        /// The route that was rejected: the compare-and-swap expectation.
        rejected: RouteIdentity,
    },
    /// Retry once on the same route after a transport failure.
    RetrySameRoute,
}

/// Why an operation ends in an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Denied: surfaced, never retried.
    Denied(DenyReason),
    /// The operation may have started; it is not repeated.
    NotEligible(RefreshReason),
    /// RefreshRoute again after the one rebuilt attempt.
    RefreshAfterRebuild(RefreshReason),
    /// The resolve returned the rejected route again.
    ResolvedSameRoute,
    /// A transport failure that may not be retried (or a second one).
    Transport,
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Denied(r) => write!(f, "denied: {r}"),
            Self::NotEligible(r) => write!(f, "route changed ({r}) after the operation started"),
            Self::RefreshAfterRebuild(r) => {
                write!(f, "route still stale ({r}) after one rebuilt attempt")
            }
            Self::ResolvedSameRoute => {
                f.write_str("the control plane resolved the rejected route again")
            }
            Self::Transport => f.write_str("transport failure"),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Per-operation recovery state: at most one rebuilt attempt after a RefreshRoute and
/// at most one retry after a transport failure.
#[derive(Clone, Debug)]
pub struct Recovery {
    class: OperationClass,
    pending: Option<RouteIdentity>,
    rebuilt: bool,
    retried: bool,
}

impl Recovery {
    /// Recovery state for a new operation.
    pub fn new(class: OperationClass) -> Self {
        Self {
            class,
            pending: None,
            rebuilt: false,
            retried: false,
        }
    }

    /// Whether the rebuilt attempt has been made (or is under way).
    pub fn rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// The attempt on `used` got RefreshRoute.
    pub fn on_refresh(
        &mut self,
        used: RouteIdentity,
        reason: RefreshReason,
        progress: Progress,
    ) -> Result<RecoveryStep, RecoveryError> {
        if self.rebuilt {
            return Err(RecoveryError::RefreshAfterRebuild(reason));
        }
        if !self.class.eligible_for_rebuilt_attempt(progress) {
            return Err(RecoveryError::NotEligible(reason));
        }
        self.rebuilt = true;
        self.pending = Some(used.clone());
        Ok(RecoveryStep::Resolve { rejected: used })
    }

    /// The resolve (or a repaired cache entry) gave `route` for the rebuilt attempt.
    pub fn on_resolved(&mut self, route: &RouteIdentity) -> Result<(), RecoveryError> {
        match self.pending.take() {
            Some(rejected) if rejected == *route => Err(RecoveryError::ResolvedSameRoute),
            _ => Ok(()),
        }
    }

    /// The attempt was denied.
    pub fn on_deny(&mut self, reason: DenyReason) -> RecoveryError {
        RecoveryError::Denied(reason)
    }

    /// The attempt failed in transport at `progress`.
    pub fn on_transport_failure(
        &mut self,
        progress: Progress,
    ) -> Result<RecoveryStep, RecoveryError> {
        if self.retried || !self.class.retryable_after_transport_failure(progress) {
            return Err(RecoveryError::Transport);
        }
        self.retried = true;
        Ok(RecoveryStep::RetrySameRoute)
    }
}
