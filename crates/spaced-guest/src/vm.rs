//! The agent as a VM's init (`/init` of the initramfs the worker builds) and its
//! service over the VM's virtio-serial port.
//!
//! As PID 1 ([`init`]): read the transport and the disks' naming from the kernel
//! command line the worker's driver wrote (`space.transport=`, `space.disks=`, see
//! `space_proto::vm`); mount `/dev`, `/proc`, `/sys`; load the modules the initramfs
//! carries; bring up `lo` and the NIC (when the VM has one: the address, mask and
//! gateway of every VM, `/etc/resolv.conf` naming the platform's resolver); mount the template disk read-only under the sandbox's writable disk as an
//! overlay and switch to it; start the agent (`spaced-guest vm-agent PORT`, this same
//! program) and reap every orphan until it ends, then power off — so the host sees the
//! VM end when its agent does.
//!
//! As the agent ([`serve_port`]): wait for the host (the bridge) to open its end of the
//! port, run a `space-mux` link on it, take the activation record from its first
//! control message and answer [`vm::READY`], then serve every stream the host opens
//! like a connection of the jail's agent. When the link ends (the bridge went away),
//! wait for the next host: a new link brings its own activation (after a resume from a
//! memory snapshot, a new execution's), and the previous link's streams are gone.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::mount::{MsFlags, mount};
use space_proto::guest::Activation;
use space_proto::vm;

use crate::agent::Agent;
use crate::server;

/// How long the init waits for a device the host attached.
const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// PID 1 of a VM: sets the guest up, runs the agent, powers off when it ends.
pub fn init() -> ! {
    if let Err(e) = boot() {
        eprintln!("spaced-guest init: {e}");
    }
    nix::unistd::sync();
    // Firecracker ends its VM on the guest's reset (`reboot=k`), not on a power-off,
    // which would leave a halted VM behind: its guests (the vsock transport) reset.
    // QEMU's vsock guests reset too, which ends QEMU as well (`-no-reboot`).
    let vsock = std::fs::read_to_string("/proc/cmdline")
        .is_ok_and(|l| vm::transport_of_command_line(&l) == Some(vm::GuestTransport::Vsock));
    let _ = nix::sys::reboot::reboot(if vsock {
        nix::sys::reboot::RebootMode::RB_AUTOBOOT
    } else {
        nix::sys::reboot::RebootMode::RB_POWER_OFF
    });
    // Not reached: a failed power-off leaves PID 1 to exit, which panics the kernel
    // (`panic=-1` on the command line reboots it, and QEMU `-no-reboot` ends).
    std::process::exit(1)
}

