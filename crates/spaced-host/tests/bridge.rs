//! The bridge and the worker-side client against real agent and bridge processes.

use std::os::unix::net::UnixListener;

use space_peer::PeerError;
use space_proto::client::ClientError;
use space_proto::guest::{ErrorKind, ExecSpec, ExitOutcome};
use space_testkit::bridge::{Sandbox, activation, bridge_bin, start_agent, start_bridge_with};
use spaced_host::{BridgeClientError, BridgePool, connect};

fn refused_by_bridge(e: BridgeClientError) -> String {
    match e {
        BridgeClientError::Handshake(ClientError::Agent(w)) => {
            assert_eq!(w.kind, ErrorKind::PermissionDenied, "{w}");
            w.message
        }
        other => panic!("expected a refusal from the bridge, got {other:?}"),
    }
}

#[test]
fn operations_through_the_bridge_reach_the_recorded_execution() {
    let sbx = Sandbox::start();
    let mut conn = connect(&sbx.target).unwrap();
    assert_eq!(conn.identity(), sbx.target.served);
    let out = conn.exec(ExecSpec::shell("echo hello")).unwrap();
    assert_eq!(out.stdout, b"hello\n");
    assert_eq!(out.status.outcome, ExitOutcome::Code(0));
    let home = sbx.dir.path().join("home");
    let file = home.join("f.txt");
    let path = file.to_str().unwrap();
    conn.write_file(path, b"four kb or so", None).unwrap();
    assert_eq!(conn.read_file(path, 1 << 20).unwrap(), b"four kb or so");
    assert_eq!(conn.stat(path).unwrap().size, 13);
}

#[test]
fn pooled_connection_is_reused_for_the_same_execution() {
    let sbx = Sandbox::start();
    let pool = BridgePool::new(sbx.target.clone(), 4);
    assert!(pool.idle().is_none());
    let mut c = connect(pool.target()).unwrap();
    c.stat("/").unwrap();
    pool.give_back(c);
    let mut again = pool.idle().expect("the connection given back");
    again.stat("/").unwrap();
    assert_eq!(again.identity(), pool.served());
    assert!(pool.idle().is_none(), "taken out, not copied");
}

#[test]
fn rival_process_listening_at_the_bridge_socket_path_is_refused() {
    let sbx = Sandbox::start();
    // A second, genuine bridge binary with the same spec takes over the path.
    std::fs::remove_file(&sbx.spec.listen).unwrap();
    let _rival = start_bridge_with(&bridge_bin(), &sbx.spec);
    match connect(&sbx.target) {
        Err(BridgeClientError::Peer(PeerError::Mismatch { what: "pid" })) => {}
        other => panic!("rival bridge accepted: {other:?}"),
    }
}

#[test]
fn rival_listener_of_another_program_at_the_bridge_socket_path_is_refused() {
    let sbx = Sandbox::start();
    std::fs::remove_file(&sbx.spec.listen).unwrap();
    // This test process itself listens at the path.
    let _rival = UnixListener::bind(&sbx.spec.listen).unwrap();
    assert!(matches!(
        connect(&sbx.target),
        Err(BridgeClientError::Peer(PeerError::Mismatch { .. }))
    ));
}

#[test]
fn bridge_restarted_under_a_new_pid_is_refused_while_the_record_holds_the_old() {
    let mut sbx = Sandbox::start();
    sbx.bridge.0.kill().unwrap();
    sbx.bridge.0.wait().unwrap();
    let _restarted = start_bridge_with(&bridge_bin(), &sbx.spec);
    match connect(&sbx.target) {
        Err(BridgeClientError::Peer(PeerError::Mismatch { what: "pid" })) => {}
        other => panic!("restarted bridge accepted under the old record: {other:?}"),
    }
}

#[test]
fn copy_of_the_bridge_binary_at_another_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("spaced-host-copy");
    std::fs::copy(bridge_bin(), &copy).unwrap();
    // The worker meant to launch the real binary (and records its inode); a copy ran.
    let sbx = Sandbox::start_with(&activation(0xe7, 0x42), &activation(0xe7, 0x42), copy);
    match connect(&sbx.target) {
        Err(BridgeClientError::Peer(PeerError::Mismatch { what: "executable" })) => {}
        other => panic!("copied bridge accepted: {other:?}"),
    }
}

#[test]
fn client_of_another_uid_is_refused_by_the_bridge() {
    let mut sbx = Sandbox::start();
    sbx.bridge.0.kill().unwrap();
    sbx.bridge.0.wait().unwrap();
    let mut spec = sbx.spec.clone();
    spec.worker_uid = 4242;
    let bridge = start_bridge_with(&bridge_bin(), &spec);
    sbx.target.bridge = bridge.identity();
    let why = refused_by_bridge(connect(&sbx.target).unwrap_err());
    assert!(why.contains("client uid"), "{why}");
}

#[test]
fn guest_answering_with_another_execution_id_is_refused() {
    // The agent serves execution 0xe8 (with the right secret); the record says 0xe7.
    let sbx = Sandbox::start_with(
        &activation(0xe8, 0x42),
        &activation(0xe7, 0x42),
        bridge_bin(),
    );
    let why = refused_by_bridge(connect(&sbx.target).unwrap_err());
    assert!(why.contains("handshake"), "{why}");
}

