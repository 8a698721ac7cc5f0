//! Calls about the platform rather than one sandbox's operations: snapshots, workers,
//! signing keys (all through the edge).

use bytes::Bytes;
use hyper::Method;
use space_identity::SandboxId;

use super::{Client, Error, WorkerView, decode};

impl Client {
    /// Takes a snapshot of a sandbox (its files, archived by the control plane); the
    /// answer as the API gives it (`generation`, `size`, `digest` …).
    pub async fn snapshot(&self, id: &SandboxId) -> Result<serde_json::Value, Error> {
        let path = format!("/v1/sandboxes/{id}/snapshot");
        decode(&self.edge(Method::POST, &path, None, Bytes::new()).await?)
    }

    /// The workers of the installation (admin only).
    pub async fn workers(&self) -> Result<Vec<WorkerView>, Error> {
        decode(
            &self
                .edge(Method::GET, "/v1/workers", None, Bytes::new())
                .await?,
        )
    }

    /// Rotates the signing key (admin only); the answer as the API gives it
    /// (`active_key`).
    pub async fn rotate_signing_key(&self) -> Result<serde_json::Value, Error> {
        let path = "/v1/signing-keys/rotate";
        decode(&self.edge(Method::POST, path, None, Bytes::new()).await?)
    }

    /// A new API key of the caller's tenant: `space_…`, or with `e2b` in E2B's format
    /// (`e2b_…`, for E2B's SDKs against the E2B front). The answer as the API gives it
    /// (`key_id`, `api_key`).
    pub async fn create_key(&self, e2b: bool) -> Result<serde_json::Value, Error> {
        let body = serde_json::json!({"format": if e2b { "e2b" } else { "space" }});
        decode(&self.edge_json(Method::POST, "/v1/keys", &body).await?)
    }
}
