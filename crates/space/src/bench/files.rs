//! `space bench files`: a 50 MiB put and get through the edge (the SDK with
//! `direct: false`, streamed both ways) against a host `cp` of the same file into and
//! out of the same filesystem — the worker's sandbox volume, where the sandbox's files
//! live — in the same run. Target: each ≤ 3 × the `cp`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use space_proto::api::{CreateSandbox, LimitsRequest};

use super::platform::Platform;
use super::row::{Row, quantile};

/// The file's size.
const SIZE: u64 = 50 << 20;

/// Timed runs of each.
const RUNS: usize = 7;

/// The target ratio to `cp`.
const TARGET: f64 = 3.0;

/// The figure on `p`.
pub async fn run(p: &Platform) -> Result<Vec<Row>, String> {
    let edge = p.client(false);
    let create = CreateSandbox {
        limits: Some(LimitsRequest {
            disk_mib: Some(512),
            ..LimitsRequest::default()
        }),
        ..CreateSandbox::default()
    };
    let sandbox = edge
        .create_sandbox(&create)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let worker = sandbox
        .execution
        .as_ref()
        .map(|x| x.worker.to_string())
        .ok_or("the sandbox has no execution")?;
    let id = sandbox.id;
    let scratch = tempfile::Builder::new()
        .prefix("space-bench-files-")
        .tempdir()
        .map_err(|e| format!("scratch directory: {e}"))?;
    let src = scratch.path().join("src");
    write_source(&src)?;
    // The sandbox volume when the worker has one (its files are there), else the
    // worker's data directory.
    let worker_dir = p.data_dir.join("workers").join(&worker);
    let volume = worker_dir.join("sandboxes");
    let host_dir = if volume.is_dir() { volume } else { worker_dir };
    let host_copy = host_dir.join(".space-bench-cp");
    let back = scratch.path().join("back");

    // Interleaved, so that the two see the same load of the machine.
    eprintln!(
        "files: {RUNS} × (host cp in, put through the edge, host cp out, get through the \
         edge) of 50 MiB, cp in {}",
        host_dir.display()
    );
    let (mut cp_in, mut cp_out, mut puts, mut gets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        cp_in.push(cp(&src, &host_copy).await?);
        let t = Instant::now();
        edge.write_file_from_path(&id, "/root/bench-50m", &src)
            .await
            .map_err(|e| format!("put: {e}"))?;
        puts.push(ms(t));
        cp_out.push(cp(&host_copy, &back).await?);
        let t = Instant::now();
        let mut f = tokio::fs::File::create(&back)
            .await
            .map_err(|e| format!("{}: {e}", back.display()))?;
        let n = edge
            .read_file_to(&id, "/root/bench-50m", &mut f)
            .await
            .map_err(|e| format!("get: {e}"))?;
        gets.push(ms(t));
        if n != SIZE {
            return Err(format!("get returned {n} bytes of {SIZE}"));
        }
    }
    let _ = std::fs::remove_file(&host_copy);
    let _ = edge.delete_sandbox(&id).await;

    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        quantile(v, 0.5)
    };
    let (cp_in, cp_out) = (p50(&mut cp_in), p50(&mut cp_out));
    let (put, get) = (p50(&mut puts), p50(&mut gets));
    let row = |what: &str, measured: f64, base: f64| {
        let ratio = measured / base.max(1e-3);
        Row::new(
            "files",
            what,
            format!(
                "p50 {measured:.1} ms ({:.0} MiB/s), cp {base:.1} ms",
                50.0 / (measured / 1000.0)
            ),
            "≤ 3 × cp",
        )
        .ratio(ratio)
        .pass(ratio <= TARGET)
    };
    Ok(vec![
        row("50 MiB put through the edge vs host cp in", put, cp_in),
        row("50 MiB get through the edge vs host cp out", get, cp_out),
    ])
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// 50 MiB of non-repeating bytes (so no layer can compress or deduplicate them).
fn write_source(path: &Path) -> Result<(), String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut data = Vec::with_capacity(SIZE as usize);
    while (data.len() as u64) < SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(SIZE as usize);
    std::fs::write(path, &data).map_err(|e| format!("{}: {e}", path.display()))
}

/// One host `cp` (the command), timed in ms.
async fn cp(from: &Path, to: &PathBuf) -> Result<f64, String> {
    let t = Instant::now();
    let status = tokio::process::Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .await
        .map_err(|e| format!("cp: {e}"))?;
    if !status.success() {
        return Err(format!("cp {} {} failed", from.display(), to.display()));
    }
    Ok(ms(t))
}