#[test]
fn guest_with_a_wrong_proof_is_refused() {
    // Same execution claimed, but the agent holds another activation's secret (a
    // restored snapshot of a predecessor, say).
    let sbx = Sandbox::start_with(
        &activation(0xe7, 0x99),
        &activation(0xe7, 0x42),
        bridge_bin(),
    );
    let why = refused_by_bridge(connect(&sbx.target).unwrap_err());
    assert!(why.contains("proof"), "{why}");
}

#[test]
fn agent_replaced_under_the_same_bridge_is_refused() {
    let mut sbx = Sandbox::start();
    // A new agent process with the very same activation and secret takes the path.
    sbx.agent.0.kill().unwrap();
    sbx.agent.0.wait().unwrap();
    let _replacement = start_agent(
        sbx.dir.path(),
        &sbx.spec.agent_socket,
        &activation(0xe7, 0x42),
    );
    let why = refused_by_bridge(connect(&sbx.target).unwrap_err());
    assert!(why.contains("transport"), "{why}");
}

#[test]
fn rival_listener_at_the_agent_path_is_refused_even_while_the_agent_lives() {
    let sbx = Sandbox::start();
    std::fs::remove_file(&sbx.spec.agent_socket).unwrap();
    let _rival = UnixListener::bind(&sbx.spec.agent_socket).unwrap();
    let why = refused_by_bridge(connect(&sbx.target).unwrap_err());
    assert!(why.contains("transport"), "{why}");
}

#[test]
fn dropped_agent_ends_the_connection_and_nothing_reconnects() {
    let mut sbx = Sandbox::start();
    let mut conn = connect(&sbx.target).unwrap();
    conn.stat("/").unwrap();
    sbx.agent.0.kill().unwrap();
    sbx.agent.0.wait().unwrap();
    assert!(conn.stat("/").is_err(), "the old connection must fail");
    assert!(
        connect(&sbx.target).is_err(),
        "a new connection must not reach anything"
    );
}

#[test]
fn after_the_handshake_the_worker_holds_the_verified_agent_connection_itself() {
    let mut sbx = Sandbox::start();
    let mut conn = connect(&sbx.target).unwrap();
    // The stream the worker now talks on is connected to the agent, not to the bridge.
    let peer =
        rustix::net::sockopt::socket_peercred(std::os::fd::AsFd::as_fd(conn.stream_mut())).unwrap();
    assert_eq!(peer.pid.as_raw_nonzero().get() as u32, sbx.agent.0.id());
    // So the bridge is out of the path: an established connection keeps working
    // without it, and no new connection gets anywhere.
    sbx.bridge.0.kill().unwrap();
    sbx.bridge.0.wait().unwrap();
    conn.stat("/").unwrap();
    assert!(connect(&sbx.target).is_err());
}

/// Copies `a` to `b` until either ends, then shuts `b`'s writing half.
fn splice(mut a: std::os::unix::net::UnixStream, mut b: std::os::unix::net::UnixStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut a, &mut b);
        let _ = b.shutdown(std::net::Shutdown::Write);
    });
}

#[test]
fn a_vm_guest_answering_with_the_previous_activations_secret_is_refused() {
    use std::os::unix::net::UnixStream;
    use std::time::Duration;
    // A VM restored from a memory snapshot whose guest ignores the new activation and
    // answers as its predecessor: here, a stand-in VMM (this test process holds the
    // serial socket, and the spec records it) whose "guest" link takes the activation,
    // answers `ready`, and carries every stream to a real agent of the old secret.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    space_peer::prepare_socket_dir(&run).unwrap();
    let stale = run.join("stale.sock");
    let _agent = start_agent(dir.path(), &stale, &activation(0xe7, 0x99));
    let serial = run.join("vm.sock");
    let listener = UnixListener::bind(&serial).unwrap();
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let link = space_mux::Link::over_unix(conn, false, 16, None).unwrap();
        let _ignored = link.recv_control(Duration::from_secs(30)).unwrap();
        link.set_accept(Box::new(move |s: UnixStream| {
            let agent = UnixStream::connect(&stale).unwrap();
            splice(s.try_clone().unwrap(), agent.try_clone().unwrap());
            splice(agent, s);
        }));
        link.send_control(space_proto::vm::READY).unwrap();
        while link.dead().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let expected = activation(0xe7, 0x42);
    let spec = spaced_host::BridgeSpec {
        listen: run.join("bridge.sock"),
        agent_socket: serial,
        worker_uid: rustix::process::geteuid().as_raw(),
        agent: space_peer::LiveProcess::open(std::process::id())
            .unwrap()
            .identity,
        activation: expected.clone(),
        max_connections: 4,
        transport: spaced_host::Transport::Serial,
    };
    let bridge = start_bridge_with(&bridge_bin(), &spec);
    let target = spaced_host::BridgeTarget {
        socket: spec.listen.clone(),
        bridge: bridge.identity(),
        served: expected.identity(),
        secret: expected.secret,
    };
    let why = refused_by_bridge(connect(&target).unwrap_err());
    assert!(why.contains("proof"), "{why}");
}
