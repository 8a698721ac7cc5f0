//! The `vm` substrate under QEMU, end to end with the real agent and bridge: a guest in
//! its own (Debian) kernel, booted from the worker's initramfs, its root an image of
//! the template, reached only through the bridge's verified serial transport.
//!
//! Needs `qemu-system-x86_64` (Debian: qemu-system-x86), a statically linked busybox
//! (busybox-static) for the template's userland, `mkfs.ext4` (e2fsprogs), and the guest
//! kernel: prepared once into `target/space-vm/kernel` from Debian's
//! `linux-image-cloud-amd64` (apt-get download + dpkg-deb, never installed). Runs under
//! software emulation (TCG): this host class's KVM does not boot stock kernels.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec, ExitOutcome};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::daemon::records::BridgeRecord;
use space_worker::substrate::jail::uid_ranges::{UidRangeConfig, UidRanges};
use space_worker::substrate::vm::{Accel, QemuDriver, VmConfig, detect_accel, kernel};
use space_worker::substrate::{Limits, SandboxHandle, Substrate, TemplateSpec};

const QEMU: &str = "/usr/bin/qemu-system-x86_64";
const BUSYBOX: &str = "/bin/busybox";

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

/// Skips (saying why) unless `SPACE_REQUIRE_VM=1` (CI) makes that a failure.
fn skip(why: &str) {
    assert!(
        std::env::var_os("SPACE_REQUIRE_VM").is_none_or(|v| v != "1"),
        "SPACE_REQUIRE_VM=1, and the VM tests cannot run: {why}"
    );
    eprintln!("SKIPPED: {why}");
}

/// Why these tests cannot run here, if they cannot.
fn missing_requirement() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("VM sandboxes need root (cgroups for QEMU)".into());
    }
    if !Path::new(QEMU).is_file() {
        return Some(format!("needs {QEMU} (Debian: qemu-system-x86)"));
    }
    if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
        return Some(format!(
            "needs a static busybox at {BUSYBOX} (Debian: busybox-static)"
        ));
    }
    None
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
        "sh", "cat", "ls", "uname", "echo", "sleep", "ps", "test", "hostname", "head", "yes",
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
    driver: Arc<QemuDriver>,
    data: tempfile::TempDir,
    files: tempfile::TempDir,
    cgroup_parent: String,
}

impl Env {
    fn new() -> Self {
        Self::with_accel(Accel::Tcg)
    }

