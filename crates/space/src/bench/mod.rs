//! `space bench …`: every performance and reliability figure of
//! `QUALITY.md` from the installed binaries, against a real `space up` started for the
//! purpose (see [`platform`]). Each figure prints a progress line on stderr while it
//! runs and a row of the table on stdout: measured value, target, ratio, pass.

pub mod cmd;
pub mod e2b;
pub mod egress;
mod figures;
pub mod files;
pub mod image;
pub mod p10;
pub mod p1_p2;
pub mod p3;
pub mod p4;
pub mod p5_p6;
pub mod p7;
pub mod p8;
pub mod platform;
mod row;
pub mod soak;
pub mod templates;

use cmd::BenchCmd;
use row::print_table;

/// Runs `space bench CMD`; the exit code is 0 unless a run failed (or, for
/// reliability figures, missed its target).
pub async fn run(cmd: &BenchCmd, json: bool) -> Result<i32, String> {
    match cmd {
        BenchCmd::Soak(a) => {
            let report = soak::run(a).await?;
            print_table(&report.rows(), json);
            Ok(if report.passed() { 0 } else { 1 })
        }
        BenchCmd::Serve(a) => p10::serve::run(a).await.map(|()| 0),
        BenchCmd::Load(a) => p10::load::run(a).await,
        figure => figures::run(figure, json).await,
    }
}
