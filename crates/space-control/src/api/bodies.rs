//! The JSON bodies only the control plane's own routes read and write (the rest are
//! `space_proto::api`'s). Each answer's fields are declared in alphabetical order:
//! they replaced `serde_json::json!` objects, which serialize their keys sorted, and
//! the bytes on the wire stay the ones clients have always read.

use serde::{Deserialize, Serialize};
use space_identity::{Generation, SandboxId, WorkerId};
use space_proto::openapi::{SandboxIdSchema, WorkerIdSchema};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/resume` (an empty body: resume in place).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// Restore the sandbox's stored snapshot on this worker, as a new execution.
    #[schema(value_type = Option<WorkerIdSchema>)]
    pub worker: Option<WorkerId>,
}

/// `POST /v1/sandboxes/{id}/migrate`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// The worker the sandbox moves to.
    #[schema(value_type = WorkerIdSchema)]
    pub worker: WorkerId,
}

/// `POST /v1/sandboxes/{id}/snapshot`'s answer: the writable layer kept on the
/// control plane.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotTaken {
    /// BLAKE3 of the archive, lowercase hex.
    pub digest: String,
    /// The generation of the execution it was taken from.
    #[schema(value_type = u64)]
    pub generation: Generation,
    /// Its length in bytes.
    pub size: u64,
}

/// `GET /v1/whoami`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct WhoAmI {
    /// Whether the key is an admin key.
    pub admin: bool,
    /// The key's ID (`ak…`).
    pub key_id: String,
    /// The key's tenant (`ten_…`).
    pub tenant: String,
}

/// `POST /v1/tenants` (admin only).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// 1 to 64 characters; names need not be unique.
    pub name: String,
}

/// `POST /v1/sandboxes/{id}/ttl`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TtlRequest {
    /// Seconds from now, 1 to 2 592 000 (30 days); `null` or absent: no expiry.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// `POST /v1/keys`'s optional body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    /// `space` (the default: `space_…`) or `e2b` (`e2b_` and 60 hex digits, the form
    /// E2B's SDKs take).
    #[serde(default)]
    pub format: Option<String>,
}

/// `POST /v1/tenants`'s answer: the tenant and its first (non-admin) key.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    /// The key's text, shown only here.
    pub api_key: String,
    /// The key's ID.
    pub key_id: String,
    /// The tenant's name.
    pub name: String,
    /// The tenant's ID (`ten_…`).
    pub tenant: String,
}

/// `POST /v1/keys`'s answer: a new non-admin key of the caller's tenant.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyCreated {
    /// The key's text, shown only here.
    pub api_key: String,
    /// The key's ID.
    pub key_id: String,
}

/// `POST /v1/signing-keys/rotate`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyRotated {
    /// The ID of the signing key now in use.
    pub active_key: String,
}

/// `POST /internal/v1/workers/{id}/lost`: an execution the worker no longer runs.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionLost {
    /// The sandbox.
    #[schema(value_type = SandboxIdSchema)]
    pub sandbox: SandboxId,
    /// The generation of the execution lost.
    #[schema(value_type = u64)]
    pub generation: Generation,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed answers write exactly what the `json!` objects they replaced wrote.
    #[test]
    fn the_typed_answers_serialize_as_the_json_objects_they_replaced() {
        let same = |typed: String, untyped: serde_json::Value| {
            assert_eq!(typed, serde_json::to_string(&untyped).unwrap());
        };
        same(
            serde_json::to_string(&WhoAmI {
                admin: false,
                key_id: "ak1".into(),
                tenant: "ten_1".into(),
            })
            .unwrap(),
            serde_json::json!({"tenant": "ten_1", "key_id": "ak1", "admin": false}),
        );
        same(
            serde_json::to_string(&TenantCreated {
                api_key: "space_x".into(),
                key_id: "ak1".into(),
                name: "acme".into(),
                tenant: "ten_1".into(),
            })
            .unwrap(),
            serde_json::json!({"tenant": "ten_1", "name": "acme", "key_id": "ak1", "api_key": "space_x"}),
        );
        same(
            serde_json::to_string(&KeyCreated {
                api_key: "space_x".into(),
                key_id: "ak1".into(),
            })
            .unwrap(),
            serde_json::json!({"key_id": "ak1", "api_key": "space_x"}),
        );
        same(
            serde_json::to_string(&KeyRotated {
                active_key: "k2".into(),
            })
            .unwrap(),
            serde_json::json!({"active_key": "k2"}),
        );
        same(
            serde_json::to_string(&SnapshotTaken {
                digest: "ab".into(),
                generation: Generation(3),
                size: 10,
            })
            .unwrap(),
            serde_json::json!({"generation": 3, "digest": "ab", "size": 10}),
        );
    }
}
