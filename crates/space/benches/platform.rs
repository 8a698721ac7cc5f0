//! P3, P4 and P5 (in place) of QUALITY.md against a real `space up` (two workers) on
//! loopback.
//!
//! - P3: a 4 KiB file read end to end (client → edge → worker → bridge → agent in the
//!   jail), sequential p50/p99, versus a direct call to a guest agent on a pooled
//!   connection measured in the same run; and throughput with 16 concurrent clients.
//! - P4: 50 sandbox creates at once through the public API, each ready for its first
//!   exec when the call returns (a command runs in each afterwards): p50/p99 with the
//!   defaults of `space up` (16 warm jails and 16 standby sandboxes per worker), with
//!   32 warm jails per worker alone, and with no pools.
//!
//! `cargo bench -p space --bench platform` (root); `SPACE_BENCH_ONLY=p3` stops after P3.

#![allow(clippy::print_stdout)] // A bench binary reports on stdout.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use space_http::HttpClient;
use space_identity::{ExecutionId, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::Activation;

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rustix::rand::getrandom(&mut out, rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    out
}

/// A guest agent outside any jail, on a pooled, handshaken connection: the baseline,
/// from a blocking client and from an asynchronous one on `seq` (the runtime the other
/// P3 rows are measured from). Sorted times of each.
fn direct_agent_reads(
    iterations: usize,
    seq: &tokio::runtime::Runtime,
) -> (Vec<Duration>, Vec<Duration>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let activation = Activation {
        sandbox: SandboxId::from_bytes(random()),
        generation: 1,
        execution_id: ExecutionId::from_bytes(random()),
        activation: 1,
        secret: random(),
    };
    let act = dir.path().join("activation.json");
    std::fs::write(&act, activation.encode()).expect("activation");
    let file = dir.path().join("4k.bin");
    std::fs::write(&file, vec![7u8; 4096]).expect("file");
    let socket = dir.path().join("agent.sock");
    let mut child =
        std::process::Command::new(space_testkit::workspace_bin("spaced-guest", "spaced-guest"))
            .args(["serve", "--listen"])
            .arg(&socket)
            .arg("--activation-file")
            .arg(&act)
            .arg("--home")
            .arg(dir.path())
            .spawn()
            .expect("agent");
    while !socket.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stream = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    let mut conn = AgentConnection::handshake_verified(stream, random(), &activation.secret)
        .expect("handshake");
    let path = file.to_str().expect("utf-8");
    let mut blocking = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let data = conn.read_file(path, 1 << 20).expect("read");
        blocking.push(t.elapsed());
        assert_eq!(data.len(), 4096);
    }
    blocking.sort();
    let mut asynchronous = seq.block_on(async {
        let mut conn = conn
            .map_stream(|s| {
                s.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(s)
            })
            .expect("non-blocking");
        let mut times = Vec::with_capacity(iterations);
        for i in 0..iterations + 200 {
            let t = Instant::now();
            let data = conn
                .run_async(space_proto::client::Call::read_file(path, 1 << 20))
                .await
                .expect("read");
            if i >= 200 {
                times.push(t.elapsed());
            }
            assert_eq!(data.len(), 4096);
        }
        times
    });
    asynchronous.sort();
    let _ = child.kill();
    let _ = child.wait();
    (blocking, asynchronous)
}

