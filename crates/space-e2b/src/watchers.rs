//! Directory watches: envd's `WatchDir` stream, and its polled watchers
//! (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`, what the synchronous Python
//! SDK uses). Both ride on the node API's `watch` stream on the token's execution; a
//! polled watcher keeps that stream open here and queues its events (bounded: a
//! watcher whose queue fills reports the loss instead of dropping events unsaid,
//! and one not polled for [`IDLE`] is closed).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use space_identity::{ExecutionId, SandboxId};
use tokio_tungstenite::tungstenite::Message;

use crate::Front;
use crate::connect::{self, Code, RpcError};
use crate::envd::Envd;
use crate::filesystem::{PathRequest, space_client_query, stat};

/// Events a polled watcher queues at most.
pub const MAX_QUEUED: usize = 10_000;

/// Polled watchers per execution at most.
pub const MAX_WATCHERS: usize = 64;

/// A polled watcher nobody asked for events for this long is closed.
pub const IDLE: Duration = Duration::from_secs(600);

/// A quiet `WatchDir` stream gets a keep-alive this often.
const KEEPALIVE: Duration = Duration::from_secs(20);

/// The polled watchers.
#[derive(Debug, Default)]
pub struct Table {
    by_id: Mutex<HashMap<String, Arc<Watcher>>>,
}

#[derive(Debug)]
struct Watcher {
    sandbox: SandboxId,
    execution: ExecutionId,
    state: Mutex<Queued>,
    task: tokio::task::AbortHandle,
}

#[derive(Debug, Default)]
struct Queued {
    events: VecDeque<Value>,
    /// Events were lost (the queue was full, or the watch told of an overflow).
    lost: bool,
    /// The watch ended (its directory went, or its execution was replaced).
    ended: Option<RpcError>,
    polled: Option<Instant>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Table {
    fn get(&self, ctx: &Envd, id: &str) -> Result<Arc<Watcher>, RpcError> {
        let mut t = self.by_id.lock().map_err(|_| poisoned())?;
        reap(&mut t);
        t.get(id)
            .filter(|w| w.sandbox == ctx.sandbox && w.execution == ctx.execution)
            .cloned()
            .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id} not found")))
    }

    /// The events queued since the last call (or the watch's end, once they are out).
    pub(crate) fn take(&self, ctx: &Envd, id: &str) -> Result<Vec<Value>, RpcError> {
        let w = self.get(ctx, id)?;
        let mut q = w.state.lock().map_err(|_| poisoned())?;
        q.polled = Some(Instant::now());
        if q.lost {
            q.lost = false;
            q.events.clear();
            return Err(RpcError::new(
                Code::DataLoss,
                format!(
                    "watcher {id} lost events: more than {MAX_QUEUED} were queued between polls"
                ),
            ));
        }
        if q.events.is_empty() {
            if let Some(e) = &q.ended {
                return Err(e.clone());
            }
        }
        Ok(q.events.drain(..).collect())
    }

    pub(crate) fn remove(&self, ctx: &Envd, id: &str) -> Result<(), RpcError> {
        self.get(ctx, id)?;
        if let Ok(mut t) = self.by_id.lock() {
            t.remove(id);
        }
        Ok(())
    }

    /// Closes every watcher of `sandbox` (it was deleted).
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        if let Ok(mut t) = self.by_id.lock() {
            t.retain(|_, w| w.sandbox != *sandbox);
        }
    }
}

/// Drops watchers idle past [`IDLE`].
fn reap(t: &mut HashMap<String, Arc<Watcher>>) {
    t.retain(|_, w| {
        w.state
            .lock()
            .map(|q| q.polled.is_none_or(|p| p.elapsed() < IDLE))
            .unwrap_or(false)
    });
}

fn poisoned() -> RpcError {
    RpcError::new(Code::Internal, "watcher table lock poisoned")
}

/// Opens the node API's watch of `req.path` on the context's execution.
async fn open(
    front: &Front,
    ctx: &Envd,
    req: &PathRequest,
) -> Result<space_control::edge::Backend, RpcError> {
    if req.path.is_empty() {
        return Err(RpcError::new(Code::InvalidArgument, "path is required"));
    }
    let pq = format!(
        "watch?path={}&recursive={}",
        space_client_query(&req.path),
        req.recursive
    );
    front.stream(ctx, &pq).await
}

