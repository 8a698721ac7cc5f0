//! Hostile workloads against the cgroup limits, and pause/resume through the
//! freezer.

use std::fs;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use space_testkit::jail::{self as support, TestEnv};
use space_testkit::require_jail_host;
use space_worker::substrate::{Limits, Substrate};

#[test]
fn a_fork_bomb_stops_at_the_pids_limit_while_a_neighbour_keeps_working() {
    require_jail_host!();
    let env = TestEnv::new();
    let limits = Limits {
        pids_max: Some(48),
        ..Limits::default()
    };
    let bombed = env.launch(env.spec(limits)).unwrap();
    let neighbour = env.jail();
    // Forks until the kernel refuses; each child closes its output and sleeps so
    // that every process stays counted.
    bombed.ok(
        "printf 'import os, time, errno\\nn = 0\\ntry:\\n    while True:\\n        if os.fork() == 0:\\n            os.close(1); os.close(2); time.sleep(60); os._exit(0)\\n        n += 1\\nexcept OSError as e:\\n    print(n, errno.errorcode[e.errno])\\n' > /root/bomb.py",
    );
    let reply = bombed.sh("python3 /root/bomb.py");
    assert_eq!(reply.exit_code, 0, "{reply:?}");
    let mut words = reply.stdout.split_whitespace();
    let forked: u64 = words.next().unwrap().parse().unwrap();
    assert_eq!(words.next(), Some("EAGAIN"), "{reply:?}");
    assert!(forked > 10 && forked < 48, "forked {forked}");
    let stats = env.driver.stats(&bombed.handle).unwrap();
    assert!(stats.cgroup.pids <= 48, "{stats:?}");
    // The neighbour and the host are unaffected.
    assert_eq!(neighbour.ok("echo still here"), "still here\n");
    assert!(
        std::process::Command::new("/bin/true")
            .status()
            .unwrap()
            .success()
    );
    let handle = bombed.destroy();
    assert!(support::leftovers(&handle).is_empty());
}

#[test]
fn a_memory_hog_is_oom_killed_inside_its_sandbox_only() {
    require_jail_host!();
    let env = TestEnv::new();
    let limits = Limits {
        memory_bytes: Some(96 << 20),
        ..Limits::default()
    };
    let jail = env.launch(env.spec(limits)).unwrap();
    let neighbour = env.jail();
    let hog = jail.sh("python3 -c \"b = bytearray(b'x') * (512 << 20); print('survived')\"");
    assert_eq!(
        hog.exit_code,
        128 + 9,
        "the hog must die by SIGKILL: {hog:?}"
    );
    assert!(!hog.stdout.contains("survived"));
    let stats = env.driver.stats(&jail.handle).unwrap();
    assert!(stats.cgroup.oom_kills >= 1, "{stats:?}");
    assert!(stats.running);
    // Only the hog died: the agent (same sandbox) and the neighbour still answer.
    assert_eq!(jail.ok("echo agent alive"), "agent alive\n");
    assert_eq!(neighbour.ok("echo neighbour alive"), "neighbour alive\n");
    assert_eq!(
        env.driver
            .stats(&neighbour.handle)
            .unwrap()
            .cgroup
            .oom_kills,
        0
    );
}

/// Reads the counter the background loop keeps in the writable layer.
fn counter(upper: &Path) -> u64 {
    for _ in 0..200 {
        let text = fs::read_to_string(upper.join("root/count")).unwrap_or_default();
        if let Ok(n) = text.trim().parse() {
            return n;
        }
        sleep(Duration::from_millis(5));
    }
    panic!("counter never appeared");
}

#[test]
fn pause_freezes_the_sandbox_and_resume_continues_it() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    jail.ok(
        "printf 'import os, time\\ni = 0\\nwhile True:\\n    i += 1\\n    open(\"/root/t\", \"w\").write(str(i))\\n    os.replace(\"/root/t\", \"/root/count\")\\n    time.sleep(0.002)\\n' > /root/counter.py \
         && python3 /root/counter.py >/dev/null 2>&1 &",
    );
    let upper = jail.handle.upper_dir.clone();
    let first = counter(&upper);
    sleep(Duration::from_millis(100));
    assert!(counter(&upper) > first, "the counter does not run");

    env.driver.pause(&jail.handle).unwrap();
    assert!(env.driver.stats(&jail.handle).unwrap().cgroup.frozen);
    let paused = counter(&upper);
    sleep(Duration::from_millis(300));
    assert_eq!(counter(&upper), paused, "the counter advanced while paused");

    env.driver.resume(&jail.handle).unwrap();
    assert!(!env.driver.stats(&jail.handle).unwrap().cgroup.frozen);
    sleep(Duration::from_millis(300));
    assert!(counter(&upper) > paused, "the counter did not continue");
    assert_eq!(jail.ok("echo resumed"), "resumed\n");
}

#[test]
fn pause_and_destroy_succeed_while_the_sandbox_keeps_spawning_processes() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    // posix_spawn uses vfork: a parent waiting for a child frozen before its exec
    // cannot be frozen itself, so a naive freeze would hang in FREEZING.
    jail.ok(
        "printf 'import subprocess\\nwhile True:\\n    subprocess.run([\"/bin/true\"])\\n' > /root/spawner.py \
         && python3 /root/spawner.py >/dev/null 2>&1 &",
    );
    sleep(Duration::from_millis(50));
    for _ in 0..30 {
        env.driver.pause(&jail.handle).expect("pause");
        assert!(env.driver.stats(&jail.handle).unwrap().cgroup.frozen);
        env.driver.resume(&jail.handle).expect("resume");
    }
    assert!(
        jail.ok("ps -e -o comm= 2>/dev/null || cat /proc/[0-9]*/comm")
            .contains("python3")
    );
    let handle = jail.destroy();
    assert!(
        support::leftovers(&handle).is_empty(),
        "{:?}",
        support::leftovers(&handle)
    );
}

#[test]
fn a_paused_sandbox_can_be_destroyed() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    jail.ok("sleep 1000 >/dev/null 2>&1 &");
    env.driver.pause(&jail.handle).unwrap();
    let handle = jail.destroy();
    assert!(
        support::leftovers(&handle).is_empty(),
        "{:?}",
        support::leftovers(&handle)
    );
}

#[test]
fn the_cpu_quota_caps_a_busy_loop() {
    require_jail_host!();
    let env = TestEnv::new();
    let limits = Limits {
        cpu_millis: Some(100),
        ..Limits::default()
    };
    let jail = env.launch(env.spec(limits)).unwrap();
    let before = env.driver.stats(&jail.handle).unwrap().cgroup.cpu_usage_ns;
    jail.sh("timeout 1 sh -c 'while :; do :; done'");
    let used = env.driver.stats(&jail.handle).unwrap().cgroup.cpu_usage_ns - before;
    // A tenth of a core for one second is 0.1 s; unthrottled it would be ~1 s.
    assert!(
        used < 500_000_000,
        "used {used} ns of CPU in 1 s at 10% quota"
    );
    assert!(used > 10_000_000, "the loop did not run at all ({used} ns)");
}
