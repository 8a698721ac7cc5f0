//! The upstream client against DNS servers this test runs on 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use space_egress::DnsName;
use space_egress::dns::{self, Rcode, TYPE_A, TYPE_AAAA};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use super::*;

fn answer_bytes(id: u16, name: &str, qtype: u16, addrs: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let q = dns::parse_query(&dns::build_query(id, name, qtype).unwrap()).unwrap();
    let addrs: Vec<IpAddr> = addrs.iter().map(|&a| a.into()).collect();
    dns::answer(&q, &addrs, ttl)
}

fn name(text: &str) -> DnsName {
    DnsName::parse(text).unwrap()
}

const A1: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const A2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 9);

#[test]
fn only_the_answer_to_our_question_matches() {
    let good = answer_bytes(77, "a.test", TYPE_A, &[A1], 60);
    assert!(matching(&good, 77, "a.test", TYPE_A).is_some());
    assert!(matching(&good, 77, "A.Test.", TYPE_A).is_some());
    assert!(
        matching(&good, 78, "a.test", TYPE_A).is_none(),
        "another ID"
    );
    assert!(
        matching(&good, 77, "b.test", TYPE_A).is_none(),
        "another name"
    );
    assert!(
        matching(&good, 77, "a.test", TYPE_AAAA).is_none(),
        "another type"
    );
    let query = dns::build_query(77, "a.test", TYPE_A).unwrap();
    assert!(matching(&query, 77, "a.test", TYPE_A).is_none(), "a query");
    assert!(matching(&good[..good.len() - 3], 77, "a.test", TYPE_A).is_none());
}

#[test]
fn ttls_are_capped_and_only_ipv4_addresses_kept() {
    let q = dns::parse_query(&dns::build_query(1, "a.test", TYPE_A).unwrap()).unwrap();
    let bytes = dns::answer(&q, &[A1.into(), A1.into(), A2.into()], 86_400);
    let r = resolved(dns::parse_response(&bytes).unwrap()).unwrap();
    assert_eq!(
        r,
        Resolved {
            addrs: vec![A1, A2],
            ttl: MAX_TTL
        }
    );
}

/// What a test server does with each question it receives (by its index).
type Script = Arc<dyn Fn(usize, &[u8]) -> Vec<Vec<u8>> + Send + Sync>;

/// A UDP server on 127.0.0.1 sending, for each query, the datagrams `script` returns.
async fn udp_server(script: Script) -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let i = counter.fetch_add(1, Ordering::SeqCst);
            for reply in script(i, &buf[..n]) {
                let _ = socket.send_to(&reply, from).await;
            }
        }
    });
    (addr, seen)
}

fn reply_to(query: &[u8], addrs: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let q = dns::parse_query(query).unwrap();
    let addrs: Vec<IpAddr> = addrs.iter().map(|&a| a.into()).collect();
    dns::answer(&q, &addrs, ttl)
}

#[tokio::test]
async fn forged_answers_are_ignored_until_the_real_one_comes() {
    let (server, _) = udp_server(Arc::new(|_, query: &[u8]| {
        let q = dns::parse_query(query).unwrap();
        let mut wrong_id = reply_to(query, &[A2], 60);
        wrong_id[0] ^= 0xff;
        vec![
            wrong_id,
            answer_bytes(q.id, "b.test", TYPE_A, &[A2], 60),
            answer_bytes(q.id, "a.test", TYPE_AAAA, &[], 60),
            b"garbage".to_vec(),
            reply_to(query, &[A1], 60),
        ]
    }))
    .await;
    let up = Upstream::new(vec![server], Duration::from_secs(2), 0);
    let r = up.resolve_a(&name("a.test")).await.unwrap();
    assert_eq!(r.addrs, [A1]);
}

#[tokio::test]
async fn no_answer_in_time_is_asked_once_more_of_the_next_server() {
    let (silent, silent_seen) = udp_server(Arc::new(|_, _: &[u8]| Vec::new())).await;
    let (good, good_seen) =
        udp_server(Arc::new(|_, query: &[u8]| vec![reply_to(query, &[A1], 60)])).await;
    let up = Upstream::new(vec![silent, good], Duration::from_millis(200), 1);
    assert_eq!(up.resolve_a(&name("a.test")).await.unwrap().addrs, [A1]);
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1);
    assert_eq!(good_seen.load(Ordering::SeqCst), 1);

    let only_silent = Upstream::new(vec![silent], Duration::from_millis(100), 1);
    assert_eq!(
        only_silent.resolve_a(&name("a.test")).await,
        Err(UpstreamError::Timeout)
    );
    assert_eq!(silent_seen.load(Ordering::SeqCst), 3, "one retry, no more");
}

#[tokio::test]
async fn a_truncated_answer_is_asked_again_over_tcp() {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    // The UDP server on the same port number: truncated answers only.
    let udp = UdpSocket::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let mut r = reply_to(&buf[..n], &[A2], 60);
            r[2] |= 0x02;
            let _ = udp.send_to(&r, from).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut c, _)) = tcp.accept().await {
            let len = usize::from(c.read_u16().await.unwrap());
            let mut q = vec![0u8; len];
            c.read_exact(&mut q).await.unwrap();
            let r = reply_to(&q, &[A1, A2], 60);
            c.write_all(&(r.len() as u16).to_be_bytes()).await.unwrap();
            c.write_all(&r).await.unwrap();
        }
    });
    let up = Upstream::new(
        vec![SocketAddr::from(([127, 0, 0, 1], port))],
        Duration::from_secs(2),
        0,
    );
    assert_eq!(up.resolve_a(&name("a.test")).await.unwrap().addrs, [A1, A2]);
}

#[tokio::test]
async fn answers_are_cached_for_their_ttl_and_nxdomain_is_not_retried() {
    let (server, seen) = udp_server(Arc::new(|_, query: &[u8]| {
        let q = dns::parse_query(query).unwrap();
        if q.name == "gone.test" {
            return vec![dns::reply_without_records(&q, Rcode::NxDomain)];
        }
        vec![reply_to(query, &[A1], 60)]
    }))
    .await;
    let up = Upstream::new(vec![server], Duration::from_secs(2), 1);
    for _ in 0..3 {
        let r = up.resolve_a(&name("a.test")).await.unwrap();
        assert_eq!(r.addrs, [A1]);
        assert!(r.ttl <= 60 && r.ttl > 50);
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1, "cached");
    assert_eq!(
        up.resolve_a(&name("gone.test")).await,
        Err(UpstreamError::NxDomain)
    );
    assert_eq!(seen.load(Ordering::SeqCst), 2, "NXDOMAIN is an answer");
    assert_eq!(
        Upstream::new(Vec::new(), Duration::from_secs(1), 0)
            .resolve_a(&name("a.test"))
            .await,
        Err(UpstreamError::NoServer)
    );
}

#[test]
fn the_cache_is_bounded() {
    let up = Upstream::new(Vec::new(), Duration::from_secs(1), 0);
    let r = Resolved {
        addrs: vec![A1],
        ttl: 60,
    };
    for i in 0..MAX_CACHED_NAMES + 3 {
        up.store(&format!("n{i}.test"), &r);
    }
    let len = up.cache.lock().unwrap().len();
    assert!(len <= MAX_CACHED_NAMES, "{len}");
    assert!(
        up.cached(&format!("n{}.test", MAX_CACHED_NAMES + 2))
            .is_some()
    );
}
