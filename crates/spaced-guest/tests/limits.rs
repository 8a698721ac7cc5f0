//! Hostile and heavy peers: garbage, oversized frames, floods. The agent answers with
//! an error, closes that connection only, keeps its memory bounded, and never dies.

use std::io::{Read, Write};
use std::time::Duration;

use space_proto::codec;
use space_proto::frame::{MAX_FRAME_LEN, read_frame, write_frame};
use space_proto::guest::{
    self, AgentBody, ClientFrame, ErrorKind, ExecSpec, ExitOutcome, Hello, Operation,
    PROTOCOL_VERSION,
};
use space_testkit::agent::AgentProcess;
use space_testkit::rng::random;

fn hello(raw: &mut std::os::unix::net::UnixStream) {
    let hello = ClientFrame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce: random(),
    });
    write_frame(raw, &codec::encode(&hello)).unwrap();
    let ack = guest::decode_agent_frame(&read_frame(raw).unwrap()).unwrap();
    assert!(matches!(ack.body, AgentBody::HelloAck(_)));
}

fn expect_protocol_error_then_close(raw: &mut std::os::unix::net::UnixStream) {
    let answer = guest::decode_agent_frame(&read_frame(raw).unwrap()).unwrap();
    assert!(
        matches!(answer.body, AgentBody::Error(ref e) if e.kind == ErrorKind::Protocol),
        "{answer:?}"
    );
    assert_eq!(answer.request_id, guest::CONNECTION);
    assert!(read_frame(raw).is_err(), "connection stayed open");
}

#[test]
fn garbage_frame_gets_an_error_and_the_agent_keeps_serving() {
    let mut agent = AgentProcess::start();
    let mut before = agent.connect();
    let mut raw = agent.raw();
    hello(&mut raw);
    write_frame(&mut raw, b"\xff\xfe garbage that decodes to nothing").unwrap();
    expect_protocol_error_then_close(&mut raw);
    // Garbage instead of a hello, too (a frame tag that is no variant: not a hello of
    // another protocol version either).
    let mut raw = agent.raw();
    write_frame(&mut raw, &[0x09, 0x01]).unwrap();
    expect_protocol_error_then_close(&mut raw);
    assert!(agent.is_running());
    assert_eq!(
        before
            .exec(ExecSpec::command(["true"]))
            .unwrap()
            .status
            .outcome,
        ExitOutcome::Code(0)
    );
    assert!(agent.connect().stat("/").is_ok());
}

#[test]
fn oversized_length_gets_an_error_and_the_agent_keeps_serving() {
    let mut agent = AgentProcess::start();
    for announced in [MAX_FRAME_LEN as u32 + 1, u32::MAX] {
        let mut raw = agent.raw();
        hello(&mut raw);
        raw.write_all(&announced.to_be_bytes()).unwrap();
        expect_protocol_error_then_close(&mut raw);
    }
    // Before the handshake as well.
    let mut raw = agent.raw();
    raw.write_all(&u32::MAX.to_be_bytes()).unwrap();
    expect_protocol_error_then_close(&mut raw);
    assert!(agent.is_running());
    assert!(agent.connect().stat("/").is_ok());
}

#[test]
fn input_for_a_request_that_is_not_running_is_refused() {
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    conn.send_input(77, guest::Input::Close).unwrap();
    let err = conn.next_answer(77).unwrap_err();
    assert!(
        matches!(err, space_proto::client::ClientError::Agent(ref e) if e.kind == ErrorKind::Protocol),
        "{err:?}"
    );
}

#[test]
fn a_peer_stalled_inside_a_frame_does_not_block_others() {
    let agent = AgentProcess::start();
    let mut raw = agent.raw();
    hello(&mut raw);
    // Announce 1000 bytes and send 3.
    raw.write_all(&1000u32.to_be_bytes()).unwrap();
    raw.write_all(b"abc").unwrap();
    let mut other = agent.connect();
    assert_eq!(
        other
            .exec(ExecSpec::command(["echo", "fine"]))
            .unwrap()
            .stdout,
        b"fine\n"
    );
}

#[test]
fn silent_connections_beyond_the_limit_are_told_busy() {
    let agent = AgentProcess::start_with(&["--max-connections", "2"]);
    // Let the start-up probe connection of the harness end first.
    std::thread::sleep(Duration::from_millis(300));
    let mut held = [agent.raw(), agent.raw()];
    std::thread::sleep(Duration::from_millis(200));
    for s in &mut held {
        // Neither of the first two was refused: the agent waits for their hello.
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert!(s.read(&mut [0u8; 1]).is_err());
    }
    let mut c = agent.raw();
    let answer = guest::decode_agent_frame(&read_frame(&mut c).unwrap()).unwrap();
    assert!(
        matches!(answer.body, AgentBody::Error(ref e) if e.kind == ErrorKind::Busy),
        "{answer:?}"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    assert!(agent.connect().stat("/").is_ok());
}

#[test]
fn output_flood_is_streamed_with_bounded_agent_memory() {
    const TOTAL: u64 = 200_000_000;
    const LIMIT_KIB: u64 = 16 * 1024;
    let agent = AgentProcess::start();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::Exec(ExecSpec::command([
            "head",
            "-c",
            &TOTAL.to_string(),
            "/dev/zero",
        ])))
        .unwrap();
    assert!(matches!(
        conn.next_answer(id).unwrap(),
        AgentBody::Started { .. }
    ));
    let (mut received, mut frames, mut max_rss) = (0u64, 0u64, agent.vm_rss_kib());
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::Stdout(chunk) => {
                assert!(chunk.iter().all(|&b| b == 0));
                received += chunk.len() as u64;
                frames += 1;
                if frames % 256 == 0 {
                    max_rss = max_rss.max(agent.vm_rss_kib());
                }
                // A slow reader for a moment: the agent must wait, not buffer.
                if frames == 200 {
                    std::thread::sleep(Duration::from_millis(500));
                    max_rss = max_rss.max(agent.vm_rss_kib());
                }
            }
            AgentBody::Exited(status) => {
                assert_eq!(status.outcome, ExitOutcome::Code(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(received, TOTAL);
    eprintln!("agent peak VmRSS sampled: {max_rss} KiB");
    assert!(max_rss < LIMIT_KIB, "agent RSS reached {max_rss} KiB");
}

#[test]
fn large_file_read_is_streamed_with_bounded_agent_memory() {
    const LIMIT_KIB: u64 = 16 * 1024;
    let agent = AgentProcess::start();
    let big = agent.home.join("big");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(150_000_000).unwrap();
    let mut conn = agent.connect();
    let id = conn
        .send_request(Operation::ReadFile {
            path: "big".into(),
            offset: 0,
            max_bytes: u64::MAX,
        })
        .unwrap();
    let (mut received, mut frames, mut max_rss) = (0u64, 0u64, 0u64);
    loop {
        match conn.next_answer(id).unwrap() {
            AgentBody::FileData(chunk) => {
                received += chunk.len() as u64;
                frames += 1;
                if frames % 256 == 0 {
                    max_rss = max_rss.max(agent.vm_rss_kib());
                }
            }
            AgentBody::ReadEnd { bytes, truncated } => {
                assert_eq!(bytes, 150_000_000);
                assert!(!truncated);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(received, 150_000_000);
    eprintln!("agent peak VmRSS sampled: {max_rss} KiB");
    assert!(max_rss < LIMIT_KIB, "agent RSS reached {max_rss} KiB");
    let mut raw_check = agent.raw();
    let mut buf = [0u8; 1];
    raw_check
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    // The agent says nothing before a hello.
    assert!(raw_check.read(&mut buf).is_err());
}
