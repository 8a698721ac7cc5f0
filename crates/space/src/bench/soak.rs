//! `space bench soak`: sandboxes migrating, pausing and resuming back to back while
//! clients read, write, exec and open streams, through the edge and in the SDK's
//! direct mode; every answer checked against the execution that should have given it.

mod churn;
mod clients;
mod timeline;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hyper::Method;
use space_client::{Client, CreateSandbox, Options};

use super::platform::{Platform, PlatformOptions};
use super::row::{Row, quantile};
use clients::{Ctx, Tally, WHOAMI};

/// `space bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Sandboxes churned.
    #[arg(long, default_value_t = 3)]
    pub sandboxes: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Concurrent clients (half through the edge, half in direct mode).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Seconds to run (at least; see --min-migrations and --ops).
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// Keep going until this many operations were made.
    #[arg(long, default_value_t = 0)]
    pub ops: u64,
    /// Keep going until this many migrations were made.
    #[arg(long, default_value_t = 0)]
    pub min_migrations: u64,
    /// Also kill a worker with SIGKILL now and then (`space up` restarts it).
    #[arg(long)]
    pub kill_workers: bool,
    /// Stop after this many seconds whatever was reached (the run then fails if
    /// --ops or --min-migrations was not).
    #[arg(long, default_value_t = 7200)]
    pub max_duration: u64,
}

impl SoakArgs {
    /// The short form `space bench all` and CI run.
    pub fn short() -> Self {
        Self {
            sandboxes: 3,
            workers: 2,
            clients: 4,
            duration: 10,
            ops: 0,
            min_migrations: 20,
            kill_workers: false,
            max_duration: 600,
        }
    }
}

/// What a soak saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SoakReport {
    /// Whether the operations and migrations asked for were reached.
    pub reached: bool,
    /// Seconds it ran.
    pub seconds: f64,
    /// Operations made.
    pub ops: u64,
    /// Of them through the edge (the rest in direct mode).
    pub via_edge: u64,
    /// Operations that failed (every kind below included).
    pub failures: u64,
    /// Answers from another execution than the route named.
    pub wrong_execution: u64,
    /// Answers from an execution of the sandbox not current during the request.
    pub stale_execution: u64,
    /// Answers from another sandbox.
    pub cross_sandbox: u64,
    /// Answers naming an execution the timeline never held for any sandbox (it lived
    /// between two looks of the watcher): neither right nor cross-sandbox as far as the
    /// soak can tell, and counted as failures.
    pub unverified: u64,
    /// Acknowledged writes not found later.
    pub lost_writes: u64,
    /// Non-stream operations that got no complete answer.
    pub dropped: u64,
    /// Streams opened, and of them ended by "execution replaced".
    pub streams: u64,
    /// Streams ended by "execution replaced" (expected: the execution was replaced).
    pub streams_replaced: u64,
    /// Migrations, pause/resume pairs and worker kills made.
    pub migrations: u64,
    /// Pause + resume pairs.
    pub pauses: u64,
    /// Workers killed.
    pub kills: u64,
    /// Lifecycle calls that failed.
    pub churn_failures: u64,
    /// Rebuilt attempts in direct mode, and their added latency in ms (p50, p99).
    pub rebuilt_direct: u64,
    /// p50 of the latency a rebuilt attempt added in direct mode, ms.
    pub rebuilt_direct_p50_ms: f64,
    /// p99 of it, ms.
    pub rebuilt_direct_p99_ms: f64,
    /// Rebuilt attempts at the edge.
    pub rebuilt_edge: u64,
    /// Upper bound of the p50 of the edge's added latency (its histogram bucket), ms.
    pub rebuilt_edge_p50_ms: f64,
    /// Upper bound of the p99 of it, ms.
    pub rebuilt_edge_p99_ms: f64,
    /// Failures by message (the first kinds seen), lifecycle ones prefixed `churn:`.
    pub errors: Vec<(String, u64)>,
}

impl SoakReport {
    /// Failed operations per million.
    pub fn failures_per_million(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        self.failures as f64 * 1e6 / self.ops as f64
    }

    /// Wrong deliveries of every kind.
    pub fn wrong_deliveries(&self) -> u64 {
        self.wrong_execution + self.stale_execution + self.cross_sandbox
    }

    /// Whether every target was met: some operations, no wrong delivery, no lost
    /// write, no dropped connection, at most 2 failures per million (in a short run
    /// that means none).
    pub fn passed(&self) -> bool {
        self.ops > 0
            && self.reached
            && self.wrong_deliveries() == 0
            && self.unverified == 0
            && self.lost_writes == 0
            && self.dropped == 0
            && self.failures_per_million() <= 2.0
    }

