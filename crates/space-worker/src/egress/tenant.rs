//! One sandbox as the proxy and the resolver see it: its policy (replaced whole by
//! `PATCH …/network`; a connection or question judged once uses the policy of that
//! moment), its counters and its recent refusals, and the [`Directory`] that finds it
//! from a connection's addresses.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use space_egress::{Decision, Policy};
use space_identity::SandboxId;

/// Most refusals a tenant keeps (the oldest go first).
pub const MAX_REFUSALS: usize = 256;
/// Longest target kept in a refusal, in characters.
pub const MAX_TARGET: usize = 260;
/// Most distinct `(layer, rule)` refusal counters per tenant; refusals past it are
/// counted under [`OVERFLOW_RULE`].
pub const MAX_RULE_COUNTERS: usize = 1024;
/// The rule under which refusals past [`MAX_RULE_COUNTERS`] distinct rules are counted.
pub const OVERFLOW_RULE: &str = "(more rules than counted)";

/// The layer of refusals the proxy makes itself, for what it cannot judge (no SNI,
/// not TLS on port 443, a `Host` that is no name).
pub const LAYER_PROXY: &str = "proxy";

/// What a connection or a question was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Dns,
    Http,
    Tls,
}

impl Via {
    /// `dns`, `http` or `tls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Dns => "dns",
            Via::Http => "http",
            Via::Tls => "tls",
        }
    }
}

/// A refused question or connection, for the sandbox's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Unix seconds.
    pub at: u64,
    /// `dns`, `http` or `tls`.
    pub via: &'static str,
    /// The name or `addr:port` asked for (at most [`MAX_TARGET`] characters).
    pub target: String,
    /// `global`, `sandbox`, `mode` (see `space_egress::Layer`) or [`LAYER_PROXY`].
    pub layer: &'static str,
    /// The rule that refused, or the sentence saying why.
    pub rule: String,
}

/// A tenant's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// HTTP connections accepted from the sandbox.
    pub http_connections: u64,
    /// TLS connections accepted from the sandbox.
    pub tls_connections: u64,
    /// DNS questions received (UDP datagrams and TCP messages).
    pub dns_questions: u64,
    /// Bytes from the sandbox forwarded out (HTTP and TLS).
    pub bytes_out: u64,
    /// Bytes forwarded back into the sandbox (HTTP and TLS).
    pub bytes_in: u64,
    /// Refusals by `(layer, rule)`.
    pub refusals: BTreeMap<(&'static str, String), u64>,
}

#[derive(Debug, Default)]
struct Counters {
    http: AtomicU64,
    tls: AtomicU64,
    dns: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
}

/// One sandbox as the proxy and the resolver see it.
#[derive(Debug)]
pub struct Tenant {
    sandbox: SandboxId,
    policy: RwLock<Arc<Policy>>,
    counters: Counters,
    by_rule: Mutex<BTreeMap<(&'static str, String), u64>>,
    recent: Mutex<VecDeque<Refusal>>,
    connections: AtomicUsize,
    questions: AtomicUsize,
}

impl Tenant {
    pub fn new(sandbox: SandboxId, policy: Policy) -> Self {
        Tenant {
            sandbox,
            policy: RwLock::new(Arc::new(policy)),
            counters: Counters::default(),
            by_rule: Mutex::new(BTreeMap::new()),
            recent: Mutex::new(VecDeque::with_capacity(16)),
            connections: AtomicUsize::new(0),
            questions: AtomicUsize::new(0),
        }
    }

