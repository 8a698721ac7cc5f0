//! Per-operation latency of the agent through one direct, already handshaken
//! connection (the pooled case): the baseline that end-to-end paths are compared with
//! (QUALITY.md P3).
//!
//! `cargo bench -p spaced-guest --bench agent`

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec};

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .expect("read /dev/urandom");
    out
}

struct Agent {
    child: Child,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    secret: [u8; 32],
    home: std::path::PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent() -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(1),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let act = dir.path().join("activation.json");
    std::fs::write(&act, activation.encode()).expect("write activation");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir home");
    let socket = dir.path().join("agent.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
        .args(["serve", "--listen"])
        .arg(&socket)
        .arg("--activation-file")
        .arg(&act)
        .arg("--home")
        .arg(&home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn spaced-guest");
    let start = Instant::now();
    while !Path::new(&socket).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "agent did not listen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Agent {
        child,
        _dir: dir,
        socket,
        secret: activation.secret,
        home,
    }
}

fn connect(agent: &Agent) -> AgentConnection {
    let stream = UnixStream::connect(&agent.socket).expect("connect");
    AgentConnection::handshake_verified(stream, random(), &agent.secret).expect("handshake")
}

/// The floor under every agent operation: a 64-byte round trip over a Unix socket to
/// an echo thread, measured in the same run.
fn socket_round_trip(c: &mut Criterion) {
    use std::io::Write;
    let (mut client, mut server) = UnixStream::pair().expect("socketpair");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while server.read_exact(&mut buf).is_ok() {
            if server.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 64];
    c.benchmark_group("baseline")
        .throughput(Throughput::Elements(1))
        .bench_function("unix_socket_64b_round_trip", |b| {
            b.iter(|| {
                client.write_all(&buf).expect("write");
                client.read_exact(&mut buf).expect("read");
            });
        });
    drop(client);
    let _ = echo.join();
}

fn bench_agent(c: &mut Criterion) {
    let agent = start_agent();
    std::fs::write(agent.home.join("4k"), vec![7u8; 4096]).expect("write 4k");
    let mut conn = connect(&agent);
    let mut group = c.benchmark_group("agent_direct");
    group.throughput(Throughput::Elements(1));
    group.bench_function("stat", |b| {
        b.iter(|| conn.stat("4k").expect("stat"));
    });
    group.bench_function("read_4k", |b| {
        b.iter(|| {
            let data = conn.read_file("4k", 1 << 20).expect("read");
            assert_eq!(data.len(), 4096);
        });
    });
    group.bench_function("handshake", |b| {
        b.iter(|| connect(&agent));
    });
    group.sample_size(20);
    group.bench_function("exec_true", |b| {
        b.iter(|| conn.exec(ExecSpec::command(["/bin/true"])).expect("exec"));
    });
    group.finish();
}

criterion_group!(benches, socket_round_trip, bench_agent);
criterion_main!(benches);
