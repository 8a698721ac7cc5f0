//! Where the edge gets callers and capabilities from: the control plane in this
//! process, or one over HTTP. A caller carries the API key it presented, which only a
//! remote control plane reads (it authenticates and authorizes on it again).

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use space_identity::{Access, AccessSet, Purpose, SandboxId};
use space_proto::api::{CapabilityResponse, ErrorBody};

use super::Edge;
use crate::auth::Caller;
use crate::error::{ControlError, ErrorCode, Relayed};
use crate::http::HttpClient;
use crate::service::ControlPlane;

/// Where the edge gets callers and capabilities from.
#[derive(Debug, Clone)]
pub enum Authority {
    /// In the control-plane process (`space up`, `space control`).
    Local(Arc<ControlPlane>),
    /// A control plane over HTTP (`space edge`).
    Remote {
        /// Its base URL.
        url: String,
        /// Client.
        http: HttpClient,
    },
}

/// A caller the edge authenticated, with the API key it presented.
#[derive(Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// Who it is.
    pub caller: Caller,
    /// The key, for a remote control plane (never logged).
    key: String,
}

impl std::fmt::Debug for Authenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticated")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl Authenticated {
    /// `caller`, verified with `key`.
    pub fn new(caller: Caller, key: String) -> Self {
        Self { caller, key }
    }

    /// Whether `key` is the key this caller was verified with.
    pub fn presented(&self, key: &str) -> bool {
        self.key == key
    }

    /// The `authorization` header that presents the key again.
    fn bearer(&self) -> String {
        format!("Bearer {}", self.key)
    }
}

/// Access the edge asks for: every control operation it forwards.
fn edge_access() -> AccessSet {
    AccessSet::of(&[
        Access::Exec,
        Access::FsRead,
        Access::FsWrite,
        Access::Terminal,
        Access::Watch,
        Access::Lifecycle,
    ])
}

impl Edge {
    /// Resolves an API key.
    pub async fn authenticate(&self, key: &str) -> Result<Authenticated, ControlError> {
        let caller = match &self.authority {
            Authority::Local(cp) => cp.authenticate(key).await?,
            Authority::Remote { url, http } => {
                let auth = format!("Bearer {key}");
                let a = http
                    .call(
                        Method::GET,
                        &format!("{url}/v1/whoami"),
                        &[("authorization", &auth)],
                        Bytes::new(),
                    )
                    .await
                    .map_err(|e| ControlError::Unavailable(format!("control plane: {e}")))?;
                if a.status == StatusCode::UNAUTHORIZED {
                    return Err(ControlError::Unauthorized);
                }
                let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|_| {
                    ControlError::BadGateway("control plane: bad whoami answer".into())
                })?;
                Caller {
                    tenant: v["tenant"].as_str().unwrap_or_default().to_owned(),
                    key_id: v["key_id"].as_str().unwrap_or_default().to_owned(),
                    admin: v["admin"].as_bool().unwrap_or(false),
                }
            }
        };
        Ok(Authenticated::new(caller, key.to_owned()))
    }

    /// A fresh capability for `sandbox` under `who`'s authorization.
    pub(super) async fn authorize(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> Result<CapabilityResponse, ControlError> {
        match &self.authority {
            Authority::Local(cp) => {
                // During a transition: the next execution, once acknowledged (bounded).
                let s = cp
                    .settled(&who.caller, sandbox, cp.transition_wait())
                    .await?;
                let cap = cp
                    .issue_capability(&s, edge_access(), Purpose::Control, None)
                    .await?;
                if rebuilt {
                    cp.note_rebuilt(&cap);
                }
                Ok(cap)
            }
            Authority::Remote { url, http } => {
                let auth = who.bearer();
                let body = serde_json::json!({
                    "access": edge_access().iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                    "purpose": "control",
                    "rebuilt": rebuilt,
                });
                let a = http
                    .post_json(
                        &format!("{url}/v1/sandboxes/{sandbox}/capabilities"),
                        &[("authorization", &auth)],
                        &body,
                    )
                    .await
                    .map_err(|e| ControlError::Unavailable(format!("control plane: {e}")))?;
                if !a.status.is_success() {
                    let e: ErrorBody = serde_json::from_slice(&a.body).unwrap_or(ErrorBody {
                        error: "bad_gateway".into(),
                        message: String::from_utf8_lossy(&a.body).into_owned(),
                        reason: None,
                    });
                    return Err(ControlError::Relayed(Relayed {
                        status: a.status.as_u16(),
                        code: ErrorCode::relayed(&e.error),
                        message: e.message,
                        reason: e.reason,
                    }));
                }
                serde_json::from_slice(&a.body).map_err(|_| {
                    ControlError::BadGateway("control plane: bad capability answer".into())
                })
            }
        }
    }
}