fn main() {
    if !support::can_run_jails() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The defaults of `space up`: warm pools of 16 jails per worker and 16 standby
    // sandboxes per worker (the test harness turns both down; set them back).
    let defaults = Pools {
        warm: space_worker::daemon::DEFAULT_WARM_POOL,
        standby: space_control::service::STANDBY_PER_WORKER * 2,
    };
    let cluster = defaults.start();
    // Measure on a quiet machine: the pools fill first.
    wait_for_pools(&cluster, defaults);

    let http = HttpClient::new(Duration::from_secs(30));
    if std::env::var("SPACE_BENCH_ONLY").as_deref() != Ok("p4") {
        p3_to_p8(&rt, &cluster);
        if std::env::var("SPACE_BENCH_ONLY").as_deref() == Ok("p3") {
            return;
        }
    }

    // ---- P4 -------------------------------------------------------------------------
    // Three configurations, each measured on full pools:
    // - the defaults of `space up`: creates claim standby sandboxes (one write) and,
    //   once those are gone, activate warm jails;
    // - warm jails alone, 32 per worker (as many launched ahead as the defaults);
    // - a jail and bridge launched for every create (no pools).
    let report = |name: &str, cluster: &support::Cluster, pools: Pools| {
        let url = cluster.url.clone();
        let auth = format!("Bearer {}", cluster.admin_key);
        wait_for_pools(cluster, pools);
        let burst = p4_burst(&rt, &http, &url, &auth);
        wait_for_pools(cluster, pools);
        let single = p4_single(&rt, &http, &url, &auth);
        println!(
            "P4 create, 50 concurrent through the public API ({name}): min {:.1} ms, p50 {:.1} ms, p99 {:.1} ms",
            pct(&burst, 0.0),
            pct(&burst, 0.5),
            pct(&burst, 0.99)
        );
        println!(
            "P4 create, one at a time ({name}): p50 {:.1} ms, p99 {:.1} ms",
            pct(&single, 0.5),
            pct(&single, 0.99)
        );
    };
    report(
        "defaults: 16 warm jails and 16 standby sandboxes per worker",
        &cluster,
        defaults,
    );
    drop(cluster);
    for (name, warm) in [
        ("32 warm jails per worker, no standby", 32),
        ("no pools", 0),
    ] {
        let pools = Pools { warm, standby: 0 };
        let cluster = pools.start();
        report(name, &cluster, pools);
    }
}