fn boot() -> Result<(), String> {
    mount_fs("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, None)?;
    mount_fs(
        "proc",
        "/proc",
        "proc",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    mount_fs(
        "sysfs",
        "/sys",
        "sysfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    load_modules(Path::new(vm::MODULES_DIR))?;
    // The guest's own loopback (a kernel starts with `lo` down): what its servers
    // listen on and what the agent connects to for a service port.
    space_jail::bring_up_loopback().map_err(|e| format!("loopback up: {e}"))?;
    // The NIC of a VM launched with one: the same address in every VM.
    let nic = Path::new("/sys/class/net").join(vm::GUEST_NIC).exists();
    if nic {
        crate::sys::configure_ipv4(
            vm::GUEST_NIC,
            vm::GUEST_ADDR,
            vm::GUEST_NETMASK,
            vm::GUEST_GATEWAY,
        )
        .map_err(|e| format!("{}: {e}", vm::GUEST_NIC))?;
    }
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("/proc/cmdline: {e}"))?;
    // The transport the worker's driver wrote on the command line, never one guessed
    // from the devices present.
    let transport = vm::transport_of_command_line(&cmdline)
        .ok_or_else(|| format!("an unknown {}= on the command line", vm::TRANSPORT_PARAM))?;
    let agent_args: Vec<String> = match transport {
        vm::GuestTransport::Serial => {
            vec![find_port(vm::PORT_NAME)?.to_string_lossy().into_owned()]
        }
        vm::GuestTransport::Vsock => vec!["--vsock".into(), vm::VSOCK_PORT.to_string()],
    };
    let layers = vm::layers_of_command_line(&cmdline)
        .ok_or_else(|| format!("no valid {}= on the command line", vm::LAYERS_PARAM))?;
    let disks = if vm::disks_by_order(&cmdline) {
        disks_in_order(layers + 1)?
    } else {
        let mut d = Vec::with_capacity(layers + 1);
        for i in 0..layers {
            d.push(find_disk(&vm::layer_serial(i))?);
        }
        d.push(find_disk(vm::UPPER_SERIAL)?);
        d
    };
    let upper = disks[layers].to_string_lossy().into_owned();
    for d in ["/disk", "/newroot"] {
        std::fs::create_dir_all(d).map_err(|e| format!("{d}: {e}"))?;
    }
    // Each layer's disk read-only at /lower/N (0 the top one), stacked by overlay as
    // the jail stacks the same layers' directories.
    let mut lowers = Vec::with_capacity(layers);
    for (i, disk) in disks.iter().take(layers).enumerate() {
        let at = format!("/lower/{i}");
        std::fs::create_dir_all(&at).map_err(|e| format!("{at}: {e}"))?;
        mount_fs(
            &disk.to_string_lossy(),
            &at,
            "ext4",
            MsFlags::MS_RDONLY,
            None,
        )?;
        lowers.push(at);
    }
    mount_fs(&upper, "/disk", "ext4", MsFlags::empty(), None)?;
    for d in ["/disk/upper", "/disk/work"] {
        std::fs::create_dir_all(d).map_err(|e| format!("{d}: {e}"))?;
    }
    mount_fs(
        "overlay",
        "/newroot",
        "overlay",
        MsFlags::empty(),
        Some(&format!(
            "lowerdir={},upperdir=/disk/upper,workdir=/disk/work",
            lowers.join(":")
        )),
    )?;
    for d in ["dev", "proc", "sys", "tmp"] {
        let at = Path::new("/newroot").join(d);
        std::fs::create_dir_all(&at).map_err(|e| format!("{}: {e}", at.display()))?;
    }
    for d in ["/dev", "/proc", "/sys"] {
        let to = format!("/newroot{d}");
        mount(
            Some(d),
            to.as_str(),
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("move {d}: {e}"))?;
    }
    std::fs::create_dir_all("/newroot/dev/pts").map_err(|e| format!("/dev/pts: {e}"))?;
    mount_fs(
        "devpts",
        "/newroot/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("ptmxmode=0666,mode=0620"),
    )?;
    // The initramfs stays underneath (it cannot be pivoted away): moved over by the
    // sandbox's root, it is out of every path.
    nix::unistd::chdir("/newroot").map_err(|e| format!("chdir: {e}"))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| format!("move the root: {e}"))?;
    nix::unistd::chroot(".").map_err(|e| format!("chroot: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    if nic {
        // The platform's resolver, as a jail's `/etc` names it (a link the image
        // left there is replaced, not followed: this is the guest's own disk).
        let conf = Path::new("/etc/resolv.conf");
        if std::fs::symlink_metadata(conf).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(conf);
        }
        if let Err(e) = std::fs::write(conf, format!("nameserver {}\n", vm::GUEST_RESOLVER)) {
            eprintln!("spaced-guest init: /etc/resolv.conf: {e}");
        }
    }
    // This program, from the initramfs beneath (the magic link still reaches it).
    let mut agent = std::process::Command::new("/proc/self/exe")
        .arg("vm-agent")
        .args(&agent_args)
        .env_clear()
        .env("PATH", crate::DEFAULT_PATH)
        .env("HOME", "/root")
        .spawn()
        .map_err(|e| format!("start the agent: {e}"))?;
    let agent_pid = nix::unistd::Pid::from_raw(agent.id() as i32);
    // Reap everything: orphans of the workload are this process's children now.
    loop {
        match nix::sys::wait::waitpid(None::<nix::unistd::Pid>, None) {
            Ok(status) if status.pid() == Some(agent_pid) => {
                let _ = agent.try_wait();
                return Err(format!("the agent ended: {status:?}"));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::ECHILD) => return Err("no agent left".into()),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
}

fn mount_fs(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    mount(Some(source), target, Some(fstype), flags, data)
        .map_err(|e| format!("mount {fstype} {source} on {target}: {e}"))
}

/// Loads the modules [`vm::MODULES_ORDER`] names, in order; one already loaded (or
/// built in) is fine.
fn load_modules(dir: &Path) -> Result<(), String> {
    let order = std::fs::read_to_string(dir.join(vm::MODULES_ORDER))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!("module name {name:?}"));
        }
        let path = dir.join(format!("{name}.ko"));
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        match nix::kmod::finit_module(file.as_fd(), c"", nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(format!("load {name}: {e}")),
        }
    }
    Ok(())
}

