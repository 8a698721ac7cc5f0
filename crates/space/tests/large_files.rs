//! Files of any size against a real `space up`: 100 MB round trips byte for byte
//! through the CLI and the SDK with the edge's and the worker's peak RSS bounded,
//! Range reads, a file that changes while it is read (cut, never a short 200), and a
//! write past the disk limit (a clear error, nothing half-written).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use space_client::{ByteRange, Client, Options};
use space_identity::SandboxId;
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, peak_growth, reset_peak};

const MIB: u64 = 1 << 20;

/// 100 MB, the issue's size (not MiB).
const BIG: u64 = 100_000_000;

/// Most a process's peak RSS may grow during a 100 MB transfer.
const MAX_GROWTH: u64 = 64 * MIB;

/// `len` bytes of a seeded xorshift stream: random-looking, reproducible.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len as usize + 8);
    while (out.len() as u64) < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

fn write_pattern(path: &Path, seed: u64, len: u64) -> blake3::Hash {
    let data = pattern(seed, len);
    std::fs::write(path, &data).unwrap();
    blake3::hash(&data)
}

fn hash_file(path: &Path) -> (u64, blake3::Hash) {
    let data = std::fs::read(path).unwrap();
    (data.len() as u64, blake3::hash(&data))
}

/// `sh -c script` in the sandbox through the edge: (exit code, stdout).
fn sh(c: &Cluster, id: &str, script: &str) -> (i64, String) {
    let body = serde_json::json!({"cmd": ["sh", "-c", script], "timeout_secs": 120});
    let (status, out) = c.http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.to_string().as_bytes(),
    );
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    (
        v["exit_code"].as_i64().unwrap_or(-1),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
    )
}

fn worker_of(c: &Cluster, id: &str) -> String {
    c.sandbox(id)["execution"]["worker"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A raw HTTP/1.1 exchange on loopback, to see exactly what the edge sends: the
/// status, the headers (lower-cased names) and the body bytes that arrived before the
/// connection closed (all of them, however many `Content-Length` announced).
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.parse().ok()
    }
}

