//! What the filesystem calls and the watches share: the path request, the node API's
//! query encoding, `Stat` and envd's `EntryInfo` of a node-API entry.

use axum::body::Bytes;
use axum::http::Method;
use serde::Deserialize;
use serde_json::{Value, json};
use space_identity::OperationClass;

use crate::connect::{Code, RpcError};
use crate::front::{Envd, Front};

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

/// `path` as a query value.
pub(crate) fn q(path: &str) -> String {
    space_client::encode_query(path)
}

/// `&user=…` for the call's account, if it names one.
pub(crate) fn user_param(ctx: &Envd) -> String {
    ctx.user
        .as_deref()
        .map(|u| format!("&user={}", space_client::encode_query(u)))
        .unwrap_or_default()
}

pub(crate) fn required(path: &str) -> Result<(), RpcError> {
    if path.is_empty() {
        Err(RpcError::new(Code::InvalidArgument, "path is required"))
    } else {
        Ok(())
    }
}

pub(crate) fn parse_json(body: &Bytes) -> Result<Value, RpcError> {
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
            &format!("files/stat?path={}{}", q(path), user_param(ctx)),
            None,
            Bytes::new(),
            OperationClass::Read,
        )
        .await?;
    let v = parse_json(&f.body)?;
    let shown = v["path"].as_str().unwrap_or(path).to_owned();
    Ok(entry_info(&v, &shown))
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
