//! Directory watches: envd's `WatchDir` stream, and its polled watchers
//! (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`, what the synchronous Python
//! SDK uses). Both ride on the node API's `watch` stream on the token's execution; a
//! polled watcher keeps that stream open here and queues its events (bounded: a
//! watcher whose queue fills reports the loss instead of dropping events unsaid,
//! and one not polled for [`IDLE`] is closed).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::connect::{self, Code, RpcError};
use crate::entries::{PathRequest, stat};
use crate::front::{Envd, Front};
use crate::watch_table::{MAX_QUEUED, MAX_QUEUED_BYTES, Queued, REAP_EVERY, Watcher, lock};

/// A quiet `WatchDir` stream gets a keep-alive this often.
const KEEPALIVE: Duration = Duration::from_secs(20);

/// Keeps reaping the polled watchers while the front lives.
pub(crate) fn spawn_reaper(front: std::sync::Weak<Front>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REAP_EVERY).await;
            let Some(f) = front.upgrade() else { return };
            f.watchers.reap();
        }
    });
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
        space_client::encode_query(&req.path),
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
    let id = format!(
        "w{}",
        space_control::random_bytes::<12>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    front.watchers.reserve((ctx.sandbox, ctx.execution), &id)?;
    let mut backend = match open(front, &ctx, &req).await {
        Ok(b) => b,
        Err(e) => {
            lock(&front.watchers.by_id).remove(&id);
            return Err(e);
        }
    };
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
            let mut q = lock(&watcher.state);
            if list.is_err() {
                q.lost = true;
            }
            for e in made {
                let size = e.to_string().len();
                if q.events.len() >= MAX_QUEUED || q.bytes + size > MAX_QUEUED_BYTES {
                    q.lost = true;
                } else {
                    q.bytes += size;
                    q.events.push_back(e);
                }
            }
        };
        if let Some(watcher) = w.upgrade() {
            lock(&watcher.state).ended = Some(ended);
        }
    });
    let w = Arc::new(Watcher {
        state: Mutex::new(Queued {
            polled: Some(Instant::now()),
            ..Queued::default()
        }),
        task: task.abort_handle(),
    });
    match lock(&front.watchers.by_id).get_mut(&id) {
        Some(entry) => entry.watcher = Some(Arc::clone(&w)),
        // Forgotten meanwhile (its sandbox deleted): nothing to keep.
        None => return Err(RpcError::new(Code::NotFound, "the sandbox went away")),
    }
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
