//! Per-sandbox resource limits (defaults and maxima of the platform), the
//! per-tenant sandbox quota, and what an imported template's layers may unpack to.
//!
//! A create's `limits` are resolved once, against the defaults and maxima in force,
//! and stored with the sandbox: every execution of it (relaunch, resume, migration)
//! is installed with the same limits, whatever the flags of a later control plane.

use space_proto::api::{Limits, LimitsRequest};
use space_store::SandboxLimits;

use crate::error::ControlError;

const MIB: u64 = 1 << 20;

/// Smallest limits a sandbox may ask for: below them its agent cannot run.
const MIN_MEMORY_MIB: u64 = 32;
const MIN_PIDS: u32 = 8;
const MIN_CPU_MILLIS: u32 = 10;
const MIN_DISK_MIB: u64 = 16;

/// Live sandboxes a tenant may have when no flag says otherwise.
pub const DEFAULT_TENANT_SANDBOXES: u64 = 100;

/// What a create gets when it names no limit, the most it may name, and the
/// per-tenant sandbox quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsPolicy {
    /// Limits of a create that names none (and of standby sandboxes).
    pub defaults: Limits,
    /// The most a create may ask for.
    pub maxima: Limits,
    /// Live (not stopped) sandboxes one tenant may have; standby sandboxes belong to
    /// no tenant until claimed and do not count.
    pub tenant_sandboxes: u64,
    /// What an imported image's layers may decompress to, each and together, while
    /// the import hashes them (`SPACE_TEMPLATE_MAX_LAYER_BYTES`,
    /// `SPACE_TEMPLATE_MAX_IMAGE_BYTES`; 16 GiB each by default).
    pub templates: space_image::ImageLimits,
}

impl Default for LimitsPolicy {
    /// Defaults: 512 MiB, one core, 256 processes, 1 GiB of disk; maxima: 16 GiB, 8
    /// cores, 4096 processes, 64 GiB of disk; 100 sandboxes per tenant.
    fn default() -> Self {
        Self {
            defaults: Limits::default(),
            maxima: Limits::DEFAULT_MAXIMA,
            tenant_sandboxes: DEFAULT_TENANT_SANDBOXES,
            templates: space_image::ImageLimits::default(),
        }
    }
}

impl LimitsPolicy {
    /// The defaults with what the environment changes (see [`Limits::configured`];
    /// `SPACE_TENANT_SANDBOXES` for the quota).
    pub fn from_env() -> Self {
        let base = Self::default();
        Self {
            defaults: base
                .defaults
                .configured("DEFAULT", |k| std::env::var(k).ok()),
            maxima: base.maxima.configured("MAX", |k| std::env::var(k).ok()),
            tenant_sandboxes: std::env::var("SPACE_TENANT_SANDBOXES")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(base.tenant_sandboxes),
            templates: space_image::ImageLimits::from_env().unwrap_or_else(|e| {
                tracing::error!(error = %e, "template limits: the defaults are used");
                base.templates
            }),
        }
    }
}

fn invalid(message: String) -> ControlError {
    ControlError::InvalidLimits(message)
}

impl LimitsPolicy {
    /// Checks the policy itself (defaults within the maxima and above the minimums).
    pub fn validate(&self) -> Result<(), String> {
        self.resolve(Some(&view_request(&self.defaults)))
            .map(drop)
            .map_err(|e| format!("default limits: {}", e))
    }

    /// The limits of a create asking for `req`: each named limit at least the minimum
    /// and at most the maximum (`400 invalid_limits` otherwise), the rest defaults.
    pub fn resolve(&self, req: Option<&LimitsRequest>) -> Result<Limits, ControlError> {
        let Some(req) = req else {
            return Ok(self.defaults);
        };
        let (d, max) = (&self.defaults, &self.maxima);
        let memory_bytes = match req.memory_mib {
            None => d.memory_bytes,
            Some(m) if (MIN_MEMORY_MIB..=max.memory_bytes / MIB).contains(&m) => m * MIB,
            Some(m) => {
                return Err(invalid(format!(
                    "memory_mib {m} must be {MIN_MEMORY_MIB} to {}",
                    max.memory_bytes / MIB
                )));
            }
        };
        let pids = match req.pids {
            None => d.pids,
            Some(p) if (MIN_PIDS..=max.pids).contains(&p) => p,
            Some(p) => {
                return Err(invalid(format!(
                    "pids {p} must be {MIN_PIDS} to {}",
                    max.pids
                )));
            }
        };
        let cpu_millis = match req.cpus {
            None => d.cpu_millis,
            Some(c) => {
                let millis = c * 1000.0;
                let max_cpus = f64::from(max.cpu_millis) / 1000.0;
                if !millis.is_finite()
                    || millis.round() < f64::from(MIN_CPU_MILLIS)
                    || millis.round() > f64::from(max.cpu_millis)
                {
                    return Err(invalid(format!(
                        "cpus {c} must be {} to {max_cpus}",
                        f64::from(MIN_CPU_MILLIS) / 1000.0
                    )));
                }
                millis.round() as u32
            }
        };
        let disk_bytes = match req.disk_mib {
            None => d.disk_bytes,
            Some(m) if (MIN_DISK_MIB..=max.disk_bytes / MIB).contains(&m) => m * MIB,
            Some(m) => {
                return Err(invalid(format!(
                    "disk_mib {m} must be {MIN_DISK_MIB} to {}",
                    max.disk_bytes / MIB
                )));
            }
        };
        Ok(Limits {
            memory_bytes,
            pids,
            cpu_millis,
            disk_bytes,
        })
    }

