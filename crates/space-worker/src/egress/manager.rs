//! The worker's egress: which sandboxes have a link, the one nftables table that
//! judges their packets, and the proxy and resolver that judge their names.
//!
//! A sandbox in mode `egress` gets a pair when its execution is launched, before the
//! install is acknowledged (so before anything of the user's runs in it), and keeps it
//! until the execution ends; a policy change on a running sandbox re-renders the table
//! and swaps the policy the proxy and resolver read. Mode `none` has no pair.
//!
//! Table changes are applied in groups: the table is always rendered whole from the
//! current set, and a change that finds an `nft` run under way waits for it and is
//! then covered by the next run, so fifty sandboxes attached at once cost a few runs,
//! not fifty.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex};

use space_egress::plan::AddressBlock;
use space_egress::{GlobalDeny, IpNet, NetworkMode, Policy};
use space_identity::{Execution, SandboxId};

use super::nft::{self, Attached, HostPorts, Ruleset, TableName};
use super::services::{Services, ServicesConfig};
use super::tenant::{Directory, PairDirectory, Tenant};
use super::veth::{self, LinkNames, Pair};
use crate::substrate::process::ProcessIdentity;

/// The last egress slot: `240.0.0.0/4` holds 256 blocks of `/12`, and the last one
/// holds the broadcast address.
pub const MAX_SLOT: u8 = 254;

/// Where a worker's links, addresses and table come from: slot `n` is the block
/// `240.0.0.0/12 + n × 2^20`, links `sxh<n in base 36>-<index>`, table
/// `space_egress_<n>`. Workers sharing a host take different slots (`space up` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(u8);

impl Slot {
    /// Slot `n`, for `n` up to [`MAX_SLOT`].
    pub fn new(n: u8) -> Option<Self> {
        (n <= MAX_SLOT).then_some(Slot(n))
    }

    /// Its address block.
    pub fn block(self) -> AddressBlock {
        let base = u32::from(Ipv4Addr::new(240, 0, 0, 0)) + (u32::from(self.0) << 20);
        IpNet::new(IpAddr::V4(Ipv4Addr::from(base)), 12)
            .ok()
            .and_then(|net| AddressBlock::new(net).ok())
            .expect("a /12 inside 240/4 is a valid block")
    }

    /// Its link names' tag (at most two base-36 characters).
    pub fn tag(self) -> String {
        const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        let n = usize::from(self.0);
        if n < 36 {
            (DIGITS[n] as char).to_string()
        } else {
            format!("{}{}", DIGITS[n / 36] as char, DIGITS[n % 36] as char)
        }
    }

    /// Its table's name.
    pub fn table(self) -> TableName {
        TableName::for_worker(&self.0.to_string()).expect("a number is a valid table suffix")
    }
}

/// The worker's egress settings.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Which block, links and table.
    pub slot: Slot,
    /// What no sandbox reaches, whatever its policy.
    pub global: GlobalDeny,
    /// DNS servers the platform asks for sandboxes.
    pub upstream: Vec<SocketAddr>,
}

