//! Whether Firecracker can run guests here: a `/dev/kvm` on which a stock kernel boots,
//! probed as `substrate::vm::accel` probes it for QEMU — the guest kernel started
//! without a root must reach its root mount (`VFS:`) or its panic within a bound — but
//! under Firecracker itself (`--no-api`, a configuration file), so what is probed is
//! exactly what the driver needs. A nested KVM that cannot boot a stock kernel (this
//! host class's) never gets there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the probe's guest may take.
const PROBE_WAIT: Duration = Duration::from_secs(15);
/// Console bytes kept.
const PROBE_OUTPUT: usize = 256 * 1024;

/// The probe's configuration file: the kernel alone, 128 MiB, one vCPU, its console
/// on Firecracker's stdout.
pub fn probe_config(vmlinux: &Path) -> serde_json::Value {
    serde_json::json!({
        "boot-source": {
            "kernel_image_path": vmlinux.to_string_lossy(),
            "boot_args": "console=ttyS0 reboot=k panic=-1 pci=off",
        },
        "drives": [],
        "machine-config": { "vcpu_count": 1, "mem_size_mib": 128, "smt": false },
    })
}

/// Whether a probe's console shows a kernel that booted (it reached its root mount,
/// or panicked for want of one).
pub fn booted(console: &str) -> bool {
    console.contains("VFS:") || console.contains("Kernel panic")
}

/// Whether `firecracker` boots `vmlinux` here, and why (or why not); its
/// configuration file is written in `work_dir` (and removed).
pub fn kvm_boots(firecracker: &Path, vmlinux: &Path, work_dir: &Path) -> (bool, String) {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return (false, "no usable /dev/kvm".into());
    }
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let config = work_dir.join(format!(
        "firecracker-probe-{}-{}.json",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = std::fs::create_dir_all(work_dir)
        .and_then(|()| std::fs::write(&config, probe_config(vmlinux).to_string()));
    if let Err(e) = written {
        return (false, format!("probe configuration: {e}"));
    }
    let result = run_probe(firecracker, &config, work_dir);
    let _ = std::fs::remove_file(&config);
    result
}

fn run_probe(firecracker: &Path, config: &Path, work_dir: &Path) -> (bool, String) {
    let child = Command::new(firecracker)
        .arg("--no-api")
        .arg("--config-file")
        .arg(config)
        .current_dir(work_dir)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => return (false, format!("the probe did not start: {e}")),
    };
    let (text, last) = super::super::vm::shared::probe_output(child, PROBE_OUTPUT, PROBE_WAIT);
    if booted(&text) {
        return (true, "a stock guest kernel boots under Firecracker".into());
    }
    (
        false,
        format!(
            "KVM does not boot a stock kernel under Firecracker here (the probe's guest \
             stopped at {last:?} within {} s)",
            PROBE_WAIT.as_secs()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_boots_the_kernel_alone_and_reads_its_console() {
        let c = probe_config(Path::new("/k/vmlinux"));
        assert_eq!(c["boot-source"]["kernel_image_path"], "/k/vmlinux");
        assert_eq!(c["drives"], serde_json::json!([]));
        assert_eq!(c["machine-config"]["mem_size_mib"], 128);
        assert!(booted("[ 1.2] VFS: Cannot open root device"));
        assert!(booted("Kernel panic - not syncing"));
        assert!(!booted("Booting the kernel.\n"));
    }
}
