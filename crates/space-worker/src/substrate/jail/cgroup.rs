//! Per-sandbox cgroups: limits (memory, pids, CPU), the freezer for pause and
//! for killing without races, and statistics. Supports cgroup v1 (one hierarchy
//! per controller) and v2 (one unified hierarchy), detected at runtime.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::substrate::{Limits, SubstrateError};

/// CFS period used for CPU quotas (the kernel default).
const CPU_PERIOD_US: u64 = 100_000;

/// How long to wait for a freeze, a thaw or an emptied cgroup before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one freeze attempt may stay in FREEZING. A task waiting for its
/// `vfork` child (as `posix_spawn` does) cannot be frozen while that child is
/// frozen before its `exec`; the freeze then never completes, so it is undone and
/// retried, letting the spawn finish in between.
const FREEZE_ATTEMPT: Duration = Duration::from_millis(50);

/// The cgroup hierarchies of this machine, found in `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupHierarchy {
    /// Controllers mounted separately (`/sys/fs/cgroup/memory`, …).
    V1 {
        /// Mount point of the memory controller.
        memory: PathBuf,
        /// Mount point of the pids controller.
        pids: PathBuf,
        /// Mount point of the freezer controller.
        freezer: PathBuf,
        /// Mount point of the cpu controller, when mounted.
        cpu: Option<PathBuf>,
        /// Mount point of the cpuacct controller, when mounted (may equal `cpu`).
        cpuacct: Option<PathBuf>,
    },
    /// The unified hierarchy with memory and pids enabled.
    V2 {
        /// Its mount point.
        root: PathBuf,
    },
}

/// One sandbox's cgroups: where they are, and what can be done with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "snake_case")]
pub enum CgroupSet {
    /// cgroup v1: one directory per controller.
    V1 {
        /// `memory/<parent>/<name>`.
        memory: PathBuf,
        /// `pids/<parent>/<name>`.
        pids: PathBuf,
        /// `freezer/<parent>/<name>`.
        freezer: PathBuf,
        /// `cpu/<parent>/<name>`, when the controller is mounted.
        cpu: Option<PathBuf>,
        /// `cpuacct/<parent>/<name>`, when mounted separately from cpu.
        cpuacct: Option<PathBuf>,
    },
    /// cgroup v2: one directory.
    V2 {
        /// `<root>/<parent>/<name>`.
        dir: PathBuf,
    },
    /// No cgroups: a rootless jail on a host that delegates none to the worker's
    /// user. Limits are rlimits set by `space-jail`; there is no freezer, and the
    /// driver ends the jail by killing its init (which takes the PID namespace down).
    None,
}

fn no_freezer() -> SubstrateError {
    SubstrateError::Unsupported(
        "pause needs a cgroup freezer, which this rootless jail has not".into(),
    )
}

/// Resource usage read from a sandbox's cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Memory charged to the sandbox, bytes.
    pub memory_bytes: u64,
    /// Number of tasks (threads included).
    pub pids: u64,
    /// CPU time used, nanoseconds.
    pub cpu_usage_ns: u64,
    /// Times the OOM killer killed a process inside the sandbox.
    pub oom_kills: u64,
    /// Whether the sandbox is frozen.
    pub frozen: bool,
}

fn cg_err(path: &Path, err: io::Error) -> SubstrateError {
    SubstrateError::Cgroup {
        path: path.to_path_buf(),
        source: err,
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), SubstrateError> {
    fs::write(path, value).map_err(|e| cg_err(path, e))
}

fn read_file(path: &Path) -> Result<String, SubstrateError> {
    fs::read_to_string(path).map_err(|e| cg_err(path, e))
}

fn read_u64(path: &Path) -> Result<u64, SubstrateError> {
    let text = read_file(path)?;
    let text = text.trim();
    if text == "max" {
        return Ok(u64::MAX);
    }
    text.parse().map_err(|_| {
        cg_err(
            path,
            io::Error::new(io::ErrorKind::InvalidData, format!("not a number: {text}")),
        )
    })
}

/// Value of `key` in a flat keyed file (`memory.events`, `cpu.stat`, `oom_control`).
fn keyed_u64(path: &Path, key: &str) -> Result<u64, SubstrateError> {
    let text = read_file(path)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0))
}

/// Mount points of cgroup filesystems: (fstype, mount point, super options).
fn cgroup_mounts(mountinfo: &str) -> Vec<(String, PathBuf, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("");
            fstype.starts_with("cgroup").then(|| {
                (
                    fstype.to_owned(),
                    PathBuf::from(mount_point.replace("\\040", " ")),
                    options.to_owned(),
                )
            })
        })
        .collect()
}

