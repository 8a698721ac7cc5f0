use super::*;
use std::io::{Read, Write};

/// A host link and a guest link over a socket pair; the guest echoes every stream.
fn echo_pair(max_streams: usize) -> (Link, Link) {
    let (h, g) = UnixStream::pair().unwrap();
    let guest = Link::over_unix(
        g,
        false,
        max_streams,
        Some(Box::new(|mut s: UnixStream| {
            thread::spawn(move || {
                let mut buf = vec![0u8; 8192];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.shutdown(Shutdown::Write);
            });
        })),
    )
    .unwrap();
    let host = Link::over_unix(h, true, max_streams, None).unwrap();
    (host, guest)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn many_streams_carry_megabytes_both_ways_intact_under_flow_control() {
    let (host, _guest) = echo_pair(64);
    let workers: Vec<_> = (0..16u8)
        .map(|i| {
            let mut s = host.open().unwrap();
            thread::spawn(move || {
                let data = pattern(i, (1 << 20) + usize::from(i) * 977);
                let mut w = s.try_clone().unwrap();
                let sent = data.clone();
                // Writes far past the window: only credit lets them through.
                let writer = thread::spawn(move || {
                    w.write_all(&sent).unwrap();
                    w.shutdown(Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                s.read_to_end(&mut back).unwrap();
                writer.join().unwrap();
                assert!(back == data, "stream {i} came back altered");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // Every stream, done both ways, has left the table.
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.streams() > 0 {
        assert!(Instant::now() < deadline, "{} streams left", host.streams());
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn control_messages_pass_and_a_silent_peer_times_out() {
    let (host, guest) = echo_pair(4);
    host.send_control(b"activation").unwrap();
    assert_eq!(
        guest.recv_control(Duration::from_secs(5)).unwrap(),
        b"activation"
    );
    assert_eq!(
        host.recv_control(Duration::from_millis(50)),
        Err(LinkError::Timeout)
    );
    assert_eq!(guest.open().unwrap_err(), LinkError::NotOpener);
}

#[test]
fn streams_past_the_limit_are_refused() {
    let (host, _guest) = echo_pair(2);
    let _a = host.open().unwrap();
    let _b = host.open().unwrap();
    assert_eq!(host.open().unwrap_err(), LinkError::Busy);
}

/// A host link and the raw other end of its transport, to play a hostile guest by hand.
fn host_and_raw() -> (Link, UnixStream) {
    let (h, g) = UnixStream::pair().unwrap();
    (Link::over_unix(h, true, 8, None).unwrap(), g)
}

fn wait_dead(link: &Link) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(why) = link.dead() {
            return why;
        }
        assert!(Instant::now() < deadline, "the link stayed up");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_guest_sending_past_its_credit_ends_the_link_and_every_stream() {
    let (host, mut raw) = host_and_raw();
    let mut app = host.open().unwrap();
    let open = frame::read_frame(&mut raw).unwrap().unwrap();
    assert_eq!(open.kind, Kind::Open);
    // The application never reads: once its socket is full, the link gives no more
    // credit back, and WINDOW bytes later the guest is over. It ignores the credit
    // and sends on (its writes fail once the link shut the transport).
    let stream = open.stream;
    let _flood = thread::spawn(move || {
        for _ in 0..(64 << 20) / MAX_PAYLOAD {
            let data = Frame {
                stream,
                kind: Kind::Data,
                payload: vec![1; MAX_PAYLOAD],
            };
            if data.write_to(&mut raw).is_err() {
                break;
            }
        }
    });
    let why = wait_dead(&host);
    assert!(why.contains("past its credit"), "{why}");
    // The application's stream ends (after what was within the window, if read).
    app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = Vec::new();
    let _ = app.read_to_end(&mut sink);
    assert!(sink.len() < 64 << 20, "{} bytes", sink.len());
    assert!(matches!(host.open(), Err(LinkError::Dead(_))));
}

#[test]
fn a_guest_that_opens_a_stream_or_credits_past_the_window_ends_the_link() {
    let (host, mut raw) = host_and_raw();
    Frame::bare(9, Kind::Open).write_to(&mut raw).unwrap();
    assert!(wait_dead(&host).contains("opened a stream"));

    let (host, mut raw) = host_and_raw();
    let _app = host.open().unwrap();
    let open = frame::read_frame(&mut raw).unwrap().unwrap();
    Frame::credit(open.stream, 1).write_to(&mut raw).unwrap();
    assert!(wait_dead(&host).contains("past its window"));
}

#[test]
fn the_end_of_the_transport_closes_every_stream_and_nothing_reconnects() {
    let (host, raw) = host_and_raw();
    let mut app = host.open().unwrap();
    drop(raw);
    // Ended, or reset (the Open frame was left unread).
    let why = wait_dead(&host);
    assert!(why.contains("ended") || why.contains("read:"), "{why}");
    app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = [0u8; 1];
    assert_eq!(app.read(&mut sink).unwrap_or(0), 0);
    assert!(matches!(host.open(), Err(LinkError::Dead(_))));
}

#[test]
fn a_transports_end_is_told_apart_from_a_protocol_violation_and_a_local_shut() {
    // The peer's end (what a VMM resetting the connection looks like).
    let (host, raw) = host_and_raw();
    assert!(!host.ended_by_transport());
    drop(raw);
    wait_dead(&host);
    assert!(host.ended_by_transport());
    // The peer breaks the protocol: not the transport's end.
    let (host, mut raw) = host_and_raw();
    let _app = host.open().unwrap();
    let open = frame::read_frame(&mut raw).unwrap().unwrap();
    Frame::credit(open.stream, 1).write_to(&mut raw).unwrap();
    wait_dead(&host);
    assert!(!host.ended_by_transport());
    // An unknown frame kind, then the end: the violation is what counts.
    let (host, mut raw) = host_and_raw();
    raw.write_all(&[0, 0, 0, 0, 0xee, 0, 0, 0, 0]).unwrap();
    drop(raw);
    wait_dead(&host);
    assert!(!host.ended_by_transport());
    // This side shut it.
    let (host, _raw) = host_and_raw();
    host.shut("done");
    assert!(!host.ended_by_transport());
}
