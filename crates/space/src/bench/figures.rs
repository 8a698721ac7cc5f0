//! `space bench p1` … `p8` and `all`: which figures run on which platform, and the
//! exit code.
//!
//! P1 and P2 need no platform. P3–P6, P8 and P10 share one `space up` with the defaults
//! (two workers, 16 warm jails and 16 standby sandboxes per worker), P4 first while
//! the machine is quiet and the pools full. P7 starts its own (one worker, no pools),
//! so that nothing but the idle sandboxes is counted. `all` then runs the soak's short
//! form.

use super::cmd::BenchCmd;
use super::platform::{Platform, PlatformOptions};
use super::row::{Row, print_table};
use super::{p1_p2, p3, p4, p5_p6, p7, p8, p10, soak};

/// The pools of the platform P3–P8 run on: the defaults of `space up`.
fn pools() -> (usize, usize) {
    (
        space_worker::daemon::DEFAULT_WARM_POOL,
        space_control::service::STANDBY_PER_WORKER * 2,
    )
}

async fn figures_platform() -> Result<Platform, String> {
    let (warm_pool, standby) = pools();
    eprintln!(
        "bench: starting space up (2 workers, {warm_pool} warm jails per worker, {standby} standby sandboxes)"
    );
    Platform::start(PlatformOptions {
        workers: 2,
        warm_pool,
        standby,
        // The figures create more sandboxes than one tenant may keep by default.
        env: vec![("SPACE_TENANT_SANDBOXES".into(), "100000".into())],
    })
    .await
}

/// A row saying a figure could not be measured.
fn failed(id: &str, e: &str) -> Row {
    Row::new(id, "could not be measured", format!("error: {e}"), "-").pass(false)
}

/// Rows of a figure, or a failed row.
fn rows_or_failed(id: &str, r: Result<Vec<Row>, String>) -> Vec<Row> {
    r.unwrap_or_else(|e| {
        eprintln!("{id}: {e}");
        vec![failed(id, &e)]
    })
}

async fn cpu_figures(p1: bool, p2: bool) -> Result<Vec<Row>, String> {
    tokio::task::spawn_blocking(move || {
        let (mut rows, first_sight) = p1_p2::p1();
        if !p1 {
            rows.clear();
        }
        if p2 {
            rows.extend(p1_p2::p2(first_sight));
        }
        rows
    })
    .await
    .map_err(|e| format!("P1/P2: {e}"))
}

/// P3–P6 and P8 (those of `which`) on one platform of the defaults.
async fn platform_figures(which: &[&str]) -> Vec<Row> {
    let p = match figures_platform().await {
        Ok(p) => p,
        Err(e) => return which.iter().map(|id| failed(id, &e)).collect(),
    };
    let (warm, standby) = pools();
    // Measure on a quiet machine: the pools fill first.
    if let Err(e) = p
        .wait_for_pools(warm, standby, std::time::Duration::from_secs(180))
        .await
    {
        p.stop().await;
        return which.iter().map(|id| failed(id, &e)).collect();
    }
    let mut rows = Vec::new();
    if which.contains(&"P4") {
        rows.extend(rows_or_failed("P4", p4::run(&p, warm, standby).await));
    }
    if which.contains(&"P3") {
        rows.extend(rows_or_failed("P3", p3::run(&p).await));
    }
    if which.contains(&"P5") || which.contains(&"P6") {
        let r = rows_or_failed("P5", p5_p6::run(&p).await);
        rows.extend(
            r.into_iter()
                .filter(|r| which.contains(&r.id.as_str()) || r.measured.starts_with("error: ")),
        );
    }
    if which.contains(&"files") {
        rows.extend(rows_or_failed("files", super::files::run(&p).await));
    }
    if which.contains(&"P8") {
        rows.extend(rows_or_failed("P8", p8::run(&p, warm, standby).await));
    }
    if which.contains(&"P10") {
        rows.extend(rows_or_failed("P10", p10::run(&p).await));
    }
    p.stop().await;
    rows
}

