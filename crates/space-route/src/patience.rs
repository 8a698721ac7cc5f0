//! Waiting for a worker that refuses connections. Nothing was sent to it, so waiting is
//! not a retry of any operation; it is bounded (a budget in all) and backs off from
//! 20 ms to 500 ms between attempts.

use std::time::Duration;

/// First pause between attempts.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// Longest pause between attempts.
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// The state of one operation's wait for an unreachable worker.
#[derive(Debug)]
pub struct Patience {
    until: Option<tokio::time::Instant>,
    budget: Duration,
    pause: Duration,
}

impl Patience {
    /// At most `budget` in all, counted from the first [`Patience::patient`].
    pub fn new(budget: Duration) -> Self {
        Self {
            until: None,
            budget,
            pause: FIRST_PAUSE,
        }
    }

    /// Whether another pause fits in the budget (the first call starts it).
    pub fn patient(&mut self) -> bool {
        let until = *self
            .until
            .get_or_insert_with(|| tokio::time::Instant::now() + self.budget);
        tokio::time::Instant::now() + self.pause < until
    }

    /// Sleeps the next pause.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_backs_off_and_never_starts_a_pause_past_its_budget() {
        let mut p = Patience::new(Duration::from_millis(3000));
        let start = tokio::time::Instant::now();
        let mut pauses = Vec::new();
        while p.patient() {
            pauses.push(p.pause);
            p.wait().await;
        }
        assert!(start.elapsed() <= Duration::from_millis(3000), "{pauses:?}");
        assert_eq!(
            &pauses[..6],
            &[20, 40, 80, 160, 320, 500].map(Duration::from_millis)
        );
        assert!(pauses[6..].iter().all(|p| *p == LONGEST_PAUSE));
        assert!(!p.patient(), "a spent budget stays spent");
    }
}
