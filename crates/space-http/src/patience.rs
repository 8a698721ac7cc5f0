//! Waiting for a peer that refuses connections. Nothing was sent to it, so waiting is
//! not a retry of any operation; it is bounded (a budget in all) and backs off from
//! 20 ms to 500 ms between attempts. The edge and the SDK use it for a worker that is
//! restarting.

use std::time::Duration;

/// The state of one operation's wait for an unreachable peer.
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
            pause: Duration::from_millis(20),
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
        self.pause = (self.pause * 2).min(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_wait_backs_off_and_ends_within_its_budget() {
        let mut p = Patience::new(Duration::from_millis(300));
        let start = tokio::time::Instant::now();
        let mut pauses = Vec::new();
        while p.patient() {
            pauses.push(p.pause);
            p.wait().await;
        }
        // It never starts a pause that would end past the budget.
        assert!(start.elapsed() < Duration::from_millis(300) + Duration::from_secs(1));
        assert!(pauses.len() >= 2, "{pauses:?}");
        assert!(
            pauses
                .windows(2)
                .all(|w| w[1] == (w[0] * 2).min(Duration::from_millis(500)))
        );
        assert!(!p.patient(), "a spent budget stays spent");
    }
}
