//! The one wait loop of the harness: readiness of a process, a socket, a worker.

use std::time::{Duration, Instant};

/// Polls `probe` every `every` until it gives a value or `limit` has passed; `None`
/// then. `probe` runs at least once, and once more at the deadline.
pub fn wait_for<T>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(every.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_that_answers_ends_the_wait_with_its_value() {
        let mut calls = 0;
        let got = wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(got, Some(3));
    }

    #[test]
    fn a_probe_that_never_answers_is_given_up_on_at_the_limit() {
        let limit = Duration::from_millis(200);
        let start = Instant::now();
        let mut calls = 0;
        let got: Option<()> = wait_for(limit, Duration::from_millis(10), || {
            calls += 1;
            None
        });
        assert_eq!(got, None);
        let waited = start.elapsed();
        assert!(waited >= limit, "gave up after {waited:?}");
        // Not much later either (slack for a busy machine).
        assert!(waited < limit + Duration::from_millis(600), "{waited:?}");
        assert!(calls >= 2, "probed {calls} times");
    }
}
