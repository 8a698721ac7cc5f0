//! The startup sweep after a simulated worker crash.

use std::fs;
use std::path::PathBuf;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use space_testkit::jail::TestEnv;
use space_testkit::require_jail_host;

/// Detaches a host mount made by the test if the sweep did not.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

#[test]
fn the_startup_sweep_cleans_what_a_crashed_worker_left() {
    require_jail_host!();
    let env = TestEnv::new();
    // Two executions left running by a worker that crashed; the restarted worker
    // re-adopts one (the keep-list) and knows nothing of the other.
    let lost = env.jail();
    let kept = env.jail();
    lost.ok("sleep 1000 >/dev/null 2>&1 &");
    kept.ok("echo precious > /root/work && sleep 1000 >/dev/null 2>&1 &");
    // A mount that leaked into the host namespace under the data dir.
    let stale = lost.handle.sandbox_dir.join("root");
    mount(
        Some("tmpfs"),
        &stale,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let _guard = MountGuard(stale.clone());
    // A jail of another data dir (another worker) must survive the sweep.
    let other_env = TestEnv::new();
    let other = other_env.jail();

    let pids = lost.handle.cgroups.procs().unwrap();
    assert!(pids.len() >= 3, "{pids:?}");

    let report = env
        .driver
        .sweep_leftovers(&env.data_dir(), std::slice::from_ref(&kept.handle.key), &[])
        .unwrap();
    assert_eq!(report.removed_cgroups, 1, "{report:?}");
    assert!(report.killed_processes >= 3, "{report:?}");
    assert!(report.unmounted >= 1, "{report:?}");

    for pid in pids {
        assert!(
            !PathBuf::from(format!("/proc/{pid}")).exists(),
            "pid {pid} survived the sweep"
        );
    }
    assert!(
        !lost.handle.cgroups.exists(),
        "cgroups of the lost execution remain"
    );
    assert!(!lost.handle.socket_path.exists());
    assert!(
        !fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&*stale.to_string_lossy())
    );
    assert!(!lost.handle.sandbox_dir.exists());
    // The kept execution is untouched: processes, cgroups, layer, socket.
    assert!(kept.handle.init.is_alive() && kept.handle.cgroups.exists());
    assert_eq!(kept.ok("cat /root/work"), "precious\n");
    assert_eq!(
        fs::read_to_string(kept.handle.upper_dir.join("root/work")).unwrap(),
        "precious\n"
    );

    assert_eq!(other.ok("echo unaffected"), "unaffected\n");
    // A second sweep finds nothing more to do.
    let again = env
        .driver
        .sweep_leftovers(&env.data_dir(), std::slice::from_ref(&kept.handle.key), &[])
        .unwrap();
    assert_eq!(
        (
            again.removed_cgroups,
            again.killed_processes,
            again.removed_dirs
        ),
        (0, 0, 0)
    );
}
