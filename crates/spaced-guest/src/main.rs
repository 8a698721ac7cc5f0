//! `spaced-guest serve …`: the guest agent. See the library for what it does.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before the activation secret is read: the workload runs under the same uid, and
    // only a non-dumpable agent keeps its memory (`/proc/<agent>/mem`), environment,
    // maps and descriptors out of the workload's reach. execve reset the flag, so the
    // agent sets it itself.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("spaced-guest: PR_SET_DUMPABLE: {e}");
        return ExitCode::from(1);
    }
    // PID 1 of a VM sandbox (the initramfs's `/init`, started without arguments).
    if rustix::process::getpid().is_init() {
        spaced_guest::vm::init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The agent over vsock (a VM whose command line names that transport).
    if let [cmd, flag, port] = args.as_slice() {
        if cmd == "vm-agent" && flag == "--vsock" {
            let Ok(port) = port.parse::<u32>() else {
                eprintln!("spaced-guest: vm-agent --vsock: not a port: {port}");
                return ExitCode::from(2);
            };
            let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
            let here = spaced_guest::vsock::pid1_is_this_binary();
            // Under QEMU's vhost-vsock any host process reaches the guest's CID, so
            // only a reserved host port (the bridge's) is served: the command line
            // says which, and comes with the permission.
            let peers = match spaced_guest::vsock::may_serve(&cmdline, here) {
                Ok(peers) => peers,
                Err(e) => {
                    eprintln!("spaced-guest: vm-agent --vsock: {e}");
                    return ExitCode::from(2);
                }
            };
            return match spaced_guest::vsock::serve_vsock(port, peers, 256) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("spaced-guest: {e}");
                    ExitCode::from(1)
                }
            };
        }
    }
    if let [cmd, port] = args.as_slice() {
        if cmd == "vm-agent" {
            return match spaced_guest::vm::serve_port(std::path::Path::new(port), 256) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("spaced-guest: {e}");
                    ExitCode::from(1)
                }
            };
        }
    }
    let home = spaced_guest::config::default_home(
        rustix::process::getuid().as_raw(),
        std::env::var("HOME").ok().as_deref(),
    );
    let config = match spaced_guest::Config::parse(std::env::args().skip(1), home) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spaced-guest: {e}\n{}", spaced_guest::config::USAGE);
            return ExitCode::from(2);
        }
    };
    let (agent, listener) = match spaced_guest::start(&config) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("spaced-guest: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!(
        "spaced-guest: serving sandbox {} execution {} (generation {}, activation {})",
        agent.identity.sandbox,
        agent.identity.execution.id,
        agent.identity.execution.generation,
        agent.identity.activation
    );
    match spaced_guest::serve(agent, listener) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spaced-guest: accept: {e}");
            ExitCode::from(1)
        }
    }
}
