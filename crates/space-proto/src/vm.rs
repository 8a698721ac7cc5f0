//! What a VM sandbox's host and guest agree on: how the guest boots (its initramfs
//! layout, its disks) and how its agent is reached (a virtio-serial port carrying a
//! `space-mux` link whose first control message is the activation record).

/// The virtio-serial port's name (`/sys/class/virtio-ports/*/name`).
pub const PORT_NAME: &str = "space.agent";
/// The initramfs directory holding the kernel modules the guest loads at boot.
pub const MODULES_DIR: &str = "/lib/space/modules";
/// The file in [`MODULES_DIR`] naming the modules to load, one per line, in order.
pub const MODULES_ORDER: &str = "order";
/// The serial of the template's disk (read-only, ext4), as the guest finds it
/// (`/sys/block/*/serial`: device order is not stable across machine types).
pub const ROOT_SERIAL: &str = "space-root";
/// The serial of the sandbox's writable disk (ext4, its size the disk limit).
pub const UPPER_SERIAL: &str = "space-upper";
/// The guest's answer once it serves the activation it was sent.
pub const READY: &[u8] = b"ready";
/// Streams a link carries at once (the bridge's connection limit).
pub const MAX_STREAMS: usize = 256;
/// The kernel modules a guest needs, in load order (their names without `.ko`):
/// virtio on PCI and MMIO, the console (serial ports) and block devices, and overlay.
pub const GUEST_MODULES: &[&str] = &[
    "virtio",
    "virtio_ring",
    "virtio_mmio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "virtio_console",
    "virtio_blk",
    "overlay",
];
