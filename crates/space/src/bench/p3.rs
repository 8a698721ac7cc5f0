//! P3: a 4 KiB file read end to end (client → edge → worker → bridge → agent in the
//! jail), sequential p50, against a direct call to a guest agent on a pooled,
//! handshaken connection measured in the same run; and reads per second with 16
//! concurrent clients. The SDK's direct mode (a capability from the edge once, then
//! straight to the worker) is measured alongside.
//!
//! Sequential reads run on a one-thread runtime of their own, like the blocking
//! baseline: on a multi-thread runtime the measuring client's own wake-ups cross CPUs
//! and add tens of microseconds to every round trip on a small machine.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::Activation;

use super::platform::Platform;
use super::row::{Row, quantile};

/// Sequential reads timed on each path (after 200 not timed).
const READS: usize = 2000;
/// Concurrent clients for the throughput figure.
const CLIENTS: usize = 16;
/// How long the throughput figure runs.
const THROUGHPUT_FOR: Duration = Duration::from_secs(5);
/// The file read.
const FILE: &str = "/root/4k.bin";

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    // An all-zero value only makes the baseline's sandbox ID and secret predictable.
    let _ = rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty());
    out
}

/// A guest agent outside any jail (the `spaced-guest` next to this executable),
/// killed on drop.
struct DirectAgent {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for DirectAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The baseline: sorted times (ms) of `READS` 4 KiB reads from a guest agent
/// on a pooled, handshaken connection with a blocking client.
fn direct_agent_reads() -> Result<Vec<f64>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(1),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let act = dir.path().join("activation.json");
    std::fs::write(&act, activation.encode()).map_err(|e| format!("activation: {e}"))?;
    let file = dir.path().join("4k.bin");
    std::fs::write(&file, [7u8; 4096]).map_err(|e| format!("file: {e}"))?;
    let socket = dir.path().join("agent.sock");
    let agent = crate::daemons::own_dir()?.join("spaced-guest");
    let child = Command::new(&agent)
        .args(["serve", "--listen"])
        .arg(&socket)
        .arg("--activation-file")
        .arg(&act)
        .arg("--home")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", agent.display()))?;
    let _agent = DirectAgent { child, _dir: dir };
    wait_for(&socket)?;
    let stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| format!("connect to the agent: {e}"))?;
    let mut conn = AgentConnection::handshake_verified(stream, random(), &activation.secret)
        .map_err(|e| format!("agent handshake: {e}"))?;
    let path = file.to_str().ok_or("temporary path is not UTF-8")?;
    let mut times = Vec::with_capacity(READS);
    for i in 0..READS + 200 {
        let t = Instant::now();
        let data = conn
            .read_file(path, 1 << 20)
            .map_err(|e| format!("agent read: {e}"))?;
        if i >= 200 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if data.len() != 4096 {
            return Err(format!("the agent read {} bytes, not 4096", data.len()));
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

fn wait_for(socket: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err("the direct agent did not listen within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Sorted times (ms) of `READS` sequential reads of `FILE` in `sandbox` through
/// `client`, on a one-thread runtime of its own.
fn sequential(client: space_client::Client, sandbox: SandboxId) -> Result<Vec<f64>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async {
        let mut times = Vec::with_capacity(READS);
        for i in 0..READS + 200 {
            let t = Instant::now();
            let data = client
                .read_file(&sandbox, FILE)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if i >= 200 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            if data.len() != 4096 {
                return Err(format!("read {} bytes, not 4096", data.len()));
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times)
    })
}

/// Reads per second with `CLIENTS` concurrent tasks sharing `client`, and the
/// failures (count, first message).
async fn throughput(client: &space_client::Client, sandbox: SandboxId) -> (f64, u64, String) {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + THROUGHPUT_FOR;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, done) = (client.clone(), Arc::clone(&done));
            tokio::spawn(async move {
                let (mut failed, mut first) = (0u64, String::new());
                while Instant::now() < until {
                    match client.read_file(&sandbox, FILE).await {
                        Ok(d) if d.len() == 4096 => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(d) => {
                            failed += 1;
                            first = format!("read {} bytes", d.len());
                        }
                        Err(e) => {
                            failed += 1;
                            if first.is_empty() {
                                first = e.to_string();
                            }
                        }
                    }
                }
                (failed, first)
            })
        })
        .collect();
    let (mut failed, mut first) = (0, String::new());
    for t in tasks {
        if let Ok((f, m)) = t.await {
            failed += f;
            if first.is_empty() {
                first = m;
            }
        }
    }
    let ops = done.load(Ordering::Relaxed) as f64 / THROUGHPUT_FOR.as_secs_f64();
    (ops, failed, first)
}