/// envd's events for one node-API watch message (a rename is its old name gone and
/// its new one made, as envd's inotify reports it).
fn events(msg: &Value) -> Result<Vec<(String, &'static str)>, RpcError> {
    let path = |k: &str| msg[k].as_str().unwrap_or_default().to_owned();
    Ok(match msg["type"].as_str().unwrap_or_default() {
        "created" => vec![(path("path"), "EVENT_TYPE_CREATE")],
        "modified" => vec![(path("path"), "EVENT_TYPE_WRITE")],
        "removed" => vec![(path("path"), "EVENT_TYPE_REMOVE")],
        "renamed" => vec![
            (path("from"), "EVENT_TYPE_RENAME"),
            (path("to"), "EVENT_TYPE_CREATE"),
        ],
        "overflow" => {
            return Err(RpcError::new(
                Code::DataLoss,
                "the sandbox's watch overflowed: events were lost",
            ));
        }
        _ => vec![],
    })
}

/// An event, with the entry it names when asked for (`includeEntry`) and it still
/// exists.
async fn event(
    front: &Front,
    ctx: &Envd,
    root: &str,
    name: String,
    kind: &str,
    include: bool,
) -> Value {
    let mut e = json!({"name": name, "type": kind});
    if include && kind != "EVENT_TYPE_REMOVE" && kind != "EVENT_TYPE_RENAME" {
        let full = format!("{}/{}", root.trim_end_matches('/'), name);
        if let Ok(entry) = stat(front, ctx, &full).await {
            e["entry"] = entry;
        }
    }
    e
}

/// Why a watch stream closed.
fn closed(code: u16, reason: &str) -> RpcError {
    match code {
        1000 => RpcError::new(
            Code::NotFound,
            format!("the watched directory went away ({reason})"),
        ),
        4001 => RpcError::new(
            Code::Unavailable,
            "the sandbox's execution was replaced (resumed or moved): the watch ended",
        ),
        _ => RpcError::new(Code::Unavailable, format!("the watch ended: {reason}")),
    }
}

/// `CreateWatcher`: a watch kept here, polled with `GetWatcherEvents`.
pub(crate) async fn create(
    front: &Arc<Front>,
    ctx: Envd,
    req: PathRequest,
) -> Result<String, RpcError> {
    {
        let t = front.watchers.by_id.lock().map_err(|_| poisoned())?;
        let mine = t
            .values()
            .filter(|w| w.sandbox == ctx.sandbox && w.execution == ctx.execution)
            .count();
        if mine >= MAX_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_WATCHERS} watchers per sandbox: remove one first"),
            ));
        }
    }
    let mut backend = open(front, &ctx, &req).await?;
    let id = format!(
        "w{}",
        space_control::random_bytes::<12>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let (sandbox, execution) = (ctx.sandbox, ctx.execution);
    let (tx, rx) = tokio::sync::oneshot::channel::<Arc<Watcher>>();
    let f = Arc::clone(front);
    let task = tokio::spawn(async move {
        let Ok(strong) = rx.await else { return };
        // The table holds the watcher; this task only while it handles an event.
        let w = Arc::downgrade(&strong);
        drop(strong);
        let ended = loop {
            let Some(m) = backend.next().await else {
                break RpcError::new(Code::Unavailable, "the watch's connection ended");
            };
            let msg = match m {
                Ok(Message::Text(t)) => {
                    serde_json::from_str::<Value>(t.as_str()).unwrap_or_default()
                }
                Ok(Message::Close(c)) => {
                    let (code, reason) = c.map_or((1006, String::new()), |c| {
                        (u16::from(c.code), c.reason.to_string())
                    });
                    break closed(code, &reason);
                }
                Ok(_) => continue,
                Err(e) => {
                    break RpcError::new(
                        Code::Unavailable,
                        format!("the watch's connection ended: {e}"),
                    );
                }
            };
            let Some(watcher) = w.upgrade() else { return };
            let list = events(&msg);
            let mut made = Vec::new();
            if let Ok(list) = &list {
                for (name, kind) in list {
                    made.push(
                        event(&f, &ctx, &req.path, name.clone(), kind, req.include_entry).await,
                    );
                }
            }
            let Ok(mut q) = watcher.state.lock() else {
                return;
            };
            if list.is_err() {
                q.lost = true;
            }
            for e in made {
                if q.events.len() >= MAX_QUEUED {
                    q.lost = true;
                } else {
                    q.events.push_back(e);
                }
            }
        };
        if let Some(watcher) = w.upgrade() {
            if let Ok(mut q) = watcher.state.lock() {
                q.ended = Some(ended);
            }
        }
    });
    let w = Arc::new(Watcher {
        sandbox,
        execution,
        state: Mutex::new(Queued {
            polled: Some(Instant::now()),
            ..Queued::default()
        }),
        task: task.abort_handle(),
    });
    front
        .watchers
        .by_id
        .lock()
        .map_err(|_| poisoned())?
        .insert(id.clone(), Arc::clone(&w));
    let _ = tx.send(w);
    Ok(id)
}

