//! What a sandbox cannot see or do: other processes, other sandboxes, the host
//! network, mounts, new namespaces, capabilities.

use std::net::TcpListener;

use space_testkit::jail::TestEnv;
use space_testkit::require_jail_host;

#[test]
fn the_jail_sees_only_its_own_processes() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    // PID 1 is the jail's init, 2 the agent; the host's processes are absent.
    let pids: Vec<u32> = jail
        .ok("ls /proc | grep -E '^[0-9]+$'")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(pids.contains(&1) && pids.contains(&2), "{pids:?}");
    assert!(pids.len() < 10, "host processes visible: {pids:?}");
    assert_eq!(jail.ok("cat /proc/1/comm"), "space-jail\n");
    let host_pid = std::process::id();
    assert!(jail.sh(&format!("test -e /proc/{host_pid}")).exit_code != 0 || host_pid < 10);
    assert_eq!(
        jail.ok("hostname"),
        format!("{}\n", jail.handle.key.sandbox_id.replace('_', "-"))
    );
}

#[test]
fn sandbox_a_cannot_see_the_processes_or_files_of_sandbox_b() {
    require_jail_host!();
    let env = TestEnv::new();
    let a = env.jail();
    let b = env.jail();
    b.ok("echo b-secret > /root/secret-of-b && sleep 4242 >/dev/null 2>&1 &");
    // The marker exists on B's side, so the checks below can fail.
    assert!(b.handle.upper_dir.join("root/secret-of-b").exists());
    assert!(
        b.ok("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            .contains("sleep 4242")
    );
    let seen_by_a = a.ok("cat /proc/[0-9]*/cmdline | tr '\\0' ' '");
    assert!(!seen_by_a.contains("4242"), "{seen_by_a}");
    let search = a.sh("grep -rs b-secret / --exclude-dir=proc --exclude-dir=usr -l; find / -xdev -name 'secret-of-b*'");
    assert!(!search.stdout.contains("secret"), "{search:?}");
}

#[test]
fn the_network_has_only_loopback_and_cannot_reach_a_host_listener() {
    require_jail_host!();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let env = TestEnv::new();
    let jail = env.jail();
    let interfaces: Vec<String> = jail
        .ok("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(interfaces, ["lo"]);
    let reach_host = jail.sh(&format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\""
    ));
    assert_ne!(reach_host.exit_code, 0, "{reach_host:?}");
    assert!(!reach_host.stdout.contains("connected"));
    // Loopback itself is up: a listener inside is reachable from inside.
    let inside = jail.ok(
        "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); \
         c=socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\"",
    );
    assert_eq!(inside, "loopback ok\n");
    host.set_nonblocking(true).unwrap();
    assert!(host.accept().is_err(), "the host listener was reached");
}

#[test]
fn seccomp_refuses_mount_and_unshare_inside() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let unshare = jail.sh("unshare -r true");
    assert_ne!(unshare.exit_code, 0);
    assert!(
        unshare.stderr.contains("Operation not permitted"),
        "{unshare:?}"
    );
    let mount = jail.sh("mount -t tmpfs none /mnt");
    assert_ne!(mount.exit_code, 0);
    assert!(
        mount.stderr.contains("ermission denied") || mount.stderr.contains("not permitted"),
        "{mount:?}"
    );
    assert!(
        jail.ok("grep ' /mnt ' /proc/self/mounts || echo none")
            .contains("none")
    );
    // The call itself is refused with EPERM, not merely the tool: ask Python.
    let errnos = jail.ok(
        "python3 -c \"import ctypes, os; libc=ctypes.CDLL(None, use_errno=True); \
         r=libc.unshare(0x10000000); e1=ctypes.get_errno(); \
         r2=libc.mount(b'none', b'/mnt', b'tmpfs', 0, None); e2=ctypes.get_errno(); \
         r3=libc.process_vm_readv(os.getpid(), None, 0, None, 0, 0); e3=ctypes.get_errno(); \
         print(r, e1, r2, e2, r3, e3)\"",
    );
    // unshare(CLONE_NEWUSER), mount, process_vm_readv: each -1 with EPERM (1).
    assert_eq!(errnos, "-1 1 -1 1 -1 1\n");
}

/// The capabilities the sandbox's root keeps in a user namespace of its own range:
/// CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETGID, SETUID (bits 0, 1, 3, 5, 6, 7; see
/// `space_jail::init::SANDBOX_ROOT_CAPABILITIES`).
const SANDBOX_ROOT_CAPS: &str = "00000000000000eb";

#[test]
fn root_keeps_only_the_account_capabilities_inside_its_user_namespace() {
    require_jail_host!();
    let kept: u64 = space_jail::init::SANDBOX_ROOT_CAPABILITIES
        .iter()
        .map(|c| 1u64 << c.1)
        .sum();
    assert_eq!(format!("{kept:016x}"), SANDBOX_ROOT_CAPS);
    let env = TestEnv::new();
    let jail = env.jail();
    let caps = jail.ok("grep ^Cap /proc/self/status");
    for (set, want) in [
        ("CapInh", "0000000000000000"),
        ("CapPrm", SANDBOX_ROOT_CAPS),
        ("CapEff", SANDBOX_ROOT_CAPS),
        ("CapBnd", SANDBOX_ROOT_CAPS),
        ("CapAmb", "0000000000000000"),
    ] {
        let line = caps
            .lines()
            .find(|l| l.starts_with(set))
            .unwrap_or_else(|| panic!("{caps}"));
        assert!(line.ends_with(want), "{line}");
    }
    assert_eq!(
        jail.ok("grep NoNewPrivs /proc/self/status"),
        "NoNewPrivs:\t1\n"
    );
    assert!(jail.ok("grep ^Seccomp: /proc/self/status").contains('2'));
    // The init is hardened the same way.
    assert!(
        jail.ok("grep ^CapEff /proc/1/status")
            .ends_with(&format!("{SANDBOX_ROOT_CAPS}\n"))
    );
}

#[test]
fn every_capability_set_is_empty_without_a_user_namespace_of_its_own() {
    require_jail_host!();
    // Host root (`--no-userns`): nothing is kept, not even for accounts.
    let env = TestEnv::without_user_namespaces();
    let jail = env.jail();
    let caps = jail.ok("grep ^Cap /proc/self/status");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = caps
            .lines()
            .find(|l| l.starts_with(set))
            .unwrap_or_else(|| panic!("{caps}"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(
        jail.ok("grep ^CapEff /proc/1/status")
            .ends_with("0000000000000000\n")
    );
}

#[test]
fn host_kernel_knobs_in_proc_are_read_only_or_hidden() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let sysrq = jail.sh("echo h > /proc/sysrq-trigger");
    assert_ne!(sysrq.exit_code, 0, "{sysrq:?}");
    let core = jail.sh("echo '|/bin/false' > /proc/sys/kernel/core_pattern");
    assert_ne!(core.exit_code, 0, "{core:?}");
    assert!(core.stderr.contains("Read-only"), "{core:?}");
    assert_eq!(jail.ok("wc -c < /proc/kallsyms"), "0\n");
}
