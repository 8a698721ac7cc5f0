//! Time in tests: a fixed "now" and a clock that tests move by hand (in-process
//! fixtures), and the wall clock for what is sent to real daemons.

use space_identity::Timestamp;

/// A fixed "now" for tests: 2026-11-30T00:00:00Z.
pub const T0: Timestamp = Timestamp::from_unix_secs(1_795_996_800);

/// A test clock: time is a value that tests move by hand.
#[derive(Debug, Clone, Copy)]
pub struct TestClock(Timestamp);

impl Default for TestClock {
    fn default() -> Self {
        Self(T0)
    }
}

impl TestClock {
    /// The current test time.
    pub fn now(&self) -> Timestamp {
        self.0
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, secs: u64) {
        self.0 = self.0.plus_secs(secs);
    }
}

/// Unix seconds now (the wall clock: for messages a real daemon checks against its own
/// clock, such as the issue time of a signed update).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}
