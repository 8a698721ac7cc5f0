//! The `vm` substrate under QEMU over vhost-vsock, end to end with the real agent and
//! bridge: the guest's agent reached with the host's `AF_VSOCK` at the VM's own guest
//! CID (the bridge verifying the recorded QEMU as the live holder of
//! `/dev/vhost-vsock` before and after it connects, from a reserved host port);
//! commands, pause and resume with a background counter going on; a memory snapshot
//! restored as a new execution on a new CID whose processes go on, the old activation
//! refused.
//!
//! Needs `/dev/vhost-vsock` openable read-write (the `vhost_vsock` module), root (the
//! bridge binds a reserved vsock port; cgroups and a uid of its own for QEMU),
//! `qemu-system-x86_64`, a static busybox (busybox-static), `mkfs.ext4` and the guest
//! kernel (prepared once into `target/space-vm/kernel`, as `tests/vm.rs` does). Without
//! them each test here says what is missing and passes (`SPACE_REQUIRE_VHOST_VSOCK=1`
//! makes that a failure) — except the last, which needs no vhost-vsock: a worker
//! without it refuses a vhost-vsock VM's snapshot, keeping the sandbox's disk.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec, ExitOutcome};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::daemon::records::BridgeRecord;
use space_worker::substrate::jail::uid_ranges::{UidRangeConfig, UidRanges};
use space_worker::substrate::vm::{
    Accel, AgentTransport, QemuDriver, TransportChoice, VmConfig, kernel,
};
use space_worker::substrate::{Limits, SandboxHandle, Substrate, TemplateSpec};

const QEMU: &str = "/usr/bin/qemu-system-x86_64";
const BUSYBOX: &str = "/bin/busybox";
const VHOST_VSOCK: &str = "/dev/vhost-vsock";
/// What these tests need, said whenever one is missing.
const NEEDS: &str = "needs /dev/vhost-vsock openable read-write (modprobe vhost_vsock), and \
                     QEMU (/usr/bin/qemu-system-x86_64), as root";

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

/// Skips (saying why) unless `SPACE_REQUIRE_VHOST_VSOCK=1` makes that a failure.
fn skip(why: &str) {
    assert!(
        std::env::var_os("SPACE_REQUIRE_VHOST_VSOCK").is_none_or(|v| v != "1"),
        "SPACE_REQUIRE_VHOST_VSOCK=1, and the vhost-vsock VM tests cannot run: {why}"
    );
    eprintln!("SKIPPED: {NEEDS}: {why}");
}

/// Why a QEMU VM cannot run here at all, if it cannot.
fn missing_qemu() -> Option<String> {
    if !Path::new(QEMU).is_file() {
        return Some(format!("no {QEMU} (Debian: qemu-system-x86)"));
    }
    if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
        return Some(format!(
            "no static busybox at {BUSYBOX} (Debian: busybox-static)"
        ));
    }
    None
}

/// Why these tests cannot run here, if they cannot (the device first: the rest
/// matters only where it opens).
fn missing_requirement() -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(VHOST_VSOCK)
    {
        return Some(format!("{VHOST_VSOCK} does not open read-write: {e}"));
    }
    if !rustix::process::geteuid().is_root() {
        return Some("not root (a reserved vsock port for the bridge, cgroups for QEMU)".into());
    }
    missing_qemu()
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
    for tool in ["sh", "cat", "ls", "uname", "echo", "sleep", "test"] {
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
    driver: Arc<QemuDriver>,
    data: tempfile::TempDir,
    files: tempfile::TempDir,
    cgroup_parent: String,
}

