//! A VM worker's driver: QEMU's (`--substrate vm`) or Firecracker's (`--substrate vm
//! --vmm firecracker`), with what the daemon needs of either beyond [`Substrate`] —
//! memory snapshots in the shared layout (`vm::snapshot`).

use std::path::Path;
use std::sync::Arc;

use super::firecracker::FirecrackerDriver;
use super::vm::QemuDriver;
use super::vm::snapshot::VmSnapshot;
use super::{SandboxHandle, Substrate, SubstrateError};

/// The VMM driver of a VM worker.
#[derive(Debug, Clone)]
pub enum VmDriver {
    /// VMs under QEMU.
    Qemu(Arc<QemuDriver>),
    /// VMs under Firecracker.
    Firecracker(Arc<FirecrackerDriver>),
}

impl VmDriver {
    /// The driver as the daemon's substrate.
    pub fn substrate(&self) -> Arc<dyn Substrate> {
        match self {
            Self::Qemu(d) => Arc::clone(d) as Arc<dyn Substrate>,
            Self::Firecracker(d) => Arc::clone(d) as Arc<dyn Substrate>,
        }
    }

    /// A memory snapshot of `handle`'s VM into `dir`, the VM left paused.
    pub fn snapshot(
        &self,
        handle: &SandboxHandle,
        dir: &Path,
    ) -> Result<VmSnapshot, SubstrateError> {
        match self {
            Self::Qemu(d) => d.snapshot(handle, dir),
            Self::Firecracker(d) => d.snapshot(handle, dir),
        }
    }

    /// Holds what a VM re-adopted after a restart holds of the driver's (a QEMU VM's
    /// guest CID); `false` if another VM of this worker holds it.
    pub fn hold(&self, handle: &SandboxHandle) -> bool {
        match self {
            Self::Qemu(d) => d.hold_guest_cid(handle),
            Self::Firecracker(_) => true,
        }
    }
}
