//! Starting a worker: open its records, bind node-api, enroll with the control plane,
//! sync, then catch up periodically; and stopping it ([`WorkerHandle::shutdown`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_http::HttpClient;
use space_identity::{InstalledKeys, VerifyingKey};
use space_proto::api::{EnrollRequest, EnrollResponse, SignedUpdate};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::WorkerConfig;
use super::state::{self, Worker};
use super::{lock, node_api, sync};

/// How often a worker catches up with the control plane's view.
const RESYNC_EVERY: Duration = Duration::from_secs(15);

/// A running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    /// node-api address.
    pub addr: SocketAddr,
    /// The worker.
    pub worker: Arc<Worker>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The data directory's `worker.lock`, held while this worker runs.
    _lock: lock::DirLock,
    /// Its egress slot's lock (no other worker of the host takes the slot meanwhile).
    _egress_lock: Option<lock::DirLock>,
}

impl WorkerHandle {
    /// Stops serving. Sandboxes keep running (a restarted worker re-adopts them)
    /// unless `stop_sandboxes`, which stops their processes but keeps their records
    /// and writable layers.
    pub async fn shutdown(self, stop_sandboxes: bool) {
        if stop_sandboxes {
            self.worker.set_stopping();
        } else if let Ok(egress) = self.worker.egress() {
            // The sandboxes keep running, and their links and rules stay for the next
            // run of this worker (which replaces them); the proxy and resolver end.
            egress.stop_services();
        }
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let worker = Arc::clone(&self.worker);
        let _ = tokio::task::spawn_blocking(move || worker.warm.shutdown(&worker.jail)).await;
        if stop_sandboxes {
            self.worker.stop_all().await;
            if let Ok(egress) = self.worker.egress() {
                let egress = Arc::clone(egress);
                let _ = tokio::task::spawn_blocking(move || egress.shutdown()).await;
            }
            // Unmounted only once no jail holds a layer on it (else the next start uses it).
            let data_dir = self.worker.data_dir.clone();
            let _ = tokio::task::spawn_blocking(move || {
                crate::substrate::jail::disk::unmount_volume(&data_dir)
            })
            .await;
        }
    }
}

/// Starts a worker: open records, bind node-api, enroll, sync with the control plane.
pub async fn run(config: WorkerConfig) -> Result<WorkerHandle, String> {
    config.validate()?;
    // Records (credential, activation secrets, environments) and tenants' layers live
    // here: 0700, and refused when others can reach them.
    space_http::private_dir::ensure_private_dir(&config.data_dir)?;
    // One worker per data directory: a second is refused before it opens anything.
    let lock = lock::DirLock::acquire(
        &config.data_dir,
        "worker.lock",
        &format!("space worker {}", config.id),
    )?;
    space_http::private_dir::check_database_files(&config.data_dir.join("records.db"))?;
    let listener = bind_node_api(config.listen, &config.data_dir).await?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let url = config
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    lock.record(Some(&url))?;
    let worker = Worker::open(&config, url.clone())?;
    super::snapshot::transfer::clear_leftovers(&config.data_dir);
    // Before anything is served: an install of a sandbox in mode `egress` needs it.
    let (egress, egress_lock) = match start_egress(&worker, &config, addr).await {
        Ok((e, l)) => (Ok(e), Some(l)),
        Err(why) => (Err(why), None),
    };
    let _ = worker.egress.set(egress);
    // Until the reconciliation below re-adopted what ran before a restart, sandbox
    // requests wait (node-api serves from now on: the control plane pushes installs).
    worker.readiness.adopting();
    let adoption = AdoptionOver(Arc::clone(&worker));
    // What ran before this start, read before anything can be installed.
    let before = sync::live_before_serving(&worker)?;

    // Serve first: the control plane pushes installs while this worker syncs.
    let app = node_api::router(Arc::clone(&worker));
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = space_http::serve_until(listener, app, shutdown).await {
            tracing::error!(error = %e, "node-api failed");
        }
    });

    let http = HttpClient::new(Duration::from_secs(30));
    // A restart re-enrolls with the credential of the first enrollment: the
    // enrollment secret alone only enrolls a new worker ID.
    let credential = worker
        .records
        .setting("credential")
        .map_err(|e| e.to_string())?
        .and_then(|c| String::from_utf8(c).ok());
    let enrolled = enroll(&http, &config, &url, credential).await?;
    let anchor = decode_anchor(&enrolled.anchor)?;
    worker.set_enrollment(anchor, &enrolled.credential)?;
    let asked_at = state::now_secs() as i64;
    let updates = sync_list(&http, &config, &enrolled.credential).await?;
    sync::reconcile(
        &worker,
        before,
        updates,
        asked_at,
        &http,
        &config.control_url,
        &enrolled.credential,
    )
    .await?;
    worker.readiness.synced();
    drop(adoption);
    tracing::info!(worker = %config.id, url = %url, "worker ready");
    // After the reconciliation's sweep, which would take warm jails for leftovers.
    worker.warm.start(
        Arc::clone(&worker.jail),
        worker.binaries.clone(),
        worker.data_dir.clone(),
    );
    // Updates pushed while this worker was unreachable are caught up here.
    let resync_worker = Arc::clone(&worker);
    let resync_config = config.clone();
    let mut resync_stop = stop.subscribe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RESYNC_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = resync_stop.changed() => return,
            }
            let asked_at = state::now_secs() as i64;
            match sync_list(&http, &resync_config, &enrolled.credential).await {
                Ok(list) => {
                    sync::resync(&resync_worker, list, asked_at).await;
                    resync_worker.readiness.synced();
                }
                Err(e) => {
                    resync_worker.readiness.sync_failed();
                    tracing::warn!(error = %e, "periodic sync failed");
                }
            }
            // Tombstones past their retention go (a capability for them is expired by
            // then); the sandbox's highest generation stays, so nothing old installs.
            let before = asked_at
                - i64::try_from(space_identity::TOMBSTONE_RETENTION_SECS).unwrap_or(150)
                - 60;
            let records = resync_worker.clone();
            match tokio::task::spawn_blocking(move || records.records.prune(before)).await {
                Ok(Ok(n)) if n > 0 => tracing::debug!(pruned = n, "tombstones pruned"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not prune tombstones"),
                _ => {}
            }
        }
    });
    Ok(WorkerHandle {
        addr,
        worker,
        stop,
        task,
        _lock: lock,
        _egress_lock: egress_lock,
    })
}

