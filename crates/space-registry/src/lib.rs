//! Registry pulls for `space template pull`, run by the CLI on the caller's machine
//! with the caller's credentials (the platform itself never connects to a registry:
//! no request of an API user makes it reach a URL they name, and it stores no
//! registry secret). The result is an OCI image layout the CLI then imports through
//! the API like any other.
//!
//! - [`reference`]: Docker-style references (`alpine`, `ghcr.io/o/r:tag`,
//!   `host:5000/r@sha256:…`).
//! - [`pull`]: the OCI distribution protocol's pull side: the manifest (an index
//!   followed to [`Platform`]'s manifest), the config and the layers, bearer-token or
//!   basic authentication, redirects.
//! - Every byte a registry sends is hostile: documents are read within
//!   [`space_image::limits::MAX_JSON`], blobs streamed to disk with their sha256 and
//!   byte count checked as they come, digests parsed before they name a file, media
//!   types checked, `Authorization` kept to the registry's own origin.
//! - Transport: the workspace's hyper client; HTTPS with rustls (the `ring`
//!   provider), trusting the system bundle and `--ca-file`, always verified; plain
//!   HTTP only when asked for and only to loopback.

mod auth;
mod client;
pub mod error;
mod http;
mod layout;
pub mod manifest;
mod platform;
pub mod pull;
pub mod reference;
pub mod tls;
mod url;

pub use auth::{Credentials, docker_config_credentials, docker_config_path, from_docker_config};
pub use client::MAX_REDIRECTS;
pub use error::{RegistryError, Result};
pub use http::{CONNECT_TIMEOUT, READ_TIMEOUT, Timeouts};
pub use platform::Platform;
pub use pull::{Progress, PullOptions, Pulled, pull};
pub use reference::Reference;
