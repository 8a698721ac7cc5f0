//! `spaced-host --spec-fd N`: reads a [`spaced_host::BridgeSpec`] as JSON from file
//! descriptor N to EOF (0 for stdin; never argv, which any local user can read), binds the bridge socket, prints `ready` on stdout, and serves.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use spaced_host::BridgeSpec;

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spaced-host: {e}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec_bytes = match args.as_slice() {
        [flag, fd] if flag == "--spec-fd" => {
            let fd: i32 = fd
                .parse()
                .map_err(|_| format!("--spec-fd: not a number: {fd}"))?;
            if fd < 0 {
                return Err("--spec-fd must not be negative".into());
            }
            read_fd(fd)?
        }
        [flag, path] if flag == "--spec-file" => {
            std::fs::read(path).map_err(|e| format!("{path}: {e}"))?
        }
        _ => return Err("usage: spaced-host --spec-fd N | --spec-file PATH".into()),
    };
    if spec_bytes.is_empty() {
        // A bridge started ahead of demand whose worker went away before using it.
        return Err("no spec: the worker closed the pipe before sending one".into());
    }
    let spec = BridgeSpec::decode(&spec_bytes)?;
    // A VM's agent: verified and activated before the bridge says it is ready.
    let link = match spec.transport {
        spaced_host::Transport::Socket => None,
        spaced_host::Transport::Serial => {
            let link = spaced_host::serial::connect(&spec, spaced_host::serial::READY_WAIT)
                .map_err(|e| format!("serial transport: {e}"))?;
            let shared = spaced_host::relink::SharedLink::new(link);
            spaced_host::relink::watch(shared.clone(), spec.clone(), false);
            Some(shared)
        }
        spaced_host::Transport::Vsock => {
            let link = spaced_host::vsock::connect_agent(&spec, spaced_host::serial::READY_WAIT)
                .map_err(|e| format!("vsock transport: {e}"))?;
            // Firecracker resets vsock at every snapshot: linked again, see `relink`.
            let shared = spaced_host::relink::SharedLink::new(link);
            spaced_host::relink::watch(shared.clone(), spec.clone(), true);
            Some(shared)
        }
        spaced_host::Transport::VhostVsock { cid } => {
            let (link, hold) =
                spaced_host::vhost::connect_agent(&spec, cid, spaced_host::serial::READY_WAIT)
                    .map_err(|e| format!("vhost-vsock transport: {e}"))?;
            // QEMU's device held (its CID cannot go to another) until the bridge ends,
            // which it does when QEMU does.
            spaced_host::vhost::exit_when_the_vmm_ends(hold);
            // QEMU resets no connection of a VM that goes on after its snapshot: the
            // bridge ends with its link, as over serial (see `vhost`).
            let shared = spaced_host::relink::SharedLink::new(link);
            spaced_host::relink::watch(shared.clone(), spec.clone(), false);
            Some(shared)
        }
    };
    let listener = space_peer::bind_listener(&spec.listen).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout();
    writeln!(out, "ready")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())?;
    spaced_host::run_shared(spec, listener, link).map_err(|e| format!("listener failed: {e}"))
}

#[allow(unsafe_code)]
fn read_fd(fd: i32) -> Result<Vec<u8>, String> {
    // Refuse fds that are not open rather than adopting a random number.
    rustix::io::fcntl_getfd(
        // SAFETY: only used for the duration of this call to test that `fd` is open.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .map_err(|e| format!("--spec-fd {fd}: {e}"))?;
    // SAFETY: the worker passed this fd to us for our exclusive use; it is open (checked
    // above) and nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = Vec::new();
    std::fs::File::from(owned)
        .take(spaced_host::spec::MAX_SPEC_LEN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("--spec-fd {fd}: {e}"))?;
    Ok(buf)
}
