//! `ConnectPort` through the real agent: the agent connects to a port on its
//! loopback and the connection becomes the port's (how a VM's service ports are
//! reached). The agent here runs in the test's own network namespace, so the
//! servers are the test's, on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::time::Duration;

use space_proto::client::ClientError;
use space_proto::guest::{AgentBody, ErrorKind, Operation};
use space_testkit::agent::AgentProcess;

#[test]
fn a_connected_port_carries_bytes_both_ways_and_each_side_can_end_its_half() {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn.send_request(Operation::ConnectPort { port }).unwrap();
    assert_eq!(conn.next_answer(id).unwrap(), AgentBody::PortConnected);
    let (mut inside, _) = server.accept().unwrap();
    inside
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut client = conn.into_stream();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    // Unframed bytes, more than one chunk of the relay's, both ways.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    client.write_all(&big).unwrap();
    let mut got = vec![0; big.len()];
    inside.read_exact(&mut got).unwrap();
    assert_eq!(got, big);
    inside.write_all(b"answer from the port").unwrap();
    let mut got = [0; 20];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"answer from the port");

    // The client's end of sending reaches the server as EOF; the server can still
    // answer, and its close ends the client's connection.
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    inside.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    inside.write_all(b"last words").unwrap();
    drop(inside);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"last words");
}

#[test]
fn a_port_nothing_accepts_on_is_port_closed_and_the_connection_stays_usable() {
    // A port that was just free: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn.send_request(Operation::ConnectPort { port }).unwrap();
    match conn.next_answer(id) {
        Err(ClientError::Agent(e)) => {
            assert_eq!(e.kind, ErrorKind::PortClosed, "{e:?}");
            assert!(e.message.contains(&port.to_string()), "{e:?}");
        }
        other => panic!("expected port_closed, got {other:?}"),
    }
    // Only a connection that connected is handed over.
    let out = conn
        .exec(space_proto::guest::ExecSpec::command([
            "echo",
            "still here",
        ]))
        .unwrap();
    assert_eq!(out.stdout, b"still here\n");
}
