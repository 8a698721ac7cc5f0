//! The driver's rules, each against a control plane that counts what it is asked
//! (a [`Plane`]) and attempts that answer as a worker would.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use space_identity::{Generation, Route};
use space_testkit::route;
use tokio::sync::Semaphore;

use super::*;

/// The control plane as the driver sees it: resolves sandbox 1 to the generation
/// `current`; counts resolves (and the rebuilt ones); a rebuilt resolve may be held
/// at a gate.
#[derive(Debug)]
struct Plane {
    current: AtomicU64,
    resolves: AtomicUsize,
    rebuilt_resolves: AtomicUsize,
    /// When set, a rebuilt resolve first takes a permit (tests release them).
    gate: Option<Semaphore>,
    /// How long a rebuilt resolve takes.
    rebuilt_delay: Duration,
    patience: Duration,
    events: Mutex<Vec<String>>,
}

/// An operation's error in these tests.
#[derive(Debug, PartialEq)]
enum Failure {
    Recovery(RecoveryError),
    /// What an attempt said.
    Worker(&'static str),
}

impl From<RecoveryError> for Failure {
    fn from(e: RecoveryError) -> Self {
        Self::Recovery(e)
    }
}

impl Plane {
    fn at(generation: u64) -> Self {
        Self {
            current: AtomicU64::new(generation),
            resolves: AtomicUsize::new(0),
            rebuilt_resolves: AtomicUsize::new(0),
            gate: None,
            rebuilt_delay: Duration::ZERO,
            patience: Duration::from_secs(10),
            events: Mutex::new(Vec::new()),
        }
    }

    fn moves_to(&self, generation: u64) {
        self.current.store(generation, Ordering::SeqCst);
    }

    fn events(&self) -> Vec<String> {
        lock(&self.events).clone()
    }
}

fn in_an_hour() -> Timestamp {
    now().plus_secs(3600)
}

impl Resolver for Plane {
    /// The generation the route names.
    type Grant = u64;
    type Error = Failure;

    async fn resolve(&self, sandbox: &SandboxId, rebuilt: bool) -> Result<Resolved<u64>, Failure> {
        assert_eq!(*sandbox, space_testkit::sandbox(1));
        let n = self.resolves.fetch_add(1, Ordering::SeqCst);
        assert!(n < 100, "resolves go on");
        if rebuilt {
            self.rebuilt_resolves.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("open").forget();
            }
            tokio::time::sleep(self.rebuilt_delay).await;
        }
        let generation = self.current.load(Ordering::SeqCst);
        Ok(Resolved {
            route: route(1, generation, "w1"),
            grant: generation,
            until: in_an_hour(),
        })
    }

    fn patience(&self) -> Duration {
        self.patience
    }

    fn observe(&self, event: Event<'_>) {
        let text = match event {
            Event::Rebuilt { reason } => format!("rebuilt {reason}"),
            Event::RefreshFailed { reason } => format!("failed {reason}"),
            Event::Denied { reason } => format!("denied {reason}"),
            Event::RebuiltAttemptEnded { .. } => "ended".into(),
        };
        lock(&self.events).push(text);
    }
}

fn sandbox() -> SandboxId {
    space_testkit::sandbox(1)
}

fn generation_of(r: &Route) -> u64 {
    let Generation(g) = r.execution.generation;
    g
}

/// A worker serving `generation`: RefreshRoute for any other, the generation served
/// otherwise.
fn worker_serving(generation: u64, route: &Route) -> Attempt<u64, Failure> {
    if generation_of(route) == generation {
        Attempt::Done(Ok(generation))
    } else {
        Attempt::RefreshRoute {
            reason: RefreshReason::StaleGeneration,
            answer: Failure::Worker("421"),
        }
    }
}

/// A driver whose cache holds `plane`'s current route.
async fn warmed(plane: &Plane) -> RouteDriver<u64> {
    let driver = RouteDriver::new(100);
    driver.fresh(plane, &sandbox()).await.expect("resolves");
    driver
}

fn cached_generation(driver: &RouteDriver<u64>) -> Option<u64> {
    driver
        .cached(&sandbox(), |_| true)
        .map(|(r, _)| generation_of(&r))
}

