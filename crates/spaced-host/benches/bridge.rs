//! A small operation (stat, 4 KiB read) directly to the agent vs through the bridge,
//! both on one pooled, handshaken connection, in one run (issue #3; QUALITY.md P3's
//! inner hops).
//!
//! `cargo bench -p spaced-host --bench bridge`

use std::hint::black_box;
use std::os::unix::net::UnixStream;

use criterion::{Criterion, criterion_group, criterion_main};
use space_proto::client::AgentConnection;
use space_testkit::bridge as common;

fn benches(c: &mut Criterion) {
    let sbx = common::Sandbox::start();
    let file = sbx.dir.path().join("home").join("4k.bin");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let path = file.to_str().unwrap().to_owned();

    let stream = UnixStream::connect(&sbx.spec.agent_socket).unwrap();
    let mut direct =
        AgentConnection::handshake_verified(stream, [1; 32], &sbx.target.secret).unwrap();
    let mut bridged = spaced_host::connect(&sbx.target).unwrap();

    let mut g = c.benchmark_group("stat");
    g.bench_function("direct", |b| {
        b.iter(|| direct.stat(black_box(&path)).unwrap())
    });
    g.bench_function("through_bridge", |b| {
        b.iter(|| bridged.stat(black_box(&path)).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("read_4k");
    g.bench_function("direct", |b| {
        b.iter(|| direct.read_file(black_box(&path), 1 << 20).unwrap())
    });
    g.bench_function("through_bridge", |b| {
        b.iter(|| bridged.read_file(black_box(&path), 1 << 20).unwrap())
    });
    g.finish();

    // A new verified connection per operation (no pool): peer checks, socket table,
    // handshake on both hops.
    c.bench_function("connect_verified", |b| {
        b.iter(|| spaced_host::connect(&sbx.target).unwrap())
    });
}

criterion_group!(bridge, benches);
criterion_main!(bridge);
