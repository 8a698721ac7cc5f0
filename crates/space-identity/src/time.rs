//! Time as a value. This crate never reads a clock: callers pass `now`.

use std::fmt;

/// Seconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// A timestamp from Unix seconds.
    pub const fn from_unix_secs(secs: u64) -> Self {
        Self(secs)
    }

    /// Unix seconds.
    pub const fn unix_secs(self) -> u64 {
        self.0
    }

    /// `self + secs`, saturating at the far future.
    #[must_use]
    pub const fn plus_secs(self, secs: u64) -> Self {
        Self(self.0.saturating_add(secs))
    }

    /// `self - secs`, saturating at the epoch.
    #[must_use]
    pub const fn minus_secs(self, secs: u64) -> Self {
        Self(self.0.saturating_sub(secs))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
