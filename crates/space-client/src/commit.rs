//! A sandbox's changes committed as a new template (`POST /v1/sandboxes/{id}/commit`,
//! admin only).

use hyper::Method;
use space_identity::SandboxId;
use space_proto::api::templates::TemplateView;

use crate::{Client, Error, decode};

impl Client {
    /// Commits the changes of sandbox `id` (created from an image template) as the
    /// template `name` (`name[:tag]`): its template's layers and one more. The
    /// sandbox is frozen while its layer is archived, then carries on.
    pub async fn commit_sandbox(&self, id: &SandboxId, name: &str) -> Result<TemplateView, Error> {
        let path = format!("/v1/sandboxes/{id}/commit");
        decode(
            &self
                .edge_json(Method::POST, &path, &serde_json::json!({ "name": name }))
                .await?,
        )
    }
}
