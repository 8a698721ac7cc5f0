//! The bridge's vsock transport (a Firecracker VM's) against a stand-in for
//! Firecracker's hybrid vsock socket: a thread of this test that listens where the
//! VMM would, answers the `CONNECT` as Firecracker does, and then speaks the guest's
//! side with the real guest code (`spaced_guest::vsock::serve_connection`, the agent
//! a VM runs). Firecracker itself does not run on this host class; the driver's own
//! tests (space-worker's `tests/firecracker.rs`) need it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use space_proto::guest::{ExecSpec, ExitOutcome};
use space_testkit::bridge::{activation, bridge_bin, start_bridge_with};

/// `run/` (0700) holding the VMM's own directory `fc-1/` (0700) as the driver makes
/// them.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    space_peer::prepare_socket_dir(&run).unwrap();
    let vmm = run.join("fc-1");
    space_peer::prepare_socket_dir(&vmm).unwrap();
    (t, run, vmm)
}

/// The stand-in VMM at `socket`: for each of `connections` connections reads the
/// `CONNECT` line, and (when it names the agent's port) answers `OK` and serves the
/// guest's end of the link with the real guest code until the link ends.
fn fake_firecracker(socket: &Path, connections: usize) -> std::thread::JoinHandle<Vec<String>> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let mut asked = Vec::new();
        for _ in 0..connections {
            let Ok((mut conn, _)) = listener.accept() else {
                break;
            };
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while conn.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' && line.len() < 64 {
                line.push(b[0]);
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            asked.push(line.clone());
            if line != format!("CONNECT {}", space_proto::vm::VSOCK_PORT) {
                continue;
            }
            // Firecracker's acknowledgement names the host side's port.
            conn.write_all(b"OK 1073741824\n").unwrap();
            let _ = spaced_guest::vsock::serve_connection(OwnedFd::from(conn), 16, false);
        }
        asked
    })
}

fn spec(
    run: &Path,
    socket: PathBuf,
    agent: space_peer::ProcessIdentity,
) -> spaced_host::BridgeSpec {
    spaced_host::BridgeSpec {
        listen: run.join("bridge.sock"),
        agent_socket: socket,
        worker_uid: rustix::process::geteuid().as_raw(),
        agent,
        activation: activation(0xf1, 0x42),
        max_connections: 4,
        transport: spaced_host::Transport::Vsock,
    }
}

fn this_process() -> space_peer::ProcessIdentity {
    space_peer::LiveProcess::open(std::process::id())
        .unwrap()
        .identity
}

/// Starts a bridge of `spec`: its first line (`ready`, or nothing if it refused) and
/// its stderr.
fn bridge_outcome(spec: &spaced_host::BridgeSpec) -> (String, String) {
    let mut child = Command::new(bridge_bin())
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
fn the_bridge_reaches_the_guest_agent_over_the_vmms_hybrid_vsock_socket() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    let asked = fake_firecracker(&socket, 1);
    let spec = spec(&run, socket, this_process());
    let mut bridge = start_bridge_with(&bridge_bin(), &spec);
    let target = spaced_host::BridgeTarget {
        socket: spec.listen.clone(),
        bridge: bridge.identity(),
        served: spec.activation.identity(),
        secret: spec.activation.secret,
    };
    // Several worker connections: streams of the one link.
    for _ in 0..3 {
        let mut conn = spaced_host::connect(&target).unwrap();
        assert_eq!(conn.identity(), target.served);
        let out = conn.exec(ExecSpec::shell("echo over vsock")).unwrap();
        assert_eq!(out.stdout, b"over vsock\n");
        assert_eq!(out.status.outcome, ExitOutcome::Code(0));
    }
    // The bridge ends with its link: the guest's end sees the link end, and the
    // stand-in its one connection.
    bridge.0.kill().unwrap();
    bridge.0.wait().unwrap();
    assert_eq!(
        asked.join().unwrap(),
        [format!("CONNECT {}", space_proto::vm::VSOCK_PORT)]
    );
}

#[test]
fn a_vsock_socket_whose_peer_is_not_the_recorded_vmm_is_refused() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    let asked = fake_firecracker(&socket, 1);
    // The record names another process (a Firecracker that was replaced): refused
    // before a byte is sent to the socket.
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let other_id = space_peer::LiveProcess::open(other.id()).unwrap().identity;
    let (line, err) = bridge_outcome(&spec(&run, socket.clone(), other_id));
    other.kill().unwrap();
    other.wait().unwrap();
    assert_ne!(line.trim(), "ready");
    assert!(
        err.contains("vsock transport: guest transport refused: peer process differs"),
        "{err}"
    );
    // Nothing asked for the guest's port.
    let _ = std::os::unix::net::UnixStream::connect(&socket);
    let asked = asked.join().unwrap();
    assert_eq!(asked, [String::new()], "the refused bridge sent {asked:?}");
}

#[test]
fn a_vsock_socket_others_can_reach_or_without_a_listener_in_the_guest_is_refused() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    // A stand-in that closes without an acknowledgement: no agent listens.
    let listener = UnixListener::bind(&socket).unwrap();
    let closer = std::thread::spawn(move || {
        if let Ok((mut c, _)) = listener.accept() {
            let mut b = [0u8; 16];
            let _ = c.read(&mut b);
        }
    });
    let (line, err) = bridge_outcome(&spec(&run, socket.clone(), this_process()));
    assert_ne!(line.trim(), "ready");
    assert!(err.contains("nothing listens on vsock port"), "{err}");
    closer.join().unwrap();
    // The VMM's directory open to others: refused before connecting.
    std::fs::set_permissions(&vmm, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (line, err) = bridge_outcome(&spec(&run, socket, this_process()));
    assert_ne!(line.trim(), "ready");
    assert!(err.contains("accessible to group or others"), "{err}");
}
