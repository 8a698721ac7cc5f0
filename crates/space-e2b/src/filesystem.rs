//! envd's `filesystem.Filesystem` service on the node API's file operations (each on
//! the token's execution): `Stat` (`files/stat`), `MakeDir` (`files/mkdir`), `Move`
//! (`files/rename`), `ListDir` (`files/list`, walked to `depth`), `Remove` (`DELETE
//! files`), `WatchDir` (the `watch` stream) and the polled watchers
//! ([`crate::watchers`]). The agent does each inside the sandbox as the sandbox, so
//! no host path is ever touched here.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use space_identity::OperationClass;

use crate::connect::{self, Code, RpcError};
use crate::entries::{PathRequest, entry_info, parse_json, q, required, stat, user_param};
use crate::front::{Envd, Front};

/// Entries a `ListDir` answers at most (deeper walks past it are refused, not cut).
pub const MAX_LISTED: usize = 100_000;

/// Deepest `ListDir` walk.
const MAX_DEPTH: u32 = 64;

/// Directories one `ListDir` lists at most (each is a call to the sandbox).
pub const MAX_WALKED: usize = 10_000;

#[derive(Debug, Default, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WatcherRequest {
    #[serde(default)]
    pub(crate) watcher_id: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn call(
    State(front): State<Arc<Front>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    let fail = |e: RpcError| connect::failure(streaming, &e);
    let (ctx, body) =
        match crate::front::begin(&front, &headers, body, connect::SMALL_MESSAGE).await {
            Ok(b) => b,
            Err(r) => return r,
        };
    if method == "WatchDir" {
        if !streaming {
            return fail(RpcError::new(
                Code::InvalidArgument,
                "WatchDir is a streaming call (application/connect+json)",
            ));
        }
        return match connect::stream_request::<PathRequest>(&body) {
            Ok(req) => crate::watchers::watch_dir(&front, ctx, req, &headers).await,
            Err(e) => fail(e),
        };
    }
    if streaming {
        return fail(RpcError::new(
            Code::InvalidArgument,
            format!("filesystem.Filesystem/{method} is a unary call (application/json)"),
        ));
    }
    let outcome = match method.as_str() {
        "Stat" => match connect::unary_request::<PathRequest>(&headers, &body) {
            Ok(r) => stat(&front, &ctx, &r.path)
                .await
                .map(|e| json!({"entry": e})),
            Err(e) => Err(e),
        },
        "MakeDir" => match connect::unary_request::<PathRequest>(&headers, &body) {
            Ok(r) => make_dir(&front, &ctx, &r.path).await,
            Err(e) => Err(e),
        },
        "Move" => match connect::unary_request::<MoveRequest>(&headers, &body) {
            Ok(r) => rename(&front, &ctx, &r.source, &r.destination).await,
            Err(e) => Err(e),
        },
        "ListDir" => match connect::unary_request::<PathRequest>(&headers, &body) {
            Ok(r) => list_dir(&front, &ctx, &r.path, r.depth.unwrap_or(1))
                .await
                .map(|entries| json!({"entries": entries})),
            Err(e) => Err(e),
        },
        "Remove" => match connect::unary_request::<PathRequest>(&headers, &body) {
            Ok(r) => remove(&front, &ctx, &r.path).await.map(|()| json!({})),
            Err(e) => Err(e),
        },
        "CreateWatcher" => match connect::unary_request::<PathRequest>(&headers, &body) {
            Ok(r) => crate::watchers::create(&front, ctx, r)
                .await
                .map(|id| json!({"watcherId": id})),
            Err(e) => Err(e),
        },
        "GetWatcherEvents" => match connect::unary_request::<WatcherRequest>(&headers, &body) {
            Ok(r) => front
                .watchers
                .take((ctx.sandbox, ctx.execution), &r.watcher_id)
                .map(|events| json!({"events": events})),
            Err(e) => Err(e),
        },
        "RemoveWatcher" => match connect::unary_request::<WatcherRequest>(&headers, &body) {
            Ok(r) => front
                .watchers
                .remove((ctx.sandbox, ctx.execution), &r.watcher_id)
                .map(|()| json!({})),
            Err(e) => Err(e),
        },
        m => Err(RpcError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{m} is not a method"),
        )),
    };
    match outcome {
        Ok(v) => connect::unary_response(&v),
        Err(e) => fail(e),
    }
}

