//! Issue #18 benchmark: the `vm` substrate with the real agent and bridge, 256 MiB of
//! guest RAM and a 1 GiB disk, under QEMU (KVM where a stock kernel boots under it,
//! else software emulation, reported) and then under Firecracker where a `firecracker`
//! binary and a KVM that boots the guest kernel are there (skipped saying so
//! otherwise): cold boot to first exec, memory snapshot, what a migration moves (the
//! snapshot packed keeping the disk's holes and unpacked as a kept layer), restore
//! from it to first exec (a new execution), their ratio, and the host memory an idle
//! VM sandbox costs beyond its guest RAM (the VMM's PSS outside the guest RAM mapping,
//! plus the bridge's) — for one VM alone, and per VM of four idling together (files
//! the VMMs map are shared among them, as on a worker).
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
use space_worker::substrate::vmm::VmDriver;
use space_worker::substrate::{AgentCommand, LaunchSpec, Limits, Substrate, TemplateSpec};

const RAM: u64 = 256 << 20;
const RUNS: usize = 5;

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    out
}

/// A new sandbox's first activation.
fn new_sandbox() -> Activation {
    Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(1),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A process's proportional set size (KiB), split: the guest's RAM (the mapping `RAM`
/// bytes long, when asked), and beyond it what is anonymous (the process's own) and
/// what maps files (shared with every process mapping them: the binary, its libraries,
/// the initramfs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pss {
    beyond: u64,
    anon: u64,
    file: u64,
    guest: u64,
}

fn pss_kib(pid: i32, ram_mapping: Option<u64>) -> Pss {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out = Pss::default();
    let (mut in_ram, mut file_backed) = (false, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                in_ram = ram_mapping == Some(b - a);
                file_backed = words.nth(4).is_some_and(|path| path.starts_with('/'));
                continue;
            }
        }
        if line.starts_with("Pss:") {
            let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if in_ram {
                out.guest += kib;
            } else if file_backed {
                out.file += kib;
            } else {
                out.anon += kib;
            }
        }
    }
    out.beyond = out.anon + out.file;
    out
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
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
    let bench = Bench {
        bins,
        data: data.path().to_path_buf(),
        files: files.path().to_path_buf(),
        agent,
        limits,
        template,
    };
    let qemu = VmDriver::Qemu(std::sync::Arc::new(driver));
    measure(
        &bench,
        &qemu,
        &format!("QEMU, accelerator {}", accel.as_str()),
    );
    drop(qemu);
    match firecracker(&kernel_dir, &bench) {
        Ok(fc) => measure(&bench, &fc, "Firecracker, accelerator kvm"),
        Err(why) => println!(
            "vm_lifecycle: Firecracker SKIPPED (needs a `firecracker` binary on PATH or SPACE_FIRECRACKER, and a /dev/kvm that boots a stock kernel: {why})"
        ),
    }
    if let Ok(h) = space_worker::substrate::jail::cgroup::CgroupHierarchy::detect() {
        for dir in h.parent_dirs(&format!("space-bench-vm-{}", std::process::id())) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// What every measured VMM shares.
struct Bench {
    bins: Binaries,
    data: std::path::PathBuf,
    files: std::path::PathBuf,
    agent: std::path::PathBuf,
    limits: Limits,
    template: TemplateSpec,
}

/// The guest's uptime (seconds) by a first exec: a restored guest's goes on from the
/// snapshot's, a guest that booted afresh starts again near zero.
fn first_exec(bridge: &space_worker::daemon::records::BridgeRecord, a: &Activation) -> f64 {
    let mut c = spaced_host::connect(&launch::bridge_target(bridge, a)).expect("connect");
    let out = c
        .exec(ExecSpec::shell("read up idle < /proc/uptime; echo $up"))
        .expect("exec");
    let up = String::from_utf8_lossy(&out.stdout);
    up.trim().parse::<f64>().expect("the guest's uptime")
}

/// Boot, snapshot, migrate's parts and restore, [`RUNS`] times, and the idle
/// overhead, under `vmm` (`label` says which and its accelerator).
fn measure(b: &Bench, vmm: &VmDriver, label: &str) {
    let sub = vmm.substrate();
    let (bins, limits, template, agent) = (&b.bins, b.limits, &b.template, &b.agent);
    let (mut cold, mut snap_t, mut restore_t) = (Vec::new(), Vec::new(), Vec::new());
    let (mut transfer_t, mut archive_bytes) = (Vec::new(), Vec::new());
    let mut overhead = Vec::new();
    for run in 0..RUNS {
        let a = new_sandbox();
        let t0 = Instant::now();
        let (handle, bridge) =
            launch::launch(&*sub, bins, &b.data, &a, limits, template).expect("launch");
        first_exec(&bridge, &a);
        cold.push(t0.elapsed());
        // Idle host cost, once the guest settled.
        std::thread::sleep(Duration::from_secs(1));
        let qemu = pss_kib(handle.init.pid, Some(RAM));
        let bridge_pss = pss_kib(bridge.process.pid as i32, None).beyond;
        overhead.push((qemu.beyond + bridge_pss, qemu, bridge_pss));
        let dir = b.files.join(format!("snap-{run}"));
        let up_at_snapshot = first_exec(&bridge, &a);
        let t1 = Instant::now();
        let snap = vmm.snapshot(&handle, &dir).expect("snapshot");
        snap_t.push(t1.elapsed());
        drop(snap);
        // What a migration moves: the snapshot packed keeping the disk's holes, and
        // unpacked as the sandbox's kept layer where it resumes.
        let t_move = Instant::now();
        let (archive, packed) = space_worker::daemon::snapshot::pack_to_temp_keeping_holes(
            &dir,
            &b.files.join("spool"),
            space_worker::daemon::snapshot::MAX_ARCHIVE,
        )
        .expect("pack");
        let kept = launch::kept_layer(&b.data, &a.sandbox);
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
        launch::teardown(&*sub, &b.data, Some(&handle), Some(&bridge), Layer::Discard);
        let next = Activation {
            generation: Generation(2),
            execution_id: ExecutionId::from_bytes(random()),
            secret: random(),
            ..a.clone()
        };
        let spec = LaunchSpec {
            key: launch::execution_key(&next.sandbox, &next.execution_id),
            data_dir: b.data.clone(),
            template: template.clone(),
            limits,
            agent: AgentCommand::spaced_guest(agent),
            activation: next.encode(),
            hostname: None,
            initial_upper: Some(kept),
        };
        // Restored as a migration's target does: a launch that finds the snapshot in
        // the kept layer.
        let t2 = Instant::now();
        let handle = sub.launch(&spec).expect("restore");
        let bridge = launch::start_bridge(bins, &handle, &next).expect("bridge");
        let up_restored = first_exec(&bridge, &next);
        restore_t.push(t2.elapsed());
        // A measure of a fresh boot would pass for a restore's: refuse it.
        assert!(
            up_restored >= up_at_snapshot,
            "the guest booted afresh instead of being restored (uptime {up_restored} s, {up_at_snapshot} s at the snapshot)"
        );
        launch::teardown(&*sub, &b.data, Some(&handle), Some(&bridge), Layer::Discard);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (c, s, r) = (median(cold), median(snap_t), median(restore_t));
    println!(
        "vm_lifecycle: {label}, guest RAM {} MiB, {RUNS} runs (medians)",
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
    let (o, qemu, bridge) = overhead[overhead.len() / 2];
    println!(
        "idle host overhead beyond guest RAM, one VM alone: {:.1} MiB (VMM {:.1} MiB anonymous + {:.1} MiB of files it alone maps; guest RAM {:.1} MiB; bridge {:.1} MiB; target <= 10 MiB)",
        mib(o),
        mib(qemu.anon),
        mib(qemu.file),
        mib(qemu.guest),
        mib(bridge)
    );
    idle_together(&*sub, bins, &b.data, limits, template);
}

/// VMs idle side by side on one worker.
const IDLE_VMS: usize = 4;

/// The overhead per VM where [`IDLE_VMS`] VMs idle together, as on a worker: what
/// each maps of files (the VMM's binary, its libraries, the initramfs) counts a share
/// each, what is anonymous (QEMU's: the translation cache under TCG, its copy of the
/// kernel image, its heap) counts whole.
fn idle_together(
    driver: &dyn Substrate,
    bins: &Binaries,
    data: &Path,
    limits: Limits,
    template: &TemplateSpec,
) {
    let mut vms = Vec::new();
    for _ in 0..IDLE_VMS {
        let a = new_sandbox();
        let (handle, bridge) =
            launch::launch(driver, bins, data, &a, limits, template).expect("launch");
        first_exec(&bridge, &a);
        vms.push((handle, bridge));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (mut anon, mut file, mut bridges) = (0, 0, 0);
    for (handle, bridge) in &vms {
        let q = pss_kib(handle.init.pid, Some(RAM));
        anon += q.anon;
        file += q.file;
        bridges += pss_kib(bridge.process.pid as i32, None).beyond;
    }
    let n = IDLE_VMS as u64;
    println!(
        "idle host overhead beyond guest RAM, per VM of {IDLE_VMS} idle together: {:.1} MiB (VMM {:.1} MiB anonymous + {:.1} MiB its share of mapped files; bridge {:.1} MiB; target <= 10 MiB)",
        mib((anon + file + bridges) / n),
        mib(anon / n),
        mib(file / n),
        mib(bridges / n)
    );
    for (handle, bridge) in vms {
        launch::teardown(driver, data, Some(&handle), Some(&bridge), Layer::Discard);
    }
}

/// The Firecracker driver, where a `firecracker` binary (SPACE_FIRECRACKER, else on
/// PATH) and a KVM that boots the guest kernel are there; why not otherwise.
fn firecracker(kernel_dir: &Path, b: &Bench) -> Result<VmDriver, String> {
    use space_worker::substrate::firecracker::{FirecrackerConfig, FirecrackerDriver, probe};
    let fc = match std::env::var_os("SPACE_FIRECRACKER") {
        Some(p) => Some(std::path::PathBuf::from(p)).filter(|p| p.is_file()),
        None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("firecracker"))
            .find(|p| p.is_file()),
    }
    .ok_or("no `firecracker` on PATH and no SPACE_FIRECRACKER")?;
    let k = kernel::load(kernel_dir)?;
    let vmlinux = space_worker::substrate::vm::vmlinux::vmlinux(&k.vmlinuz, kernel_dir)
        .map_err(|e| format!("no ELF kernel for Firecracker: {e}"))?;
    let (boots, why) = probe::kvm_boots(&fc, &vmlinux, &std::env::temp_dir());
    if !boots {
        return Err(why);
    }
    let driver = FirecrackerDriver::new(
        FirecrackerConfig {
            firecracker: fc,
            kernel_dir: kernel_dir.to_path_buf(),
            agent: b.agent.clone(),
            cgroup_parent: format!("space-bench-vm-{}", std::process::id()),
            uid_ranges: None,
        },
        &b.data,
    )
    .map_err(|e| format!("the Firecracker driver: {e}"))?;
    Ok(VmDriver::Firecracker(std::sync::Arc::new(driver)))
}
