//! PID 1 of the jail: finishes the jail from inside the new PID namespace, starts
//! the agent hardened, then reaps every process and forwards termination signals
//! to the agent until the agent exits. When the init exits the kernel kills
//! everything left in the namespace, so the agent's lifetime is the jail's.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::socket::{Backlog, listen};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, chdir, pipe2, pivot_root, sethostname, setsid};
use seccompiler::BpfProgram;

use crate::error::JailError;
use crate::fds::{ACTIVATION_FD, LISTEN_FD, send_status};
use crate::spec::{JailSpec, StatusEvent};
use crate::sys::{self, Forked};
use crate::{rootfs, seccomp_profile, userns};

/// Signals the init passes on to the agent (it is the agent's job to stop its
/// own children gracefully).
const FORWARDED: &[Signal] = &[
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Default `PATH` inside the jail.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs the init; returns its exit code (the agent's, or 1 if the jail failed).
pub fn run(
    spec: &JailSpec,
    agent: OwnedFd,
    userns: Option<OwnedFd>,
    filters: &[BpfProgram],
) -> i32 {
    let mut handled = SigSet::empty();
    handled.add(Signal::SIGCHLD);
    for &sig in FORWARDED {
        handled.add(sig);
    }
    // Hardened once, before the fork: the agent inherits the empty capability
    // sets, no_new_privs and the very same filter (one kernel copy per jail).
    // Root keeps a few capabilities only inside a user namespace of its own range.
    let own_range = userns.is_some();
    let started = finish_jail(spec, userns)
        .and_then(|()| block(&handled))
        .and_then(|()| harden(filters, own_range))
        .and_then(|()| start_agent(spec, &agent));
    let agent_pid = match started {
        Ok(pid) => pid,
        Err(err) => {
            eprintln!("space-jail init: {err}");
            send_status(&err.to_event());
            return 1;
        }
    };
    drop(agent);
    send_status(&StatusEvent::Ready {
        pid_in_jail: agent_pid.as_raw(),
    });
    detach_status_pipe();
    reap_until_agent_exits(agent_pid, &handled)
}

fn block(set: &SigSet) -> Result<(), JailError> {
    // Blocked signals are queued even for a namespace init (unblocked ones with the
    // default action would be dropped), and `sigwait` picks them up in order.
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(set), None)
        .map_err(|e| JailError::new("block signals", e.to_string()))
}

/// `/proc` for this PID namespace, the switch into the overlay root, hostname and
/// loopback; then, as the sandbox's root when it has a user namespace, the homes and
/// `/etc` (only now: no host path is reachable any more, see
/// [`rootfs::finish_inside`]).
fn finish_jail(spec: &JailSpec, userns: Option<OwnedFd>) -> Result<(), JailError> {
    // Nothing of the workload may read or write this process's memory or
    // descriptors through /proc or ptrace, even under the same uid.
    sys::set_not_dumpable().map_err(|e| JailError::new("not dumpable", e.to_string()))?;
    let root = &spec.root_dir;
    // Mounted by PID 1 so that it shows this PID namespace, not the host's.
    mount(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| JailError::new("mount /proc", e.to_string()))?;
    protect_proc(&root.join("proc"))?;
    chdir(root).map_err(|e| JailError::new("chdir root", e.to_string()))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; detaching it
    // right away leaves no path back to the host's filesystem.
    pivot_root(".", ".").map_err(|e| JailError::new("pivot_root", e.to_string()))?;
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| JailError::new("detach old root", e.to_string()))?;
    chdir("/").map_err(|e| JailError::new("chdir /", e.to_string()))?;
    sethostname(&spec.hostname).map_err(|e| JailError::new("sethostname", e.to_string()))?;
    sys::bring_up_loopback().map_err(|e| JailError::new("loopback up", e.to_string()))?;
    if let Some(ns) = userns {
        userns::enter(&ns).map_err(|e| JailError::new("enter user namespace", e.to_string()))?;
        // Entering a namespace makes the process dumpable again.
        sys::set_not_dumpable().map_err(|e| JailError::new("not dumpable", e.to_string()))?;
    }
    rootfs::finish_inside(&spec.hostname, spec.rootless.is_some(), spec.accounts)
}

/// `/proc` entries that reach the host kernel. The agent is uid 0 without
/// capabilities over the host, and several of these check only file permissions: writing
/// `sysrq-trigger` reboots the host, `sys/kernel/core_pattern` runs a host program.
/// As in Docker's default: read-only where reading is harmless, hidden otherwise.
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
const PROC_HIDDEN_FILES: &[&str] = &[
    "kcore",
    "keys",
    "kmsg",
    "kallsyms",
    "timer_list",
    "sched_debug",
    "latency_stats",
];
const PROC_HIDDEN_DIRS: &[&str] = &["acpi", "scsi"];