/// Sends a GET with `extra` headers and reads the head; `between` runs after the head
/// and `pause_after` body bytes, then the rest is read to the connection's end.
fn raw_get(
    c: &Cluster,
    path_and_query: &str,
    extra: &[(&str, &str)],
    pause_after: usize,
    between: impl FnOnce(),
) -> Raw {
    let addr = c.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "GET {path_and_query} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\nconnection: close\r\n",
        c.admin_key
    );
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before the head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut body = buf[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut between = Some(between);
    loop {
        if body.len() >= pause_after {
            if let Some(f) = between.take() {
                f();
            }
        }
        let want = if between.is_some() {
            (pause_after - body.len()).min(chunk.len())
        } else {
            chunk.len()
        };
        match s.read(&mut chunk[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    Raw {
        status,
        headers,
        body,
    }
}

fn files_path(id: &str, path: &str) -> String {
    format!("/v1/sandboxes/{id}/files?path={path}")
}

/// Peak RSS baselines of the edge and the sandbox's worker, reset now.
fn peaks(c: &Cluster, worker: &str) -> [(i32, u64); 2] {
    let (e, w) = (c.edge_pid(), c.worker_pid(worker));
    [(e, reset_peak(e)), (w, reset_peak(w))]
}

fn assert_bounded(what: &str, base: [(i32, u64); 2]) {
    let [(e, eb), (w, wb)] = base;
    let (eg, wg) = (peak_growth(e, eb), peak_growth(w, wb));
    eprintln!(
        "{what}: peak RSS growth edge {:.1} MiB, worker {:.1} MiB",
        eg as f64 / MIB as f64,
        wg as f64 / MIB as f64
    );
    assert!(eg <= MAX_GROWTH, "{what}: the edge grew {eg} bytes");
    assert!(wg <= MAX_GROWTH, "{what}: the worker grew {wg} bytes");
}

#[test]
fn a_100_mb_file_round_trips_byte_for_byte_through_the_cli() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--disk-mib", "512"]);
    let worker = worker_of(&c, &id);
    let local = c.dir.path().join("big.in");
    let sent = write_pattern(&local, 12, BIG);

    // Up from a file, with the edge's and the worker's peak RSS watched.
    let base = peaks(&c, &worker);
    let t = Instant::now();
    let out = c.cli(&["fs", "put", &id, local.to_str().unwrap(), "/root/big"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("cli put 100 MB: {:?}", t.elapsed());
    assert_bounded("cli put", base);
    let (code, size) = sh(&c, &id, "stat -c %s /root/big");
    assert_eq!((code, size.trim()), (0, BIG.to_string().as_str()));

    // Down to a file.
    let back = c.dir.path().join("big.out");
    let base = peaks(&c, &worker);
    let t = Instant::now();
    let out = c.cli(&["fs", "get", &id, "/root/big", back.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("cli get 100 MB: {:?}", t.elapsed());
    assert_bounded("cli get", base);
    assert_eq!(hash_file(&back), (BIG, sent));

    // Down to stdout, and up from stdin: the same bytes.
    let out = c.cli(&["fs", "get", &id, "/root/big"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len() as u64, BIG);
    assert_eq!(blake3::hash(&out.stdout), sent);
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/again"], &out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = c.dir.path().join("again.out");
    let out = c.cli(&["fs", "get", &id, "/root/again", again.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hash_file(&again), (BIG, sent));
}

#[test]
fn a_100_mb_file_round_trips_byte_for_byte_through_the_sdk() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--disk-mib", "512"]);
    let worker = worker_of(&c, &id);
    let sandbox: SandboxId = id.parse().unwrap();
    let local = c.dir.path().join("big.in");
    let sent = write_pattern(&local, 34, BIG);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for direct in [true, false] {
        let client = Client::with_options(
            &c.url,
            &c.admin_key,
            Options {
                direct,
                ..Options::default()
            },
        );
        let what = if direct { "sdk direct" } else { "sdk via edge" };
        let target = format!("/root/sdk-{direct}");
        let base = peaks(&c, &worker);
        let n = rt
            .block_on(client.write_file_from_path(&sandbox, &target, &local))
            .unwrap();
        assert_eq!(n, BIG);
        assert_bounded(&format!("{what} write"), base);

        let back = c.dir.path().join(format!("sdk-{direct}.out"));
        let base = peaks(&c, &worker);
        let got = rt
            .block_on(async {
                let mut f = tokio::fs::File::create(&back).await.unwrap();
                client.read_file_to(&sandbox, &target, &mut f).await
            })
            .unwrap();
        assert_eq!(got, BIG);
        assert_bounded(&format!("{what} read"), base);
        assert_eq!(hash_file(&back), (BIG, sent), "{what}");

        // From a reader of unknown length, too.
        let data = std::fs::read(&local).unwrap();
        rt.block_on(client.write_file_from_reader(
            &sandbox,
            "/root/from-reader",
            std::io::Cursor::new(data),
        ))
        .unwrap();
        let mut again = Vec::new();
        rt.block_on(client.read_file_to(&sandbox, "/root/from-reader", &mut again))
            .unwrap();
        assert_eq!(blake3::hash(&again), sent, "{what}");

        // The in-memory read refuses rather than holding (or cutting) a large file.
        let big = rt.block_on(client.read_file(&sandbox, &target));
        rt.block_on(client.write_file_from(
            &sandbox,
            "/root/small",
            std::io::Cursor::new(b"small\n".to_vec()),
            6,
        ))
        .unwrap();
        let small = rt.block_on(client.read_file(&sandbox, "/root/small"));
        assert_eq!(small.unwrap().as_ref(), b"small\n");
        if space_client::READ_FILE_MAX < BIG {
            let e = big.unwrap_err();
            assert_eq!(e.code(), Some("too_large"), "{e}");
        } else {
            assert_eq!(big.unwrap().len() as u64, BIG);
        }
    }
}

#[test]
fn range_reads_return_exactly_the_bytes_asked_for() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let sandbox: SandboxId = id.parse().unwrap();
    let size: u64 = 3 * MIB + 12_345;
    let data = pattern(56, size);
    let client = Client::new(&c.url, &c.admin_key);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client.write_file_from(
        &sandbox,
        "/root/r",
        std::io::Cursor::new(data.clone()),
        size,
    ))
    .unwrap();
    let path = files_path(&id, "/root/r");
    let s = size as usize;
    for (range, first, last) in [
        ("bytes=0-99", 0, 99),
        ("bytes=1000000-2000000", 1_000_000, 2_000_000),
        ("bytes=3145000-", 3_145_000, s - 1),
        ("bytes=-10", s - 10, s - 1),
        ("bytes=100-99999999", 100, s - 1),
        ("bytes=-99999999", 0, s - 1),
    ] {
        let r = raw_get(&c, &path, &[("range", range)], 0, || {});
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {first}-{last}/{size}").as_str()),
            "{range}"
        );
        assert_eq!(
            r.content_length(),
            Some((last - first + 1) as u64),
            "{range}"
        );
        assert!(r.body == data[first..=last], "{range}: other bytes");
    }
    // Nothing to select: 416 with the size.
    for range in [format!("bytes={size}-"), "bytes=-0".to_owned()] {
        let r = raw_get(&c, &path, &[("range", &range)], 0, || {});
        assert_eq!(r.status, 416, "{range}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes */{size}").as_str())
        );
        let e: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(e["error"], "range_not_satisfiable");
    }
    // Not one byte range: ignored, the whole file.
    for range in ["bytes=0-1,5-6", "items=0-3", "bytes=9-2"] {
        let r = raw_get(&c, &path, &[("range", range)], 0, || {});
        assert_eq!((r.status, r.body.len() as u64), (200, size), "{range}");
        assert_eq!(r.header("accept-ranges"), Some("bytes"));
    }
    // Direct to the worker, and through the SDK, the same.
    for direct in [true, false] {
        let client = Client::with_options(
            &c.url,
            &c.admin_key,
            Options {
                direct,
                ..Options::default()
            },
        );
        let mut out = Vec::new();
        let got = rt
            .block_on(client.read_file_range_to(
                &sandbox,
                "/root/r",
                ByteRange::Span {
                    first: 7,
                    last: 70_006,
                },
                &mut out,
            ))
            .unwrap();
        assert_eq!((got.start, got.len, got.size), (7, 70_000, size));
        assert!(out == data[7..70_007]);
        let e = rt
            .block_on(client.read_file_range_to(
                &sandbox,
                "/root/r",
                ByteRange::From(size),
                &mut Vec::new(),
            ))
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(416), "{e}");
    }
}

#[test]
fn a_file_that_changes_while_read_is_cut_short_of_its_length_never_a_short_200() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--disk-mib", "256"]);
    let (code, _) = sh(
        &c,
        &id,
        "head -c 48M /dev/urandom > /root/shrinks && cp /root/shrinks /root/grows",
    );
    assert_eq!(code, 0);

    // Shrinks: cut to 1 MiB after the first MiB of the answer went out.
    let r = raw_get(
        &c,
        &files_path(&id, "/root/shrinks"),
        &[],
        MIB as usize,
        || {
            assert_eq!(sh(&c, &id, "truncate -s 1M /root/shrinks").0, 0);
        },
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.content_length(), Some(48 * MIB));
    assert!(
        (r.body.len() as u64) < 48 * MIB,
        "a shrunk file was answered whole: {} bytes",
        r.body.len()
    );

    // Grows: 1 MiB appended while it is read. Every byte of the length could be
    // sent, and would look complete; the end is held back and the answer cut.
    let r = raw_get(
        &c,
        &files_path(&id, "/root/grows"),
        &[],
        MIB as usize,
        || {
            assert_eq!(sh(&c, &id, "head -c 1M /dev/zero >> /root/grows").0, 0);
        },
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.content_length(), Some(48 * MIB));
    assert!(
        (r.body.len() as u64) < 48 * MIB,
        "a file that grew while read was answered as complete at its old size"
    );

    // The CLI says so and exits non-zero, and leaves no partial file behind.
    sh(&c, &id, "head -c 48M /dev/urandom > /root/shrinks2");
    let mut child = std::process::Command::new(support::space_bin())
        .args(["fs", "get", &id, "/root/shrinks2"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = vec![0u8; MIB as usize];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(sh(&c, &id, "truncate -s 0 /root/shrinks2").0, 0);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "a short read exited 0");
    assert!((first.len() + rest.len()) < 48 << 20);
    eprintln!(
        "cli on a short read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_write_past_the_disk_limit_is_a_clear_error_and_leaves_no_partial_file() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    if !c.worker_dir("w1").join("disk.img").exists() {
        eprintln!("skipping: the workers have no disk volume (mkfs.btrfs missing?)");
        return;
    }
    let id = c.create(&["--disk-mib", "64"]);
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/keep"], b"the old content\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local = c.dir.path().join("big.in");
    write_pattern(&local, 78, BIG);

    // Over the limit: the CLI fails with the worker's reason.
    let out = c.cli(&["fs", "put", &id, local.to_str().unwrap(), "/root/keep"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a write past the disk limit succeeded"
    );
    assert!(err.contains("no_space") && err.contains("507"), "{err}");

    // The old file is whole, and nothing else is left in its directory.
    let out = c.cli(&["fs", "get", &id, "/root/keep"]);
    assert!(
        out.stdout == b"the old content\n",
        "the old file is not whole: {} bytes",
        out.stdout.len()
    );
    let (_, listing) = sh(&c, &id, "ls -a /root");
    assert!(
        !listing.contains("space-tmp"),
        "a temporary file stayed: {listing}"
    );
    // And the room is back: a file that fits is written.
    let (code, _) = sh(
        &c,
        &id,
        "head -c 40M /dev/zero > /root/fits && rm /root/fits",
    );
    assert_eq!(code, 0, "the failed write's space was not freed");

    // Through the HTTP API: 507 with a JSON error.
    let client = Client::with_options(
        &c.url,
        &c.admin_key,
        Options {
            direct: false,
            ..Options::default()
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sandbox: SandboxId = id.parse().unwrap();
    let e = rt
        .block_on(client.write_file_from_path(&sandbox, "/root/new", &local))
        .unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(507), "{e}");
    assert_eq!(e.code(), Some("no_space"), "{e}");
    let (_, listing) = sh(&c, &id, "ls -a /root");
    assert!(!listing.contains("new"), "{listing}");
}

/// Sum of the edge's route recoveries with `outcome`, over every reason.
fn recoveries(c: &Cluster, outcome: &str) -> f64 {
    let (_, metrics) = c.http("GET", &format!("{}/metrics", c.url), None, b"");
    String::from_utf8_lossy(&metrics)
        .lines()
        .filter(|l| {
            l.starts_with("space_edge_route_recoveries_total{")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn an_upload_refused_by_a_stale_route_is_rebuilt_with_its_whole_body() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--disk-mib", "256"]);
    let from = worker_of(&c, &id);
    let to = if from == "w1" { "w2" } else { "w1" };
    // The edge caches the route to the first worker.
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/warm"], b"warm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli(&["sandbox", "migrate", &id, "--worker", to]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(worker_of(&c, &id), to);
    let rebuilt = recoveries(&c, "rebuilt");

    // 32 MB through the stale route: the old worker refuses it at admission (421),
    // before reading its body; the edge's rebuilt attempt carries every byte.
    let local = c.dir.path().join("up.in");
    let sent = write_pattern(&local, 90, 32_000_000);
    let out = c.cli(&["fs", "put", &id, local.to_str().unwrap(), "/root/up"]);
    assert!(
        out.status.success(),
        "the upload through a stale route failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        recoveries(&c, "rebuilt"),
        rebuilt + 1.0,
        "the upload did not go through a rebuilt attempt"
    );
    let back = c.dir.path().join("up.out");
    let out = c.cli(&["fs", "get", &id, "/root/up", back.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hash_file(&back), (32_000_000, sent));

    // The SDK in direct mode, the same: its cached route goes stale with a migration
    // back, and its one rebuilt attempt carries the whole body.
    let client = Client::new(&c.url, &c.admin_key);
    let sandbox: SandboxId = id.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client.write_file_from(
        &sandbox,
        "/root/warm",
        std::io::Cursor::new(b"warm".to_vec()),
        4,
    ))
    .unwrap();
    let out = c.cli(&["sandbox", "migrate", &id, "--worker", &from]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = client.recoveries().rebuilt;
    rt.block_on(client.write_file_from_path(&sandbox, "/root/up2", &local))
        .unwrap();
    assert_eq!(client.recoveries().rebuilt, before + 1);
    let mut got = Vec::new();
    rt.block_on(client.read_file_to(&sandbox, "/root/up2", &mut got))
        .unwrap();
    assert_eq!(blake3::hash(&got), sent);
}

#[test]
fn an_upload_cut_part_way_leaves_the_old_file_whole_and_no_temporary_file() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--disk-mib", "256"]);
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/keep"], b"old\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A client announces 50 MB, sends 8 MB and goes away.
    let addr = c.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!(
        "PUT {} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\n\
         content-type: application/octet-stream\r\ncontent-length: 50000000\r\n\r\n",
        files_path(&id, "/root/keep"),
        c.admin_key
    );
    s.write_all(head.as_bytes()).unwrap();
    let data = pattern(3, 8 * MIB);
    s.write_all(&data).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    // The agent drops its temporary file once the worker's connection ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, listing) = sh(&c, &id, "ls -a /root");
        if !listing.contains("space-tmp") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a temporary file stayed: {listing}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = c.cli(&["fs", "get", &id, "/root/keep"]);
    assert!(
        out.stdout == b"old\n",
        "the old file was replaced by {} bytes of a cut upload: {}",
        out.stdout.len(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stalled_client_loses_its_transfer_after_the_idle_time() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_FILE_IDLE_SECS", "2")]);
    let id = c.create(&["--disk-mib", "256"]);
    let out = c.cli_with_stdin(&["fs", "put", &id, "-", "/root/keep"], b"old\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An upload that announces 50 MB, sends 1 MB and stalls (the connection open).
    let addr = c.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!(
        "PUT {} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\n\
         content-type: application/octet-stream\r\ncontent-length: 50000000\r\n\r\n",
        files_path(&id, "/root/keep"),
        c.admin_key
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&pattern(5, MIB)).unwrap();
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) => {
                assert!(
                    e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut,
                    "a stalled upload was still held after {:?}",
                    t.elapsed()
                );
                break;
            }
        }
    }
    eprintln!(
        "stalled upload ended after {:?}: {}",
        t.elapsed(),
        String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or("(closed)")
    );
    assert!(t.elapsed() < Duration::from_secs(12));
    drop(s);
    let out = c.cli(&["fs", "get", &id, "/root/keep"]);
    assert!(out.stdout == b"old\n", "{} bytes", out.stdout.len());
    let (_, listing) = sh(&c, &id, "ls -a /root");
    assert!(!listing.contains("space-tmp"), "{listing}");

    // A download whose reader stalls past the idle time is cut.
    assert_eq!(sh(&c, &id, "head -c 48M /dev/urandom > /root/big").0, 0);
    let r = raw_get(&c, &files_path(&id, "/root/big"), &[], 1, || {
        std::thread::sleep(Duration::from_secs(5));
    });
    assert_eq!(r.content_length(), Some(48 * MIB));
    assert!(
        (r.body.len() as u64) < 48 * MIB,
        "a stalled download was held open past the idle time"
    );
}