#[tokio::test]
async fn a_repair_that_resolved_late_does_not_evict_a_newer_route_a_concurrent_resolve_cached() {
    let plane = Arc::new(Plane {
        gate: Some(Semaphore::new(0)),
        ..Plane::at(1)
    });
    let driver = Arc::new(warmed(&plane).await);
    // An operation on generation 1 meets RefreshRoute; its repair resolves while the
    // sandbox is at 2, and is held before it answers.
    plane.moves_to(2);
    let late = tokio::spawn({
        let (plane, driver) = (Arc::clone(&plane), Arc::clone(&driver));
        async move {
            driver
                .drive(
                    &*plane,
                    &sandbox(),
                    OperationClass::Read,
                    |r, _| async move { worker_serving(2, &r) },
                )
                .await
        }
    });
    for _ in 0..1000 {
        if plane.rebuilt_resolves.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(plane.rebuilt_resolves.load(Ordering::SeqCst), 1, "a repair");
    // Meanwhile the sandbox moved on to 3 and another operation cached it afresh.
    plane.moves_to(3);
    driver.fresh(&*plane, &sandbox()).await.expect("resolves");
    // The held repair answers generation 2 (resolved before the move): its attempt
    // uses it, the cache keeps 3.
    plane.current.store(2, Ordering::SeqCst);
    plane.gate.as_ref().expect("gated").add_permits(1);
    assert_eq!(late.await.expect("joins"), Ok(2));
    assert_eq!(cached_generation(&driver), Some(3));
}

#[tokio::test]
async fn concurrent_refreshes_of_one_sandbox_share_one_resolve() {
    let plane = Arc::new(Plane {
        rebuilt_delay: Duration::from_millis(50),
        ..Plane::at(1)
    });
    let driver = Arc::new(warmed(&plane).await);
    plane.moves_to(2);
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (plane, driver) = (Arc::clone(&plane), Arc::clone(&driver));
            tokio::spawn(async move {
                driver
                    .drive(
                        &*plane,
                        &sandbox(),
                        OperationClass::Read,
                        |r, _| async move { worker_serving(2, &r) },
                    )
                    .await
            })
        })
        .collect();
    for c in callers {
        assert_eq!(c.await.expect("joins"), Ok(2));
    }
    assert_eq!(plane.rebuilt_resolves.load(Ordering::SeqCst), 1);
    assert_eq!(cached_generation(&driver), Some(2));
}

#[tokio::test]
async fn a_refresh_route_gets_exactly_one_rebuilt_attempt_and_a_second_one_is_an_error() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    // The sandbox keeps moving: every route the attempt gets is already stale.
    let result = driver
        .drive(&plane, &sandbox(), OperationClass::Read, |r, _| {
            assert!(
                attempts.fetch_add(1, Ordering::SeqCst) < 5,
                "attempts go on"
            );
            plane.moves_to(generation_of(&r) + 1);
            async move { worker_serving(0, &r) }
        })
        .await;
    assert_eq!(
        result,
        Err(Failure::Recovery(RecoveryError::RefreshAfterRebuild(
            RefreshReason::StaleGeneration
        )))
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "one rebuilt attempt");
    assert_eq!(plane.rebuilt_resolves.load(Ordering::SeqCst), 1);
    assert_eq!(
        plane.events(),
        ["rebuilt stale_generation", "failed stale_generation"]
    );
}

