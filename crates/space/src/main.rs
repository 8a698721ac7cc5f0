//! `space`: the platform (`space up`), its daemons, and the client CLI.
#![allow(clippy::print_stdout)] // A command-line tool: printing is its job.

mod args;
mod bench;
mod cli;
mod daemons;
mod files;
mod streams;
mod up;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

// The command line lives in `args`; `cli.rs` still names these as `crate::…`.
pub use args::{Cli, Command, FsCmd, KeysCmd, SandboxCmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Up(_) | Command::Control(_) | Command::Worker(_)
    ) {
        // Before any thread, file or database exists: everything the daemons (and
        // SQLite, for its -wal/-shm/-journal files) create is the owner's only.
        space_http::private_dir::restrict_umask();
    }
    let filter = std::env::var("SPACE_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // A log line that cannot be written (standard error is a pipe whose reader went
        // away) is dropped. With this on, the subscriber reports the failure with
        // `eprintln!`, which panics on that same pipe: the thread that logged died —
        // a worker stopping mid-shutdown left its disk volume mounted.
        .log_internal_errors(false)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "space: error: cannot start the runtime: {e}"
            );
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(a) => up::run(a).await.map(|()| 0),
            Command::Control(a) => daemons::control(a).await.map(|()| 0),
            Command::Worker(a) => daemons::worker(a).await.map(|()| 0),
            Command::Edge(a) => daemons::edge(a).await.map(|()| 0),
            Command::Bench(b) => bench::run(&b, cli.json).await,
            Command::Vm(args::VmCmd::Setup {
                data_dir,
                kernel_deb,
            }) => vm_setup(&data_dir, kernel_deb.as_deref()),
            ref other => cli::run(&cli, other).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            // The one error format of the CLI (see `cli::api_error`).
            // Not `eprintln!`: it panics when standard error goes nowhere.
            let _ = writeln!(std::io::stderr(), "space: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `space vm setup`: the guest kernel into `<data>/vm/kernel`, each step printed.
fn vm_setup(data_dir: &std::path::Path, deb: Option<&std::path::Path>) -> Result<i32, String> {
    let dir = data_dir.join("vm").join("kernel");
    let kernel = space_worker::substrate::vm::kernel::setup(&dir, deb, &mut |step| {
        println!("{step}");
    })?;
    println!(
        "guest kernel {} with {} modules: {}",
        kernel.release,
        kernel.modules.len(),
        kernel.vmlinuz.display()
    );
    Ok(0)
}