fn ops_text(ops: f64, failed: u64, first: &str) -> String {
    if failed == 0 {
        format!("{ops:.0} ops/s")
    } else {
        format!("{ops:.0} ops/s ({failed} failed: {first})")
    }
}

/// P3 on `p`.
pub async fn run(p: &Platform) -> Result<Vec<Row>, String> {
    let edge = p.client(false);
    let sdk = p.client(true);
    let sandbox = edge
        .create_sandbox(&Default::default())
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    edge.write_file(&sandbox, FILE, vec![7u8; 4096])
        .await
        .map_err(|e| format!("write {FILE}: {e}"))?;
    eprintln!("P3: {READS} reads from a guest agent directly (baseline)");
    let direct = tokio::task::spawn_blocking(direct_agent_reads)
        .await
        .map_err(|e| format!("baseline: {e}"))??;
    eprintln!("P3: {READS} reads through the edge");
    let c = edge.clone();
    let through_edge = tokio::task::spawn_blocking(move || sequential(c, sandbox))
        .await
        .map_err(|e| format!("edge reads: {e}"))??;
    eprintln!("P3: {READS} reads through the SDK's direct mode");
    let c = sdk.clone();
    let direct_mode = tokio::task::spawn_blocking(move || sequential(c, sandbox))
        .await
        .map_err(|e| format!("direct-mode reads: {e}"))??;
    eprintln!("P3: {CLIENTS} concurrent clients through the edge, then in direct mode");
    let (edge_ops, edge_failed, edge_first) = throughput(&edge, sandbox).await;
    let (sdk_ops, sdk_failed, sdk_first) = throughput(&sdk, sandbox).await;
    let _ = edge.delete_sandbox(&sandbox).await;

    let base = quantile(&direct, 0.5);
    let e2e = quantile(&through_edge, 0.5);
    let dm = quantile(&direct_mode, 0.5);
    let p99 = |v: &[f64]| quantile(v, 0.99);
    Ok(vec![
        Row::new(
            "P3",
            "4 KiB read, direct to a guest agent, pooled connection (baseline)",
            format!("p50 {base:.3} ms, p99 {:.3} ms", p99(&direct)),
            "-",
        ),
        Row::new(
            "P3",
            "4 KiB read, client → edge → worker → bridge → guest",
            format!("p50 {e2e:.3} ms, p99 {:.3} ms", p99(&through_edge)),
            "p50 ≤ 3 × direct",
        )
        .ratio(e2e / base)
        .pass(e2e <= 3.0 * base),
        Row::new(
            "P3",
            "4 KiB read, SDK direct mode: client → worker → bridge → guest",
            format!("p50 {dm:.3} ms, p99 {:.3} ms", p99(&direct_mode)),
            "(information) 3 × direct",
        )
        .ratio(dm / base),
        Row::new(
            "P3",
            "4 KiB reads through the edge, 16 concurrent clients",
            ops_text(edge_ops, edge_failed, &edge_first),
            "≥ 10,000 ops/s",
        )
        .ratio(edge_ops / 10_000.0)
        .pass(edge_ops >= 10_000.0 && edge_failed == 0),
        Row::new(
            "P3",
            "4 KiB reads in SDK direct mode, 16 concurrent clients",
            ops_text(sdk_ops, sdk_failed, &sdk_first),
            "(information) 10,000 ops/s",
        )
        .ratio(sdk_ops / 10_000.0),
    ])
}