/// `WatchDir`: the watch as a stream — `start`, then each event, keep-alives while
/// quiet, until the client's deadline or the watch's end.
pub(crate) async fn watch_dir(
    front: &Arc<Front>,
    ctx: Envd,
    req: PathRequest,
    headers: &HeaderMap,
) -> Response {
    let backend = match open(front, &ctx, &req).await {
        Ok(b) => b,
        Err(e) => return connect::stream_error(&e),
    };
    let deadline = connect::timeout(headers).map(|d| tokio::time::Instant::now() + d);
    let start = connect::envelope(&json!({"start": {}}));
    let front = Arc::clone(front);
    let state = WatchState {
        first: Some(start),
        backend: Some(backend),
        pending: VecDeque::new(),
        front,
        ctx,
        req,
        deadline,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let chunk = next_chunk(&mut st).await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), st))
    });
    connect::stream_response(Body::from_stream(stream))
}

/// The next envelope of a `WatchDir` answer (`None`: it ended).
async fn next_chunk(st: &mut WatchState) -> Option<Bytes> {
    if let Some(first) = st.first.take() {
        return Some(first);
    }
    loop {
        if let Some(e) = st.pending.pop_front() {
            return Some(connect::envelope(&json!({"filesystem": e})));
        }
        let backend = st.backend.as_mut()?;
        let next = async { tokio::time::timeout(KEEPALIVE, backend.next()).await.ok() };
        let got = match st.deadline {
            Some(d) => match tokio::time::timeout_at(d, next).await {
                Ok(g) => g,
                Err(_) => {
                    let e = RpcError::new(Code::DeadlineExceeded, "the watch's timeout passed");
                    return Some(finish(st, &e));
                }
            },
            None => next.await,
        };
        let msg = match got {
            None => return Some(connect::envelope(&json!({"keepalive": {}}))),
            Some(None) => {
                let e = RpcError::new(Code::Unavailable, "the watch's connection ended");
                return Some(finish(st, &e));
            }
            Some(Some(Err(e))) => {
                let e = RpcError::new(
                    Code::Unavailable,
                    format!("the watch's connection ended: {e}"),
                );
                return Some(finish(st, &e));
            }
            Some(Some(Ok(Message::Close(c)))) => {
                let (code, reason) = c.map_or((1006, String::new()), |c| {
                    (u16::from(c.code), c.reason.to_string())
                });
                return Some(finish(st, &closed(code, &reason)));
            }
            Some(Some(Ok(Message::Text(t)))) => {
                serde_json::from_str::<Value>(t.as_str()).unwrap_or_default()
            }
            Some(Some(Ok(_))) => continue,
        };
        match events(&msg) {
            Ok(list) => {
                for (name, kind) in list {
                    let e = event(
                        &st.front,
                        &st.ctx,
                        &st.req.path,
                        name,
                        kind,
                        st.req.include_entry,
                    )
                    .await;
                    st.pending.push_back(e);
                }
            }
            Err(e) => return Some(finish(st, &e)),
        }
    }
}

/// The end of a `WatchDir` answer with `e`: nothing follows it.
fn finish(st: &mut WatchState, e: &RpcError) -> Bytes {
    st.backend = None;
    st.pending.clear();
    connect::end_stream(Some(e))
}

/// Where a `WatchDir` answer is.
struct WatchState {
    first: Option<Bytes>,
    backend: Option<space_control::edge::Backend>,
    pending: VecDeque<Value>,
    front: Arc<Front>,
    ctx: Envd,
    req: PathRequest,
    deadline: Option<tokio::time::Instant>,
}
