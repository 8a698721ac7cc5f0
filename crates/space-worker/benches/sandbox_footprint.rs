//! Issue #3 benchmarks with the real agent and bridge:
//! - launch-to-first-exec of one sandbox (jail + verified bridge + `true` through it),
//!   sequentially and with 50 launched at once (p50 / p99);
//! - host-side memory per idle sandbox (bridge + jail init + agent) with N sandboxes
//!   running: RSS and PSS (proportional: shared pages divided among sharers).
//!
//! `cargo bench -p space-worker --bench sandbox_footprint` (root; `SPACE_BENCH_SANDBOXES`
//! sets N, default 100).

#![allow(clippy::print_stdout)] // A bench binary reports on stdout.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, SandboxId};
use space_proto::guest::{Activation, ExecSpec};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{Limits, SandboxHandle};

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    out
}

struct Launched {
    handle: SandboxHandle,
    bridge: space_worker::daemon::records::BridgeRecord,
}

fn launch_and_first_exec(
    driver: &JailDriver,
    bins: &Binaries,
    data: &Path,
) -> (Launched, Duration) {
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: 1,
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let start = Instant::now();
    // As `space up` runs them: a user namespace (the driver's default) and a disk
    // limit on the worker's disk volume (where one can be mounted).
    let limits = Limits {
        disk_bytes: Some(256 << 20),
        ..Limits::default()
    };
    let (handle, bridge) = launch::launch(driver, bins, data, &activation, limits).expect("launch");
    let mut conn =
        spaced_host::connect(&launch::bridge_target(&bridge, &activation)).expect("connect");
    let out = conn.exec(ExecSpec::command(["true"])).expect("exec");
    assert!(matches!(
        out.status.outcome,
        space_proto::guest::ExitOutcome::Code(0)
    ));
    (Launched { handle, bridge }, start.elapsed())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// (RSS, PSS) in KiB from /proc/PID/smaps_rollup.
fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Pss:"))
}

/// `MemAvailable` from /proc/meminfo, in KiB.
fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: sandbox_footprint needs root (namespaces, mounts, cgroups)");
        return;
    }
    // cargo bench passes `--bench`; ignore arguments.
    let n: usize = std::env::var("SPACE_BENCH_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let bins = Binaries {
        agent: space_testkit::workspace_bin("spaced-guest", "spaced-guest"),
        bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
    };
    let mut config = JailConfig::new(space_testkit::workspace_bin("space-jail", "space-jail"));
    config.cgroup_parent = "space-bench-footprint".into();
    let driver = Arc::new(JailDriver::new(config).expect("jail driver"));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_path_buf();
    let volume = space_worker::substrate::jail::disk::ensure_volume(&data, Some(16 << 30))
        .expect("disk volume");
    println!(
        "user namespaces: {}; disk volume: {volume:?}",
        driver.uses_user_namespaces()
    );
    let teardown = |all: Vec<Launched>| {
        for l in all {
            launch::teardown(
                &*driver,
                &data,
                Some(&l.handle),
                Some(&l.bridge),
                Layer::Discard,
            );
        }
    };

    // Warm the template and caches.
    let (w, _) = launch_and_first_exec(&driver, &bins, &data);
    teardown(vec![w]);

    // Sequential launch-to-first-exec.
    let mut seq = Vec::new();
    let mut times = Vec::new();
    for _ in 0..20 {
        let (l, t) = launch_and_first_exec(&driver, &bins, &data);
        seq.push(l);
        times.push(t);
    }
    teardown(seq);
    times.sort();
    println!(
        "launch_to_first_exec sequential (20): p50 {:.1} ms, p99 {:.1} ms",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3
    );

    // 50 at once.
    let start = Instant::now();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let (driver, bins, data) = (Arc::clone(&driver), bins.clone(), data.clone());
            std::thread::spawn(move || launch_and_first_exec(&driver, &bins, &data))
        })
        .collect();
    let mut concurrent = Vec::new();
    let mut times = Vec::new();
    for h in handles {
        let (l, t) = h.join().expect("launch thread");
        concurrent.push(l);
        times.push(t);
    }
    let wall = start.elapsed();
    teardown(concurrent);
    times.sort();
    println!(
        "launch_to_first_exec 50 at once: p50 {:.1} ms, p99 {:.1} ms, all done in {:.1} ms",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3
    );

    // N idle sandboxes.
    let available_before = mem_available_kib();
    let mut idle = Vec::new();
    for _ in 0..n {
        idle.push(launch_and_first_exec(&driver, &bins, &data).0);
    }
    std::thread::sleep(Duration::from_secs(2));
    let (mut rss, mut pss) = (0u64, 0u64);
    let (mut bridge_pss, mut init_pss, mut agent_pss) = (0u64, 0u64, 0u64);
    for l in &idle {
        let b = memory_kib(l.bridge.process.pid);
        let i = memory_kib(l.handle.init.pid as u32);
        let a = l.handle.agent.map_or((0, 0), |a| memory_kib(a.pid as u32));
        rss += b.0 + i.0 + a.0;
        pss += b.1 + i.1 + a.1;
        bridge_pss += b.1;
        init_pss += i.1;
        agent_pss += a.1;
    }
    let per = |kib: u64| kib as f64 / n as f64 / 1024.0;
    // Everything the host spent, kernel included (page tables, namespaces, overlay
    // and cgroup state, socket buffers); noisy, since other processes move it too.
    let spent = available_before.saturating_sub(mem_available_kib());
    println!(
        "idle sandboxes: {n}; host MemAvailable drop {:.2} MiB per sandbox",
        per(spent)
    );
    println!(
        "idle sandboxes: {n}; per sandbox RSS {:.2} MiB, PSS {:.2} MiB (bridge {:.2}, jail init {:.2}, agent {:.2} MiB PSS)",
        per(rss),
        per(pss),
        per(bridge_pss),
        per(init_pss),
        per(agent_pss)
    );
    teardown(idle);
    space_worker::substrate::jail::disk::unmount_volume(&data);
}
