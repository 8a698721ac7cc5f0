//! A real agent and a real bridge (`spaced-host`) in a temporary directory, killed on
//! drop: the host side of one sandbox without a jail.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_peer::{FileId, LiveProcess, ProcessIdentity};
use space_proto::guest::Activation;
use spaced_host::{BridgeSpec, BridgeTarget};

use crate::bin::workspace_bin;
use crate::process::Proc;

impl Proc {
    /// The identity of the running process (as a worker records the one it launched).
    pub fn identity(&self) -> ProcessIdentity {
        LiveProcess::open(self.0.id())
            .expect("the process runs")
            .identity
    }
}

/// A fixed activation of sandbox `5b…`, generation 7, whose execution ID is `exe`
/// repeated and whose secret is `secret` repeated.
pub fn activation(exe: u8, secret: u8) -> Activation {
    Activation {
        sandbox: SandboxId::from_bytes([0x5b; 16]),
        generation: Generation(7),
        execution_id: ExecutionId::from_bytes([exe; 16]),
        activation: 1,
        secret: [secret; 32],
    }
}

/// The `spaced-host` binary.
pub fn bridge_bin() -> PathBuf {
    workspace_bin("spaced-host", "spaced-host")
}

/// Starts an agent serving `activation` at `socket` (see [`crate::agent::serve`]).
pub fn start_agent(dir: &Path, socket: &Path, activation: &Activation) -> Proc {
    crate::agent::serve(dir, socket, activation, &[])
}

/// Starts `bin` as a bridge with `spec`, waiting for its `ready` line.
pub fn start_bridge_with(bin: &Path, spec: &BridgeSpec) -> Proc {
    let mut child = Command::new(bin)
        .args(["--spec-fd", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the bridge");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(&spec.encode()).expect("write the spec");
    drop(stdin);
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("the bridge's first line");
    assert_eq!(line.trim(), "ready", "bridge did not start");
    Proc(child)
}

/// An agent and its bridge, both real processes, in a 0700 run directory.
#[derive(Debug)]
pub struct Sandbox {
    /// Holds `run/` and the agent's activation file and home (`home/`).
    pub dir: tempfile::TempDir,
    /// The sockets' directory.
    pub run: PathBuf,
    /// The agent.
    pub agent: Proc,
    /// The bridge.
    pub bridge: Proc,
    /// What the bridge was started with.
    pub spec: BridgeSpec,
    /// What a worker connects to.
    pub target: BridgeTarget,
}

impl Sandbox {
    /// An agent and a bridge of `activation(0xe7, 0x42)`.
    pub fn start() -> Self {
        Self::start_with(
            &activation(0xe7, 0x42),
            &activation(0xe7, 0x42),
            bridge_bin(),
        )
    }

    /// The agent serves `served`; the bridge (binary `bridge`) expects `expected`.
    pub fn start_with(served: &Activation, expected: &Activation, bridge: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run");
        space_peer::prepare_socket_dir(&run).expect("run dir");
        let agent_socket = run.join("agent.sock");
        let agent = start_agent(dir.path(), &agent_socket, served);
        let spec = BridgeSpec {
            listen: run.join("bridge.sock"),
            agent_socket,
            worker_uid: rustix::process::geteuid().as_raw(),
            agent: agent.identity(),
            activation: expected.clone(),
            max_connections: 64,
            transport: spaced_host::Transport::Socket,
        };
        let bridge_proc = start_bridge_with(&bridge, &spec);
        let mut bridge_identity = bridge_proc.identity();
        // The worker records the executable it meant to launch, not whatever ran.
        bridge_identity.exe = FileId::of_path(&bridge_bin()).expect("the bridge binary");
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
