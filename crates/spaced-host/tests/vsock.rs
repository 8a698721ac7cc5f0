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
    fake_firecracker_resettable(socket, connections, Default::default())
}

/// [`fake_firecracker`] that also keeps a handle of every acknowledged connection in
/// `open`, so that a test can reset it as Firecracker does at a snapshot.
fn fake_firecracker_resettable(
    socket: &Path,
    connections: usize,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::os::unix::net::UnixStream>>>,
) -> std::thread::JoinHandle<Vec<String>> {
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
            open.lock().unwrap().push(conn.try_clone().unwrap());
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
fn a_guest_not_listening_yet_is_asked_again_until_the_wait_ends() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    // A VMM whose guest never listens: every CONNECT is closed unanswered.
    let listener = UnixListener::bind(&socket).unwrap();
    let closer = std::thread::spawn(move || {
        let mut asked = 0;
        listener.set_nonblocking(true).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::time::Instant::now() < until {
            match listener.accept() {
                Ok((mut c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    let mut b = [0u8; 16];
                    let _ = c.read(&mut b);
                    asked += 1;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        asked
    });
    let started = std::time::Instant::now();
    let err = spaced_host::vsock::connect_agent(
        &spec(&run, socket, this_process()),
        std::time::Duration::from_millis(600),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("nothing listens on vsock port"), "{err}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(600));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(closer.join().unwrap() > 1, "asked only once");
}

#[test]
fn a_vmm_socket_directory_open_to_others_is_refused() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    let _listener = UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&vmm, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (line, err) = bridge_outcome(&spec(&run, socket, this_process()));
    assert_ne!(line.trim(), "ready");
    assert!(err.contains("accessible to group or others"), "{err}");
}

#[test]
fn a_link_the_vmm_resets_is_made_again_to_the_same_vmm_with_the_same_activation() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let asked = fake_firecracker_resettable(&socket, 2, open.clone());
    let spec = spec(&run, socket, this_process());
    let mut bridge = start_bridge_with(&bridge_bin(), &spec);
    let target = spaced_host::BridgeTarget {
        socket: spec.listen.clone(),
        bridge: bridge.identity(),
        served: spec.activation.identity(),
        secret: spec.activation.secret,
    };
    let echo = |what: &str| {
        let mut conn = spaced_host::connect(&target).unwrap();
        conn.exec(ExecSpec::shell(&format!("echo {what}")))
            .unwrap()
            .stdout
    };
    assert_eq!(echo("first"), b"first\n");
    // Firecracker writing a snapshot: every vsock connection reset.
    for c in open.lock().unwrap().drain(..) {
        c.shutdown(std::net::Shutdown::Both).unwrap();
    }
    // The bridge links again (a new CONNECT, the same activation) and serves on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let again = loop {
        let tried = spaced_host::connect(&target)
            .ok()
            .and_then(|mut c| c.exec(ExecSpec::shell("echo again")).ok());
        if let Some(out) = tried {
            break out.stdout;
        }
        assert!(std::time::Instant::now() < deadline, "no new link");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(again, b"again\n");
    bridge.0.kill().unwrap();
    bridge.0.wait().unwrap();
    let port = format!("CONNECT {}", space_proto::vm::VSOCK_PORT);
    assert_eq!(asked.join().unwrap(), [port.clone(), port]);
}

/// A stand-in VMM whose "guest" answers `ready` to the activation and then breaks the
/// protocol (a frame of an unknown kind); the connections it was asked for.
fn fake_firecracker_with_a_guest_that_breaks_the_protocol(
    socket: &Path,
) -> std::thread::JoinHandle<usize> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let mut connections = 0;
        let mut held = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(6);
        while std::time::Instant::now() < deadline {
            let Ok((mut conn, _)) = listener.accept() else {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            };
            connections += 1;
            conn.set_nonblocking(false).unwrap();
            let mut b = [0u8; 1];
            while conn.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {}
            conn.write_all(b"OK 1073741824\n").unwrap();
            // The activation, then `ready`, then a frame no guest may send.
            while let Ok(Some(f)) = space_mux::frame::read_frame(&mut conn) {
                if f.kind == space_mux::Kind::Control {
                    break;
                }
            }
            let ready = space_mux::frame::wire(
                space_mux::frame::CONTROL,
                space_mux::Kind::Control,
                space_proto::vm::READY,
            )
            .unwrap();
            conn.write_all(&ready).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            conn.write_all(&[0, 0, 0, 1, 0xee, 0, 0, 0, 0]).unwrap();
            held.push(conn);
        }
        connections
    })
}

#[test]
fn a_guest_that_breaks_the_protocol_ends_the_bridge_and_is_never_linked_again() {
    let (_t, run, vmm) = dirs();
    let socket = vmm.join("v.sock");
    let asked = fake_firecracker_with_a_guest_that_breaks_the_protocol(&socket);
    let spec = spec(&run, socket, this_process());
    let mut bridge = start_bridge_with(&bridge_bin(), &spec);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let status = loop {
        if let Some(status) = bridge.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bridge served on after a protocol violation"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    // One connection only: no relink of a guest that broke the protocol.
    assert_eq!(asked.join().unwrap(), 1);
}
