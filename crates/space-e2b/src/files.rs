//! envd's `/files`: `GET` streams a file of the sandbox (the node API's ranged read
//! through the edge), `POST` writes one or more: a `multipart/form-data` body (what
//! the SDKs send; each part named `file`, its filename the destination when there is
//! no `path`), held whole up to [`MAX_MULTIPART`], or an `application/octet-stream`
//! body streamed to the sandbox. Each file is written like `PUT …/files`: whole and
//! durable, or not at all. Errors are envd's `{"code": <status>, "message"}`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::connect::{Code, RpcError};
use crate::front::{Envd, Front};

/// Largest multipart body (held whole to be split into its files); larger files go
/// as `application/octet-stream`, streamed.
pub const MAX_MULTIPART: usize = 64 << 20;

/// Files one multipart body carries at most.
const MAX_PARTS: usize = 1000;

/// Longest header block of one part.
const MAX_PART_HEADERS: usize = 16 << 10;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
}

/// An envd HTTP error.
fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = json!({"code": status.as_u16(), "message": message.into()});
    (status, axum::Json(body)).into_response()
}

fn from_rpc(e: &RpcError) -> Response {
    http_error(e.code.status(), e.message.clone())
}

/// The call's context, with the account of `username` when the query names one.
async fn context(front: &Front, headers: &HeaderMap, q: &FilesQuery) -> Result<Envd, Response> {
    if q.signature.is_some() && !headers.contains_key(crate::front::TOKEN_HEADER) {
        return Err(http_error(
            StatusCode::UNAUTHORIZED,
            "signed file URLs are not served: send the access token (X-Access-Token), as files.read and files.write do",
        ));
    }
    let mut ctx = front.envd(headers).await.map_err(|e| from_rpc(&e))?;
    if let Some(u) = q.username.as_deref().filter(|u| !u.is_empty()) {
        ctx.user = Some(u.to_owned());
    }
    Ok(ctx)
}

/// `GET /files?path=`.
pub(crate) async fn download(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    let ctx = match context(&front, &headers, &q).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(path) = q.path.as_deref().filter(|p| !p.is_empty()) else {
        return http_error(StatusCode::BAD_REQUEST, "path is required");
    };
    let pq = format!(
        "/v1/sandboxes/{}/files?path={}{}",
        ctx.sandbox,
        space_client::encode_query(path),
        crate::entries::user_param(&ctx)
    );
    let mut passed = HeaderMap::new();
    if let Some(r) = headers.get(header::RANGE) {
        passed.insert(header::RANGE, r.clone());
    }
    match front
        .edge
        .read_file_of(&ctx.who, &ctx.sandbox, &ctx.execution, &pq, &passed)
        .await
    {
        Ok(resp) if resp.status().is_success() => resp,
        Ok(resp) => relay_error(resp).await,
        Err(e) => from_rpc(&front.envd_error(&ctx, &e)),
    }
}

/// A worker's error answer (`{"error", "message"}`) in envd's form.
async fn relay_error(resp: Response) -> Response {
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    let e = crate::front::worker_error(status, &body);
    let status = match e.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        // 507 (no space) and the rest keep the worker's status.
        _ => status,
    };
    http_error(status, e.message)
}

