//! `space up`: control plane + edge in this process, N worker processes supervised
//! (a worker that dies is restarted and reconciles), clean shutdown on SIGINT/SIGTERM.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use space_control::{ControlConfig, serve};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::args::UpArgs;
use crate::daemons::{LOCK_FILE, complain, own_dir, say, shutdown_signal};
use space_worker::daemon::lock::DirLock;

/// How long workers get to stop before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// `space up`.
pub async fn run(a: UpArgs) -> Result<(), String> {
    if a.workers == 0 || a.workers > 64 {
        return Err("--workers must be 1 to 64".into());
    }
    if a.vm_workers > a.workers {
        return Err(format!(
            "--vm-workers {} is more than --workers {}",
            a.vm_workers, a.workers
        ));
    }
    if !a.egress.no_egress && u32::from(a.egress.egress_slot) + a.workers - 1 > 254 {
        return Err(format!(
            "--egress-slot {} leaves no slot for {} workers (slots are 0 to 254, one per worker)",
            a.egress.egress_slot, a.workers
        ));
    }
    let stop = shutdown_signal();
    // The data directory holds every secret of the platform: created 0700, and
    // refused when others can read it (the control plane checks its files).
    space_http::private_dir::ensure_private_dir(&a.data_dir)?;
    let data_dir = std::path::absolute(&a.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    // One `space up` per data directory, held for this process's life: a second is
    // refused here, before a key, a worker or a store write.
    let lock = DirLock::acquire(&data_dir, LOCK_FILE, "space up")?;
    let bin_dir = own_dir()?;
    for b in ["spaced-guest", "spaced-host", "space-jail"] {
        if !bin_dir.join(b).is_file() {
            return Err(format!(
                "{} is missing next to the space executable (build the workspace: cargo build --release)",
                b
            ));
        }
    }
    let handle = serve(ControlConfig {
        listen: a.listen,
        data_dir: data_dir.clone(),
        database_url: None,
        standby: a.standby(),
        standby_egress: a.standby_egress,
        domain: a.domain.clone(),
        network_default: a.network_default,
        default_template: space_control::service::DEFAULT_TEMPLATE.into(),
        standby_templates: a.standby_templates.clone(),
        default_substrate: match a.vm_workers == a.workers {
            true => space_identity::Substrate::Vm,
            false => space_identity::Substrate::Jail,
        },
        // E2B's REST and envd paths on the same address (`space_e2b`).
        front: Some(space_control::server::Front(std::sync::Arc::new(
            space_e2b::wrap,
        ))),
    })
    .await?;
    let url = format!("http://{}", handle.addr);
    lock.record(Some(&url))?;
    say(format_args!("SPACE is up at {url}"));
    say(format_args!(
        "admin API key: {}",
        handle.admin_key_path.display()
    ));
    say(format_args!(
        "try: SPACE_API_KEY=$(cat {}) space sandbox create",
        handle.admin_key_path.display()
    ));

    let stopping = Arc::new(AtomicBool::new(false));
    let children: Arc<Mutex<Vec<Option<Child>>>> =
        Arc::new(Mutex::new((0..a.workers).map(|_| None).collect()));
    let mut supervisors = Vec::new();
    for n in 1..=a.workers {
        let id = format!("w{n}");
        let args = vec![
            "worker".to_owned(),
            "--id".into(),
            id.clone(),
            "--control".into(),
            url.clone(),
            "--enroll-secret-file".into(),
            data_dir.join("enroll.key").display().to_string(),
            "--data-dir".into(),
            data_dir.join("workers").join(&id).display().to_string(),
            "--cgroup-parent".into(),
            format!("space-{}-{id}", short_hash(&data_dir)),
            "--warm-pool".into(),
            a.warm_pool.to_string(),
        ];
        let mut args = args;
        if a.no_userns {
            args.push("--no-userns".into());
        }
        args.extend(egress_args(&a.egress, n - 1));
        if n > a.workers - a.vm_workers {
            let kernel = a
                .vm_kernel_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("vm").join("kernel"));
            args.extend([
                "--substrate".into(),
                "vm".into(),
                "--vm-kernel-dir".into(),
                kernel.display().to_string(),
            ]);
        } else {
            // Said, not inherited: a `SPACE_SUBSTRATE` in this environment would
            // otherwise make every worker what only the last ones are.
            args.extend(["--substrate".into(), "jail".into()]);
        }
        supervisors.push(tokio::spawn(supervise(
            n as usize - 1,
            id,
            args,
            Arc::clone(&stopping),
            Arc::clone(&children),
        )));
    }

    let default_template = (a.default_template == "debian")
        .then(|| tokio::spawn(debian_default(Arc::clone(&handle.cp))));

    stop.await;
    if let Some(t) = default_template {
        t.abort();
    }
    say(format_args!("stopping…"));
    // No new standby sandbox while the workers go.
    handle.cp.set_standby_target(0);
    handle.cp.set_standby_egress_target(0);
    stopping.store(true, Ordering::SeqCst);
    stop_children(&children).await;
    for s in supervisors {
        let _ = s.await;
    }
    handle.shutdown().await;
    say(format_args!("stopped"));
    drop(lock);
    Ok(())
}

