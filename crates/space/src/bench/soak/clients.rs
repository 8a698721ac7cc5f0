//! One soak client: random reads, writes (with idempotency keys), read-backs of its
//! own writes, execs and streaming execs on random sandboxes, each answer checked.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hyper::Method;
use space_client::{Answer, Client, Error, ExecEvent, OperationClass};
use space_identity::SandboxId;
use space_proto::api::ExecResponse;

use super::timeline::{Timeline, Verdict};

/// The file every sandbox holds with its own ID in it.
pub const WHOAMI: &str = "/root/whoami";

/// What one operation came to.
#[derive(Debug)]
enum Outcome {
    Ok,
    /// An error answer or an unexpected one.
    Failed(String),
    /// No complete answer on a non-stream operation.
    Dropped(String),
    /// Another execution than the route named (the SDK's or the edge's check).
    WrongExecution(String),
    /// An execution of this sandbox that was not current during the request.
    Stale(String),
    /// Another sandbox's execution or bytes.
    CrossSandbox(String),
    /// An execution the timeline never held for any sandbox.
    Unverified(String),
    /// A write that was acknowledged is not there.
    LostWrite(String),
    /// A stream ended by "execution replaced" (the identity rules' clear close).
    StreamReplaced,
}

/// Counts shared by every client.
#[derive(Debug, Default)]
pub struct Tally {
    /// Operations made.
    pub ops: AtomicU64,
    /// Of them through the edge.
    pub via_edge: AtomicU64,
    /// Operations that failed (any kind below included).
    pub failures: AtomicU64,
    /// Answers from another execution than the route named.
    pub wrong_execution: AtomicU64,
    /// Answers from an execution not current during the request.
    pub stale: AtomicU64,
    /// Answers from another sandbox.
    pub cross_sandbox: AtomicU64,
    /// Answers naming an execution the timeline never held for any sandbox.
    pub unverified: AtomicU64,
    /// Acknowledged writes not found.
    pub lost_writes: AtomicU64,
    /// Non-stream operations without a complete answer.
    pub dropped: AtomicU64,
    /// Streams opened.
    pub streams: AtomicU64,
    /// Streams ended by "execution replaced".
    pub streams_replaced: AtomicU64,
    /// Failure messages by kind (the first ones).
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// Answers naming an execution the timeline did not (yet) hold as current during
    /// the request: judged again once the run is over and the timeline complete (a new
    /// execution answers from its acknowledgement, before the churner hears of it).
    pub deferred: Mutex<Vec<Deferred>>,
}

/// Answers kept for judging at the end, at most.
const MAX_DEFERRED: usize = 1 << 20;

/// An answer to judge again at the end.
#[derive(Debug, Clone)]
pub struct Deferred {
    sandbox: String,
    execution: String,
    sent: Instant,
    answered: Instant,
    via_edge: bool,
}

impl Tally {
    /// Judges the deferred answers against the complete timeline, counting every one
    /// that is still not right as a failure.
    pub fn judge_deferred(&self, timeline: &Timeline) {
        let deferred = self
            .deferred
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        for d in deferred {
            let what = format!("{} answered by {}", d.sandbox, d.execution);
            let outcome = match timeline.judge(&d.sandbox, &d.execution, d.sent, d.answered) {
                Verdict::Right => continue,
                Verdict::Stale => Outcome::Stale(what),
                Verdict::OtherSandbox => Outcome::CrossSandbox(what),
                Verdict::Unknown => Outcome::Unverified(what),
            };
            // Counted as an operation already: only the failure is added.
            self.ops.fetch_sub(1, Ordering::Relaxed);
            if d.via_edge {
                self.via_edge.fetch_sub(1, Ordering::Relaxed);
            }
            self.record(outcome, d.via_edge);
        }
    }
}

impl Tally {
    fn record(&self, outcome: Outcome, via_edge: bool) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if via_edge {
            self.via_edge.fetch_add(1, Ordering::Relaxed);
        }
        let (counter, what) = match outcome {
            Outcome::Ok => return,
            Outcome::StreamReplaced => {
                self.streams_replaced.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Outcome::Failed(m) => (None, m),
            Outcome::Dropped(m) => (Some(&self.dropped), format!("dropped: {m}")),
            Outcome::WrongExecution(m) => {
                (Some(&self.wrong_execution), format!("wrong execution: {m}"))
            }
            Outcome::Stale(m) => (Some(&self.stale), format!("stale execution: {m}")),
            Outcome::CrossSandbox(m) => (Some(&self.cross_sandbox), format!("cross-sandbox: {m}")),
            Outcome::Unverified(m) => (
                Some(&self.unverified),
                format!("unverified: an execution never seen: {m}"),
            ),
            Outcome::LostWrite(m) => (Some(&self.lost_writes), format!("lost write: {m}")),
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut e) = self.errors.lock() {
            let key = format!("{} [{}]", what, if via_edge { "edge" } else { "direct" });
            if e.len() < 50 || e.contains_key(&key) {
                *e.entry(key).or_default() += 1;
            }
        }
    }
}

