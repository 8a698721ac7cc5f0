//! Resource limits: as asked at create, as a worker applies them, as shown.

use serde::{Deserialize, Serialize};

/// `limits` of `POST /v1/sandboxes`: each one positive and at most the platform's
/// maximum (400 `invalid_limits` otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// Memory (RAM and swap together) in MiB; past it the kernel kills inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// CPU bandwidth in cores (`0.5`, `2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Most processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Disk the sandbox's files may take, in MiB; writes past it fail inside
    /// (`EDQUOT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
}

/// A sandbox's limits as shown (`"limits"` of a sandbox).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitsView {
    /// Memory in MiB.
    pub memory_mib: u64,
    /// CPU bandwidth in cores.
    pub cpus: f64,
    /// Most processes and threads.
    pub pids: u32,
    /// Disk in MiB (0: not limited).
    pub disk_mib: u64,
}

impl From<&Limits> for LimitsView {
    fn from(l: &Limits) -> Self {
        Self {
            memory_mib: l.memory_bytes >> 20,
            cpus: f64::from(l.cpu_millis) / 1000.0,
            pids: l.pids,
            disk_mib: l.disk_bytes >> 20,
        }
    }
}

/// Resource limits of one sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Limits {
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Most processes.
    pub pids: u32,
    /// CPU in milli-cores.
    pub cpu_millis: u32,
    /// Disk in bytes; 0 (what an install from before disk limits carries): not
    /// limited.
    #[serde(default)]
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 << 20,
            pids: 256,
            cpu_millis: 1000,
            disk_bytes: 1 << 30,
        }
    }
}

impl Limits {
    /// The most a create may ask unless configured otherwise: 16 GiB, 8 cores, 4096
    /// processes, 64 GiB of disk.
    pub const DEFAULT_MAXIMA: Limits = Limits {
        memory_bytes: 16 << 30,
        pids: 4096,
        cpu_millis: 8000,
        disk_bytes: 64 << 30,
    };

    /// `self` with what the configuration `lookup` sets: `SPACE_<WHICH>_MEMORY_MIB`,
    /// `_CPUS`, `_PIDS`, `_DISK_MIB` (`WHICH` is `DEFAULT` or `MAX`); unparseable values
    /// are ignored. `space up` passes its environment to the control plane and the
    /// workers alike (`|k| std::env::var(k).ok()`), so both see the same values.
    pub fn configured(self, which: &str, lookup: impl Fn(&str) -> Option<String>) -> Limits {
        let var = |name: &str| lookup(&format!("SPACE_{which}_{name}"));
        let mib = |name: &str| var(name).and_then(|v| v.trim().parse::<u64>().ok());
        Limits {
            memory_bytes: mib("MEMORY_MIB")
                .map_or(self.memory_bytes, |m| m.saturating_mul(1 << 20)),
            pids: var("PIDS")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(self.pids),
            cpu_millis: var("CPUS")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|c| c.is_finite() && *c > 0.0 && *c <= 1e6)
                .map_or(self.cpu_millis, |c| (c * 1000.0).round() as u32),
            disk_bytes: mib("DISK_MIB").map_or(self.disk_bytes, |m| m.saturating_mul(1 << 20)),
        }
    }
}
