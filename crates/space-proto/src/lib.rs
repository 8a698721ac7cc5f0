//! Wire types of SPACE's hops.
//!
//! Today this holds the host ↔ guest hop between `spaced-host` (the per-sandbox bridge)
//! and `spaced-guest` (the agent in the sandbox): [`frame`]s of at most
//! [`frame::MAX_FRAME_LEN`] bytes, bodies in a strict [`codec`], the [`guest`]
//! messages with the handshake that proves which execution an agent serves, and a small
//! blocking [`client`] for the bridge, tests and benchmarks.
//!
//! Nothing here does I/O beyond reading and writing frames on the streams it is given.

pub mod api;
pub mod client;
pub mod codec;
pub mod codes;
pub mod frame;
pub mod guest;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod vm;