impl Env {
    fn new(transport: TransportChoice) -> Self {
        let data = tempfile::tempdir().unwrap();
        let cgroup_parent = format!("space-test-vsock-{}", std::process::id());
        let config = VmConfig {
            qemu: QEMU.into(),
            kernel_dir: kernel_dir(),
            agent: space_testkit::bin::static_agent(),
            accel: Accel::Tcg,
            cgroup_parent: cgroup_parent.clone(),
            uid_ranges: Some(Arc::new(UidRanges::new(UidRangeConfig::default()).unwrap())),
            transport,
        };
        Self {
            driver: Arc::new(QemuDriver::new(config, data.path()).unwrap()),
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

    /// QEMU's own logs, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(dirs) = std::fs::read_dir(self.data.path().join("sandboxes")) {
            for d in dirs.flatten() {
                if let Ok(t) = std::fs::read_to_string(d.path().join("qemu.log")) {
                    out.push_str(&format!("--- qemu.log\n{t}\n"));
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
    fn connect(&self) -> AgentConnection {
        spaced_host::connect(&launch::bridge_target(&self.bridge, &self.activation))
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", self.env.logs()))
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

    /// The background counter's value; the shell truncates the file before each
    /// write, so an empty read is read again.
    fn count(&self) -> u64 {
        for _ in 0..20 {
            if let Ok(n) = self.sh("cat /root/count").1.trim().parse() {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        0
    }
}

const COUNTER: &str = "sh -c 'i=0; while true; do i=$((i+1)); echo $i > /root/count; sleep 0.1; done' \
                       >/dev/null 2>&1 & echo $!";

#[test]
fn a_vm_on_vhost_vsock_runs_commands_and_its_counter_goes_on_across_pause_and_resume() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new(TransportChoice::Vsock);
    assert_eq!(env.driver.transport().0, AgentTransport::VhostVsock);
    let vm = env.launch(&activation());
    let cid = vm
        .handle
        .guest_cid
        .expect("a vhost-vsock VM's CID is recorded");
    assert!(cid >= 3 && cid != u32::MAX, "{cid}");
    // The recorded QEMU holds the device; nothing is bound at the serial socket's name.
    let qemu = vm.handle.init.pid as u32;
    assert!(
        space_peer::fd_holding_file(qemu, Path::new(VHOST_VSOCK))
            .unwrap()
            .is_some()
    );
    assert!(!vm.handle.socket_path.exists());
    let (code, release) = vm.sh("uname -r");
    assert_eq!(code, 0, "{release}");
    assert_eq!(release.trim(), env.driver.kernel_release());
    // Several connections at once are streams of the one vsock link.
    let conns: Vec<AgentConnection> = (0..4).map(|_| vm.connect()).collect();
    for mut c in conns {
        assert!(
            !c.exec(ExecSpec::shell("echo $$"))
                .unwrap()
                .stdout
                .is_empty()
        );
    }
    vm.sh(COUNTER);
    std::thread::sleep(std::time::Duration::from_millis(500));
    env.driver.pause(&vm.handle).unwrap();
    env.driver.resume(&vm.handle).unwrap();
    let before = vm.count();
    assert!(before > 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(vm.count() > before, "the counter stopped after resume");
}

#[test]
fn a_counter_goes_on_after_a_snapshot_restored_as_a_new_execution_on_a_new_cid() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new(TransportChoice::Vsock);
    let a = activation();
    let vm = env.launch(&a);
    let old_cid = vm.handle.guest_cid.unwrap();
    let (_, pid) = vm.sh(COUNTER);
    let pid = pid.trim().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let dir = env.files.path().join("snapshot");
    let snap = env.driver.snapshot(&vm.handle, &dir).unwrap();
    assert_eq!(snap.machine.transport, AgentTransport::VhostVsock);
    // The source goes on over the same link: QEMU resets no connection there.
    env.driver.resume(&vm.handle).unwrap();
    let before = vm.count();
    assert!(before > 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(vm.count() > before, "the counter stopped after resume");
    drop(vm);

    let b = Activation {
        generation: Generation(2),
        execution_id: ExecutionId::from_bytes(random()),
        secret: random(),
        ..a.clone()
    };
    // As a migration carries it: packed, unpacked as the kept layer, marked as the
    // receiving VM worker marks it, restored by a plain launch.
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
    let new_cid = handle.guest_cid.expect("the restored VM's CID is recorded");
    assert_ne!(
        new_cid, old_cid,
        "the restored VM took its predecessor's CID"
    );
    let bridge = launch::start_bridge(&env.bins(), &handle, &b)
        .unwrap_or_else(|e| panic!("bridge: {e}\n{}", env.logs()));
    let restored = Running {
        env: &env,
        handle,
        bridge,
        activation: b.clone(),
    };
    let after = restored.count();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let later = restored.count();
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
fn a_vhost_vsock_snapshot_is_refused_by_a_worker_without_vhost_vsock_keeping_the_disk() {
    // Needs QEMU (for the driver) but no vhost-vsock: the driver is forced to serial.
    if let Some(why) = missing_qemu() {
        eprintln!("SKIPPED: needs QEMU and a static busybox: {why}");
        return;
    }
    let env = Env::new(TransportChoice::Serial);
    let a = activation();
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    let upper = kept.join("upper");
    std::fs::create_dir_all(&upper).unwrap();
    let (ram, cpus) = space_worker::substrate::vm::machine_size(&vm_limits());
    let machine = serde_json::json!({
        "ram": ram, "cpus": cpus, "root_image": "anything",
        "kernel": env.driver.kernel_release(), "transport": "vhost_vsock",
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
    assert!(err.contains("vhost-vsock"), "{err}");
    assert!(
        kept.join("upper").join("upper.ext4").is_file(),
        "the kept disk was lost"
    );
}