#[tokio::test]
async fn a_repair_that_resolves_the_rejected_route_again_is_an_error_without_a_second_attempt() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let result = driver
        .drive(&plane, &sandbox(), OperationClass::Read, |r, _| {
            attempts.fetch_add(1, Ordering::SeqCst);
            async move { worker_serving(2, &r) }
        })
        .await;
    assert_eq!(
        result,
        Err(Failure::Recovery(RecoveryError::ResolvedSameRoute))
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_repair_asks_with_the_rebuilt_flag_and_keeps_the_entrys_original_expiry() {
    let plane = Plane::at(1);
    let driver = RouteDriver::new(100);
    let first = Resolved {
        route: route(1, 1, "w1"),
        grant: 1,
        until: now().plus_secs(60),
    };
    lock(&driver.routes).insert(first.route, Arc::new(1), first.until, now());
    plane.moves_to(2);
    let got = driver
        .drive(
            &plane,
            &sandbox(),
            OperationClass::Read,
            |r, _| async move { worker_serving(2, &r) },
        )
        .await;
    assert_eq!(got, Ok(2));
    // The only resolve was the repair's, flagged; the plane gave it an hour, the
    // entry keeps the minute the first authorization had.
    assert_eq!(plane.resolves.load(Ordering::SeqCst), 1);
    assert_eq!(plane.rebuilt_resolves.load(Ordering::SeqCst), 1);
    let routes = lock(&driver.routes);
    let e = routes.get(&sandbox(), now()).expect("cached");
    assert_eq!(generation_of(&e.route), 2);
    assert_eq!(e.authorized_until, first.until);
}

#[tokio::test]
async fn a_deny_is_surfaced_once_and_drops_the_route() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let got: Result<u64, _> = driver
        .drive(&plane, &sandbox(), OperationClass::Read, |_, _| {
            attempts.fetch_add(1, Ordering::SeqCst);
            async {
                Attempt::Denied {
                    reason: "expired".into(),
                    answer: Err(Failure::Worker("403")),
                }
            }
        })
        .await;
    assert_eq!(got, Err(Failure::Worker("403")));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(cached_generation(&driver), None);
    assert_eq!(plane.events(), ["denied expired"]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_refusing_connections_is_waited_for_within_the_patience_and_no_longer() {
    let plane = Plane {
        patience: Duration::from_secs(2),
        ..Plane::at(1)
    };
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let start = tokio::time::Instant::now();
    let id = sandbox();
    let run = driver.drive(&plane, &id, OperationClass::Read, |_, _| {
        attempts.fetch_add(1, Ordering::SeqCst);
        async {
            Attempt::<u64, _>::Failed {
                error: Failure::Worker("refused"),
                progress: Progress::NotStarted,
            }
        }
    });
    let got = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the wait is bounded");
    assert_eq!(got, Err(Failure::Worker("refused")));
    assert!(
        start.elapsed() <= Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // Each pause resolved afresh; after the budget, the one transport retry.
    let n = attempts.load(Ordering::SeqCst);
    assert!(n >= 5, "{n} attempts");
    assert_eq!(
        plane.resolves.load(Ordering::SeqCst),
        n,
        "one warm-up, one per retry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_back_within_the_patience_serves_the_operation() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let got = driver
        .drive(&plane, &sandbox(), OperationClass::StreamOpen, |_, _| {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    Attempt::Failed {
                        error: Failure::Worker("refused"),
                        progress: Progress::NotStarted,
                    }
                } else {
                    Attempt::Done(Ok(7))
                }
            }
        })
        .await;
    assert_eq!(got, Ok(7));
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_started_mutation_without_an_idempotency_key_is_never_retried() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let class = OperationClass::Mutation {
        idempotency_key: false,
    };
    let got = driver
        .drive(&plane, &sandbox(), class, |_, _| {
            assert!(
                attempts.fetch_add(1, Ordering::SeqCst) < 5,
                "attempts go on"
            );
            async {
                Attempt::<u64, _>::Failed {
                    error: Failure::Worker("cut"),
                    progress: Progress::Started,
                }
            }
        })
        .await;
    assert_eq!(got, Err(Failure::Worker("cut")));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_read_cut_short_is_retried_once_on_the_same_route() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let attempts = AtomicUsize::new(0);
    let got = driver
        .drive(&plane, &sandbox(), OperationClass::Read, |r, _| {
            assert!(
                attempts.fetch_add(1, Ordering::SeqCst) < 5,
                "attempts go on"
            );
            assert_eq!(generation_of(&r), 1);
            async {
                Attempt::<u64, _>::Failed {
                    error: Failure::Worker("cut"),
                    progress: Progress::Started,
                }
            }
        })
        .await;
    assert_eq!(got, Err(Failure::Worker("cut")));
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(plane.resolves.load(Ordering::SeqCst), 1, "no new resolve");
}

#[tokio::test]
async fn the_rebuilt_attempts_outcome_is_observed_once() {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    plane.moves_to(2);
    let attempts = AtomicUsize::new(0);
    // The rebuilt attempt is cut short, then retried (a read may be): one outcome of
    // the rebuilt attempt is counted, not two.
    let got = driver
        .drive(&plane, &sandbox(), OperationClass::Read, |r, _| {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => worker_serving(2, &r),
                    1 => Attempt::Failed {
                        error: Failure::Worker("cut"),
                        progress: Progress::Started,
                    },
                    _ => Attempt::Done(Ok(generation_of(&r))),
                }
            }
        })
        .await;
    assert_eq!(got, Ok(2));
    assert_eq!(plane.events(), ["rebuilt stale_generation", "ended"]);
}

