//! The arguments of `space bench …`: which figure, and how strictly.

use clap::{Args, Subcommand};

use super::{p10, soak};

/// `space bench …`.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Sandboxes migrating, pausing and resuming continuously while clients read,
    /// write, exec and open streams through the edge and the SDK's direct mode.
    Soak(soak::SoakArgs),
    /// P1: capability verify at first sight against a raw `verify_strict`.
    P1(Strict),
    /// P2: admission of an already verified token (the verified-token cache).
    P2(Strict),
    /// P3: a 4 KiB read through edge → worker → bridge → guest against a direct call
    /// to a guest agent; reads per second with 16 clients.
    P3(Strict),
    /// P4: 50 concurrent creates through the public API, ready for their first exec.
    P4(Strict),
    /// P5: pause and resume in place; migrate a sandbox with a 64 MiB filesystem.
    P5(Strict),
    /// P6: the first request through a stale route cache after a migration.
    P6(Strict),
    /// P7: host-side memory per idle sandbox, and how many fit in 24 GiB.
    P7(P7Args),
    /// P8: streams of execution N closed after N+1 is installed.
    P8(Strict),
    /// P10: HTTP (latency, requests per second) and TCP (throughput) to servers in a
    /// sandbox through edge + netgtw, against the same client inside the sandbox's
    /// network namespace.
    P10(Strict),
    /// Issue 15: 50 concurrent creates in network mode egress, and TCP from a sandbox
    /// to a host outside it through NAT and through the SNI proxy, against the host.
    Egress(Strict),
    /// Issue 16: the import of a 200 MB image into a template store against `tar -x`
    /// of the same layers on the same disk (target ≤ 2 ×).
    Image(Strict),
    /// Issue 16: creates from an image template with its standby pool (50 at once),
    /// cold creates of it against the default's, and 20 creates a second for 60 s
    /// while the pools refill (and how evenly they stay spread).
    Templates(Strict),
    /// P13: E2B's `commands.run("true")` and a 4 KiB `files.read` through the E2B
    /// front against the same through SPACE's own API (target p50 ≤ 1.5 ×).
    E2b(Strict),
    /// A server P10 runs inside a sandbox.
    #[command(hide = true)]
    Serve(p10::serve::ServeArgs),
    /// P10's load client: prints one JSON line.
    #[command(hide = true)]
    Load(p10::load::LoadArgs),
    /// Files: a 50 MiB put and get through the edge against a host `cp` of the same
    /// file into and out of the same filesystem (target ≤ 3 ×).
    Files(Strict),
    /// P1–P8 and P10, then the soak's short form: one table.
    All(P7Args),
}

/// `--strict` of a figure.
#[derive(Debug, Clone, Args)]
pub struct Strict {
    /// Exit non-zero when a measured value misses its target.
    #[arg(long)]
    pub strict: bool,
}

/// `space bench p7` and `space bench all`.
#[derive(Debug, Clone, Args)]
pub struct P7Args {
    /// Exit non-zero when a measured value misses its target.
    #[arg(long)]
    pub strict: bool,
    /// Idle sandboxes for P7.
    #[arg(long, default_value_t = 100)]
    pub sandboxes: usize,
}
