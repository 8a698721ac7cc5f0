//! Issue #18 benchmark: the `vm` substrate under QEMU with the real agent and bridge,
//! 256 MiB of guest RAM and a 1 GiB disk: cold boot to first exec, memory snapshot,
//! what a migration moves (the snapshot packed keeping the disk's holes and unpacked
//! as a kept layer), restore from it to first exec (a new execution), their ratio,
//! and the host memory an idle VM sandbox
//! costs beyond its guest RAM (PSS of QEMU outside the guest RAM mapping, plus the
//! bridge's PSS). Reports the accelerator.
//!
//! `cargo bench -p space-worker --bench vm_lifecycle` (root; needs qemu-system-x86_64,
//! a static busybox, and the guest kernel in `target/space-vm/kernel`, prepared on the
//! first run with `space vm setup`'s code).

#![allow(clippy::print_stdout)] // A bench binary reports on stdout.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::guest::{Activation, ExecSpec};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::substrate::vm::{QemuDriver, VmConfig, kernel};
use space_worker::substrate::{AgentCommand, LaunchSpec, Limits, TemplateSpec};

const RAM: u64 = 256 << 20;
const RUNS: usize = 5;

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `Pss:` of `/proc/PID/smaps_rollup`, and the Pss of the mapping `RAM` bytes long
/// (the guest's RAM), in KiB.
fn pss_kib(pid: i32, ram_mapping: Option<u64>) -> (u64, u64) {
    let field = |text: &str, key: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let total = field(&rollup, "Pss:");
    let Some(ram) = ram_mapping else {
        return (total, 0);
    };
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut guest = 0;
    let mut in_ram = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                in_ram = b - a == ram;
                continue;
            }
        }
        if in_ram && line.starts_with("Pss:") {
            guest += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    (total, guest)
}

