//! Starting and stopping the control plane (with its edge).

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AppState, router};
use crate::edge::{Authority, Edge};
use crate::service::ControlPlane;

/// Control-plane settings, validated before anything binds.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Data directory (SQLite store, admin and enrollment keys).
    pub data_dir: PathBuf,
    /// `postgres://…` to use PostgreSQL instead of SQLite.
    pub database_url: Option<String>,
    /// Standby sandboxes to keep ready for creates to claim (0: none).
    pub standby: usize,
    /// Standby sandboxes of the default template to keep ready with their network
    /// link made, for creates in mode `egress` to claim (0: none).
    pub standby_egress: usize,
    /// Domain of service-port URLs (`{port}-{sandbox}.{domain}`).
    pub domain: String,
    /// The network mode of a create that names no policy.
    pub network_default: space_proto::api::NetworkMode,
    /// The template of a create that names none: `default` (the host's directories)
    /// or an imported template's `name[:tag]` (`space up` changes it at run time once
    /// its default image is imported).
    pub default_template: String,
    /// Standby pools of image templates, by name (the default template's is
    /// `standby`).
    pub standby_templates: Vec<crate::service::TemplatePool>,
    /// The substrate of a create that names none (`jail`, or `vm` where every worker
    /// runs VMs).
    pub default_substrate: space_identity::Substrate,
    /// A front served on the same listener ahead of the API (the E2B front): given the
    /// handlers' state and the API's router, the router to serve.
    pub front: Option<Front>,
}

/// Builds the served router from the API's (see [`ControlConfig::front`]).
#[derive(Clone)]
pub struct Front(pub Arc<dyn Fn(AppState, axum::Router) -> axum::Router + Send + Sync>);

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Front(..)")
    }
}

impl ControlConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.database_url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(format!(
                    "--database-url must be a postgres:// URL, got {url:?}"
                ));
            }
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err("--data-dir must not be empty".into());
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if self.domain.len() > 200 || !self.domain.split('.').all(label_ok) {
            return Err(format!(
                "--domain must be a lowercase DNS name (such as localhost or sandboxes.example.com), got {:?}",
                self.domain
            ));
        }
        if self.default_template != crate::service::DEFAULT_TEMPLATE {
            space_image::TemplateRef::parse(&self.default_template)
                .map_err(|e| format!("--default-template: {e}"))?;
        }
        if self.standby > 1000 {
            return Err("--standby must be at most 1000".into());
        }
        Ok(())
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct ServerHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The control plane.
    pub cp: Arc<ControlPlane>,
    /// The admin API key, when this start created it (also in `admin.key`).
    pub admin_key_path: PathBuf,
    /// The enrollment secret workers present.
    pub enroll_secret: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// Stops serving and waits for in-flight requests.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Writes `contents` to `path` with mode 0600 unless the file exists; returns the
/// file's contents either way.
pub fn read_or_create_secret(
    path: &Path,
    make: impl FnOnce() -> String,
) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(s) => return Ok(s.trim().to_owned()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let value = make();
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(f, "{value}")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(value)
}

/// Creates the data directory 0700 and refuses to start on one that group or others
/// can reach, or whose secret files (the SQLite store with the trust-anchor and
/// signing-key seeds and the enrollment secret, `admin.key`, `enroll.key`) they can
/// read: someone else may have read them already, so nothing is loosened or
/// tightened silently.
fn check_data_dir(config: &ControlConfig) -> Result<(), String> {
    use space_http::private_dir::{
        check_database_files, check_private_dir, check_secret_file, ensure_private_dir,
    };
    let dir = &config.data_dir;
    ensure_private_dir(dir)?;
    if config.database_url.is_none() {
        check_database_files(&dir.join("control.db"))?;
    }
    for name in ["admin.key", "enroll.key", "admin.key.tmp", "enroll.key.tmp"] {
        check_secret_file(&dir.join(name))?;
    }
    let snapshots = dir.join("snapshots");
    if snapshots.exists() {
        check_private_dir(&snapshots)?;
    }
    Ok(())
}

