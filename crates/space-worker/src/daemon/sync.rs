//! Catching up with the control plane: the reconciliation at a worker's start
//! (re-adopt what survived, report what was lost, retire what is no longer listed,
//! sweep leftovers) and the periodic resync (retirements missed while unreachable).

use std::sync::Arc;

use space_http::HttpClient;
use space_proto::api::{SignedUpdate, Update};

use super::records::{ExecutionRecord, RecordState};
use super::state::{AgentPool, Worker, activation_of, now_secs};
use super::{agent_watch, launch, templates, updates};

/// The executions recorded live here before node-api serves: the only ones the
/// start-up reconciliation may retire as unlisted (see [`reconcile`]).
pub fn live_before_serving(worker: &Worker) -> Result<Vec<ExecutionRecord>, String> {
    Ok(worker
        .records
        .all()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| {
            matches!(
                r.state,
                RecordState::Starting | RecordState::Running | RecordState::Paused
            )
        })
        .collect())
}

/// Applies the control plane's sync: bundle first, then re-adopt each execution it
/// lists if its processes survived and verify, report it lost otherwise, and retire
/// every execution of `before` (what was live here before node-api served,
/// [`live_before_serving`]) it does not list and nothing changed since.
pub async fn reconcile(
    worker: &Arc<Worker>,
    before: Vec<ExecutionRecord>,
    list: Vec<SignedUpdate>,
    asked_at: i64,
    http: &HttpClient,
    control_url: &str,
    credential: &str,
) -> Result<(), String> {
    let mut wanted = Vec::new();
    let mut kept_templates = None;
    // One durable claim of every sequence number in the list.
    for (body, update) in updates::verify_all(worker, &list).map_err(|e| e.to_string())? {
        match update {
            Update::Bundle { .. } => {
                updates::apply(worker, body, update)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Update::Install(i) => wanted.push(i),
            Update::Templates { keep } => kept_templates = Some(keep),
            Update::Retire { .. }
            | Update::Pause { .. }
            | Update::Resume { .. }
            | Update::Unfreeze { .. }
            | Update::Ports { .. }
            | Update::Network { .. }
            | Update::Snapshot { .. }
            | Update::Layer { .. }
            | Update::Template { .. } => {
                updates::apply(worker, body, update)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let mut lost = Vec::new();
    for i in &wanted {
        let ran_before = before
            .iter()
            .any(|r| r.sandbox == i.sandbox && r.generation == i.generation);
        if !readopt(worker, i, asked_at, ran_before).await {
            lost.push((i.sandbox, i.generation));
        }
    }
    // What ran here before this start and the control plane did not list is retired
    // — that alone. node-api serves from before the list was asked for, and an install
    // pushed meanwhile may be newer than the list: retiring every unlisted execution
    // killed sandboxes the control plane had just been told run (a standby sandbox
    // started on a worker still syncing was found retired when a create claimed it).
    // An execution changed since (an update pushed while syncing) is known to the
    // control plane: the periodic resync judges it against a newer list.
    for r in before {
        if wanted
            .iter()
            .any(|i| i.sandbox == r.sandbox && i.generation == r.generation)
        {
            continue;
        }
        let _turn = worker.lock_sandbox(&r.sandbox).await;
        let now = worker
            .records
            .get(&r.sandbox, r.generation)
            .map_err(|e| e.to_string())?;
        if now.as_ref() == Some(&r) {
            updates::retire_unlisted(worker, &r).await;
        }
    }
    let live: Vec<_> = worker
        .records
        .all()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| matches!(r.state, RecordState::Running | RecordState::Paused))
        .collect();
    let keep: Vec<_> = live
        .iter()
        .map(|r| launch::execution_key(&r.sandbox, &r.execution_id))
        .collect();
    let keep_runs: Vec<_> = live
        .iter()
        .filter_map(|r| {
            r.handle
                .as_ref()?
                .socket_path
                .parent()
                .map(std::path::Path::to_path_buf)
        })
        .collect();
    let jail = Arc::clone(&worker.jail);
    let data_dir = worker.data_dir.clone();
    // No install may create directories while the sweep decides what is left over.
    let _applying = worker.exclusive("the startup sweep").await;
    match tokio::task::spawn_blocking(move || jail.sweep_leftovers(&data_dir, &keep, &keep_runs))
        .await
    {
        Ok(Ok(report)) => tracing::info!(?report, "startup sweep"),
        Ok(Err(e)) => tracing::warn!(error = %e, "startup sweep failed"),
        Err(e) => tracing::warn!(error = %e, "startup sweep panicked"),
    }
    launch::kill_stray_bridges(&worker.data_dir, &worker.binaries.bridge, &live);
    drop(_applying);
    // With the executions that did not survive failed: what they ran on may go.
    if let Some(keep) = kept_templates {
        sweep_templates(worker, &keep, asked_at).await;
    }
    for (sandbox, generation) in lost {
        let url = format!(
            "{}/internal/v1/workers/{}/lost",
            control_url.trim_end_matches('/'),
            worker.id
        );
        let auth = format!("Bearer {credential}");
        let body = serde_json::json!({"sandbox": sandbox, "generation": generation});
        if let Err(e) = http
            .post_json(&url, &[("authorization", &auth)], &body)
            .await
        {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not report a lost execution");
        }
    }
    Ok(())
}

/// Re-adopts an execution after a restart if its record is running and its jail,
/// agent and bridge are the recorded live processes. Otherwise marks it failed.
async fn readopt(
    worker: &Arc<Worker>,
    i: &space_proto::api::InstallExecution,
    asked_at: i64,
    ran_before: bool,
) -> bool {
    // In the sandbox's turn: node-api already serves, and an update pushed meanwhile (a
    // retirement, a newer policy) must not be undone by this older list's view.
    let _turn = worker.lock_sandbox(&i.sandbox).await;
    let Some(slot) = worker.slot(&i.sandbox) else {
        return false;
    };
    let r = &slot.record;
    let same = r.execution() == i.execution();
    // Installed while this worker synced (in its turn, so the install is over): it
    // runs as installed, with its own pool and watch; nothing to adopt.
    if !ran_before && same && matches!(r.state, RecordState::Running | RecordState::Paused) {
        return true;
    }
    // The list's ports and policy, unless an update pushed since the list was asked
    // for changed the record (it is newer than the list; one pushed before is in the
    // list already, since the control plane stores before it pushes).
    let (ports, network) = if r.updated_at >= asked_at {
        (r.ports.clone(), r.network.clone())
    } else {
        (i.ports.clone(), i.network.clone())
    };
    let alive = same
        && matches!(r.state, RecordState::Running | RecordState::Paused)
        && r.bridge
            .as_ref()
            .is_some_and(|b| launch::still_alive(&b.process))
        && r.handle.as_ref().is_some_and(|h| {
            h.agent
                .is_some_and(|a| launch::still_alive_pid(a.pid, a.start_time))
        });
    // Its user namespace range was free while no worker held it: re-adopted only
    // if it is still this jail's alone.
    let alive = alive
        && r.handle
            .as_ref()
            .is_some_and(|h| worker.jail.hold_userns(h).unwrap_or(false));
    // A vhost-vsock VM's guest CID is its own again: no new VM is given it.
    let alive = alive
        && match (&worker.vm, &r.handle) {
            (Some(vm), Some(h)) => vm.hold(h),
            _ => true,
        };
    let alive = alive
        && {
            // The links of the worker's previous run were removed when it started: the
            // sandbox gets its network back before it is served again.
            let mut r = r.clone();
            r.network = network.clone();
            match worker.give_network(&r).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(sandbox = %r.sandbox, error = %e, "cannot give the re-adopted sandbox its network");
                    false
                }
            }
        };
    if alive {
        // The control plane's list is newer than this record where they differ: a
        // ports update missed while this worker was down.
        let mut r = r.clone();
        if r.ports != ports || r.network != network {
            r.ports = ports;
            r.network = network;
            r.updated_at = now_secs() as i64;
            if let Err(e) = worker.records.put(&r) {
                tracing::warn!(sandbox = %r.sandbox, error = %e, "cannot record the sandbox's ports and network");
            }
        }
        let r = &r;
        if let Some(b) = &r.bridge {
            let pool = Arc::new(AgentPool::new(
                launch::bridge_target(b, &activation_of(r)),
                32,
            ));
            worker.put_slot(r.clone(), Some(pool));
        }
        agent_watch::watch_agent(worker, r);
        tracing::info!(sandbox = %r.sandbox, generation = r.generation.get(), "re-adopted after restart");
        return true;
    }
    if same {
        let mut failed = r.clone();
        failed.state = RecordState::Failed;
        failed.updated_at = now_secs() as i64;
        let _ = worker.records.put(&failed);
        worker.teardown(r, launch::Layer::Keep).await;
        worker.put_slot(failed, None);
    }
    false
}

/// Periodic catch-up: installs the newest bundle and retires every execution that
/// runs here but that the control plane no longer lists (a retirement missed while
/// this worker was unreachable). Executions are never started from here: an
/// install that was not acknowledged already failed at the control plane.
/// Records changed since shortly before `asked_at` are left alone: the list may
/// predate them.
pub async fn resync(worker: &Arc<Worker>, list: Vec<SignedUpdate>, asked_at: i64) {
    let mut listed = Vec::new();
    let mut kept_templates = None;
    let verified = match updates::verify_all(worker, &list) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "resync: update refused");
            return;
        }
    };
    for (body, update) in verified {
        match update {
            update @ Update::Bundle { .. } => {
                if let Err(e) = updates::apply(worker, body, update).await {
                    tracing::warn!(error = %e, "resync: bundle refused");
                }
            }
            Update::Install(i) => listed.push((i.sandbox, i.generation)),
            Update::Templates { keep } => kept_templates = Some(keep),
            _ => {}
        }
    }
    let Ok(records) = worker.records.all() else {
        return;
    };
    for r in records {
        let live = matches!(r.state, RecordState::Running | RecordState::Paused);
        let settled = r.updated_at < asked_at - 2;
        if live && settled && !listed.contains(&(r.sandbox, r.generation)) {
            tracing::info!(sandbox = %r.sandbox, generation = r.generation.get(), "retiring an execution the control plane no longer lists");
            let retire = Update::Retire {
                sandbox: r.sandbox,
                generation: r.generation,
                execution_id: r.execution_id,
            };
            let _ = updates::apply(worker, Vec::new(), retire).await;
        }
    }
    if let Some(keep) = kept_templates {
        sweep_templates(worker, &keep, asked_at).await;
    }
}

