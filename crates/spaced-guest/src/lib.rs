//! The SPACE guest agent: runs inside a sandbox, answers the host bridge.
//!
//! It proves which execution it serves (the handshake of [`space_proto::guest`]), then
//! serves requests one at a time per connection: processes with or without a PTY,
//! file operations and directory watches. Every answer names the execution.
//!
//! No async runtime: one thread per connection, blocking I/O, and `poll` where a
//! request has to move bytes in several directions at once. Every buffer is bounded,
//! and a slow reader slows the producer (backpressure) instead of growing memory.

mod accounts;
mod agent;
pub mod config;
mod conn;
mod exec;
mod files;
mod ports;
pub mod server;
mod session;
mod sys;
mod tree;
pub mod vm;
pub mod vsock;
mod watch;

pub use agent::Agent;
pub use config::{Config, ConfigError};
pub use exec::DEFAULT_PATH;
pub use server::{StartError, serve, start};
