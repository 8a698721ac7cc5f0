//! Firecracker as a uid of its own. Firecracker has no `-runas` (its jailer drops
//! privileges, besides a chroot, namespaces and a cgroup of its own; this driver does
//! not use the jailer, see `docs/architecture.md`): the child drops to the VM's uid
//! after the fork and before `exec`, so Firecracker itself never runs as the worker.
//! The uid then opens `/dev/kvm` through the device's group (kept as its one
//! supplementary group) or its mode, and reaches its files only through its own
//! working directory, which the worker prepared for it.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use crate::substrate::SubstrateError;

/// How a VM's uid gets to `/dev/kvm` given the device's `mode` and group `gid`:
/// through its mode (read and write for others: no group needed), through its group
/// (read and write for the group: that group kept), or not at all.
pub fn kvm_group(mode: u32, gid: u32) -> Result<Option<u32>, String> {
    if mode & 0o006 == 0o006 {
        return Ok(None);
    }
    if mode & 0o060 == 0o060 {
        return Ok(Some(gid));
    }
    Err(format!(
        "/dev/kvm (mode {:o}) is open to neither its group nor others: a VM's own uid \
         could not use it",
        mode & 0o7777
    ))
}

/// [`kvm_group`] of this host's `/dev/kvm`.
pub fn kvm_access(dev: &Path) -> Result<Option<u32>, SubstrateError> {
    let m = std::fs::metadata(dev).map_err(|e| {
        SubstrateError::Unsupported(format!("no {} ({e}): Firecracker needs KVM", dev.display()))
    })?;
    kvm_group(m.mode(), m.gid()).map_err(SubstrateError::Unsupported)
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3` (two data structs: 64 capabilities).
const CAP_V3: u32 = 0x2008_0522;

/// Makes `command` set `no_new_privs`, drop every capability (the bounding set where
/// the worker may, the ambient set, then effective, permitted and inheritable, checked
/// to be empty — an inherited `SECBIT_NO_SETUID_FIXUP` or a worker without uid ranges,
/// where Firecracker keeps the worker's uid, would otherwise keep them) and, with
/// `uid`, drop to `uid` (every uid and gid) with `group` as its only supplementary
/// group, and forbid core files (the guest's RAM is Firecracker's memory), in the
/// child before `exec`. Register it after any step that needs the
/// worker's privileges (`unshare` of a network namespace): closures run in their order.
pub fn drop_to(command: &mut Command, uid: Option<u32>, group: Option<u32>) {
    let groups: Vec<libc::gid_t> = group.into_iter().collect();
    let last_cap: libc::c_ulong = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    // SAFETY: the closure runs in the forked child of a multithreaded process and calls
    // only setrlimit, setgroups, setresgid, setresuid, prctl, capset and capget (async-signal-safe
    // system calls) on memory of its own stack; `groups` was allocated before the fork
    // and is only read; building the error from errno does not allocate.
    unsafe {
        command.pre_exec(move || {
            let zero: libc::c_ulong = 0;
            // The bounding set first, while the worker's CAP_SETPCAP (if it has it)
            // still holds; a worker without it has nothing there to give anyway.
            for cap in 0..=last_cap {
                libc::prctl(libc::PR_CAPBSET_DROP, cap, zero, zero, zero);
            }
            let clear_all = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
            libc::prctl(libc::PR_CAP_AMBIENT, clear_all, zero, zero, zero);
            crate::substrate::jail::spawn::no_core_dumps()?;
            if let Some(id) = uid {
                if libc::setgroups(groups.len(), groups.as_ptr()) == -1
                    || libc::setresgid(id, id, id) == -1
                    || libc::setresuid(id, id, id) == -1
                {
                    return Err(io::Error::last_os_error());
                }
            }
            let mut header = CapHeader {
                version: CAP_V3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            if libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) == -1
                || libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) == -1
            {
                return Err(io::Error::last_os_error());
            }
            if data
                .iter()
                .any(|d| d.effective | d.permitted | d.inheritable != 0)
            {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            // Whole `unsigned long`s: the kernel checks every argument.
            let one: libc::c_ulong = 1;
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_is_reached_through_its_mode_or_its_group_or_not_at_all() {
        assert_eq!(kvm_group(0o20666, 108), Ok(None));
        assert_eq!(kvm_group(0o20660, 108), Ok(Some(108)));
        assert!(kvm_group(0o20600, 108).is_err());
        // Read without write is not use.
        assert!(kvm_group(0o20640, 108).is_err());
    }

    #[test]
    fn a_child_dropped_to_a_uid_runs_as_it_with_no_new_privileges() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: needs root to drop to another uid");
            return;
        }
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/status");
        drop_to(&mut cmd, Some(64_999), Some(64_998));
        let out = cmd.output().unwrap();
        let status = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(field("Uid:"), "64999 64999 64999 64999", "{status}");
        assert_eq!(field("Gid:"), "64999 64999 64999 64999", "{status}");
        assert_eq!(field("Groups:"), "64998", "{status}");
        assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
        assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
        assert_eq!(field("NoNewPrivs:"), "1", "{status}");
        assert_eq!(field("CapBnd:"), "0000000000000000", "{status}");
    }

    #[test]
    fn a_child_is_in_its_cgroup_before_exec() {
        use crate::substrate::jail::cgroup::CgroupHierarchy;
        let Ok(h) = CgroupHierarchy::detect() else {
            eprintln!("SKIPPED: no cgroups here");
            return;
        };
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (cgroups)");
            return;
        }
        let parent = format!("space-test-fcjoin-{}", std::process::id());
        let set = h
            .create(&parent, "x.1", &crate::substrate::Limits::default())
            .unwrap();
        let procs = set.procs_files().unwrap();
        // What the program reads first thing, with nothing written after the spawn.
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/cgroup");
        crate::substrate::jail::spawn::join_cgroup(&mut cmd, procs);
        drop_to(&mut cmd, None, None);
        let out = cmd.output().unwrap();
        let cgroup = String::from_utf8_lossy(&out.stdout).into_owned();
        let _ = set.kill_all();
        let _ = set.remove();
        for dir in h.parent_dirs(&parent) {
            let _ = std::fs::remove_dir(dir);
        }
        assert!(cgroup.contains(&format!("{parent}/x.1")), "{cgroup}");
    }

    #[test]
    fn a_child_left_the_workers_uid_keeps_no_capability() {
        // A root worker without uid ranges (`--no-userns`): Firecracker stays uid 0,
        // but with no capability at all (none to use, none to regain by `exec`).
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/status");
        drop_to(&mut cmd, None, None);
        let out = cmd.output().unwrap();
        let status = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
            assert_eq!(field(cap), "0000000000000000", "{cap} {status}");
        }
        if rustix::process::geteuid().is_root() {
            assert_eq!(field("CapBnd:"), "0000000000000000", "{status}");
        }
        assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    }
}