/// P3, P5 (in place and migrate), P6 and P8 on `cluster`.
fn p3_to_p8(rt: &tokio::runtime::Runtime, cluster: &support::Cluster) {
    let url = cluster.url.clone();
    let auth = format!("Bearer {}", cluster.admin_key);
    // ---- P3 -------------------------------------------------------------------------
    let id = cluster.create(&[]);
    assert!(
        cluster
            .cli_with_stdin(&["fs", "put", &id, "-", "/root/4k.bin"], &[7u8; 4096])
            .status
            .success()
    );
    let http = HttpClient::new(Duration::from_secs(30));
    // Sequential timings run on a one-thread runtime with its own client, as the direct
    // baseline runs on one thread: the measuring client's own wake-ups then do not
    // cross CPUs (on the multi-thread runtime they add ~80 µs to every round trip here).
    let seq = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seq_http = HttpClient::new(Duration::from_secs(30));
    let (direct, direct_async) = direct_agent_reads(2000, &seq);
    let (direct_p50, direct_p99) = (pct(&direct, 0.5), pct(&direct, 0.99));
    let read_url = format!("{url}/v1/sandboxes/{id}/files?path=/root/4k.bin");
    // More reads (for a profile): `SPACE_BENCH_P3_READS`.
    let reads = std::env::var("SPACE_BENCH_P3_READS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let read = seq.block_on(seq_http.call(
        hyper::Method::GET,
        &read_url,
        &[("authorization", auth.as_str())],
        Bytes::new(),
    ));
    assert_eq!(read.expect("read").body.len(), 4096);
    eprintln!("P3: {reads} reads through the edge");
    let mut e2e = seq.block_on(sequential(&seq_http, &read_url, &auth, reads));
    e2e.sort();
    let (e2e_p50, e2e_p99) = (pct(&e2e, 0.5), pct(&e2e, 0.99));
    // The worker serving the sandbox, for its HTTP round-trip baseline.
    let worker = cluster.sandbox(&id)["execution"]["worker"]
        .as_str()
        .expect("worker")
        .to_owned();
    let (_, worker_url) = cluster
        .worker_urls()
        .into_iter()
        .find(|(w, _)| *w == worker)
        .expect("worker url");
    // The same read through the SDK in direct mode (`space-client`): a capability from
    // the edge once, then straight to the worker's node-api.
    let sdk = space_client::Client::with_options(
        &url,
        &cluster.admin_key,
        space_client::Options {
            timeout: Duration::from_secs(10),
            ..space_client::Options::default()
        },
    );
    let sandbox: SandboxId = id.parse().expect("sandbox id");
    eprintln!("P3: {reads} reads through the SDK in direct mode");
    let mut direct_mode: Vec<Duration> = seq.block_on(async {
        let mut times = Vec::with_capacity(reads);
        for i in 0..reads + 200 {
            let t = Instant::now();
            let data = sdk.read_file(&sandbox, "/root/4k.bin").await.expect("read");
            if i >= 200 {
                times.push(t.elapsed());
            }
            assert_eq!(data.len(), 4096);
        }
        times
    });
    direct_mode.sort();
    println!(
        "P3 4 KiB read, direct agent (pooled, blocking client): p50 {direct_p50:.3} ms, p99 {direct_p99:.3} ms"
    );
    println!(
        "P3 4 KiB read, direct agent (pooled, async client as below): p50 {:.3} ms, p99 {:.3} ms",
        pct(&direct_async, 0.5),
        pct(&direct_async, 0.99)
    );
    println!(
        "P3 4 KiB read, SDK direct mode worker→bridge→agent: p50 {:.3} ms, p99 {:.3} ms",
        pct(&direct_mode, 0.5),
        pct(&direct_mode, 0.99)
    );
    println!("P3 4 KiB read, edge→worker→bridge→agent: p50 {e2e_p50:.3} ms, p99 {e2e_p99:.3} ms");
    let direct_async_p50 = pct(&direct_async, 0.5);
    println!(
        "P3 ratio p50 through the edge / direct: {:.2}x (async client {:.2}x)",
        e2e_p50 / direct_p50,
        e2e_p50 / direct_async_p50
    );
    println!(
        "P3 ratio p50 SDK direct mode / direct: {:.2}x (async client {:.2}x)",
        pct(&direct_mode, 0.5) / direct_p50,
        pct(&direct_mode, 0.5) / direct_async_p50
    );
    let (sdk_ops, sdk_failed) = rt.block_on(async {
        let until = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let sdk = sdk.clone();
            tasks.push(tokio::spawn(async move {
                let (mut done, mut failed) = (0u64, Vec::new());
                while Instant::now() < until {
                    match sdk.read_file(&sandbox, "/root/4k.bin").await {
                        Ok(_) => done += 1,
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (done, failed)
            }));
        }
        let (mut done, mut failed) = (0, Vec::new());
        for t in tasks {
            let (d, f) = t.await.expect("task");
            done += d;
            failed.extend(f);
        }
        (done as f64 / 5.0, failed)
    });
    if !sdk_failed.is_empty() {
        println!(
            "P3 SDK throughput: {} reads failed, first: {}",
            sdk_failed.len(),
            sdk_failed[0]
        );
    }
    println!(
        "P3 throughput, 16 concurrent SDK tasks in direct mode, 4 KiB reads: {sdk_ops:.0} ops/s"
    );

    let ops = rt.block_on(async {
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let until = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (http, read_url, auth, done) = (
                http.clone(),
                read_url.clone(),
                auth.clone(),
                Arc::clone(&done),
            );
            tasks.push(tokio::spawn(async move {
                let h = [("authorization", auth.as_str())];
                while Instant::now() < until {
                    if http
                        .call(hyper::Method::GET, &read_url, &h, Bytes::new())
                        .await
                        .is_ok_and(|a| a.status == 200)
                    {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        done.load(std::sync::atomic::Ordering::Relaxed) as f64 / 5.0
    });
    println!("P3 throughput, 16 concurrent clients, 4 KiB reads end to end: {ops:.0} ops/s");
    // What one HTTP round trip costs with this client: the worker's and the edge's
    // cheapest answers (no sandbox behind them).
    let worker_health = format!("{worker_url}/healthz");
    let hops: Vec<(&str, String, &str)> = vec![
        ("worker /healthz", worker_health, ""),
        ("edge /v1/whoami", format!("{url}/v1/whoami"), auth.as_str()),
    ];
    for (name, target, authorization) in hops {
        let mut times = seq.block_on(sequential(&seq_http, &target, authorization, 2000));
        times.sort();
        println!(
            "P3 one HTTP round trip, {name}: p50 {:.3} ms, p99 {:.3} ms",
            pct(&times, 0.5),
            pct(&times, 0.99)
        );
    }
    if std::env::var("SPACE_BENCH_ONLY").as_deref() == Ok("p3") {
        return;
    }
    // ---- P5 (in place) ---------------------------------------------------------------
    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    rt.block_on(async {
        let h = [("authorization", auth.as_str())];
        for _ in 0..20 {
            for (verb, out) in [("pause", &mut pauses), ("resume", &mut resumes)] {
                let t = Instant::now();
                let a = http
                    .call(
                        hyper::Method::POST,
                        &format!("{url}/v1/sandboxes/{id}/{verb}"),
                        &h,
                        Bytes::new(),
                    )
                    .await
                    .expect(verb);
                out.push(t.elapsed());
                assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
            }
        }
    });
    pauses.sort();
    resumes.sort();
    println!(
        "P5 pause in place through the public API: p50 {:.2} ms; resume: p50 {:.2} ms",
        pct(&pauses, 0.5),
        pct(&resumes, 0.5)
    );

    // ---- P5 (migrate) and P6 ----------------------------------------------------------
    // A sandbox with a 64 MiB filesystem moved between the two workers; then the first
    // read through the edge, whose route cache still names the old execution (one
    // rebuilt attempt), against a warm read.
    let mover = cluster.create(&["--worker", "w1"]);
    assert!(
        cluster
            .cli(&[
                "exec",
                &mover,
                "--",
                "sh",
                "-c",
                "head -c 67108864 /dev/urandom > /root/blob"
            ])
            .status
            .success()
    );
    let mover_read = format!("{url}/v1/sandboxes/{mover}/files?path=/root/4k");
    assert!(
        cluster
            .cli_with_stdin(&["fs", "put", &mover, "-", "/root/4k"], &[1u8; 4096])
            .status
            .success()
    );
    let (mut migrations, mut stale, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        let h = [
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        for (i, target) in ["w2", "w1", "w2", "w1", "w2", "w1"].iter().enumerate() {
            // Warm the edge's cache for the current execution.
            for _ in 0..3 {
                let t = Instant::now();
                let a = http
                    .call(hyper::Method::GET, &mover_read, &h[..1], Bytes::new())
                    .await
                    .expect("read");
                assert_eq!(a.status, 200);
                if i > 0 {
                    warm.push(t.elapsed());
                }
            }
            let t = Instant::now();
            let body = Bytes::from(format!(r#"{{"worker":"{target}"}}"#));
            let a = http
                .call(
                    hyper::Method::POST,
                    &format!("{url}/v1/sandboxes/{mover}/migrate"),
                    &h,
                    body,
                )
                .await
                .expect("migrate");
            migrations.push(t.elapsed());
            assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
            let t = Instant::now();
            let a = http
                .call(hyper::Method::GET, &mover_read, &h[..1], Bytes::new())
                .await
                .expect("read");
            stale.push(t.elapsed());
            assert_eq!(a.status, 200);
        }
    });
    migrations.sort();
    stale.sort();
    warm.sort();
    println!(
        "P5 migrate with a 64 MiB filesystem through the public API: p50 {:.0} ms, max {:.0} ms",
        pct(&migrations, 0.5),
        pct(&migrations, 1.0)
    );
    println!(
        "P6 first read after a migration through the stale route: p50 {:.2} ms vs warm p50 {:.2} ms (+{:.2} ms)",
        pct(&stale, 0.5),
        pct(&warm, 0.5),
        pct(&stale, 0.5) - pct(&warm, 0.5)
    );

    // ---- P8 -------------------------------------------------------------------------
    // 10 terminals and 10 watches on one execution; the time from the worker's
    // acknowledgement of its retirement (the sandbox's delete returning) to the last
    // stream's "execution replaced" close at the client.
    let victim = cluster.create(&[]);
    let p8 = rt.block_on(async {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut sockets = Vec::new();
        for i in 0..20 {
            let path = if i % 2 == 0 {
                "terminal"
            } else {
                "watch?path=/root"
            };
            let mut req = format!(
                "{}/v1/sandboxes/{victim}/{path}",
                url.replacen("http", "ws", 1)
            )
            .into_client_request()
            .expect("request");
            req.headers_mut()
                .insert("authorization", auth.parse().expect("header"));
            sockets.push(
                tokio_tungstenite::connect_async(req)
                    .await
                    .expect("stream")
                    .0,
            );
        }
        let h = [("authorization", auth.as_str())];
        let a = http
            .call(
                hyper::Method::DELETE,
                &format!("{url}/v1/sandboxes/{victim}"),
                &h,
                Bytes::new(),
            )
            .await
            .expect("delete");
        let acked = Instant::now();
        assert_eq!(a.status, 204);
        let mut last = Duration::ZERO;
        for mut s in sockets {
            loop {
                match s.next().await {
                    Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_)))
                    | None
                    | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                }
            }
            last = last.max(acked.elapsed());
        }
        last
    });
    println!(
        "P8 last of 20 streams closed after the retirement was acknowledged: {:.2} ms",
        p8.as_secs_f64() * 1e3
    );
}

/// `n` GETs of `target` one after the other (after 200 not timed).
async fn sequential(
    http: &HttpClient,
    target: &str,
    authorization: &str,
    n: usize,
) -> Vec<Duration> {
    let h = [("authorization", authorization)];
    let h = if authorization.is_empty() {
        &h[..0]
    } else {
        &h[..]
    };
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 200 {
        let t = Instant::now();
        let a = http
            .call(hyper::Method::GET, target, h, Bytes::new())
            .await
            .expect("get");
        assert_eq!(a.status, 200, "{target}");
        if i >= 200 {
            times.push(t.elapsed());
        }
    }
    times
}

/// What a cluster keeps launched ahead of demand.
#[derive(Clone, Copy)]
struct Pools {
    /// Warm jails per worker.
    warm: usize,
    /// Standby sandboxes in all.
    standby: usize,
}

impl Pools {
    fn start(self) -> support::Cluster {
        let (warm, standby) = (self.warm.to_string(), self.standby.to_string());
        support::Cluster::start_with_env(&[
            ("SPACE_WARM_POOL", warm.as_str()),
            ("SPACE_STANDBY", standby.as_str()),
        ])
    }
}

/// Waits until the workers' warm pools are full and the standby sandboxes are ready
/// (twice, a keeper tick apart, so a refill under way is seen).
fn wait_for_pools(cluster: &support::Cluster, pools: Pools) {
    for _ in 0..2 {
        if pools.warm > 0 {
            cluster.wait_for_warm_pools(pools.warm);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while cluster.control_metric("space_control_standby_ready") < pools.standby as f64 {
            assert!(
                Instant::now() < deadline,
                "standby sandboxes did not fill up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(400));
    }
}

/// One create through the public API, and a command run in the new sandbox (not
/// timed): "created" means ready for its first exec.
async fn create_one(http: HttpClient, url: String, auth: String) -> (Duration, String) {
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let t = Instant::now();
    let a = http
        .call(
            hyper::Method::POST,
            &format!("{url}/v1/sandboxes"),
            &h,
            Bytes::from_static(b"{}"),
        )
        .await
        .expect("create");
    let took = t.elapsed();
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let id: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
    (took, id["id"].as_str().expect("id").to_owned())
}

async fn first_exec(http: &HttpClient, url: &str, auth: &str, ids: &[String]) {
    let h = [
        ("authorization", auth),
        ("content-type", "application/json"),
    ];
    for id in ids {
        let a = http
            .call(
                hyper::Method::POST,
                &format!("{url}/v1/sandboxes/{id}/exec"),
                &h,
                Bytes::from_static(br#"{"cmd":["true"]}"#),
            )
            .await
            .expect("exec");
        assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    }
}

/// 50 creates at once.
fn p4_burst(
    rt: &tokio::runtime::Runtime,
    http: &HttpClient,
    url: &str,
    auth: &str,
) -> Vec<Duration> {
    let (mut times, ids): (Vec<Duration>, Vec<String>) = rt.block_on(async {
        let tasks: Vec<_> = (0..50)
            .map(|_| tokio::spawn(create_one(http.clone(), url.to_owned(), auth.to_owned())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("task"));
        }
        out.into_iter().unzip()
    });
    rt.block_on(first_exec(http, url, auth, &ids));
    times.sort();
    times
}

/// 20 creates one after the other.
fn p4_single(
    rt: &tokio::runtime::Runtime,
    http: &HttpClient,
    url: &str,
    auth: &str,
) -> Vec<Duration> {
    let mut times = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..20 {
        let (took, id) = rt.block_on(create_one(http.clone(), url.to_owned(), auth.to_owned()));
        times.push(took);
        ids.push(id);
    }
    rt.block_on(first_exec(http, url, auth, &ids));
    times.sort();
    times
}
