//! The first `space-jail` process: reads the spec, builds the root filesystem in
//! its private mount namespace, opens the agent binary while host paths still
//! resolve, forks the init and reports the init's host PID.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;

use crate::error::JailError;
use crate::fds::{ACTIVATION_FD, LISTEN_FD, send_status};
use crate::spec::{DEFAULT_NOFILE, JailSpec, MAX_SPEC_BYTES, Rootless, StatusEvent};
use crate::sys::{self, Forked};
use crate::{init, rootfs, seccomp_profile, userns};

/// Runs the launcher; returns the exit code of the first `space-jail` process.
pub fn run() -> i32 {
    match launch() {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("space-jail: {err}");
            send_status(&err.to_event());
            1
        }
    }
}

fn read_spec() -> Result<JailSpec, JailError> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| JailError::new("read spec", e.to_string()))?;
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(JailError::new(
            "read spec",
            "spec larger than MAX_SPEC_BYTES",
        ));
    }
    let spec: JailSpec =
        serde_json::from_slice(&bytes).map_err(|e| JailError::new("parse spec", e.to_string()))?;
    validate(&spec)?;
    Ok(spec)
}

/// Checks what the kernel would otherwise reject late or interpret surprisingly.
fn validate(spec: &JailSpec) -> Result<(), JailError> {
    let hostname_ok = !spec.hostname.is_empty()
        && spec.hostname.len() <= 64
        && spec
            .hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !hostname_ok {
        return Err(JailError::new(
            "validate spec",
            "hostname must be 1-64 of [A-Za-z0-9.-]",
        ));
    }
    if spec.lower_dirs.is_empty() || spec.lower_dirs.len() > crate::spec::MAX_LOWER_DIRS {
        return Err(JailError::new(
            "validate spec",
            format!(
                "{} lower dirs (1 to {} allowed)",
                spec.lower_dirs.len(),
                crate::spec::MAX_LOWER_DIRS
            ),
        ));
    }
    for path in spec.lower_dirs.iter().chain([
        &spec.root_dir,
        &spec.upper_dir,
        &spec.work_dir,
        &spec.agent.path,
    ]) {
        if !path.is_absolute() {
            return Err(JailError::new(
                "validate spec",
                format!("{} is not absolute", path.display()),
            ));
        }
    }
    if !spec.agent.cwd.is_absolute() {
        return Err(JailError::new("validate spec", "agent cwd is not absolute"));
    }
    Ok(())
}

/// Opens the agent executable by descriptor: after `pivot_root` its host path no
/// longer resolves, and a descriptor cannot be swapped under us by anything in the
/// jail. The descriptor is the root of a detached read-only bind of the file, so the
/// agent's `/proc/PID/exe` leads to a read-only mount: whatever reaches it (the agent
/// runs as the binary's owner without a user namespace) cannot reopen it for
/// writing and change what the next jail runs.
fn open_agent(spec: &JailSpec) -> Result<OwnedFd, JailError> {
    if !OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(&spec.agent.path)
        .and_then(|f| f.metadata())
        .map_err(|e| JailError::io("open agent", &spec.agent.path, e))?
        .is_file()
    {
        return Err(JailError::new(
            "open agent",
            format!("{} is not a regular file", spec.agent.path.display()),
        ));
    }
    crate::mounts::clone_tree(
        &spec.agent.path,
        crate::mounts::BindAttrs {
            read_only: true,
            idmap: None,
        },
    )
    .map_err(|e| JailError::io("bind agent read-only", &spec.agent.path, e))
}

/// Fails unless fds 3 and 4 are open: otherwise the first file this process opens
/// would take number 3 and be handed to the agent as its listener.
fn check_inherited_fds() -> Result<(), JailError> {
    for fd in [LISTEN_FD, ACTIVATION_FD] {
        if !sys::is_open(fd) {
            return Err(JailError::new(
                "inherited fds",
                format!("fd {fd} is not open"),
            ));
        }
    }
    Ok(())
}

/// Rootless: a user namespace where root maps to the worker's uid, then the other
/// namespaces, owned by it. A process that has just unshared holds every capability
/// in its new user namespace (until it execs), which is what writing its own maps and
/// the later mounts need.
fn enter_user_namespace(r: &Rootless) -> Result<(), JailError> {
    use nix::sched::{CloneFlags, unshare};
    unshare(CloneFlags::CLONE_NEWUSER)
        .map_err(|e| JailError::new("unshare user namespace", e.to_string()))?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| JailError::new("map ids", format!("{file}: {e}")))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("0 {} 1\n", r.uid))?;
    write("gid_map", format!("0 {} 1\n", r.gid))?;
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC,
    )
    .map_err(|e| JailError::new("unshare namespaces", e.to_string()))
}

/// Rootless limits: inherited by the init and everything it starts.
fn apply_rlimits(r: &Rootless) -> Result<(), JailError> {
    use nix::sys::resource::{Resource, setrlimit};
    if let Some(n) = r.pids_max {
        setrlimit(Resource::RLIMIT_NPROC, n, n)
            .map_err(|e| JailError::new("rlimit nproc", e.to_string()))?;
    }
    if let Some(m) = r.memory_bytes {
        setrlimit(Resource::RLIMIT_AS, m, m)
            .map_err(|e| JailError::new("rlimit as", e.to_string()))?;
    }
    Ok(())
}

fn launch() -> Result<(), JailError> {
    check_inherited_fds()?;
    let spec = read_spec()?;
    if let Some(r) = &spec.rootless {
        enter_user_namespace(r)?;
    }
    // Root: the namespaces except PIDs came from the worker (see `lib.rs`).
    let userns = match (&spec.userns, &spec.rootless) {
        (Some(map), None) => Some(
            userns::create(map)
                .map_err(|e| JailError::new("create user namespace", e.to_string()))?,
        ),
        _ => None,
    };
    if spec.rootless.is_none() {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
            .map_err(|e| JailError::new("unshare pid namespace", e.to_string()))?;
    }
    rootfs::build(&spec, userns.as_ref())?;
    let agent = open_agent(&spec)?;
    let filters =
        seccomp_profile::compile().map_err(|e| JailError::new("compile seccomp", e.to_string()))?;
    if let Some(r) = &spec.rootless {
        apply_rlimits(r)?;
    }
    let nofile = spec.nofile.unwrap_or(DEFAULT_NOFILE);
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, nofile, nofile)
        .map_err(|e| JailError::new("rlimit nofile", e.to_string()))?;
    match sys::fork().map_err(|e| JailError::new("fork init", e.to_string()))? {
        Forked::Child => {
            // PID 1 of the new PID namespace; never returns into this function.
            let code = init::run(&spec, agent, userns, &filters);
            sys::exit_now(code)
        }
        Forked::Parent(pid) => {
            send_status(&StatusEvent::Init { pid });
            Ok(())
        }
    }
}
