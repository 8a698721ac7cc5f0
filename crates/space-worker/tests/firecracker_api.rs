//! The Firecracker driver against a stand-in `firecracker` (a Python script,
//! `tests/firecracker/fake_firecracker.py`, that serves the API, opens what it is
//! given as Firecracker would and boots nothing): everything of a launch, a pause, a
//! snapshot, a restore and a destroy that happens on the host runs for real — the
//! cgroup, the cleared environment, the working directory, the inherited kernel and
//! initramfs descriptors, the requests in their order, the snapshot's files and their
//! staging for a load. What needs a real Firecracker and KVM is in
//! `tests/firecracker.rs`.
//!
//! Needs root (cgroups), `/usr/bin/python3` and `mkfs.ext4`; skips saying so otherwise.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use space_worker::substrate::firecracker::{FirecrackerConfig, FirecrackerDriver};
use space_worker::substrate::vm::snapshot::{Machine, Vmm};
use space_worker::substrate::{
    AgentCommand, ExecutionKey, LaunchSpec, Limits, Substrate, SubstrateKind, TemplateSpec,
};

const PYTHON: &str = "/usr/bin/python3";

fn missing() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (cgroups)".into());
    }
    if !Path::new(PYTHON).is_file() {
        return Some(format!("needs {PYTHON} for the stand-in firecracker"));
    }
    if std::process::Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .is_err()
    {
        return Some("needs mkfs.ext4 (e2fsprogs)".into());
    }
    None
}

/// A kernel directory as `space vm setup` leaves it, with placeholder files (the
/// stand-in boots nothing) and an ELF header as its `vmlinux`.
fn fake_kernel(dir: &Path) {
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::write(dir.join("vmlinuz"), b"not a kernel").unwrap();
    std::fs::write(dir.join("release"), "6.1.0-test\n").unwrap();
    let names: Vec<&str> = space_proto::vm::GUEST_MODULES
        .iter()
        .chain(space_proto::vm::VSOCK_MODULES)
        .copied()
        .collect();
    for n in &names {
        std::fs::write(modules.join(format!("{n}.ko")), b"module").unwrap();
    }
    std::fs::write(modules.join("order"), names.join("\n")).unwrap();
    let mut elf = vec![0u8; 128];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1;
    elf[18] = 62;
    std::fs::write(dir.join("vmlinux"), elf).unwrap();
}

struct Env {
    driver: FirecrackerDriver,
    data: tempfile::TempDir,
    files: tempfile::TempDir,
    cgroup_parent: String,
}

impl Env {
    fn new(firecracker: &Path) -> Self {
        let files = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        fake_kernel(&files.path().join("kernel"));
        let agent = files.path().join("agent");
        std::fs::write(&agent, b"an agent").unwrap();
        let template = files.path().join("template");
        std::fs::create_dir_all(template.join("etc")).unwrap();
        std::fs::write(template.join("etc/hostname"), b"t\n").unwrap();
        let cgroup_parent = format!("space-test-fcapi-{}", std::process::id());
        let driver = FirecrackerDriver::new(
            FirecrackerConfig {
                firecracker: firecracker.to_path_buf(),
                kernel_dir: files.path().join("kernel"),
                agent,
                cgroup_parent: cgroup_parent.clone(),
                // This host's /dev/kvm is root's alone: the uid drop itself is tested
                // in `substrate::firecracker::child`.
                uid_ranges: None,
            },
            data.path(),
        )
        .unwrap();
        Self {
            driver,
            data,
            files,
            cgroup_parent,
        }
    }

