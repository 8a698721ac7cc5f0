//! What the egress services' listeners and connection tasks share: the limits, the
//! directory, the upstream, the global list, and what an accepted connection holds
//! (used by [`super::services`], [`super::proxy`] and [`super::resolver`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use space_egress::GlobalDeny;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::tenant::{Directory, Slot};
use super::upstream::{DEFAULT_ANSWER_TIMEOUT, DEFAULT_RETRIES, Upstream};

/// Bounds of the services; [`Limits::default`] documents the defaults.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time for a request head or a ClientHello to arrive (10 s).
    pub hello_timeout: Duration,
    /// Time for a connection to the destination to be made (10 s).
    pub dial_timeout: Duration,
    /// A proxied connection with no byte either way for this long is closed (15 min).
    pub idle_timeout: Duration,
    /// Open proxy and DNS-over-TCP connections per tenant (256).
    pub connections_per_tenant: usize,
    /// Open proxy and DNS-over-TCP connections in all (8192).
    pub connections: usize,
    /// DNS questions being answered per tenant (64).
    pub questions_per_tenant: usize,
    /// DNS questions being answered in all (1024): each holds a socket to the
    /// upstream until it is answered or given up.
    pub questions: usize,
    /// Time for the upstream to answer one attempt (3 s).
    pub answer_timeout: Duration,
    /// Attempts after the first when the upstream does not answer in time (1).
    pub answer_retries: usize,
    /// Questions on one DNS-over-TCP connection (64).
    pub tcp_questions: usize,
    /// Time for the next question on a DNS-over-TCP connection (10 s).
    pub tcp_idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hello_timeout: Duration::from_secs(10),
            dial_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(15 * 60),
            connections_per_tenant: 256,
            connections: 8192,
            questions_per_tenant: 64,
            questions: 1024,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            answer_retries: DEFAULT_RETRIES,
            tcp_questions: 64,
            tcp_idle: Duration::from_secs(10),
        }
    }
}

/// What was turned away before any tenant was involved.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unknown {
    /// No tenant has that (peer, local).
    Peer,
    /// A limit was reached.
    Limit,
}

/// What every listener and connection task shares.
pub(crate) struct Shared {
    pub directory: Arc<dyn Directory>,
    pub global: Arc<GlobalDeny>,
    pub upstream: Upstream,
    pub limits: Limits,
    pub stop: watch::Receiver<bool>,
    pub(crate) all: Arc<Semaphore>,
    /// Places of the DNS questions being answered ([`Limits::questions`]).
    pub(crate) questions: Arc<Semaphore>,
    pub(crate) unknown_peers: AtomicU64,
    pub(crate) over_limit: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn unknown(&self, what: Unknown) {
        let counter = match what {
            Unknown::Peer => &self.unknown_peers,
            Unknown::Limit => &self.over_limit,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What an accepted connection holds until it ends.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub slot: Slot,
    pub(crate) _all: OwnedSemaphorePermit,
}