    /// `Ok` while `live` sandboxes leave room for one more; `429 quota_exceeded`
    /// otherwise.
    pub fn admit(&self, live: u64) -> Result<(), ControlError> {
        if live < self.tenant_sandboxes {
            return Ok(());
        }
        Err(ControlError::Quota {
            live,
            quota: self.tenant_sandboxes,
        })
    }
}

fn view_request(l: &Limits) -> LimitsRequest {
    LimitsRequest {
        memory_mib: Some(l.memory_bytes / MIB),
        cpus: Some(f64::from(l.cpu_millis) / 1000.0),
        pids: Some(l.pids),
        disk_mib: Some(l.disk_bytes / MIB),
    }
}

/// As stored with the sandbox.
pub fn to_store(l: &Limits) -> SandboxLimits {
    SandboxLimits {
        memory_bytes: l.memory_bytes,
        pids: l.pids,
        cpu_millis: l.cpu_millis,
        disk_bytes: l.disk_bytes,
    }
}

/// The limits of a stored sandbox; one stored before limits existed gets the
/// built-in defaults without a disk limit (its files may already be larger).
pub fn of_store(l: Option<&SandboxLimits>) -> Limits {
    match l {
        Some(l) => Limits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpu_millis: l.cpu_millis,
            disk_bytes: l.disk_bytes,
        },
        None => Limits {
            disk_bytes: 0,
            ..Limits::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(f: impl FnOnce(&mut LimitsRequest)) -> LimitsRequest {
        let mut r = LimitsRequest::default();
        f(&mut r);
        r
    }

    #[test]
    fn named_limits_replace_defaults_and_the_rest_stay() {
        let p = LimitsPolicy::default();
        assert_eq!(p.resolve(None).unwrap(), p.defaults);
        let l = p
            .resolve(Some(&req(|r| {
                r.memory_mib = Some(256);
                r.cpus = Some(0.5);
                r.disk_mib = Some(64);
            })))
            .unwrap();
        assert_eq!(
            l,
            Limits {
                memory_bytes: 256 << 20,
                cpu_millis: 500,
                disk_bytes: 64 << 20,
                pids: p.defaults.pids,
            }
        );
        p.validate().unwrap();
    }

    #[test]
    fn limits_past_the_maxima_or_not_positive_are_refused_with_400() {
        let p = LimitsPolicy::default();
        for bad in [
            req(|r| r.memory_mib = Some(0)),
            req(|r| r.memory_mib = Some(u64::MAX)),
            req(|r| r.memory_mib = Some(16 * 1024 + 1)),
            req(|r| r.pids = Some(0)),
            req(|r| r.pids = Some(4097)),
            req(|r| r.cpus = Some(0.0)),
            req(|r| r.cpus = Some(-1.0)),
            req(|r| r.cpus = Some(f64::NAN)),
            req(|r| r.cpus = Some(f64::INFINITY)),
            req(|r| r.cpus = Some(8.001)),
            req(|r| r.disk_mib = Some(0)),
            req(|r| r.disk_mib = Some(u64::MAX / 2)),
        ] {
            let e = p.resolve(Some(&bad)).unwrap_err();
            assert!(matches!(e, ControlError::InvalidLimits(_)), "{bad:?}");
        }
    }

    #[test]
    fn the_quota_admits_below_it_and_refuses_at_it_with_429() {
        let p = LimitsPolicy {
            tenant_sandboxes: 2,
            ..LimitsPolicy::default()
        };
        assert!(p.admit(1).is_ok());
        let e = p.admit(2).unwrap_err();
        assert!(matches!(e, ControlError::Quota { live: 2, quota: 2 }));
        assert_eq!(
            e.to_string(),
            "this tenant has 2 live sandboxes, its quota is 2: delete one first"
        );
    }

    #[test]
    fn stored_limits_round_trip_and_old_rows_get_no_disk_limit() {
        let l = LimitsPolicy::default().maxima;
        assert_eq!(of_store(Some(&to_store(&l))), l);
        assert_eq!(of_store(None).disk_bytes, 0);
    }
}