    fn spec(&self, execution: &str, initial_upper: Option<PathBuf>) -> LaunchSpec {
        LaunchSpec {
            key: ExecutionKey::new("sbx_fc", execution),
            data_dir: self.data.path().to_path_buf(),
            template: TemplateSpec::Directory {
                lower_dir: self.files.path().join("template"),
                read_only_binds: Vec::new(),
            },
            limits: Limits {
                memory_bytes: Some(256 << 20),
                disk_bytes: Some(64 << 20),
                ..Limits::default()
            },
            agent: AgentCommand::spaced_guest("/nonexistent"),
            activation: b"{}".to_vec(),
            hostname: None,
            initial_upper,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Ok(h) = space_worker::substrate::jail::cgroup::CgroupHierarchy::detect() {
            for dir in h.parent_dirs(&self.cgroup_parent) {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// The stand-in (or `script`) as an executable in a directory of its own.
fn firecracker_bin(root: &Path, script: &str) -> PathBuf {
    let dir = root.join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("firecracker");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The stand-in as `fake_firecracker.py` in `root`, behind a `firecracker` that
/// `wrapper` (given the stand-in's path) writes: a shell script that ends by running it.
fn stand_in_behind(root: &Path, wrapper: impl FnOnce(&Path) -> String) -> PathBuf {
    let fake = firecracker_bin(root, include_str!("firecracker/fake_firecracker.py"));
    let real = root.join("fake_firecracker.py");
    std::fs::rename(&fake, &real).unwrap();
    firecracker_bin(root, &wrapper(&real))
}

fn requests(fc_dir: &Path) -> Vec<(String, String, serde_json::Value)> {
    std::fs::read_to_string(fc_dir.join("requests.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn launch_pause_snapshot_restore_and_destroy_against_a_stand_in_firecracker() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    let fake = firecracker_bin(bins.path(), include_str!("firecracker/fake_firecracker.py"));
    let env = Env::new(&fake);
    let handle = env.driver.launch(&env.spec("01", None)).unwrap();
    assert_eq!(handle.substrate, SubstrateKind::Firecracker);
    let fc = handle.socket_path.parent().unwrap().to_path_buf();
    assert_eq!(fc.file_name().unwrap(), "fc-01");
    assert_eq!(handle.socket_path.file_name().unwrap(), "v.sock");
    assert!(handle.upper_dir.is_file());
    // Firecracker in its directory, with nothing of the worker's environment.
    let pid = handle.init.pid;
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        fc.canonicalize().unwrap()
    );
    assert!(
        std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap()
            .is_empty()
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // Left the worker's uid (no uid ranges here), yet with no capability at all.
    for cap in ["CapEff", "CapPrm", "CapBnd"] {
        assert!(
            status.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {status}"
        );
    }
    // No core dump, ever: its memory is the guest's RAM (1 also stops a piped dump).
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits.lines().any(|l| l.starts_with("Max core file size")
            && l.split_whitespace().nth(4) == Some("1")
            && l.split_whitespace().nth(5) == Some("1")),
        "{limits}"
    );
    // In a cgroup of its own, where this host has cgroups.
    if space_worker::substrate::jail::cgroup::CgroupHierarchy::detect().is_ok() {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(cgroup.contains(&env.cgroup_parent), "{cgroup}");
        assert!(cgroup.contains("sbx_fc.01"), "{cgroup}");
    }
    // The boot's requests in order, after Firecracker answered on its socket; the
    // kernel and initramfs by inherited descriptor (the stand-in opened them).
    let reqs = requests(&fc);
    let paths: Vec<&str> = reqs.iter().map(|(_, p, _)| p.as_str()).collect();
    let first = paths.iter().position(|p| *p != "/").unwrap();
    assert_eq!(
        &paths[first..],
        [
            "/version",
            "/machine-config",
            "/boot-source",
            "/drives/layer0",
            "/drives/upper",
            "/vsock",
            "/actions"
        ]
    );
    let boot = &reqs[first + 2].2;
    assert!(
        boot["kernel_image_path"]
            .as_str()
            .unwrap()
            .starts_with("/proc/self/fd/"),
        "{boot}"
    );
    assert_eq!(reqs[first + 1].2["mem_size_mib"], 256);

    env.driver.pause(&handle).unwrap();
    env.driver.resume(&handle).unwrap();
    let reqs = requests(&fc);
    let vm: Vec<&serde_json::Value> = reqs
        .iter()
        .filter(|(m, p, _)| m == "PATCH" && p == "/vm")
        .map(|(_, _, b)| b)
        .collect();
    assert_eq!(
        vm,
        [
            &serde_json::json!({"state": "Paused"}),
            &serde_json::json!({"state": "Resumed"})
        ]
    );

    // A snapshot: the shared layout plus the state, the worker's own files.
    let snap_dir = env.files.path().join("snap");
    let snap = env.driver.snapshot(&handle, &snap_dir).unwrap();
    assert_eq!(snap.machine.vmm, Vmm::Firecracker);
    assert_eq!(std::fs::read(snap_dir.join("memory")).unwrap(), b"ram");
    assert_eq!(std::fs::read(snap_dir.join("vmstate")).unwrap(), b"state");
    assert!(snap_dir.join("upper.ext4").is_file());
    assert_eq!(
        Machine::read(&snap_dir.join("vm.json")).unwrap().vmm,
        Vmm::Firecracker
    );
    assert!(!fc.join("new.memory").exists() && !fc.join("new.vmstate").exists());

    // Restored as a new execution: a new Firecracker that only loads the snapshot,
    // the staged names gone once it has.
    let restored = env.driver.restore(&env.spec("02", None), &snap).unwrap();
    let fc2 = restored.socket_path.parent().unwrap().to_path_buf();
    assert_ne!(restored.init.pid, handle.init.pid);
    let reqs = requests(&fc2);
    let asked: Vec<(&str, &str)> = reqs
        .iter()
        .filter(|(_, p, _)| p != "/")
        .map(|(m, p, _)| (m.as_str(), p.as_str()))
        .collect();
    assert_eq!(asked, [("GET", "/version"), ("PUT", "/snapshot/load")]);
    assert!(!fc2.join("memory").exists() && !fc2.join("vmstate").exists());
    assert!(restored.upper_dir.is_file());
    // The snapshot itself is whole after the load.
    assert_eq!(std::fs::read(snap_dir.join("memory")).unwrap(), b"ram");

    for h in [&handle, &restored] {
        env.driver.destroy(h).unwrap();
        assert!(!h.init.is_alive());
        assert!(!h.socket_path.parent().unwrap().exists());
        assert!(!h.sandbox_dir.exists());
        // Idempotent.
        env.driver.destroy(h).unwrap();
    }
}

#[test]
fn a_firecracker_that_fails_to_start_leaves_nothing_and_gives_the_kept_disk_back() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    let broken = firecracker_bin(bins.path(), "#!/bin/sh\necho 'no KVM here' >&2\nexit 1\n");
    let env = Env::new(&broken);
    let kept = env.files.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("upper.ext4"), b"the sandbox's files").unwrap();
    let err = env
        .driver
        .launch(&env.spec("03", Some(kept.clone())))
        .unwrap_err()
        .to_string();
    assert!(err.contains("API socket"), "{err}");
    assert_eq!(
        std::fs::read(kept.join("upper.ext4")).unwrap(),
        b"the sandbox's files"
    );
    let run = env.data.path().join("run").join("sbx_fc");
    assert!(
        !run.join("fc-03").exists(),
        "the Firecracker directory was left"
    );
}

#[test]
fn an_api_socket_a_vmm_replaced_by_a_link_or_another_listener_gets_no_request() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    let fake = firecracker_bin(bins.path(), include_str!("firecracker/fake_firecracker.py"));
    let env = Env::new(&fake);
    let handle = env.driver.launch(&env.spec("04", None)).unwrap();
    let fc = handle.socket_path.parent().unwrap().to_path_buf();
    let api = fc.join("api.sock");
    // The VMM moves its own socket aside and leaves, at its name, a link to another
    // listener (another VM's API socket, say) ...
    std::fs::rename(&api, fc.join("api.real")).unwrap();
    let other = env.files.path().join("other.sock");
    let listener = std::os::unix::net::UnixListener::bind(&other).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::os::unix::fs::symlink(&other, &api).unwrap();
    let err = env.driver.pause(&handle).unwrap_err().to_string();
    assert!(err.contains("not a socket"), "{err}");
    assert!(
        env.driver
            .snapshot(&handle, &env.files.path().join("s1"))
            .is_err()
    );
    assert!(listener.accept().is_err(), "the link was followed");
    // ... or a socket of another process than the recorded Firecracker.
    std::fs::remove_file(&api).unwrap();
    let impostor = std::os::unix::net::UnixListener::bind(&api).unwrap();
    impostor.set_nonblocking(true).unwrap();
    let err = env.driver.resume(&handle).unwrap_err().to_string();
    assert!(err.contains("not served by Firecracker"), "{err}");
    // Connected (the backlog took it), but never written to: nothing was sent.
    if let Ok((mut s, _)) = impostor.accept() {
        use std::io::Read as _;
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        assert!(
            !matches!(s.read(&mut buf), Ok(n) if n > 0),
            "a request was sent"
        );
    }
    let asked: Vec<String> = requests(&fc).into_iter().map(|(_, p, _)| p).collect();
    assert!(!asked.iter().any(|p| p == "/vm"), "{asked:?}");
    // Its own socket back at its name: served again.
    drop(impostor);
    std::fs::remove_file(&api).unwrap();
    std::fs::rename(fc.join("api.real"), &api).unwrap();
    env.driver.pause(&handle).unwrap();
    env.driver.destroy(&handle).unwrap();
}

#[test]
fn a_kept_disk_is_kept_only_as_the_plain_single_link_file_and_the_directory_goes() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    let fake = firecracker_bin(bins.path(), include_str!("firecracker/fake_firecracker.py"));
    let env = Env::new(&fake);
    // Kept: the disk moves out, the worker's, and the Firecracker directory goes.
    let handle = env.driver.launch(&env.spec("05", None)).unwrap();
    let fc = handle.socket_path.parent().unwrap().to_path_buf();
    let keep = env.files.path().join("keep5");
    env.driver.destroy_keeping_layer(&handle, &keep).unwrap();
    assert!(keep.join("upper.ext4").is_file());
    assert!(!fc.exists());
    // The VMM hard-linked another file at the disk's name: nothing is kept, and the
    // other file is neither moved nor given away.
    let handle = env.driver.launch(&env.spec("06", None)).unwrap();
    let other = env.files.path().join("other.ext4");
    std::fs::write(&other, b"not the VM's").unwrap();
    std::fs::remove_file(&handle.upper_dir).unwrap();
    std::fs::hard_link(&other, &handle.upper_dir).unwrap();
    let keep = env.files.path().join("keep6");
    env.driver.destroy_keeping_layer(&handle, &keep).unwrap();
    assert!(!keep.join("upper.ext4").exists());
    assert_eq!(std::fs::read(&other).unwrap(), b"not the VM's");
    // A link at the disk's name: not followed.
    let handle = env.driver.launch(&env.spec("07", None)).unwrap();
    std::fs::remove_file(&handle.upper_dir).unwrap();
    std::os::unix::fs::symlink(&other, &handle.upper_dir).unwrap();
    let keep = env.files.path().join("keep7");
    env.driver.destroy_keeping_layer(&handle, &keep).unwrap();
    assert!(!keep.join("upper.ext4").exists());
    assert!(other.is_file());
    assert!(!handle.socket_path.parent().unwrap().exists());
}

#[test]
fn a_firecracker_writing_without_end_to_its_log_fills_only_a_bounded_log() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    // Megabytes of warnings (what a guest poking its devices could make Firecracker
    // write), then the stand-in itself.
    let fake = stand_in_behind(bins.path(), |real| {
        format!(
            "#!/bin/sh\nhead -c 8000000 /dev/zero | tr '\\000' w >&2\nexec {} \"$@\"\n",
            real.display()
        )
    });
    let env = Env::new(&fake);
    let handle = env.driver.launch(&env.spec("08", None)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read(&handle.log_path).unwrap();
        if log.ends_with(b"dropped]\n") || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let max = space_worker::substrate::firecracker::LOG_MAX as usize;
    assert!(log.len() <= max + 100, "a log of {} bytes", log.len());
    assert!(log.ends_with(b"dropped]\n"), "no mark of the dropped rest");
    // It still runs and answers: nothing blocked on its stderr.
    env.driver.pause(&handle).unwrap();
    env.driver.destroy(&handle).unwrap();
}

#[test]
fn a_firecracker_older_than_1_10_is_refused_at_launch() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    let old = include_str!("firecracker/fake_firecracker.py").replace("1.10.1", "1.9.1");
    let fake = firecracker_bin(bins.path(), &old);
    let env = Env::new(&fake);
    let err = env
        .driver
        .launch(&env.spec("09", None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("older than 1.10"), "{err}");
    let run = env.data.path().join("run").join("sbx_fc");
    assert!(!run.join("fc-09").exists());
}

#[test]
fn a_firecracker_that_keeps_writing_to_its_memory_file_cannot_change_the_snapshot_taken() {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let bins = tempfile::tempdir().unwrap();
    // After writing the memory file it keeps the descriptor and writes through it for
    // two seconds: rewriting and growing what the worker took.
    let fake = stand_in_behind(bins.path(), |real| {
        format!(
            "#!/bin/sh\nexec {} --keep-writing-memory \"$@\"\n",
            real.display()
        )
    });
    let env = Env::new(&fake);
    let handle = env.driver.launch(&env.spec("10", None)).unwrap();
    let snap_dir = env.files.path().join("snap");
    env.driver.snapshot(&handle, &snap_dir).unwrap();
    let memory = snap_dir.join("memory");
    let taken = std::fs::read(&memory).unwrap();
    assert_eq!(taken, b"ram");
    // Long enough for the stand-in's writes to land on whatever inode it holds.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        std::fs::read(&memory).unwrap(),
        taken,
        "the VMM changed the snapshot's memory after the worker took it"
    );
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(&memory).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777, m.nlink()), (0, 0o600, 1));
    env.driver.destroy(&handle).unwrap();
}
