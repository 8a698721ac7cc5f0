//! The handshake proves which execution the agent serves.

use space_identity::Generation;
use space_proto::client::{AgentConnection, ClientError};
use space_proto::codec;
use space_proto::frame::{read_frame, write_frame};
use space_proto::guest::{
    self, AgentBody, ClientFrame, ErrorKind, ExecSpec, Hello, Operation, PROTOCOL_VERSION,
    verify_proof,
};
use space_testkit::agent::AgentProcess;
use space_testkit::rng::random;

#[test]
fn handshake_proof_verifies_and_names_the_execution() {
    let agent = AgentProcess::start();
    let nonce = random();
    let conn = AgentConnection::handshake(agent.raw(), nonce).unwrap();
    let ack = conn.ack();
    assert!(verify_proof(&agent.activation.secret, &nonce, ack));
    assert_eq!(ack.sandbox, agent.activation.sandbox);
    assert_eq!(ack.execution_id, agent.activation.execution_id);
    assert_eq!(ack.generation, Generation(4));
    assert_eq!(ack.activation, 2);
}

#[test]
fn handshake_proof_does_not_verify_with_another_secret_or_nonce() {
    let agent = AgentProcess::start();
    let nonce = random();
    let conn = AgentConnection::handshake(agent.raw(), nonce).unwrap();
    assert!(!verify_proof(&random(), &nonce, conn.ack()));
    assert!(!verify_proof(
        &agent.activation.secret,
        &random(),
        conn.ack()
    ));
    let err = AgentConnection::handshake_verified(agent.raw(), random(), &random()).unwrap_err();
    assert!(matches!(err, ClientError::BadProof), "{err:?}");
}

#[test]
fn two_connections_get_different_proofs_for_different_nonces() {
    let agent = AgentProcess::start();
    let a = agent.connect();
    let b = agent.connect();
    assert_ne!(a.ack().proof, b.ack().proof);
    assert_eq!(a.identity(), b.identity());
}

#[test]
fn hello_of_another_protocol_version_is_refused_and_the_connection_closed() {
    let agent = AgentProcess::start();
    let mut raw = agent.raw();
    let hello = ClientFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION + 1,
        nonce: random(),
    });
    write_frame(&mut raw, &codec::encode(&hello)).unwrap();
    let answer = guest::decode_agent_frame(&read_frame(&mut raw).unwrap()).unwrap();
    assert_eq!(answer.execution_id, agent.activation.execution_id);
    let AgentBody::Error(e) = answer.body else {
        panic!("expected an error, got {:?}", answer.body);
    };
    assert_eq!(e.kind, ErrorKind::UnsupportedVersion);
    assert!(read_frame(&mut raw).is_err(), "connection stayed open");
}

#[test]
fn hello_of_a_future_version_with_a_longer_layout_is_refused_as_unsupported() {
    let agent = AgentProcess::start();
    let mut raw = agent.raw();
    let mut body = codec::encode(&ClientFrame::Hello(Hello {
        protocol_version: 9,
        nonce: random(),
    }));
    body.extend_from_slice(b"fields this agent does not know");
    write_frame(&mut raw, &body).unwrap();
    let answer = guest::decode_agent_frame(&read_frame(&mut raw).unwrap()).unwrap();
    assert!(
        matches!(answer.body, AgentBody::Error(ref e) if e.kind == ErrorKind::UnsupportedVersion),
        "{answer:?}"
    );
}

#[test]
fn request_before_hello_is_refused() {
    let agent = AgentProcess::start();
    let mut raw = agent.raw();
    let req = ClientFrame::Request(guest::Request {
        id: 1,
        op: Operation::Stat { path: "/".into() },
    });
    write_frame(&mut raw, &codec::encode(&req)).unwrap();
    let answer = guest::decode_agent_frame(&read_frame(&mut raw).unwrap()).unwrap();
    assert!(
        matches!(answer.body, AgentBody::Error(ref e) if e.kind == ErrorKind::Protocol),
        "{answer:?}"
    );
    assert!(read_frame(&mut raw).is_err());
}

#[test]
fn second_hello_on_a_connection_is_refused() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let hello = ClientFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce: random(),
    });
    write_frame(conn.stream_mut(), &codec::encode(&hello)).unwrap();
    let err = conn.next_answer(1).unwrap_err();
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::Protocol),
        "{err:?}"
    );
}

#[test]
fn every_answer_names_the_execution_the_handshake_proved() {
    let agent = AgentProcess::start();
    let mut raw = agent.raw();
    let nonce = random();
    let hello = ClientFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce,
    });
    write_frame(&mut raw, &codec::encode(&hello)).unwrap();
    let mut frames = vec![guest::decode_agent_frame(&read_frame(&mut raw).unwrap()).unwrap()];
    let ops = [
        Operation::Exec(ExecSpec::shell("echo out; echo err >&2; exit 3")),
        Operation::List { path: "/".into() },
        Operation::Stat {
            path: "/nonexistent".into(),
        },
        Operation::ReadFile {
            path: "/proc/self/status".into(),
            offset: 0,
            max_bytes: 1 << 20,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let id = i as u64 + 1;
        let req = ClientFrame::Request(guest::Request { id, op });
        write_frame(&mut raw, &codec::encode(&req)).unwrap();
        loop {
            let f = guest::decode_agent_frame(&read_frame(&mut raw).unwrap()).unwrap();
            assert_eq!(f.request_id, id);
            let done = f.body.is_final();
            frames.push(f);
            if done {
                break;
            }
        }
    }
    assert!(frames.len() > 8, "{}", frames.len());
    for f in &frames {
        assert_eq!(f.execution_id, agent.activation.execution_id, "{f:?}");
    }
}
