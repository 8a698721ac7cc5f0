//! Templates published by the control plane (`POST/GET/DELETE /v1/templates`): what
//! an import answers and what a listing shows. A template is immutable: a name and
//! tag bound to one digest, the sha256 of its manifest.

use serde::{Deserialize, Serialize};

/// One template, as the control plane keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateView {
    /// `[a-z0-9._-]`, starting with a letter or a digit, at most 128.
    pub name: String,
    /// The same alphabet (`latest` when the import named none).
    pub tag: String,
    /// `sha256:<hex>` of the template's manifest: the same image has the same digest
    /// under any name.
    pub digest: String,
    /// Its layers.
    pub layers: u32,
    /// Bytes of its layer blobs (compressed, as imported).
    pub size: u64,
    /// When it was imported here (RFC 3339).
    pub created: String,
    /// The image's process defaults.
    pub config: TemplateConfig,
}

/// The process defaults an image's config gives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateConfig {
    /// `NAME=value` pairs.
    #[serde(default)]
    pub env: Vec<String>,
    /// The working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// The command (or the entrypoint's arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

/// `GET /v1/templates`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateList {
    /// Every template, by name and tag (the host-directories `default` is not one).
    pub templates: Vec<TemplateView>,
}
