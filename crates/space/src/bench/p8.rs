//! P8: streams of execution N closed after N+1 is installed. Ten terminals and ten
//! watches are open (through the SDK's direct mode, at N's worker) when the sandbox
//! migrates to the other worker; the figure is the time from N+1's installation to
//! the last of the twenty streams ending with "execution replaced".
//!
//! The installation's moment comes from the target worker's `space_worker_launches`
//! counter, polled while the migration runs: the start of the last poll that still
//! read the old value is before N+1 was recorded running, so the figure is an upper
//! bound (by at most one poll). Run on a quiet platform (pools full), so no other
//! install moves the counter; a run where it moved by more than one is repeated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use space_client::Client;
use space_identity::{SandboxId, WorkerId};

use super::platform::{self, Platform};
use super::row::{Row, quantile};

/// Streams per kind.
const STREAMS: usize = 10;
/// Measured migrations.
const RUNS: usize = 5;
const LAUNCHES: &str = "space_worker_launches_total";

/// Opens the streams; each task resolves to the instant its stream ended, and whether
/// it ended as "replaced" (an error close, not a normal end).
async fn open_streams(
    sdk: &Client,
    id: &SandboxId,
) -> Result<Vec<tokio::task::JoinHandle<(Instant, bool)>>, String> {
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let mut term = sdk
            .terminal(id, 24, 80)
            .await
            .map_err(|e| format!("terminal: {e}"))?;
        tasks.push(tokio::spawn(async move {
            loop {
                match term.next().await {
                    Some(Ok(space_client::TerminalEvent::Output(_))) => {}
                    Some(Err(_)) => return (Instant::now(), true),
                    Some(Ok(_)) | None => return (Instant::now(), false),
                }
            }
        }));
        let mut watch = sdk
            .watch(id, "/root", false)
            .await
            .map_err(|e| format!("watch: {e}"))?;
        tasks.push(tokio::spawn(async move {
            loop {
                match watch.next().await {
                    Some(Ok(_)) => {}
                    Some(Err(_)) => return (Instant::now(), true),
                    None => return (Instant::now(), false),
                }
            }
        }));
    }
    Ok(tasks)
}

/// One measured migration of `id` to `target` (node-api `target_url`): ms from
/// before N+1's install to the last close, or `None` when another install moved the
/// counter meanwhile.
async fn one(
    edge: &Client,
    sdk: &Client,
    id: &SandboxId,
    target: &WorkerId,
    target_url: &str,
) -> Result<Option<f64>, String> {
    let streams = open_streams(sdk, id).await?;
    // Let every stream reach the agent before the move.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = platform::metric(target_url, LAUNCHES).await;
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (done, url) = (Arc::clone(&done), target_url.to_owned());
        tokio::spawn(async move {
            // The start of the last poll that read `before`.
            let mut last_old = Instant::now();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                if platform::metric(&url, LAUNCHES).await <= before {
                    last_old = t;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            last_old
        })
    };
    let moved = edge.migrate(id, target).await;
    let mut closes = Vec::new();
    let mut replaced = true;
    for s in streams {
        let (at, r) = tokio::time::timeout(Duration::from_secs(10), s)
            .await
            .map_err(|_| "a stream of the old execution stayed open 10 s".to_owned())?
            .map_err(|e| format!("stream task: {e}"))?;
        closes.push(at);
        replaced &= r;
    }
    done.store(true, Ordering::Relaxed);
    let last_old = poller.await.map_err(|e| format!("poller: {e}"))?;
    moved.map_err(|e| format!("migrate to {target}: {e}"))?;
    if !replaced {
        return Err("a stream of the old execution ended normally, not as replaced".into());
    }
    let after = platform::metric(target_url, LAUNCHES).await;
    if after - before != 1.0 {
        return Ok(None);
    }
    let last = closes.into_iter().max().unwrap_or(last_old);
    Ok(Some(
        last.saturating_duration_since(last_old).as_secs_f64() * 1e3,
    ))
}

/// P8 on `p` (two workers), with `warm` and `standby` as it was started (waited for,
/// so that no refill installs anything meanwhile).
pub async fn run(p: &Platform, warm: usize, standby: usize) -> Result<Vec<Row>, String> {
    if p.workers.len() < 2 {
        return Err("P8 needs two workers".into());
    }
    let edge = p.client(false);
    let sdk = p.client(true);
    let first: WorkerId = p.workers[0].parse().map_err(|_| "worker id")?;
    let id = edge
        .create_sandbox(&space_client::CreateSandbox {
            worker: Some(first),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    eprintln!(
        "P8: {RUNS} migrations with {STREAMS} terminals and {STREAMS} watches open on the old execution"
    );
    let mut times = Vec::new();
    let mut attempts = 0;
    while times.len() < RUNS && attempts < 3 * RUNS {
        attempts += 1;
        p.wait_for_pools(warm, standby, Duration::from_secs(120))
            .await?;
        // The sandbox is on worker `(attempts - 1) % 2`: move it to the other.
        let target = &p.workers[attempts % 2];
        let target_url = p.worker_url(target).await?;
        let target_id: WorkerId = target.parse().map_err(|_| "worker id")?;
        if let Some(t) = one(&edge, &sdk, &id, &target_id, &target_url).await? {
            times.push(t);
        }
    }
    let _ = edge.delete_sandbox(&id).await;
    if times.is_empty() {
        return Err("P8: every run saw another install on the target worker".into());
    }
    times.sort_by(f64::total_cmp);
    let worst = quantile(&times, 1.0);
    Ok(vec![
        Row::new(
            "P8",
            &format!(
                "{} terminals + {} watches on N: N+1 installed → last stream closed (max of {})",
                STREAMS,
                STREAMS,
                times.len()
            ),
            format!("{worst:.1} ms (p50 {:.1} ms)", quantile(&times, 0.5)),
            "≤ 100 ms",
        )
        .ratio(worst / 100.0)
        .pass(worst <= 100.0),
    ])
}
