//! Which execution of which sandbox may answer when: the churner writes it, the
//! clients check every answer against it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// One execution's span: from when it may first have answered to when it last may
/// have (`None`: still current).
#[derive(Debug, Clone)]
struct Span {
    execution: String,
    from: Instant,
    until: Option<Instant>,
}

/// What an answer naming an execution is, against the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The sandbox's execution, current at some moment of the request.
    Right,
    /// The sandbox's execution, but not current at any moment of the request.
    Stale,
    /// Another sandbox's execution, or one nobody knows.
    Foreign,
}

/// Executions per sandbox, in order.
#[derive(Debug, Default)]
pub struct Timeline {
    spans: Mutex<HashMap<String, Vec<Span>>>,
}

impl Timeline {
    /// `sandbox` starts with `execution` (current from `at`).
    pub fn start(&self, sandbox: &str, execution: &str, at: Instant) {
        if let Ok(mut s) = self.spans.lock() {
            s.entry(sandbox.to_owned()).or_default().push(Span {
                execution: execution.to_owned(),
                from: at,
                until: None,
            });
        }
    }

    /// After a transition that began at `began` and ended at `ended`, `sandbox` runs
    /// `execution`. A new execution may have answered from `began` on (it is
    /// acknowledged before the transition returns); the old one until `ended`.
    pub fn moved(&self, sandbox: &str, execution: &str, began: Instant, ended: Instant) {
        let Ok(mut s) = self.spans.lock() else {
            return;
        };
        let list = s.entry(sandbox.to_owned()).or_default();
        if list.last().is_some_and(|l| l.execution == execution) {
            return;
        }
        if let Some(last) = list.last_mut() {
            last.until = Some(ended);
        }
        list.push(Span {
            execution: execution.to_owned(),
            from: began,
            until: None,
        });
    }

    /// Judges an answer of `sandbox` named `execution`, for a request sent at `sent`
    /// and answered at `answered`.
    pub fn judge(
        &self,
        sandbox: &str,
        execution: &str,
        sent: Instant,
        answered: Instant,
    ) -> Verdict {
        let Ok(s) = self.spans.lock() else {
            return Verdict::Foreign;
        };
        let Some(list) = s.get(sandbox) else {
            return Verdict::Foreign;
        };
        let Some(span) = list.iter().rev().find(|p| p.execution == execution) else {
            return Verdict::Foreign;
        };
        let overlaps = span.from <= answered && span.until.is_none_or(|u| u >= sent);
        if overlaps {
            Verdict::Right
        } else {
            Verdict::Stale
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_answer_of_the_execution_current_during_the_request_is_right() {
        let t = Timeline::default();
        let t0 = Instant::now();
        t.start("a", "e1", t0);
        let t1 = t0 + Duration::from_millis(10);
        let t2 = t0 + Duration::from_millis(20);
        t.moved("a", "e2", t1, t2);
        assert_eq!(t.judge("a", "e1", t0, t1), Verdict::Right);
        assert_eq!(
            t.judge("a", "e2", t2, t2 + Duration::from_millis(1)),
            Verdict::Right
        );
        // Both may answer during the transition.
        assert_eq!(t.judge("a", "e1", t1, t2), Verdict::Right);
        assert_eq!(t.judge("a", "e2", t1, t2), Verdict::Right);
    }

    #[test]
    fn an_answer_of_a_retired_execution_after_its_end_is_stale() {
        let t = Timeline::default();
        let t0 = Instant::now();
        t.start("a", "e1", t0);
        let t1 = t0 + Duration::from_millis(10);
        let t2 = t0 + Duration::from_millis(20);
        t.moved("a", "e2", t1, t2);
        let later = t2 + Duration::from_millis(5);
        assert_eq!(t.judge("a", "e1", later, later), Verdict::Stale);
    }

    #[test]
    fn an_answer_of_another_sandbox_or_an_unknown_execution_is_foreign() {
        let t = Timeline::default();
        let t0 = Instant::now();
        t.start("a", "e1", t0);
        t.start("b", "e9", t0);
        assert_eq!(t.judge("a", "e9", t0, t0), Verdict::Foreign);
        assert_eq!(t.judge("a", "zz", t0, t0), Verdict::Foreign);
        assert_eq!(t.judge("c", "e1", t0, t0), Verdict::Foreign);
    }
}