    /// The report as table rows.
    pub fn rows(&self) -> Vec<Row> {
        let zero =
            |id: &str, what: &str, n: u64| Row::new(id, what, n.to_string(), "0").pass(n == 0);
        vec![
            Row::new(
                "P9",
                "operations (through the edge / direct)",
                format!(
                    "{} ({} / {}) in {:.0} s",
                    self.ops,
                    self.via_edge,
                    self.ops - self.via_edge,
                    self.seconds
                ),
                ">= 1,000,000 for the record",
            ),
            Row::new(
                "P9",
                "failed operations per million",
                format!(
                    "{:.2} ({} failed)",
                    self.failures_per_million(),
                    self.failures
                ),
                "<= 2",
            )
            .ratio(self.failures_per_million() / 2.0)
            .pass(self.failures_per_million() <= 2.0),
            zero(
                "P9",
                "wrong-execution deliveries",
                self.wrong_execution + self.stale_execution,
            ),
            zero("P9", "cross-sandbox deliveries", self.cross_sandbox),
            zero(
                "P9",
                "answers of an execution never seen (unverified)",
                self.unverified,
            ),
            zero("P9", "acknowledged writes lost", self.lost_writes),
            zero("P9", "dropped non-stream connections", self.dropped),
            Row::new(
                "P9",
                "lifecycle churn (migrations / pause+resume / worker kills / failed)",
                format!(
                    "{} / {} / {} / {}",
                    self.migrations, self.pauses, self.kills, self.churn_failures
                ),
                "-",
            ),
            Row::new(
                "P9",
                "rebuilt attempts, direct: count, added p50 / p99",
                format!(
                    "{}, {:.2} / {:.2} ms",
                    self.rebuilt_direct, self.rebuilt_direct_p50_ms, self.rebuilt_direct_p99_ms
                ),
                "-",
            ),
            Row::new(
                "P9",
                "rebuilt attempts, edge: count, added p50 / p99 (bucket bounds)",
                format!(
                    "{}, <= {:.2} / <= {:.2} ms",
                    self.rebuilt_edge, self.rebuilt_edge_p50_ms, self.rebuilt_edge_p99_ms
                ),
                "-",
            ),
            Row::new(
                "P9",
                "streams opened / ended by execution replaced",
                format!("{} / {}", self.streams, self.streams_replaced),
                "-",
            ),
        ]
    }
}

/// Runs a soak against a `space up` it starts.
pub async fn run(args: &SoakArgs) -> Result<SoakReport, String> {
    if args.sandboxes == 0 || args.clients == 0 || args.workers < 2 {
        return Err("a soak needs at least 1 sandbox, 1 client and 2 workers".into());
    }
    eprintln!(
        "soak: starting space up with {} workers; {} sandboxes, {} clients",
        args.workers, args.sandboxes, args.clients
    );
    let platform = Arc::new(
        Platform::start(PlatformOptions {
            workers: args.workers,
            warm_pool: 2,
            standby: 0,
            env: Vec::new(),
        })
        .await?,
    );
    let result = soak(args, &platform).await;
    if let Ok(p) = Arc::try_unwrap(platform) {
        p.stop().await;
    }
    result
}