/// Opens the store, loads keys, writes `admin.key` and `enroll.key` on first start, and
/// serves until [`ServerHandle::shutdown`].
pub async fn serve(config: ControlConfig) -> Result<ServerHandle, String> {
    config.validate()?;
    // A bad template bound is refused before anything binds (as on workers), not
    // replaced by the defaults.
    space_image::ImageLimits::from_env()?;
    check_data_dir(&config)?;
    let url = match &config.database_url {
        Some(u) => u.clone(),
        None => config.data_dir.join("control.db").display().to_string(),
    };
    let store = Store::open(&url)
        .await
        .map_err(|e| format!("store {url}: {e}"))?;
    // One enrollment secret for every replica on this database; each replica also
    // writes it to its data directory for the workers started next to it.
    let fresh = crate::auth::issue_key().text;
    store
        .kv_insert_if_absent("enroll_secret", &fresh)
        .await
        .map_err(|e| format!("store: {e}"))?;
    let enroll_secret = store
        .kv_get("enroll_secret")
        .await
        .map_err(|e| format!("store: {e}"))?
        .ok_or("the enrollment secret vanished from the store")?;
    let enroll_path = config.data_dir.join("enroll.key");
    let _ = std::fs::remove_file(&enroll_path);
    read_or_create_secret(&enroll_path, || enroll_secret.clone())
        .map_err(|e| format!("enroll.key: {e}"))?;
    let cp = ControlPlane::new(
        store,
        enroll_secret.clone(),
        config.data_dir.join("snapshots"),
    )
    .await
    .map_err(|e| format!("control plane: {e}"))?;

    let admin_key_path = config.data_dir.join("admin.key");
    if !admin_key_path.exists() {
        let first = cp
            .store
            .kv_insert_if_absent("admin_bootstrapped", "1")
            .await
            .map_err(|e| format!("store: {e}"))?;
        if first {
            let (_, key) = cp
                .create_tenant("admin", true)
                .await
                .map_err(|e| format!("admin tenant: {e}"))?;
            read_or_create_secret(&admin_key_path, || key.text.clone())
                .map_err(|e| format!("admin.key: {e}"))?;
        } else {
            tracing::warn!(
                "an admin key exists already (written by the replica that first started on this database)"
            );
        }
    }

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    cp.set_port_urls(crate::service::PortUrls {
        domain: config.domain.clone(),
        edge_port: addr.port(),
    });
    let state = AppState {
        cp: Some(Arc::clone(&cp)),
        edge: Edge::new(Authority::Local(Arc::clone(&cp))),
    };
    let app = match &config.front {
        Some(front) => (front.0)(state.clone(), router(state)),
        None => router(state),
    };
    let (stop, mut stopped) = watch::channel(false);
    cp.set_standby_target(config.standby);
    cp.set_standby_egress_target(config.standby_egress);
    cp.set_standby_templates(config.standby_templates.clone());
    cp.set_default_network(config.network_default);
    cp.set_default_template(&config.default_template);
    cp.set_default_substrate(config.default_substrate);
    let background = spawn_background(Arc::clone(&cp), stop.subscribe());
    let keeper = spawn_standby_keeper(Arc::clone(&cp), stop.subscribe());
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = space_http::serve_until(listener, app, shutdown).await {
            tracing::error!(error = %e, "server failed");
        }
        background.abort();
        keeper.abort();
    });
    Ok(ServerHandle {
        addr,
        cp,
        admin_key_path,
        enroll_secret,
        stop,
        task,
    })
}

/// Keeps the standby pools topped up: a plan every [`KEEPER_TICK`] (refills begun in
/// the background, a few in flight per worker), also while creates run.
fn spawn_standby_keeper(cp: Arc<ControlPlane>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut pause = KEEPER_TICK;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
            pause = match cp.keep_standby(false).await {
                Ok(_) => KEEPER_TICK,
                Err(e) => {
                    tracing::warn!(error = %e, "standby keeper failed");
                    Duration::from_secs(2)
                }
            };
        }
    })
}

/// How often the standby keeper plans.
const KEEPER_TICK: Duration = Duration::from_millis(50);

/// Periodic work: TTL expiry, key retirement, key reload, state gauges.
fn spawn_background(cp: Arc<ControlPlane>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if let Err(e) = cp.reconcile_transitions().await {
                tracing::warn!(error = %e, "transition reconciler failed");
            }
            if let Err(e) = cp.expire_sandboxes().await {
                tracing::warn!(error = %e, "ttl sweep failed");
            }
            if let Err(e) = cp.retire_old_keys().await {
                tracing::warn!(error = %e, "key retirement failed");
            }
            if let Err(e) = cp.store.purge_port_links(crate::now_secs() as i64).await {
                tracing::warn!(error = %e, "expired port links not purged");
            }
            if let Err(e) = cp.reload_keys().await {
                tracing::warn!(error = %e, "key reload failed");
            }
            cp.refresh_gauges().await;
        }
    })
}
