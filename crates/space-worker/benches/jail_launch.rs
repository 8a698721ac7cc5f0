//! Jail substrate benchmark (QUALITY.md P4, P5):
//! - launch-to-first-command latency of one jail at a time;
//! - the same with 50 jails launched at once (p50/p99);
//! - pause (freeze) and resume (thaw) time;
//! - destroy time.
//!
//! The agent is `space-jail probe-agent`; "first command" is one request through
//! the agent's socket running `/bin/sh -c true` inside. Run as root:
//! `cargo bench -p space-worker --bench jail_launch` (add `-- --quick` for fewer
//! rounds).
#![allow(clippy::print_stdout)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use space_testkit::jail::{self as support, Jail, TestEnv, request};
use space_worker::substrate::{Limits, Substrate};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<44} n={:<4} p50={:>8.2} ms  p99={:>8.2} ms  min={:>7.2} ms  max={:>8.2} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
}

/// Launches one jail and runs its first command; returns the jail and the time
/// until the launch returned and until the command answered.
fn launch_and_first_command(env: &TestEnv) -> (Jail, Duration, Duration) {
    let spec = env.spec(Limits::default());
    let start = Instant::now();
    let jail = env.launch(spec).expect("launch");
    let launched = start.elapsed();
    let reply = request(&jail.handle.socket_path, "true");
    let first_command = start.elapsed();
    assert_eq!(reply.exit_code, 0, "{reply:?}");
    (jail, launched, first_command)
}

fn sequential(env: &TestEnv, rounds: usize) {
    let (mut launched, mut first, mut destroyed) = (Vec::new(), Vec::new(), Vec::new());
    // One warm-up round builds the template and warms the page cache.
    drop(launch_and_first_command(env).0);
    for _ in 0..rounds {
        let (jail, l, f) = launch_and_first_command(env);
        launched.push(l);
        first.push(f);
        let start = Instant::now();
        jail.destroy();
        destroyed.push(start.elapsed());
    }
    report("one at a time: launch until agent runs", launched);
    report("one at a time: launch to first command", first);
    report("one at a time: destroy", destroyed);
}

fn concurrent(env: &TestEnv, count: usize) {
    let barrier = Arc::new(Barrier::new(count));
    let results: Vec<(Jail, Duration, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|_| {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    barrier.wait();
                    launch_and_first_command(env)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("launch thread"))
            .collect()
    });
    let launched = results.iter().map(|r| r.1).collect();
    let first = results.iter().map(|r| r.2).collect();
    report(
        &format!("{count} at once: launch until agent runs"),
        launched,
    );
    report(&format!("{count} at once: launch to first command"), first);
    let start = Instant::now();
    let jails: Vec<Jail> = results.into_iter().map(|r| r.0).collect();
    std::thread::scope(|scope| {
        for jail in jails {
            scope.spawn(move || jail.destroy());
        }
    });
    println!(
        "{count} at once: destroy all                     {:>8.2} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
}

fn freeze_thaw(env: &TestEnv, rounds: usize) {
    let jail = env.jail();
    // A few busy and idle processes, like a sandbox in use.
    jail.ok("for i in 1 2 3; do sleep 1000 >/dev/null 2>&1 & done; (while :; do :; done) >/dev/null 2>&1 &");
    let (mut frozen, mut thawed) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        env.driver.pause(&jail.handle).expect("pause");
        frozen.push(start.elapsed());
        let start = Instant::now();
        env.driver.resume(&jail.handle).expect("resume");
        thawed.push(start.elapsed());
    }
    report("pause (freeze, 6 processes)", frozen);
    report("resume (thaw, 6 processes)", thawed);
}

fn main() {
    if let Some(reason) = support::missing_requirement() {
        println!("jail_launch bench SKIPPED: {reason}");
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    println!(
        "jail substrate, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // Both ways in one run, so the cost of the user namespace (its helper process,
    // the idmapped layers) reads as a ratio on the same machine state.
    for userns in [true, false] {
        let env = if userns {
            TestEnv::new()
        } else {
            TestEnv::without_user_namespaces()
        };
        println!(
            "-- {} --",
            if userns {
                "user namespace per jail (default)"
            } else {
                "--no-userns"
            }
        );
        sequential(&env, if quick { 10 } else { 50 });
        concurrent(&env, 50);
        if userns {
            freeze_thaw(&env, if quick { 20 } else { 100 });
        }
    }
}
