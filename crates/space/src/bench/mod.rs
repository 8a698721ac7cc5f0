//! `space bench …`: every performance and reliability figure of
//! `QUALITY.md` from the installed binaries, against a real `space up` started for the
//! purpose (see [`platform`]). Each figure prints a progress line on stderr while it
//! runs and a row of the table on stdout: measured value, target, ratio, pass.

mod figures;
pub mod files;
pub mod p1_p2;
pub mod p3;
pub mod p4;
pub mod p5_p6;
pub mod p7;
pub mod p8;
pub mod platform;
pub mod soak;

use clap::Subcommand;
use serde::Serialize;

/// `space bench …`.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Sandboxes migrating, pausing and resuming continuously while clients read,
    /// write, exec and open streams through the edge and the SDK's direct mode.
    Soak(soak::SoakArgs),
    /// P1: capability verify at first sight against a raw `verify_strict`.
    P1(figures::Strict),
    /// P2: admission of an already verified token (the verified-token cache).
    P2(figures::Strict),
    /// P3: a 4 KiB read through edge → worker → bridge → guest against a direct call
    /// to a guest agent; reads per second with 16 clients.
    P3(figures::Strict),
    /// P4: 50 concurrent creates through the public API, ready for their first exec.
    P4(figures::Strict),
    /// P5: pause and resume in place; migrate a sandbox with a 64 MiB filesystem.
    P5(figures::Strict),
    /// P6: the first request through a stale route cache after a migration.
    P6(figures::Strict),
    /// P7: host-side memory per idle sandbox, and how many fit in 24 GiB.
    P7(figures::P7Args),
    /// P8: streams of execution N closed after N+1 is installed.
    P8(figures::Strict),
    /// Files: a 50 MiB put and get through the edge against a host `cp` of the same
    /// file into and out of the same filesystem (target ≤ 3 ×).
    Files(figures::Strict),
    /// P1–P8, then the soak's short form: one table.
    All(figures::P7Args),
}

/// One row of a benchmark table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The figure's name in `QUALITY.md` (`P3`, `P9`, …) or a short name.
    pub id: String,
    /// What was measured.
    pub what: String,
    /// The measured value, with its unit.
    pub measured: String,
    /// The target, as `QUALITY.md` states it.
    pub target: String,
    /// Measured over the target's anchor, where the target is a ratio or a bound.
    pub ratio: Option<f64>,
    /// Whether the target was met (`None`: no target, information only).
    pub pass: Option<bool>,
}

impl Row {
    /// A row.
    pub fn new(id: &str, what: &str, measured: String, target: &str) -> Self {
        Self {
            id: id.to_owned(),
            what: what.to_owned(),
            measured,
            target: target.to_owned(),
            ratio: None,
            pass: None,
        }
    }

    /// With the ratio of measured to target.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = Some(ratio);
        self
    }

    /// With the verdict.
    pub fn pass(mut self, pass: bool) -> Self {
        self.pass = Some(pass);
        self
    }
}

/// Prints `rows` as an aligned table (or JSON lines with `json`).
pub fn print_table(rows: &[Row], json: bool) {
    if json {
        for r in rows {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        return;
    }
    let head = ["id", "what", "measured", "target", "ratio", "pass"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                r.what.clone(),
                r.measured.clone(),
                r.target.clone(),
                r.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}")),
                match r.pass {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut out = String::new();
        for (i, (s, w)) in c.iter().zip(width).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(s);
            out.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(s.chars().count()),
            ));
        }
        println!("{}", out.trim_end());
    };
    line(&head.map(str::to_owned));
    for c in &cells {
        line(c);
    }
}

/// Runs `space bench CMD`; the exit code is 0 unless a run failed (or, for
/// reliability figures, missed its target).
pub async fn run(cmd: &BenchCmd, json: bool) -> Result<i32, String> {
    match cmd {
        BenchCmd::Soak(a) => {
            let report = soak::run(a).await?;
            print_table(&report.rows(), json);
            Ok(if report.passed() { 0 } else { 1 })
        }
        figure => figures::run(figure, json).await,
    }
}

/// The `p`-quantile of sorted `values` (nearest rank), or 0 when empty.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
