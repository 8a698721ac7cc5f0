//! The `vm` substrate under Firecracker, end to end with the real agent and bridge:
//! the scenarios of `tests/vm.rs` (QEMU) on the other VMM — a guest in its own
//! (Debian) kernel booted from the worker's initramfs, reached only through the
//! bridge's verified vsock transport; pause and resume; a memory snapshot restored as
//! a new execution whose processes go on, the old activation refused.
//!
//! Needs root (cgroups, a uid of its own for Firecracker), a `firecracker` binary on
//! PATH or at SPACE_FIRECRACKER, a /dev/kvm that boots a stock kernel (probed under
//! Firecracker as `substrate::vm::accel` probes it for QEMU), a static busybox
//! (busybox-static) for the template's userland, `mkfs.ext4`, and the guest kernel
//! (prepared once into `target/space-vm/kernel` from Debian's `linux-image-cloud-amd64`,
//! with its vsock modules). Without them every test here says what is missing and
//! passes (`SPACE_REQUIRE_FIRECRACKER=1` makes that a failure).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec, ExitOutcome};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::daemon::records::BridgeRecord;
use space_worker::substrate::firecracker::{FirecrackerConfig, FirecrackerDriver, probe};
use space_worker::substrate::jail::uid_ranges::{UidRangeConfig, UidRanges};
use space_worker::substrate::vm::kernel;
use space_worker::substrate::{Limits, SandboxHandle, Substrate, TemplateSpec};

const BUSYBOX: &str = "/bin/busybox";
/// What these tests need, said whenever one is missing.
const NEEDS: &str = "needs a `firecracker` binary on PATH or SPACE_FIRECRACKER, and a /dev/kvm \
                     that boots a stock kernel";

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).unwrap();
    out
}

fn activation() -> Activation {
    Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(1),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    }
}

/// Skips (saying why) unless `SPACE_REQUIRE_FIRECRACKER=1` makes that a failure.
fn skip(why: &str) {
    assert!(
        std::env::var_os("SPACE_REQUIRE_FIRECRACKER").is_none_or(|v| v != "1"),
        "SPACE_REQUIRE_FIRECRACKER=1, and the Firecracker tests cannot run: {why}"
    );
    eprintln!("SKIPPED: {NEEDS}: {why}");
}

/// The `firecracker` binary: SPACE_FIRECRACKER, else the first on PATH.
fn firecracker() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPACE_FIRECRACKER") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("firecracker"))
        .find(|p| p.is_file())
}

/// Why these tests cannot run here, if they cannot (cheapest checks first: the
/// kernel is prepared, and KVM probed, only where Firecracker is there at all).
fn missing_requirement() -> Option<String> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let Some(fc) = firecracker() else {
            return Some("no `firecracker` on PATH and no SPACE_FIRECRACKER".into());
        };
        if !rustix::process::geteuid().is_root() {
            return Some("VM sandboxes need root (cgroups, a uid for Firecracker)".into());
        }
        if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
            return Some(format!(
                "needs a static busybox at {BUSYBOX} (Debian: busybox-static)"
            ));
        }
        let dir = kernel_dir();
        let k = match kernel::load(&dir) {
            Ok(k) => k,
            Err(e) => return Some(e),
        };
        let vmlinux = match space_worker::substrate::vm::vmlinux::vmlinux(&k.vmlinuz, &dir) {
            Ok(v) => v,
            Err(e) => return Some(format!("no ELF kernel for Firecracker: {e}")),
        };
        let (boots, why) = probe::kvm_boots(&fc, &vmlinux, &std::env::temp_dir());
        (!boots).then_some(why)
    })
    .clone()
}

/// The guest kernel, prepared once for every test run on this checkout.
fn kernel_dir() -> PathBuf {
    static READY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    READY
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/space-vm/kernel");
            kernel::setup(&dir, None, &mut |step| eprintln!("vm setup: {step}"))
                .unwrap_or_else(|e| panic!("preparing the guest kernel: {e}"));
            dir
        })
        .clone()
}

/// 256 MiB of RAM and of disk, one vCPU.
fn vm_limits() -> Limits {
    Limits {
        memory_bytes: Some(256 << 20),
        disk_bytes: Some(256 << 20),
        ..Limits::default()
    }
}

