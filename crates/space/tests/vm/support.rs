//! What the platform's VM tests share: the host programs they need and the guest
//! kernel, prepared once per checkout.

use std::path::{Path, PathBuf};

pub const BUSYBOX: &str = "/bin/busybox";
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";

/// What this host lacks for a VM sandbox of the sample template, if anything.
pub fn missing_vm() -> Option<String> {
    if !Path::new(QEMU).is_file() {
        return Some(format!("needs {QEMU} (Debian: qemu-system-x86)"));
    }
    if !space_worker::substrate::jail::template::is_static(Path::new(BUSYBOX)) {
        return Some(format!(
            "needs a statically linked busybox at {BUSYBOX} (Debian: busybox-static)"
        ));
    }
    None
}

/// The guest kernel, prepared once per checkout (as the worker's VM tests do).
pub fn kernel_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/space-vm/kernel");
    space_worker::substrate::vm::kernel::setup(&dir, None, &mut |step| {
        eprintln!("vm setup: {step}")
    })
    .unwrap_or_else(|e| panic!("preparing the guest kernel: {e}"));
    dir
}
