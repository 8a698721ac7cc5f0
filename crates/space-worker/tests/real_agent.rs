//! The whole worker-side stack with the real components: a jail running `spaced-guest`,
//! its verified `spaced-host` bridge, and the worker's bridge client.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{
    Activation, AgentBody, ExecSpec, ExitOutcome, Input, Operation, PtySize, WatchEvent,
};
use space_worker::daemon::launch::{self, Binaries, Layer};
use space_worker::daemon::records::BridgeRecord;
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{Limits, SandboxHandle, Substrate, TemplateSpec};

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).unwrap();
    out
}

/// One launched execution, destroyed on drop (also when a test fails).
struct Running {
    driver: Arc<JailDriver>,
    data: tempfile::TempDir,
    handle: SandboxHandle,
    bridge: BridgeRecord,
    activation: Activation,
}

impl Drop for Running {
    fn drop(&mut self) {
        launch::teardown(
            &*self.driver,
            self.data.path(),
            Some(&self.handle),
            Some(&self.bridge),
            Layer::Discard,
        );
        // This process's cgroup parents go once its last jail has (rmdir refuses a
        // parent that still holds another test's jail).
        let parent = &self.driver.config().cgroup_parent;
        for dir in self.driver.hierarchy().parent_dirs(parent) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Running {
    fn connect(&self) -> AgentConnection {
        spaced_host::connect(&launch::bridge_target(&self.bridge, &self.activation)).unwrap()
    }
}

fn start() -> Option<Running> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: the real-agent tests need root (namespaces, mounts, cgroups)");
        return None;
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        eprintln!("SKIPPED: the real-agent tests need a cgroup filesystem at /sys/fs/cgroup");
        return None;
    }
    let bins = Binaries {
        agent: space_testkit::workspace_bin("spaced-guest", "spaced-guest"),
        bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
    };
    let mut config = JailConfig::new(space_testkit::workspace_bin("space-jail", "space-jail"));
    config.cgroup_parent = format!("space-test-real-{}", std::process::id());
    let driver = Arc::new(JailDriver::new(config).unwrap());
    let data = tempfile::tempdir().unwrap();
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(3),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let (handle, bridge) = launch::launch(
        &*driver,
        &bins,
        data.path(),
        &activation,
        Limits::default(),
        &TemplateSpec::Default,
    )
    .unwrap();
    Some(Running {
        driver,
        data,
        handle,
        bridge,
        activation,
    })
}

#[test]
fn launched_sandbox_runs_echo_and_every_answer_names_its_execution() {
    let Some(r) = start() else { return };
    let mut c = r.connect();
    assert_eq!(c.identity(), r.activation.identity());
    let out = c.exec(ExecSpec::shell("echo hello; hostname")).unwrap();
    assert_eq!(out.status.outcome, ExitOutcome::Code(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("hello\n"), "{text}");
}

#[test]
fn file_written_through_the_bridge_reads_back_and_lands_in_the_upper_layer() {
    let Some(r) = start() else { return };
    let mut c = r.connect();
    c.write_file("/root/data.txt", b"sandboxed", None).unwrap();
    assert_eq!(
        c.read_file("/root/data.txt", 1 << 20).unwrap(),
        b"sandboxed"
    );
    assert_eq!(
        std::fs::read(r.handle.upper_dir.join("root/data.txt")).unwrap(),
        b"sandboxed"
    );
}

#[test]
fn pty_session_in_the_jail_has_a_terminal() {
    let Some(r) = start() else { return };
    let mut c = r.connect();
    let mut spec = ExecSpec::shell("tty; stty size");
    spec.pty = Some(PtySize {
        rows: 33,
        cols: 101,
    });
    let out = c.exec(spec).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("33 101"), "{text}");
}

#[test]
fn watch_sees_a_file_created_by_an_exec() {
    let Some(r) = start() else { return };
    let mut watcher = r.connect();
    let id = watcher
        .send_request(Operation::Watch {
            path: "/root".into(),
            recursive: false,
        })
        .unwrap();
    assert_eq!(watcher.next_answer(id).unwrap(), AgentBody::WatchStarted);
    let mut c = r.connect();
    c.exec(ExecSpec::shell("echo x > /root/new-file")).unwrap();
    watcher
        .stream_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    loop {
        match watcher.next_answer(id).unwrap() {
            AgentBody::WatchEvent(WatchEvent::Created { path, .. }) if path == "new-file" => break,
            AgentBody::WatchEvent(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    watcher.send_input(id, Input::Close).unwrap();
}

#[test]
fn pause_makes_work_wait_and_resume_lets_it_finish() {
    let Some(r) = start() else { return };
    let mut c = r.connect();
    c.exec(ExecSpec::shell("true")).unwrap();
    r.driver.pause(&r.handle).unwrap();
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let out = c.exec(ExecSpec::shell("echo done")).unwrap();
        (out, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !waiter.is_finished(),
        "work ran while the sandbox was paused"
    );
    r.driver.resume(&r.handle).unwrap();
    let (out, took) = waiter.join().unwrap();
    assert_eq!(out.stdout, b"done\n");
    assert!(took >= Duration::from_millis(400));
}

#[test]
fn destroy_leaves_no_process_cgroup_socket_or_directory() {
    let Some(r) = start() else { return };
    let pids = [
        r.handle.init.pid as u32,
        r.handle.agent.unwrap().pid as u32,
        r.bridge.process.pid,
    ];
    let (dir, socket, bridge_socket) = (
        r.handle.sandbox_dir.clone(),
        r.handle.socket_path.clone(),
        r.bridge.socket.clone(),
    );
    let cgroups = r.handle.cgroups.clone();
    drop(r);
    // The bridge is a child of this test process: reap it.
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pids[2] as i32), None);
    for pid in pids {
        let alive =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "process {pid} survived destroy");
    }
    assert!(!dir.exists());
    assert!(!socket.exists());
    assert!(!bridge_socket.exists());
    assert!(cgroups.procs().is_err() || cgroups.procs().unwrap().is_empty());
}

