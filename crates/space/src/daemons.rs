//! `space control`, `space worker`, `space edge`: one role per process.

use std::path::{Path, PathBuf};

use space_control::{ControlConfig, serve};
use space_worker::daemon::lock::DirLock;
use space_worker::daemon::{Binaries, WorkerConfig};

use crate::args::{ControlArgs, EdgeArgs, WorkerArgs};

/// The lock file of a control plane's data directory (`space up`, `space control`).
pub const LOCK_FILE: &str = "space.lock";

/// Resolves at SIGINT or SIGTERM. The handlers are installed when this is called,
/// not when it is first polled: call it before a slow start-up, so a signal that
/// arrives meanwhile still ends in a clean shutdown rather than the default action.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            // Without signal handlers the process can only be killed; wait forever.
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

/// `space control`.
pub async fn control(a: ControlArgs) -> Result<(), String> {
    let stop = shutdown_signal();
    // The same lock as `space up`: one control plane per data directory.
    space_http::private_dir::ensure_private_dir(&a.data_dir)?;
    let lock = DirLock::acquire(&a.data_dir, LOCK_FILE, "space control")?;
    let handle = serve(ControlConfig {
        listen: a.listen,
        data_dir: a.data_dir,
        database_url: a.database_url,
        standby: a.standby,
        standby_egress: a.standby_egress,
        domain: a.domain.clone(),
        network_default: a.network_default,
        default_template: a.default_template.clone(),
        standby_templates: a.standby_templates.clone(),
        default_substrate: a.default_substrate,
        // E2B's REST and envd paths on the same address (`space_e2b`).
        front: Some(space_control::server::Front(std::sync::Arc::new(
            space_e2b::wrap,
        ))),
    })
    .await?;
    lock.record(Some(&format!("http://{}", handle.addr)))?;
    say(format_args!(
        "control plane listening on http://{}",
        handle.addr
    ));
    stop.await;
    handle.shutdown().await;
    drop(lock);
    Ok(())
}

/// The directory of the running executable.
pub fn own_dir() -> Result<PathBuf, String> {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| "cannot find the directory of the space executable".into())
}

/// Set by `space up` for its workers: its pid.
pub const PARENT_ENV: &str = "SPACE_UP_PID";

/// When started by `space up` ([`PARENT_ENV`]), ends this process once that parent is
/// gone (killed with -9, it cannot stop its workers): as a crash does, without
/// stopping sandboxes (the next `space up` re-adopts them), so the worker's lock is
/// free for the next start's worker. Checked twice a second.
fn exit_with_parent() {
    let Some(parent) = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        return;
    };
    let gone = move || rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get()) != parent;
    if gone() {
        complain(format_args!("space up (pid {parent}) is gone; exiting"));
        std::process::exit(1);
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tick.tick().await;
            if gone() {
                complain(format_args!("space up (pid {parent}) is gone; exiting"));
                std::process::exit(1);
            }
        }
    });
}

/// The agent of `bin_dir`: its `spaced-guest`, unless that one is dynamically linked
/// and `cargo static-agent` left a static build beside it
/// (`<target>/<triple>/<profile>/spaced-guest` for `<target>/<profile>/`): image
/// templates run the agent from the image's root, where only a static one runs.
fn agent_binary(bin_dir: &Path) -> PathBuf {
    use space_worker::substrate::jail::template::is_static;
    let plain = bin_dir.join("spaced-guest");
    if is_static(&plain) {
        return plain;
    }
    let beside = bin_dir.file_name().and_then(|profile| {
        let target = bin_dir.parent()?;
        Some(
            target
                .join(STATIC_AGENT_TRIPLE)
                .join(profile)
                .join("spaced-guest"),
        )
    });
    match beside {
        Some(s) if is_static(&s) => s,
        _ => plain,
    }
}

