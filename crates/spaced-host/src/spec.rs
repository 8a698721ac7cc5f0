//! What the worker tells a bridge at launch.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use space_peer::ProcessIdentity;
use space_proto::guest::Activation;

/// Largest spec a bridge reads.
pub const MAX_SPEC_LEN: usize = 16 * 1024;

/// A bridge's launch specification, passed as JSON on a file descriptor (never on the
/// command line: it holds the activation secret).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSpec {
    /// Where the bridge listens for the worker (inside a 0700 worker-owned directory).
    pub listen: PathBuf,
    /// The guest transport: the agent's listening socket.
    pub agent_socket: PathBuf,
    /// The only uid allowed to connect.
    pub worker_uid: u32,
    /// The recorded agent process that must be the transport's peer.
    pub agent: ProcessIdentity,
    /// The execution the agent must prove, with its secret.
    pub activation: Activation,
    /// Most connections served at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// How the agent is reached through `agent_socket`.
    #[serde(default)]
    pub transport: Transport,
}

/// How the bridge reaches the agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// The agent listens on `agent_socket` (a jail's): one new connection per worker
    /// connection, its peer the recorded agent process.
    #[default]
    Socket,
    /// `agent_socket` is a VM's virtio-serial port, served by its VMM (the recorded
    /// `agent` process is QEMU): one connection for the bridge's life, carrying a
    /// `space-mux` link whose first control message is the activation record.
    Serial,
    /// `agent_socket` is a VM's hybrid vsock socket, served by its VMM (Firecracker,
    /// the recorded `agent` process): one connection for the bridge's life, opened
    /// to the guest's vsock port with `CONNECT`, carrying a `space-mux` link as
    /// [`Transport::Serial`] does.
    Vsock,
    /// The guest's vsock port [`space_proto::vm::VSOCK_PORT`] at context ID `cid`,
    /// reached with the host's `AF_VSOCK` through QEMU's vhost-vsock device (the
    /// recorded `agent` process is QEMU, holding `/dev/vhost-vsock`; `agent_socket`
    /// names no socket): one connection for the bridge's life, from a reserved host
    /// port, carrying a `space-mux` link as [`Transport::Serial`] does. See
    /// [`crate::vhost`].
    VhostVsock {
        /// The guest's context ID, as the worker gave it to QEMU.
        cid: u32,
    },
}

fn default_max_connections() -> usize {
    256
}

impl BridgeSpec {
    /// Parses a spec strictly.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_SPEC_LEN {
            return Err(format!("bridge spec over {MAX_SPEC_LEN} bytes"));
        }
        serde_json::from_slice(bytes).map_err(|e| format!("invalid bridge spec: {e}"))
    }

    /// The JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}
