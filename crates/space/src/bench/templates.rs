//! Issue 16's figures on a real `space up`: creates from an image template (the
//! sample image of `space_image::sample`) with its standby pool, 50 at once (P4);
//! cold creates of the template against cold creates of the default template (no
//! pool: an environment of their own; no warm jails, so both are launches); and 20
//! creates a second for 60 s claiming the default pool while the keeper refills it
//! (by launches), with how evenly the pool stays spread over the two workers.

use std::path::Path;
use std::time::{Duration, Instant};

use space_client::Client;
use space_identity::SandboxId;
use space_proto::api::CreateSandbox;

use super::platform::{Platform, PlatformOptions, metric};
use super::row::{Row, quantile};

/// The template's name on the bench's platform.
const TEMPLATE: &str = "bench:1";
/// Standby sandboxes of the default template's pool (16 per worker).
const POOL: usize = 32;
/// Standby sandboxes of the image template's pool: a burst of 50 claims them all
/// (image templates have no warm jails to fall back on).
const TEMPLATE_POOL: usize = 64;
/// Warm jails per worker: none, so that cold creates of both templates are launches
/// (a warm jail is of the default template only) and the pools refill by launches.
const WARM: usize = 0;
/// Creates one after the other, per template, without a pool.
const COLD: usize = 10;
/// The sustained run: creates a second, for so long.
const RATE: u64 = 20;
const SUSTAIN: Duration = Duration::from_secs(60);

/// What this host lacks for the figures, if anything.
fn missing_requirement() -> Option<String> {
    let busybox = Path::new("/bin/busybox");
    if !space_worker::substrate::jail::template::is_static(busybox) {
        return Some(
            "needs a statically linked /bin/busybox (Debian: busybox-static) for the sample image"
                .into(),
        );
    }
    None
}

/// Runs the figures.
pub async fn run() -> Result<Vec<Row>, String> {
    if let Some(why) = missing_requirement() {
        return Ok(vec![Row::new(
            "templates",
            &format!("skipped: {why}"),
            "-".into(),
            "-",
        )]);
    }
    let p = Platform::start(PlatformOptions {
        workers: 2,
        warm_pool: WARM,
        standby: POOL,
        env: vec![(
            "SPACE_STANDBY_TEMPLATES".into(),
            format!("{TEMPLATE}={TEMPLATE_POOL}"),
        )],
    })
    .await?;
    let rows = measure(&p).await;
    p.stop().await;
    rows
}

async fn one(client: &Client, body: &CreateSandbox) -> Result<(f64, SandboxId), String> {
    super::p4::create_body(client.clone(), body.clone()).await
}

async fn delete_all(client: &Client, ids: &[SandboxId]) -> Result<(), String> {
    for id in ids {
        client
            .delete_sandbox(id)
            .await
            .map_err(|e| format!("delete: {e}"))?;
    }
    Ok(())
}

