//! P5 and P6 through the public API (the SDK):
//! - pause and resume in place (a signed update, the freezer, the record persisted);
//! - migrate a sandbox with a 64 MiB filesystem to the other worker and back (freeze,
//!   archive, signed digest, transfer, unpack, the new execution acknowledged, the
//!   source retired);
//! - the first read after each migration through a route cache that still names the
//!   old execution (the edge's, and the SDK's in direct mode): one 421, one coalesced
//!   resolve, one rebuilt attempt; its time over a warm read's.

use std::time::Instant;

use space_client::Client;
use space_identity::{SandboxId, WorkerId};

use super::platform::Platform;
use super::row::{Row, quantile};

/// Pause/resume pairs timed.
const PAUSES: usize = 20;
/// Migrations timed (alternating between two workers).
const MIGRATIONS: usize = 6;
/// Warm reads before each migration, per client.
const WARM_READS: usize = 5;
const SMALL: &str = "/root/4k";

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A read of `SMALL` through `client`, timed (ms).
async fn timed_read(client: &Client, id: &SandboxId) -> Result<f64, String> {
    let t = Instant::now();
    let data = client
        .read_file(id, SMALL)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let took = ms(t);
    if data.len() != 4096 {
        return Err(format!("read {} bytes, not 4096", data.len()));
    }
    Ok(took)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// P5 in place: pause and resume times (ms).
async fn in_place(edge: &Client) -> Result<(Vec<f64>, Vec<f64>), String> {
    let id = edge
        .create_sandbox(&Default::default())
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..PAUSES {
        let t = Instant::now();
        edge.pause(&id).await.map_err(|e| format!("pause: {e}"))?;
        pauses.push(ms(t));
        let t = Instant::now();
        edge.resume(&id, None)
            .await
            .map_err(|e| format!("resume: {e}"))?;
        resumes.push(ms(t));
    }
    let _ = edge.delete_sandbox(&id).await;
    Ok((sorted(pauses), sorted(resumes)))
}

/// What the migrations measured (ms each).
#[derive(Default)]
struct Moves {
    migrations: Vec<f64>,
    edge_warm: Vec<f64>,
    edge_stale: Vec<f64>,
    sdk_warm: Vec<f64>,
    sdk_stale: Vec<f64>,
}

async fn migrations(p: &Platform, edge: &Client, sdk: &Client) -> Result<Moves, String> {
    if p.workers.len() < 2 {
        return Err("P5 migrate needs two workers".into());
    }
    let workers: Vec<WorkerId> = p.workers[..2]
        .iter()
        .map(|w| w.parse().map_err(|_| format!("worker id {w}")))
        .collect::<Result<_, _>>()?;
    let id = edge
        .create_sandbox(&space_client::CreateSandbox {
            worker: Some(workers[0].clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    let fill = space_client::exec(["sh", "-c", "head -c 67108864 /dev/urandom > /root/blob"]);
    let out = edge
        .exec(&id, &fill)
        .await
        .map_err(|e| format!("64 MiB fill: {e}"))?;
    if out.exit_code != 0 {
        return Err(format!("64 MiB fill: {out:?}"));
    }
    edge.write_file(&id, SMALL, vec![1u8; 4096])
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut m = Moves::default();
    for i in 0..MIGRATIONS {
        // Both caches warm for the current execution.
        for _ in 0..WARM_READS {
            m.edge_warm.push(timed_read(edge, &id).await?);
            m.sdk_warm.push(timed_read(sdk, &id).await?);
        }
        let target = &workers[(i + 1) % 2];
        let t = Instant::now();
        let s = edge
            .migrate(&id, target)
            .await
            .map_err(|e| format!("migrate to {target}: {e}"))?;
        m.migrations.push(ms(t));
        if s.execution.as_ref().map(|e| &e.worker) != Some(target) {
            return Err(format!("migrate to {target} answered {:?}", s.execution));
        }
        m.edge_stale.push(timed_read(edge, &id).await?);
        m.sdk_stale.push(timed_read(sdk, &id).await?);
    }
    let _ = edge.delete_sandbox(&id).await;
    Ok(m)
}

/// P5 and P6 on `p` (two workers).
pub async fn run(p: &Platform) -> Result<Vec<Row>, String> {
    let edge = p.client(false);
    let sdk = p.client(true);
    eprintln!("P5: {PAUSES} pauses and resumes in place");
    let (pauses, resumes) = in_place(&edge).await?;
    eprintln!("P5/P6: {MIGRATIONS} migrations of a sandbox with a 64 MiB filesystem");
    let m = migrations(p, &edge, &sdk).await?;
    let (pause, resume) = (quantile(&pauses, 0.5), quantile(&resumes, 0.5));
    let moves = sorted(m.migrations);
    let migrate = quantile(&moves, 0.5);
    let stale_row = |what: &str, warm: Vec<f64>, stale: Vec<f64>| {
        let (warm, stale) = (quantile(&sorted(warm), 0.5), quantile(&sorted(stale), 0.5));
        let added = stale - warm;
        Row::new(
            "P6",
            what,
            format!("+{added:.2} ms (p50 {stale:.2} vs warm {warm:.2} ms)"),
            "≤ 5 ms added",
        )
        .ratio(added / 5.0)
        .pass(added <= 5.0)
    };
    Ok(vec![
        Row::new(
            "P5",
            "pause in place through the public API",
            format!("p50 {pause:.2} ms"),
            "≤ 10 ms",
        )
        .ratio(pause / 10.0)
        .pass(pause <= 10.0),
        Row::new(
            "P5",
            "resume in place",
            format!("p50 {resume:.2} ms"),
            "≤ 10 ms",
        )
        .ratio(resume / 10.0)
        .pass(resume <= 10.0),
        Row::new(
            "P5",
            "migrate, 64 MiB filesystem, to the other worker",
            format!(
                "p50 {migrate:.0} ms, max {:.0} ms ({MIGRATIONS} moves)",
                quantile(&moves, 1.0)
            ),
            "≤ 1 s",
        )
        .ratio(migrate / 1000.0)
        .pass(migrate <= 1000.0),
        stale_row(
            "first read after a migration, the edge's route cache stale",
            m.edge_warm,
            m.edge_stale,
        ),
        stale_row(
            "the same in SDK direct mode (the SDK's own route cache stale)",
            m.sdk_warm,
            m.sdk_stale,
        ),
    ])
}