/// A template: busybox, accounts, `/root` and `/tmp`.
fn template(root: &Path) -> TemplateSpec {
    let t = root.join("template");
    let spec = TemplateSpec::Directory {
        lower_dir: t.clone(),
        read_only_binds: Vec::new(),
    };
    if t.exists() {
        return spec;
    }
    std::fs::create_dir_all(t.join("bin")).unwrap();
    std::fs::copy(BUSYBOX, t.join("bin/busybox")).unwrap();
    for tool in [
        "sh", "cat", "ls", "uname", "echo", "sleep", "ps", "test", "grep", "cut",
    ] {
        symlink("busybox", t.join("bin").join(tool)).unwrap();
    }
    for d in ["root", "tmp", "etc"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    std::fs::write(t.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(t.join("etc/group"), "root:x:0:\n").unwrap();
    spec
}

struct Env {
    driver: Arc<FirecrackerDriver>,
    data: tempfile::TempDir,
    files: tempfile::TempDir,
    cgroup_parent: String,
}

impl Env {
    fn new() -> Self {
        let data = tempfile::tempdir().unwrap();
        let cgroup_parent = format!("space-test-fc-{}", std::process::id());
        let config = FirecrackerConfig {
            firecracker: firecracker().expect("checked by missing_requirement"),
            kernel_dir: kernel_dir(),
            agent: space_testkit::bin::static_agent(),
            cgroup_parent: cgroup_parent.clone(),
            uid_ranges: Some(Arc::new(UidRanges::new(UidRangeConfig::default()).unwrap())),
        };
        Self {
            driver: Arc::new(FirecrackerDriver::new(config, data.path()).unwrap()),
            data,
            files: tempfile::tempdir().unwrap(),
            cgroup_parent,
        }
    }

    fn bins(&self) -> Binaries {
        Binaries {
            agent: space_testkit::bin::static_agent(),
            bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
        }
    }

    fn launch(&self, activation: &Activation) -> Running<'_> {
        let (handle, bridge) = launch::launch(
            &*self.driver,
            &self.bins(),
            self.data.path(),
            activation,
            vm_limits(),
            &template(self.files.path()),
        )
        .unwrap_or_else(|e| panic!("launch: {e}\n{}", self.logs()));
        Running {
            env: self,
            handle,
            bridge,
            activation: activation.clone(),
        }
    }

    fn spec(
        &self,
        activation: &Activation,
        initial_upper: Option<PathBuf>,
    ) -> space_worker::substrate::LaunchSpec {
        space_worker::substrate::LaunchSpec {
            key: launch::execution_key(&activation.sandbox, &activation.execution_id),
            data_dir: self.data.path().to_path_buf(),
            template: template(self.files.path()),
            limits: vm_limits(),
            agent: space_worker::substrate::AgentCommand::spaced_guest(
                space_testkit::bin::static_agent(),
            ),
            activation: activation.encode(),
            hostname: None,
            initial_upper,
        }
    }

    /// Firecracker's own logs, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(dirs) = std::fs::read_dir(self.data.path().join("sandboxes")) {
            for d in dirs.flatten() {
                if let Ok(t) = std::fs::read_to_string(d.path().join("firecracker.log")) {
                    out.push_str(&format!("--- firecracker.log\n{t}\n"));
                }
            }
        }
        out
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Ok(h) = space_worker::substrate::jail::cgroup::CgroupHierarchy::detect() {
            for dir in h.parent_dirs(&self.cgroup_parent) {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

struct Running<'a> {
    env: &'a Env,
    handle: SandboxHandle,
    bridge: BridgeRecord,
    activation: Activation,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        launch::teardown(
            &*self.env.driver,
            self.env.data.path(),
            Some(&self.handle),
            Some(&self.bridge),
            Layer::Discard,
        );
    }
}

impl Running<'_> {
    /// A verified connection; tried again for a while, as a worker does, after a
    /// snapshot (Firecracker resets vsock then, and the bridge links again).
    fn connect(&self) -> AgentConnection {
        let target = launch::bridge_target(&self.bridge, &self.activation);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match spaced_host::connect(&target) {
                Ok(c) => return c,
                Err(e) if std::time::Instant::now() > deadline => {
                    panic!("connect: {e}\n{}", self.env.logs())
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
    }

    fn sh(&self, script: &str) -> (i32, String) {
        let out = self.connect().exec(ExecSpec::shell(script)).unwrap();
        let code = match out.status.outcome {
            ExitOutcome::Code(c) => c,
            other => panic!("{script}: {other:?}"),
        };
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (code, text)
    }
}

#[test]
fn a_firecracker_vm_runs_commands_in_its_own_kernel_and_pauses_and_resumes() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    let (code, release) = vm.sh("uname -r");
    assert_eq!(code, 0, "{release}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(release.trim(), env.driver.kernel_release());
    assert_ne!(
        release.trim(),
        host.trim(),
        "the guest runs the host's kernel"
    );
    let (_, ps) = vm.sh("ls /proc | grep -c '^[0-9]'");
    assert!(
        ps.trim().parse::<usize>().unwrap_or(usize::MAX) < 100,
        "{ps}"
    );
    // Files written in the guest stay (its writable disk), across connections.
    assert_eq!(vm.sh("echo kept > /root/f && cat /root/f").0, 0);
    assert_eq!(vm.sh("cat /root/f").1.trim(), "kept");
    // Several connections at once are streams of one vsock link.
    let conns: Vec<AgentConnection> = (0..8).map(|_| vm.connect()).collect();
    for mut c in conns {
        assert!(
            !c.exec(ExecSpec::shell("echo $$"))
                .unwrap()
                .stdout
                .is_empty()
        );
    }
    env.driver.pause(&vm.handle).unwrap();
    env.driver.resume(&vm.handle).unwrap();
    assert_eq!(vm.sh("cat /root/f").1.trim(), "kept");
}

#[test]
fn firecracker_runs_as_a_uid_of_its_own_without_capabilities() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    assert_eq!(vm.sh("echo up").1.trim(), "up");
    let uid = vm.handle.host_uid.expect("the VM's uid is recorded");
    assert_ne!(uid, 0);
    let status = std::fs::read_to_string(format!("/proc/{}/status", vm.handle.init.pid)).unwrap();
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        field("Uid:"),
        format!("{uid} {uid} {uid} {uid}"),
        "{status}"
    );
    assert_eq!(
        field("Gid:"),
        format!("{uid} {uid} {uid} {uid}"),
        "{status}"
    );
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
}

