//! The command line of `space`: every subcommand and its arguments, parsed by clap.
//! Each daemon and command module takes its arguments from here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::bench::cmd::BenchCmd;

/// SPACE: sandboxes for AI agents, where every request reaches the execution it was
/// authorized for.
#[derive(Debug, Parser)]
#[command(name = "space", version, about)]
pub struct Cli {
    /// Edge URL.
    #[arg(
        long,
        global = true,
        env = "SPACE_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub url: String,
    /// API key (default: ./.space/admin.key when present).
    #[arg(long, global = true, env = "SPACE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the platform on this machine: control plane + edge, N workers, SQLite.
    Up(UpArgs),
    /// Run the control plane (with its edge).
    Control(ControlArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Run an edge in front of a control plane.
    Edge(EdgeArgs),
    /// Manage sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec(ExecArgs),
    /// Files in a sandbox.
    #[command(subcommand)]
    Fs(FsCmd),
    /// An interactive shell in a sandbox (a PTY over WebSocket).
    Term {
        /// Sandbox ID.
        sandbox: String,
    },
    /// Print changes under a directory of a sandbox, one JSON line each.
    Watch {
        /// Sandbox ID.
        sandbox: String,
        /// Directory in the sandbox.
        #[arg(default_value = "/root")]
        path: String,
        /// Also watch subdirectories.
        #[arg(long)]
        recursive: bool,
    },
    /// List workers.
    Workers,
    /// Signing keys.
    #[command(subcommand)]
    Keys(KeysCmd),
    /// Benchmarks and the churn soak, against a `space up` started for them.
    #[command(subcommand)]
    Bench(BenchCmd),
}

/// `space up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Data directory.
    #[arg(long, default_value = ".space")]
    pub data_dir: PathBuf,
    /// Control plane + edge address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Number of worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Jails each worker keeps launched ahead of demand (0 turns the pool off).
    #[arg(long, env = "SPACE_WARM_POOL", default_value_t = space_worker::daemon::DEFAULT_WARM_POOL)]
    pub warm_pool: usize,
    /// Sandboxes kept running, unowned, for creates to claim: a create without its own
    /// environment or worker then costs one write (0 turns it off) [default: 16 per
    /// worker].
    #[arg(long, env = "SPACE_STANDBY")]
    pub standby: Option<usize>,
    /// Workers run jails as host uid 0 without user namespaces (weaker; see
    /// `space worker --no-userns`).
    #[arg(long, env = "SPACE_NO_USERNS")]
    pub no_userns: bool,
}

impl UpArgs {
    /// Standby sandboxes to keep: as asked, or 16 per worker.
    pub fn standby(&self) -> usize {
        self.standby
            .unwrap_or(space_control::service::STANDBY_PER_WORKER * self.workers as usize)
    }
}

/// `space control`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Data directory.
    #[arg(long, default_value = ".space")]
    pub data_dir: PathBuf,
    /// PostgreSQL URL (`postgres://…`); SQLite in the data directory otherwise.
    #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Sandboxes kept running, unowned, for creates to claim (0 turns it off).
    #[arg(long, env = "SPACE_STANDBY", default_value_t = 0)]
    pub standby: usize,
}

/// `space worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Worker ID (a DNS label).
    #[arg(long)]
    pub id: String,
    /// Control-plane URL.
    #[arg(long)]
    pub control: String,
    /// File holding the enrollment secret.
    #[arg(long, conflicts_with = "enroll_secret")]
    pub enroll_secret_file: Option<PathBuf>,
    /// The enrollment secret.
    #[arg(long, env = "SPACE_ENROLL_SECRET", hide_env_values = true)]
    pub enroll_secret: Option<String>,
    /// node-api listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// URL others reach node-api at.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Most sandboxes.
    #[arg(long, default_value_t = 1000)]
    pub capacity: u32,
    /// cgroup parent directory name (distinct per worker on one host).
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// Jails kept launched ahead of demand, so that a create costs an activation
    /// rather than a launch (0 turns the pool off; needs root).
    #[arg(long, env = "SPACE_WARM_POOL", default_value_t = space_worker::daemon::DEFAULT_WARM_POOL)]
    pub warm_pool: usize,
    /// Run jails as host uid 0 without a user namespace of their own. Weaker: every
    /// sandbox then shares host root's per-user kernel limits (see
    /// docs/operations.md); only for kernels without idmapped mounts.
    #[arg(long, env = "SPACE_NO_USERNS")]
    pub no_userns: bool,
    /// First host uid of the jails' user namespace ranges (65,536 ids per sandbox;
    /// every worker of a host draws from the same ranges).
    #[arg(long, default_value_t = space_worker::substrate::jail::uid_ranges::DEFAULT_FIRST_ID)]
    pub userns_first_uid: u32,
    /// How many such ranges (sandboxes with a user namespace at once, on this host).
    #[arg(long, default_value_t = space_worker::substrate::jail::uid_ranges::DEFAULT_SLOTS)]
    pub userns_ranges: u32,
    /// Directory holding spaced-guest, spaced-host and space-jail (default: next to
    /// this executable).
    #[arg(long, env = "SPACE_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
}

