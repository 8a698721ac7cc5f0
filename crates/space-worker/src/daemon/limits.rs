//! The worker's side of sandbox limits: the defaults its warm jails are launched with,
//! the most an install may ask for, and the size of its disk volume.

use space_proto::api::Limits;

/// Limits settings of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    /// What the control plane gives a sandbox that names no limits: warm jails are
    /// launched with these, so only such sandboxes start from one.
    pub defaults: Limits,
    /// The most an install may carry; a larger one is refused (400).
    pub maxima: Limits,
    /// Size of the disk volume's sparse image when the worker makes it (`None`: a
    /// quarter of the free space, at most 64 GiB).
    pub disk_image_bytes: Option<u64>,
    /// What a template's layers may unpack to in the worker's store (see
    /// [`space_image::ImageLimits`]).
    pub images: space_image::ImageLimits,
}

impl Default for WorkerLimits {
    /// The control plane's defaults and maxima (see `space_control::limits`).
    fn default() -> Self {
        Self {
            defaults: Limits::default(),
            maxima: Limits::DEFAULT_MAXIMA,
            disk_image_bytes: None,
            images: space_image::ImageLimits::default(),
        }
    }
}

impl WorkerLimits {
    /// The defaults with what the environment changes (see [`Limits::configured`];
    /// `SPACE_DISK_IMAGE_GIB` for the volume; `SPACE_TEMPLATE_MAX_LAYER_BYTES` and
    /// `SPACE_TEMPLATE_MAX_IMAGE_BYTES` for templates, whose bad values
    /// [`super::config::WorkerConfig::validate`] refuses).
    pub fn from_env() -> Self {
        let base = Self::default();
        Self {
            defaults: base
                .defaults
                .configured("DEFAULT", |k| std::env::var(k).ok()),
            maxima: base.maxima.configured("MAX", |k| std::env::var(k).ok()),
            disk_image_bytes: std::env::var("SPACE_DISK_IMAGE_GIB")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|g| g.saturating_mul(1 << 30)),
            images: space_image::ImageLimits::from_env().unwrap_or_default(),
        }
    }

    /// Why `asked` is over this worker's maxima, if it is. A disk of 0 (an install
    /// from before disk limits) is unlimited, and allowed.
    pub fn refusal(&self, asked: &Limits) -> Option<String> {
        let max = &self.maxima;
        let over = [
            ("memory", asked.memory_bytes > max.memory_bytes),
            ("pids", asked.pids > max.pids),
            ("cpu", asked.cpu_millis > max.cpu_millis),
            ("disk", asked.disk_bytes > max.disk_bytes),
        ];
        let names: Vec<&str> = over.iter().filter(|(_, o)| *o).map(|(n, _)| *n).collect();
        (!names.is_empty()).then(|| {
            format!(
                "limits over this worker's maxima ({}): at most {} MiB memory, {} pids, \
                 {} cpus, {} MiB disk",
                names.join(", "),
                max.memory_bytes >> 20,
                max.pids,
                f64::from(max.cpu_millis) / 1000.0,
                max.disk_bytes >> 20
            )
        })
    }
}

/// The substrate's limits for an install's.
pub fn substrate_limits(l: &Limits) -> crate::substrate::Limits {
    crate::substrate::Limits {
        memory_bytes: Some(l.memory_bytes),
        pids_max: Some(u64::from(l.pids)),
        cpu_millis: Some(l.cpu_millis),
        disk_bytes: (l.disk_bytes > 0).then_some(l.disk_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_over_the_maxima_are_refused_naming_what_is_over() {
        let w = WorkerLimits::default();
        assert_eq!(w.refusal(&w.defaults), None);
        let big = Limits {
            memory_bytes: 32 << 30,
            disk_bytes: 128 << 30,
            ..w.defaults
        };
        let why = w.refusal(&big).unwrap();
        assert!(why.contains("memory, disk"), "{why}");
    }
}
