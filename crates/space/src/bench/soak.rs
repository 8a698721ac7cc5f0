//! `space bench soak`: sandboxes migrating, pausing and resuming back to back while
//! clients read, write, exec and open streams, through the edge and in the SDK's
//! direct mode; every answer checked against the execution that should have given it.

use clap::Args;

use super::Row;

/// `space bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Sandboxes churned.
    #[arg(long, default_value_t = 3)]
    pub sandboxes: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Concurrent clients (half through the edge, half in direct mode).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Seconds to run (at least; see --min-migrations and --ops).
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// Keep going until this many operations were made.
    #[arg(long, default_value_t = 0)]
    pub ops: u64,
    /// Keep going until this many migrations were made.
    #[arg(long, default_value_t = 0)]
    pub min_migrations: u64,
    /// Also kill a worker with SIGKILL now and then (`space up` restarts it).
    #[arg(long)]
    pub kill_workers: bool,
}

impl SoakArgs {
    /// The short form `space bench all` and CI run.
    pub fn short() -> Self {
        Self {
            sandboxes: 3,
            workers: 2,
            clients: 4,
            duration: 10,
            ops: 0,
            min_migrations: 20,
            kill_workers: false,
        }
    }
}

/// What a soak saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SoakReport {
    /// Operations made.
    pub ops: u64,
    /// Operations that failed.
    pub failures: u64,
}

impl SoakReport {
    /// Whether every target was met.
    pub fn passed(&self) -> bool {
        self.ops > 0 && self.failures == 0
    }

    /// The report as table rows.
    pub fn rows(&self) -> Vec<Row> {
        vec![Row::new("P9", "operations", self.ops.to_string(), "-")]
    }
}

/// Runs a soak.
pub async fn run(_args: &SoakArgs) -> Result<SoakReport, String> {
    Err("the soak is being written".into())
}
