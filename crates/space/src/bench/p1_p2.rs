//! P1 and P2: a capability's first-sight verification against a raw `verify_strict`
//! of the same bytes, and admission of an already verified token from the
//! verified-token cache. The fixture is `space_identity::bench::CapabilityBench`, the
//! one the criterion bench (`cargo bench -p space-identity --bench capability`) times.
//!
//! Each figure is the median over batches, the batches of the compared calls
//! interleaved so that a slow stretch of this machine hits both alike.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use space_identity::Timestamp;
use space_identity::bench::CapabilityBench;

use super::row::{Row, quantile};

/// Batches per figure.
const BATCHES: usize = 41;

/// The median time of one call, in microseconds, for each of `calls`: `BATCHES`
/// batches of `per_batch` calls each, the calls' batches taken in turn.
fn interleaved(per_batch: usize, calls: &mut [&mut dyn FnMut() -> bool]) -> Vec<f64> {
    let mut times = vec![Vec::with_capacity(BATCHES); calls.len()];
    for _ in 0..BATCHES {
        for (call, out) in calls.iter_mut().zip(times.iter_mut()) {
            let t = Instant::now();
            let mut ok = true;
            for _ in 0..per_batch {
                ok &= call();
            }
            let took = t.elapsed();
            assert!(ok, "a fixture call failed");
            out.push(took.as_secs_f64() * 1e6 / per_batch as f64);
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            quantile(&t, 0.5)
        })
        .collect()
}

fn fixture() -> CapabilityBench {
    let mut seeds = [[0u8; 32]; 2];
    for s in &mut seeds {
        // Keys of this run only; nothing else trusts them.
        if rustix::rand::getrandom(&mut *s, rustix::rand::GetRandomFlags::empty()).is_err() {
            *s = [0x42; 32];
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    CapabilityBench::new(seeds[0], seeds[1], Timestamp::from_unix_secs(now))
}

/// P1: first-sight verification over raw `verify_strict`; the sign cost and token
/// size as information. Also returns the P1 median (µs) for P2's speed-up.
pub fn p1() -> (Vec<Row>, f64) {
    eprintln!("P1: capability verify, first sight, against raw verify_strict");
    let fixture = fixture();
    let mut raw = || fixture.raw_verify();
    let mut first = || fixture.verify_first_sight();
    let mut sign = || fixture.sign();
    let m = interleaved(50, &mut [&mut raw, &mut first, &mut sign]);
    let (raw, first, sign) = (m[0], m[1], m[2]);
    let (binary, text) = fixture.token_sizes();
    let rows = vec![
        Row::new(
            "P1",
            "raw Ed25519 verify_strict of the signed bytes (baseline)",
            format!("{raw:.1} µs"),
            "-",
        ),
        Row::new(
            "P1",
            "capability verify, first sight (size, decode, key, strict signature, time)",
            format!("{first:.1} µs"),
            "≤ 1.15 × raw",
        )
        .ratio(first / raw)
        .pass(first / raw <= 1.15),
        Row::new(
            "P1",
            "sign one capability (control plane)",
            format!("{sign:.1} µs; token {binary} B, {text} B base64url"),
            "-",
        ),
    ];
    (rows, first)
}

/// P2: admission from the verified-token cache (among 5,000 other tokens), against
/// `first_sight` (P1's median, µs).
pub fn p2(first_sight: f64) -> Vec<Row> {
    eprintln!("P2: admission of an already verified token (verified-token cache)");
    let mut fixture = fixture();
    let mut admit = || fixture.admit_cached();
    let admit = interleaved(20_000, &mut [&mut admit])[0];
    let speedup = first_sight / admit;
    vec![
        Row::new(
            "P2",
            "admission of a token already verified (cache hit among 5,000)",
            format!("{admit:.2} µs"),
            "≤ 2 µs",
        )
        .ratio(admit / 2.0)
        .pass(admit <= 2.0),
        Row::new(
            "P2",
            "speed-up of that admission over P1's first sight",
            format!("{speedup:.0} ×"),
            "≥ 20 ×",
        )
        .ratio(speedup / 20.0)
        .pass(speedup >= 20.0),
    ]
}
