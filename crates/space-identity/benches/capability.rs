//! P1 and P2 of QUALITY.md, plus sign cost and token size, with criterion's
//! statistics. The fixture is [`space_identity::bench::CapabilityBench`], which
//! `space bench p1` / `space bench p2` time too (from an installed `space`).
//!
//! Run: `cargo bench -p space-identity --bench capability`
//!
//! - `p1/raw_verify_strict` — ed25519 `verify_strict` over exactly the bytes a token
//!   signs (domain prefix + claims), with an already-decompressed key: the floor.
//! - `p1/verify_capability_first_sight` — the full first-sight path: size, decode, key
//!   lookup, strict signature check, time rules.
//! - `p2/admit_cached` — a token this receiver verified before: hash, cache lookup,
//!   time re-check, purpose, access and identity comparison.
//! - `sign` — the control plane's cost to issue one capability.

use criterion::{Criterion, criterion_group, criterion_main};
use space_identity::bench::CapabilityBench;
use space_testkit::T0;

fn benches(c: &mut Criterion) {
    let mut fixture = CapabilityBench::new([1; 32], [2; 32], T0);
    let (binary, text) = fixture.token_sizes();
    eprintln!("token: {binary} bytes binary, {text} bytes base64url");

    let mut g = c.benchmark_group("p1");
    g.bench_function("raw_verify_strict", |b| b.iter(|| fixture.raw_verify()));
    g.bench_function("verify_capability_first_sight", |b| {
        b.iter(|| fixture.verify_first_sight())
    });
    g.finish();

    let mut g = c.benchmark_group("p2");
    g.bench_function("admit_cached", |b| b.iter(|| fixture.admit_cached()));
    g.finish();

    c.bench_function("sign", |b| b.iter(|| fixture.sign()));
}

criterion_group!(capability, benches);
criterion_main!(capability);
