//! Jails launched ahead of demand ("warm"), activated when a sandbox needs one.
//!
//! A warm jail is complete — namespaces, overlay root with an empty writable layer,
//! cgroups with its limits, the agent running — except for its identity: the agent
//! blocks reading its activation record, and directories and cgroups carry a
//! placeholder key `warm_<random>.<random>`. Activation gives it an execution:
//! the sandbox directory and cgroups are renamed to the execution's key, the hostname
//! is set inside the jail's UTS namespace, and the activation record is written.
//! Only then does the agent answer anything, so a warm jail never serves a request
//! under any identity before it has one.
//!
//! The agent's socket keeps the path it was bound at (`run/warm_<random>/agent.sock`,
//! recorded in the handle): the bridge checks the kernel's socket table by that path.
//! A warm jail no record names is a leftover for the startup sweep.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, RenameFlags, renameat_with};
use space_jail::spec::MAX_ACTIVATION_BYTES;

use super::{JailDriver, LaunchCleanup, Layout};
use crate::substrate::process::ProcessIdentity;
use crate::substrate::{
    AgentCommand, ExecutionKey, LaunchSpec, Limits, SandboxHandle, Substrate, SubstrateError,
    TemplateSpec,
};

/// Prefix of a warm jail's placeholder sandbox ID.
pub const WARM_PREFIX: &str = "warm_";

/// A jail whose agent runs and waits for its activation record.
#[derive(Debug)]
pub struct WarmJail {
    handle: SandboxHandle,
    activation: File,
    data_dir: PathBuf,
    limits: Limits,
}

impl WarmJail {
    /// Its limits (fixed at launch: the tmpfs size and, rootless, the rlimits).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The handle under the placeholder key (agent, socket, init).
    pub fn handle(&self) -> &SandboxHandle {
        &self.handle
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn placeholder_key() -> Result<ExecutionKey, SubstrateError> {
    let mut raw = [0u8; 16];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| SubstrateError::io("getrandom", e.into()))?;
    Ok(ExecutionKey::new(
        format!("{WARM_PREFIX}{}", hex(&raw[..8])),
        hex(&raw[8..]),
    ))
}

/// Whether `name` is a valid hostname for a jail (what `space-jail` accepts).
fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

fn rename_noreplace(from: &Path, to: &Path) -> Result<(), SubstrateError> {
    renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE).map_err(|e| {
        SubstrateError::io(
            format!("rename {} to {}", from.display(), to.display()),
            e.into(),
        )
    })
}

/// Renames a cgroup directory. cgroupfs takes no rename flags, but it never replaces:
/// renaming onto an existing cgroup fails with `EEXIST`.
fn rename_cgroup(from: &Path, to: &Path) -> Result<(), SubstrateError> {
    std::fs::rename(from, to).map_err(|e| SubstrateError::Cgroup {
        path: from.to_path_buf(),
        source: e,
    })
}

/// Sets the hostname inside the UTS namespace of `init`, from a short-lived thread
/// (entering a namespace changes only the calling thread, which then exits).
fn set_hostname_of(init: &ProcessIdentity, name: &str) -> Result<(), SubstrateError> {
    let pid = rustix::process::Pid::from_raw(init.pid).ok_or(SubstrateError::NotRunning)?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|_| SubstrateError::NotRunning)?;
    // The pidfd names the process from here on; check it is still the recorded one.
    if !init.is_alive() {
        return Err(SubstrateError::NotRunning);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&pidfd, nix::sched::CloneFlags::CLONE_NEWUTS)
                    .and_then(|()| nix::unistd::sethostname(name))
                    .map_err(|e| SubstrateError::io("set the jail's hostname", e.into()))
            })
            .join()
            .unwrap_or_else(|_| {
                Err(SubstrateError::io(
                    "set the jail's hostname",
                    std::io::Error::other("thread panicked"),
                ))
            })
    })
}