fn wait_for(path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear", path.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The block device whose serial is `serial`.
fn find_disk(serial: &str) -> Result<PathBuf, String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/block") {
            for e in entries.flatten() {
                let got = std::fs::read_to_string(e.path().join("serial")).unwrap_or_default();
                if got.trim() == serial {
                    let dev = Path::new("/dev").join(e.file_name());
                    wait_for(&dev)?;
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no disk with serial {serial}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The first `n` virtio block devices in attach order ([`vm::block_device_order`]),
/// once `n` of them are there (where the VMM gives disks no serial, see
/// [`vm::DISKS_PARAM`]).
fn disks_in_order(n: usize) -> Result<Vec<PathBuf>, String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        let mut names: Vec<String> = std::fs::read_dir("/sys/block")
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| is_virtio_disk_name(n))
                    .collect()
            })
            .unwrap_or_default();
        if names.len() >= n {
            names.sort_by(|a, b| vm::block_device_order(a, b));
            let mut out = Vec::with_capacity(n);
            for name in names.into_iter().take(n) {
                let dev = Path::new("/dev").join(name);
                wait_for(&dev)?;
                out.push(dev);
            }
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(format!("{n} disks expected, {} found", names.len()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `vd` and lowercase letters: a whole virtio block device, not a partition.
fn is_virtio_disk_name(name: &str) -> bool {
    name.strip_prefix("vd")
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_lowercase()))
}

/// The device of the virtio-serial port named `name` (no udev here to make
/// `/dev/virtio-ports/NAME`).
fn find_port(name: &str) -> Result<PathBuf, String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in entries.flatten() {
                let named = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if named.trim() == name {
                    let dev = Path::new("/dev").join(e.file_name());
                    wait_for(&dev)?;
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no virtio port named {name}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The agent over the port at `port`: one link per host connection, for ever. The
/// port stays open across links: what a new host sends while the last link winds
/// down (a new execution's activation, after a restore) waits in it for the next
/// link — a port closed and opened again would have dropped it.
pub fn serve_port(port: &Path, max_connections: usize) -> Result<(), String> {
    // Non-blocking (see [`PortIo`]): a write to a port whose host is gone blocks
    // until a host comes, and would then reach the next host with the old session's
    // bytes.
    let file = std::os::unix::fs::OpenOptionsExt::custom_flags(
        OpenOptions::new().read(true).write(true),
        libc::O_NONBLOCK,
    )
    .open(port)
    .map_err(|e| format!("{}: {e}", port.display()))?;
    // Held by every read and write (non-blocking, so briefly) and by a link's shut:
    // once a link is shut, none of its reads or writes is under way or can start.
    let port_lock = Arc::new(std::sync::Mutex::new(()));
    loop {
        wait_for_host(&file).map_err(|e| format!("poll {}: {e}", port.display()))?;
        if let Err(e) = serve_link(&file, &port_lock, max_connections) {
            eprintln!("spaced-guest: link ended: {e}");
        }
    }
}

/// A link's end of the (non-blocking) port: each read and write waits in `poll` a
/// bounded time at once, so that once the link is shut (`closed`) nothing blocks on
/// the port any more — reads end (EOF), writes fail.
struct PortIo {
    port: File,
    closed: Arc<std::sync::atomic::AtomicBool>,
    port_lock: Arc<std::sync::Mutex<()>>,
}

impl PortIo {
    /// Waits (50 ms at a time) until the port is ready for `flags` or hung up;
    /// `false` once the link is shut.
    fn wait(&self, flags: rustix::event::PollFlags) -> io::Result<bool> {
        use rustix::event::{PollFd, PollFlags, poll};
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        loop {
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(false);
            }
            let mut fds = [PollFd::new(&self.port, flags)];
            match poll(&mut fds, Some(&tick)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
            let got = fds[0].revents();
            if got.intersects(flags)
                || (flags.contains(PollFlags::IN) && got.contains(PollFlags::HUP))
            {
                return Ok(true);
            }
            // A write while the host is away: wait for it, or for the shut.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl io::Read for PortIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.wait(rustix::event::PollFlags::IN)? {
                return Ok(0);
            }
            let _reading = self
                .port_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(0);
            }
            match (&self.port).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

impl io::Write for PortIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            if !self.wait(rustix::event::PollFlags::OUT)? {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the link on this port is shut",
                ));
            }
            let _writing = self
                .port_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the link on this port is shut",
                ));
            }
            match (&self.port).write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Until the host side of the port is open (a port without one reads as EOF).