/// Ends the start-up adoption however [`run`] leaves it (done, or an error on the way).
struct AdoptionOver(Arc<Worker>);

impl Drop for AdoptionOver {
    fn drop(&mut self) {
        self.0.readiness.adoption_over();
    }
}

/// Binds node-api. With port 0, the port of the previous run is tried first, so a
/// restarted worker keeps its address: routes cached by edges and direct-mode clients
/// stay valid, and a stale capability meets this worker's comparator (421) rather than
/// a closed port.
async fn bind_node_api(
    listen: SocketAddr,
    data_dir: &std::path::Path,
) -> Result<TcpListener, String> {
    let remembered = data_dir.join("node-api.port");
    if listen.port() == 0 {
        if let Some(port) = std::fs::read_to_string(&remembered)
            .ok()
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            if let Ok(l) = TcpListener::bind(SocketAddr::new(listen.ip(), port)).await {
                return Ok(l);
            }
        }
    }
    let l = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    if let Ok(addr) = l.local_addr() {
        let _ = std::fs::write(&remembered, addr.port().to_string());
    }
    Ok(l)
}

fn decode_anchor(text: &str) -> Result<VerifyingKey, String> {
    let bytes: [u8; 32] = B64
        .decode(text)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or("enrollment answer holds no valid anchor")?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|e| format!("anchor: {e}"))?;
    if key.is_weak() {
        return Err("anchor is a weak key".into());
    }
    Ok(key)
}

