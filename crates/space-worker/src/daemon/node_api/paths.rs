//! Operations on one path of the sandbox that the agent answers at once: describe it
//! (`stat`, a final symlink not followed), make a directory, rename. Each is one
//! agent call on a pooled connection ([`file_op`]); `mkdir` and `rename` take
//! `Idempotency-Key` and `?user=` like uploads.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use space_identity::Access;
use space_proto::api::{FileInfo, MkdirResponse, RenameRequest};
use space_proto::client::Call;
use space_proto::guest::{Account, FileStat};

use super::files::{PathQuery, checked_path, file_op, required_path};
use super::idempotency::IdempotencyCache;
use super::refusal::Refusal;
use crate::daemon::state::Worker;

/// Largest body of a rename: two paths of at most 4096 bytes, as JSON.
pub(super) const MAX_RENAME_BODY: usize = 64 << 10;

/// The query of `mkdir`: the directory, and as whom it is made.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct MkdirQuery {
    /// The directory: 1 to 4096 bytes, no NUL (400 `bad_request` otherwise). Its
    /// missing parents are made too (mode 0755, owned like it).
    #[param(required = true)]
    path: Option<String>,
    /// Make it as this account of the sandbox (a user name or a uid): its
    /// permissions apply and what is made is its own (an unknown name: 400
    /// `unknown_user`).
    user: Option<String>,
}

/// The query of `rename`: as whom.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RenameQuery {
    /// Rename as this account of the sandbox (a user name or a uid): its permissions
    /// apply (an unknown name: 400 `unknown_user`).
    user: Option<String>,
}

fn account(user: Option<&str>) -> Option<Account> {
    user.map(|u| space_proto::api::User::parse(u).into())
}

/// `GET /v1/sandboxes/{id}/files/stat?path=[&user=]`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "sandbox", params(space_proto::openapi::SandboxPath, PathQuery), responses((status = 200, description = "the path's description (a final symlink described, not followed)", body = FileInfo, headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn stat(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let stat = || Ok(Call::stat(&required_path(&q)?).as_user(q.account()));
    let respond = |s: FileStat| Json(FileInfo::from(s)).into_response();
    file_op(
        &w,
        &idempotency,
        &headers,
        &id,
        Access::FsRead,
        "stat",
        stat,
        respond,
    )
    .await
}

/// `POST /v1/sandboxes/{id}/files/mkdir?path=[&user=]`: 201 when this request made
/// the directory, 200 when one was already there.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "sandbox", summary = "Make a directory and its missing parents (0755); accepts `Idempotency-Key`.", params(space_proto::openapi::SandboxPath, MkdirQuery), responses((status = 201, description = "made (`{\"created\":true}`)", body = MkdirResponse, headers(("space-execution" = String, description = "the execution that answered"))), (status = 200, description = "a directory was already there (`{\"created\":false}`); a non-directory there is 409 `already_exists`", body = MkdirResponse), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn mkdir(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<MkdirQuery>,
    headers: HeaderMap,
) -> Response {
    let mkdir = || {
        let path = checked_path(q.path.as_deref())?;
        Ok(Call::mkdir(&path, true, account(q.user.as_deref())))
    };
    let respond = |created: bool| {
        let status = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        (status, Json(MkdirResponse { created })).into_response()
    };
    file_op(
        &w,
        &idempotency,
        &headers,
        &id,
        Access::FsWrite,
        "mkdir",
        mkdir,
        respond,
    )
    .await
}

/// `POST /v1/sandboxes/{id}/files/rename[?user=]` with `{"from","to"}`: 204.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "sandbox", summary = "Rename a path (a file at `to` is replaced); accepts `Idempotency-Key`.", params(space_proto::openapi::SandboxPath, RenameQuery), request_body = RenameRequest, responses((status = 204, description = "renamed (404 `not_found` when `from` is missing)", headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn rename(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<RenameQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let rename = || {
        let body = body.map_err(|e| Refusal::BadRequest(format!("rename body: {e}")))?;
        let req: RenameRequest = serde_json::from_slice(&body)
            .map_err(|e| Refusal::BadRequest(format!("invalid rename body: {e}")))?;
        let path = |p: &str, name: &str| {
            checked_path(Some(p)).map_err(|_| {
                Refusal::BadRequest(format!("`{name}` must be 1 to 4096 bytes, no NUL"))
            })
        };
        let (from, to) = (path(&req.from, "from")?, path(&req.to, "to")?);
        Ok(Call::rename(&from, &to, account(q.user.as_deref())))
    };
    let respond = |()| StatusCode::NO_CONTENT.into_response();
    file_op(
        &w,
        &idempotency,
        &headers,
        &id,
        Access::FsWrite,
        "rename",
        rename,
        respond,
    )
    .await
}
