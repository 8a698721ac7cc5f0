//! Starts the real agent binary on a Unix socket in a temporary directory.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_identity::{ExecutionId, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::Activation;

pub fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .expect("read /dev/urandom");
    out
}

pub struct AgentProcess {
    child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub home: PathBuf,
    pub activation: Activation,
}

impl AgentProcess {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let activation = Activation {
            sandbox: SandboxId::from_bytes(random()),
            generation: 4,
            execution_id: ExecutionId::from_bytes(random()),
            activation: 2,
            secret: random(),
        };
        let act_path = dir.path().join("activation.json");
        std::fs::write(&act_path, activation.encode()).expect("write activation");
        let home = dir.path().join("home");
        std::fs::create_dir(&home).expect("mkdir home");
        let socket = dir.path().join("agent.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
            .arg("serve")
            .arg("--listen")
            .arg(&socket)
            .arg("--activation-file")
            .arg(&act_path)
            .arg("--home")
            .arg(&home)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn spaced-guest");
        let agent = Self {
            child,
            dir,
            socket,
            home,
            activation,
        };
        let start = Instant::now();
        while UnixStream::connect(&agent.socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent did not listen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        agent
    }

    /// A raw, un-handshaken connection.
    pub fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// A connection whose handshake proof verified with the activation's secret.
    pub fn connect(&self) -> AgentConnection {
        AgentConnection::handshake_verified(self.raw(), random(), &self.activation.secret)
            .expect("handshake")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn path(&self, rel: &str) -> String {
        self.home.join(rel).to_string_lossy().into_owned()
    }

    pub fn vm_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// Whether the agent process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn home_path(&self) -> &Path {
        &self.home
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
