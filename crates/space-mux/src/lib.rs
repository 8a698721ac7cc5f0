//! `space-mux`: many byte streams over one.
//!
//! A VM sandbox's agent is reached over a single virtio-serial port (no vsock on this
//! host class), while the worker opens one connection per request and per stream. The
//! bridge (host) and the agent (guest) run a [`Link`] over that port: the host opens
//! numbered streams; each side gives every stream a Unix socket pair, so both ends use
//! their ordinary per-connection code on it.
//!
//! Bounds: frames carry at most [`frame::MAX_PAYLOAD`] bytes and are checked before
//! their payload is read; a receiver buffers at most [`frame::WINDOW`] bytes per stream
//! and the sender may not send past the credit it was given (a peer that does ends the
//! link); at most `max_streams` streams are open at once. A broken link resets every
//! stream and is never re-established behind its users' backs.

pub mod frame;
mod link;

pub use frame::{Frame, Kind};
pub use link::{Link, LinkError};
