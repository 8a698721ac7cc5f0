//! P1 and P2 of QUALITY.md, plus sign cost and token size.
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

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::{Signature, VerifyingKey};
use space_identity::{Access, Endpoint, Operation, VerifiedTokenCache, verify_capability};
use space_testkit::{CapabilityBuilder, T0, TestKeys, route, running, worker};

fn benches(c: &mut Criterion) {
    let keys = TestKeys::new();
    let r = route(1, 7, "worker-a");
    let builder = CapabilityBuilder::control(&keys, &r);
    let token = builder.sign(&keys);
    let bytes = token.as_bytes().to_vec();
    eprintln!(
        "token: {} bytes binary, {} bytes base64url",
        bytes.len(),
        token.to_text().len()
    );

    // The exact message the capability signature covers.
    let (region, sig) = bytes.split_at(bytes.len() - 64);
    let msg = [b"space/capability/v1\0".as_slice(), region].concat();
    let sig = Signature::from_slice(sig).unwrap();
    let vk: VerifyingKey = keys.control.verifying_key();
    assert!(vk.verify_strict(&msg, &sig).is_ok());

    let mut g = c.benchmark_group("p1");
    g.bench_function("raw_verify_strict", |b| {
        b.iter(|| black_box(&vk).verify_strict(black_box(&msg), black_box(&sig)))
    });
    g.bench_function("verify_capability_first_sight", |b| {
        b.iter(|| verify_capability(black_box(&bytes), black_box(&keys.installed), T0))
    });
    g.finish();

    let record = running(&r);
    let me = worker("worker-a");
    let op = Operation {
        path_sandbox: &r.sandbox,
        bound_sandbox: None,
        endpoint: Endpoint::Control {
            access: Access::FsRead,
        },
    };
    let mut cache = VerifiedTokenCache::new(10_000);
    // Fill the cache with other tokens so the hit is a realistic lookup.
    for n in 0..5_000 {
        let t = CapabilityBuilder::control(&keys, &r)
            .token_id(n + 10)
            .sign(&keys);
        cache
            .verify_capability(t.as_bytes(), &keys.installed, T0)
            .unwrap();
    }
    assert_eq!(
        cache.admit(&bytes, &keys.installed, T0, &op, &me, Some(&record)),
        space_identity::Verdict::Allow
    );
    let mut g = c.benchmark_group("p2");
    g.bench_function("admit_cached", |b| {
        b.iter(|| {
            cache.admit(
                black_box(&bytes),
                &keys.installed,
                T0,
                black_box(&op),
                &me,
                Some(&record),
            )
        })
    });
    g.finish();

    c.bench_function("sign", |b| {
        b.iter(|| keys.control.sign(black_box(builder.claims())))
    });
}

criterion_group!(capability, benches);
criterion_main!(capability);
