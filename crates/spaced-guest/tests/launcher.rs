//! The agent started the way the jail launcher starts it: listener and activation
//! record on inherited descriptors.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::{Activation, ExecSpec};
use space_testkit::rng::random;

/// A duplicate of `fd` without close-on-exec, so the next spawned process inherits it.
fn inheritable(fd: &impl std::os::fd::AsFd) -> OwnedFd {
    let dup = rustix::io::fcntl_dupfd_cloexec(fd, 10).expect("dup");
    rustix::io::fcntl_setfd(&dup, rustix::io::FdFlags::empty()).expect("clear cloexec");
    dup
}

#[test]
fn agent_serves_on_an_inherited_listener_with_an_activation_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("jail.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(9),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    let listen_fd = inheritable(&listener);
    let activation_fd = inheritable(&read_end);
    drop(read_end);
    let mut child = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
        .arg("serve")
        .arg("--listen-fd")
        .arg(listen_fd.as_raw_fd().to_string())
        .arg("--activation-fd")
        .arg(activation_fd.as_raw_fd().to_string())
        .arg("--home")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    drop((listen_fd, activation_fd));
    // The agent reads until EOF: it must not serve before the launcher closes its end.
    let mut w = std::fs::File::from(write_end);
    w.write_all(&activation.encode()).unwrap();
    drop(w);

    let stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut conn =
        AgentConnection::handshake_verified(stream, random(), &activation.secret).unwrap();
    assert_eq!(conn.identity(), activation.identity());
    // Neither the listener nor the activation pipe reaches a child.
    let out = conn
        .exec(ExecSpec::shell("ls /proc/self/fd | wc -l"))
        .unwrap();
    let n: u32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(n <= 4, "child sees {n} descriptors");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn agent_refuses_to_start_on_a_descriptor_that_is_not_a_listener() {
    let dir = tempfile::tempdir().unwrap();
    let act = dir.path().join("a.json");
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: Generation(1),
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    std::fs::write(&act, activation.encode()).unwrap();
    let (a, _b) = UnixStream::pair().unwrap();
    let fd = inheritable(&a);
    let out = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
        .arg("serve")
        .arg("--listen-fd")
        .arg(fd.as_raw_fd().to_string())
        .arg("--activation-file")
        .arg(&act)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a listening socket"));
}

#[test]
fn agent_refuses_an_invalid_activation_record() {
    let dir = tempfile::tempdir().unwrap();
    let act = dir.path().join("a.json");
    std::fs::write(&act, br#"{"sandbox":"sbx_x"}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
        .arg("serve")
        .arg("--listen")
        .arg(dir.path().join("s.sock"))
        .arg("--activation-file")
        .arg(&act)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("activation"));
    assert!(
        !dir.path().join("s.sock").exists(),
        "bound before validating"
    );
}

#[test]
fn bad_flags_exit_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_spaced-guest"))
        .args(["serve", "--listen-fd", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
}
