//! Shared fixtures and harnesses for SPACE tests.
//!
//! In-process fixtures, deterministic so that a failing test fails the same way twice:
//! fixed keys and a capability builder ([`TestKeys`], [`CapabilityBuilder`]), a settable
//! clock ([`TestClock`], [`T0`]), identities and routes built from small numbers
//! ([`sandbox`], [`route`], [`running`], …).
//!
//! Cross-process harness, for tests that run the real binaries:
//!
//! - [`bin`]: the workspace's binaries, built in the test's profile, never stale;
//! - [`process`]: children stopped on drop, their first line, processes found by their
//!   arguments or cgroups, `kill -9`, peak memory;
//! - [`wait`]: the one wait loop;
//! - [`host`]: whether this host can run jails ([`can_run_jails`]);
//! - [`rng`]: random bytes.
//!
//! Behind features, one for the tests of each crate that needs more (each pulls in the
//! crates its harness drives; none is on by default):
//!
//! - `agent`: a real `spaced-guest` on a Unix socket ([`agent`]; spaced-guest's tests);
//! - `bridge`: such an agent and a real `spaced-host` bridge ([`bridge`]; spaced-host's);
//! - `jail`: a jail driver on a private data dir and jails destroyed on drop ([`jail`];
//!   space-worker's);
//! - `cluster`: a real `space up`, its CLI, HTTP calls and a second signer
//!   ([`cluster`]; space's);
//! - `debian`: a Debian image with apt made from the host's packages
//!   ([`debian_image`]) and a flat apt repository ([`apt_repo`]; space's egress tests);
//! - `registry`: an OCI registry on a loopback address, plain or HTTPS with a test CA,
//!   with a token endpoint and hostile answers ([`registry`]; space-registry's and
//!   space's pull tests).

mod clock;
mod ids;
mod keys;

pub mod bin;
pub mod host;
pub mod process;
pub mod rng;
pub mod wait;

#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "debian")]
pub mod apt_repo;
#[cfg(feature = "bridge")]
pub mod bridge;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "debian")]
pub mod debian_image;
#[cfg(feature = "jail")]
pub mod jail;
#[cfg(feature = "registry")]
pub mod registry;

pub use bin::{static_agent, workspace_bin};
pub use clock::{T0, TestClock, unix_now};
pub use host::can_run_jails;
pub use ids::{bytes16, execution, route, running, sandbox, worker};
pub use keys::{CapabilityBuilder, TestKeys};
