//! Non-idempotent operations run once per idempotency key: the answers remembered
//! (bounded by bytes and keys, for a while), and [`once`], which runs an operation to
//! its end and answers its replays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_identity::SandboxId;

use super::refusal::Refusal;

/// A response remembered under an idempotency key.
#[derive(Debug)]
struct Stored {
    status: StatusCode,
    execution: String,
    content_type: &'static str,
    at: Instant,
    /// Bytes the entry counts against the cache's budget while it keeps its body.
    size: usize,
    /// The body, while kept; a replay of a key whose body is gone is answered 409.
    body: Mutex<Option<Bytes>>,
    /// Why the body is gone (when it is).
    dropped: Mutex<Option<Dropped>>,
}

/// Why a remembered answer has no body any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    /// It was larger than one entry may be.
    TooLarge,
    /// Newer answers needed the room.
    Evicted,
}

impl Stored {
    fn body(&self) -> Option<Bytes> {
        self.body.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Drops the body; whether there was one.
    fn drop_body(&self, why: Dropped) -> bool {
        let had = self
            .body
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if had {
            *self.dropped.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        }
        had
    }
}

type Key = (SandboxId, String);
type StoredCell = Arc<tokio::sync::OnceCell<Arc<Stored>>>;

/// Responses of non-idempotent operations by (sandbox, idempotency key), kept at least
/// as long as a capability lives, so a replay has no second effect.
///
/// Bounded twice: the bodies it keeps add up to at most `max_bytes` (the oldest bodies
/// are dropped first, an answer over a quarter of the budget is never kept), and it
/// remembers at most `max_entries` keys (the oldest are forgotten first). A key whose
/// body was dropped is still remembered: its replay is answered `409
/// replay_unavailable`, never run a second time.
#[derive(Debug, Clone)]
pub struct IdempotencyCache {
    inner: Arc<Mutex<CacheInner>>,
}

#[derive(Debug)]
struct CacheInner {
    max_bytes: usize,
    max_entries: usize,
    entries: HashMap<Key, StoredCell>,
    /// Completed entries, oldest first (for the key bound and the TTL).
    keys: std::collections::VecDeque<(Key, Arc<Stored>)>,
    /// Completed entries that still keep a body, oldest first (for the byte bound).
    bodies: std::collections::VecDeque<Arc<Stored>>,
    /// Bytes of the bodies kept.
    bytes: usize,
}

/// Default byte budget of the idempotency cache.
pub const IDEMPOTENCY_MAX_BYTES: usize = 64 << 20;
/// Default number of keys the idempotency cache remembers.
pub const IDEMPOTENCY_MAX_ENTRIES: usize = 50_000;

impl Default for IdempotencyCache {
    fn default() -> Self {
        Self::with_limits(IDEMPOTENCY_MAX_BYTES, IDEMPOTENCY_MAX_ENTRIES)
    }
}

/// How long responses are remembered.
const IDEMPOTENCY_TTL: Duration = Duration::from_secs(600);

impl IdempotencyCache {
    /// A cache keeping at most `max_bytes` of bodies and `max_entries` keys.
    pub fn with_limits(max_bytes: usize, max_entries: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(CacheInner {
                max_bytes,
                max_entries,
                entries: HashMap::new(),
                keys: Default::default(),
                bodies: Default::default(),
                bytes: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Largest body one entry may keep.
    fn max_entry(&self) -> usize {
        self.lock().max_bytes / 4
    }

    /// Bytes of the bodies kept (tests, metrics).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Keys remembered, completed or under way.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn cell(&self, key: Key) -> StoredCell {
        let mut inner = self.lock();
        inner.expire();
        Arc::clone(inner.entries.entry(key).or_default())
    }

    /// Counts an answer just stored under `key`, then drops the oldest bodies and keys
    /// past the bounds.
    fn admit(&self, key: Key, stored: &Arc<Stored>) {
        let mut inner = self.lock();
        if stored.body().is_some() {
            inner.bytes += stored.size;
            inner.bodies.push_back(Arc::clone(stored));
        }
        inner.keys.push_back((key, Arc::clone(stored)));
        while inner.bytes > inner.max_bytes {
            let Some(old) = inner.bodies.pop_front() else {
                break;
            };
            if old.drop_body(Dropped::Evicted) {
                inner.bytes -= old.size;
            }
        }
        while inner.entries.len() > inner.max_entries {
            if !inner.forget_oldest() {
                break;
            }
        }
        inner.expire();
    }
}

impl CacheInner {
    /// Forgets the oldest completed key; false when there is none.
    fn forget_oldest(&mut self) -> bool {
        let Some((key, old)) = self.keys.pop_front() else {
            return false;
        };
        if old.drop_body(Dropped::Evicted) {
            self.bytes -= old.size;
        }
        let current = self
            .entries
            .get(&key)
            .and_then(|c| c.get())
            .is_some_and(|s| Arc::ptr_eq(s, &old));
        if current {
            self.entries.remove(&key);
        }
        // Both queues are in completion order: a body still queued for this entry is
        // the first one.
        if self.bodies.front().is_some_and(|s| Arc::ptr_eq(s, &old)) {
            self.bodies.pop_front();
        }
        true
    }

    /// Forgets the keys older than [`IDEMPOTENCY_TTL`] (they are oldest first).
    fn expire(&mut self) {
        while self
            .keys
            .front()
            .is_some_and(|(_, s)| s.at.elapsed() >= IDEMPOTENCY_TTL)
        {
            self.forget_oldest();
        }
    }
}
/// Runs `fut` in its own task to its end, whatever becomes of the caller.
async fn detached<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::spawn(fut)
        .await
        .map_err(|e| Refusal::Internal(format!("operation task: {e}")))
}

/// Largest answer an operation may give (an exec's JSON is bounded by its output caps).
const MAX_ANSWER: usize = 2 * space_proto::api::MAX_OUTPUT_BYTES as usize + (1 << 20);

/// Runs a non-idempotent operation once per idempotency key, to its end: it runs in
/// its own task, so a caller that goes away (a dropped connection, a client timeout)
/// cancels neither the operation nor the recording of its answer, and a retry with the
/// same key gets that answer instead of a second run — or, when the answer was too
/// large to keep or was dropped to make room, `409 replay_unavailable`.
pub(crate) async fn once<F, Fut>(
    cache: &IdempotencyCache,
    sandbox: SandboxId,
    headers: &HeaderMap,
    run: F,
) -> Response
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return detached(run())
            .await
            .unwrap_or_else(IntoResponse::into_response);
    };
    if key.is_empty() || key.len() > 255 {
        return Refusal::BadRequest("idempotency key must be 1 to 255 characters".into())
            .into_response();
    }
    let key: Key = (sandbox, key.to_owned());
    let cell = cache.cell(key.clone());
    let operation = run();
    let cache = cache.clone();
    let answered = detached(async move {
        // The body of the answer when this task ran the operation (the first caller
        // gets it whether or not the cache keeps it).
        let mut fresh: Option<Bytes> = None;
        let stored = cell
            .get_or_init(|| async {
                let resp = operation.await;
                let status = resp.status();
                let execution = resp
                    .headers()
                    .get("space-execution")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let content_type = if resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|v| v == "application/json")
                {
                    "application/json"
                } else {
                    "application/octet-stream"
                };
                let (status, content_type, body) =
                    match axum::body::to_bytes(resp.into_body(), MAX_ANSWER).await {
                        Ok(body) => (status, content_type, body),
                        Err(e) => {
                            let e = Refusal::AnswerLost(format!(
                                "the operation ran but its answer was lost: {e}"
                            ))
                            .into_response();
                            let body = axum::body::to_bytes(e.into_body(), 4096)
                                .await
                                .unwrap_or_default();
                            (StatusCode::BAD_GATEWAY, "application/json", body)
                        }
                    };
                let size = body.len() + key.1.len() + execution.len();
                let keep = size <= cache.max_entry();
                fresh = Some(body.clone());
                let stored = Arc::new(Stored {
                    status,
                    execution,
                    content_type,
                    at: Instant::now(),
                    size,
                    body: Mutex::new(keep.then_some(body)),
                    dropped: Mutex::new((!keep).then_some(Dropped::TooLarge)),
                });
                cache.admit(key.clone(), &stored);
                stored
            })
            .await
            .clone();
        (stored, fresh)
    })
    .await;
    let (stored, fresh) = match answered {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let mut resp = match fresh.or_else(|| stored.body()) {
        Some(body) => (
            stored.status,
            [(header::CONTENT_TYPE, stored.content_type)],
            body,
        )
            .into_response(),
        None => {
            let why = match *stored.dropped.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(Dropped::TooLarge) => "was too large to keep for a replay",
                _ => "is no longer kept (newer answers needed the room)",
            };
            Refusal::ReplayUnavailable(format!(
                "an operation with this idempotency key already ran (status {}); its \
                 answer {why}, and it is not run a second time",
                stored.status.as_u16()
            ))
            .into_response()
        }
    };
    // Only an answer that came from the agent names an execution (a refusal before it
    // names none).
    if let Ok(v) = HeaderValue::from_str(&stored.execution)
        && !stored.execution.is_empty()
    {
        resp.headers_mut().insert("space-execution", v);
    }
    resp.headers_mut()
        .insert("idempotent-replay", HeaderValue::from_static("checked"));
    resp
}

