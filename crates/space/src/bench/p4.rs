//! P4: 50 sandbox creates at once through the public API (the SDK, through the
//! edge), on the defaults of `space up` (16 warm jails and 16 standby sandboxes per
//! worker) once the pools are full; each create counts as done when its answer
//! arrives, and every created sandbox then runs `true` (not timed) to show it was
//! ready for its first exec. Creates one at a time as information.

use std::time::{Duration, Instant};

use space_client::{Client, SandboxState};
use space_egress::Policy;
use space_identity::SandboxId;
use space_proto::api::CreateSandbox;

use super::platform::Platform;
use super::row::{Row, quantile};

/// Creates at once.
const BURST: usize = 50;
/// Creates one after the other.
const SINGLE: usize = 20;

/// One create: its time (ms) and the sandbox.
async fn create(client: Client, network: Option<Policy>) -> Result<(f64, SandboxId), String> {
    let body = CreateSandbox {
        network,
        ..CreateSandbox::default()
    };
    create_body(client, body).await
}

/// One create of `body`: its time (ms) and the sandbox.
pub async fn create_body(client: Client, body: CreateSandbox) -> Result<(f64, SandboxId), String> {
    let t = Instant::now();
    let s = client
        .create_sandbox(&body)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let took = t.elapsed().as_secs_f64() * 1e3;
    if s.state != SandboxState::Running {
        return Err(format!("a create answered {:?}, not running", s.state));
    }
    Ok((took, s.id))
}

/// `BURST` creates of `body` at once (each then runs `true`, and is deleted): their
/// times in ms, sorted.
pub async fn burst_of(client: &Client, body: &CreateSandbox) -> Result<Vec<f64>, String> {
    let tasks: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(create_body(client.clone(), body.clone())))
        .collect();
    let (mut times, mut ids) = (Vec::new(), Vec::new());
    for t in tasks {
        let (took, id) = t.await.map_err(|e| format!("create task: {e}"))??;
        times.push(took);
        ids.push(id);
    }
    first_exec_and_delete(client, &ids).await?;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// Runs `true` in each sandbox (each must be ready for it), then deletes them.
async fn first_exec_and_delete(client: &Client, ids: &[SandboxId]) -> Result<(), String> {
    for id in ids {
        let out = client
            .exec(id, &space_client::exec(["true"]))
            .await
            .map_err(|e| format!("first exec in a created sandbox: {e}"))?;
        if out.exit_code != 0 {
            return Err(format!("`true` in a created sandbox: {out:?}"));
        }
    }
    for id in ids {
        client
            .delete_sandbox(id)
            .await
            .map_err(|e| format!("delete: {e}"))?;
    }
    Ok(())
}

/// P4 on `p`, started with `warm` warm jails per worker and `standby` standby
/// sandboxes.
pub async fn run(p: &Platform, warm: usize, standby: usize) -> Result<Vec<Row>, String> {
    run_with(p, warm, standby, None).await
}

/// P4 with every sandbox created with `network` (issue 15: in mode egress, each gets
/// its link and rules before its create is answered).
pub async fn run_with(
    p: &Platform,
    warm: usize,
    standby: usize,
    network: Option<Policy>,
) -> Result<Vec<Row>, String> {
    let figure = if network.is_some() { "P4 egress" } else { "P4" };
    let client = p.client(true);
    let settle = Duration::from_secs(180);
    p.wait_for_pools(warm, standby, settle).await?;
    eprintln!("P4: {BURST} creates at once through the public API");
    let tasks: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(create(client.clone(), network.clone())))
        .collect();
    let (mut burst, mut ids) = (Vec::new(), Vec::new());
    for t in tasks {
        let (took, id) = t.await.map_err(|e| format!("create task: {e}"))??;
        burst.push(took);
        ids.push(id);
    }
    first_exec_and_delete(&client, &ids).await?;
    p.wait_for_pools(warm, standby, settle).await?;
    eprintln!("P4: {SINGLE} creates one at a time");
    let (mut single, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..SINGLE {
        let (took, id) = create(client.clone(), network.clone()).await?;
        single.push(took);
        ids.push(id);
    }
    first_exec_and_delete(&client, &ids).await?;
    burst.sort_by(f64::total_cmp);
    single.sort_by(f64::total_cmp);
    let (p50, p99) = (quantile(&burst, 0.5), quantile(&burst, 0.99));
    let pools = format!("{warm} warm jails per worker, {standby} standby sandboxes");
    Ok(vec![
        Row::new(
            figure,
            &format!("create, {BURST} concurrent, ready for its first exec, p50 ({pools})"),
            format!("{p50:.1} ms (min {:.1} ms)", quantile(&burst, 0.0)),
            "≤ 25 ms",
        )
        .ratio(p50 / 25.0)
        .pass(p50 <= 25.0),
        Row::new(
            figure,
            &format!("create, {BURST} concurrent, p99"),
            format!("{p99:.1} ms"),
            "≤ 100 ms",
        )
        .ratio(p99 / 100.0)
        .pass(p99 <= 100.0),
        Row::new(
            figure,
            "create, one at a time (information)",
            format!(
                "p50 {:.1} ms, p99 {:.1} ms",
                quantile(&single, 0.5),
                quantile(&single, 0.99)
            ),
            "-",
        ),
    ])
}
