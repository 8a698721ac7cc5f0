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
    /// An execution the timeline holds for another sandbox: a cross-sandbox delivery.
    OtherSandbox,
    /// An execution the timeline holds for no sandbox (one that lived between two of
    /// the watcher's looks): not verified either way, and counted as such.
    Unknown,
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
    /// acknowledged before the transition returns); every earlier one until `ended`.
    pub fn moved(&self, sandbox: &str, execution: &str, began: Instant, ended: Instant) {
        let Ok(mut s) = self.spans.lock() else {
            return;
        };
        let list = s.entry(sandbox.to_owned()).or_default();
        if !list.iter().any(|p| p.execution == execution) {
            list.push(Span {
                execution: execution.to_owned(),
                from: began,
                until: None,
            });
        }
        for span in list.iter_mut() {
            if span.execution != execution && span.until.is_none() {
                span.until = Some(ended);
            }
        }
    }

    /// `sandbox` was seen running `execution`, which it did not at `since`: entered
    /// as current from then, the executions before it left open — only a transition's
    /// end ([`Timeline::moved`]) says when they stopped answering.
    pub fn seen(&self, sandbox: &str, execution: &str, since: Instant) {
        let Ok(mut s) = self.spans.lock() else {
            return;
        };
        let list = s.entry(sandbox.to_owned()).or_default();
        if !list.iter().any(|p| p.execution == execution) {
            list.push(Span {
                execution: execution.to_owned(),
                from: since,
                until: None,
            });
        }
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
            return Verdict::Unknown;
        };
        let span = s
            .get(sandbox)
            .and_then(|list| list.iter().rev().find(|p| p.execution == execution));
        let Some(span) = span else {
            let elsewhere = s.iter().any(|(other, list)| {
                other != sandbox && list.iter().any(|p| p.execution == execution)
            });
            return if elsewhere {
                Verdict::OtherSandbox
            } else {
                Verdict::Unknown
            };
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
    fn an_execution_only_seen_is_right_at_once_and_closes_the_earlier_ones_only_at_a_transitions_end()
     {
        let t = Timeline::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        t.start("a", "e1", t0);
        // A restart nobody here made, seen by the watcher at 20 ms (not at 10 ms).
        t.seen("a", "e2", ms(10));
        assert_eq!(t.judge("a", "e2", ms(15), ms(16)), Verdict::Right);
        // The old one may still answer: nothing said when it stopped.
        assert_eq!(t.judge("a", "e1", ms(30), ms(31)), Verdict::Right);
        // The transition's end does; the new one is not entered twice.
        t.moved("a", "e2", ms(5), ms(40));
        assert_eq!(t.judge("a", "e1", ms(50), ms(51)), Verdict::Stale);
        assert_eq!(t.judge("a", "e2", ms(50), ms(51)), Verdict::Right);
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
    fn an_answer_of_another_sandboxs_execution_is_cross_sandbox_and_one_nobody_saw_is_unknown() {
        let t = Timeline::default();
        let t0 = Instant::now();
        t.start("a", "e1", t0);
        t.start("b", "e9", t0);
        assert_eq!(t.judge("a", "e9", t0, t0), Verdict::OtherSandbox);
        assert_eq!(t.judge("a", "zz", t0, t0), Verdict::Unknown);
        assert_eq!(t.judge("c", "e1", t0, t0), Verdict::OtherSandbox);
    }
}