/// The target triple of `.cargo/config.toml`'s `static-agent` alias.
const STATIC_AGENT_TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// `space worker`.
pub async fn worker(a: WorkerArgs) -> Result<(), String> {
    exit_with_parent();
    let id =
        a.id.parse()
            .map_err(|_| format!("--id {:?} is not a valid worker id (a DNS label)", a.id))?;
    let enroll_secret = match (a.enroll_secret, a.enroll_secret_file) {
        (Some(s), None) => s,
        (None, Some(f)) => std::fs::read_to_string(&f)
            .map_err(|e| format!("{}: {e}", f.display()))?
            .trim()
            .to_owned(),
        _ => return Err("give --enroll-secret or --enroll-secret-file".into()),
    };
    let bin_dir = match a.bin_dir {
        Some(d) => d,
        None => own_dir()?,
    };
    let data_dir = std::path::absolute(&a.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    let cgroup_parent = a.cgroup_parent.unwrap_or_else(|| format!("space-{}", a.id));
    let config = WorkerConfig {
        id,
        control_url: a.control,
        enroll_secret,
        listen: a.listen,
        advertise_url: a.advertise_url,
        data_dir: data_dir.clone(),
        capacity: a.capacity,
        binaries: Binaries {
            agent: a.agent.unwrap_or_else(|| agent_binary(&bin_dir)),
            bridge: bin_dir.join("spaced-host"),
        },
        jail_binary: bin_dir.join("space-jail"),
        cgroup_parent,
        warm_pool: a.warm_pool,
        limits: space_worker::daemon::limits::WorkerLimits::from_env(),
        egress: (!a.egress.no_egress).then(|| space_worker::daemon::config::EgressSettings {
            slot: a.egress.egress_slot,
            deny: a.egress.egress_deny.clone(),
            allow_private: a.egress.egress_allow_private.clone(),
            dns: a.egress.egress_dns.clone(),
        }),
        vm: (a.substrate == space_identity::Substrate::Vm).then(|| {
            space_worker::daemon::VmSettings {
                qemu: a.qemu.clone(),
                firecracker: (a.vmm == "firecracker").then(|| a.firecracker.clone()),
                kernel_dir: a
                    .vm_kernel_dir
                    .clone()
                    .unwrap_or_else(|| data_dir.join("vm").join("kernel")),
                transport: a
                    .vm_transport
                    .parse()
                    .expect("clap allowed only auto, serial and vsock"),
            }
        }),
        userns: (!a.no_userns).then(
            || space_worker::substrate::jail::uid_ranges::UidRangeConfig {
                first_id: a.userns_first_uid,
                slots: a.userns_ranges,
                ..Default::default()
            },
        ),
    };
    let mut stop = std::pin::pin!(shutdown_signal());
    let mut start = std::pin::pin!(space_worker::daemon::run(config));
    let handle = tokio::select! {
        h = &mut start => h?,
        _ = &mut stop => {
            // Signalled while starting (enrolling can wait ~40 s for a control plane):
            // a start-up that is nearly done may finish and stop cleanly; otherwise
            // stop now.
            return match tokio::time::timeout(std::time::Duration::from_secs(5), &mut start).await {
                Ok(h) => {
                    h?.shutdown(true).await;
                    Ok(())
                }
                Err(_) => Err("stopped while starting".into()),
            };
        }
    };
    say(format_args!(
        "worker {} listening on http://{}",
        a.id, handle.addr
    ));
    stop.await;
    handle.shutdown(true).await;
    Ok(())
}

/// `space edge`.
pub async fn edge(a: EdgeArgs) -> Result<(), String> {
    let state = space_control::api::edge_only(a.control.trim_end_matches('/').to_owned());
    let app = space_control::api::edge_router(state);
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", a.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    say(format_args!("edge listening on http://{addr}"));
    axum_serve(listener, app).await
}

async fn axum_serve(
    listener: tokio::net::TcpListener,
    app: space_control::api::Router,
) -> Result<(), String> {
    space_control::api::serve_until(listener, app, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

/// A line on standard output for whoever watches a daemon. Output that goes nowhere (a
/// pipe whose reader went away) is no reason to stop: `println!` would panic there and
/// take the daemon down mid-way (`space up` would leave its workers running).
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// [`say`] on standard error.
pub(crate) fn complain(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
