//! SPACE control plane and edge.
//!
//! The control plane is the only holder of signing keys. It keeps tenants, API keys,
//! sandboxes and their executions in the store, places executions on workers, pushes
//! signed identity updates to them, and issues capabilities only for executions their
//! worker acknowledged as running. The edge (in the same process for `space up`, or on
//! its own) authenticates callers, caches routes and capabilities, forwards operations
//! to workers and repairs stale routes.

pub mod api;
pub mod auth;
pub mod edge;
pub mod error;
pub mod health;
pub mod keyring;
pub mod limits;
pub mod metrics;
pub mod placement;
pub mod server;
pub mod service;
pub mod standby_plan;

pub use server::{ControlConfig, ServerHandle, serve};
/// The HTTP client, re-exported for the CLI and tests.
pub use space_http as http;

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `N` bytes from the kernel's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom(2) only fails on a kernel without it; nothing can run then.
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    out
}