/// `POST /files`.
pub(crate) async fn upload(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
    body: Body,
) -> Response {
    // The token first: no byte of the body is kept for a call that may not write.
    let ctx = match context(&front, &headers, &q).await {
        Ok(c) => c,
        Err(r) => {
            crate::front::drain_refused(body).await;
            return r;
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
    {
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "compressed uploads are not accepted (this envd is version 0.5.2: write without gzip)",
        );
    }
    let written = if content_type.starts_with("multipart/form-data") {
        let Some(boundary) = boundary(&content_type) else {
            return http_error(StatusCode::BAD_REQUEST, "multipart body without a boundary");
        };
        let whole = match axum::body::to_bytes(body, MAX_MULTIPART).await {
            Ok(b) => b,
            Err(_) => {
                return http_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "a multipart upload is at most {} MiB here: write larger files one at a time",
                        MAX_MULTIPART >> 20
                    ),
                );
            }
        };
        let parts = match parts(&whole, &boundary) {
            Ok(p) => p,
            Err(m) => return http_error(StatusCode::BAD_REQUEST, m),
        };
        let files: Vec<_> = parts.into_iter().filter(|p| p.name == "file").collect();
        if files.is_empty() {
            return http_error(StatusCode::BAD_REQUEST, "no part named \"file\"");
        }
        let single = files.len() == 1;
        let mut written = Vec::with_capacity(files.len());
        for p in files {
            let dest = match (single, q.path.as_deref(), p.filename.as_deref()) {
                (true, Some(path), _) if !path.is_empty() => path.to_owned(),
                (_, _, Some(f)) if !f.is_empty() => f.to_owned(),
                _ => {
                    return http_error(
                        StatusCode::BAD_REQUEST,
                        "each file needs a destination: path, or the part's filename",
                    );
                }
            };
            let data = whole.slice(p.data);
            if let Err(r) = write(&front, &ctx, &dest, &headers, Body::from(data)).await {
                return r;
            }
            written.push(dest);
        }
        written
    } else {
        let Some(path) = q.path.clone().filter(|p| !p.is_empty()) else {
            return http_error(StatusCode::BAD_REQUEST, "path is required");
        };
        if let Err(r) = write(&front, &ctx, &path, &headers, body).await {
            return r;
        }
        vec![path]
    };
    let answer: Vec<_> = written
        .iter()
        .map(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            json!({"name": name, "type": "file", "path": p})
        })
        .collect();
    axum::Json(answer).into_response()
}

/// Writes one file as `PUT …/files` does (parents made).
async fn write(
    front: &Front,
    ctx: &Envd,
    path: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<(), Response> {
    let user = ctx
        .user
        .as_deref()
        .map(|u| format!("&user={}", space_client::encode_query(u)))
        .unwrap_or_default();
    let pq = format!(
        "/v1/sandboxes/{}/files?path={}{user}",
        ctx.sandbox,
        space_client::encode_query(path)
    );
    let mut passed = HeaderMap::new();
    passed.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(n) = headers.get(header::CONTENT_LENGTH) {
        // Only an octet-stream body's own length is the file's.
        if !headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("multipart/"))
        {
            passed.insert(header::CONTENT_LENGTH, n.clone());
        }
    }
    match front
        .edge
        .write_file_of(&ctx.who, &ctx.sandbox, &ctx.execution, &pq, &passed, body)
        .await
    {
        Ok(resp) if resp.status().is_success() => Ok(()),
        Ok(resp) => Err(relay_error(resp).await),
        Err(e) => Err(from_rpc(&front.envd_error(ctx, &e))),
    }
}

/// The `boundary` parameter of a multipart content type.
fn boundary(content_type: &str) -> Option<String> {
    content_type
        .split(';')
        .skip(1)
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim().eq_ignore_ascii_case("boundary"))
                .then(|| v.trim().trim_matches('"').to_owned())
        })
        .filter(|b| !b.is_empty() && b.len() <= 200)
}

/// One part of a multipart body.
#[derive(Debug, PartialEq, Eq)]
struct Part {
    name: String,
    filename: Option<String>,
    data: std::ops::Range<usize>,
}

