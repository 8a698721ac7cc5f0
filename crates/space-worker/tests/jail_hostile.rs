//! A hostile workload against the host: links planted in the writable layer for the
//! next launch, shared per-user kernel limits, the agent's and init's memory and
//! descriptors, vsock, the host's `/usr/local`, host paths in mountinfo. Each test
//! attacks one defence and fails without it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use space_testkit::jail::{self as support, Jail, TestEnv};
use space_testkit::require_jail_host;
use space_worker::substrate::jail::uid_ranges::{DEFAULT_FIRST_ID, UidRangeConfig, UidRanges};
use space_worker::substrate::jail::{JailConfig, JailDriver};
use space_worker::substrate::{Limits, Substrate};

/// Host paths a test plants links to, removed at the end.
struct Victims {
    dir: tempfile::TempDir,
}

impl Victims {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("space-victim")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::write(dir.path().join("existing"), "host file\n").unwrap();
        std::fs::create_dir(dir.path().join("hostdir")).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Everything under the victims' dir, with contents: must never change.
    fn snapshot(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in walk(self.dir.path()) {
            let content = std::fs::read_to_string(&e).unwrap_or_default();
            out.push((e.display().to_string(), content));
        }
        out.sort();
        out
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// Runs a Python script inside (the probe agent takes one line: the script travels
/// base64-encoded).
fn python(jail: &Jail, script: &str) -> space_jail::probe_agent::ProbeReply {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(script);
    jail.sh(&format!(
        "echo {encoded} | base64 -d > /tmp/script.py && python3 /tmp/script.py"
    ))
}

/// Destroys `jail` keeping its writable layer, and launches the same sandbox again
/// on that layer (what a relaunch, restart or migration does).
fn relaunch(env: &TestEnv, jail: Jail) -> Jail {
    let keep = env.data_dir().join("kept-layer");
    let _ = std::fs::remove_dir_all(&keep);
    let handle = jail.handle.clone();
    std::mem::forget(jail);
    env.driver
        .destroy_keeping_layer(&handle, &keep)
        .expect("destroy keeping the layer");
    let mut spec = env.spec(Limits::default());
    spec.key = space_worker::substrate::ExecutionKey::new(
        handle.key.sandbox_id.clone(),
        format!("{}r", handle.key.execution_id),
    );
    spec.initial_upper = Some(keep);
    env.launch(spec).expect("relaunch on the kept layer")
}

#[test]
fn symlinked_etc_passwd_is_replaced_not_followed_on_relaunch() {
    require_jail_host!();
    let env = TestEnv::new();
    let victims = Victims::new();
    let before = victims.snapshot();
    let jail = env.jail();
    // The template is every sandbox's lower layer: a file planted there would appear
    // in every other sandbox of the worker.
    let template = env.data_dir().join("templates/default");
    assert!(template.is_dir());
    let (existing, absent, hostdir) = (
        victims.path("existing"),
        victims.path("created-by-the-platform"),
        victims.path("hostdir"),
    );
    jail.ok(&format!(
        "rm -f /etc/passwd /etc/hosts /etc/resolv.conf /etc/nsswitch.conf /etc/group && \
         ln -s {existing} /etc/passwd && ln -s {absent} /etc/hosts && \
         ln -s {existing} /etc/resolv.conf && ln -s {template}/etc/planted /etc/nsswitch.conf && \
         ln -s {hostdir}/group /etc/group; ls -l /etc",
        existing = existing.display(),
        absent = absent.display(),
        hostdir = hostdir.display(),
        template = template.display(),
    ));
    let again = relaunch(&env, jail);
    assert_eq!(victims.snapshot(), before, "a host file was written");
    assert!(!absent.exists(), "the platform created a host file");
    assert!(
        !template.join("etc/planted").exists(),
        "the platform wrote into the template"
    );
    let passwd = again.ok("cat /etc/passwd");
    assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
    assert_eq!(again.ok("test -L /etc/passwd || echo regular"), "regular\n");
    assert!(again.ok("cat /etc/hosts").contains("localhost"));
}

#[test]
fn a_symlinked_etc_home_or_mount_point_is_replaced_not_followed_on_relaunch() {
    require_jail_host!();
    let env = TestEnv::new();
    let victims = Victims::new();
    let before = victims.snapshot();
    let jail = env.jail();
    let hostdir = victims.path("hostdir");
    // The sandbox's root may replace whole directories of its layer, including the
    // mount points the builder mounts on and the homes it creates.
    jail.ok(&format!(
        "cd / && rm -rf /etc /home && ln -s {h} /etc && ln -s {h} /home; \
         rm -rf /root && ln -s {h} /root; true",
        h = hostdir.display()
    ));
    let again = relaunch(&env, jail);
    assert_eq!(
        victims.snapshot(),
        before,
        "something was written on the host"
    );
    assert_eq!(again.ok("test -d /etc -a ! -L /etc && echo dir"), "dir\n");
    assert!(again.ok("cat /etc/passwd").contains("user:x:1000:1000:"));
    assert_eq!(again.ok("stat -c %u /home/user"), "1000\n");
    assert_eq!(again.ok("test -d /root -a ! -L /root && echo dir"), "dir\n");
}

#[test]
fn a_symlinked_ca_certificates_mount_point_is_replaced_not_followed_on_relaunch() {
    require_jail_host!();
    if !std::path::Path::new("/etc/ssl/certs").is_dir() {
        eprintln!("skipped: this host has no /etc/ssl/certs to bind");
        return;
    }
    let env = TestEnv::new();
    let victims = Victims::new();
    let before = victims.snapshot();
    let jail = env.jail();
    assert_ne!(jail.ok("ls /etc/ssl/certs | wc -l").trim(), "0");
    // The certificates are read-only inside.
    assert_ne!(jail.sh("touch /etc/ssl/certs/planted").exit_code, 0);
    // The bind's parent is the sandbox's own directory: it moves it away and leaves a
    // link to a host directory where the builder will mount at the next launch.
    let hostdir = victims.path("hostdir");
    jail.ok(&format!(
        "mv /etc/ssl /etc/ssl.moved 2>/dev/null; rm -rf /etc/ssl; ln -s {h} /etc/ssl; true",
        h = hostdir.display()
    ));
    let again = relaunch(&env, jail);
    assert_eq!(
        victims.snapshot(),
        before,
        "something was written on the host"
    );
    assert_eq!(
        again.ok("test -d /etc/ssl -a ! -L /etc/ssl && echo dir"),
        "dir\n"
    );
    assert_ne!(again.ok("ls /etc/ssl/certs | wc -l").trim(), "0");
}

#[test]
fn jail_root_is_an_unprivileged_host_range_of_its_own() {
    require_jail_host!();
    let env = TestEnv::new();
    assert!(env.driver.uses_user_namespaces());
    let (a, b) = (env.jail(), env.jail());
    let host_uid = |jail: &Jail| {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", jail.handle.init.pid)).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .to_owned();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    let (ua, ub) = (host_uid(&a), host_uid(&b));
    assert!(
        ua >= DEFAULT_FIRST_ID && ub >= DEFAULT_FIRST_ID,
        "{ua} {ub}"
    );
    assert_ne!(ua, ub, "two sandboxes share a host uid range");
    assert_eq!(a.handle.host_uid, Some(ua));
    // Inside, it is root, and the shared template is root's (idmapped, read-only).
    assert_eq!(a.ok("id -u; id -g"), "0\n0\n");
    assert_eq!(a.ok("stat -c %u:%g /usr/bin/env"), "0:0\n");
    assert_ne!(a.sh("touch /usr/bin/planted").exit_code, 0);
    // On disk the layer keeps canonical ids: root's file is uid 0, user's 1000.
    a.ok("echo x > /root/mine");
    assert_eq!(a.ok("stat -c %u /home/user"), "1000\n");
    let upper = &a.handle.upper_dir;
    assert_eq!(std::fs::metadata(upper.join("root/mine")).unwrap().uid(), 0);
    assert_eq!(
        std::fs::metadata(upper.join("home/user")).unwrap().uid(),
        1000
    );
}

/// Opens inotify instances until the kernel refuses; `None` once it does.
fn inotify_instances_available() -> bool {
    // SAFETY: inotify_init1 returns a new descriptor or -1; closed right away.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC);
        if fd < 0 {
            return false;
        }
        libc::close(fd);
    }
    true
}

#[test]
fn inotify_instances_held_by_one_sandbox_leave_host_root_and_other_sandboxes_theirs() {
    require_jail_host!();
    let env = TestEnv::new();
    let hog = env.jail();
    let other = env.jail();
    // Hold every inotify instance the kernel lets this sandbox's user have.
    let held = python(
        &hog,
        "
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while libc.inotify_init1(0) >= 0:
    n += 1
print(n, os.strerror(ctypes.get_errno()), flush=True)
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(600)
",
    )
    .stdout;
    assert!(held.contains("Too many open files"), "{held}");
    assert!(
        inotify_instances_available(),
        "host root lost its inotify instances"
    );
    let probe =
        "python3 -c \"import ctypes; l = ctypes.CDLL(None); print(l.inotify_init1(0) >= 0)\"";
    assert_eq!(
        other.ok(probe),
        "True\n",
        "the other sandbox lost its inotify instances"
    );
}

#[test]
fn the_workload_cannot_read_or_write_the_inits_memory_or_descriptors() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    // PID 1 is the init: same uid as the workload, but not dumpable.
    let attempt = python(
        &jail,
        "
import os
for path, mode in [('/proc/1/mem', 'r+b'), ('/proc/1/environ', 'rb'), ('/proc/1/maps', 'rb')]:
    try:
        open(path, mode).read(1); print('opened', path)
    except OSError as e:
        print('refused', path, e.errno)
try:
    print('fds', os.listdir('/proc/1/fd'))
except OSError as e:
    print('refused fd', e.errno)
",
    );
    assert!(!attempt.stdout.contains("opened"), "{attempt:?}");
    assert!(!attempt.stdout.contains("fds"), "{attempt:?}");
    assert_eq!(attempt.stdout.matches("refused").count(), 4, "{attempt:?}");
}

#[test]
fn the_jail_holds_no_host_file_only_a_log_pipe() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    jail.ok("echo hello from inside >&2; true");
    let data = env.data_dir().display().to_string();
    let mut pids = jail.handle.cgroups.procs().unwrap();
    pids.push(jail.handle.init.pid);
    let mut seen = Vec::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            let t = target.display().to_string();
            seen.push(format!("{pid}: {t}"));
            assert!(
                !t.starts_with(&data) && !t.contains("jail.log"),
                "a jail process holds host file {t}"
            );
        }
    }
    assert!(seen.iter().any(|s| s.contains("pipe:")), "{seen:?}");
}

