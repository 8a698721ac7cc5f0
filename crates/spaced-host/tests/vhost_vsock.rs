//! The bridge's vhost-vsock transport (a QEMU VM's `AF_VSOCK`), its verification
//! against hostile records: this host class has no `/dev/vhost-vsock` and no vsock
//! loopback, so the device is a stand-in file the recorded process holds open and the
//! connection a stand-in too — a Unix stream whose other end runs the real guest code
//! (`spaced_guest::vsock::serve_connection`). Each attack is refused before any
//! connection is made (the stand-in connector counts them), or before the guest is
//! activated. The driver's own test (`space-worker`'s `tests/vm_vsock.rs`) needs the
//! real device.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_peer::{LiveProcess, PeerError, ProcessIdentity};
use space_testkit::bridge::{activation, bridge_bin};
use spaced_host::BridgeError;

const CID: u32 = 41;

/// A stand-in `/dev/vhost-vsock` (a plain file, its canonical path as `/proc/PID/fd`
/// shows it).
fn device() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("vhost-vsock");
    std::fs::write(&path, b"").unwrap();
    let path = std::fs::canonicalize(&path).unwrap();
    (t, path)
}

/// A "QEMU": a plain process, holding `device` open (as its stdin) or nothing.
fn qemu(device: Option<&Path>) -> Child {
    let stdin = match device {
        Some(d) => Stdio::from(std::fs::File::open(d).unwrap()),
        None => Stdio::null(),
    };
    let child = Command::new("sleep")
        .arg("30")
        .stdin(stdin)
        .spawn()
        .unwrap();
    // Until it runs `sleep` (its recorded executable), not the forked test binary.
    let sleep = space_peer::FileId::of_path(&which("sleep")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while LiveProcess::open(child.id()).map(|l| l.identity.exe) != Ok(sleep) {
        assert!(std::time::Instant::now() < deadline, "sleep did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap()
}

fn identity(child: &Child) -> ProcessIdentity {
    LiveProcess::open(child.id()).unwrap().identity
}

fn end(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn spec(agent: ProcessIdentity, cid: u32) -> spaced_host::BridgeSpec {
    let run = std::env::temp_dir();
    spaced_host::BridgeSpec {
        listen: run.join("unused-bridge.sock"),
        agent_socket: run.join("unused-vm.sock"),
        worker_uid: rustix::process::geteuid().as_raw(),
        agent,
        activation: activation(0xa5, 0x42),
        max_connections: 4,
        transport: spaced_host::Transport::VhostVsock { cid },
    }
}

/// What the stand-in connector saw, and the guest ends it handed out.
#[derive(Default)]
struct Connections {
    asked: Vec<(u32, u32)>,
    guests: Vec<std::thread::JoinHandle<Result<(), String>>>,
}

/// A connector that records each connection asked for and answers it with a Unix
/// stream whose other end the real guest code serves; `before` runs first (a test's
/// way to change the world once the connection is being made).
fn connector(
    seen: Arc<Mutex<Connections>>,
    mut before: impl FnMut() + 'static,
) -> impl FnMut(u32, u32, Duration) -> std::io::Result<OwnedFd> {
    move |cid, port, _timeout| {
        before();
        let (host, guest) = UnixStream::pair()?;
        let served = std::thread::spawn(move || {
            spaced_guest::vsock::serve_connection(OwnedFd::from(guest), 16, false)
        });
        let mut s = seen.lock().unwrap();
        s.asked.push((cid, port));
        s.guests.push(served);
        Ok(OwnedFd::from(host))
    }
}

fn connect(
    spec: &spaced_host::BridgeSpec,
    device: &Path,
    seen: &Arc<Mutex<Connections>>,
    before: impl FnMut() + 'static,
) -> Result<(space_mux::Link, spaced_host::vhost::VmmHold), BridgeError> {
    let mut connect = connector(Arc::clone(seen), before);
    spaced_host::vhost::connect_agent_with(spec, CID, Duration::from_secs(10), device, &mut connect)
}

#[test]
fn a_live_recorded_qemu_holding_the_device_is_connected_and_its_guest_activated() {
    let (_t, device) = device();
    let vm = qemu(Some(&device));
    let spec = spec(identity(&vm), CID);
    let seen = Arc::new(Mutex::new(Connections::default()));
    let (link, hold) = connect(&spec, &device, &seen, || {}).unwrap();
    assert!(link.dead().is_none());
    assert!(link.open().is_ok());
    // The bridge holds QEMU's own open file of the device.
    let (held, named) = (
        rustix::fs::fstat(&hold.device).unwrap(),
        rustix::fs::stat(&device).unwrap(),
    );
    assert_eq!((held.st_dev, held.st_ino), (named.st_dev, named.st_ino));
    assert_eq!(
        seen.lock().unwrap().asked,
        [(CID, space_proto::vm::VSOCK_PORT)]
    );
    link.shut("done");
    end(vm);
}

#[test]
fn a_bridge_keeps_its_qemus_device_past_qemus_end_and_learns_of_the_end_at_once() {
    // When a QEMU ends, the kernel frees its CID and resets the host's connections to
    // it only if no device took the CID again meanwhile: another device taking it in
    // that window would inherit the bridge's connection. So the bridge holds QEMU's
    // own device (the CID cannot go while it does) and ends when QEMU does.
    let (_t, device) = device();
    let vm = qemu(Some(&device));
    let spec = spec(identity(&vm), CID);
    let seen = Arc::new(Mutex::new(Connections::default()));
    let (link, hold) = connect(&spec, &device, &seen, || {}).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let pidfd = hold.vmm.pidfd.try_clone().unwrap();
    std::thread::spawn(move || {
        spaced_host::vhost::wait_for_end(&pidfd);
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "ended while QEMU runs"
    );
    end(vm);
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the bridge did not learn that QEMU ended");
    // QEMU is gone; its device's open file is still the bridge's.
    let held = rustix::fs::fstat(&hold.device).unwrap();
    let named = rustix::fs::stat(&device).unwrap();
    assert_eq!((held.st_dev, held.st_ino), (named.st_dev, named.st_ino));
    link.shut("done");
}

#[test]
fn a_recorded_qemu_that_holds_no_vhost_vsock_device_is_refused_without_a_connect() {
    let (_t, device) = device();
    // A plain process at the recorded identity: alive, the right executable, but no
    // descriptor of the device (what any process of the worker's uid could be).
    let impostor = qemu(None);
    let spec = spec(identity(&impostor), CID);
    let seen = Arc::new(Mutex::new(Connections::default()));
    let err = connect(&spec, &device, &seen, || {}).unwrap_err();
    assert!(
        matches!(err, BridgeError::Transport(PeerError::NotHeld(_))),
        "{err}"
    );
    assert!(seen.lock().unwrap().asked.is_empty(), "it connected");
    end(impostor);
}

#[test]
fn a_recorded_qemu_that_is_gone_is_refused_without_a_connect() {
    let (_t, device) = device();
    let vm = qemu(Some(&device));
    let recorded = identity(&vm);
    end(vm);
    let spec = spec(recorded, CID);
    let seen = Arc::new(Mutex::new(Connections::default()));
    let err = connect(&spec, &device, &seen, || {}).unwrap_err();
    assert!(
        matches!(err, BridgeError::Transport(PeerError::NoSuchProcess(_))),
        "{err}"
    );
    assert!(seen.lock().unwrap().asked.is_empty(), "it connected");
}

#[test]
fn a_reused_pid_with_another_start_time_is_refused_without_a_connect() {
    let (_t, device) = device();
    // The process at the PID holds the device, but it is not the one recorded: that
    // one started earlier and is gone, its PID taken by this one.
    let later = qemu(Some(&device));
    let mut recorded = identity(&later);
    recorded.start_time -= 1;
    recorded.pidfs_ino = None;
    let spec = spec(recorded, CID);
    let seen = Arc::new(Mutex::new(Connections::default()));
    let err = connect(&spec, &device, &seen, || {}).unwrap_err();
    assert!(
        matches!(
            err,
            BridgeError::Transport(PeerError::Mismatch { what: "start_time" })
        ),
        "{err}"
    );
    assert!(seen.lock().unwrap().asked.is_empty(), "it connected");
    end(later);
}

#[test]
fn a_qemu_gone_once_the_connection_is_up_is_refused_before_its_guest_is_activated() {
    let (_t, device) = device();
    let vm = qemu(Some(&device));
    let spec = spec(identity(&vm), CID);
    let pid = vm.id();
    let vm = Arc::new(Mutex::new(Some(vm)));
    let ending = Arc::clone(&vm);
    let seen = Arc::new(Mutex::new(Connections::default()));
    // The VMM ends while the connection is made.
    let err = connect(&spec, &device, &seen, move || {
        if let Some(c) = ending.lock().unwrap().take() {
            end(c);
        }
    })
    .unwrap_err();
    assert!(
        matches!(err, BridgeError::Transport(PeerError::NoSuchProcess(p)) if p == pid),
        "{err}"
    );
    // The guest's end saw its link end without an activation.
    let guest = seen.lock().unwrap().guests.pop().unwrap();
    let served = guest.join().unwrap();
    assert!(served.is_err(), "the guest was served: {served:?}");
}

#[test]
fn a_context_id_that_is_no_guests_is_refused_without_a_connect() {
    let (_t, device) = device();
    let vm = qemu(Some(&device));
    for cid in [0, 1, space_proto::vm::HOST_CID, u32::MAX] {
        let spec = spec(identity(&vm), cid);
        let seen = Arc::new(Mutex::new(Connections::default()));
        let mut c = connector(Arc::clone(&seen), || {});
        let r = spaced_host::vhost::connect_agent_with(
            &spec,
            cid,
            Duration::from_secs(1),
            &device,
            &mut c,
        );
        assert!(r.is_err(), "{cid}");
        assert!(seen.lock().unwrap().asked.is_empty(), "{cid}");
    }
    end(vm);
}

#[test]
fn the_bridge_refuses_a_vhost_vsock_vm_whose_qemu_holds_no_device_and_says_why() {
    // The real bridge and the real device path: the recorded process holds none.
    let impostor = qemu(None);
    let spec = spec(identity(&impostor), CID);
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
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(line, "", "the bridge became ready");
    assert!(stderr.contains("holds no vhost-vsock device"), "{stderr}");
    end(impostor);
}