impl CgroupHierarchy {
    /// Finds the hierarchies of this machine: v2 when its unified hierarchy offers
    /// memory and pids, else v1 when memory, pids and freezer are mounted.
    pub fn detect() -> Result<Self, SubstrateError> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| cg_err(Path::new("/proc/self/mountinfo"), e))?;
        Self::from_mountinfo(&mountinfo, |p| fs::read_to_string(p).ok())
    }

    /// [`CgroupHierarchy::detect`] on given mountinfo text; `read` reads a file
    /// (the unified root's `cgroup.controllers`).
    pub fn from_mountinfo(
        mountinfo: &str,
        read: impl Fn(&Path) -> Option<String>,
    ) -> Result<Self, SubstrateError> {
        let mounts = cgroup_mounts(mountinfo);
        for (fstype, mount_point, _) in &mounts {
            if fstype != "cgroup2" {
                continue;
            }
            let controllers = read(&mount_point.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                return Ok(Self::V2 {
                    root: mount_point.clone(),
                });
            }
        }
        let v1 = |controller: &str| {
            mounts
                .iter()
                .find(|(fstype, _, options)| {
                    fstype == "cgroup" && options.split(',').any(|o| o == controller)
                })
                .map(|(_, mount_point, _)| mount_point.clone())
        };
        match (v1("memory"), v1("pids"), v1("freezer")) {
            (Some(memory), Some(pids), Some(freezer)) => Ok(Self::V1 {
                memory,
                pids,
                freezer,
                cpu: v1("cpu"),
                cpuacct: v1("cpuacct"),
            }),
            _ => Err(SubstrateError::Unsupported(
                "no cgroup v2 hierarchy with memory+pids and no cgroup v1 memory, pids and freezer mounts"
                    .into(),
            )),
        }
    }

    /// The cgroup set a sandbox named `name` has (or would have) under `parent`,
    /// without creating anything.
    pub fn set_for(&self, parent: &str, name: &str) -> CgroupSet {
        let at = |mount: &Path| mount.join(parent).join(name);
        match self {
            Self::V1 {
                memory,
                pids,
                freezer,
                cpu,
                cpuacct,
            } => CgroupSet::V1 {
                memory: at(memory),
                pids: at(pids),
                freezer: at(freezer),
                cpu: cpu.as_deref().map(at),
                // A combined cpu,cpuacct mount is one directory: list it once.
                cpuacct: cpuacct
                    .as_deref()
                    .filter(|a| Some(*a) != cpu.as_deref())
                    .map(at),
            },
            Self::V2 { root } => CgroupSet::V2 { dir: at(root) },
        }
    }

    /// Directories holding the sandboxes' cgroups (`<mount>/<parent>`), one per
    /// hierarchy.
    pub fn parent_dirs(&self, parent: &str) -> Vec<PathBuf> {
        match self {
            Self::V1 {
                memory,
                pids,
                freezer,
                cpu,
                cpuacct,
            } => {
                let mut dirs = vec![memory.join(parent), pids.join(parent), freezer.join(parent)];
                for mount in [cpu, cpuacct].into_iter().flatten() {
                    let dir = mount.join(parent);
                    if !dirs.contains(&dir) {
                        dirs.push(dir);
                    }
                }
                dirs
            }
            Self::V2 { root } => vec![root.join(parent)],
        }
    }

    /// Creates a sandbox's cgroups with its limits. On failure nothing is left.
    ///
    /// A parent emptied and removed by someone else while this runs (the last sandbox
    /// of another process under the same parent going, a sweep) fails a mkdir or a
    /// write with ENOENT: the whole creation is done again, a few times.
    pub fn create(
        &self,
        parent: &str,
        name: &str,
        limits: &Limits,
    ) -> Result<CgroupSet, SubstrateError> {
        let mut tries = 0;
        loop {
            match self.create_once(parent, name, limits) {
                Err(SubstrateError::Cgroup { ref source, .. })
                    if source.kind() == io::ErrorKind::NotFound && tries < 3 =>
                {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    fn create_once(
        &self,
        parent: &str,
        name: &str,
        limits: &Limits,
    ) -> Result<CgroupSet, SubstrateError> {
        if let Self::V2 { root } = self {
            enable_v2_controllers(root, &root.join(parent))?;
        }
        let set = self.set_for(parent, name);
        let made = set
            .dirs()
            .iter()
            .try_for_each(|dir| fs::create_dir_all(dir).map_err(|e| cg_err(dir, e)));
        if let Err(err) = made.and_then(|()| set.apply_limits(limits)) {
            let _ = set.remove();
            return Err(err);
        }
        Ok(set)
    }
}

/// Enables memory, pids and cpu for the children of the root and of the parent.
fn enable_v2_controllers(root: &Path, parent: &Path) -> Result<(), SubstrateError> {
    fs::create_dir_all(parent).map_err(|e| cg_err(parent, e))?;
    let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["memory", "pids", "cpu"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    for dir in [root, parent] {
        let control = dir.join("cgroup.subtree_control");
        let enabled = fs::read_to_string(&control).unwrap_or_default();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|w| !enabled.split_whitespace().any(|e| e == &w[1..]))
            .collect();
        if !missing.is_empty() {
            let line = missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            write_file(&control, &line)?;
        }
    }
    Ok(())
}

impl CgroupSet {
    /// The `cgroup.procs` of every directory of the set, open for writing: for a child
    /// to join the set before `exec` ([`super::spawn::join_cgroup`]), through
    /// descriptors opened while the worker's privileges hold.
    pub fn procs_files(&self) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
        use std::os::unix::fs::OpenOptionsExt as _;
        self.dirs()
            .iter()
            .map(|d| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(d.join("cgroup.procs"))
                    .map(std::os::fd::OwnedFd::from)
            })
            .collect()
    }

    /// Every directory of the set.
    pub fn dirs(&self) -> Vec<&Path> {
        match self {
            Self::V1 {
                memory,
                pids,
                freezer,
                cpu,
                cpuacct,
            } => {
                let mut dirs = vec![memory.as_path(), pids.as_path(), freezer.as_path()];
                dirs.extend(cpu.as_deref());
                dirs.extend(cpuacct.as_deref());
                dirs
            }
            Self::V2 { dir } => vec![dir.as_path()],
            Self::None => Vec::new(),
        }
    }

    /// Whether any directory of the set exists.
    pub fn exists(&self) -> bool {
        self.dirs().iter().any(|d| d.exists())
    }

    fn apply_limits(&self, limits: &Limits) -> Result<(), SubstrateError> {
        match self {
            Self::V1 {
                memory, pids, cpu, ..
            } => {
                if let Some(bytes) = limits.memory_bytes {
                    write_file(&memory.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    // Without swap accounting the limit can be dodged into swap.
                    let memsw = memory.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &bytes.to_string())?;
                    }
                }
                if let Some(max) = limits.pids_max {
                    write_file(&pids.join("pids.max"), &max.to_string())?;
                }
                if let (Some(millis), Some(cpu)) = (limits.cpu_millis, cpu) {
                    write_file(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    let quota = u64::from(millis) * CPU_PERIOD_US / 1000;
                    write_file(&cpu.join("cpu.cfs_quota_us"), &quota.max(1000).to_string())?;
                }
            }
            Self::V2 { dir } => {
                if let Some(bytes) = limits.memory_bytes {
                    write_file(&dir.join("memory.max"), &bytes.to_string())?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write_file(&swap, "0")?;
                    }
                }
                if let Some(max) = limits.pids_max {
                    write_file(&dir.join("pids.max"), &max.to_string())?;
                }
                if let Some(millis) = limits.cpu_millis {
                    let quota = (u64::from(millis) * CPU_PERIOD_US / 1000).max(1000);
                    write_file(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                }
            }
            Self::None => {}
        }
        Ok(())
    }

    /// Moves `pid` (and, being a process, all its threads) into every cgroup of
    /// the set. Its future children are born inside.
    pub fn add_process(&self, pid: i32) -> Result<(), SubstrateError> {
        self.dirs()
            .iter()
            .try_for_each(|dir| write_file(&dir.join("cgroup.procs"), &pid.to_string()))
    }

    /// PIDs in the sandbox (host PID namespace).
    pub fn procs(&self) -> Result<Vec<i32>, SubstrateError> {
        let dir = match self {
            Self::V1 { freezer, .. } => freezer,
            Self::V2 { dir } => dir,
            Self::None => return Ok(Vec::new()),
        };
        let path = dir.join("cgroup.procs");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(cg_err(&path, e)),
        }
    }

    /// Freezes every process and waits until the kernel reports them frozen,
    /// retrying (thaw, then freeze again) when an attempt is stuck; on failure the
    /// sandbox is left thawed.
    pub fn freeze(&self) -> Result<(), SubstrateError> {
        if matches!(self, Self::None) {
            return Err(no_freezer());
        }
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            self.request_freeze(true)?;
            let attempt = (Instant::now() + FREEZE_ATTEMPT).min(deadline);
            if poll_until(attempt, || self.is_frozen())? {
                return Ok(());
            }
            self.thaw()?;
            if Instant::now() >= deadline {
                return Err(SubstrateError::Timeout(format!(
                    "cgroup {} did not freeze",
                    self.dirs()[0].display()
                )));
            }
            std::thread::yield_now();
        }
    }

    fn request_freeze(&self, frozen: bool) -> Result<(), SubstrateError> {
        match self {
            Self::V1 { freezer, .. } => write_file(
                &freezer.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            ),
            Self::V2 { dir } => {
                write_file(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
            }
            Self::None => Err(no_freezer()),
        }
    }

    fn is_frozen(&self) -> Result<bool, SubstrateError> {
        match self {
            Self::V1 { freezer, .. } => {
                Ok(read_file(&freezer.join("freezer.state"))?.trim() == "FROZEN")
            }
            Self::V2 { dir } => Ok(keyed_u64(&dir.join("cgroup.events"), "frozen")? == 1),
            Self::None => Ok(false),
        }
    }

    /// Thaws every process.
    pub fn thaw(&self) -> Result<(), SubstrateError> {
        match self {
            Self::V1 { freezer, .. } => {
                let state = freezer.join("freezer.state");
                write_file(&state, "THAWED")?;
                wait_until(&state, || Ok(read_file(&state)?.trim() == "THAWED"))
            }
            Self::V2 { dir } => {
                write_file(&dir.join("cgroup.freeze"), "0")?;
                let events = dir.join("cgroup.events");
                wait_until(&events, || Ok(keyed_u64(&events, "frozen")? == 0))
            }
            Self::None => Err(no_freezer()),
        }
    }

    /// Sends SIGKILL to every process of the sandbox; returns how many there
    /// were. Frozen first, so that nothing can fork between reading the list and
    /// the kill; the kill lands as the tasks are thawed. Follow with
    /// [`CgroupSet::wait_empty`] (after reaping any of them that are children of
    /// the caller, or they stay as zombies).
    pub fn kill_all(&self) -> Result<usize, SubstrateError> {
        if !self.exists() {
            return Ok(0);
        }
        if let Self::V2 { dir } = self {
            let kill = dir.join("cgroup.kill");
            if kill.exists() {
                let count = self.procs()?.len();
                write_file(&kill, "1")?;
                return Ok(count);
            }
        }
        // Frozen, nothing can fork between reading the list and the kill. If the
        // freeze cannot complete, kill anyway and repeat until the list is empty:
        // the tasks are bounded by pids.max, so new forks run out.
        let frozen = self.freeze().is_ok();
        let mut killed = HashSet::new();
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let pids = self.procs()?;
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for &pid in &pids {
                // ESRCH only means it is already gone.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::SIGKILL,
                );
                killed.insert(pid);
            }
            if frozen {
                // The kills land as the tasks thaw; what is left is zombies to reap.
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.request_freeze(false)?;
        Ok(killed.len())
    }

    /// Waits until no process is left in the sandbox's cgroups.
    pub fn wait_empty(&self) -> Result<(), SubstrateError> {
        let Some(dir) = self.dirs().first().map(|d| d.to_path_buf()) else {
            return Ok(());
        };
        wait_until(&dir, || Ok(self.procs()?.is_empty()))
    }

    /// Removes every directory of the set (they must be empty of processes).
    pub fn remove(&self) -> Result<(), SubstrateError> {
        for dir in self.dirs() {
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // Exiting tasks leave the cgroup a moment after cgroup.procs empties.
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(cg_err(dir, e)),
                }
            }
        }
        Ok(())
    }

    /// Times the kernel's OOM killer killed a process of the set for its memory limit;
    /// `None` without a memory cgroup (rootless) or when it cannot be read.
    pub fn oom_kills(&self) -> Option<u64> {
        match self {
            Self::V1 { memory, .. } => {
                keyed_u64(&memory.join("memory.oom_control"), "oom_kill").ok()
            }
            Self::V2 { dir } => keyed_u64(&dir.join("memory.events"), "oom_kill").ok(),
            Self::None => None,
        }
    }

    /// The memory limit in force, bytes; `None` when unlimited or unreadable.
    pub fn memory_limit(&self) -> Option<u64> {
        let text = match self {
            Self::V1 { memory, .. } => read_file(&memory.join("memory.limit_in_bytes")).ok()?,
            Self::V2 { dir } => read_file(&dir.join("memory.max")).ok()?,
            Self::None => return None,
        };
        // v1 reports "unlimited" as a huge page-rounded number, v2 as "max".
        text.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62))
    }

    /// Changes the limits of the live set (memory, pids, CPU): a jail launched ahead
    /// with the defaults, handed to a sandbox created with others.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), SubstrateError> {
        self.apply_limits(limits)
    }

    /// Current usage.
    pub fn stats(&self) -> Result<CgroupStats, SubstrateError> {
        match self {
            Self::V1 {
                memory,
                pids,
                freezer,
                cpu,
                cpuacct,
            } => {
                let cpu_usage_ns = match cpuacct.as_ref().or(cpu.as_ref()) {
                    Some(dir) if dir.join("cpuacct.usage").exists() => {
                        read_u64(&dir.join("cpuacct.usage"))?
                    }
                    _ => 0,
                };
                Ok(CgroupStats {
                    memory_bytes: read_u64(&memory.join("memory.usage_in_bytes"))?,
                    pids: read_u64(&pids.join("pids.current"))?,
                    cpu_usage_ns,
                    oom_kills: keyed_u64(&memory.join("memory.oom_control"), "oom_kill")?,
                    frozen: read_file(&freezer.join("freezer.state"))?.trim() == "FROZEN",
                })
            }
            Self::V2 { dir } => Ok(CgroupStats {
                memory_bytes: read_u64(&dir.join("memory.current"))?,
                pids: read_u64(&dir.join("pids.current"))?,
                cpu_usage_ns: keyed_u64(&dir.join("cpu.stat"), "usage_usec")?.saturating_mul(1000),
                oom_kills: keyed_u64(&dir.join("memory.events"), "oom_kill")?,
                frozen: keyed_u64(&dir.join("cgroup.events"), "frozen")? == 1,
            }),
            Self::None => Ok(CgroupStats::default()),
        }
    }
}

