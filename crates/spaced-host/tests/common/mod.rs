//! A real agent and a real bridge in a temporary directory, killed on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, SandboxId};
use space_peer::{FileId, LiveProcess, ProcessIdentity};
use space_proto::guest::Activation;
use spaced_host::{BridgeSpec, BridgeTarget};

/// A child process killed and reaped on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn identity(&self) -> ProcessIdentity {
        LiveProcess::open(self.0.id()).unwrap().identity
    }
}

pub fn activation(exe: u8, secret: u8) -> Activation {
    Activation {
        sandbox: SandboxId::from_bytes([0x5b; 16]),
        generation: 7,
        execution_id: ExecutionId::from_bytes([exe; 16]),
        activation: 1,
        secret: [secret; 32],
    }
}

pub fn agent_bin() -> PathBuf {
    space_testkit::workspace_bin("spaced-guest", "spaced-guest")
}

pub fn bridge_bin() -> PathBuf {
    space_testkit::workspace_bin("spaced-host", "spaced-host")
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts an agent serving `activation` at `socket`.
pub fn start_agent(dir: &Path, socket: &Path, activation: &Activation) -> Proc {
    let file = dir.join(format!("activation-{}", activation.execution_id));
    std::fs::write(&file, activation.encode()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _ = std::fs::remove_file(socket);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let child = Command::new(agent_bin())
        .args(["serve", "--listen"])
        .arg(socket)
        .arg("--activation-file")
        .arg(&file)
        .arg("--home")
        .arg(&home)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(socket);
    Proc(child)
}

/// Starts `bin` as a bridge with `spec`, waiting for its `ready` line.
pub fn start_bridge_with(bin: &Path, spec: &BridgeSpec) -> Proc {
    let mut child = Command::new(bin)
        .args(["--spec-fd", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&spec.encode()).unwrap();
    drop(stdin);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "bridge did not start");
    Proc(child)
}

/// An agent and its bridge, both real processes, in a 0700 run directory.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub run: PathBuf,
    pub agent: Proc,
    pub bridge: Proc,
    pub spec: BridgeSpec,
    pub target: BridgeTarget,
}

impl Sandbox {
    pub fn start() -> Self {
        Self::start_with(
            &activation(0xe7, 0x42),
            &activation(0xe7, 0x42),
            bridge_bin(),
        )
    }

    /// The agent serves `served`; the bridge expects `expected`.
    pub fn start_with(served: &Activation, expected: &Activation, bridge: PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        space_peer::prepare_socket_dir(&run).unwrap();
        let agent_socket = run.join("agent.sock");
        let agent = start_agent(dir.path(), &agent_socket, served);
        let spec = BridgeSpec {
            listen: run.join("bridge.sock"),
            agent_socket,
            worker_uid: rustix::process::geteuid().as_raw(),
            agent: agent.identity(),
            activation: expected.clone(),
            max_connections: 64,
        };
        let bridge_proc = start_bridge_with(&bridge, &spec);
        let mut bridge_identity = bridge_proc.identity();
        // The worker records the executable it meant to launch, not whatever ran.
        bridge_identity.exe = FileId::of_path(&bridge_bin()).unwrap();
        let target = BridgeTarget {
            socket: spec.listen.clone(),
            bridge: bridge_identity,
            served: expected.identity(),
            secret: expected.secret,
        };
        Self {
            dir,
            run,
            agent,
            bridge: bridge_proc,
            spec,
            target,
        }
    }
}
