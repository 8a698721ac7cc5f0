//! Hostile clients against every listener of a real `space up`: slow heads, thousands
//! of idle connections, large bodies without credentials, layers with a bad
//! signature, and a sandbox whose writable layer holds a 50 GB sparse file. Every one
//! is cut off or refused, and the peak RSS (`VmHWM`) of the edge and of the workers
//! stays bounded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, http, peak_growth, pid_of, reset_peak};

const MIB: u64 = 1 << 20;

/// The worker `w` (`w1`, `w2`): its PID and node-api address (`host:port`).
fn worker(c: &Cluster, w: &str) -> (i32, String) {
    let dir = c.worker_dir(w);
    let pid = pid_of(&["worker", "--id", w, dir.to_str().unwrap()]);
    let url = c
        .worker_urls()
        .into_iter()
        .find(|(id, _)| id == w)
        .unwrap()
        .1;
    (pid, host_port(&url))
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// Whether the peer closes `tcp` within `within` (reads until end or error).
fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        tcp.set_read_timeout(Some(left)).unwrap();
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// A connection that sent the start of a request head and nothing more.
fn half_head(addr: &str, padding: usize) -> Option<TcpStream> {
    let mut tcp = TcpStream::connect(addr).ok()?;
    let mut head = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n").into_bytes();
    if padding > 0 {
        head.extend_from_slice(b"x-pad: ");
        head.extend(std::iter::repeat_n(b'a', padding));
        head.extend_from_slice(b"\r\n");
    }
    let _ = tcp.write_all(&head);
    Some(tcp)
}

/// The status of the answer read from `tcp` (0 when none arrived within `within`).
fn answer_status(tcp: &mut TcpStream, within: Duration) -> u16 {
    tcp.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn slow_header_clients_are_cut_off_by_the_header_timeout() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_HEADER_TIMEOUT_MS", "1500")]);
    let edge = host_port(&c.url);
    let (_, w1) = worker(&c, "w1");
    let started = Instant::now();
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|i| half_head(if i % 2 == 0 { &edge } else { &w1 }, 0).unwrap())
        .collect();
    // A header line every 300 ms: never a whole head, always something new.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        for tcp in &mut slow {
            let _ = tcp.write_all(b"x-slow: 1\r\n");
        }
    }
    for (i, tcp) in slow.iter_mut().enumerate() {
        assert!(
            closed_within(tcp, Duration::from_secs(5)),
            "slow client {i} still open {:?} after it connected",
            started.elapsed()
        );
    }
    // Normal requests are still served, on both listeners.
    let (status, body) = http("GET", &format!("http://{w1}/healthz"), None, b"");
    assert_eq!((status, &body[..]), (200, &br#"{"status":"ok"}"#[..]));
    let out = c.cli(&["--json", "workers"]);
    assert!(out.status.success());
}

#[test]
fn connections_past_the_limit_are_refused_and_rss_stays_bounded() {
    if !can_run_jails() {
        return;
    }
    const LIMIT: usize = 1000;
    let c = Cluster::start_with_env(&[("SPACE_MAX_CONNECTIONS", "1000")]);
    let edge = host_port(&c.url);
    let edge_pid = c.edge_pid();
    let (w1_pid, w1) = worker(&c, "w1");
    let (edge_base, w1_base) = (reset_peak(edge_pid), reset_peak(w1_pid));
    // 1,200 clients on each, each holding a head of 60 KiB it never finishes.
    let mut held = Vec::new();
    for addr in [&edge, &w1] {
        for _ in 0..LIMIT + 200 {
            if let Some(tcp) = half_head(addr, 60 << 10) {
                held.push(tcp);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // Those past the limit were closed at once (a few slots may be the platform's own).
    let mut closed = 0;
    for tcp in &mut held {
        if closed_within(tcp, Duration::from_millis(5)) {
            closed += 1;
        }
    }
    assert!(
        closed >= 2 * 200,
        "only {closed} of {} connections past the limits were closed",
        held.len()
    );
    let (edge_growth, w1_growth) = (
        peak_growth(edge_pid, edge_base),
        peak_growth(w1_pid, w1_base),
    );
    eprintln!(
        "{} connections held: edge peak RSS +{} MiB, worker +{} MiB",
        held.len(),
        edge_growth / MIB,
        w1_growth / MIB
    );
    assert!(edge_growth <= 256 * MIB, "edge grew {edge_growth} bytes");
    assert!(w1_growth <= 256 * MIB, "worker grew {w1_growth} bytes");
    drop(held);
    // Once they are gone, both answer again.
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = http("GET", &format!("http://{w1}/healthz"), None, b"");
    assert_eq!((status, &body[..]), (200, &br#"{"status":"ok"}"#[..]));
    let out = c.cli(&["--json", "workers"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends the head of a `len`-byte PUT/POST and then up to `send` bytes of its body
/// (stopping early if the server answers or closes); the answer's status.
fn large_body(addr: &str, head: &str, len: u64, send: u64) -> u16 {
    let mut tcp = TcpStream::connect(addr).unwrap();
    let head = format!("{head}host: {addr}\r\ncontent-length: {len}\r\n\r\n");
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let chunk = vec![b'z'; 64 << 10];
    let mut sent = 0u64;
    while sent < send {
        match tcp.write(&chunk) {
            Ok(n) => sent += n as u64,
            Err(_) => break,
        }
    }
    answer_status(&mut tcp, Duration::from_secs(5))
}

#[test]
fn unauthenticated_64_mib_bodies_are_refused_before_reading() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let edge = host_port(&c.url);
    let edge_pid = c.edge_pid();
    let (w1_pid, w1) = worker(&c, "w1");
    let (edge_base, w1_base) = (reset_peak(edge_pid), reset_peak(w1_pid));
    let len = 64 * MIB;
    let bad_key = format!("space_ak{}_{}", "a".repeat(16), "b".repeat(52));
    let start = Instant::now();
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let (edge, w1, id, bad_key) = (edge.clone(), w1.clone(), id.clone(), bad_key.clone());
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    let head = format!(
                        "PUT /v1/sandboxes/{id}/files?path=/root/x HTTP/1.1\r\nauthorization: Bearer {bad_key}\r\n"
                    );
                    large_body(&edge, &head, len, len)
                } else {
                    let head = format!(
                        "PUT /v1/sandboxes/{id}/files?path=/root/x HTTP/1.1\r\nauthorization: SpaceCap forged\r\n"
                    );
                    large_body(&w1, &head, len, len)
                }
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 401);
    }
    let took = start.elapsed();
    let (edge_growth, w1_growth) = (
        peak_growth(edge_pid, edge_base),
        peak_growth(w1_pid, w1_base),
    );
    eprintln!(
        "32 unauthenticated 64 MiB PUTs refused in {took:?}: edge peak RSS +{} MiB, worker +{} MiB",
        edge_growth / MIB,
        w1_growth / MIB
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Reading even one of those bodies would take the process 64 MiB further.
    assert!(edge_growth < 32 * MIB, "edge grew {edge_growth} bytes");
    assert!(w1_growth < 32 * MIB, "worker grew {w1_growth} bytes");
    // An authenticated upload still works.
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/ok"], b"fine");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn update_bodies_without_a_signed_delivery_are_refused_before_reading() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let _ = c.create(&["--worker", "w1"]);
    let (w1_pid, w1) = worker(&c, "w1");
    let base = reset_peak(w1_pid);
    let len = 64 * MIB;
    // A delivery signed by a rogue key, and one that is no delivery at all.
    let rogue = space_identity::BundleSigner::from_seed([7u8; 32]);
    let descriptor = serde_json::json!({"worker": "w1", "issued_at": support::unix_now(),
        "size": len, "digest": "0".repeat(64)})
    .to_string();
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let forged = format!(
        "{}.{}",
        b64(descriptor.as_bytes()),
        b64(&rogue.sign_delivery(descriptor.as_bytes()))
    );
    let start = Instant::now();
    let threads: Vec<_> = (0..24)
        .map(|i| {
            let (w1, forged) = (w1.clone(), forged.clone());
            std::thread::spawn(move || {
                let head = match i % 3 {
                    0 => "POST /internal/v1/updates HTTP/1.1\r\n".to_owned(),
                    1 => "POST /internal/v1/updates HTTP/1.1\r\nspace-delivery: garbage\r\n"
                        .to_owned(),
                    _ => format!(
                        "POST /internal/v1/updates HTTP/1.1\r\nspace-delivery: {forged}\r\n"
                    ),
                };
                large_body(&w1, &head, len, len)
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let took = start.elapsed();
    let growth = peak_growth(w1_pid, base);
    eprintln!(
        "24 unsigned 64 MiB update bodies refused in {took:?}: worker peak RSS +{} MiB",
        growth / MIB
    );
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 403),
        "{statuses:?}"
    );
    assert!(growth < 32 * MIB, "worker grew {growth} bytes");
    // The control plane's own updates still arrive: a pause and a resume.
    let id = c.create(&["--worker", "w1"]);
    for verb in ["pause", "resume"] {
        let out = c.cli(&["sandbox", verb, &id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn layer_upload_with_a_bad_signature_is_refused_before_reading_the_body() {
    forged_upload_is_refused_before_reading_the_body(
        "layers",
        |id| serde_json::json!({"kind": "layer", "sandbox": id, "digest": "0".repeat(64), "size": 1u64 << 30}),
    );
}

#[test]
fn template_upload_with_a_bad_signature_is_refused_before_reading_the_body() {
    forged_upload_is_refused_before_reading_the_body(
        "templates",
        |_| serde_json::json!({"kind": "template", "digest": format!("sha256:{}", "0".repeat(64)), "size": 1u64 << 30}),
    );
}

/// Eight 1 GiB uploads to `POST /internal/v1/{path}` under an update signed by a
/// key that is not the cluster's trust anchor: each refused (4xx) before its body
/// is read, the worker's memory and spool untouched.
fn forged_upload_is_refused_before_reading_the_body(
    path: &str,
    update: impl Fn(&str) -> serde_json::Value,
) {
    if !can_run_jails() {
        return;
    }
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let (w1_pid, w1) = worker(&c, "w1");
    let base = reset_peak(w1_pid);
    // Signed by a key that is not the cluster's trust anchor, for a 1 GiB body.
    let rogue = space_identity::BundleSigner::from_seed([7u8; 32]);
    let body =
        serde_json::json!({"worker": "w1", "issued_at": support::unix_now(), "seq": 1u64 << 40,
        "update": update(&id)})
        .to_string();
    let signed = serde_json::json!({"body": b64(body.as_bytes()),
        "signature": b64(&rogue.sign_update(body.as_bytes()))});
    let header = b64(signed.to_string().as_bytes());
    let start = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (w1, header) = (w1.clone(), header.clone());
            let head = format!("POST /internal/v1/{path} HTTP/1.1\r\nspace-update: {header}\r\n");
            std::thread::spawn(move || large_body(&w1, &head, 1 << 30, 256 * MIB))
        })
        .collect();
    for t in threads {
        let status = t.join().unwrap();
        // 403: refused for its signature (not a 404 of a route that is not there).
        assert_eq!(
            status, 403,
            "an upload to {path} with a bad signature got {status}"
        );
    }
    let took = start.elapsed();
    let growth = peak_growth(w1_pid, base);
    eprintln!(
        "8 forged 1 GiB uploads to {path} refused in {took:?}: worker peak RSS +{} MiB",
        growth / MIB
    );
    assert!(growth < 32 * MIB, "worker grew {growth} bytes");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Nothing was left in the worker's spool.
    let spool = c.worker_dir("w1").join("spool");
    if spool.exists() {
        assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
    }
}

#[test]
fn sparse_50_gb_file_in_a_snapshot_keeps_worker_rss_bounded() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "truncate -s 50G /root/big && echo made",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("made"),
        "truncate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (w1_pid, _) = worker(&c, "w1");
    let edge_pid = c.edge_pid();
    let (w1_base, edge_base) = (reset_peak(w1_pid), reset_peak(edge_pid));
    let auth = format!("Bearer {}", c.admin_key);
    let start = Instant::now();
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/snapshot", c.url),
        Some(&auth),
        b"",
    );
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("too_large") && text.contains("1 GiB") && text.contains("/root/big"),
        "{text}"
    );
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/migrate", c.url),
        Some(&auth),
        br#"{"worker": "w2"}"#,
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let took = start.elapsed();
    let (w1_growth, edge_growth) = (
        peak_growth(w1_pid, w1_base),
        peak_growth(edge_pid, edge_base),
    );
    eprintln!(
        "snapshot and migration of a 50 GB sparse file refused in {took:?}: worker peak RSS +{} MiB, edge +{} MiB",
        w1_growth / MIB,
        edge_growth / MIB
    );
    assert!(w1_growth <= 256 * MIB, "worker grew {w1_growth} bytes");
    assert!(edge_growth <= 256 * MIB, "edge grew {edge_growth} bytes");
    // The sandbox runs on where it was, thawed.
    let v = c.sandbox(&id);
    assert_eq!(v["state"], "running", "{v}");
    let out = c.cli(&["exec", &id, "--", "sh", "-c", "echo alive"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "alive");
    // Without the file the same sandbox migrates, its files intact.
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "rm /root/big; echo kept > /root/k",
    ]);
    assert!(out.status.success());
    let out = c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli(&["exec", &id, "--", "cat", "/root/k"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "kept",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
