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
/// The guest's vsock port its agent listens on when the VM has a vsock device
/// (Firecracker's, reached through the VMM's hybrid vsock socket; or QEMU's
/// vhost-vsock, reached by the host's `AF_VSOCK` at the guest's CID).
///
/// Below 1024: the guest kernel lets only a process with `CAP_NET_BIND_SERVICE` (in
/// the initial user namespace) bind a vsock port at or below 1023
/// (`net/vmw_vsock/af_vsock.c`, `__vsock_bind_connectible`: `EACCES` otherwise), so an
/// unprivileged guest process cannot take the agent's port should the agent die, and
/// receive the activation a relink sends. A guest process that is root in the guest
/// still could; the activation then proves nothing to it beyond what it already had
/// (its own sandbox, execution and secret).
pub const VSOCK_PORT: u32 = 1023;
const _: () = assert!(
    VSOCK_PORT <= 1023,
    "the agent's port must be a privileged one"
);
/// The host's vsock context ID: the only peer the guest's agent accepts.
pub const HOST_CID: u32 = 2;
/// The guest's vsock context ID under Firecracker (its `guest_cid`: each VM's hybrid
/// vsock is its own, so every guest has this one). QEMU's vhost-vsock guests have
/// host-wide unique CIDs the worker allocates instead.
pub const GUEST_CID: u32 = 3;
/// The highest reserved vsock port: the kernel lets only a process with
/// `CAP_NET_BIND_SERVICE` bind a port at or below it, on the host as in a guest.
pub const LAST_RESERVED_PORT: u32 = 1023;
/// The kernel command-line parameter saying which host ports the vsock agent accepts
/// connections from: `space.vsock_peer=reserved_port` (QEMU's vhost-vsock, where any
/// host process may connect to any guest's CID) — only from a port at or below
/// [`LAST_RESERVED_PORT`], which the bridge binds and an unprivileged host process
/// cannot. Absent: any port of the host (Firecracker's hybrid vsock, whose socket only
/// the worker's bridge reaches, and whose host ports are its own).
pub const VSOCK_PEER_PARAM: &str = "space.vsock_peer";
/// The value of [`VSOCK_PEER_PARAM`] the QEMU driver writes.
pub const VSOCK_PEER_RESERVED: &str = "reserved_port";
/// The kernel command-line parameter naming the agent's transport
/// (`space.transport=serial|vsock`; absent: serial). Written by the worker's driver:
/// the guest never chooses by probing its devices.
pub const TRANSPORT_PARAM: &str = "space.transport";
/// The kernel command-line parameter saying how the guest finds its disks:
/// `space.disks=order` where the VMM gives block devices no serial of the worker's
/// choosing (Firecracker): the virtio block devices in the order the driver attached
/// them — layer 0 (the top one) to layer N-1, then the writable disk — which is the
/// order of their names (`vda`, `vdb`, …, `vdz`, `vdaa`, …). Absent: by serial.
pub const DISKS_PARAM: &str = "space.disks";
/// The kernel modules of the guest's vsock (virtio vsock: Firecracker's, QEMU's
/// vhost-vsock), loaded after
/// [`GUEST_MODULES`]; a kernel directory prepared before they were added lacks them.
pub const VSOCK_MODULES: &[&str] = &[
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
];

/// How the guest's agent is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestTransport {
    /// The virtio-serial port [`PORT_NAME`] (QEMU).
    Serial,
    /// Vsock port [`VSOCK_PORT`], connections from [`HOST_CID`] only (Firecracker's
    /// hybrid vsock, QEMU's vhost-vsock).
    Vsock,
}

impl GuestTransport {
    /// Its value of [`TRANSPORT_PARAM`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serial => "serial",
            Self::Vsock => "vsock",
        }
    }
}

/// The value of `name=` on a kernel command line: its last occurrence (as the kernel
/// itself takes a repeated parameter).
fn param<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .next_back()
}

/// The transport a kernel command line names: serial without the parameter, `None`
/// for a value this guest does not know (the guest then serves nothing).
pub fn transport_of_command_line(line: &str) -> Option<GuestTransport> {
    match param(line, TRANSPORT_PARAM) {
        None | Some("serial") => Some(GuestTransport::Serial),
        Some("vsock") => Some(GuestTransport::Vsock),
        Some(_) => None,
    }
}

/// Whether a kernel command line restricts the vsock agent's peers to reserved host
/// ports ([`VSOCK_PEER_PARAM`]): any value but none at all does (an unknown one is
/// taken as the stricter rule).
pub fn vsock_peer_needs_reserved_port(line: &str) -> bool {
    param(line, VSOCK_PEER_PARAM).is_some()
}

/// Whether a kernel command line says the disks are found by order
/// ([`DISKS_PARAM`]`=order`).
pub fn disks_by_order(line: &str) -> bool {
    param(line, DISKS_PARAM) == Some("order")
}

/// The order of virtio block device names (`vda` < `vdz` < `vdaa`): shorter first,
/// then alphabetical.
pub fn block_device_order(a: &str, b: &str) -> std::cmp::Ordering {
    (a.len(), a).cmp(&(b.len(), b))
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

    #[test]
    fn the_transport_and_the_disk_order_come_from_the_command_line() {
        use GuestTransport::*;
        assert_eq!(transport_of_command_line("quiet panic=-1"), Some(Serial));
        assert_eq!(
            transport_of_command_line("space.transport=vsock space.layers=1"),
            Some(Vsock)
        );
        assert_eq!(
            transport_of_command_line("space.transport=serial"),
            Some(Serial)
        );
        // The kernel's rule: the last one counts.
        assert_eq!(
            transport_of_command_line("space.transport=serial space.transport=vsock"),
            Some(Vsock)
        );
        for bad in [
            "space.transport=",
            "space.transport=tcp",
            "space.transport=Vsock",
        ] {
            assert_eq!(transport_of_command_line(bad), None, "{bad:?}");
        }
        // A look-alike parameter is not it.
        assert_eq!(
            transport_of_command_line("xspace.transport=vsock"),
            Some(Serial)
        );
        assert!(vsock_peer_needs_reserved_port(&format!(
            "space.transport=vsock {VSOCK_PEER_PARAM}={VSOCK_PEER_RESERVED}"
        )));
        assert!(vsock_peer_needs_reserved_port("space.vsock_peer=other"));
        assert!(!vsock_peer_needs_reserved_port("space.transport=vsock"));
        assert!(!vsock_peer_needs_reserved_port(
            "xspace.vsock_peer=reserved_port"
        ));
        assert!(disks_by_order("a space.disks=order b"));
        assert!(!disks_by_order("space.disks=serial"));
        assert!(!disks_by_order("space.disksx=order"));
        assert_eq!(Vsock.as_str(), "vsock");
        assert_eq!(
            transport_of_command_line(&format!("{TRANSPORT_PARAM}={}", Serial.as_str())),
            Some(Serial)
        );
    }

    #[test]
    fn block_devices_sort_in_attach_order() {
        let mut names = vec!["vdaa", "vdb", "vdz", "vda", "vdab"];
        names.sort_by(|a, b| block_device_order(a, b));
        assert_eq!(names, ["vda", "vdb", "vdz", "vdaa", "vdab"]);
    }
}
