//! What this host lets a test run: jails need root and a cgroup filesystem. A test
//! that cannot run here says why on stderr and passes (it is skipped).

use std::path::Path;

/// Why this host cannot create jails, if it cannot.
pub fn jail_host_missing() -> Option<&'static str> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (mount, PID and network namespaces; cgroups)");
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        return Some("needs a cgroup filesystem at /sys/fs/cgroup");
    }
    None
}

/// Whether this process may create jails; prints why the test skips otherwise.
pub fn can_run_jails() -> bool {
    match jail_host_missing() {
        Some(reason) => {
            eprintln!("SKIPPED: {reason}");
            false
        }
        None => true,
    }
}
