//! Rootless jails: the driver run by an unprivileged user. The test (root) runs itself
//! again as `nobody` (uid 65534) and the scenario executes in that child.

use std::os::unix::process::CommandExt;
use std::process::Command;

use space_testkit::jail::{TestEnv, jail_binary};
use space_worker::substrate::jail::cgroup::CgroupSet;
use space_worker::substrate::{Limits, Substrate, SubstrateError};

const CHILD_ENV: &str = "SPACE_ROOTLESS_SCENARIO";
const NOBODY: u32 = 65534;

/// Runs `scenario` as `nobody` in a fresh copy of this test binary.
fn as_nobody(scenario: &str) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to start the scenario as an unprivileged user");
        return;
    }
    let userns_ok = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .is_ok_and(|v| v.trim().parse::<u64>().is_ok_and(|n| n > 0));
    if !userns_ok {
        eprintln!(
            "SKIPPED: needs unprivileged user namespaces (/proc/sys/user/max_user_namespaces > 0)"
        );
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([scenario, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .env("SPACE_JAIL_BIN", jail_binary())
        .env("TMPDIR", "/tmp")
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "rootless scenario failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the scenario did not run:\n{text}"
    );
}

fn in_child(scenario: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == scenario)
}

#[test]
fn rootless_jail_maps_root_inside_to_the_unprivileged_user() {
    if !in_child("rootless_jail_maps_root_inside_to_the_unprivileged_user") {
        return as_nobody("rootless_jail_maps_root_inside_to_the_unprivileged_user");
    }
    let env = TestEnv::new();
    assert!(env.driver.is_rootless());
    let jail = env.jail();
    assert_eq!(jail.handle.cgroups, CgroupSet::None);
    assert_eq!(jail.ok("id -u").trim(), "0");
    let map = jail.ok("cat /proc/self/uid_map");
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(fields, ["0", "65534", "1"], "{map}");
    // Still its own PID namespace, hostname and loopback-only network.
    assert_eq!(jail.ok("cat /proc/1/comm").trim(), "space-jail");
    assert!(
        jail.ok("cat /proc/net/dev")
            .lines()
            .all(|l| !l.contains("eth"))
    );
    // No capabilities left, even inside the user namespace.
    let status = jail.ok("grep CapEff /proc/self/status");
    assert!(status.trim().ends_with("0000000000000000"), "{status}");
    // Pausing needs a freezer, which rootless jails lack: a clear refusal.
    assert!(matches!(
        env.driver.pause(&jail.handle),
        Err(SubstrateError::Unsupported(_))
    ));
    let handle = jail.destroy();
    assert!(!handle.init.exists(), "init survived destroy");
    assert!(!handle.sandbox_dir.exists(), "sandbox dir left behind");
}

#[test]
fn rootless_fork_bomb_stops_at_the_process_rlimit_and_the_jail_keeps_answering() {
    if !in_child("rootless_fork_bomb_stops_at_the_process_rlimit_and_the_jail_keeps_answering") {
        return as_nobody(
            "rootless_fork_bomb_stops_at_the_process_rlimit_and_the_jail_keeps_answering",
        );
    }
    let env = TestEnv::new();
    let jail = env
        .launch(env.spec(Limits {
            memory_bytes: None,
            pids_max: Some(48),
            cpu_millis: None,
            disk_bytes: None,
        }))
        .unwrap();
    let bomb = jail.sh("for i in $(seq 1 200); do sleep 2 & done; echo all-started");
    assert_ne!(
        bomb.exit_code, 0,
        "200 processes started under a limit of 48: {bomb:?}"
    );
    assert!(!bomb.stdout.contains("all-started"), "{bomb:?}");
    assert!(bomb.stderr.to_lowercase().contains("fork"), "{bomb:?}");
    // Once the sleeps end, the jail answers again: the limit only bounded it.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(jail.ok("echo alive").trim(), "alive");
    let handle = jail.destroy();
    assert!(!handle.init.exists());
}
