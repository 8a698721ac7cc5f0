//! How a QEMU VM's agent is reached: the virtio-serial port on a host Unix socket, or
//! vhost-vsock (the host's `AF_VSOCK` at the guest's own context ID) where
//! `/dev/vhost-vsock` opens read-write — probed once, when the driver is made, and
//! chosen by the operator's `--vm-transport` (`auto`, `serial`, `vsock`).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The host's vhost-vsock device.
pub const VHOST_VSOCK: &str = "/dev/vhost-vsock";

/// A QEMU VM's agent transport (its device set: a snapshot restores only on the one it
/// was taken on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentTransport {
    /// A virtio-serial port on a Unix socket in the worker's run directory.
    #[default]
    Serial,
    /// A `vhost-vsock-device` with a host-wide unique guest CID.
    VhostVsock,
}

impl AgentTransport {
    /// Its name in logs and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serial => "serial",
            Self::VhostVsock => "vsock",
        }
    }

    /// Whether it is [`AgentTransport::Serial`] (a machine record leaves it out then,
    /// as records were before vhost-vsock).
    pub fn is_serial(&self) -> bool {
        *self == Self::Serial
    }
}

/// What the operator asked for (`--vm-transport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// The serial port. vhost-vsock is not chosen unasked: on it the guest is told
    /// from other host processes only by a reserved source port, and another guest
    /// may reach a bridge's connection through the host's vsock (see the threat
    /// model's known limits) — until that is checked on a host with the device, it is
    /// the operator's choice alone.
    #[default]
    Auto,
    /// The serial port, always.
    Serial,
    /// vhost-vsock, or the worker does not start.
    Vsock,
}

impl std::str::FromStr for TransportChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "serial" => Ok(Self::Serial),
            "vsock" => Ok(Self::Vsock),
            other => Err(format!(
                "--vm-transport: {other:?} is none of auto, serial, vsock"
            )),
        }
    }
}

/// What the host offers: whether `/dev/vhost-vsock` opened read-write, and whether a
/// reserved vsock port could be bound (what each bridge must do: only
/// `CAP_NET_BIND_SERVICE` in the host's first user namespace may), or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVsock {
    /// `Ok` when the device opened read-write; the reason it did not otherwise.
    pub device: Result<(), String>,
    /// `Ok` when a reserved vsock port was bound (and let go); why not otherwise.
    pub reserved_port: Result<(), String>,
}

/// Probes this host: the device opened read-write and closed again, a reserved vsock
/// port bound and let go again.
pub fn probe_host() -> HostVsock {
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(VHOST_VSOCK))
        .map(drop)
        .map_err(|e| format!("{VHOST_VSOCK} does not open read-write: {e}"));
    HostVsock {
        device,
        reserved_port: bind_a_reserved_port(),
    }
}

/// Binds an `AF_VSOCK` socket to a reserved port (any free one of the last hundred)
/// and closes it.
fn bind_a_reserved_port() -> Result<(), String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, VsockAddr, bind, socket};
    use std::os::fd::AsRawFd as _;
    let why = |e: nix::Error| format!("a reserved vsock port cannot be bound: {e}");
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(why)?;
    let last = space_proto::vm::LAST_RESERVED_PORT;
    let mut failed = nix::Error::EADDRINUSE;
    for port in (last - 100..=last).rev() {
        match bind(fd.as_raw_fd(), &VsockAddr::new(libc::VMADDR_CID_ANY, port)) {
            Ok(()) => return Ok(()),
            Err(nix::Error::EADDRINUSE) => continue,
            Err(e) => {
                failed = e;
                break;
            }
        }
    }
    Err(why(failed))
}

#[allow(unsafe_code)]
mod ioctl {
    // `VHOST_VSOCK_SET_GUEST_CID`, `_IOW(VHOST_VIRTIO, 0x60, __u64)`.
    nix::ioctl_write_ptr!(set_guest_cid, 0xaf, 0x60, u64);
}

