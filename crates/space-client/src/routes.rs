//! Direct mode's side of the route driver ([`space_route`]): routes resolved by the
//! edge (a capability asked with this client's API key), and what recovery cost.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use space_identity::{OperationClass, SandboxId, Timestamp};
use space_proto::api::CapabilityResponse;
use space_route::{Event, Resolved, Resolver};

use super::{Attempt, Client, Error, Grant, Recoveries, decode, grant_of};

/// Access a direct-mode capability asks for: what this client sends to workers.
const ACCESS: &str =
    r#"{"access":["exec","fs_read","fs_write","watch","terminal"],"purpose":"control"}"#;

/// [`ACCESS`] for a rebuilt attempt (see `CapabilityRequest::rebuilt`).
const ACCESS_REBUILT: &str = r#"{"access":["exec","fs_read","fs_write","watch","terminal"],"purpose":"control","rebuilt":true}"#;

/// Ask for a new capability this long before the cached one expires.
const RENEW_MARGIN_SECS: u64 = 10;

/// How long a worker that refuses connections is waited for (nothing was sent to it).
const UNREACHABLE_WAIT: Duration = Duration::from_secs(10);

/// This client's routes, from the edge.
struct FromTheEdge<'a>(&'a Client);

impl Resolver for FromTheEdge<'_> {
    type Grant = Grant;
    type Error = Error;

    async fn resolve(&self, sandbox: &SandboxId, rebuilt: bool) -> Result<Resolved<Grant>, Error> {
        let cap = self.0.authorize(sandbox, rebuilt).await?;
        let until = Timestamp::from_unix_secs(cap.expires_at.saturating_sub(RENEW_MARGIN_SECS));
        let (route, grant) = grant_of(cap);
        Ok(Resolved {
            route,
            grant,
            until,
        })
    }

    fn patience(&self) -> Duration {
        UNREACHABLE_WAIT
    }

    fn observe(&self, event: Event<'_>) {
        if let Event::RebuiltAttemptEnded { added } = event {
            self.0.rebuilt(added);
        }
    }
}

impl Client {
    /// Runs `attempt` on the route of `sandbox` with the route driver's recovery
    /// rules ([`space_route::RouteDriver::drive`]).
    pub(crate) async fn on_route<T, F, Fut>(
        &self,
        sandbox: &SandboxId,
        class: OperationClass,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Arc<Grant>) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        self.inner
            .routes
            .drive(&FromTheEdge(self), sandbox, class, |_, grant| {
                attempt(grant)
            })
            .await
    }

    /// Records one rebuilt attempt's added latency.
    fn rebuilt(&self, added: Duration) {
        if let Ok(mut r) = self.inner.recoveries.lock() {
            r.rebuilt += 1;
            if r.added.len() < Recoveries::KEPT {
                r.added.push(added);
            }
        }
    }

    /// The rebuilt attempts this client made so far and what they added.
    pub fn recoveries(&self) -> Recoveries {
        self.inner
            .recoveries
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// A capability for the current execution of `sandbox`, from the edge.
    /// `rebuilt`: for the rebuilt attempt after a RefreshRoute.
    async fn authorize(
        &self,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> Result<CapabilityResponse, Error> {
        let h = [("content-type", "application/json")];
        let body = if rebuilt { ACCESS_REBUILT } else { ACCESS };
        let a = self
            .edge(
                Method::POST,
                &format!("/v1/sandboxes/{sandbox}/capabilities"),
                Some(&h),
                Bytes::from_static(body.as_bytes()),
            )
            .await?;
        decode(&a)
    }
}