async fn enroll(
    http: &HttpClient,
    config: &WorkerConfig,
    url: &str,
    credential: Option<String>,
) -> Result<EnrollResponse, String> {
    let req = EnrollRequest {
        worker: config.id.clone(),
        url: url.to_owned(),
        substrate: match config.vm {
            Some(_) => space_identity::Substrate::Vm,
            None => space_identity::Substrate::Jail,
        },
        capacity: config.capacity,
        enroll_secret: config.enroll_secret.clone(),
        credential,
    };
    let endpoint = format!(
        "{}/internal/v1/enroll",
        config.control_url.trim_end_matches('/')
    );
    // The control plane may still be starting (space up starts everything at once).
    let mut delay = Duration::from_millis(50);
    for attempt in 0.. {
        match http.post_json(&endpoint, &[], &req).await {
            Ok(a) if a.status.is_success() => {
                return serde_json::from_slice(&a.body)
                    .map_err(|e| format!("enrollment answer: {e}"));
            }
            Ok(a) if a.status.is_client_error() => {
                return Err(format!(
                    "enrollment refused ({}): {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                ));
            }
            Ok(_) | Err(_) if attempt < 40 => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Ok(a) => return Err(format!("enrollment failed: {}", a.status)),
            Err(e) => return Err(format!("enrollment failed: {e}")),
        }
    }
    unreachable!("the loop returns")
}

async fn sync_list(
    http: &HttpClient,
    config: &WorkerConfig,
    credential: &str,
) -> Result<Vec<SignedUpdate>, String> {
    let endpoint = format!(
        "{}/internal/v1/workers/{}/sync",
        config.control_url.trim_end_matches('/'),
        config.id
    );
    let auth = format!("Bearer {credential}");
    let a = http
        .call(
            hyper::Method::POST,
            &endpoint,
            &[("authorization", &auth)],
            bytes::Bytes::new(),
        )
        .await
        .map_err(|e| format!("sync: {e}"))?;
    if !a.status.is_success() {
        return Err(format!(
            "sync refused ({}): {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ));
    }
    serde_json::from_slice(&a.body).map_err(|e| format!("sync answer: {e}"))
}

/// The keys a worker trusts before it holds any bundle.
pub fn empty_keys(anchor: VerifyingKey) -> InstalledKeys {
    InstalledKeys::new(anchor)
}

/// Starts the worker's egress, or says why it has none (sandboxes in mode `egress`
/// are then refused with that reason).
async fn start_egress(
    worker: &Worker,
    config: &WorkerConfig,
    node_api: std::net::SocketAddr,
) -> Result<(Arc<crate::egress::manager::Egress>, lock::DirLock), String> {
    use crate::egress::manager::{self, Egress, EgressConfig, Slot};
    let Some(settings) = config.egress.clone() else {
        return Err("the worker was started with --no-egress".into());
    };
    if let Some(why) = manager::unavailable(worker.jail.is_rootless()) {
        tracing::info!(reason = %why, "network mode egress is not available on this worker");
        return Err(why);
    }
    let (slot, dns) = (settings.slot, settings.dns.clone());
    let control_url = config.control_url.clone();
    let global = tokio::task::spawn_blocking(move || {
        let listeners: Vec<std::net::SocketAddr> = std::iter::once(node_api)
            .chain(control_listeners(&control_url))
            .collect();
        manager::global_deny(&listeners, &settings.deny, &settings.allow_private)
    })
    .await
    .map_err(|e| e.to_string())??;
    let upstream = if dns.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        crate::egress::services::host_nameservers(&text)
    } else {
        dns
    };
    let slot_lock = lock_slot(Path::new(EGRESS_LOCK_DIR), slot, &config.id.to_string())?;
    let slot = Slot::new(slot).ok_or(format!(
        "--egress-slot {slot}: slots are 0 to {}",
        manager::MAX_SLOT
    ))?;
    let started = Egress::start(EgressConfig {
        slot,
        global,
        upstream,
    })
    .await
    .map_err(|e| e.to_string());
    if let Err(e) = &started {
        tracing::warn!(error = %e, "network mode egress is not available on this worker");
    }
    started.map(|e| (e, slot_lock))
}

/// Where the egress slots of a host are locked (one `flock` per slot in use).
pub const EGRESS_LOCK_DIR: &str = "/run/space/egress";

/// Locks egress slot `slot` in `dir` for worker `id`, or says which worker holds it:
/// two workers on one slot would take each other's links and replace each other's
/// table.
fn lock_slot(dir: &Path, slot: u8, id: &str) -> Result<lock::DirLock, String> {
    space_http::private_dir::ensure_private_dir(dir)?;
    lock::DirLock::acquire(
        dir,
        &format!("slot-{slot}.lock"),
        &format!("space worker {id} (egress slot {slot})"),
    )
    .map_err(|e| {
        format!("egress slot {slot} is taken: {e} (give this worker another --egress-slot)")
    })
}

/// The control plane's addresses: the one its URL names, or those its host name
/// resolves to now (blocking: a lookup). Nothing when the URL does not parse.
fn control_listeners(url: &str) -> Vec<std::net::SocketAddr> {
    use std::net::ToSocketAddrs as _;
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let Some(authority) = rest.split('/').next().filter(|a| !a.is_empty()) else {
        return Vec::new();
    };
    if let Ok(a) = authority.parse::<std::net::SocketAddr>() {
        return vec![a];
    }
    let default_port = if scheme == "https" { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
            Ok(p) => (h, p),
            Err(_) => (authority, default_port),
        },
        _ => (authority, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_planes_listeners_come_from_its_url_by_address_or_by_name() {
        assert_eq!(
            control_listeners("http://127.0.0.1:7070/"),
            ["127.0.0.1:7070".parse().unwrap()]
        );
        assert_eq!(
            control_listeners("https://[::1]:9443"),
            ["[::1]:9443".parse().unwrap()]
        );
        // A name is looked up (here one the host resolves without any network).
        let by_name = control_listeners("http://localhost:7071");
        assert!(
            by_name
                .iter()
                .all(|a| a.port() == 7071 && a.ip().is_loopback())
                && !by_name.is_empty(),
            "{by_name:?}"
        );
        assert_eq!(
            control_listeners("https://localhost")
                .first()
                .map(std::net::SocketAddr::port),
            Some(443)
        );
        assert!(control_listeners("http:///no-authority").is_empty());
    }

    #[test]
    fn a_second_worker_on_the_same_egress_slot_is_refused_and_names_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("egress");
        let first = lock_slot(&locks, 7, "w1").expect("a free slot");
        let e = lock_slot(&locks, 7, "w2").expect_err("a taken slot");
        assert!(
            e.contains("egress slot 7 is taken") && e.contains("w1"),
            "{e}"
        );
        // Another slot is free; the slot is free again once the first lets it go.
        let _other = lock_slot(&locks, 8, "w2").expect("another slot");
        drop(first);
        lock_slot(&locks, 7, "w2").expect("released");
    }
}