#[test]
fn a_background_process_keeps_its_memory_across_a_snapshot_restored_as_a_new_execution() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let a = activation();
    let vm = env.launch(&a);
    let (_, pid) = vm.sh(
        "sh -c 'i=0; while true; do i=$((i+1)); echo $i > /root/count; sleep 0.1; done' \
         >/dev/null 2>&1 & echo $!",
    );
    let pid = pid.trim().to_owned();
    // The shell truncates the file before each write: a read between the two finds
    // it empty, so an empty read is read again.
    let count = |vm: &Running<'_>| -> u64 {
        for _ in 0..20 {
            if let Ok(n) = vm.sh("cat /root/count").1.trim().parse() {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        0
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let dir = env.files.path().join("snapshot");
    let snap = env.driver.snapshot(&vm.handle, &dir).unwrap();
    for f in ["vm.json", "memory", "upper.ext4", "vmstate"] {
        assert!(dir.join(f).is_file(), "the snapshot has no {f}");
    }
    env.driver.resume(&vm.handle).unwrap();
    let before = count(&vm);
    assert!(before > 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(count(&vm) > before, "the counter stopped after resume");
    drop(vm);

    let b = Activation {
        generation: Generation(2),
        execution_id: ExecutionId::from_bytes(random()),
        secret: random(),
        ..a.clone()
    };
    // As a migration carries it: packed keeping holes, unpacked as the kept layer,
    // marked as the receiving VM worker marks it, restored by a plain launch.
    let (archive, _) = space_worker::daemon::snapshot::pack_to_temp_keeping_holes(
        &dir,
        &env.files.path().join("spool"),
        space_worker::daemon::snapshot::MAX_ARCHIVE,
    )
    .unwrap();
    drop(snap);
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    std::fs::create_dir_all(&kept).unwrap();
    space_worker::daemon::snapshot::unpack_keeping_holes(
        std::io::BufReader::new(archive),
        &kept.join("upper"),
    )
    .unwrap();
    std::fs::write(
        kept.join(space_worker::substrate::vm::snapshot::RECEIVED_MARK),
        b"",
    )
    .unwrap();
    let handle = env
        .driver
        .launch(&env.spec(&b, Some(kept.clone())))
        .unwrap_or_else(|e| panic!("restore: {e}\n{}", env.logs()));
    assert!(
        !kept.exists(),
        "the kept snapshot was left after the restore"
    );
    let bridge = launch::start_bridge(&env.bins(), &handle, &b)
        .unwrap_or_else(|e| panic!("bridge: {e}\n{}", env.logs()));
    let restored = Running {
        env: &env,
        handle,
        bridge,
        activation: b.clone(),
    };
    let after = count(&restored);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let later = count(&restored);
    assert!(
        later > after,
        "the restored counter is not running ({after} then {later})"
    );
    assert_eq!(
        restored.sh(&format!("kill -0 {pid}")).0,
        0,
        "process {pid} is gone"
    );
    // The old execution's identity and secret get nothing from the new one.
    let old = spaced_host::BridgeTarget {
        served: a.identity(),
        secret: a.secret,
        ..launch::bridge_target(&restored.bridge, &b)
    };
    assert!(
        spaced_host::connect(&old).is_err(),
        "the old execution was served"
    );
}

#[test]
fn a_qemu_snapshot_is_never_loaded_into_firecracker() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let a = activation();
    // A kept layer marked as a received VM snapshot whose machine is QEMU's.
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    let upper = kept.join("upper");
    std::fs::create_dir_all(&upper).unwrap();
    let (ram, cpus) = space_worker::substrate::vm::machine_size(&vm_limits());
    let machine = serde_json::json!({
        "ram": ram, "cpus": cpus, "root_image": "anything", "kernel": env.driver.kernel_release(),
    });
    std::fs::write(upper.join("vm.json"), machine.to_string()).unwrap();
    std::fs::write(upper.join("memory"), b"QEVM").unwrap();
    std::fs::File::create(upper.join("upper.ext4"))
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    std::fs::write(
        kept.join(space_worker::substrate::vm::snapshot::RECEIVED_MARK),
        b"",
    )
    .unwrap();
    let err = env
        .driver
        .launch(&env.spec(&a, Some(kept.clone())))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Qemu"), "{err}");
    assert!(
        kept.join("upper").join("upper.ext4").is_file(),
        "the kept disk was lost"
    );
}