async fn soak(args: &SoakArgs, platform: &Arc<Platform>) -> Result<SoakReport, String> {
    let timeout = Duration::from_secs(60);
    let admin = Client::with_options(
        &platform.url,
        &platform.admin_key,
        Options {
            direct: false,
            timeout,
        },
    );
    let timeline = Arc::new(timeline::Timeline::default());
    let mut sandboxes = Vec::new();
    for _ in 0..args.sandboxes {
        let s = admin
            .create_sandbox(&CreateSandbox::default())
            .await
            .map_err(|e| format!("create: {e}"))?;
        admin
            .write_file(&s.id, WHOAMI, s.id.to_string())
            .await
            .map_err(|e| format!("setup write: {e}"))?;
        admin
            .exec(&s.id, &space_client::exec(["mkdir", "-p", "/root/soak"]))
            .await
            .map_err(|e| format!("setup exec: {e}"))?;
        let (exe, _) = churn::execution_of(&admin, &s.id)
            .await
            .ok_or("a new sandbox has no execution")?;
        timeline.start(&s.id.to_string(), &exe, Instant::now());
        sandboxes.push(s.id);
    }
    let sandboxes = Arc::new(sandboxes);
    let workers = platform
        .workers
        .iter()
        .map(|w| w.parse().map_err(|_| format!("worker id {w}")))
        .collect::<Result<Vec<_>, String>>()?;
    let tally = Arc::new(Tally::default());
    let churned = Arc::new(churn::Churned::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut direct_clients = Vec::new();
    let mut tasks = Vec::new();
    for n in 0..args.clients {
        let via_edge = n % 2 == 1;
        let client = Client::with_options(
            &platform.url,
            &platform.admin_key,
            Options {
                direct: !via_edge,
                timeout,
            },
        );
        if !via_edge {
            direct_clients.push(client.clone());
        }
        tasks.push(tokio::spawn(clients::run(Ctx {
            n,
            client,
            via_edge,
            sandboxes: Arc::clone(&sandboxes),
            timeline: Arc::clone(&timeline),
            tally: Arc::clone(&tally),
            stop: Arc::clone(&stop),
        })));
    }
    let churner = tokio::spawn(churn::run(
        admin.clone(),
        Arc::clone(&sandboxes),
        workers,
        Arc::clone(&timeline),
        Arc::clone(&churned),
        Arc::clone(&stop),
    ));
    // Every execution a sandbox runs enters the timeline, also those the churner does
    // not start itself (a restart after a worker died, the reconciler's).
    let watcher = tokio::spawn(churn::watch(
        admin.clone(),
        Arc::clone(&sandboxes),
        Arc::clone(&timeline),
        Arc::clone(&stop),
    ));
    let killer = args.kill_workers.then(|| {
        tokio::spawn(churn::kill_workers(
            Arc::clone(platform),
            admin.clone(),
            Arc::clone(&sandboxes),
            Arc::clone(&timeline),
            Arc::clone(&churned),
            Arc::clone(&stop),
            Duration::from_secs(8),
        ))
    });
    let started = Instant::now();
    let give_up = Duration::from_secs(args.max_duration.max(args.duration));
    let mut last_line = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let ops = tally.ops.load(Ordering::Relaxed);
        let migrations = churned.migrations.load(Ordering::Relaxed);
        let elapsed = started.elapsed();
        if last_line.elapsed() >= Duration::from_secs(1) {
            last_line = Instant::now();
            eprintln!(
                "soak: {:>5.0} s  ops {ops}  failed {}  wrong {}  dropped {}  migrations {migrations}  pauses {}  kills {}  churn failures {}",
                elapsed.as_secs_f64(),
                tally.failures.load(Ordering::Relaxed),
                tally.wrong_execution.load(Ordering::Relaxed)
                    + tally.stale.load(Ordering::Relaxed)
                    + tally.cross_sandbox.load(Ordering::Relaxed),
                tally.dropped.load(Ordering::Relaxed),
                churned.pauses.load(Ordering::Relaxed),
                churned.kills.load(Ordering::Relaxed),
                churned.failed(),
            );
        }
        let done = elapsed >= Duration::from_secs(args.duration)
            && ops >= args.ops
            && migrations >= args.min_migrations;
        if done || elapsed >= give_up {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    let _ = churner.await;
    if let Some(k) = killer {
        k.abort();
    }
    let _ = watcher.await;
    tally.judge_deferred(&timeline);
    let mut added: Vec<f64> = Vec::new();
    let mut rebuilt_direct = 0;
    for c in &direct_clients {
        let r = c.recoveries();
        rebuilt_direct += r.rebuilt;
        added.extend(r.added.iter().map(|d| d.as_secs_f64() * 1e3));
    }
    added.sort_by(f64::total_cmp);
    let edge = EdgeFigures::scrape(platform).await;
    let errors = tally
        .errors
        .lock()
        .map(|e| e.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut errors = errors;
    if let Ok(e) = churned.errors.lock() {
        errors.extend(e.iter().map(|(k, v)| (format!("churn: {k}"), *v)));
    }
    for (what, n) in &errors {
        eprintln!("soak: {n} × {what}");
    }
    let migrations = churned.migrations.load(Ordering::Relaxed);
    let ops = tally.ops.load(Ordering::Relaxed);
    let reached = ops >= args.ops && migrations >= args.min_migrations;
    if ops < args.ops {
        eprintln!("soak: only {ops} operations of the {} asked for", args.ops);
    }
    if migrations < args.min_migrations {
        eprintln!(
            "soak: only {migrations} migrations of the {} asked for",
            args.min_migrations
        );
    }
    let report = SoakReport {
        reached,
        seconds,
        ops: tally.ops.load(Ordering::Relaxed),
        via_edge: tally.via_edge.load(Ordering::Relaxed),
        failures: tally.failures.load(Ordering::Relaxed),
        wrong_execution: tally.wrong_execution.load(Ordering::Relaxed) + edge.wrong_execution,
        stale_execution: tally.stale.load(Ordering::Relaxed),
        cross_sandbox: tally.cross_sandbox.load(Ordering::Relaxed),
        unverified: tally.unverified.load(Ordering::Relaxed),
        lost_writes: tally.lost_writes.load(Ordering::Relaxed),
        dropped: tally.dropped.load(Ordering::Relaxed),
        streams: tally.streams.load(Ordering::Relaxed),
        streams_replaced: tally.streams_replaced.load(Ordering::Relaxed),
        migrations,
        pauses: churned.pauses.load(Ordering::Relaxed),
        kills: churned.kills.load(Ordering::Relaxed),
        churn_failures: churned.failed(),
        rebuilt_direct,
        rebuilt_direct_p50_ms: quantile(&added, 0.5),
        rebuilt_direct_p99_ms: quantile(&added, 0.99),
        rebuilt_edge: edge.rebuilt,
        rebuilt_edge_p50_ms: edge.p50_ms,
        rebuilt_edge_p99_ms: edge.p99_ms,
        errors,
    };
    Ok(report)
}

/// What the edge's metrics say about route recovery.
#[derive(Debug, Default)]
struct EdgeFigures {
    rebuilt: u64,
    p50_ms: f64,
    p99_ms: f64,
    wrong_execution: u64,
}

impl EdgeFigures {
    async fn scrape(platform: &Platform) -> Self {
        let http = space_http::HttpClient::new(Duration::from_secs(10));
        let auth = format!("Bearer {}", platform.admin_key);
        let Ok(a) = http
            .call(
                Method::GET,
                &format!("{}/metrics", platform.url),
                &[("authorization", &auth)],
                Bytes::new(),
            )
            .await
        else {
            return Self::default();
        };
        Self::parse(&String::from_utf8_lossy(&a.body))
    }

    fn parse(text: &str) -> Self {
        let mut f = Self::default();
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if name.starts_with("space_edge_route_recoveries_total")
                && name.contains("outcome=\"rebuilt\"")
            {
                f.rebuilt += value as u64;
            } else if name.starts_with("space_edge_wrong_execution_answers_total") {
                f.wrong_execution += value as u64;
            } else if let Some(rest) =
                name.strip_prefix("space_edge_rebuilt_added_seconds_bucket{le=\"")
            {
                let le = rest.trim_end_matches("\"}");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                buckets.push((le, value));
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map_or(0.0, |b| b.1);
        let at = |q: f64| {
            buckets
                .iter()
                .find(|b| total > 0.0 && b.1 >= q * total)
                .map_or(0.0, |b| b.0 * 1e3)
        };
        f.p50_ms = at(0.5);
        f.p99_ms = at(0.99);
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_figures_come_from_the_prometheus_text() {
        let text = "# HELP x\n\
space_edge_route_recoveries_total{reason=\"retired\",outcome=\"rebuilt\"} 7\n\
space_edge_route_recoveries_total{reason=\"not_running\",outcome=\"rebuilt\"} 3\n\
space_edge_route_recoveries_total{reason=\"retired\",outcome=\"failed\"} 1\n\
space_edge_wrong_execution_answers_total 0\n\
space_edge_rebuilt_added_seconds_bucket{le=\"0.001\"} 4\n\
space_edge_rebuilt_added_seconds_bucket{le=\"0.002\"} 9\n\
space_edge_rebuilt_added_seconds_bucket{le=\"+Inf\"} 10\n";
        let f = EdgeFigures::parse(text);
        assert_eq!(f.rebuilt, 10);
        assert_eq!(f.wrong_execution, 0);
        assert_eq!(f.p50_ms, 2.0);
        assert!(f.p99_ms.is_infinite());
    }

    #[test]
    fn a_run_with_a_wrong_delivery_or_a_dropped_connection_fails() {
        let ok = SoakReport {
            reached: true,
            ops: 1_000_000,
            failures: 2,
            ..SoakReport::default()
        };
        assert!(ok.passed());
        for bad in [
            SoakReport {
                cross_sandbox: 1,
                ..ok.clone()
            },
            SoakReport {
                unverified: 1,
                ..ok.clone()
            },
            SoakReport {
                dropped: 1,
                ..ok.clone()
            },
            SoakReport {
                lost_writes: 1,
                ..ok.clone()
            },
            SoakReport {
                failures: 3,
                ..ok.clone()
            },
            SoakReport {
                ops: 0,
                failures: 0,
                ..ok.clone()
            },
        ] {
            assert!(!bad.passed(), "{bad:?}");
        }
    }
}