#[test]
fn vsock_sockets_are_refused_by_seccomp() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    let out = python(
        &jail,
        "
import socket
try:
    socket.socket(40, socket.SOCK_STREAM); print('created')
except OSError as e:
    print('errno', e.errno)
",
    );
    // EPERM (1) is the filter; a kernel without vsock would say EAFNOSUPPORT (97).
    assert_eq!(out.stdout.trim(), "errno 1", "{out:?}");
}

#[test]
fn the_default_template_hides_usr_local_and_host_paths() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    if std::fs::read_dir("/usr/local")
        .map(|d| d.count())
        .unwrap_or(0)
        == 0
    {
        eprintln!("note: the host's /usr/local is empty; checking only that it stays so");
    }
    assert_eq!(jail.ok("ls -A /usr/local | wc -l").trim(), "0");
    let mountinfo = jail.ok("cat /proc/self/mountinfo");
    let data = env.data_dir().display().to_string();
    assert!(!mountinfo.contains(&data), "{mountinfo}");
    assert!(!mountinfo.contains("templates"), "{mountinfo}");
    assert_eq!(jail.ok("ulimit -n"), "4096\n");
}

#[test]
fn a_destroyed_jail_gives_its_uid_range_back() {
    require_jail_host!();
    // Ranges of its own, so that no parallel test takes the released one first.
    let locks = tempfile::tempdir().unwrap();
    let ranges = UidRangeConfig {
        lock_dir: locks.path().to_path_buf(),
        ..UidRangeConfig::default()
    };
    let mut config = JailConfig::new(support::jail_binary());
    config.userns = Some(ranges.clone());
    let env = TestEnv {
        driver: std::sync::Arc::new(JailDriver::new(config).unwrap()),
        data: tempfile::Builder::new().prefix("spw").tempdir().unwrap(),
    };
    let jail = env.jail();
    let base = jail.handle.host_uid.unwrap();
    // Held while the jail lives: nobody else (another worker) can take it.
    let other = UidRanges::new(ranges).unwrap();
    assert!(
        !other.hold(base).unwrap(),
        "range {base} not held by its jail"
    );
    let handle = jail.destroy();
    assert!(support::leftovers(&handle).is_empty());
    assert!(
        other.hold(base).unwrap(),
        "range {base} still held after destroy"
    );
}