fn protect_proc(proc: &std::path::Path) -> Result<(), JailError> {
    let fail = |what: &str, e: Errno| JailError::new("protect /proc", format!("{what}: {e}"));
    for name in PROC_READ_ONLY {
        let path = proc.join(name);
        if !path.exists() {
            continue;
        }
        mount(
            Some(&path),
            &path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| fail(name, e))?;
        let ro = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC;
        mount(None::<&str>, &path, None::<&str>, ro, None::<&str>).map_err(|e| fail(name, e))?;
    }
    for name in PROC_HIDDEN_FILES {
        let path = proc.join(name);
        if path.exists() {
            mount(
                Some("/dev/null"),
                &path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| fail(name, e))?;
        }
    }
    for name in PROC_HIDDEN_DIRS {
        let path = proc.join(name);
        if path.exists() {
            mount(
                Some("tmpfs"),
                &path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY,
                Some("size=0"),
            )
            .map_err(|e| fail(name, e))?;
        }
    }
    Ok(())
}

/// The capabilities the sandbox's root keeps when the jail has a user namespace of
/// its own range (the default as root), and why. They act only within that
/// namespace: on the sandbox's own processes, and on files whose owner and group are
/// ids of its range (`capable_wrt_inode_uidgid`); nothing of the host is owned by
/// those ids, the template layers are read-only mounts, and the other namespaces
/// (mount, network, PID, UTS, IPC) belong to the host's namespace, so none of these
/// reaches them. Everything else stays dropped (bounding set included), with
/// `no_new_privs`: a process that switched to another account cannot get any back
/// (setuid binaries and file capabilities grant nothing). Without a namespace of its
/// own (`--no-userns`: host root; rootless: only root is mapped) nothing is kept.
/// Entries: name, number (`linux/capability.h`), why.
pub const SANDBOX_ROOT_CAPABILITIES: &[(&str, u32, &str)] = &[
    (
        "CAP_CHOWN",
        0,
        "give a file to an account of the sandbox (`chown user`)",
    ),
    (
        "CAP_DAC_OVERRIDE",
        1,
        "root reads and writes the accounts' files (uploads into /home/user)",
    ),
    (
        "CAP_FOWNER",
        3,
        "root changes modes and times of the accounts' files",
    ),
    (
        "CAP_KILL",
        5,
        "the agent signals and times out processes it started as another account",
    ),
    (
        "CAP_SETGID",
        6,
        "switch groups: exec as a user, `setpriv`, `su`",
    ),
    (
        "CAP_SETUID",
        7,
        "switch to another account: exec as a user, `setpriv`, `su`",
    ),
];

/// no_new_privs, the capabilities (none, or [`SANDBOX_ROOT_CAPABILITIES`] in a user
/// namespace of the sandbox's own range), the seccomp profile: the same for init and
/// agent.
fn harden(filters: &[BpfProgram], own_range: bool) -> Result<(), JailError> {
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| JailError::new("no_new_privs", e.to_string()))?;
    let keep: Vec<u32> = if own_range {
        SANDBOX_ROOT_CAPABILITIES.iter().map(|c| c.1).collect()
    } else {
        Vec::new()
    };
    sys::keep_only_capabilities(&keep)
        .map_err(|e| JailError::new("drop capabilities", e.to_string()))?;
    seccomp_profile::install(filters).map_err(|e| JailError::new("install seccomp", e.to_string()))
}

fn cstring(stage: &str, bytes: &[u8]) -> Result<CString, JailError> {
    CString::new(bytes).map_err(|_| JailError::new(stage, "contains a NUL byte"))
}

fn agent_argv(spec: &JailSpec) -> Result<Vec<CString>, JailError> {
    let name = spec
        .agent
        .path
        .file_name()
        .map(|n| n.as_bytes())
        .unwrap_or(b"agent");
    let mut argv = vec![cstring("agent argv", name)?];
    for arg in &spec.agent.args {
        argv.push(cstring("agent argv", arg.as_bytes())?);
    }
    Ok(argv)
}

