//! QEMU's command line for one VM, from what the driver decided (pure: the paths and
//! descriptor numbers are passed in).

use std::ffi::OsString;
use std::path::Path;

use super::accel::Accel;

/// The translation cache under software emulation, in MiB.
pub(super) const TB_SIZE_MIB: u64 = 16;
/// The guest console's ring buffer (a power of two).
pub(super) const CONSOLE_BYTES: usize = 64 * 1024;

/// How the guest's agent is reached, as QEMU's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AgentDevice<'a> {
    /// A virtio-serial port served on the Unix socket `socket`.
    Serial {
        /// Where QEMU listens.
        socket: &'a Path,
    },
    /// `vhost-vsock-device` (virtio-mmio: the `microvm` machine has no PCI) with guest
    /// CID `cid`, on the `/dev/vhost-vsock` descriptor `fd` the worker opened and
    /// handed over (QEMU makes it its own: `VHOST_SET_OWNER`, then the CID).
    VhostVsock {
        /// The guest's context ID.
        cid: u32,
        /// QEMU's descriptor number of the device.
        fd: i32,
    },
}

/// Everything QEMU's command line is made of.
#[derive(Debug, Clone)]
pub(super) struct QemuArgs<'a> {
    pub accel: Accel,
    /// Guest RAM, bytes.
    pub ram: u64,
    pub cpus: u32,
    /// `-sandbox`'s options.
    pub sandbox: &'a str,
    /// The uid QEMU drops to (`-runas`), if any.
    pub runas: Option<u32>,
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    /// The kernel command line.
    pub append: &'a str,
    /// QEMU's descriptor numbers of the layers' images, top first.
    pub layer_fds: &'a [i32],
    /// QEMU's descriptor number of the writable disk.
    pub upper_fd: i32,
    pub agent: AgentDevice<'a>,
    pub nic: bool,
    /// The QMP socket.
    pub qmp: &'a Path,
    /// Arguments to wait for an incoming migration (a restore), or none.
    pub incoming: &'a [String],
}

/// QEMU's arguments (after the program).
pub(super) fn qemu_args(a: &QemuArgs<'_>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let mut push = |args: &[&str]| out.extend(args.iter().map(OsString::from));
    let accel = match a.accel {
        Accel::Kvm => "kvm".to_owned(),
        Accel::Tcg => format!("tcg,tb-size={TB_SIZE_MIB}"),
    };
    let cpu = match a.accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    };
    // Guest RAM is never merged with other VMs' (KSM, where the host runs it, would
    // let one tenant time another's memory contents through shared pages) and never
    // written into a core dump of QEMU's.
    push(&[
        "-machine",
        "microvm,mem-merge=off,dump-guest-core=off",
        "-accel",
        &accel,
        "-cpu",
        cpu,
    ]);
    push(&[
        "-m",
        &format!("{}M", a.ram >> 20),
        "-smp",
        &a.cpus.to_string(),
    ]);
    push(&["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    // QEMU's own seccomp filter: no obsolete system calls, no privilege gain, no
    // spawning (snapshots go through descriptors the worker passes), no scheduler or
    // resource changes.
    push(&["-sandbox", a.sandbox]);
    if let Some(uid) = a.runas {
        push(&["-runas", &format!("{uid}:{uid}")]);
    }
    out.push("-kernel".into());
    out.push(a.kernel.into());
    out.push("-initrd".into());
    out.push(a.initramfs.into());
    let mut push = |args: &[&str]| out.extend(args.iter().map(OsString::from));
    push(&["-append", a.append]);
    // The guest's console: a ring buffer of CONSOLE_BYTES in QEMU (read over QMP),
    // never a host file the guest could grow without end.
    push(&[
        "-chardev",
        &format!("ringbuf,id=console,size={CONSOLE_BYTES}"),
        "-serial",
        "chardev:console",
    ]);
    match a.agent {
        AgentDevice::Serial { socket } => push(&[
            "-device",
            "virtio-serial-device",
            "-chardev",
            &format!(
                "socket,id=agent,path={},server=on,wait=off",
                socket.display()
            ),
            "-device",
            &format!(
                "virtserialport,chardev=agent,name={}",
                space_proto::vm::PORT_NAME
            ),
        ]),
        AgentDevice::VhostVsock { cid, fd } => push(&[
            "-device",
            &format!("vhost-vsock-device,id=agent,guest-cid={cid},vhostfd={fd}"),
        ]),
    }
    let drive = |fd: i32, id: &str, ro: bool| {
        format!(
            // An I/O error (a full host disk) is the guest's to see, not a pause of the
            // VM the worker would not know of.
            "file=/proc/self/fd/{fd},if=none,id={id},format=raw,readonly={},cache=none,aio=threads,werror=report,rerror=report,file.locking=off",
            if ro { "on" } else { "off" }
        )
    };
    for (i, &fd) in a.layer_fds.iter().enumerate() {
        push(&[
            "-drive",
            &drive(fd, &format!("layer{i}"), true),
            "-device",
            &format!(
                "virtio-blk-device,drive=layer{i},serial={}",
                space_proto::vm::layer_serial(i)
            ),
        ]);
    }
    push(&[
        "-drive",
        &drive(a.upper_fd, "upper", false),
        "-device",
        &format!(
            "virtio-blk-device,drive=upper,serial={}",
            space_proto::vm::UPPER_SERIAL
        ),
    ]);
    if a.nic {
        // Its user-mode network (every guest the same addresses,
        // `space_proto::vm::GUEST_ADDR` and its gateway), IPv4 only.
        push(&[
            "-netdev",
            &format!(
                "user,id=net0,ipv6=off,net={},host={}",
                space_proto::vm::GUEST_NET,
                space_proto::vm::GUEST_GATEWAY
            ),
            "-device",
            "virtio-net-device,netdev=net0",
        ]);
    }
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", a.qmp.display()),
    ]);
    out.extend(a.incoming.iter().map(OsString::from));
    out
}