/// `space edge`.
#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// Control-plane URL.
    #[arg(long)]
    pub control: String,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub listen: std::net::SocketAddr,
}

/// `space sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox.
    Create {
        /// Lifetime in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// At the TTL: stop (default) or pause.
        #[arg(long, value_parser = ["stop", "pause"])]
        ttl_action: Option<String>,
        /// Environment variable (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Place on this worker.
        #[arg(long)]
        worker: Option<String>,
        /// Metadata (a JSON object).
        #[arg(long)]
        metadata: Option<String>,
        /// Memory limit in MiB (RAM and swap together).
        #[arg(long)]
        memory_mib: Option<u64>,
        /// CPU limit in cores (`0.5`, `2`).
        #[arg(long)]
        cpus: Option<f64>,
        /// Most processes and threads at once.
        #[arg(long)]
        pids: Option<u32>,
        /// Disk limit in MiB for the sandbox's files.
        #[arg(long)]
        disk_mib: Option<u64>,
    },
    /// List sandboxes.
    List,
    /// Show one sandbox.
    Get {
        /// Sandbox ID.
        id: String,
    },
    /// Remove a sandbox.
    Rm {
        /// Sandbox ID.
        id: String,
    },
    /// Pause a sandbox in place (same execution).
    Pause {
        /// Sandbox ID.
        id: String,
    },
    /// Resume a paused sandbox: in place, or from its snapshot on `--worker` (a new
    /// execution).
    Resume {
        /// Sandbox ID.
        id: String,
        /// Restore the snapshot on this worker.
        #[arg(long)]
        worker: Option<String>,
    },
    /// Freeze a sandbox and keep its writable layer (it is then paused).
    Snapshot {
        /// Sandbox ID.
        id: String,
    },
    /// Move a sandbox to another worker (a new execution, with its files).
    Migrate {
        /// Sandbox ID.
        id: String,
        /// Target worker.
        #[arg(long)]
        worker: String,
    },
}

/// `space exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox ID.
    pub sandbox: String,
    /// Kill after this many seconds.
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Working directory.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Print output as it is produced (a WebSocket stream) instead of at the end;
    /// stdin is forwarded as it is read (any size; its end closes the command's).
    #[arg(long)]
    pub stream: bool,
    /// Do not read stdin (by default, stdin that is not a terminal is sent to the
    /// command: up to 64 MiB, any size with --stream).
    #[arg(long, short = 'n')]
    pub no_stdin: bool,
    /// Keep at most this many bytes of each of stdout and stderr (default 16 MiB, at
    /// most 32 MiB; ignored with --stream, which has no cap).
    #[arg(long, value_name = "BYTES")]
    pub max_output_bytes: Option<u64>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `space fs …`.
#[derive(Debug, Subcommand)]
pub enum FsCmd {
    /// Download a file (to stdout with `-` or no LOCAL).
    Get {
        /// Sandbox ID.
        sandbox: String,
        /// Path in the sandbox.
        path: String,
        /// Local file.
        local: Option<PathBuf>,
    },
    /// Upload a file (from stdin with `-`).
    Put {
        /// Sandbox ID.
        sandbox: String,
        /// Local file or `-`.
        local: PathBuf,
        /// Path in the sandbox.
        path: String,
    },
    /// List a directory.
    Ls {
        /// Sandbox ID.
        sandbox: String,
        /// Directory in the sandbox.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Remove a file or directory.
    Rm {
        /// Sandbox ID.
        sandbox: String,
        /// Path in the sandbox.
        path: String,
    },
}

/// `space keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCmd {
    /// Publish a new signing key to every receiver, then sign with it.
    Rotate,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(args: &[&str]) -> UpArgs {
        let argv = ["space", "up"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Up(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn space_up_keeps_warm_jails_and_standby_sandboxes_per_worker_unless_told_otherwise() {
        if std::env::var_os("SPACE_STANDBY").is_some()
            || std::env::var_os("SPACE_WARM_POOL").is_some()
        {
            eprintln!("SKIPPED: SPACE_STANDBY / SPACE_WARM_POOL set in the environment");
            return;
        }
        let a = up(&[]);
        assert_eq!((a.warm_pool, a.standby()), (16, 32));
        assert_eq!(up(&["--workers", "3"]).standby(), 48);
        let off = up(&["--standby", "0", "--warm-pool", "0"]);
        assert_eq!((off.warm_pool, off.standby()), (0, 0));
        assert_eq!(up(&["--workers", "1", "--standby", "5"]).standby(), 5);
    }
}