#[test]
fn settling_an_attempt_takes_each_outcome_as_final() {
    let refresh: Attempt<u64, Failure> = Attempt::RefreshRoute {
        reason: RefreshReason::Retired,
        answer: Failure::Worker("421"),
    };
    assert_eq!(refresh.settle(), Err(Failure::Worker("421")));
    let denied: Attempt<u64, Failure> = Attempt::Denied {
        reason: String::new(),
        answer: Ok(403),
    };
    assert_eq!(denied.settle(), Ok(403));
    let failed: Attempt<u64, Failure> = Attempt::Failed {
        error: Failure::Worker("refused"),
        progress: Progress::NotStarted,
    };
    assert_eq!(failed.settle(), Err(Failure::Worker("refused")));
}

/// A keyed mutation cut off after it reached the worker, whose worker then refuses
/// connections (killed, restarting) for `refusals` attempts and then serves generation
/// `after`, which the control plane names from the cut on. Returns the result and the
/// generations the attempts went to.
async fn cut_off_then_restarted(refusals: usize, after: u64) -> (Result<u64, Failure>, Vec<u64>) {
    let plane = Plane::at(1);
    let driver = warmed(&plane).await;
    let sent = Mutex::new(Vec::new());
    let class = OperationClass::Mutation {
        idempotency_key: true,
    };
    let got = driver
        .drive(&plane, &sandbox(), class, |r, _| {
            let n = {
                let mut sent = lock(&sent);
                sent.push(generation_of(&r));
                sent.len()
            };
            assert!(n < 50, "attempts go on");
            let plane = &plane;
            async move {
                if n == 1 {
                    plane.moves_to(after);
                    Attempt::Failed {
                        error: Failure::Worker("cut"),
                        progress: Progress::Started,
                    }
                } else if n <= 1 + refusals {
                    Attempt::Failed {
                        error: Failure::Worker("refused"),
                        progress: Progress::NotStarted,
                    }
                } else {
                    worker_serving(after, &r)
                }
            }
        })
        .await;
    let sent = lock(&sent).clone();
    (got, sent)
}

#[tokio::test(start_paused = true)]
async fn a_mutation_cut_off_by_its_workers_death_is_sent_again_only_to_the_same_execution() {
    // The worker comes back with the execution re-adopted: the operation is served
    // there (its idempotency key lets the worker tell a repeat).
    let (got, sent) = cut_off_then_restarted(3, 1).await;
    assert_eq!(got, Ok(1));
    assert!(sent.iter().all(|g| *g == 1), "{sent:?}");
    // The sandbox was started again as another execution meanwhile: the mutation may
    // have run on the first, so it is not sent to the second.
    let (got, sent) = cut_off_then_restarted(3, 2).await;
    assert_eq!(got, Err(Failure::Worker("refused")));
    assert!(!sent.contains(&2), "{sent:?}");
    // Also when the worker answers the very next attempt's connection refused (no wait).
    let (got, sent) = cut_off_then_restarted(1, 2).await;
    assert_eq!(got, Err(Failure::Worker("refused")));
    assert!(!sent.contains(&2), "{sent:?}");
    // And when the worker is back at once but no longer runs that execution (its
    // answer is a RefreshRoute): the refusal, no rebuilt attempt on the new one.
    let (got, sent) = cut_off_then_restarted(0, 2).await;
    assert_eq!(got, Err(Failure::Worker("421")));
    assert_eq!(sent, [1, 1], "one attempt, one retry on the same route");
}