/// Whether QEMU's log says its vhost-vsock device could not take its guest CID
/// because another device of the host holds it (`VHOST_VSOCK_SET_GUEST_CID`:
/// `EADDRINUSE`): the start is tried again with another CID.
pub(super) fn cid_taken(log: &str) -> bool {
    log.lines().any(|l| {
        l.contains("vhost-vsock")
            && l.contains("guest cid")
            && (l.contains("Address already in use") || l.contains("EADDRINUSE"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(agent: AgentDevice<'_>) -> Vec<String> {
        let append = super::super::accel::kernel_command_line(
            Accel::Tcg,
            2,
            match agent {
                AgentDevice::Serial { .. } => super::super::transport::AgentTransport::Serial,
                AgentDevice::VhostVsock { .. } => {
                    super::super::transport::AgentTransport::VhostVsock
                }
            },
        );
        qemu_args(&QemuArgs {
            accel: Accel::Tcg,
            ram: 256 << 20,
            cpus: 1,
            sandbox: "on",
            runas: Some(70_000),
            kernel: Path::new("/k/vmlinuz"),
            initramfs: Path::new("/k/initramfs"),
            append: &append,
            layer_fds: &[64, 65],
            upper_fd: 66,
            agent,
            nic: false,
            qmp: Path::new("/run/vm-1.qmp"),
            incoming: &[],
        })
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
    }

    /// The value after each `flag`.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn a_vsock_vm_has_a_vhost_vsock_device_on_the_handed_descriptor_and_no_serial_port() {
        let a = args(AgentDevice::VhostVsock { cid: 1234, fd: 67 });
        let devices = values(&a, "-device");
        assert!(
            devices.contains(&"vhost-vsock-device,id=agent,guest-cid=1234,vhostfd=67"),
            "{devices:?}"
        );
        // virtio-mmio's device, not the PCI one, and no virtio-serial at all.
        assert!(!devices.iter().any(|d| d.starts_with("vhost-vsock-pci")));
        assert!(
            !devices.iter().any(|d| d.contains("virtserial")),
            "{devices:?}"
        );
        assert!(
            !values(&a, "-chardev")
                .iter()
                .any(|c| c.starts_with("socket"))
        );
        let append = values(&a, "-append")[0];
        assert_eq!(
            space_proto::vm::transport_of_command_line(append),
            Some(space_proto::vm::GuestTransport::Vsock),
            "{append}"
        );
        assert!(
            space_proto::vm::vsock_peer_needs_reserved_port(append),
            "{append}"
        );
        assert_eq!(space_proto::vm::layers_of_command_line(append), Some(2));
        // The sandbox and the uid drop stay as they are.
        assert_eq!(values(&a, "-sandbox"), ["on"]);
        assert_eq!(values(&a, "-runas"), ["70000:70000"]);
    }

    #[test]
    fn a_serial_vm_has_its_port_on_the_socket_and_no_vsock() {
        let a = args(AgentDevice::Serial {
            socket: Path::new("/run/vm-1.sock"),
        });
        let devices = values(&a, "-device");
        assert!(devices.contains(&"virtio-serial-device"));
        assert!(!devices.iter().any(|d| d.contains("vsock")), "{devices:?}");
        assert!(
            values(&a, "-chardev")
                .contains(&"socket,id=agent,path=/run/vm-1.sock,server=on,wait=off")
        );
        let append = values(&a, "-append")[0];
        assert_eq!(
            space_proto::vm::transport_of_command_line(append),
            Some(space_proto::vm::GuestTransport::Serial)
        );
        assert!(!space_proto::vm::vsock_peer_needs_reserved_port(append));
        // The disks on their descriptors.
        let drives = values(&a, "-drive");
        assert!(
            drives[0].starts_with("file=/proc/self/fd/64,"),
            "{drives:?}"
        );
        assert!(
            drives[2].starts_with("file=/proc/self/fd/66,") && drives[2].contains("readonly=off")
        );
    }

    #[test]
    fn a_cid_taken_by_another_vm_of_the_host_is_told_from_other_failures() {
        let taken = "qemu-system-x86_64: -device vhost-vsock-device,id=agent,guest-cid=7,vhostfd=67: \
                     vhost-vsock: unable to set guest cid: Address already in use\n";
        assert!(cid_taken(taken));
        for other in [
            "",
            "qemu-system-x86_64: -device vhost-vsock-device,guest-cid=7: vhost-vsock: unable to set guest cid: Invalid argument",
            "qemu-system-x86_64: -qmp unix:/x: Address already in use",
        ] {
            assert!(!cid_taken(other), "{other}");
        }
    }
}
