//! What every connection of this agent shares: the identity it serves and its secret.

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;

use space_proto::guest::{Activation, ServedIdentity, compute_proof};

/// What every connection of this agent shares.
pub struct Agent {
    /// The execution this agent serves.
    pub identity: ServedIdentity,
    secret: [u8; 32],
    /// Default working directory and base of relative paths.
    pub home: PathBuf,
    /// How many connections are served at once, at most.
    pub(crate) max_connections: usize,
    /// Connections being served now.
    pub(crate) active: AtomicUsize,
}

// The secret must never reach a log through `{:?}`.
impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("identity", &self.identity)
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent for `activation`.
    pub fn new(activation: &Activation, home: PathBuf, max_connections: usize) -> Self {
        Self {
            identity: activation.identity(),
            secret: activation.secret,
            home,
            max_connections,
            active: AtomicUsize::new(0),
        }
    }

    /// The handshake proof for a client's nonce.
    pub(crate) fn proof(&self, nonce: &[u8; 32]) -> [u8; 32] {
        compute_proof(&self.secret, nonce, &self.identity)
    }
}
