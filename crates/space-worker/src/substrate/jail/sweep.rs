//! The startup sweep: what a crashed worker left behind under its data dir.
//!
//! A restarted worker does not adopt the old jails (their bridges and records of
//! in-flight work are gone; the next execution starts from the kept layer), so
//! every process in the data dir's sandbox cgroups is killed and every such cgroup
//! removed. Sandbox directories (the writable layers) named in the keep-list stay;
//! the others, stale sockets, stale mounts and half-built templates go.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

use super::cgroup::CgroupHierarchy;
use super::reap_children_of_this_process;
use crate::substrate::{ExecutionKey, SubstrateError};

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Processes killed in leftover cgroups.
    pub killed_processes: usize,
    /// Sandbox cgroup sets removed.
    pub removed_cgroups: usize,
    /// Mounts under the data dir detached.
    pub unmounted: usize,
    /// Sandbox and run directories removed.
    pub removed_dirs: usize,
}

fn entries(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    match fs::read_dir(dir) {
        Ok(read) => Ok(read
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok().map(|n| (n, e.path())))
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Decodes the octal escapes (`\040` for a space) of a mountinfo path.
fn unescape_mount_path(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Mount points at or below `dir` in `mountinfo` text, deepest first.
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Sweeps `data_dir`: kills and removes the cgroups of every sandbox directory
/// found there, detaches mounts below it, and removes sandbox and run directories
/// except those of `keep` (whose sockets are still removed: their processes are
/// gone).
pub fn sweep_leftovers(
    hierarchy: &CgroupHierarchy,
    cgroup_parent: &str,
    data_dir: &Path,
    keep: &[ExecutionKey],
) -> Result<SweepReport, SubstrateError> {
    let mut report = SweepReport::default();
    let data_dir = match data_dir.canonicalize() {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(SubstrateError::io("resolve data dir", e)),
    };
    let sandboxes = entries(&data_dir.join("sandboxes"))
        .map_err(|e| SubstrateError::io("list sandboxes", e))?;

    // Cgroups are named like the sandbox dirs, which launch creates first and
    // destroy removes last: every leftover cgroup of this data dir has its dir.
    for (name, _) in &sandboxes {
        let set = hierarchy.set_for(cgroup_parent, name);
        if !set.exists() {
            continue;
        }
        let pids = set.procs()?;
        report.killed_processes += set.kill_all()?;
        reap_children_of_this_process(&pids);
        set.wait_empty()?;
        set.remove()?;
        report.removed_cgroups += 1;
    }

    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| SubstrateError::io("read mountinfo", e))?;
    for mount_point in mounts_under(&mountinfo, &data_dir) {
        if mount_point == data_dir {
            continue;
        }
        if umount2(&mount_point, MntFlags::MNT_DETACH).is_ok() {
            report.unmounted += 1;
        }
    }

    let kept_dirs: HashSet<String> = keep.iter().map(ExecutionKey::dir_name).collect();
    let kept_sandboxes: HashSet<&str> = keep.iter().map(|k| k.sandbox_id.as_str()).collect();
    for (name, path) in sandboxes {
        if !kept_dirs.contains(&name) {
            fs::remove_dir_all(&path)
                .map_err(|e| SubstrateError::io(format!("remove {}", path.display()), e))?;
            report.removed_dirs += 1;
        }
    }
    let runs = entries(&data_dir.join("run")).map_err(|e| SubstrateError::io("list run", e))?;
    for (name, path) in runs {
        if kept_sandboxes.contains(name.as_str()) {
            let _ = fs::remove_file(path.join("agent.sock"));
        } else {
            fs::remove_dir_all(&path)
                .map_err(|e| SubstrateError::io(format!("remove {}", path.display()), e))?;
            report.removed_dirs += 1;
        }
    }
    for (name, path) in entries(&data_dir.join("templates")).unwrap_or_default() {
        if name.starts_with(".default.") {
            let _ = fs::remove_dir_all(path);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_below_the_data_dir_are_found_deepest_first() {
        let info = "\
22 1 8:1 / / rw - ext4 /dev/vda rw
40 22 0:50 / /data/sandboxes/a.1/root rw - overlay overlay rw
41 40 0:51 / /data/sandboxes/a.1/root/tmp rw - tmpfs tmpfs rw
42 22 0:52 / /data2/x rw - tmpfs tmpfs rw
43 22 0:53 / /data/with\\040space rw - tmpfs tmpfs rw
";
        let found = mounts_under(info, Path::new("/data"));
        assert_eq!(
            found,
            [
                PathBuf::from("/data/sandboxes/a.1/root/tmp"),
                PathBuf::from("/data/sandboxes/a.1/root"),
                PathBuf::from("/data/with space"),
            ]
        );
    }
}