/// A small xorshift generator: the soak's choices need no cryptographic randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// One client's writes per sandbox: the last acknowledged, and the range of those that
/// failed after it (each may or may not have landed: a failed write is not a lost
/// one, and a later one that landed legitimately replaces an acknowledged one).
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    acked: Option<u64>,
    /// The first and the last write that failed since `acked`.
    maybe: Option<(u64, u64)>,
}

/// Everything a client needs.
pub struct Ctx {
    /// This client's number.
    pub n: usize,
    /// Its SDK client (direct mode or through the edge).
    pub client: Client,
    /// Whether it goes through the edge.
    pub via_edge: bool,
    /// The sandboxes.
    pub sandboxes: Arc<Vec<SandboxId>>,
    /// Who may answer when.
    pub timeline: Arc<Timeline>,
    /// Counts.
    pub tally: Arc<Tally>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
}

/// Runs one client until `stop`.
pub async fn run(c: Ctx) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c.n as u64 + 1) << 32 | 0x1234_5678));
    let mut written: HashMap<SandboxId, Written> = HashMap::new();
    let mut seq = 0u64;
    while !c.stop.load(Ordering::Relaxed) {
        let sbx = c.sandboxes[(rng.next() % c.sandboxes.len() as u64) as usize];
        let roll = rng.next() % 100;
        let outcome = match roll {
            0..50 => read_whoami(&c, &sbx).await,
            50..70 => {
                seq += 1;
                let w = written.entry(sbx).or_default();
                write(&c, &sbx, seq, w).await
            }
            70..80 => match written.get(&sbx).copied() {
                Some(w) if w.acked.is_some() || w.maybe.is_some() => read_back(&c, &sbx, w).await,
                _ => read_whoami(&c, &sbx).await,
            },
            80..95 => exec(&c, &sbx).await,
            _ => stream(&c, &sbx).await,
        };
        c.tally.record(outcome, c.via_edge);
    }
}

fn mine(c: &Ctx) -> String {
    format!("/root/soak/c{}", c.n)
}

fn files(sbx: &SandboxId, path: &str) -> String {
    format!(
        "/v1/sandboxes/{sbx}/files?path={}",
        space_client::encode_query(path)
    )
}

/// The outcome of an error.
fn failed(e: Error) -> Outcome {
    match e {
        // Nothing was sent: the worker is not listening (restarting, say).
        Error::Transport(t @ space_http::CallError::Connect(_)) => {
            Outcome::Failed(format!("unreachable: {t}"))
        }
        Error::Transport(t) => Outcome::Dropped(t.to_string()),
        Error::WrongExecution { expected, got } => {
            Outcome::WrongExecution(format!("expected {expected}, got {got}"))
        }
        Error::Api { ref code, .. } if code == "wrong_execution" => {
            Outcome::WrongExecution(e.to_string())
        }
        other => Outcome::Failed(other.to_string()),
    }
}

/// Checks the execution an answer names against the timeline (an answer that is not
/// right now is judged again at the end, see [`Tally::judge_deferred`]).
fn judged(c: &Ctx, sbx: &SandboxId, a: &Answer, sent: Instant) -> Option<Outcome> {
    let Some(x) = a
        .headers
        .get("space-execution")
        .and_then(|v| v.to_str().ok())
    else {
        return Some(Outcome::Failed("the answer names no execution".into()));
    };
    let answered = Instant::now();
    let sandbox = sbx.to_string();
    let verdict = c.timeline.judge(&sandbox, x, sent, answered);
    if verdict != Verdict::Right {
        if let Ok(mut d) = c.tally.deferred.lock() {
            // Bounded: past the bound an answer is judged now, as it stands.
            if d.len() >= MAX_DEFERRED {
                let what = format!("{sandbox} answered by {x}");
                return Some(match verdict {
                    Verdict::Stale => Outcome::Stale(what),
                    Verdict::Unknown => Outcome::Unverified(what),
                    _ => Outcome::CrossSandbox(what),
                });
            }
            d.push(Deferred {
                sandbox,
                execution: x.to_owned(),
                sent,
                answered,
                via_edge: c.via_edge,
            });
        }
    }
    None
}

async fn read(c: &Ctx, sbx: &SandboxId, path: &str) -> Result<(Answer, Instant), Outcome> {
    let sent = Instant::now();
    c.client
        .operation(
            sbx,
            Method::GET,
            &files(sbx, path),
            None,
            Bytes::new(),
            OperationClass::Read,
        )
        .await
        .map(|a| (a, sent))
        .map_err(failed)
}

