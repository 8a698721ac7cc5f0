//! `spaced-host`: one bridge process per sandbox (`IDENTITY.md` §5).
//!
//! The worker reaches a sandbox's agent only through its bridge. The bridge listens on
//! a Unix socket in a worker-owned 0700 directory and serves only the worker's uid. For
//! every connection it opens a *new* transport connection to the agent, checks that the
//! transport's peer is the recorded jail process (PID, start time, executable, uid,
//! pidfd) and that the kernel's socket table shows that process holding the listener,
//! relays the worker's `Hello`, and checks that the agent's answer proves the expected
//! execution with this activation's secret and that the same process still holds the
//! transport. Only then does it forward the rest — by handing the verified transport
//! connection itself to the worker (`SCM_RIGHTS`), so that requests do not pay two more
//! thread wake-ups in a relay. A dropped connection is never re-established behind
//! the worker's back: the worker must connect, and be verified, again.
//!
//! The worker side ([`client`]) checks the bridge the same way: peer credentials of the
//! bridge process against the record, the handshake, and the peer again afterwards.

pub mod client;
pub mod error;
pub mod relink;
pub mod serial;
pub mod server;
pub mod spec;
pub mod vhost;
pub mod vsock;

pub use client::{BridgeClientError, BridgePool, BridgeTarget, connect};
pub use server::{BridgeError, run, run_shared};
pub use spec::{BridgeSpec, Transport};