/// The parts of a whole multipart body (RFC 7578), as ranges of it.
fn parts(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut at = find(body, delimiter.as_bytes(), 0)
        .ok_or("the multipart body has no boundary line")?
        + delimiter.len();
    let mut out = Vec::new();
    loop {
        if body[at..].starts_with(b"--") {
            return Ok(out);
        }
        // Transport padding, then the line break after the boundary.
        while at < body.len() && (body[at] == b' ' || body[at] == b'\t') {
            at += 1;
        }
        if !body[at..].starts_with(b"\r\n") {
            return Err("malformed multipart boundary line".into());
        }
        at += 2;
        // Looked for within the bound only.
        let window = &body[..body.len().min(at + MAX_PART_HEADERS + 4)];
        let head_end = find(window, b"\r\n\r\n", at)
            .ok_or("a multipart part's headers are missing or too long")?;
        let head = std::str::from_utf8(&body[at..head_end])
            .map_err(|_| "a multipart part's headers are not UTF-8")?;
        let (name, filename) = disposition(head)?;
        let data_start = head_end + 4;
        let data_end = find(body, next_delimiter.as_bytes(), data_start)
            .ok_or("the multipart body ends inside a part")?;
        if out.len() == MAX_PARTS {
            return Err(format!("at most {MAX_PARTS} files in one upload"));
        }
        out.push(Part {
            name,
            filename,
            data: data_start..data_end,
        });
        at = data_end + next_delimiter.len();
    }
}

/// `name` and `filename` of a part's `Content-Disposition: form-data`.
fn disposition(head: &str) -> Result<(String, Option<String>), String> {
    let line = head
        .split("\r\n")
        .find(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
        })
        .ok_or("a multipart part without Content-Disposition")?;
    let value = line.split_once(':').map(|(_, v)| v).unwrap_or_default();
    let mut name = None;
    let mut filename = None;
    for p in split_params(value).into_iter().skip(1) {
        let Some((k, v)) = p.split_once('=') else {
            continue;
        };
        let v = unquote(v.trim());
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    Ok((name.ok_or("a multipart part without a name")?, filename))
}

/// `;`-separated parameters, a `;` inside quotes kept.
fn split_params(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in v.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out
}

fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut escaped = false;
            for c in inner.chars() {
                if escaped || c != '\\' {
                    out.push(c);
                    escaped = false;
                } else {
                    escaped = true;
                }
            }
            out
        }
        None => v.to_owned(),
    }
}

/// Where `needle` first occurs in `hay` at or after `from` (linear time whatever the
/// input: a hostile body of near-boundaries costs no more than any other).
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() || needle.is_empty() {
        return None;
    }
    memchr::memmem::find(&hay[from..], needle).map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (name, filename, data) in parts {
            b.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"");
            b.extend_from_slice(name.as_bytes());
            b.push(b'"');
            if let Some(f) = filename {
                b.extend_from_slice(format!("; filename=\"{f}\"").as_bytes());
            }
            b.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
            b.extend_from_slice(data);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"--XyZ--\r\n");
        b
    }

    #[test]
    fn a_multipart_body_splits_into_its_files_with_any_bytes_inside() {
        let data: &[u8] = b"line\r\n--Xy not the boundary\r\n\0\xff";
        let b = body(&[
            ("file", Some("/home/user/a b;c.txt"), data),
            ("file", Some("rel/b"), b""),
        ]);
        let p = parts(&b, "XyZ").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].filename.as_deref(), Some("/home/user/a b;c.txt"));
        assert_eq!(&b[p[0].data.clone()], data);
        assert_eq!(p[1].filename.as_deref(), Some("rel/b"));
        assert!(p[1].data.is_empty());
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some("XyZ")
        );
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn malformed_multipart_bodies_are_refused_not_guessed() {
        let good = body(&[("file", Some("a"), b"x")]);
        // Cut inside the part, or with no closing boundary.
        assert!(parts(&good[..good.len() - 12], "XyZ").is_err());
        assert!(parts(b"no boundary here", "XyZ").is_err());
        assert!(parts(b"--XyZ\r\nContent-Type: x\r\n\r\ndata\r\n--XyZ--", "XyZ").is_err());
        let huge_head = format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\nX: {}\r\n\r\nd\r\n--XyZ--",
            "a".repeat(MAX_PART_HEADERS)
        );
        assert!(parts(huge_head.as_bytes(), "XyZ").is_err());
    }
}
