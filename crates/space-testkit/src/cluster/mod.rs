//! The harness of the platform's end-to-end tests (`crates/space/tests/`): a real
//! `space up` ([`Cluster`]) and its CLI, blocking HTTP calls, a second signer of
//! updates ([`Signer`]). It also names the process, probe and random helpers those
//! tests use with it, so that a test file needs one import:
//! `use space_testkit::cluster as support;`.

mod http;
mod postmortem;
mod signer;
mod up;

pub use http::{http, http_with, post_delivered, post_within};
pub use signer::Signer;
pub use up::{Cluster, TEST_WARM_POOL, space_bin};

pub use crate::clock::unix_now;
pub use crate::host::can_run_jails;
pub use crate::process::{
    find_pid, jail_pids_of, kill9, peak_growth, pid_of, reset_peak, status_kib,
};
pub use crate::rng::rand_u128;