/// Python that holds every pipe buffer page (`pipe-user-pages-soft`) this sandbox's
/// user may have, then idles in the background; prints how many pipes it made.
const HOLD_PIPE_PAGES: &str = "
import fcntl, os, time
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
pipes = []
while True:
    try:
        r, w = os.pipe()
    except OSError:
        break
    pipes.append((r, w))
    if fcntl.fcntl(w, F_GETPIPE_SZ) < 65536 or len(pipes) > 4000:
        break
print('pipes', len(pipes), 'last size', fcntl.fcntl(pipes[-1][1], F_GETPIPE_SZ), flush=True)
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(600)
";

/// Python that queues real-time signals to itself until the kernel refuses
/// (`RLIMIT_SIGPENDING` of the user), then idles in the background with them queued.
const HOLD_PENDING_SIGNALS: &str = "
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
class Val(ctypes.Union):
    _fields_ = [('i', ctypes.c_int), ('p', ctypes.c_void_p)]
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    n = 0
    while libc.sigqueue(os.getpid(), signal.SIGRTMIN, Val(0)) == 0 and n < 1000000:
        n += 1
    os.write(w, ('queued %d %s' % (n, os.strerror(ctypes.get_errno()))).encode())
    for fd in (w, 0, 1, 2):
        os.close(fd)
    time.sleep(600)