    fn with_accel(accel: Accel) -> Self {
        let data = tempfile::tempdir().unwrap();
        let cgroup_parent = format!("space-test-vm-{}", std::process::id());
        let config = VmConfig {
            qemu: QEMU.into(),
            kernel_dir: kernel_dir(),
            agent: space_testkit::bin::static_agent(),
            accel,
            cgroup_parent: cgroup_parent.clone(),
            // QEMU as a uid of its own, from the host's shared ranges (as a worker).
            uid_ranges: Some(Arc::new(UidRanges::new(UidRangeConfig::default()).unwrap())),
            transport: space_worker::substrate::vm::TransportChoice::Serial,
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
        let limits = vm_limits();
        let (handle, bridge) = launch::launch(
            &*self.driver,
            &self.bins(),
            self.data.path(),
            activation,
            limits,
            &template(self.files.path()),
        )
        .unwrap_or_else(|e| panic!("launch: {e}\n{}", self.console()));
        Running {
            env: self,
            handle,
            bridge,
            activation: activation.clone(),
        }
    }

    /// What a launch of `activation` on the test template gets (a restore, a start
    /// from a kept disk at `initial_upper`).
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

    /// The guest consoles, for a failure's message.
    fn console(&self) -> String {
        let mut out = String::new();
        if let Ok(dirs) = std::fs::read_dir(self.data.path().join("sandboxes")) {
            for d in dirs.flatten() {
                for f in ["qemu.log"] {
                    if let Ok(t) = std::fs::read_to_string(d.path().join(f)) {
                        out.push_str(&format!("--- {f}\n{t}\n"));
                    }
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
        spaced_host::connect(&launch::bridge_target(&self.bridge, &self.activation)).unwrap_or_else(
            |e| {
                let console = self.env.driver.console(&self.handle).unwrap_or_default();
                panic!(
                    "connect: {e}\n{}\n--- console\n{console}",
                    self.env.console()
                )
            },
        )
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
fn a_sandboxs_own_files_shaped_like_a_vm_snapshot_are_never_loaded_into_qemu() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let a = activation();
    // A kept layer as a jail leaves it (`upper/` holds the sandbox's own `/`), with
    // the files of a VM snapshot planted there by the sandbox: a machine that fits,
    // a migration stream it wrote, a disk.
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    let upper = kept.join("upper");
    std::fs::create_dir_all(&upper).unwrap();
    let (ram, cpus) = space_worker::substrate::vm::machine_size(&vm_limits());
    let planted = serde_json::json!({
        "ram": ram, "cpus": cpus, "root_image": "anything", "kernel": env.driver.kernel_release(),
    });
    std::fs::write(upper.join("vm.json"), planted.to_string()).unwrap();
    std::fs::write(
        upper.join("memory"),
        b"QEVM a migration stream the sandbox wrote",
    )
    .unwrap();
    std::fs::File::create(upper.join("upper.ext4"))
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    // Not a VM snapshot this worker received (no mark beside the layer): a boot.
    let vm = env.launch(&a);
    assert_eq!(vm.sh("echo booted").1.trim(), "booted");
    let (_, uptime) = vm.sh("cut -d. -f1 /proc/uptime");
    assert!(
        uptime.trim().parse::<u64>().unwrap_or(u64::MAX) < 120,
        "{uptime}"
    );
}

#[test]
fn qemu_runs_as_a_uid_of_its_own_without_capabilities_and_cannot_read_the_workers_files() {
    if let Some(why) = missing_requirement() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let env = Env::new();
    // A secret of the worker's, as its keys and records are: 0600 in a 0700 directory.
    let private = env.data.path().join("private");
    std::fs::create_dir_all(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let secret = private.join("secret.key");
    std::fs::write(&secret, b"the worker's secret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
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
    // Every uid and gid of QEMU the VM's, no capability, and no way to gain one.
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
    assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    // What an escape from QEMU would be: a process of that uid. It reads nothing of
    // the worker's (root reads the same file: the file is there).
    let as_vm = |path: &Path| {
        Command::new("cat")
            .arg(path)
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap()
    };
    let read = as_vm(&secret);
    assert!(
        !read.status.success(),
        "the VM's uid read the worker's secret"
    );
    assert!(read.stdout.is_empty());
    assert!(
        Command::new("cat")
            .arg(&secret)
            .output()
            .unwrap()
            .status
            .success()
    );
    // Nor another VM's disk or the run directory's sockets.
    let run = vm.handle.socket_path.parent().unwrap().to_path_buf();
    assert!(!as_vm(&run.join("nothing")).status.success());
}

#[test]
fn a_vm_sandbox_runs_commands_in_its_own_kernel_and_sees_nothing_of_the_host() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    let (code, release) = vm.sh("uname -r");
    assert_eq!(code, 0, "{release}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host = host.trim();
    assert_eq!(release.trim(), env.driver.kernel_release());
    assert_ne!(release.trim(), host, "the guest runs the host's kernel");
    // The guest's processes are its own: its init, its agent, this shell.
    let (_, ps) = vm.sh("ls /proc | grep -c '^[0-9]'");
    let n: usize = ps.trim().parse().unwrap_or(usize::MAX);
    assert!(n < 100, "{n} processes visible: {ps}");
    // Nothing of the host's files: this test's own directory does not exist there.
    let marker = env.files.path().join("host-marker");
    std::fs::write(&marker, "host").unwrap();
    let (code, _) = vm.sh(&format!("test -e {}", marker.display()));
    assert_ne!(code, 0, "the guest sees a host file");
    // Files written in the guest stay (its writable disk), across connections.
    assert_eq!(vm.sh("echo kept > /root/f && cat /root/f").0, 0);
    assert_eq!(vm.sh("cat /root/f").1.trim(), "kept");
    // Several connections at once are streams of one serial link.
    let conns: Vec<AgentConnection> = (0..8).map(|_| vm.connect()).collect();
    for mut c in conns {
        let out = c.exec(ExecSpec::shell("echo $$")).unwrap();
        assert!(!out.stdout.is_empty());
    }
    // Pause stops its vCPUs; resume goes on with the same processes.
    env.driver.pause(&vm.handle).unwrap();
    env.driver.resume(&vm.handle).unwrap();
    assert_eq!(vm.sh("cat /root/f").1.trim(), "kept");
}

/// Starts a bridge of `spec`; its first line (`ready`, or nothing if it refused) and
/// its stderr.
fn bridge_outcome(spec: &spaced_host::BridgeSpec) -> (String, String) {
    let mut child = Command::new(space_testkit::workspace_bin("spaced-host", "spaced-host"))
        .args(["--spec-fd", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&spec.encode())
        .unwrap();
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (line, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_rival_listener_or_another_process_at_the_serial_transport_is_refused() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let a = activation();
    let vm = env.launch(&a);
    let qemu = space_peer::LiveProcess::open(vm.handle.init.pid as u32)
        .unwrap()
        .identity;
    let run = env.files.path().join("run");
    space_peer::prepare_socket_dir(&run).unwrap();
    let base = spaced_host::BridgeSpec {
        listen: run.join("bridge.sock"),
        agent_socket: vm.handle.socket_path.clone(),
        worker_uid: rustix::process::geteuid().as_raw(),
        agent: qemu,
        activation: a.clone(),
        max_connections: 4,
        transport: spaced_host::Transport::Serial,
    };
    // A rival listener (this test process) at another path, named as the transport,
    // with the recorded identity of QEMU: its peer is not QEMU.
    let rival = run.join("rival.sock");
    let _listener = UnixListener::bind(&rival).unwrap();
    let spec = spaced_host::BridgeSpec {
        agent_socket: rival,
        ..base.clone()
    };
    let (line, err) = bridge_outcome(&spec);
    assert_ne!(line.trim(), "ready");
    assert!(
        err.contains("transport refused: peer process differs"),
        "{err}"
    );
    // The right socket, but the record names another process (QEMU replaced): refused.
    let other = space_peer::LiveProcess::open(std::process::id())
        .unwrap()
        .identity;
    let spec = spaced_host::BridgeSpec {
        listen: run.join("bridge2.sock"),
        agent: other,
        ..base
    };
    let (line, err) = bridge_outcome(&spec);
    assert_ne!(line.trim(), "ready");
    assert!(
        err.contains("transport refused: peer process differs"),
        "{err}"
    );
    // The VM's own bridge still serves it: the attempts changed nothing.
    assert_eq!(vm.sh("echo ok").1.trim(), "ok");
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
    // A counter whose value lives only in a process's memory (the file is its output).
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
    // Pause and resume in place: the same execution goes on counting.
    env.driver.resume(&vm.handle).unwrap();
    let before = count(&vm);
    assert!(before > 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(count(&vm) > before, "the counter stopped after resume");
    drop(vm);

    // A new execution of the sandbox from the snapshot.
    let b = Activation {
        generation: Generation(2),
        execution_id: ExecutionId::from_bytes(random()),
        secret: random(),
        ..a.clone()
    };
    // As a migration carries it: packed keeping the disk's holes, unpacked as the
    // sandbox's kept layer on the receiving side, restored by a plain launch.
    let (archive, packed) = space_worker::daemon::snapshot::pack_to_temp_keeping_holes(
        &dir,
        &env.files.path().join("spool"),
        space_worker::daemon::snapshot::MAX_ARCHIVE,
    )
    .unwrap();
    assert!(
        packed.size < 200 << 20,
        "the archive of a 256 MiB VM is {} bytes",
        packed.size
    );
    drop(snap);
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    std::fs::create_dir_all(&kept).unwrap();
    space_worker::daemon::snapshot::unpack_keeping_holes(
        std::io::BufReader::new(archive),
        &kept.join("upper"),
    )
    .unwrap();
    // As the receiving VM worker marks it (beside the layer, not in it).
    std::fs::write(
        kept.join(space_worker::substrate::vm::snapshot::RECEIVED_MARK),
        b"",
    )
    .unwrap();
    let spec = env.spec(&b, Some(kept.clone()));
    let handle = env
        .driver
        .launch(&spec)
        .unwrap_or_else(|e| panic!("restore: {e}\n{}", env.console()));
    assert!(
        !kept.exists(),
        "the kept snapshot was left after the restore"
    );
    let bridge = launch::start_bridge(&env.bins(), &handle, &b)
        .unwrap_or_else(|e| panic!("bridge: {e}\n{}", env.console()));
    let restored = Running {
        env: &env,
        handle,
        bridge,
        activation: b.clone(),
    };
    // The same process, its memory kept: counting on from where the snapshot was.
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
fn a_killed_qemu_is_noticed_its_bridge_ends_and_nothing_reconnects() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    assert_eq!(vm.sh("echo up").1.trim(), "up");
    let mut idle = vm.connect();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(vm.handle.init.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // The substrate sees QEMU gone (reaped: the exit status of a SIGKILL).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let code = loop {
        if let Some(code) = env.driver.try_wait(&vm.handle).unwrap() {
            break code;
        }
        assert!(std::time::Instant::now() < deadline, "QEMU's end not seen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(code, 128 + 9);
    assert!(!env.driver.stats(&vm.handle).unwrap().running);
    // Its bridge exits with the link; a connection open before fails, a new one is
    // refused: nothing was re-established behind the worker's back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while launch::still_alive(&vm.bridge.process) {
        assert!(
            std::time::Instant::now() < deadline,
            "the bridge outlived its VM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(idle.exec(ExecSpec::shell("echo late")).is_err());
    assert!(spaced_host::connect(&launch::bridge_target(&vm.bridge, &vm.activation)).is_err());
}

#[test]
fn a_guest_flooding_its_console_fills_a_bounded_ring_not_the_hosts_disk() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    // Root in the guest writes 2 MB to its console (an owned kernel could write any
    // amount): the host keeps the last 64 KiB in QEMU's ring buffer, no file grows.
    let (code, out) = vm.sh("yes console-flood | head -c 2000000 > /dev/console; echo done");
    assert_eq!((code, out.trim()), (0, "done"));
    let mut host_bytes = 0u64;
    for e in std::fs::read_dir(&vm.handle.sandbox_dir).unwrap().flatten() {
        if e.file_name() != "upper.ext4" {
            host_bytes += e.metadata().unwrap().len();
        }
    }
    assert!(
        host_bytes < 64 * 1024,
        "{host_bytes} bytes of console on the host"
    );
    let console = env.driver.console(&vm.handle).unwrap();
    assert!(
        !console.is_empty() && console.len() <= 64 * 1024 * 4,
        "{}",
        console.len()
    );
}

#[test]
fn a_start_that_fails_gives_the_kept_disk_back() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    // A "QEMU" that exits at once: the start fails after the kept disk moved in.
    let broken = QemuDriver::new(
        VmConfig {
            qemu: "/bin/false".into(),
            kernel_dir: kernel_dir(),
            agent: space_testkit::bin::static_agent(),
            accel: Accel::Tcg,
            cgroup_parent: env.cgroup_parent.clone(),
            uid_ranges: None,
            transport: space_worker::substrate::vm::TransportChoice::Serial,
        },
        env.data.path(),
    )
    .unwrap();
    let a = activation();
    let kept = launch::kept_layer(env.data.path(), &a.sandbox);
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("upper.ext4"), b"the sandbox's files").unwrap();
    let spec = env.spec(&a, Some(kept.clone()));
    assert!(broken.launch(&spec).is_err());
    assert_eq!(
        std::fs::read(kept.join("upper.ext4")).unwrap(),
        b"the sandbox's files",
        "the kept disk was lost"
    );
}

#[test]
fn the_accelerator_is_probed_once_and_a_vm_boots_with_the_one_chosen() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (accel, why) = detect_accel(Path::new(QEMU), &kernel_dir(), data.path());
    eprintln!("accelerator: {} ({why})", accel.as_str());
    if !Path::new("/dev/kvm").exists() {
        assert_eq!(accel, Accel::Tcg, "{why}");
    }
    let (again, why) = detect_accel(Path::new(QEMU), &kernel_dir(), data.path());
    assert_eq!(again, accel);
    assert!(why.contains("probed before"), "{why}");
    // Whichever it is, a VM boots with it and runs a command.
    let env = Env::with_accel(accel);
    let vm = env.launch(&activation());
    assert_eq!(vm.sh("echo booted").1.trim(), "booted");
}

#[test]
fn the_debian_kernel_yields_the_elf_vmlinux_a_firecracker_boots() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    if Command::new("lz4").arg("--version").output().is_err() {
        skip("needs lz4 (Debian: lz4), the Debian kernel's payload compressor");
        return;
    }
    let kernel = space_worker::substrate::vm::kernel::load(&kernel_dir()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let vmlinux =
        space_worker::substrate::vm::vmlinux::vmlinux(&kernel.vmlinuz, out.path()).unwrap();
    let bytes = std::fs::read(&vmlinux).unwrap();
    assert!(bytes.starts_with(b"\x7fELF\x02\x01"), "not a 64-bit LE ELF");
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 62, "not x86-64");
    // Uncompressed: well beyond the bzImage it came from, and it names its release.
    let compressed = std::fs::metadata(&kernel.vmlinuz).unwrap().len();
    assert!(bytes.len() as u64 > 2 * compressed, "{} bytes", bytes.len());
    assert!(
        bytes
            .windows(kernel.release.len())
            .any(|w| w == kernel.release.as_bytes()),
        "the release {} is not in it",
        kernel.release
    );
    // Made once: a second call keeps the file.
    let mtime = std::fs::metadata(&vmlinux).unwrap().modified().unwrap();
    space_worker::substrate::vm::vmlinux::vmlinux(&kernel.vmlinuz, out.path()).unwrap();
    assert_eq!(
        std::fs::metadata(&vmlinux).unwrap().modified().unwrap(),
        mtime
    );
}

#[test]
fn qemu_inherits_its_disks_and_nothing_the_worker_left_without_close_on_exec() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    // A descriptor of the worker's that some library left inheritable: a secret of
    // the worker's, opened without close-on-exec.
    let secret = env.data.path().join("inheritable-secret");
    std::fs::write(&secret, b"the worker's").unwrap();
    let file = std::fs::File::open(&secret).unwrap();
    rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty()).unwrap();
    let vm = env.launch(&activation());
    assert_eq!(vm.sh("echo up").1.trim(), "up");
    let fds = std::fs::read_dir(format!("/proc/{}/fd", vm.handle.init.pid)).unwrap();
    let targets: Vec<String> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.display().to_string())
        .collect();
    assert!(
        !targets.iter().any(|t| t.contains("inheritable-secret")),
        "QEMU inherited the worker's descriptor: {targets:?}"
    );
    // Its disks it has: the sandbox's writable one among them.
    assert!(
        targets.iter().any(|t| t.ends_with("upper.ext4")),
        "{targets:?}"
    );
    drop(file);
}

#[test]
fn a_vms_guest_ram_is_never_merged_with_another_vms_nor_dumped_with_qemu_and_no_core_file_is_made()
{
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    let env = Env::new();
    let vm = env.launch(&activation());
    assert_eq!(vm.sh("echo up").1.trim(), "up");
    // Guest RAM is QEMU's mapping of the guest's size; KSM would merge its pages with
    // other VMs' (a timing channel between tenants through shared pages) if QEMU
    // marked it mergeable ("mg"), and a crash of QEMU would write it into a core
    // file unless it is marked do-not-dump ("dd").
    let ram = vm_limits().memory_bytes.unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", vm.handle.init.pid)).unwrap();
    let (mut size, mut guest_ram_flags, mut mergeable) = (0u64, Vec::new(), Vec::new());
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                size = b - a;
                continue;
            }
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let flags: Vec<&str> = flags.split_whitespace().collect();
            if flags.contains(&"mg") {
                mergeable.push(size);
            }
            if size == ram {
                guest_ram_flags.push(flags.join(" "));
            }
        }
    }
    assert!(
        mergeable.is_empty(),
        "mergeable mappings of sizes {mergeable:?}"
    );
    // Nor is any of QEMU's memory written into a core dump: none may be made (a
    // limit of 1 also stops a dump piped to a handler, which ignores the limit's size).
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", vm.handle.init.pid)).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(
        core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
        ["1", "1"],
        "{core}"
    );
    assert_eq!(guest_ram_flags.len(), 1, "{guest_ram_flags:?}");
    assert!(
        guest_ram_flags[0].split(' ').any(|f| f == "dd"),
        "guest RAM would be dumped: {}",
        guest_ram_flags[0]
    );
}

#[test]
fn qemu_is_in_its_cgroup_from_its_first_instruction() {
    if let Some(why) = missing_requirement() {
        skip(&why);
        return;
    }
    if space_worker::substrate::jail::cgroup::CgroupHierarchy::detect().is_err() {
        skip("no cgroups on this host");
        return;
    }
    let env = Env::new();
    // A "QEMU" that writes down its cgroup as it starts, then fails: a join after
    // the spawn would find it already written from outside the VM's cgroup.
    let bin = env.data.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let seen = env.data.path().join("cgroup-at-exec");
    let fake = bin.join("qemu");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ncat /proc/self/cgroup > {}\nexit 1\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let driver = QemuDriver::new(
        VmConfig {
            qemu: fake,
            kernel_dir: kernel_dir(),
            agent: space_testkit::bin::static_agent(),
            accel: Accel::Tcg,
            cgroup_parent: env.cgroup_parent.clone(),
            uid_ranges: None,
            transport: space_worker::substrate::vm::TransportChoice::Serial,
        },
        env.data.path(),
    )
    .unwrap();
    let a = activation();
    assert!(driver.launch(&env.spec(&a, None)).is_err());
    let cgroup = std::fs::read_to_string(&seen).unwrap();
    assert!(
        cgroup.contains(&env.cgroup_parent),
        "QEMU started outside its cgroup: {cgroup}"
    );
}