/// `n` creates of `body` one after the other (each deleted at the end): ms, sorted.
async fn sequential(client: &Client, body: &CreateSandbox, n: usize) -> Result<Vec<f64>, String> {
    let (mut times, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (took, id) = one(client, body).await?;
        times.push(took);
        ids.push(id);
    }
    delete_all(client, &ids).await?;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// The standby pool's share on each worker, from the control plane's gauge.
async fn shares(p: &Platform, template: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for w in &p.workers {
        let name =
            format!("space_control_standby_by_worker{{worker=\"{w}\",template=\"{template}\"}}");
        out.push(metric(&p.url, &name).await);
    }
    out
}

async fn measure(p: &Platform) -> Result<Vec<Row>, String> {
    let client = p.client(false);
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let archive = dir.path().join("image.tar");
    space_image::sample::write_docker_save(&archive, Path::new("/bin/busybox"))
        .map_err(|e| format!("sample image: {e}"))?;
    eprintln!("templates: importing the sample image as {TEMPLATE}");
    let view = client
        .import_template(TEMPLATE, &archive)
        .await
        .map_err(|e| format!("import: {e}"))?;
    eprintln!("templates: {TEMPLATE} is {}", view.digest);
    let settle = Duration::from_secs(240);
    p.wait_for_pools(WARM, POOL + TEMPLATE_POOL, settle).await?;

    // P4 from the template, claiming its pool.
    eprintln!("templates: 50 creates of {TEMPLATE} at once (its standby pool)");
    let templated = CreateSandbox {
        template: Some(TEMPLATE.into()),
        ..CreateSandbox::default()
    };
    let burst = super::p4::burst_of(&client, &templated).await?;
    p.wait_for_pools(WARM, POOL + TEMPLATE_POOL, settle).await?;

    // Cold creates (an environment of their own claims no standby sandbox).
    eprintln!("templates: {COLD} cold creates of each, one at a time");
    let env = Some([("SPACE_BENCH".to_owned(), "1".to_owned())].into());
    let cold_default = sequential(
        &client,
        &CreateSandbox {
            env: env.clone(),
            ..CreateSandbox::default()
        },
        COLD,
    )
    .await?;
    let cold_template = sequential(
        &client,
        &CreateSandbox {
            env,
            template: Some(TEMPLATE.into()),
            ..CreateSandbox::default()
        },
        COLD,
    )
    .await?;
    p.wait_for_pools(WARM, POOL + TEMPLATE_POOL, settle).await?;

    // Sustained claims of the default pool while it refills.
    eprintln!(
        "templates: {RATE} creates a second for {} s, claiming the default pool",
        SUSTAIN.as_secs()
    );
    let (sustained, spread) = sustain(p, &client).await?;
    let (p50, p99) = (quantile(&burst, 0.5), quantile(&burst, 0.99));
    let (cd, ct) = (quantile(&cold_default, 0.5), quantile(&cold_template, 0.5));
    let (s50, s99) = (quantile(&sustained, 0.5), quantile(&sustained, 0.99));
    let worst = spread.iter().copied().fold(0.0_f64, f64::max);
    let final_shares = shares(p, "default").await;
    Ok(vec![
        Row::new(
            "templates",
            &format!("create from a template, 50 concurrent, with its standby pool ({TEMPLATE_POOL}), p50"),
            format!("{p50:.1} ms"),
            "≤ 25 ms",
        )
        .ratio(p50 / 25.0)
        .pass(p50 <= 25.0),
        Row::new(
            "templates",
            "the same, p99",
            format!("{p99:.1} ms"),
            "≤ 100 ms",
        )
        .ratio(p99 / 100.0)
        .pass(p99 <= 100.0),
        Row::new(
            "templates",
            &format!("create from a template without a pool, p50 of {COLD} one at a time, against the default template's (both launched: no warm jails)"),
            format!("{ct:.1} ms vs {cd:.1} ms"),
            "≤ 2 ×",
        )
        .ratio(ct / cd)
        .pass(ct <= 2.0 * cd),
        Row::new(
            "templates",
            &format!("{RATE} creates/s for {} s claiming the default pool while it refills, p99", SUSTAIN.as_secs()),
            format!("p50 {s50:.1} ms, p99 {s99:.1} ms ({} creates)", sustained.len()),
            "≤ 25 ms",
        )
        .ratio(s99 / 25.0)
        .pass(s99 <= 25.0),
        Row::new(
            "templates",
            "the default pool's spread over the two workers during that run (largest difference between workers' shares, sampled each second; then the shares after it)",
            format!("{worst:.0} sandboxes; then {:?}", final_shares),
            "even",
        ),
    ])
}

/// `RATE` creates a second for `SUSTAIN` (each deleted in the background once it
/// answered): the creates' times (ms, sorted) and, sampled each second, how far
/// apart the two workers' shares of the default pool were.
async fn sustain(p: &Platform, client: &Client) -> Result<(Vec<f64>, Vec<f64>), String> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
    let mut tasks = Vec::new();
    let mut spread = Vec::new();
    let mut next_sample = Instant::now();
    while started.elapsed() < SUSTAIN {
        tick.tick().await;
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let (took, id) = one(&c, &CreateSandbox::default()).await?;
            let _ = c.delete_sandbox(&id).await;
            Ok::<f64, String>(took)
        }));
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let s = shares(p, "default").await;
            if let (Some(max), Some(min)) = (
                s.iter().copied().reduce(f64::max),
                s.iter().copied().reduce(f64::min),
            ) {
                spread.push(max - min);
            }
        }
    }
    let mut times = Vec::new();
    for t in tasks {
        times.push(t.await.map_err(|e| format!("create task: {e}"))??);
    }
    times.sort_by(f64::total_cmp);
    Ok((times, spread))
}