os.close(w)
print(os.read(r, 200).decode(), flush=True)
";

#[test]
fn pipe_pages_and_pending_signals_held_by_one_sandbox_leave_other_sandboxes_theirs() {
    require_jail_host!();
    let env = TestEnv::new();
    let hog = env.jail();
    let other = env.jail();
    let pipes = python(&hog, HOLD_PIPE_PAGES).stdout;
    assert!(
        !pipes.contains("last size 65536"),
        "the hog never reached its limit: {pipes}"
    );
    let signals = python(&hog, HOLD_PENDING_SIGNALS).stdout;
    assert!(
        signals.contains("Resource temporarily unavailable"),
        "{signals}"
    );
    // Another sandbox still gets full-size pipes and can queue a signal.
    let probe = "
import ctypes, fcntl, os, signal
r, w = os.pipe()
print('size', fcntl.fcntl(w, 1032))
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
libc = ctypes.CDLL(None, use_errno=True)
class Val(ctypes.Union):
    _fields_ = [('i', ctypes.c_int), ('p', ctypes.c_void_p)]
print('queued', libc.sigqueue(os.getpid(), signal.SIGRTMIN, Val(0)) == 0)
";
    let seen = python(&other, probe).stdout;
    assert!(
        seen.contains("size 65536"),
        "the other sandbox lost its pipe pages: {seen}"
    );
    assert!(
        seen.contains("queued True"),
        "the other sandbox cannot queue signals: {seen}"
    );
}