/// Polls `done` until it holds or `deadline` passes; returns whether it held.
/// Spins briefly first (freezing usually takes well under a millisecond), then
/// sleeps in short steps.
fn poll_until(
    deadline: Instant,
    mut done: impl FnMut() -> Result<bool, SubstrateError>,
) -> Result<bool, SubstrateError> {
    let mut polls = 0u32;
    loop {
        if done()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        polls += 1;
        if polls < 50 {
            std::thread::yield_now();
        } else {
            sleep(Duration::from_micros(200));
        }
    }
}

/// Polls `done` until it holds, or fails after [`SETTLE_TIMEOUT`].
fn wait_until(
    what: &Path,
    done: impl FnMut() -> Result<bool, SubstrateError>,
) -> Result<(), SubstrateError> {
    if poll_until(Instant::now() + SETTLE_TIMEOUT, done)? {
        Ok(())
    } else {
        Err(SubstrateError::Timeout(format!(
            "cgroup {} did not settle",
            what.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_layout_without_v2_memory_is_driven_as_v1() {
        let h = CgroupHierarchy::from_mountinfo(HYBRID, |_| Some("cpu io".into())).unwrap();
        let CgroupHierarchy::V1 {
            memory,
            cpu,
            cpuacct,
            ..
        } = &h
        else {
            panic!("{h:?}")
        };
        assert_eq!(memory, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(
            cpuacct.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        let set = h.set_for("space", "sbx.1");
        assert_eq!(set.dirs().len(), 5);
        assert!(
            set.dirs()
                .contains(&Path::new("/sys/fs/cgroup/freezer/space/sbx.1"))
        );
    }

    #[test]
    fn unified_hierarchy_with_memory_and_pids_is_driven_as_v2() {
        let info = "36 30 0:32 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
        let h =
            CgroupHierarchy::from_mountinfo(info, |_| Some("cpu memory pids io".into())).unwrap();
        assert_eq!(
            h,
            CgroupHierarchy::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        assert_eq!(
            h.set_for("space", "a.b"),
            CgroupSet::V2 {
                dir: "/sys/fs/cgroup/space/a.b".into()
            }
        );
    }

    #[test]
    fn combined_cpu_cpuacct_mount_is_listed_once() {
        let info = "\
33 30 0:29 / /c/memory rw - cgroup cgroup rw,memory
34 30 0:30 / /c/freezer rw - cgroup cgroup rw,freezer
35 30 0:31 / /c/pids rw - cgroup cgroup rw,pids
36 30 0:32 / /c/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";
        let h = CgroupHierarchy::from_mountinfo(info, |_| None).unwrap();
        let set = h.set_for("space", "x");
        assert_eq!(set.dirs().len(), 4);
        assert_eq!(h.parent_dirs("space").len(), 4);
    }

    #[test]
    fn machine_without_usable_cgroups_is_refused_with_a_reason() {
        let err = CgroupHierarchy::from_mountinfo("", |_| None).unwrap_err();
        assert!(err.to_string().contains("cgroup"));
    }
}
