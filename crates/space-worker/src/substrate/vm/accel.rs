//! How QEMU runs guest code: the accelerator (KVM where a stock kernel boots under
//! it, else software emulation), probed once per data directory, and the guest
//! kernel's command line that depends on it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::kernel;
use super::transport::AgentTransport;

/// How QEMU runs guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization (`/dev/kvm`, where a stock kernel boots under it).
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl Accel {
    /// QEMU's name of it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

/// How long the KVM probe's guest may take to reach its root mount.
const KVM_PROBE_WAIT: Duration = Duration::from_secs(15);
/// Console bytes of the probe kept (the rest is read and dropped).
const KVM_PROBE_OUTPUT: usize = 256 * 1024;

/// The accelerator for this machine, and why: KVM where a stock guest kernel boots under
/// it, software emulation (TCG) otherwise. Probed once per data directory (the answer
/// is kept in `<data>/vm/accel`; remove it to probe again): the guest kernel is started
/// under KVM without a root and must reach its root mount — a nested KVM that cannot
/// boot a stock kernel (this host class's) hangs before, in its real-mode setup.
pub fn detect_accel(qemu: &Path, kernel_dir: &Path, data_dir: &Path) -> (Accel, String) {
    let cache = data_dir.join("vm").join("accel");
    match std::fs::read_to_string(&cache).as_deref().map(str::trim) {
        Ok("kvm") => return (Accel::Kvm, format!("probed before ({})", cache.display())),
        Ok("tcg") => return (Accel::Tcg, format!("probed before ({})", cache.display())),
        _ => {}
    }
    let (accel, why) = probe_kvm(qemu, kernel_dir);
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(&cache, accel.as_str());
    (accel, why)
}

fn probe_kvm(qemu: &Path, kernel_dir: &Path) -> (Accel, String) {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return (Accel::Tcg, "no usable /dev/kvm: software emulation".into());
    }
    let kernel = match kernel::load(kernel_dir) {
        Ok(k) => k,
        Err(e) => {
            return (
                Accel::Tcg,
                format!("KVM not probed ({e}): software emulation"),
            );
        }
    };
    let child = Command::new(qemu)
        .args([
            "-machine", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128M",
        ])
        .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
        .args([
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .args(["-append", "console=ttyS0 panic=-1", "-serial", "stdio"])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            return (
                Accel::Tcg,
                format!("KVM probe did not start ({e}): software emulation"),
            );
        }
    };
    let (text, last) = super::shared::probe_output(child, KVM_PROBE_OUTPUT, KVM_PROBE_WAIT);
    if text.contains("VFS:") || text.contains("Kernel panic") {
        return (Accel::Kvm, "a stock guest kernel boots under KVM".into());
    }
    (
        Accel::Tcg,
        format!(
            "KVM does not boot a stock kernel here (the probe's guest stopped at {last:?} within {} s): software emulation",
            KVM_PROBE_WAIT.as_secs()
        ),
    )
}

/// The guest kernel's command line. Under software emulation the guest's TSC is the
/// host's, and the kernel is told its rate: calibrating it against the emulated PIT
/// fails whenever QEMU's main loop is busy (seen: a QMP client connected during boot),
/// and a kernel without a clock source hangs there.
/// Over vhost-vsock it names that transport, and that the agent serves only reserved
/// host ports (any host process may connect to a guest's CID; only the bridge, with
/// `CAP_NET_BIND_SERVICE`, binds one of those).
pub(super) fn kernel_command_line(
    accel: Accel,
    layers: usize,
    transport: AgentTransport,
) -> String {
    let mut line = format!(
        "console=ttyS0 quiet panic=-1 rdinit=/init pci=off random.trust_cpu=on {}={layers}",
        space_proto::vm::LAYERS_PARAM
    );
    if transport == AgentTransport::VhostVsock {
        line.push_str(&format!(
            " {}={} {}={}",
            space_proto::vm::TRANSPORT_PARAM,
            space_proto::vm::GuestTransport::Vsock.as_str(),
            space_proto::vm::VSOCK_PEER_PARAM,
            space_proto::vm::VSOCK_PEER_RESERVED
        ));
    }
    if accel == Accel::Tcg {
        if let Some(khz) = host_tsc_khz() {
            line.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
        }
    }
    line
}

/// The host's TSC rate in kHz (`cpu MHz` of `/proc/cpuinfo`: the nominal rate on a
/// CPU with a constant TSC).
fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    (mhz > 1.0).then_some((mhz * 1000.0) as u64)
}