/// Runs figure `cmd` (anything but the soak) and prints its table.
pub async fn run(cmd: &BenchCmd, json: bool) -> Result<i32, String> {
    let (rows, strict, soak_passed) = match cmd {
        BenchCmd::Soak(_) => return Err("the soak is not a figure".into()),
        BenchCmd::Serve(_) | BenchCmd::Load(_) => return Err("not a figure".into()),
        BenchCmd::P1(s) => (cpu_figures(true, false).await?, s.strict, true),
        BenchCmd::P2(s) => (cpu_figures(false, true).await?, s.strict, true),
        BenchCmd::P3(s) => (platform_figures(&["P3"]).await, s.strict, true),
        BenchCmd::P4(s) => (platform_figures(&["P4"]).await, s.strict, true),
        BenchCmd::P5(s) => (platform_figures(&["P5"]).await, s.strict, true),
        BenchCmd::P6(s) => (platform_figures(&["P6"]).await, s.strict, true),
        BenchCmd::P8(s) => (platform_figures(&["P8"]).await, s.strict, true),
        BenchCmd::Files(s) => (platform_figures(&["files"]).await, s.strict, true),
        BenchCmd::P10(s) => (platform_figures(&["P10"]).await, s.strict, true),
        BenchCmd::Egress(s) => (
            rows_or_failed("egress", super::egress::run().await),
            s.strict,
            true,
        ),
        BenchCmd::E2b(s) => (
            rows_or_failed("P13", super::e2b::run().await),
            s.strict,
            true,
        ),
        BenchCmd::Image(s) => (
            rows_or_failed("image", super::image::run().await),
            s.strict,
            true,
        ),
        BenchCmd::Templates(s) => (
            rows_or_failed("templates", super::templates::run().await),
            s.strict,
            true,
        ),
        BenchCmd::P7(a) => (
            rows_or_failed("P7", p7::run(a.sandboxes).await),
            a.strict,
            true,
        ),
        BenchCmd::All(a) => {
            let mut rows = cpu_figures(true, true).await?;
            rows.extend(platform_figures(&["P3", "P4", "P5", "P6", "P8", "P10"]).await);
            rows.extend(rows_or_failed("P7", p7::run(a.sandboxes).await));
            eprintln!("P9: the soak's short form");
            let args = soak::SoakArgs::short();
            let passed = match soak::run(&args).await {
                Ok(report) => {
                    rows.extend(report.rows());
                    report.passed()
                }
                Err(e) => {
                    rows.push(failed("P9", &e));
                    false
                }
            };
            // In QUALITY.md's order: P1 … P10 (P10 after P9, not after P1).
            rows.sort_by_key(|r| figure_order(&r.id));
            (rows, a.strict, passed)
        }
    };
    print_table(&rows, json);
    Ok(exit_code(&rows, strict, soak_passed))
}

/// Where a row of figure `id` goes in the table: by the figure's number, then by
/// name (`files`, anything unnumbered, last).
fn figure_order(id: &str) -> (u32, String) {
    let n = id.strip_prefix('P').and_then(|n| n.parse().ok());
    (n.unwrap_or(u32::MAX), id.to_owned())
}

/// 1 when a figure could not be measured or the soak failed; with `strict`, also when
/// a measured value missed its target.
fn exit_code(rows: &[Row], strict: bool, soak_passed: bool) -> i32 {
    let could_not = rows.iter().any(|r| r.measured.starts_with("error: "));
    let missed = rows.iter().any(|r| r.pass == Some(false));
    i32::from(could_not || !soak_passed || (strict && missed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_ordered_by_figure_number_so_p10_comes_after_p9() {
        let mut ids = vec!["P10", "P9", "P1", "P3", "P2", "P10", "P8"];
        ids.sort_by_key(|id| figure_order(id));
        assert_eq!(ids, ["P1", "P2", "P3", "P8", "P9", "P10", "P10"]);
    }

    #[test]
    fn a_missed_target_fails_the_run_only_with_strict() {
        let met = Row::new("P4", "p50", "5 ms".into(), "≤ 25 ms").pass(true);
        let missed = Row::new("P3", "p50", "4 ×".into(), "≤ 3 ×").pass(false);
        let info = Row::new("P3", "baseline", "0.05 ms".into(), "-");
        assert_eq!(exit_code(&[met.clone(), info.clone()], true, true), 0);
        assert_eq!(exit_code(&[met.clone(), missed.clone()], false, true), 0);
        assert_eq!(exit_code(&[met.clone(), missed], true, true), 1);
        // A figure that could not be measured, or a failed soak, fails the run anyway.
        assert_eq!(
            exit_code(&[met.clone(), failed("P7", "no worker")], false, true),
            1
        );
        assert_eq!(exit_code(&[met, info], false, false), 1);
    }
}