#[test]
fn kept_layer_carries_the_files_into_the_next_execution() {
    let Some(r) = start() else { return };
    r.connect()
        .write_file("/root/carry.txt", b"across", None)
        .unwrap();
    let kept = launch::kept_layer(r.data.path(), &r.activation.sandbox);
    r.driver.destroy_keeping_layer(&r.handle, &kept).unwrap();
    assert!(kept.join("upper/root/carry.txt").is_file());
    // The next execution of the same sandbox starts from the kept layer.
    let bins = Binaries {
        agent: space_testkit::workspace_bin("spaced-guest", "spaced-guest"),
        bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
    };
    let next = Activation {
        generation: Generation(4),
        execution_id: ExecutionId::from_bytes(random()),
        secret: random(),
        ..r.activation.clone()
    };
    let (handle, bridge) = launch::launch(
        &*r.driver,
        &bins,
        r.data.path(),
        &next,
        Limits::default(),
        &TemplateSpec::Default,
    )
    .unwrap();
    let mut c = spaced_host::connect(&launch::bridge_target(&bridge, &next)).unwrap();
    assert_eq!(c.read_file("/root/carry.txt", 1024).unwrap(), b"across");
    assert!(!kept.exists(), "the layer moved into the new execution");
    launch::teardown(
        &*r.driver,
        r.data.path(),
        Some(&handle),
        Some(&bridge),
        Layer::Discard,
    );
    // The first bridge still runs: `r` tears it down on drop.
}

#[test]
fn the_workload_cannot_write_the_agents_memory_or_read_its_environment() {
    let Some(r) = start() else { return };
    let mut c = r.connect();
    // The agent is PID 2 of the jail, under the workload's own uid; it holds the
    // activation secret. Open its memory for writing, its environment, maps, fds.
    let script = "
import os
agent = [p for p in os.listdir('/proc') if p.isdigit() and open('/proc/%s/comm' % p).read().strip() == 'spaced-guest'][0]
for name, mode in [('mem', 'r+b'), ('environ', 'rb'), ('maps', 'rb')]:
    try:
        open('/proc/%s/%s' % (agent, name), mode).read(1); print('opened', name)
    except OSError as e:
        print('refused', name, e.errno)
# The directory may list numbers (it belongs to the namespace's root); every
# descriptor itself stays out of reach.
try:
    fds = os.listdir('/proc/%s/fd' % agent)
except OSError as e:
    fds = []
    print('refused fd', e.errno)
for fd in fds:
    path = '/proc/%s/fd/%s' % (agent, fd)
    for what, call in [('open', lambda: os.close(os.open(path, os.O_RDONLY))), ('readlink', lambda: os.readlink(path))]:
        try:
            call(); print('reached', what, fd)
        except OSError as e:
            pass
print('checked', len(fds))
";
    let out = c
        .exec(ExecSpec::shell(&format!("python3 -c \"{script}\"")))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !text.contains("opened") && !text.contains("reached"),
        "{text}"
    );
    assert!(text.matches("refused").count() >= 3, "{text}");
    assert!(text.contains("checked"), "{text}");
}

#[test]
fn file_api_paths_with_dots_or_links_never_leave_the_sandbox_root() {
    let Some(r) = start() else { return };
    // A host file the sandbox must never read or write through the file API.
    let host = tempfile::Builder::new()
        .prefix("space-host-marker")
        .tempfile_in("/tmp")
        .unwrap();
    std::fs::write(host.path(), "host only").unwrap();
    let host_path = host.path().display().to_string();
    let mut c = r.connect();
    c.exec(ExecSpec::shell(&format!(
        "ln -s {host_path} /root/to-host && ln -s / /root/to-root"
    )))
    .unwrap();
    let dotted = format!("/root/../../../..{host_path}");
    for path in [
        host_path.clone(),
        dotted.clone(),
        "/root/to-host".to_owned(),
        format!("/root/to-root{host_path}"),
    ] {
        // Inside the jail these names resolve in the jail's own tree, where the
        // marker does not exist: the read fails, it never returns the host's bytes.
        let read = c.read_file(&path, 1 << 20);
        assert!(
            !matches!(&read, Ok(bytes) if bytes == b"host only"),
            "{path} read the host file"
        );
        let _ = c.write_file(&path, b"from the sandbox", None);
    }
    assert_eq!(std::fs::read_to_string(host.path()).unwrap(), "host only");
    // In the layer, the link is still a link or was replaced by the sandbox's own file
    // (the agent writes by rename): never a way to the host.
    let at = r.handle.upper_dir.join("root/to-host");
    let meta = std::fs::symlink_metadata(&at).unwrap();
    assert!(
        meta.file_type().is_symlink()
            || (meta.is_file() && std::fs::read(&at).unwrap() == b"from the sandbox"),
        "{meta:?}"
    );
}