impl JailDriver {
    /// Launches a warm jail of the default template with `limits` and `agent`. Needs
    /// root: activation sets the hostname inside the jail, which a rootless worker
    /// cannot do.
    pub fn prelaunch(
        &self,
        data_dir: &Path,
        limits: Limits,
        agent: AgentCommand,
    ) -> Result<WarmJail, SubstrateError> {
        if self.rootless {
            return Err(SubstrateError::Unsupported(
                "warm jails need root (activation sets the hostname inside the jail)".into(),
            ));
        }
        let spec = LaunchSpec {
            key: placeholder_key()?,
            data_dir: data_dir.to_path_buf(),
            template: TemplateSpec::Default,
            limits,
            agent,
            activation: Vec::new(),
            hostname: None,
            initial_upper: None,
        };
        Self::validate(&spec)?;
        std::fs::create_dir_all(&spec.data_dir).map_err(super::io_err("create data dir"))?;
        let data_dir = spec
            .data_dir
            .canonicalize()
            .map_err(super::io_err("resolve data dir"))?;
        let spec = LaunchSpec {
            data_dir: data_dir.clone(),
            ..spec
        };
        let layout = Layout::new(&spec.data_dir, &spec.key);
        let mut cleanup = LaunchCleanup::default();
        let (handle, activation) = self.launch_inner(&spec, &layout, &mut cleanup, true)?;
        let activation = activation.ok_or_else(|| SubstrateError::Jail {
            stage: "warm".into(),
            message: "no activation pipe".into(),
        })?;
        cleanup.disarm();
        tracing::debug!(key = %spec.key.dir_name(), init = handle.init.pid, "warm jail launched");
        Ok(WarmJail {
            handle,
            activation,
            data_dir,
            limits,
        })
    }

    /// Gives `warm` the execution `key`: renames its directory and cgroups, sets
    /// `hostname` (default: the sandbox ID with `_` mapped to `-`), then writes the
    /// activation record. On failure the warm jail is destroyed and nothing of it is
    /// left.
    pub fn activate(
        &self,
        warm: WarmJail,
        key: &ExecutionKey,
        activation: &[u8],
        hostname: Option<&str>,
    ) -> Result<SandboxHandle, SubstrateError> {
        let WarmJail {
            handle,
            activation: mut pipe,
            data_dir,
            ..
        } = warm;
        let mut handle = handle;
        let result = if activation.len() > MAX_ACTIVATION_BYTES {
            Err(SubstrateError::InvalidSpec(format!(
                "activation is {} bytes, at most {MAX_ACTIVATION_BYTES}",
                activation.len()
            )))
        } else {
            self.activate_inner(&mut handle, &data_dir, key, hostname)
        };
        let result = result.and_then(|()| {
            // The agent answers nothing before this: it is blocked reading it.
            pipe.write_all(activation)
                .map_err(super::io_err("write activation"))
        });
        drop(pipe);
        match result {
            Ok(()) => Ok(handle),
            Err(e) => {
                // Whatever names it has now, the handle has them.
                let _ = self.destroy(&handle);
                Err(e)
            }
        }
    }

    fn activate_inner(
        &self,
        handle: &mut SandboxHandle,
        data_dir: &Path,
        key: &ExecutionKey,
        hostname: Option<&str>,
    ) -> Result<(), SubstrateError> {
        key.validate()?;
        let name = hostname
            .map(str::to_owned)
            .unwrap_or_else(|| key.sandbox_id.replace('_', "-"));
        if !valid_hostname(&name) {
            return Err(SubstrateError::InvalidSpec(format!(
                "hostname {name:?} must be 1-64 of [A-Za-z0-9.-]"
            )));
        }
        if !handle.init.is_alive() {
            return Err(SubstrateError::NotRunning);
        }
        let layout = Layout::new(data_dir, key);
        rename_noreplace(&handle.sandbox_dir, &layout.sandbox_dir)?;
        handle.sandbox_dir = layout.sandbox_dir;
        handle.upper_dir = layout.upper;
        handle.log_path = layout.log;
        let renamed = self
            .hierarchy
            .set_for(&self.config.cgroup_parent, &key.dir_name());
        let pairs: Vec<(PathBuf, PathBuf)> = handle
            .cgroups
            .dirs()
            .into_iter()
            .map(Path::to_path_buf)
            .zip(renamed.dirs().into_iter().map(Path::to_path_buf))
            .collect();
        for (i, (from, to)) in pairs.iter().enumerate() {
            if let Err(e) = rename_cgroup(from, to) {
                // Back to the names the handle still records.
                for (from, to) in pairs[..i].iter().rev() {
                    let _ = rename_cgroup(to, from);
                }
                return Err(e);
            }
        }
        handle.cgroups = renamed;
        handle.key = key.clone();
        set_hostname_of(&handle.init, &name)
    }

    /// Destroys a warm jail that will not be used.
    pub fn discard(&self, warm: WarmJail) {
        let WarmJail {
            handle, activation, ..
        } = warm;
        drop(activation);
        if let Err(e) = self.destroy(&handle) {
            tracing::warn!(key = %handle.key.dir_name(), error = %e, "destroying a warm jail failed");
        }
    }
}
