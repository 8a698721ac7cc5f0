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
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use space_identity::OperationClass;

use crate::Front;
use crate::connect::{self, Code, RpcError};
use crate::envd::Envd;

/// Entries a `ListDir` answers at most (deeper walks past it are refused, not cut).
pub const MAX_LISTED: usize = 100_000;

/// Deepest `ListDir` walk.
const MAX_DEPTH: u32 = 64;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PathRequest {
    #[serde(default)]
    pub(crate) path: String,
    #[serde(default)]
    pub(crate) depth: Option<u32>,
    #[serde(default)]
    pub(crate) recursive: bool,
    #[serde(default)]
    pub(crate) include_entry: bool,
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) allow_network_mounts: bool,
}

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
    let fail = |e: RpcError| {
        if streaming {
            connect::stream_error(&e)
        } else {
            e.into_response()
        }
    };
    let ctx = match front.envd(&headers).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let body = match axum::body::to_bytes(body, connect::SMALL_MESSAGE).await {
        Ok(b) => b,
        Err(_) => {
            return fail(RpcError::new(
                Code::ResourceExhausted,
                "the request is over its size limit",
            ));
        }
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
                .take(&ctx, &r.watcher_id)
                .map(|events| json!({"events": events})),
            Err(e) => Err(e),
        },
        "RemoveWatcher" => match connect::unary_request::<WatcherRequest>(&headers, &body) {
            Ok(r) => front
                .watchers
                .remove(&ctx, &r.watcher_id)
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

/// `path` as a query value.
fn q(path: &str) -> String {
    space_client_query(path)
}

/// The query encoding SPACE's node API reads (unreserved characters and `/` kept).
pub(crate) fn space_client_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `&user=…` for the call's account, if it names one.
pub(crate) fn user_param(ctx: &Envd) -> String {
    ctx.user
        .as_deref()
        .map(|u| format!("&user={}", space_client_query(u)))
        .unwrap_or_default()
}

fn required(path: &str) -> Result<(), RpcError> {
    if path.is_empty() {
        Err(RpcError::new(Code::InvalidArgument, "path is required"))
    } else {
        Ok(())
    }
}

fn parse_json(body: &Bytes) -> Result<Value, RpcError> {
    serde_json::from_slice(body)
        .map_err(|e| RpcError::new(Code::Internal, format!("the sandbox's answer: {e}")))
}

/// The EntryInfo of `path`.
pub(crate) async fn stat(front: &Front, ctx: &Envd, path: &str) -> Result<Value, RpcError> {
    required(path)?;
    let f = front
        .operate(
            ctx,
            Method::GET,
            &format!("files/stat?path={}", q(path)),
            None,
            Bytes::new(),
            OperationClass::Read,
        )
        .await?;
    let v = parse_json(&f.body)?;
    let shown = v["path"].as_str().unwrap_or(path).to_owned();
    Ok(entry_info(&v, &shown))
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
            &format!("files?path={}", q(path)),
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
    while let Some((dir, level)) = queue.pop_front() {
        let f = front
            .operate(
                ctx,
                Method::GET,
                &format!("files/list?path={}", q(&dir)),
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

/// envd's EntryInfo of a node-API stat or listing entry shown at `path`.
pub(crate) fn entry_info(v: &Value, path: &str) -> Value {
    let kind = v["kind"].as_str().unwrap_or("other");
    let mode = v["mode"].as_u64().unwrap_or(0) as u32;
    let name = v["name"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path).to_owned());
    let mut e = json!({
        "name": name,
        "type": file_type(kind),
        "path": path,
        "size": v["size"].as_u64().unwrap_or(0).to_string(),
        "mode": mode,
        "permissions": permissions(kind, mode),
        "owner": v["owner"].as_str().unwrap_or_default(),
        "group": v["group"].as_str().unwrap_or_default(),
    });
    if let Some(m) = v["modified"].as_str() {
        e["modifiedTime"] = Value::String(m.to_owned());
    }
    if let Some(t) = v["symlink_target"].as_str() {
        e["symlinkTarget"] = Value::String(t.to_owned());
    }
    if kind == "symlink" {
        e["isSymlink"] = Value::Bool(true);
    }
    e
}

fn file_type(kind: &str) -> &'static str {
    match kind {
        "file" => "FILE_TYPE_FILE",
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

/// `ls -l`'s form of a mode: the kind, then `rwx` three times (with setuid, setgid
/// and sticky shown as `s`/`S` and `t`/`T`).
fn permissions(kind: &str, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        "dir" => 'd',
        "symlink" => 'l',
        "file" => '-',
        _ => '?',
    });
    for (shift, special, mark) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (mode & special != 0, x) {
            (true, true) => mark,
            (true, false) => mark.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_ls_shows_them() {
        assert_eq!(permissions("file", 0o644), "-rw-r--r--");
        assert_eq!(permissions("dir", 0o755), "drwxr-xr-x");
        assert_eq!(permissions("file", 0o4755), "-rwsr-xr-x");
        assert_eq!(permissions("dir", 0o1777), "drwxrwxrwt");
        assert_eq!(permissions("file", 0o2600), "-rw---S---");
    }

    #[test]
    fn a_stat_becomes_envds_entry_info() {
        let v = json!({"name": "a.txt", "path": "/home/user/a.txt", "kind": "file", "size": 12,
            "mode": 420, "owner": "user", "group": "user", "modified": "2026-01-01T00:00:00Z"});
        let e = entry_info(&v, "/home/user/a.txt");
        assert_eq!(e["type"], "FILE_TYPE_FILE");
        assert_eq!(e["size"], "12");
        assert_eq!(e["permissions"], "-rw-r--r--");
        assert_eq!(e["modifiedTime"], "2026-01-01T00:00:00Z");
        let l = entry_info(
            &json!({"name": "l", "kind": "symlink", "symlink_target": "/etc"}),
            "/l",
        );
        assert_eq!(
            (l["type"].as_str(), l["symlinkTarget"].as_str()),
            (Some("FILE_TYPE_SYMLINK"), Some("/etc"))
        );
        assert_eq!(l["isSymlink"], true);
    }
}