async fn read_whoami(c: &Ctx, sbx: &SandboxId) -> Outcome {
    let (a, sent) = match read(c, sbx, WHOAMI).await {
        Ok(v) => v,
        Err(o) => return o,
    };
    if let Some(o) = judged(c, sbx, &a, sent) {
        return o;
    }
    let body = String::from_utf8_lossy(&a.body);
    if body != sbx.to_string() {
        return Outcome::CrossSandbox(format!("{sbx} read {body:?}"));
    }
    Outcome::Ok
}

async fn write(c: &Ctx, sbx: &SandboxId, seq: u64, w: &mut Written) -> Outcome {
    let sent = Instant::now();
    let body = format!("{}:{seq}", c.n);
    let r = c
        .client
        .operation(
            sbx,
            Method::PUT,
            &files(sbx, &mine(c)),
            Some("application/octet-stream"),
            Bytes::from(body),
            OperationClass::Mutation {
                idempotency_key: true,
            },
        )
        .await;
    match r {
        Ok(a) => {
            w.acked = Some(seq);
            w.maybe = None;
            judged(c, sbx, &a, sent).unwrap_or(Outcome::Ok)
        }
        Err(e) => {
            w.maybe = Some(w.maybe.map_or((seq, seq), |(first, _)| (first, seq)));
            failed(e)
        }
    }
}

async fn read_back(c: &Ctx, sbx: &SandboxId, w: Written) -> Outcome {
    let (a, sent) = match read(c, sbx, &mine(c)).await {
        Ok(v) => v,
        Err(o) => return o,
    };
    if let Some(o) = judged(c, sbx, &a, sent) {
        return o;
    }
    let body = String::from_utf8_lossy(&a.body).into_owned();
    let held = body
        .strip_prefix(&format!("{}:", c.n))
        .and_then(|s| s.parse::<u64>().ok());
    let failed_since = |s: u64| {
        w.maybe
            .is_some_and(|(first, last)| (first..=last).contains(&s))
    };
    if held.is_some_and(|s| Some(s) == w.acked || failed_since(s)) {
        Outcome::Ok
    } else {
        Outcome::LostWrite(format!(
            "{sbx}: {} holds {body:?}, acknowledged {:?}",
            mine(c),
            w.acked
        ))
    }
}

async fn exec(c: &Ctx, sbx: &SandboxId) -> Outcome {
    let sent = Instant::now();
    let req = space_client::exec(["cat", WHOAMI]);
    let body = serde_json::to_vec(&req).unwrap_or_default();
    let r = c
        .client
        .operation(
            sbx,
            Method::POST,
            &format!("/v1/sandboxes/{sbx}/exec"),
            Some("application/json"),
            Bytes::from(body),
            OperationClass::Mutation {
                idempotency_key: true,
            },
        )
        .await;
    let a = match r {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    if let Some(o) = judged(c, sbx, &a, sent) {
        return o;
    }
    match serde_json::from_slice::<ExecResponse>(&a.body) {
        Ok(out) if out.exit_code == 0 && out.stdout == sbx.to_string() => Outcome::Ok,
        Ok(out) if out.exit_code == 0 => {
            Outcome::CrossSandbox(format!("{sbx} exec printed {:?}", out.stdout))
        }
        Ok(out) => Outcome::Failed(format!("exec exited {}: {}", out.exit_code, out.stderr)),
        Err(e) => Outcome::Failed(format!("exec answer: {e}")),
    }
}

async fn stream(c: &Ctx, sbx: &SandboxId) -> Outcome {
    c.tally.streams.fetch_add(1, Ordering::Relaxed);
    let run = async {
        let mut s = c
            .client
            .exec_stream(sbx, &space_client::exec(["cat", WHOAMI]))
            .await
            .map_err(|e| Outcome::Failed(format!("stream open: {e}")))?;
        let mut out = Vec::new();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(ExecEvent::Stdout(b)) => out.extend_from_slice(&b),
                Ok(ExecEvent::Stderr(_) | ExecEvent::Started { .. }) => {}
                Ok(ExecEvent::Exited(0)) if out == sbx.to_string().as_bytes() => {
                    return Ok(());
                }
                Ok(ExecEvent::Exited(code)) => {
                    return Err(Outcome::Failed(format!(
                        "stream exec exited {code} with {:?}",
                        String::from_utf8_lossy(&out)
                    )));
                }
                Err(Error::Closed { code: 4001, .. }) => {
                    return Err(Outcome::StreamReplaced);
                }
                Err(e) => return Err(Outcome::Failed(format!("stream: {e}"))),
            }
        }
        Err(Outcome::Failed("stream ended without an exit".into()))
    };
    match tokio::time::timeout(std::time::Duration::from_secs(60), run).await {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(o)) => o,
        Err(_) => Outcome::Failed("stream: no exit within 60 s".into()),
    }
}