    pub fn sandbox(&self) -> &SandboxId {
        &self.sandbox
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the policy: new connections and questions are judged by it (a spliced
    /// TLS connection already judged stays up; the next request on a kept-alive HTTP
    /// connection is judged by the new one).
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }

    pub fn counters(&self) -> CounterSnapshot {
        let c = &self.counters;
        CounterSnapshot {
            http_connections: c.http.load(Ordering::Relaxed),
            tls_connections: c.tls.load(Ordering::Relaxed),
            dns_questions: c.dns.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            refusals: self
                .by_rule
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// The recent refusals, most recent first (at most [`MAX_REFUSALS`]).
    pub fn refusals(&self) -> Vec<Refusal> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().rev().cloned().collect()
    }

    pub(crate) fn count(&self, via: Via) {
        let c = match via {
            Via::Dns => &self.counters.dns,
            Via::Http => &self.counters.http,
            Via::Tls => &self.counters.tls,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_bytes(&self, out: u64, back: u64) {
        self.counters.bytes_out.fetch_add(out, Ordering::Relaxed);
        self.counters.bytes_in.fetch_add(back, Ordering::Relaxed);
    }

    /// Records a refusal by `decision` (an `Allow` records nothing).
    pub(crate) fn refused_by(&self, via: Via, target: &str, decision: &Decision) {
        if let Decision::Deny { rule, by } = decision {
            self.refuse(via, target, by.as_str(), rule);
        }
    }

    /// Records a refusal: counted by `(layer, rule)`, kept among the recent ones, and
    /// logged.
    pub(crate) fn refuse(&self, via: Via, target: &str, layer: &'static str, rule: &str) {
        let target: String = target.chars().take(MAX_TARGET).collect();
        tracing::info!(
            sandbox = %self.sandbox, via = via.as_str(), target = %target, layer, rule,
            "egress refused"
        );
        {
            let mut by_rule = self.by_rule.lock().unwrap_or_else(|p| p.into_inner());
            let key = (layer, rule.to_owned());
            let key = if by_rule.contains_key(&key) || by_rule.len() < MAX_RULE_COUNTERS {
                key
            } else {
                (LAYER_PROXY, OVERFLOW_RULE.to_owned())
            };
            *by_rule.entry(key).or_insert(0) += 1;
        }
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == MAX_REFUSALS {
            recent.pop_front();
        }
        recent.push_back(Refusal {
            at,
            via: via.as_str(),
            target,
            layer,
            rule: rule.to_owned(),
        });
    }

    /// A connection slot, if fewer than `max` of this tenant's connections are open.
    pub(crate) fn enter_connection(self: &Arc<Self>, max: usize) -> Option<Slot> {
        Slot::take(self, &self.connections, max)
    }

    /// A question slot, if fewer than `max` of this tenant's questions are in flight.
    pub(crate) fn enter_question(self: &Arc<Self>, max: usize) -> Option<Slot> {
        Slot::take(self, &self.questions, max)
    }

    #[cfg(test)]
    pub(crate) fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

/// A taken slot of a tenant's connections or questions, given back on drop.
#[derive(Debug)]
pub(crate) struct Slot {
    tenant: Arc<Tenant>,
    questions: bool,
}

impl Slot {
    fn take(tenant: &Arc<Tenant>, counter: &AtomicUsize, max: usize) -> Option<Slot> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Slot {
            tenant: Arc::clone(tenant),
            questions: std::ptr::eq(counter, &tenant.questions),
        })
    }

    pub(crate) fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let counter = if self.questions {
            &self.tenant.questions
        } else {
            &self.tenant.connections
        };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Finds the tenant of a connection or a datagram.
pub trait Directory: Send + Sync + 'static {
    /// The tenant whose sandbox side is `peer`, if `local` is that pair's host side.
    fn tenant(&self, peer: Ipv4Addr, local: Ipv4Addr) -> Option<Arc<Tenant>>;
}

/// A [`Directory`] of attached pairs: sandbox-side address → (host-side address,
/// tenant).
#[derive(Debug, Default)]
pub struct PairDirectory {
    pairs: RwLock<HashMap<Ipv4Addr, (Ipv4Addr, Arc<Tenant>)>>,
}

impl PairDirectory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the pair whose sides are `sandbox_addr` and `host_addr`.
    pub fn insert(&self, sandbox_addr: Ipv4Addr, host_addr: Ipv4Addr, tenant: Arc<Tenant>) {
        self.pairs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sandbox_addr, (host_addr, tenant));
    }

    /// Removes the pair whose sandbox side is `sandbox_addr`; its tenant, if any.
    pub fn remove(&self, sandbox_addr: Ipv4Addr) -> Option<Arc<Tenant>> {
        self.pairs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sandbox_addr)
            .map(|(_, t)| t)
    }
}

impl Directory for PairDirectory {
    fn tenant(&self, peer: Ipv4Addr, local: Ipv4Addr) -> Option<Arc<Tenant>> {
        let pairs = self.pairs.read().unwrap_or_else(|p| p.into_inner());
        let (host, tenant) = pairs.get(&peer)?;
        (*host == local).then(|| Arc::clone(tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_egress::{Layer, NetworkMode};

    fn tenant() -> Arc<Tenant> {
        let policy = Policy::parse(NetworkMode::Egress, &["a.test"], &[] as &[&str]).unwrap();
        Arc::new(Tenant::new(SandboxId::from_bytes([7; 16]), policy))
    }

    #[test]
    fn refusals_are_kept_most_recent_first_and_bounded() {
        let t = tenant();
        for i in 0..MAX_REFUSALS + 10 {
            t.refuse(Via::Dns, &format!("n{i}.test"), "sandbox", "r");
        }
        let r = t.refusals();
        assert_eq!(r.len(), MAX_REFUSALS);
        assert_eq!(r[0].target, format!("n{}.test", MAX_REFUSALS + 9));
        assert_eq!(r[MAX_REFUSALS - 1].target, "n10.test");
        assert_eq!(
            t.counters().refusals[&("sandbox", "r".to_owned())],
            (MAX_REFUSALS + 10) as u64
        );
    }

    #[test]
    fn a_long_target_is_cut_and_rule_counters_are_bounded() {
        let t = tenant();
        t.refused_by(
            Via::Http,
            &"x".repeat(1000),
            &Decision::Deny {
                rule: "evil.test".into(),
                by: Layer::Sandbox,
            },
        );
        assert_eq!(t.refusals()[0].target.len(), MAX_TARGET);
        for i in 0..MAX_RULE_COUNTERS + 5 {
            t.refuse(Via::Dns, "n.test", "global", &format!("rule {i}"));
        }
        let counters = t.counters().refusals;
        assert_eq!(counters.len(), MAX_RULE_COUNTERS + 1);
        assert_eq!(counters[&(LAYER_PROXY, OVERFLOW_RULE.to_owned())], 6);
    }

    #[test]
    fn slots_are_bounded_and_given_back() {
        let t = tenant();
        let a = t.enter_connection(2).unwrap();
        let _b = t.enter_connection(2).unwrap();
        assert!(t.enter_connection(2).is_none());
        let q = t.enter_question(1).unwrap();
        assert!(t.enter_question(1).is_none());
        drop(a);
        assert!(t.enter_connection(2).is_some());
        drop(q);
        assert!(t.enter_question(1).is_some());
        assert_eq!(t.open_connections(), 1);
    }

    #[test]
    fn a_pair_is_found_only_from_its_own_host_side() {
        let d = PairDirectory::new();
        let (sandbox, host, other) = (
            Ipv4Addr::new(10, 0, 0, 3),
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 4),
        );
        d.insert(sandbox, host, tenant());
        assert!(d.tenant(sandbox, host).is_some());
        assert!(d.tenant(sandbox, other).is_none());
        assert!(d.tenant(host, host).is_none());
        assert!(d.remove(sandbox).is_some());
        assert!(d.tenant(sandbox, host).is_none());
    }
}
