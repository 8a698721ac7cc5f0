//! Hostile workloads against the disk limit: the sandbox's writable layer lives on the
//! worker's disk volume (a btrfs image loop-mounted over `sandboxes/`), where each
//! sandbox directory is a subvolume with a limit. Writes past it fail inside with
//! `EDQUOT`; the host loses at most the limit.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use space_testkit::jail::TestEnv;
use space_testkit::require_jail_host;
use space_worker::substrate::jail::disk;
use space_worker::substrate::{Limits, Substrate};

const MIB: u64 = 1 << 20;
/// What the volume's own metadata may add to the image beyond a sandbox's data
/// (btrfs allocates metadata and data chunks ahead).
const SLACK: u64 = 48 * MIB;

/// The volume of a test's data dir, unmounted at the end (also when the test panics).
struct Volume(PathBuf);

impl Volume {
    fn mount(env: &TestEnv) -> Option<Self> {
        let data = env.data_dir();
        match disk::ensure_volume(&data, Some(4 << 30)).expect("disk volume") {
            disk::VolumeState::Unavailable => {
                eprintln!("skipping: no disk volume here (mkfs.btrfs missing?)");
                None
            }
            _ => Some(Self(data)),
        }
    }

    /// Bytes the image takes on the host's filesystem.
    fn host_bytes(&self) -> u64 {
        let _ = std::process::Command::new("sync").status();
        std::fs::metadata(self.0.join(disk::IMAGE_FILE))
            .map(|m| m.blocks() * 512)
            .unwrap()
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0.join("sandboxes"), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn with_disk(bytes: u64) -> Limits {
    Limits {
        disk_bytes: Some(bytes),
        ..Limits::default()
    }
}

#[test]
fn writes_past_the_disk_limit_get_edquot_inside_and_the_host_loses_at_most_the_limit() {
    require_jail_host!();
    let env = TestEnv::new();
    let Some(volume) = Volume::mount(&env) else {
        return;
    };
    assert!(disk::enforced(&env.data_dir()));
    let jail = env.launch(env.spec(with_disk(64 * MIB))).unwrap();
    let neighbour = env.launch(env.spec(with_disk(64 * MIB))).unwrap();
    let before = volume.host_bytes();
    let flood = jail.sh("dd if=/dev/zero of=/root/flood bs=1M count=400 conv=fsync 2>&1; sync");
    assert!(
        flood.stdout.contains("Disk quota exceeded"),
        "the write must fail inside: {flood:?}"
    );
    let written: u64 = jail.ok("stat -c %s /root/flood").trim().parse().unwrap();
    assert!(
        written <= 64 * MIB,
        "{written} bytes written past the limit"
    );
    let grown = volume.host_bytes().saturating_sub(before);
    eprintln!(
        "64 MiB limit, 400 MiB written: the host's image grew {} MiB",
        grown / MIB
    );
    assert!(
        grown <= 64 * MIB + SLACK,
        "the host lost {} MiB for a 64 MiB limit",
        grown / MIB
    );
    // The limit is the sandbox's: its neighbour still writes, and so does it once it
    // has deleted what it wrote.
    assert_eq!(
        neighbour.ok("dd if=/dev/zero of=/root/f bs=1M count=8 2>/dev/null && echo ok"),
        "ok\n"
    );
    jail.ok("rm /root/flood && sync");
    assert_eq!(
        jail.ok("dd if=/dev/zero of=/root/g bs=1M count=8 2>/dev/null && echo ok"),
        "ok\n"
    );
}

#[test]
fn a_flood_of_empty_files_runs_into_the_same_limit() {
    require_jail_host!();
    let env = TestEnv::new();
    let Some(volume) = Volume::mount(&env) else {
        return;
    };
    let jail = env.launch(env.spec(with_disk(16 * MIB))).unwrap();
    let before = volume.host_bytes();
    let inodes_before = nix::sys::statvfs::statvfs(&env.data_dir())
        .unwrap()
        .files_free();
    jail.ok(
        "printf 'import os\\nn = 0\\ntry:\\n    os.mkdir(\\042/root/many\\042)\\n    while n < 3000000:\\n        os.close(os.open(\\042/root/many/f\\042 + str(n), os.O_CREAT | os.O_WRONLY)); n += 1\\n    print(\\042unbounded\\042, n)\\nexcept OSError as e:\\n    print(\\042stopped\\042, n, e.errno)\\n' > /root/flood.py",
    );
    let flood = jail.sh("python3 /root/flood.py");
    assert!(
        flood.stdout.starts_with("stopped") && flood.stdout.trim_end().ends_with(" 122"),
        "the flood must stop with EDQUOT: {flood:?}"
    );
    let grown = volume.host_bytes().saturating_sub(before);
    eprintln!(
        "16 MiB limit, {}: the host's image grew {} MiB",
        flood.stdout.trim(),
        grown / MIB
    );
    assert!(grown <= 16 * MIB + SLACK, "host lost {} MiB", grown / MIB);
    // The host's inode table is untouched: the volume is one file there.
    let inodes_after = nix::sys::statvfs::statvfs(&env.data_dir())
        .unwrap()
        .files_free();
    assert!(inodes_before.abs_diff(inodes_after) < 1000);
}

#[test]
fn the_disk_follows_the_sandbox_into_its_next_execution_with_the_limit_it_gets_there() {
    require_jail_host!();
    let env = TestEnv::new();
    let Some(_volume) = Volume::mount(&env) else {
        return;
    };
    let first = env.spec(with_disk(64 * MIB));
    let kept: PathBuf = env
        .data_dir()
        .join("sandboxes")
        .join(disk::KEPT_DIR)
        .join(&first.key.sandbox_id);
    let jail = env.launch(first.clone()).unwrap();
    jail.ok("dd if=/dev/zero of=/root/keep bs=1M count=20 2>/dev/null; echo hi > /root/note");
    let handle = jail.handle.clone();
    env.driver.destroy_keeping_layer(&handle, &kept).unwrap();
    std::mem::forget(jail);
    assert!(kept.join("upper/root/note").is_file());
    assert!(!kept.join("work").exists(), "scratch is not kept");

    // The next execution: same files, a smaller limit that the kept 20 MiB leave
    // little room under.
    let mut next = env.spec(with_disk(32 * MIB));
    next.key.sandbox_id = first.key.sandbox_id.clone();
    next.initial_upper = Some(kept.clone());
    let jail = env.launch(next).unwrap();
    assert!(!kept.exists(), "the layer moved into the execution");
    assert_eq!(jail.ok("cat /root/note"), "hi\n");
    let more = jail.sh("dd if=/dev/zero of=/root/more bs=1M count=40 2>&1");
    assert!(more.stdout.contains("Disk quota exceeded"), "{more:?}");
    let total: u64 = jail.ok("du -sm /root | cut -f1").trim().parse().unwrap();
    assert!(total <= 33, "{total} MiB under a 32 MiB limit");
}

#[test]
fn a_failed_launch_gives_the_kept_layer_back() {
    require_jail_host!();
    let env = TestEnv::new();
    let Some(_volume) = Volume::mount(&env) else {
        return;
    };
    let first = env.spec(with_disk(64 * MIB));
    let kept = env
        .data_dir()
        .join("sandboxes")
        .join(disk::KEPT_DIR)
        .join(&first.key.sandbox_id);
    let jail = env.launch(first.clone()).unwrap();
    jail.ok("echo precious > /root/p");
    env.driver
        .destroy_keeping_layer(&jail.handle, &kept)
        .unwrap();
    std::mem::forget(jail);
    let mut broken = env.spec(with_disk(64 * MIB));
    broken.key.sandbox_id = first.key.sandbox_id.clone();
    broken.initial_upper = Some(kept.clone());
    broken.agent.path = PathBuf::from("/nonexistent/agent");
    assert!(env.launch(broken).is_err());
    assert_eq!(
        std::fs::read_to_string(kept.join("upper/root/p")).unwrap(),
        "precious\n"
    );
    // What the failed launch left beside the layer goes at the next one.
    let mut again = env.spec(with_disk(64 * MIB));
    again.key.sandbox_id = first.key.sandbox_id.clone();
    again.initial_upper = Some(kept.clone());
    let jail = env.launch(again).unwrap();
    assert_eq!(jail.ok("cat /root/p"), "precious\n");
    assert!(!Path::new(&kept).exists());
}

#[test]
fn tmp_and_dev_shm_cannot_hold_more_than_the_memory_limit() {
    require_jail_host!();
    let env = TestEnv::new();
    let limits = Limits {
        memory_bytes: Some(128 * MIB),
        ..Limits::default()
    };
    let jail = env.launch(env.spec(limits)).unwrap();
    // Each tmpfs is sized at half the memory limit, and its pages are charged to the
    // sandbox's memory cgroup: filling one stops at its size, inside the limit.
    for dir in ["/tmp", "/dev/shm"] {
        let fill = jail.sh(&format!(
            "dd if=/dev/zero of={dir}/fill bs=1M count=400 2>&1; du -sm {dir}/fill | cut -f1"
        ));
        assert!(fill.stdout.contains("No space left on device"), "{fill:?}");
        let held: u64 = fill.stdout.lines().last().unwrap().trim().parse().unwrap();
        assert!(held <= 64, "{dir} held {held} MiB under a 128 MiB limit");
        let stats = env.driver.stats(&jail.handle).unwrap();
        assert!(stats.cgroup.memory_bytes <= 128 * MIB, "{stats:?}");
        jail.ok(&format!("rm {dir}/fill"));
    }
}
