//! What the worker tells `space-jail` (the jail spec, JSON on stdin) and what
//! `space-jail` tells the worker back (status events, one JSON line each on stdout).
//!
//! The worker and the jail are built from the same workspace, so these types are
//! the single definition of the protocol between them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest spec the jail accepts on stdin: a spec is a few hundred bytes; anything
/// bigger is a bug or an attack, refused before parsing.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Largest activation payload: it is written into a pipe before the agent starts, so
/// it must fit the pipe's default buffer or the worker would block.
pub const MAX_ACTIVATION_BYTES: usize = 60 * 1024;

/// Everything `space-jail` needs to build one sandbox's jail.
///
/// All host paths are absolute and resolved by the worker; `space-jail` refuses
/// relative ones rather than guessing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JailSpec {
    /// Empty directory on the host where the overlay root is mounted (only inside
    /// the jail's private mount namespace).
    pub root_dir: PathBuf,
    /// Read-only template layers (the overlay's lower dirs), top first: one for the
    /// default template, an image's layers for an image template (at most
    /// [`MAX_LOWER_DIRS`]).
    pub lower_dirs: Vec<PathBuf>,
    /// Per-execution writable layer (the overlay's upper dir).
    pub upper_dir: PathBuf,
    /// Overlay work dir, on the same filesystem as `upper_dir`.
    pub work_dir: PathBuf,
    /// Host directories bound read-only over the overlay (the default template's
    /// `/usr` and friends).
    #[serde(default)]
    pub read_only_binds: Vec<BindMount>,
    /// Hostname inside the UTS namespace.
    pub hostname: String,
    /// Size cap of the private `/tmp` and `/dev/shm` tmpfs, in bytes.
    pub tmpfs_bytes: u64,
    /// The agent to start inside.
    pub agent: AgentSpec,
    /// Set when the worker is not root: `space-jail` then creates a user namespace
    /// itself (mapping root inside to the worker's uid) before the other namespaces,
    /// and limits come from rlimits instead of cgroups.
    #[serde(default)]
    pub rootless: Option<Rootless>,
    /// Set when the worker is root (the default): the sandbox's ids map to a host
    /// range of its own and its layers are idmapped (see `userns`). `None` as root
    /// only behind the worker's explicit `--no-userns`.
    #[serde(default)]
    pub userns: Option<UserNamespace>,
    /// Directories of the read-only binds hidden under an empty read-only tmpfs
    /// (the host's `/usr/local` in the default template).
    #[serde(default)]
    pub masked_dirs: Vec<PathBuf>,
    /// Whose `/etc` accounts the jail keeps: the synthesized ones (`root`, `user`,
    /// `nobody`; the default template) or the image's own `passwd` and `group` (an
    /// image template; synthesized only where the image has none).
    #[serde(default)]
    pub accounts: Accounts,
    /// `RLIMIT_NOFILE` (soft = hard) of the init and everything it starts; `None`
    /// keeps [`DEFAULT_NOFILE`].
    #[serde(default)]
    pub nofile: Option<u64>,
}

/// Most lower dirs a jail stacks (an image's layers; the kernel allows 500).
pub const MAX_LOWER_DIRS: usize = 128;

/// Where the accounts of a jail's `/etc` come from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Accounts {
    /// The platform writes `passwd`, `group` and `nsswitch.conf` (and `/home/user`).
    #[default]
    Synthesized,
    /// The image's own files are kept; written only if the image has no `passwd`.
    Image,
}

/// Open files per process inside a jail unless the spec says otherwise.
pub const DEFAULT_NOFILE: u64 = 4096;

/// The sandbox's user namespace: ids `0 .. count` inside are `host_uid ..` and
/// `host_gid ..` on the host.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct UserNamespace {
    /// First host uid of the range (the sandbox's root).
    pub host_uid: u32,
    /// First host gid of the range.
    pub host_gid: u32,
    /// Size of the range (65536: every id a normal system uses).
    pub count: u32,
}

/// How a jail runs without root.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rootless {
    /// The worker's uid: root inside maps to it.
    pub uid: u32,
    /// The worker's gid: root's group inside maps to it.
    pub gid: u32,
    /// `RLIMIT_NPROC`: counted per user namespace (Linux ≥ 5.14), so per sandbox.
    pub pids_max: Option<u64>,
    /// `RLIMIT_AS` of every process (a per-process cap, not a total).
    pub memory_bytes: Option<u64>,
}

/// One read-only bind mount of a host directory into the jail.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BindMount {
    /// Host path.
    pub source: PathBuf,
    /// Path inside the jail, absolute (e.g. `/usr`).
    pub target: PathBuf,
}

/// The agent command: resolved on the host and opened before `pivot_root`, then
/// executed inside the jail through its file descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentSpec {
    /// Host path of the executable (an ELF; scripts cannot be `fexecve`d from a
    /// close-on-exec descriptor).
    pub path: PathBuf,
    /// `argv[1..]`; `argv[0]` is the file name of `path`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment besides the defaults (`PATH`, `HOME`, `LANG`, `HOSTNAME`), which
    /// these override.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the jail.
    #[serde(default = "default_cwd")]
    pub cwd: PathBuf,
}

fn default_cwd() -> PathBuf {
    PathBuf::from("/root")
}

/// A status line from `space-jail` to the worker (stdout of the jail process).
///
/// The outer process sends [`StatusEvent::Init`] once the init is forked; the init
/// sends [`StatusEvent::Ready`] once the agent is exec'd (or about to be: see
/// [`StatusEvent::Ready`]), then closes the pipe. Any stage may send
/// [`StatusEvent::Error`] instead and exit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StatusEvent {
    /// The init (PID 1 of the new PID namespace) exists; `pid` is its host PID.
    Init {
        /// Host PID of the init.
        pid: i32,
    },
    /// The agent process exists and is past every hardening step; `pid` is its PID
    /// inside the jail's PID namespace. Sent by the init after the agent's child
    /// confirmed (by closing its close-on-exec pipe) that `execveat` succeeded.
    Ready {
        /// PID of the agent inside the jail (normally 2).
        pid_in_jail: i32,
    },
    /// Building the jail failed at `stage`.
    Error {
        /// Which step failed, e.g. `mount overlay`.
        stage: String,
        /// The OS error or reason.
        message: String,
    },
}

impl StatusEvent {
    /// One JSON line, as written on the status pipe.
    pub fn to_line(&self) -> String {
        // Serializing this enum cannot fail: it holds only strings and integers.
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"event":"error","stage":"status","message":"unserializable"}"#.to_owned()
        });
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_events_round_trip_as_tagged_json_lines() {
        let events = [
            StatusEvent::Init { pid: 42 },
            StatusEvent::Ready { pid_in_jail: 2 },
            StatusEvent::Error {
                stage: "mount overlay".into(),
                message: "EINVAL".into(),
            },
        ];
        for event in events {
            let line = event.to_line();
            assert!(line.ends_with('\n'));
            let back: StatusEvent = serde_json::from_str(line.trim_end()).unwrap();
            assert_eq!(back, event);
        }
        assert_eq!(
            StatusEvent::Init { pid: 7 }.to_line(),
            "{\"event\":\"init\",\"pid\":7}\n"
        );
    }

    #[test]
    fn agent_cwd_defaults_to_root_home() {
        let agent: AgentSpec = serde_json::from_str(r#"{"path":"/bin/sh"}"#).unwrap();
        assert_eq!(agent.cwd, PathBuf::from("/root"));
        assert!(agent.args.is_empty());
    }
}
