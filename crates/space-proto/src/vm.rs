//! What a VM sandbox's host and guest agree on: how the guest boots (its initramfs
//! layout, its disks) and how its agent is reached (a virtio-serial port carrying a
//! `space-mux` link whose first control message is the activation record).

/// The virtio-serial port's name (`/sys/class/virtio-ports/*/name`).
pub const PORT_NAME: &str = "space.agent";
/// The initramfs directory holding the kernel modules the guest loads at boot.
pub const MODULES_DIR: &str = "/lib/space/modules";
/// The file in [`MODULES_DIR`] naming the modules to load, one per line, in order.
pub const MODULES_ORDER: &str = "order";
/// The serials of the template's disks, one per layer (read-only, ext4), as the
/// guest finds them (`/sys/block/*/serial`: device order is not stable across machine
/// types): this prefix and the layer's place, `0` the top one.
pub const LAYER_SERIAL_PREFIX: &str = "space-layer-";
/// The kernel command-line parameter saying how many layer disks there are
/// (`space.layers=N`, 1 to [`MAX_LAYERS`]).
pub const LAYERS_PARAM: &str = "space.layers";
/// Most layers a VM's template may have (a disk each).
pub const MAX_LAYERS: usize = 16;

/// The serial of layer `i` (`0` the top one).
pub fn layer_serial(i: usize) -> String {
    format!("{LAYER_SERIAL_PREFIX}{i}")
}

/// The number of layers a kernel command line names, if it names a valid one.
pub fn layers_of_command_line(line: &str) -> Option<usize> {
    let n: usize = line
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(LAYERS_PARAM)?.strip_prefix('='))?
        .parse()
        .ok()?;
    (1..=MAX_LAYERS).contains(&n).then_some(n)
}
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
    "virtio_net",
    "overlay",
];

/// The guest's network, the same in every VM (it survives a snapshot and a
/// migration unchanged): its NIC is QEMU's user-mode network inside the execution's
/// own network namespace on the host, whose connections leave from that namespace —
/// through the sandbox's veth and the worker's egress rules when it has a link,
/// nowhere without one. The guest's interface.
pub const GUEST_NIC: &str = "eth0";
/// The guest's address (QEMU's user-mode network gives out this one).
pub const GUEST_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 2, 15);
/// The guest network's mask.
pub const GUEST_NETMASK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(255, 255, 255, 0);
/// The guest's gateway (QEMU's side).
pub const GUEST_GATEWAY: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 2, 2);
/// The guest network, as QEMU's `-netdev user,net=` takes it.
pub const GUEST_NET: &str = "10.0.2.0/24";
/// The resolver a guest asks (as a jail's `/etc/resolv.conf` names it): DNS to any
/// address from a sandbox with a link is answered by the platform's resolver.
pub const GUEST_RESOLVER: &str = "169.254.169.253";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_count_is_read_from_the_command_line_and_bounded() {
        assert_eq!(
            layers_of_command_line("quiet space.layers=2 panic=-1"),
            Some(2)
        );
        assert_eq!(layers_of_command_line("space.layers=1"), Some(1));
        for bad in [
            "",
            "space.layers=0",
            "space.layers=17",
            "space.layers=x",
            "space.layersx=2",
        ] {
            assert_eq!(layers_of_command_line(bad), None, "{bad:?}");
        }
        assert_eq!(layer_serial(15), "space-layer-15");
        // virtio-blk serials are at most 20 bytes.
        assert!(layer_serial(MAX_LAYERS - 1).len() <= 20);
    }
}