/// The template `space up --default-template debian` builds and keeps.
pub const DEBIAN_DEFAULT: &str = "debian-default";

/// `--default-template debian`: creates without a template get `debian-default`,
/// built on the first start (Debian bookworm, `python3` and `ca-certificates`, with
/// mmdebstrap; its progress shown) and imported into the platform, which keeps it in
/// the data directory. Until it is there, and where it cannot be made, creates keep
/// the host's directories, and one line says why.
async fn debian_default(cp: Arc<space_control::service::ControlPlane>) {
    let host = |why: &str| {
        say(format_args!(
            "default template: the host's directories ({why})"
        ));
    };
    if let Ok(t) = cp.template(DEBIAN_DEFAULT).await {
        cp.set_default_template(DEBIAN_DEFAULT);
        say(format_args!(
            "default template: {DEBIAN_DEFAULT} ({}, built {})",
            t.digest, t.created
        ));
        return;
    }
    if let Err(why) = crate::cli::build::mode() {
        host(&format!("no Debian image can be built here: {why}"));
        return;
    }
    say(format_args!(
        "default template: building {DEBIAN_DEFAULT} (Debian bookworm with Python 3, once; \
         creates get the host's directories until it is imported)…"
    ));
    let work = match tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(cp.template_dir())
        .or_else(|_| tempfile::tempdir())
    {
        Ok(w) => w,
        Err(e) => return host(&format!("no room to build {DEBIAN_DEFAULT}: {e}")),
    };
    let layout = work.path().join("image.tar");
    let debian = crate::cli::build::Debian {
        suite: "bookworm".into(),
        packages: vec!["python3".into(), "ca-certificates".into()],
        mirror: std::env::var("SPACE_DEBIAN_MIRROR").ok(),
    };
    let out = layout.clone();
    let built = tokio::task::spawn_blocking(move || {
        crate::cli::build::debian_layout(&debian, &out, &|line| {
            say(format_args!("  {DEBIAN_DEFAULT}: {line}"));
        })
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let built = match built {
        Ok(b) => b,
        Err(e) => {
            let first = e.lines().next().unwrap_or_default().to_owned();
            return host(&format!("building {DEBIAN_DEFAULT} failed: {first}"));
        }
    };
    match cp.import_template(DEBIAN_DEFAULT, &layout).await {
        Ok(t) => {
            cp.set_default_template(DEBIAN_DEFAULT);
            say(format_args!(
                "default template: {DEBIAN_DEFAULT} ({}, {:.1} MiB, built in {:.0} s with mmdebstrap --mode={})",
                t.digest,
                built.layer.size as f64 / f64::from(1u32 << 20),
                built.elapsed.as_secs_f64(),
                built.mode.name
            ));
        }
        Err(e) => host(&format!("importing {DEBIAN_DEFAULT} failed: {e}")),
    }
}

/// A short, stable tag of the data directory, so two `space up` on one host use
/// different cgroups.
fn short_hash(p: &Path) -> String {
    let mut h: u32 = 2_166_136_261;
    for b in p.as_os_str().as_encoded_bytes() {
        h = (h ^ u32::from(*b)).wrapping_mul(16_777_619);
    }
    format!("{:06x}", h & 0xff_ffff)
}

async fn supervise(
    slot: usize,
    id: String,
    args: Vec<String>,
    stopping: Arc<AtomicBool>,
    children: Arc<Mutex<Vec<Option<Child>>>>,
) {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            complain(format_args!(
                "worker {id}: cannot find the space executable: {e}"
            ));
            return;
        }
    };
    let mut backoff = Duration::from_millis(200);
    while !stopping.load(Ordering::SeqCst) {
        let spawned = Command::new(&exe)
            .args(&args)
            // The worker ends when this process does, however it ends (see
            // `daemons::exit_with_parent`): a `space up` killed with -9 leaves no worker
            // holding its data directory for the next one.
            .env(crate::daemons::PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(false)
            .spawn();
        match spawned {
            Ok(mut child) => {
                let mut table = children.lock().await;
                if stopping.load(Ordering::SeqCst) {
                    // Shutdown began between the check above and now: `stop_children`
                    // has already been through the table (it sets `stopping` before
                    // taking the lock), so this child is stopped here.
                    drop(table);
                    stop_child(&mut child).await;
                    return;
                }
                table[slot] = Some(child);
            }
            Err(e) => {
                complain(format_args!("worker {id}: cannot start: {e}"));
                tokio::time::sleep(backoff).await;
                continue;
            }
        }
        let started = std::time::Instant::now();
        // Poll so that shutdown can take the child out of the table to stop it.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut table = children.lock().await;
            let Some(child) = table[slot].as_mut() else {
                return;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    table[slot] = None;
                    if !stopping.load(Ordering::SeqCst) {
                        complain(format_args!("worker {id} exited ({status}); restarting"));
                    }
                    break;
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(200);
        } else {
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        if !stopping.load(Ordering::SeqCst) {
            tokio::time::sleep(backoff).await;
        }
    }
}

async fn stop_children(children: &Mutex<Vec<Option<Child>>>) {
    let mut table = children.lock().await;
    for child in table.iter().flatten() {
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for slot in table.iter_mut() {
        if let Some(mut child) = slot.take() {
            wait_or_kill(&mut child).await;
        }
    }
}

/// Stops one worker: SIGTERM, then SIGKILL after [`STOP_GRACE`].
async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    wait_or_kill(child).await;
}

async fn wait_or_kill(child: &mut Child) {
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The egress flags of worker `index` (from 0): its own slot, the rest as given.
fn egress_args(a: &crate::args::EgressArgs, index: u32) -> Vec<String> {
    if a.no_egress {
        return vec!["--no-egress".into()];
    }
    let slot = u32::from(a.egress_slot) + index;
    let mut args = vec!["--egress-slot".into(), slot.to_string()];
    let lists = [
        (
            "--egress-deny",
            a.egress_deny
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
        ),
        (
            "--egress-allow-private",
            a.egress_allow_private
                .iter()
                .map(ToString::to_string)
                .collect(),
        ),
        (
            "--egress-dns",
            a.egress_dns.iter().map(ToString::to_string).collect(),
        ),
    ];
    for (flag, values) in lists {
        for v in values {
            args.push(flag.into());
            args.push(v);
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::tests::up;

    #[test]
    fn each_worker_takes_its_own_egress_slot_and_every_list() {
        let a = up(&["--egress-slot", "4", "--egress-deny", "203.0.113.0/24"]);
        assert_eq!(
            egress_args(&a.egress, 1),
            ["--egress-slot", "5", "--egress-deny", "203.0.113.0/24"]
        );
        assert_eq!(
            egress_args(&up(&["--no-egress"]).egress, 0),
            ["--no-egress"]
        );
    }
}
