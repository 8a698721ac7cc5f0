//! Warm jails: launched ahead of demand, they serve nothing until activated, then are
//! indistinguishable from a jail launched for the execution; a discarded or failed
//! one leaves nothing behind.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec, ExitOutcome};
use space_worker::daemon::launch::{self, Binaries, Layer, WarmBridge};
use space_worker::daemon::warm::Warm;
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{AgentCommand, ExecutionKey, Limits, SandboxHandle};

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).unwrap();
    out
}

struct Env {
    driver: Arc<JailDriver>,
    bins: Binaries,
    data: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        let parent = &self.driver.config().cgroup_parent;
        for dir in self.driver.hierarchy().parent_dirs(parent) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn env(name: &str) -> Option<Env> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: warm jails need root (namespaces, mounts, cgroups, sethostname)");
        return None;
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        eprintln!("SKIPPED: warm jails need a cgroup filesystem at /sys/fs/cgroup");
        return None;
    }
    let bins = Binaries {
        agent: space_testkit::workspace_bin("spaced-guest", "spaced-guest"),
        bridge: space_testkit::workspace_bin("spaced-host", "spaced-host"),
    };
    let mut config = JailConfig::new(space_testkit::workspace_bin("space-jail", "space-jail"));
    config.cgroup_parent = format!("space-test-warm-{name}-{}", std::process::id());
    Some(Env {
        driver: Arc::new(JailDriver::new(config).unwrap()),
        bins,
        data: tempfile::tempdir().unwrap(),
    })
}

fn prelaunch(e: &Env) -> space_worker::substrate::jail::warm::WarmJail {
    e.driver
        .prelaunch(
            e.data.path(),
            Limits::default(),
            AgentCommand::spaced_guest(&e.bins.agent),
        )
        .unwrap()
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

fn gone(handle: &SandboxHandle) {
    for p in [Some(handle.init), handle.agent].into_iter().flatten() {
        assert!(!p.is_alive(), "process {} survived", p.pid);
    }
    assert!(
        !handle.sandbox_dir.exists(),
        "{}",
        handle.sandbox_dir.display()
    );
    assert!(!handle.socket_path.exists());
    for dir in handle.cgroups.dirs() {
        assert!(!dir.exists(), "{}", dir.display());
    }
}

#[test]
fn a_warm_jail_answers_nothing_before_activation_then_serves_its_execution() {
    let Some(e) = env("serve") else { return };
    let warm = prelaunch(&e);
    let before = warm.handle().clone();
    assert!(before.key.sandbox_id.starts_with("warm_"));
    // A handshake sent now waits: the agent has no identity to prove.
    let socket = before.socket_path.clone();
    let act = activation();
    let (nonce, secret) = (random(), act.secret);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let stream = UnixStream::connect(&socket).unwrap();
        let _ = tx.send(
            AgentConnection::handshake_verified(stream, nonce, &secret).map(|c| c.identity()),
        );
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a warm agent answered before its activation"
    );

    let warm = Warm {
        jail: warm,
        bridge: WarmBridge::spawn(&e.bins).unwrap(),
    };
    let (handle, bridge) = launch::launch_warm(&e.driver, &e.bins, warm, &act).unwrap();
    // The waiting handshake is answered by the activated execution, proven with its secret.
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap(),
        act.identity()
    );
    // Named as a jail launched for this execution would be.
    let key = ExecutionKey::new(act.sandbox.to_string(), act.execution_id.to_string());
    assert_eq!(handle.key, key);
    assert!(handle.sandbox_dir.ends_with(key.dir_name()));
    assert!(!before.sandbox_dir.exists());
    let renamed = e
        .driver
        .hierarchy()
        .set_for(&e.driver.config().cgroup_parent, &key.dir_name());
    assert_eq!(handle.cgroups, renamed);
    for (old, new) in before.cgroups.dirs().iter().zip(renamed.dirs()) {
        assert!(!old.exists() && new.exists(), "{}", new.display());
    }
    assert!(
        handle
            .cgroups
            .procs()
            .unwrap()
            .contains(&handle.agent.unwrap().pid)
    );

    let mut c = spaced_host::connect(&launch::bridge_target(&bridge, &act)).unwrap();
    assert_eq!(c.identity(), act.identity());
    let out = c
        .exec(ExecSpec::shell("hostname; echo $$ > /root/pid"))
        .unwrap();
    assert_eq!(out.status.outcome, ExitOutcome::Code(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        act.sandbox.to_string().replace('_', "-")
    );
    assert!(handle.upper_dir.join("root/pid").is_file());
    drop(c);

    launch::teardown(
        &*e.driver,
        e.data.path(),
        Some(&handle),
        Some(&bridge),
        Layer::Discard,
    );
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(bridge.process.pid as i32), None);
    gone(&handle);
}

#[test]
fn a_discarded_warm_jail_leaves_nothing() {
    let Some(e) = env("discard") else { return };
    let warm = prelaunch(&e);
    let handle = warm.handle().clone();
    assert!(handle.init.is_alive());
    e.driver.discard(warm);
    gone(&handle);
}

#[test]
fn a_failed_activation_destroys_the_warm_jail() {
    let Some(e) = env("fail") else { return };
    let warm = prelaunch(&e);
    let handle = warm.handle().clone();
    // A key that could escape its directory is refused; the jail goes.
    let bad = ExecutionKey::new("../escape", "1");
    assert!(e.driver.activate(warm, &bad, b"{}", None).is_err());
    gone(&handle);

    // Taken by an existing directory: refused, nothing renamed over it, jail gone.
    let warm = prelaunch(&e);
    let handle = warm.handle().clone();
    let act = activation();
    let key = ExecutionKey::new(act.sandbox.to_string(), act.execution_id.to_string());
    let taken = e.data.path().join("sandboxes").join(key.dir_name());
    std::fs::create_dir_all(taken.join("keep")).unwrap();
    assert!(e.driver.activate(warm, &key, &act.encode(), None).is_err());
    assert!(
        taken.join("keep").is_dir(),
        "an existing directory was replaced"
    );
    gone(&handle);
}