fn wait_for_host(port: &File) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [PollFd::new(port, PollFlags::IN)];
        let wait = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match poll(&mut fds, Some(&wait)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if !fds[0].revents().contains(PollFlags::HUP) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One link: the activation, `ready`, then streams until the link ends. A control
/// message on a live link is a new host session on the same port — after a restore
/// from a memory snapshot, the new execution's bridge can reach the guest before the
/// old session's end does — so it is a new activation: every stream of the old one is
/// reset, and only then is the new one served and `ready` answered.
fn serve_link(
    port: &File,
    port_lock: &Arc<std::sync::Mutex<()>>,
    max_connections: usize,
) -> Result<(), String> {
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let end = |closed: &Arc<std::sync::atomic::AtomicBool>| -> Result<PortIo, String> {
        Ok(PortIo {
            port: port.try_clone().map_err(|e| e.to_string())?,
            closed: Arc::clone(closed),
            port_lock: Arc::clone(port_lock),
        })
    };
    let (reader, writer) = (end(&closed)?, end(&closed)?);
    let shut = Arc::clone(port_lock);
    run_link(
        Box::new(reader),
        Box::new(writer),
        // Once the link is dead nothing more is read or written through it (the
        // next link has the port): a read or write under way is over before this
        // returns.
        Box::new(move || {
            let _writing = shut
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            closed.store(true, std::sync::atomic::Ordering::SeqCst);
        }),
        max_connections,
        true,
    )
}

/// The guest's end of one link over any transport (the serial port, a vsock
/// connection): activations (see [`serve_link`]) until it ends; `shutdown` ends the
/// transport both ways, after which nothing more is read or written through it. With
/// `set_hostname` (in a VM: the guest's own kernel) each activation names the host
/// after its sandbox; a test on a host passes `false`, never renaming the machine.
pub fn run_link(
    reader: Box<dyn io::Read + Send>,
    writer: Box<dyn io::Write + Send>,
    shutdown: Box<dyn Fn() + Send + Sync>,
    max_connections: usize,
    set_hostname: bool,
) -> Result<(), String> {
    let link = space_mux::Link::start(reader, writer, shutdown, false, vm::MAX_STREAMS, None)
        .map_err(|e| e.to_string())?;
    // Whatever ends this link ends it for good: its reader never takes what the next
    // host sends.
    let ended = serve_on(&link, max_connections, set_hostname);
    link.shut("the link ended");
    ended
}

/// Activations on `link` until it fails (see [`serve_link`]).
fn serve_on(
    link: &space_mux::Link,
    max_connections: usize,
    set_hostname: bool,
) -> Result<(), String> {
    let mut wait = Duration::from_secs(3600 * 24 * 365);
    loop {
        let record = match link.recv_control(wait) {
            Ok(r) => r,
            Err(space_mux::LinkError::Timeout) => continue,
            Err(e) => return Err(e.to_string()),
        };
        link.reset_streams();
        let activation = match Activation::decode(&record) {
            Ok(a) => a,
            Err(e) => {
                link.shut("an activation that does not decode");
                return Err(e.to_string());
            }
        };
        activate(link, &activation, max_connections, set_hostname)?;
        wait = Duration::from_millis(500);
    }
}

/// Serves `activation` on `link` from now on and answers `ready`.
fn activate(
    link: &space_mux::Link,
    activation: &Activation,
    max_connections: usize,
    set_hostname: bool,
) -> Result<(), String> {
    if set_hostname {
        let hostname = activation.sandbox.to_string().replace('_', "-");
        let _ = nix::unistd::sethostname(&hostname);
    }
    let agent = Arc::new(Agent::new(
        activation,
        PathBuf::from("/root"),
        max_connections,
    ));
    eprintln!(
        "spaced-guest: serving sandbox {} execution {} (generation {})",
        agent.identity.sandbox, agent.identity.execution.id, agent.identity.execution.generation,
    );
    link.set_accept(Box::new(move |stream| server::take(&agent, stream)));
    link.send_control(vm::READY).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_virtio_disks_are_taken_in_order() {
        for ok in ["vda", "vdz", "vdaa"] {
            assert!(is_virtio_disk_name(ok), "{ok}");
        }
        for no in ["vd", "vda1", "sda", "loop0", "vdA", "xvda"] {
            assert!(!is_virtio_disk_name(no), "{no}");
        }
    }
}