fn agent_env(spec: &JailSpec) -> Result<Vec<CString>, JailError> {
    let mut vars: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), "/root".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("HOSTNAME".into(), spec.hostname.clone()),
    ];
    for (key, value) in &spec.agent.env {
        if key.is_empty() || key.contains('=') {
            return Err(JailError::new(
                "agent env",
                format!("invalid variable name {key:?}"),
            ));
        }
        vars.retain(|(k, _)| k != key);
        vars.push((key.clone(), value.clone()));
    }
    vars.iter()
        .map(|(k, v)| cstring("agent env", format!("{k}={v}").as_bytes()))
        .collect()
}

/// Forks and execs the agent; returns its PID once `execveat` succeeded (the
/// close-on-exec pipe closes without a word) or the reason it did not.
fn start_agent(spec: &JailSpec, agent: &OwnedFd) -> Result<Pid, JailError> {
    let argv = agent_argv(spec)?;
    let env = agent_env(spec)?;
    let cwd = spec.agent.cwd.clone();
    let (confirm_read, confirm_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| JailError::new("exec pipe", e.to_string()))?;
    match sys::fork().map_err(|e| JailError::new("fork agent", e.to_string()))? {
        Forked::Child => {
            drop(confirm_read);
            let err = exec_agent(agent, &argv, &env, &cwd);
            let mut confirm = File::from(confirm_write);
            let _ = std::io::Write::write_all(&mut confirm, err.to_string().as_bytes());
            sys::exit_now(127)
        }
        Forked::Parent(pid) => {
            drop(confirm_write);
            let pid = Pid::from_raw(pid);
            // The agent now owns the listener and the activation pipe.
            for fd in [LISTEN_FD, ACTIVATION_FD] {
                drop(sys::take_inherited_fd(fd));
            }
            let mut failure = String::new();
            let _ = File::from(confirm_read).read_to_string(&mut failure);
            if failure.is_empty() {
                Ok(pid)
            } else {
                let _ = waitpid(pid, None);
                Err(JailError::new("start agent", failure))
            }
        }
    }
}

/// In the agent's child (already hardened by the init): calling convention, exec. Returns only on
/// failure.
fn exec_agent(
    agent: &OwnedFd,
    argv: &[CString],
    env: &[CString],
    cwd: &std::path::Path,
) -> JailError {
    let prepared = (|| {
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
            .map_err(|e| JailError::new("unblock signals", e.to_string()))?;
        setsid().map_err(|e| JailError::new("setsid", e.to_string()))?;
        let listener = sys::take_inherited_fd(LISTEN_FD)
            .ok_or_else(|| JailError::new("listener", "fd 3 is not open"))?;
        // listen() again from the agent's own process: a connecting peer's
        // SO_PEERCRED/SO_PEERPIDFD then name the agent, not the worker that bound.
        listen(&listener, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))
            .map_err(|e| JailError::new("listen on fd 3", e.to_string()))?;
        std::mem::forget(listener);
        if sys::take_inherited_fd(ACTIVATION_FD)
            .map(std::mem::forget)
            .is_none()
        {
            return Err(JailError::new("activation", "fd 4 is not open"));
        }
        let null =
            File::open("/dev/null").map_err(|e| JailError::new("open /dev/null", e.to_string()))?;
        sys::dup2(null.as_fd(), 0).map_err(|e| JailError::new("stdin", e.to_string()))?;
        let stderr = std::io::stderr();
        sys::dup2(stderr.as_fd(), 1).map_err(|e| JailError::new("stdout", e.to_string()))?;
        chdir(cwd).map_err(|e| JailError::new("agent cwd", format!("{}: {e}", cwd.display())))?;
        sys::cloexec_from(5).map_err(|e| JailError::new("close descriptors", e.to_string()))?;
        Ok(())
    })();
    match prepared {
        Err(err) => err,
        Ok(()) => JailError::new(
            "exec agent",
            sys::exec_fd(agent.as_fd(), argv, env).to_string(),
        ),
    }
}

/// Points fd 1 at /dev/null: the worker reads the status pipe to EOF, which it
/// sees once the init and the launcher have both let go of it.
fn detach_status_pipe() {
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        let _ = sys::dup2(null.as_fd(), 1);
    }
}

fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

fn reap_until_agent_exits(agent: Pid, handled: &SigSet) -> i32 {
    loop {
        let Ok(signal) = handled.wait() else { continue };
        if signal != Signal::SIGCHLD {
            let _ = kill(agent, signal);
            continue;
        }
        // SIGCHLDs coalesce: reap everything that has exited, not just one.
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(status) if status.pid() == Some(agent) => {
                    if let Some(code) = exit_code(status) {
                        return code;
                    }
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => break,
            }
        }
    }
}