#[test]
fn without_user_namespaces_behind_the_explicit_flag_jails_run_as_host_root() {
    require_jail_host!();
    // The weaker mode exists only when asked for (`--no-userns`): the default driver
    // gives every jail its own range (see `jail_root_is_an_unprivileged_…`).
    assert!(TestEnv::new().driver.uses_user_namespaces());
    let env = TestEnv::without_user_namespaces();
    assert!(!env.driver.uses_user_namespaces());
    let jail = env.jail();
    assert_eq!(jail.handle.host_uid, None);
    let status = std::fs::read_to_string(format!("/proc/{}/status", jail.handle.init.pid)).unwrap();
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t0\t")),
        "{status}"
    );
    // The links planted in its layer are not followed either.
    assert_eq!(jail.ok("id -u"), "0\n");
    assert!(jail.ok("cat /etc/passwd").starts_with("root:x:0:0:"));
}

#[test]
fn sandbox_b_cannot_reach_a_listener_of_sandbox_a_on_any_address() {
    require_jail_host!();
    let env = TestEnv::new();
    let (a, b) = (env.jail(), env.jail());
    // A listens on every address of its own namespace and proves it answers itself.
    let listen = "
import os, socket, time
s = socket.socket()
s.bind(('0.0.0.0', 47111))
s.listen()
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        c, _ = s.accept()
        c.sendall(b'from-a')
        c.close()
c = socket.create_connection(('127.0.0.1', 47111), timeout=2)
print(c.recv(16).decode())
";
    assert_eq!(python(&a, listen).stdout, "from-a\n");
    let probe = "
import socket
for host in ['127.0.0.1', '0.0.0.0', 'localhost']:
    try:
        c = socket.create_connection((host, 47111), timeout=2)
        print('reached', host, c.recv(16))
    except OSError as e:
        print('refused', host)
";
    let out = python(&b, probe).stdout;
    assert!(!out.contains("reached"), "{out}");
    assert_eq!(out.matches("refused").count(), 3, "{out}");
}

#[test]
fn x32_system_calls_are_refused_by_seccomp() {
    require_jail_host!();
    let env = TestEnv::new();
    let jail = env.jail();
    // getpid and unshare under their x32 numbers (bit 30 set): a kernel without the
    // x32 ABI says ENOSYS (38), one with it would run them; the filter says EPERM.
    let out = python(
        &jail,
        "
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for nr in (39, 272):
    r = libc.syscall(0x40000000 | nr, 0)
    print(nr, r, ctypes.get_errno())
",
    );
    assert_eq!(out.stdout, "39 -1 1\n272 -1 1\n", "{out:?}");
}

#[test]
fn the_agents_binary_is_reached_only_through_a_read_only_mount() {
    require_jail_host!();
    // Without a user namespace the agent runs as its binary's owner: were its
    // /proc/PID/exe ever reached, a write would change what every later jail runs.
    use std::os::unix::fs::OpenOptionsExt;
    for env in [TestEnv::without_user_namespaces(), TestEnv::new()] {
        let jail = env.jail();
        let agent = jail.handle.agent.expect("agent pid").pid;
        let exe = format!("/proc/{agent}/exe");
        // The mount the agent's binary is reached through is read-only (a write
        // would be EROFS once nothing runs the file; while it runs, ETXTBSY comes
        // first, so look at the mount itself).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&exe)
            .unwrap();
        let flags = nix::sys::statvfs::fstatvfs(&file).unwrap().flags();
        assert!(
            flags.contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
            "the agent's binary sits on a writable mount: {flags:?}"
        );
        // It is still the configured binary (same file).
        use std::os::unix::fs::MetadataExt;
        let (ran, configured) = (
            std::fs::metadata(&exe).unwrap(),
            std::fs::metadata(support::jail_binary()).unwrap(),
        );
        assert_eq!((ran.dev(), ran.ino()), (configured.dev(), configured.ino()));
    }
}
