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
    /// vhost-vsock where the device opens read-write and the bridge can bind a
    /// reserved vsock port (root), the serial port otherwise.
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

/// What the host offers: whether `/dev/vhost-vsock` opened read-write (or why not),
/// and whether the bridge may bind a reserved vsock port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVsock {
    /// `Ok` when the device opened read-write; the reason it did not otherwise.
    pub device: Result<(), String>,
    /// Whether the worker (and so its bridges) is root: a reserved vsock port needs
    /// `CAP_NET_BIND_SERVICE`.
    pub root: bool,
}

/// Probes this host: the device opened read-write and closed again.
pub fn probe_host() -> HostVsock {
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(VHOST_VSOCK))
        .map(drop)
        .map_err(|e| format!("{VHOST_VSOCK} does not open read-write: {e}"));
    HostVsock {
        device,
        root: rustix::process::geteuid().is_root(),
    }
}

/// The transport for `choice` on a host offering `host`, and why; an error when
/// `vsock` was asked for and the host cannot give it. Pure.
pub fn choose(
    choice: TransportChoice,
    host: &HostVsock,
) -> Result<(AgentTransport, String), String> {
    let usable = match (&host.device, host.root) {
        (Ok(()), true) => Ok(()),
        (Err(e), _) => Err(e.clone()),
        (Ok(()), false) => Err(format!(
            "{VHOST_VSOCK} opens, but the bridge cannot bind a reserved vsock port (the \
             guest serves no other) without root"
        )),
    };
    match (choice, usable) {
        (TransportChoice::Serial, _) => Ok((
            AgentTransport::Serial,
            "the serial port, as --vm-transport serial says".into(),
        )),
        (TransportChoice::Vsock | TransportChoice::Auto, Ok(())) => Ok((
            AgentTransport::VhostVsock,
            format!("{VHOST_VSOCK} opens read-write: vhost-vsock"),
        )),
        (TransportChoice::Auto, Err(why)) => {
            Ok((AgentTransport::Serial, format!("{why}: the serial port")))
        }
        (TransportChoice::Vsock, Err(why)) => Err(format!("--vm-transport vsock: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_vhost_vsock_only_where_the_device_opens_and_the_worker_is_root() {
        let ok = HostVsock {
            device: Ok(()),
            root: true,
        };
        let none = HostVsock {
            device: Err("no such device".into()),
            root: true,
        };
        let rootless = HostVsock {
            device: Ok(()),
            root: false,
        };
        let pick = |c, h: &HostVsock| choose(c, h).map(|(t, _)| t);
        assert_eq!(
            pick(TransportChoice::Auto, &ok),
            Ok(AgentTransport::VhostVsock)
        );
        assert_eq!(
            pick(TransportChoice::Auto, &none),
            Ok(AgentTransport::Serial)
        );
        assert_eq!(
            pick(TransportChoice::Auto, &rootless),
            Ok(AgentTransport::Serial)
        );
        assert_eq!(
            pick(TransportChoice::Serial, &ok),
            Ok(AgentTransport::Serial)
        );
        assert_eq!(
            pick(TransportChoice::Vsock, &ok),
            Ok(AgentTransport::VhostVsock)
        );
        // Asked for and missing: the worker does not start, saying why.
        let err = choose(TransportChoice::Vsock, &none).unwrap_err();
        assert!(err.contains("no such device"), "{err}");
        assert!(choose(TransportChoice::Vsock, &rootless).is_err());
        // The reason names the device when it falls back.
        assert!(
            choose(TransportChoice::Auto, &none)
                .unwrap()
                .1
                .contains("no such device")
        );
    }

    #[test]
    fn the_flag_takes_three_values() {
        assert_eq!("auto".parse(), Ok(TransportChoice::Auto));
        assert_eq!("serial".parse(), Ok(TransportChoice::Serial));
        assert_eq!("vsock".parse(), Ok(TransportChoice::Vsock));
        assert!("vhost".parse::<TransportChoice>().is_err());
    }
}