#[cfg(test)]
mod tests {
    use space_proto::api::ErrorBody;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Runs an operation answering `len` bytes under `key`; counts its runs.
    async fn call(
        cache: &IdempotencyCache,
        key: &str,
        runs: &Arc<AtomicUsize>,
        len: usize,
    ) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
        let runs = Arc::clone(runs);
        once(
            cache,
            SandboxId::from_bytes([1; 16]),
            &headers,
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let body = vec![b'x'; len];
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    body,
                )
                    .into_response()
            },
        )
        .await
    }

    async fn parts(resp: Response) -> (StatusCode, Vec<u8>) {
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body.to_vec())
    }

    #[tokio::test]
    async fn idempotency_cache_stays_under_its_byte_budget_dropping_the_oldest_bodies() {
        let cache = IdempotencyCache::with_limits(1 << 20, 1000);
        let runs = Arc::new(AtomicUsize::new(0));
        let len = 200 << 10;
        for i in 0..20 {
            let (status, body) = parts(call(&cache, &format!("k{i}"), &runs, len).await).await;
            assert_eq!((status, body.len()), (StatusCode::OK, len));
            assert!(cache.bytes() <= 1 << 20, "{} bytes kept", cache.bytes());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 20);
        // The newest answers replay from the cache …
        let (status, body) = parts(call(&cache, "k19", &runs, len).await).await;
        assert_eq!((status, body.len()), (StatusCode::OK, len));
        // … the oldest are refused, not run again.
        let (status, body) = parts(call(&cache, "k0", &runs, len).await).await;
        assert_eq!(status, StatusCode::CONFLICT);
        let e: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.error, "replay_unavailable");
        assert!(e.message.contains("no longer kept"), "{}", e.message);
        assert_eq!(runs.load(Ordering::SeqCst), 20);
        assert_eq!(cache.len(), 20);
    }

    #[tokio::test]
    async fn an_answer_too_large_to_keep_is_refused_on_replay_and_not_run_again() {
        let cache = IdempotencyCache::with_limits(1 << 20, 1000);
        let runs = Arc::new(AtomicUsize::new(0));
        // Over a quarter of the budget: answered once, never kept.
        let len = 600 << 10;
        let (status, body) = parts(call(&cache, "big", &runs, len).await).await;
        assert_eq!((status, body.len()), (StatusCode::OK, len));
        assert_eq!(cache.bytes(), 0);
        for _ in 0..3 {
            let (status, body) = parts(call(&cache, "big", &runs, len).await).await;
            assert_eq!(status, StatusCode::CONFLICT);
            let e: ErrorBody = serde_json::from_slice(&body).unwrap();
            assert_eq!(e.error, "replay_unavailable");
            assert!(e.message.contains("too large"), "{}", e.message);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_replays_of_an_oversized_answer_run_it_once() {
        let cache = IdempotencyCache::with_limits(1 << 20, 1000);
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (cache, runs) = (cache.clone(), Arc::clone(&runs));
                tokio::spawn(async move { call(&cache, "same", &runs, 600 << 10).await.status() })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let ok = answers.iter().filter(|s| **s == StatusCode::OK).count();
        let refused = answers
            .iter()
            .filter(|s| **s == StatusCode::CONFLICT)
            .count();
        assert_eq!((ok, refused), (1, 7), "{answers:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn idempotency_cache_forgets_its_oldest_keys_past_the_entry_bound() {
        let cache = IdempotencyCache::with_limits(1 << 20, 3);
        let runs = Arc::new(AtomicUsize::new(0));
        for i in 0..6 {
            call(&cache, &format!("k{i}"), &runs, 10).await;
            assert!(cache.len() <= 3, "{} keys", cache.len());
        }
        let kept = cache.bytes();
        assert!(kept > 0 && kept <= 3 * (10 + 2 + 16), "{kept}");
        let (status, _) = parts(call(&cache, "k5", &runs, 10).await).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(runs.load(Ordering::SeqCst), 6);
    }
}