async fn make_dir(front: &Front, ctx: &Envd, path: &str) -> Result<Value, RpcError> {
    required(path)?;
    let f = front
        .operate(
            ctx,
            Method::POST,
            &format!("files/mkdir?path={}{}", q(path), user_param(ctx)),
            None,
            Bytes::new(),
            OperationClass::Mutation {
                idempotency_key: false,
            },
        )
        .await
        .map_err(|e| {
            if e.code == Code::FailedPrecondition {
                RpcError::new(Code::AlreadyExists, e.message)
            } else {
                e
            }
        })?;
    let made = parse_json(&f.body)?;
    if made["created"] == false {
        return Err(RpcError::new(
            Code::AlreadyExists,
            format!("directory {path} already exists"),
        ));
    }
    Ok(json!({"entry": stat(front, ctx, path).await?}))
}

async fn rename(front: &Front, ctx: &Envd, from: &str, to: &str) -> Result<Value, RpcError> {
    required(from)?;
    required(to)?;
    let body = json!({"from": from, "to": to}).to_string();
    front
        .operate(
            ctx,
            Method::POST,
            &format!("files/rename?{}", user_param(ctx).trim_start_matches('&')),
            Some("application/json"),
            Bytes::from(body),
            OperationClass::Mutation {
                idempotency_key: false,
            },
        )
        .await?;
    Ok(json!({"entry": stat(front, ctx, to).await?}))
}

async fn remove(front: &Front, ctx: &Envd, path: &str) -> Result<(), RpcError> {
    required(path)?;
    front
        .operate(
            ctx,
            Method::DELETE,
            &format!("files?path={}{}", q(path), user_param(ctx)),
            None,
            Bytes::new(),
            OperationClass::Mutation {
                idempotency_key: false,
            },
        )
        .await
        .map(drop)
}

/// Every entry under `path` down to `depth` levels (1: its own entries), symlinks
/// never followed.
async fn list_dir(
    front: &Front,
    ctx: &Envd,
    path: &str,
    depth: u32,
) -> Result<Vec<Value>, RpcError> {
    required(path)?;
    let depth = depth.clamp(1, MAX_DEPTH);
    let root = stat(front, ctx, path).await?;
    if root["type"] != "FILE_TYPE_DIRECTORY" {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("path {path} is not a directory"),
        ));
    }
    let root_path = root["path"].as_str().unwrap_or(path).to_owned();
    let mut out = Vec::new();
    let mut queue = VecDeque::from([(root_path, 1u32)]);
    let mut walked = 0usize;
    while let Some((dir, level)) = queue.pop_front() {
        walked += 1;
        if walked > MAX_WALKED {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_WALKED} directories: list a smaller depth"),
            ));
        }
        let f = front
            .operate(
                ctx,
                Method::GET,
                &format!("files/list?path={}{}", q(&dir), user_param(ctx)),
                None,
                Bytes::new(),
                OperationClass::Read,
            )
            .await?;
        let entries = parse_json(&f.body)?;
        for e in entries.as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap_or_default();
            let full = if dir.ends_with('/') {
                format!("{dir}{name}")
            } else {
                format!("{dir}/{name}")
            };
            let info = entry_info(e, &full);
            if info["type"] == "FILE_TYPE_DIRECTORY" && level < depth {
                queue.push_back((full, level + 1));
            }
            if out.len() == MAX_LISTED {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!("more than {MAX_LISTED} entries: list a smaller depth"),
                ));
            }
            out.push(info);
        }
    }
    Ok(out)
}