/// Why egress could not be given or changed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(
        "network mode egress is not available on this worker: {0} (sandboxes here run with network none)"
    )]
    Unavailable(String),
    #[error("no free link: all {0} addresses of this worker's block are in use")]
    Full(u32),
    #[error("egress link: {0}")]
    Veth(#[from] veth::VethError),
    #[error("egress rules: {0}")]
    Nft(#[from] nft::NftError),
}

/// One sandbox with a link.
#[derive(Debug)]
struct Link {
    execution: Execution,
    pair: Pair,
    tenant: Arc<Tenant>,
}

#[derive(Debug, Default)]
struct Links {
    by_sandbox: HashMap<SandboxId, Link>,
    used: BTreeSet<u32>,
    /// Pairs `0..prepared` have chains of the names-only shape in the table (see
    /// [`nft::Ruleset::prepared`]); grown by [`PREPARED_STEP`] when a pair past them
    /// is given.
    prepared: u32,
    /// Bumped by every change of the table's content.
    version: u64,
}

/// Pairs prepared at a time: one `nft` run makes the next 64 links of the names-only
/// shape free of any.
pub const PREPARED_STEP: u32 = 64;

#[derive(Debug, Default)]
struct Applied {
    version: u64,
    running: bool,
    last_error: Option<String>,
}

/// The worker's egress.
pub struct Egress {
    config: EgressConfig,
    names: LinkNames,
    table: TableName,
    ports: HostPorts,
    services: Services,
    /// The proxy's and the resolver's view: a peer is a tenant only if it is the
    /// sandbox side of a pair and spoke to that pair's host side.
    peers: Arc<PairDirectory>,
    links: Mutex<Links>,
    applied: Mutex<Applied>,
    applied_changed: Condvar,
    /// Set by [`Egress::shutdown`]: no link is given and no table applied after it (a
    /// teardown finishing late must not put the removed table back).
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("slot", &self.config.slot)
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

/// What is missing for egress on this host, if anything: root and `nft` (links are
/// made over rtnetlink, no `ip` is run).
pub fn unavailable(rootless: bool) -> Option<String> {
    if rootless {
        return Some(
            "the worker runs rootless (veth pairs and nftables need root; a rootless \
             worker would need pasta or slirp4netns, which SPACE does not drive)"
                .into(),
        );
    }
    (!super::command::on_path("nft")).then(|| "`nft` is not installed".into())
}

impl Egress {
    /// Starts the proxy and the resolver and puts an empty table in place (removing
    /// whatever an earlier run of this slot left).
    pub async fn start(config: EgressConfig) -> Result<Arc<Egress>, EgressError> {
        let names = LinkNames::new(&config.slot.tag())?;
        let table = config.slot.table();
        // Links an earlier run of this slot left (a crash): their sandboxes, if they
        // are re-adopted, get new ones.
        let stale = names.clone();
        tokio::task::spawn_blocking(move || remove_links(&stale))
            .await
            .map_err(|e| EgressError::Unavailable(format!("link task: {e}")))?;
        let peers = Arc::new(PairDirectory::new());
        let mut services_config =
            ServicesConfig::new(config.upstream.clone(), Arc::new(config.global.clone()));
        let descriptors = raise_nofile();
        services_config.limits.connections =
            connections_within(descriptors, services_config.limits.connections);
        tracing::info!(
            descriptors,
            connections = services_config.limits.connections,
            "egress proxy connections bounded by the worker's descriptors"
        );
        let services = Services::start(services_config, Arc::clone(&peers) as Arc<dyn Directory>)
            .await
            .map_err(|e| EgressError::Unavailable(format!("proxy and resolver: {e}")))?;
        let ports = services.ports();
        let egress = Arc::new(Egress {
            config,
            names,
            table,
            ports,
            services,
            peers,
            links: Mutex::new(Links::default()),
            applied: Mutex::new(Applied::default()),
            applied_changed: Condvar::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        // Version 1 is the empty set (with its first prepared pairs): applied before any
        // sandbox is attached.
        {
            let mut links = egress.lock();
            links.version = 1;
            links.prepared = PREPARED_STEP.min(egress.config.slot.block().capacity());
        }
        let e = Arc::clone(&egress);
        tokio::task::spawn_blocking(move || e.sync(1))
            .await
            .map_err(|e| EgressError::Unavailable(format!("table task: {e}")))??;
        enable_forwarding().map_err(EgressError::Unavailable)?;
        tracing::info!(slot = ?egress.config.slot, block = %egress.config.slot.block(), ports = ?egress.ports, "egress ready");
        Ok(egress)
    }

    /// The proxy's and resolver's ports.
    pub fn ports(&self) -> HostPorts {
        self.ports
    }

    /// The tenant of `sandbox`, while it has a link.
    pub fn tenant(&self, sandbox: &SandboxId) -> Option<Arc<Tenant>> {
        self.lock()
            .by_sandbox
            .get(sandbox)
            .map(|l| Arc::clone(&l.tenant))
    }

    /// The tenant of `sandbox` while execution `execution` has its link.
    pub fn tenant_of(&self, sandbox: &SandboxId, execution: Execution) -> Option<Arc<Tenant>> {
        self.lock()
            .by_sandbox
            .get(sandbox)
            .filter(|l| l.execution == execution)
            .map(|l| Arc::clone(&l.tenant))
    }

    /// Every tenant, for the metrics.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.lock()
            .by_sandbox
            .values()
            .map(|l| Arc::clone(&l.tenant))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives execution `execution` of `sandbox` (whose jail's init is `init`) the
    /// network `policy` asks for: a pair and rules for mode `egress` (replacing any
    /// link an earlier execution had), nothing for `none` (removing any link).
    /// Blocking.
    pub fn apply(
        &self,
        sandbox: &SandboxId,
        execution: Execution,
        init: &ProcessIdentity,
        policy: &Policy,
    ) -> Result<(), EgressError> {
        if policy.mode == NetworkMode::None {
            self.release(sandbox, None);
            return Ok(());
        }
        if self.is_closed() {
            return Err(EgressError::Unavailable("the worker is stopping".into()));
        }
        let existing = {
            let mut links = self.lock();
            let prepared = links.prepared;
            match links.by_sandbox.get(sandbox) {
                Some(l) if l.execution == execution => {
                    // Only a change of the table's shape for this pair needs a run.
                    let free = |p: &Policy| l.pair.index() < prepared && nft::names_only(p);
                    let before = l.tenant.policy();
                    let unchanged = free(&before) && free(policy);
                    l.tenant.set_policy(policy.clone());
                    let tenant = Arc::clone(&l.tenant);
                    if unchanged {
                        Some((0, tenant, before))
                    } else {
                        links.version += 1;
                        Some((links.version, tenant, before))
                    }
                }
                _ => None,
            }
        };
        if let Some((version, tenant, before)) = existing {
            let applied = self.sync(version);
            if applied.is_err() {
                // Refused: the policy the worker records (the one before) is the one
                // in force, in the proxy, the resolver and the next table.
                tenant.set_policy((*before).clone());
                self.lock().version += 1;
            }
            return applied;
        }
        self.release(sandbox, None);
        let pair = {
            let mut links = self.lock();
            let capacity = self.config.slot.block().capacity();
            let index = (0..capacity)
                .find(|i| !links.used.contains(i))
                .ok_or(EgressError::Full(capacity))?;
            links.used.insert(index);
            if index >= links.prepared {
                links.prepared = (index / PREPARED_STEP + 1)
                    .saturating_mul(PREPARED_STEP)
                    .min(capacity);
                links.version += 1;
            }
            self.names.pair(&self.config.slot.block(), index)?
        };
        if let Err(e) = veth::attach(&pair, init) {
            self.lock().used.remove(&pair.index());
            return Err(e.into());
        }
        let tenant = Arc::new(Tenant::new(*sandbox, policy.clone()));
        let version = {
            let mut links = self.lock();
            // A names-only sandbox on a prepared pair changes nothing in the table
            // (unless the pair was just prepared, which bumped the version already).
            let needs_run = !(pair.index() < links.prepared && nft::names_only(policy));
            self.peers
                .insert(pair.sandbox_addr(), pair.host_addr(), Arc::clone(&tenant));
            links.by_sandbox.insert(
                *sandbox,
                Link {
                    execution,
                    pair,
                    tenant,
                },
            );
            if needs_run {
                links.version += 1;
            }
            links.version
        };
        if let Err(e) = self.sync(version) {
            self.release(sandbox, Some(execution));
            return Err(e);
        }
        Ok(())
    }

    /// Removes the link of `sandbox` (of `execution` only, when given). Blocking.
    pub fn release(&self, sandbox: &SandboxId, execution: Option<Execution>) {
        let (link, version) = {
            let mut links = self.lock();
            let ours = links
                .by_sandbox
                .get(sandbox)
                .is_some_and(|l| execution.is_none_or(|e| e == l.execution));
            if !ours {
                return;
            }
            let Some(link) = links.by_sandbox.remove(sandbox) else {
                return;
            };
            // A names-only link on a prepared pair leaves the table as it is; any other
            // has chains of its own, which must be gone before the pair is given again.
            let own =
                !(link.pair.index() < links.prepared && nft::names_only(&link.tenant.policy()));
            if own {
                links.version += 1;
            }
            (link, links.version)
        };
        self.peers.remove(link.pair.sandbox_addr());
        if let Err(e) = veth::detach(link.pair.host_link()) {
            tracing::warn!(sandbox = %sandbox, error = %e, "cannot remove the sandbox's link");
        }
        if let Err(e) = self.sync(version) {
            tracing::warn!(sandbox = %sandbox, error = %e, "cannot update the egress rules");
        }
        // The index is free only once its link is gone and the table no longer names it.
        self.lock().used.remove(&link.pair.index());
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Makes the table reflect at least `version` of the set. Blocking.
    fn sync(&self, version: u64) -> Result<(), EgressError> {
        if self.is_closed() {
            return Ok(());
        }
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if applied.version >= version {
                return match &applied.last_error {
                    None => Ok(()),
                    Some(e) => Err(EgressError::Unavailable(e.clone())),
                };
            }
            if !applied.running {
                break;
            }
            applied = self
                .applied_changed
                .wait(applied)
                .unwrap_or_else(|p| p.into_inner());
        }
        applied.running = true;
        drop(applied);
        let (script, rendered) = self.render();
        let result = script.and_then(|s| nft::apply(&s).map_err(EgressError::from));
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        applied.running = false;
        match &result {
            Ok(()) => {
                applied.version = applied.version.max(rendered);
                applied.last_error = None;
            }
            Err(e) => applied.last_error = Some(e.to_string()),
        }
        self.applied_changed.notify_all();
        result
    }

    /// The script for the current set, and the version it reflects.
    fn render(&self) -> (Result<String, EgressError>, u64) {
        let links = self.lock();
        let policies: Vec<(Pair, Arc<Policy>)> = links
            .by_sandbox
            .values()
            .map(|l| (l.pair.clone(), l.tenant.policy()))
            .collect();
        let (version, prepared) = (links.version, links.prepared);
        drop(links);
        let attached: Vec<Attached<'_>> = policies
            .iter()
            .map(|(pair, policy)| Attached { pair, policy })
            .collect();
        let script = nft::render(&Ruleset {
            table: &self.table,
            links: &self.names,
            block: self.config.slot.block(),
            global: &self.config.global,
            ports: self.ports,
            sandboxes: &attached,
            prepared,
        })
        .map_err(EgressError::from);
        (script, version)
    }

    /// Stops the proxy and the resolver; links and the table stay.
    pub fn stop_services(&self) {
        self.services.stop();
    }

    /// Removes every link and the table, and stops the proxy and the resolver.
    /// Blocking.
    pub fn shutdown(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        // An `nft` run under way finishes before the table is removed.
        drop(
            self.applied_changed
                .wait_while(
                    self.applied.lock().unwrap_or_else(|p| p.into_inner()),
                    |a| a.running,
                )
                .unwrap_or_else(|p| p.into_inner()),
        );
        let sandboxes: Vec<SandboxId> = self.lock().by_sandbox.keys().copied().collect();
        for s in sandboxes {
            self.release(&s, None);
        }
        self.services.stop();
        if let Err(e) = nft::remove(&self.table) {
            tracing::warn!(error = %e, "cannot remove the egress table");
        }
    }
}

/// Descriptors kept for everything of the worker that is not the egress proxy
/// (node-api, agents' connections, records, `ip`/`nft` runs).
pub const DESCRIPTOR_RESERVE: u64 = 2048;

/// Descriptors one proxied connection takes at most: its two sockets and the two
/// pipes of a splice.
pub const DESCRIPTORS_PER_CONNECTION: u64 = 6;

/// Raises the worker's soft descriptor limit to its hard limit; the soft limit after.
fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// The proxy's connection limit that `descriptors` allow, at most `wanted` (and at
/// least 16: a worker without room for even that many is misconfigured, and says so
/// in its log through the figure).
pub fn connections_within(descriptors: u64, wanted: usize) -> usize {
    let room = descriptors.saturating_sub(DESCRIPTOR_RESERVE) / DESCRIPTORS_PER_CONNECTION;
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(16, wanted.max(16))
}

/// Removes every link of `names` in the worker's namespace. Blocking.
fn remove_links(names: &LinkNames) {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if names.owns(name) {
            if let Err(e) = veth::detach(name) {
                tracing::warn!(link = name, error = %e, "cannot remove a stale egress link");
            }
        }
    }
}

/// Turns IPv4 forwarding on (the host side of each pair turns it on for its link;
/// the uplink needs it too for NATed traffic to leave).
fn enable_forwarding() -> Result<(), String> {
    let path = "/proc/sys/net/ipv4/ip_forward";
    match std::fs::read_to_string(path) {
        Ok(v) if v.trim() == "1" => Ok(()),
        _ => std::fs::write(path, "1").map_err(|e| format!("turn on {path}: {e}")),
    }
}

/// The global deny list of a worker: the defaults, every address of the host's
/// interfaces, the worker's node-api and the control plane it talks to, every egress
/// block of the host, and the operator's additions. Blocking (reads the interfaces).
pub fn global_deny(
    listeners: &[SocketAddr],
    deny: &[IpNet],
    allow_private: &[IpNet],
) -> Result<GlobalDeny, String> {
    let mut b = GlobalDeny::builder();
    for ip in host_addresses()? {
        b = b.host_address(ip);
    }
    for l in listeners {
        b = b.listener(space_egress::Listener {
            addr: l.ip(),
            port: Some(l.port()),
        });
    }
    // Every slot's block: a sandbox reaches no link of this worker nor of another
    // worker on the host.
    let all = IpNet::new(IpAddr::V4(Ipv4Addr::new(240, 0, 0, 0)), 4).map_err(|e| e.to_string())?;
    b = b.sandbox_block(all);
    for n in deny {
        b = b.deny(*n);
    }
    for n in allow_private {
        b = b.allow_private(*n);
    }
    b.build().map_err(|e| e.to_string())
}

/// Every address of the host's interfaces.
fn host_addresses() -> Result<Vec<IpAddr>, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("list interfaces: {e}"))?;
    let mut out = BTreeSet::new();
    for a in addrs {
        let Some(sa) = a.address else { continue };
        if let Some(v4) = sa.as_sockaddr_in() {
            out.insert(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            out.insert(IpAddr::V6(v6.ip()));
        }
    }
    Ok(out.into_iter().collect())
}