/// The template sweep of a sync's list (see [`templates::sweep`]); a failure is
/// logged, and the next sync tries again.
async fn sweep_templates(worker: &Arc<Worker>, keep: &[String], asked_at: i64) {
    let asked_at = u64::try_from(asked_at).unwrap_or(0);
    if let Err(e) = templates::sweep(worker, keep, asked_at).await {
        tracing::warn!(error = %e, "template sweep failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::node_api::tests::{bare_worker, enroll};
    use space_identity::{Generation, Purpose, SandboxId};

    /// Sandbox `n`'s first execution recorded here as running (no processes: nothing
    /// is launched, so its retirement has nothing to stop).
    fn hold(worker: &Worker, n: u64) -> ExecutionRecord {
        let route = space_testkit::route(n, 1, "w1");
        let record = ExecutionRecord {
            sandbox: route.sandbox,
            generation: route.execution.generation,
            execution_id: route.execution.id,
            substrate: route.placement.substrate,
            activation: route.placement.activation,
            state: RecordState::Running,
            secret: [7; 32],
            handle: None,
            bridge: None,
            env: Default::default(),
            ports: Vec::new(),
            network: space_proto::api::Policy::none(),
            defaults: Default::default(),
            template: None,
            updated_at: now_secs() as i64,
        };
        worker.records.put(&record).unwrap();
        worker.put_slot(record.clone(), None);
        record
    }

    fn state(worker: &Worker, sandbox: &SandboxId) -> RecordState {
        worker
            .records
            .get(sandbox, Generation(1))
            .unwrap()
            .expect("a record")
            .state
    }

    /// The control plane's list may predate an install it pushed while the worker
    /// synced (node-api serves from before the list is asked for): the start-up
    /// reconciliation retired every unlisted execution, that one too (in CI: a standby
    /// sandbox started on a worker still syncing, retired, then claimed by a create
    /// whose policy push was refused with `execution is Retired`).
    #[tokio::test]
    async fn an_execution_installed_while_the_worker_syncs_is_not_retired_as_unlisted() {
        let data = tempfile::tempdir().unwrap();
        let worker = bare_worker(&data, "sync");
        enroll(
            &worker,
            &space_testkit::TestKeys::new(),
            &[Purpose::Control],
        );
        // Ran before this start; the control plane lists it no more.
        let old = hold(&worker, 1);
        // Ran before too, and an update pushed while syncing changed it: the control
        // plane knows it, whatever its older list says.
        let updated = hold(&worker, 3);
        let before = live_before_serving(&worker).unwrap();
        // Installed while the worker syncs, after its list was asked for.
        let asked_at = now_secs() as i64;
        let fresh = hold(&worker, 2);
        let mut changed = updated.clone();
        changed.network = space_proto::api::Policy::parse(
            space_proto::api::NetworkMode::Egress,
            &["a.test"],
            &[] as &[&str],
        )
        .unwrap();
        worker.records.put(&changed).unwrap();
        let http = HttpClient::new(std::time::Duration::from_secs(1));
        reconcile(
            &worker,
            before,
            Vec::new(),
            asked_at,
            &http,
            "http://127.0.0.1:9",
            "c",
        )
        .await
        .unwrap();
        assert_eq!(state(&worker, &old.sandbox), RecordState::Retired);
        assert_eq!(state(&worker, &fresh.sandbox), RecordState::Running);
        assert_eq!(state(&worker, &updated.sandbox), RecordState::Running);
        assert!(
            worker
                .slot(&fresh.sandbox)
                .is_some_and(|s| s.record == fresh)
        );
    }
}