fn main() {
    if !rustix::process::geteuid().is_root() || !Path::new("/usr/bin/qemu-system-x86_64").is_file()
    {
        println!("vm_lifecycle: SKIPPED (needs root and qemu-system-x86_64)");
        return;
    }
    let kernel_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/space-vm/kernel");
    kernel::setup(&kernel_dir, None, &mut |s| println!("vm setup: {s}")).expect("guest kernel");
    let data = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let t = files.path().join("template");
    std::fs::create_dir_all(t.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", t.join("bin/busybox")).expect("a static busybox");
    for tool in ["sh", "true", "cat"] {
        symlink("busybox", t.join("bin").join(tool)).unwrap();
    }
    for d in ["root", "tmp", "etc"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    std::fs::write(t.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    let template = TemplateSpec::Directory {
        lower_dir: t,
        read_only_binds: Vec::new(),
    };
    let agent = space_testkit::bin::static_agent();
    let (accel, why) = space_worker::substrate::vm::detect_accel(
        Path::new("/usr/bin/qemu-system-x86_64"),
        &kernel_dir,
        data.path(),
    );
    println!("vm_lifecycle: accelerator {} ({why})", accel.as_str());
    let driver = QemuDriver::new(
        VmConfig {
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            kernel_dir: kernel_dir.clone(),
            agent: agent.clone(),
            accel,
            cgroup_parent: format!("space-bench-vm-{}", std::process::id()),
            uid_ranges: None,
            transport: space_worker::substrate::vm::TransportChoice::Serial,
        },
        data.path(),
    )
    .expect("the QEMU driver");
    let bins = Binaries {
        agent: agent.clone(),
        bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
    };
    let limits = Limits {
        memory_bytes: Some(RAM),
        disk_bytes: Some(1 << 30),
        ..Limits::default()
    };
    // The first exec answers the guest's uptime (seconds): a restored guest's goes on
    // from the snapshot's, a guest that booted afresh starts again near zero.
    let first_exec = |bridge: &space_worker::daemon::records::BridgeRecord, a: &Activation| {
        let mut c = spaced_host::connect(&launch::bridge_target(bridge, a)).expect("connect");
        let out = c
            .exec(ExecSpec::shell("read up idle < /proc/uptime; echo $up"))
            .expect("exec");
        let up = String::from_utf8_lossy(&out.stdout);
        up.trim().parse::<f64>().expect("the guest's uptime")
    };
    let (mut cold, mut snap_t, mut restore_t) = (Vec::new(), Vec::new(), Vec::new());
    let (mut transfer_t, mut archive_bytes) = (Vec::new(), Vec::new());
    let mut overhead = Vec::new();
    for run in 0..RUNS {
        let a = Activation {
            sandbox: SandboxId::from_bytes(random()),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes(random()),
            activation: 1,
            secret: random(),
        };
        let t0 = Instant::now();
        let (handle, bridge) =
            launch::launch(&driver, &bins, data.path(), &a, limits, &template).expect("launch");
        first_exec(&bridge, &a);
        cold.push(t0.elapsed());
        // Idle host cost, once the guest settled.
        std::thread::sleep(Duration::from_secs(1));
        let (qemu, guest) = pss_kib(handle.init.pid, Some(RAM));
        let (bridge_pss, _) = pss_kib(bridge.process.pid as i32, None);
        overhead.push((qemu - guest + bridge_pss, qemu, guest, bridge_pss));
        let dir = files.path().join(format!("snap-{run}"));
        let up_at_snapshot = first_exec(&bridge, &a);
        let t1 = Instant::now();
        let snap = driver.snapshot(&handle, &dir).expect("snapshot");
        snap_t.push(t1.elapsed());
        drop(snap);
        // What a migration moves: the snapshot packed keeping the disk's holes, and
        // unpacked as the sandbox's kept layer where it resumes.
        let t_move = Instant::now();
        let (archive, packed) = space_worker::daemon::snapshot::pack_to_temp_keeping_holes(
            &dir,
            &files.path().join("spool"),
            space_worker::daemon::snapshot::MAX_ARCHIVE,
        )
        .expect("pack");
        let kept = launch::kept_layer(data.path(), &a.sandbox);
        std::fs::create_dir_all(&kept).expect("kept layer");
        space_worker::daemon::snapshot::unpack_keeping_holes(
            std::io::BufReader::new(archive),
            &kept.join("upper"),
        )
        .expect("unpack");
        // As the receiving VM worker marks it: only a marked kept layer is restored
        // (an unmarked one is booted from, as after a crash).
        std::fs::write(
            kept.join(space_worker::substrate::vm::snapshot::RECEIVED_MARK),
            b"",
        )
        .expect("mark the kept layer");
        transfer_t.push(t_move.elapsed());
        archive_bytes.push(packed.size);
        launch::teardown(
            &driver,
            data.path(),
            Some(&handle),
            Some(&bridge),
            Layer::Discard,
        );
        let b = Activation {
            generation: Generation(2),
            execution_id: ExecutionId::from_bytes(random()),
            secret: random(),
            ..a.clone()
        };
        let spec = LaunchSpec {
            key: launch::execution_key(&b.sandbox, &b.execution_id),
            data_dir: data.path().to_path_buf(),
            template: template.clone(),
            limits,
            agent: AgentCommand::spaced_guest(&agent),
            activation: b.encode(),
            hostname: None,
            initial_upper: Some(kept),
        };
        // Restored as a migration's target does: a launch that finds the snapshot in
        // the kept layer.
        let t2 = Instant::now();
        let handle = space_worker::substrate::Substrate::launch(&driver, &spec).expect("restore");
        let bridge = launch::start_bridge(&bins, &handle, &b).expect("bridge");
        let up_restored = first_exec(&bridge, &b);
        restore_t.push(t2.elapsed());
        // A measure of a fresh boot would pass for a restore's: refuse it.
        assert!(
            up_restored >= up_at_snapshot,
            "the guest booted afresh instead of being restored (uptime {up_restored} s, {up_at_snapshot} s at the snapshot)"
        );
        launch::teardown(
            &driver,
            data.path(),
            Some(&handle),
            Some(&bridge),
            Layer::Discard,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (c, s, r) = (median(cold), median(snap_t), median(restore_t));
    println!(
        "vm_lifecycle: accelerator {}, guest RAM {} MiB, {RUNS} runs (medians)",
        accel.as_str(),
        RAM >> 20
    );
    println!("cold boot to first exec: {:.0} ms", ms(c));
    println!("memory snapshot: {:.0} ms", ms(s));
    println!("restore to first exec: {:.0} ms", ms(r));
    println!("restore / cold boot: {:.2} (target <= 0.5)", ms(r) / ms(c));
    let t = median(transfer_t);
    archive_bytes.sort_unstable();
    println!(
        "migration's archive (memory + disk of {} MiB, holes kept): {:.1} MiB; pack + unpack {:.0} ms",
        limits.disk_bytes.unwrap_or(0) >> 20,
        archive_bytes[archive_bytes.len() / 2] as f64 / f64::from(1 << 20),
        ms(t)
    );
    println!(
        "migrate on one host (snapshot + pack + unpack + restore to first exec, no network): {:.0} ms",
        ms(s) + ms(t) + ms(r)
    );
    overhead.sort();
    let (o, qemu, guest, bridge) = overhead[overhead.len() / 2];
    println!(
        "idle host overhead beyond guest RAM: {:.1} MiB (QEMU PSS {:.1} MiB of which guest RAM {:.1} MiB; bridge {:.1} MiB; target <= 10 MiB)",
        o as f64 / 1024.0,
        qemu as f64 / 1024.0,
        guest as f64 / 1024.0,
        bridge as f64 / 1024.0
    );
    let _ = driver;
    if let Ok(h) = space_worker::substrate::jail::cgroup::CgroupHierarchy::detect() {
        for dir in h.parent_dirs(&format!("space-bench-vm-{}", std::process::id())) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