/// Sets the guest CID of the vhost-vsock device `device` (`VHOST_VSOCK_SET_GUEST_CID`,
/// which needs no owner yet): `EADDRINUSE` when another device of the host holds it.
#[allow(unsafe_code)]
pub(super) fn claim_guest_cid(
    device: &std::os::fd::OwnedFd,
    cid: u32,
) -> Result<(), nix::errno::Errno> {
    let cid = u64::from(cid);
    // SAFETY: `device` is an open descriptor of /dev/vhost-vsock and `cid` a live u64
    // the kernel only reads.
    unsafe { ioctl::set_guest_cid(std::os::fd::AsRawFd::as_raw_fd(device), &cid) }.map(drop)
}

/// The transport for `choice` on a host offering `host`, and why; an error when
/// `vsock` was asked for and the host cannot give it. Pure.
pub fn choose(
    choice: TransportChoice,
    host: &HostVsock,
) -> Result<(AgentTransport, String), String> {
    match choice {
        TransportChoice::Serial => Ok((
            AgentTransport::Serial,
            "the serial port, as --vm-transport serial says".into(),
        )),
        TransportChoice::Auto => Ok((
            AgentTransport::Serial,
            "the serial port (vhost-vsock only on --vm-transport vsock)".into(),
        )),
        TransportChoice::Vsock => match (&host.device, &host.reserved_port) {
            (Ok(()), Ok(())) => Ok((
                AgentTransport::VhostVsock,
                format!("{VHOST_VSOCK} opens read-write: vhost-vsock"),
            )),
            (Err(why), _) | (Ok(()), Err(why)) => Err(format!("--vm-transport vsock: {why}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vhost_vsock_only_when_asked_for_where_the_device_opens_and_a_reserved_port_binds() {
        let ok = HostVsock {
            device: Ok(()),
            reserved_port: Ok(()),
        };
        let none = HostVsock {
            device: Err("no such device".into()),
            reserved_port: Ok(()),
        };
        let no_port = HostVsock {
            device: Ok(()),
            reserved_port: Err("permission denied".into()),
        };
        let pick = |c, h: &HostVsock| choose(c, h).map(|(t, _)| t);
        // Not unasked, even where the host has it (threat model, known limits).
        for host in [&ok, &none, &no_port] {
            assert_eq!(
                pick(TransportChoice::Auto, host),
                Ok(AgentTransport::Serial)
            );
            assert_eq!(
                pick(TransportChoice::Serial, host),
                Ok(AgentTransport::Serial)
            );
        }
        assert_eq!(
            pick(TransportChoice::Vsock, &ok),
            Ok(AgentTransport::VhostVsock)
        );
        // Asked for and missing (the device, or a reserved port: root in a user
        // namespace has no CAP_NET_BIND_SERVICE where the guest kernel checks it):
        // the worker does not start, saying why.
        let err = choose(TransportChoice::Vsock, &none).unwrap_err();
        assert!(err.contains("no such device"), "{err}");
        let err = choose(TransportChoice::Vsock, &no_port).unwrap_err();
        assert!(err.contains("permission denied"), "{err}");
    }

    #[test]
    fn the_cid_ioctl_is_vhost_vsocks_and_refuses_what_is_no_vhost_device() {
        // `_IOW(0xAF, 0x60, __u64)` as the kernel's <linux/vhost.h> defines it.
        assert_eq!(nix::request_code_write!(0xaf, 0x60, 8), 0x4008_af60);
        // On a descriptor of something else the kernel refuses it, changing nothing.
        let t = tempfile::tempfile().unwrap();
        let err = claim_guest_cid(&std::os::fd::OwnedFd::from(t), 42).unwrap_err();
        assert_eq!(err, nix::errno::Errno::ENOTTY);
    }

    #[test]
    fn the_flag_takes_three_values() {
        assert_eq!("auto".parse(), Ok(TransportChoice::Auto));
        assert_eq!("serial".parse(), Ok(TransportChoice::Serial));
        assert_eq!("vsock".parse(), Ok(TransportChoice::Vsock));
        assert!("vhost".parse::<TransportChoice>().is_err());
    }
}
