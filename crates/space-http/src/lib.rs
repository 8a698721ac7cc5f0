//! A small HTTP/1.1 client (hyper) that drives its connections in the calling task:
//! control plane → workers, edge → workers and control
//! plane, worker → control plane, CLI → edge; and [`serve_until`], how every server of
//! the platform serves. Plain HTTP: the embedded default runs on loopback; put TLS in
//! front for anything else.
//!
//! Layout: [`HttpClient`] and its pool in `client` (a request and its connection
//! polled together in `client/together`); bodies streamed from and to disk in `body`;
//! streamed exchanges in [`stream`]; serving in `server`.

use bytes::Bytes;
use hyper::StatusCode;

mod body;
mod client;
pub mod crash;
pub mod private_dir;
pub mod proxy;
mod server;
pub mod stream;

pub use body::{FileBody, HashingFile, ReqBody, spool_body};
pub use client::HttpClient;
pub use server::{
    Connection, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEAD, ServeLimits,
    run_to_end, serve_until, serve_with,
};

/// Largest answer body read from a peer (a snapshot archive is the largest).
pub const MAX_ANSWER: usize = 1 << 30;

/// Why a call failed before an HTTP answer arrived.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The URL is not valid.
    #[error("bad url {0}")]
    Url(String),
    /// Connecting failed: nothing reached the peer.
    #[error("connect: {0}")]
    Connect(String),
    /// Sending or receiving failed: the peer may have seen the request.
    #[error("transport: {0}")]
    Transport(String),
    /// No answer in time.
    #[error("timed out")]
    Timeout,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: hyper::HeaderMap,
    /// Body.
    pub body: Bytes,
}
