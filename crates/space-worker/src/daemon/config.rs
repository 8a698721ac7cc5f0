//! The worker's settings, validated before anything binds.

use std::net::SocketAddr;
use std::path::PathBuf;

use space_identity::WorkerId;

use super::launch::Binaries;
use super::limits;

/// Worker settings, validated before anything binds.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's ID.
    pub id: WorkerId,
    /// Control-plane base URL.
    pub control_url: String,
    /// Enrollment secret.
    pub enroll_secret: String,
    /// node-api listen address.
    pub listen: SocketAddr,
    /// URL the control plane and clients use to reach node-api (default: from `listen`).
    pub advertise_url: Option<String>,
    /// Data directory (records, layers, sockets).
    pub data_dir: PathBuf,
    /// Most sandboxes.
    pub capacity: u32,
    /// Binaries.
    pub binaries: Binaries,
    /// `space-jail`.
    pub jail_binary: PathBuf,
    /// cgroup parent directory (distinct per worker on one host).
    pub cgroup_parent: String,
    /// Jails kept launched ahead of demand (see [`super::warm`]); 0 turns the pool off.
    pub warm_pool: usize,
    /// Host id ranges of the jails' user namespaces; `None` (`--no-userns`) runs
    /// jails as host uid 0 without one.
    pub userns: Option<crate::substrate::jail::uid_ranges::UidRangeConfig>,
    /// Default and largest sandbox limits, disk volume size (see [`limits`]).
    pub limits: limits::WorkerLimits,
    /// Egress for sandboxes in network mode `egress`; `None` (`--no-egress`): such
    /// sandboxes are refused here.
    pub egress: Option<EgressSettings>,
    /// `Some`: this worker runs VM sandboxes (`--substrate vm`) with these settings;
    /// `None`: jails.
    pub vm: Option<VmSettings>,
}

/// A VM worker's settings (`--substrate vm`).
#[derive(Debug, Clone)]
pub struct VmSettings {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// `Some`: VMs run under this `firecracker` instead of QEMU (`--vmm
    /// firecracker`; KVM only).
    pub firecracker: Option<PathBuf>,
    /// The guest kernel prepared by `space vm setup`.
    pub kernel_dir: PathBuf,
    /// How QEMU VMs reach their agents (`--vm-transport`).
    pub transport: crate::substrate::vm::TransportChoice,
}

/// The operator's egress settings (`--egress-*`).
#[derive(Debug, Clone, Default)]
pub struct EgressSettings {
    /// Which block of `240.0.0.0/4`, link names and table (workers sharing a host
    /// take different slots).
    pub slot: u8,
    /// Networks refused to every sandbox on top of the defaults.
    pub deny: Vec<space_egress::IpNet>,
    /// Private ranges sandboxes may reach (refused by default).
    pub allow_private: Vec<space_egress::IpNet>,
    /// DNS servers the platform asks for sandboxes (default: the host's
    /// `/etc/resolv.conf`).
    pub dns: Vec<SocketAddr>,
}

/// Default size of the warm pool per worker. With the standby sandboxes `space up`
/// keeps (16 per worker), two workers serve a burst of 50 creates from what was
/// launched ahead: 64 jails, as many as 32 warm jails per worker alone.
pub const DEFAULT_WARM_POOL: usize = 16;

impl WorkerConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.control_url.starts_with("http://") || self.control_url.starts_with("https://")) {
            return Err(format!(
                "--control must be an http(s) URL, got {:?}",
                self.control_url
            ));
        }
        for (what, p) in [
            ("spaced-guest", &self.binaries.agent),
            ("spaced-host", &self.binaries.bridge),
            ("space-jail", &self.jail_binary),
        ] {
            if !p.is_file() {
                return Err(format!("{what} binary not found at {}", p.display()));
            }
        }
        if let Some(fc) = self.vm.as_ref().and_then(|vm| vm.firecracker.as_ref()) {
            if !fc.is_file() {
                return Err(format!(
                    "--vmm firecracker needs Firecracker: none at {} (--firecracker PATH)",
                    fc.display()
                ));
            }
        }
        if let Some(vm) = self.vm.as_ref().filter(|vm| vm.firecracker.is_none()) {
            if !vm.qemu.is_file() {
                return Err(format!(
                    "--substrate vm needs QEMU: none at {} (Debian: qemu-system-x86)",
                    vm.qemu.display()
                ));
            }
            if !vm.kernel_dir.is_dir() {
                return Err(format!(
                    "--substrate vm needs a guest kernel at {}: run `space vm setup`",
                    vm.kernel_dir.display()
                ));
            }
        }
        if self.capacity == 0 {
            return Err("--capacity must be at least 1".into());
        }
        if self.warm_pool > 1024 {
            return Err("--warm-pool must be at most 1024".into());
        }
        // Read from the environment into `limits` (the default where unreadable):
        // an unreadable value stops the worker here, before it binds.
        space_image::ImageLimits::from_env()?;
        Ok(())
    }
}
