//! The startup sweep: what a crashed worker left behind under its data dir.
//!
//! A restarted worker passes the executions it keeps (re-adopted, still running);
//! everything else of the data dir goes: the processes in the other sandboxes'
//! cgroups are killed and the cgroups removed, their sandbox and run directories
//! removed, mounts in the worker's namespace below the data dir detached (the
//! jails' own mounts live in their private namespaces, so any such mount is
//! stale), half-built templates removed.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

use super::cgroup::CgroupHierarchy;
use crate::substrate::process::reap_children_of_this_process;
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

/// Sweeps `data_dir`: for every sandbox directory found there that is not an
/// execution of `keep`, kills and removes its cgroups and removes its directory;
/// removes run directories of sandboxes with no kept execution; detaches mounts
/// below the data dir. Kept executions are left untouched: processes, cgroups,
/// layer and socket.
pub fn sweep_leftovers(
    hierarchy: &CgroupHierarchy,
    cgroup_parent: &str,
    data_dir: &Path,
    keep: &[ExecutionKey],
    keep_run_dirs: &[PathBuf],
) -> Result<SweepReport, SubstrateError> {
    let mut report = SweepReport::default();
    let data_dir = match data_dir.canonicalize() {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(SubstrateError::io("resolve data dir", e)),
    };
    let sandboxes = entries(&data_dir.join("sandboxes"))
        .map_err(|e| SubstrateError::io("list sandboxes", e))?;

    let kept_dirs: HashSet<String> = keep.iter().map(ExecutionKey::dir_name).collect();
    let kept_sandboxes: HashSet<&str> = keep.iter().map(|k| k.sandbox_id.as_str()).collect();

    // Cgroups are named like the sandbox dirs, which launch creates first and
    // destroy removes last: every leftover cgroup of this data dir has its dir.
    for (name, _) in sandboxes
        .iter()
        .filter(|(name, _)| !kept_dirs.contains(name))
    {
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
        // Never the data dir itself: an operator may have mounted it there.
        if mount_point == data_dir || super::disk::is_volume_mount(&data_dir, &mount_point) {
            continue;
        }
        if umount2(&mount_point, MntFlags::MNT_DETACH).is_ok() {
            report.unmounted += 1;
        }
    }

    for (name, path) in sandboxes {
        // Kept layers wait there for their sandbox's next execution.
        if !kept_dirs.contains(&name) && name != super::disk::KEPT_DIR {
            crate::substrate::tree::remove_tree(&path)
                .map_err(|e| SubstrateError::io(format!("remove {}", path.display()), e))?;
            report.removed_dirs += 1;
        }
    }
    let runs = entries(&data_dir.join("run")).map_err(|e| SubstrateError::io("list run", e))?;
    // A kept execution's socket dir is named by its sandbox, or (a warm jail's) by
    // the placeholder it was bound under.
    let kept_runs: HashSet<&std::ffi::OsStr> =
        keep_run_dirs.iter().filter_map(|d| d.file_name()).collect();
    for (_, path) in runs.into_iter().filter(|(n, _)| {
        !kept_sandboxes.contains(n.as_str()) && !kept_runs.contains(std::ffi::OsStr::new(n))
    }) {
        crate::substrate::tree::remove_tree(&path)
            .map_err(|e| SubstrateError::io(format!("remove {}", path.display()), e))?;
        report.removed_dirs += 1;
    }
    for (name, path) in entries(&data_dir.join("templates")).unwrap_or_default() {
        if name.starts_with(".default.") {
            let _ = crate::substrate::tree::remove_tree(&path);
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
