//! Issue #3 benchmarks with the real agent and bridge: launch-to-first-exec of one
//! sandbox (jail + verified bridge + `true` through it), sequentially and with 50
//! launched at once (p50 / p99), at the substrate (no worker daemon).
//!
//! The host-side memory of idle sandboxes (P7) is `space bench p7`, which counts the
//! worker too, on a real `space up`.
//!
//! `cargo bench -p space-worker --bench sandbox_footprint` (root).

#![allow(clippy::print_stdout)] // A bench binary reports on stdout.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::guest::{Activation, ExecSpec};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{Limits, SandboxHandle, TemplateSpec};

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
        generation: Generation(1),
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
    let (handle, bridge) = launch::launch(
        driver,
        bins,
        data,
        &activation,
        limits,
        &TemplateSpec::Default,
    )
    .expect("launch");
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

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: sandbox_footprint needs root (namespaces, mounts, cgroups)");
        return;
    }
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

    space_worker::substrate::jail::disk::unmount_volume(&data);
}
