//! P7: idle sandboxes on one worker. A `space up` with one worker and no pools; the
//! memory of the worker and of every process below it (each sandbox's bridge, jail
//! init and agent: the worker is their subreaper) is summed before and after N
//! sandboxes are created through the public API and have each run a command, and
//! divided by N. PSS (shared pages divided among the processes sharing them) is what
//! N sandboxes cost; RSS counts the shared binaries once per process; the host's
//! `MemAvailable` drop includes the kernel's share (page tables, namespaces, overlay
//! and cgroup state, socket buffers) and whatever else the machine did meanwhile.

use std::collections::HashMap;
use std::time::Duration;

use space_client::Client;
use space_identity::SandboxId;

use super::platform::{Platform, PlatformOptions};
use super::row::Row;

/// The memory the projection is made for.
const HOST_BYTES: f64 = 24.0 * 1024.0 * 1024.0 * 1024.0;
/// Creates in flight at once while filling the worker.
const PARALLEL: usize = 8;

/// (RSS, PSS) of one process in KiB, from `/proc/PID/smaps_rollup` (0 when gone).
fn memory_kib(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Pss:"))
}

/// `MemAvailable` of the host in KiB.
fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `root` and every process below it (by parent PID, from `/proc/*/stat`).
fn process_tree(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend_from_slice(c);
        }
        i += 1;
    }
    out
}

/// Processes, summed RSS and PSS (KiB) of the worker's tree.
fn tree_memory(worker: i32) -> (usize, u64, u64) {
    let pids = process_tree(worker);
    let (rss, pss) = pids.iter().fold((0, 0), |(r, p), pid| {
        let (a, b) = memory_kib(*pid);
        (r + a, p + b)
    });
    (pids.len(), rss, pss)
}

/// Creates `n` sandboxes, `PARALLEL` at a time, each running `true` once.
async fn fill(client: &Client, n: usize) -> Result<Vec<SandboxId>, String> {
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let batch = PARALLEL.min(n - ids.len());
        let tasks: Vec<_> = (0..batch)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let s = client
                        .create_sandbox(&Default::default())
                        .await
                        .map_err(|e| format!("create: {e}"))?;
                    let out = client
                        .exec(&s.id, &space_client::exec(["true"]))
                        .await
                        .map_err(|e| format!("exec: {e}"))?;
                    if out.exit_code != 0 {
                        return Err(format!("`true`: {out:?}"));
                    }
                    Ok::<_, String>(s.id)
                })
            })
            .collect();
        for t in tasks {
            ids.push(t.await.map_err(|e| format!("create task: {e}"))??);
        }
        if ids.len() % 50 < PARALLEL {
            eprintln!("P7: {} of {n} sandboxes", ids.len());
        }
    }
    Ok(ids)
}

/// P7 with `n` idle sandboxes on a platform of its own.
pub async fn run(n: usize) -> Result<Vec<Row>, String> {
    let n = n.max(1);
    eprintln!("P7: {n} idle sandboxes on one worker (no pools)");
    let p = Platform::start(PlatformOptions {
        workers: 1,
        warm_pool: 0,
        standby: 0,
        env: vec![("SPACE_TENANT_SANDBOXES".into(), (n + 10).to_string())],
    })
    .await?;
    let measured = measure(&p, n).await;
    p.stop().await;
    measured
}

async fn measure(p: &Platform, n: usize) -> Result<Vec<Row>, String> {
    let worker = p.worker_pid("w1").ok_or("no process for worker w1")?;
    let client = p.client(true);
    // The worker settled, with no sandbox.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (procs_before, rss_before, pss_before) = tree_memory(worker);
    let available_before = mem_available_kib();
    let ids = fill(&client, n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (procs_after, rss_after, pss_after) = tree_memory(worker);
    let available_after = mem_available_kib();
    for id in &ids {
        let _ = client.delete_sandbox(id).await;
    }
    let per_mib = |kib: u64| kib as f64 / n as f64 / 1024.0;
    let pss = per_mib(pss_after.saturating_sub(pss_before));
    let rss = per_mib(rss_after.saturating_sub(rss_before));
    let spent = per_mib(available_before.saturating_sub(available_after));
    let procs = (procs_after.saturating_sub(procs_before)) as f64 / n as f64;
    // The projection takes the larger of what the processes and the host lost.
    let per_sandbox = pss.max(spent).max(f64::EPSILON) * 1024.0 * 1024.0;
    let fit = (HOST_BYTES - pss_before as f64 * 1024.0) / per_sandbox;
    Ok(vec![
        Row::new(
            "P7",
            &format!(
                "host-side overhead per idle sandbox, PSS of worker + bridge + jail init + agent ({n} sandboxes, {procs:.1} processes each)"
            ),
            format!("{pss:.2} MiB"),
            "≤ 3 MiB",
        )
        .ratio(pss / 3.0)
        .pass(pss <= 3.0),
        Row::new(
            "P7",
            "the same as a sum of RSS (shared pages counted per process)",
            format!("{rss:.2} MiB"),
            "-",
        ),
        Row::new(
            "P7",
            "host MemAvailable drop per sandbox (kernel included; noisy)",
            format!("{spent:.2} MiB"),
            "-",
        ),
        Row::new(
            "P7",
            "idle sandboxes that fit in 24 GiB (the larger of PSS and MemAvailable drop)",
            format!("{fit:.0}"),
            "≥ 1,000",
        )
        .ratio(fit / 1000.0)
        .pass(fit >= 1000.0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_tree_counts_a_grandchild_and_its_memory() {
        // sh (child) → sleep (grandchild): both below this process.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let me = std::process::id() as i32;
        let sh = child.id() as i32;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let tree = loop {
            let tree = process_tree(me);
            if tree.len() >= 3 || std::time::Instant::now() > deadline {
                break tree;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree[0], me);
        assert!(tree.contains(&sh), "{tree:?}");
        assert!(tree.len() >= 3, "the grandchild is missing: {tree:?}");
        let (rss, pss) = memory_kib(me);
        assert!(rss > 0 && pss > 0 && pss <= rss, "rss {rss} pss {pss}");
        assert_eq!(memory_kib(-1), (0, 0));
    }
}
