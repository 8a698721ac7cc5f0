//! JSON bodies of the HTTP hops: the public edge API (`API.md`), the worker's node-api
//! (same sandbox-scoped shapes), and the control plane ↔ worker channel.
//!
//! Request bodies refuse unknown fields, so a typo is an error rather than a silently
//! ignored option.

use std::collections::BTreeMap;

mod accounts;
mod files;
mod limits;
pub mod ports;
pub mod templates;
mod time;

pub use accounts::User;
pub use files::{FileEntry, FileInfo, MkdirResponse, RenameRequest};
pub use limits::{Limits, LimitsRequest, LimitsView};
pub use time::{rfc3339, rfc3339_nanos};

use serde::{Deserialize, Serialize};
pub use space_egress::{NetworkMode, Policy};
use space_identity::{
    Access, Execution, ExecutionId, Generation, Placement, PodUid, Protocol, Purpose,
    RefreshReason, Route, SandboxId, Substrate, WorkerId,
};

/// Error body of every hop: `{"error": code, "message": text}`, plus the comparator's
/// reason code for `refresh_route` and `deny`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Stable machine-readable code (`not_found`, `refresh_route`, `deny` …).
    pub error: String,
    /// Human-readable text.
    #[serde(default)]
    pub message: String,
    /// The comparator's reason code, for `refresh_route` and `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The reason a 421 answer gives for its RefreshRoute (`not_running` when its body is
/// not an error body or names no reason it knows).
pub fn refresh_reason(body: Option<&ErrorBody>) -> RefreshReason {
    body.and_then(|e| e.reason.as_deref())
        .and_then(|r| r.parse().ok())
        .unwrap_or(RefreshReason::NotRunning)
}

/// Lifecycle state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Its first execution is being launched.
    Starting,
    /// Serving.
    Running,
    /// Frozen in place.
    Paused,
    /// Moving to a new execution.
    Migrating,
    /// Gone.
    Stopped,
}

impl SandboxState {
    /// Stable text form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Migrating => "migrating",
            Self::Stopped => "stopped",
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name (`default`).
    #[serde(default)]
    pub template: Option<String>,
    /// Lifetime in seconds (wall-clock, paused time included).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// What happens at the TTL: `stop` (the default) or `pause`.
    #[serde(default)]
    pub ttl_action: Option<String>,
    /// Environment for every process.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Caller's metadata, returned as is.
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    /// Place on this worker.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::openapi::WorkerIdSchema>))]
    pub worker: Option<WorkerId>,
    /// Resource limits; what is left out takes the platform's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsRequest>,
    /// Network policy (`{"mode": "none"|"egress", "allow": […], "deny": […]}`); left
    /// out, the platform's default (`none` unless the operator chose otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::openapi::NetworkSchema>))]
    pub network: Option<Policy>,
    /// What runs it: `jail` (Linux namespaces on the worker's kernel) or `vm` (a
    /// virtual machine with its own kernel). Left out, the platform's default
    /// (`jail` unless every worker runs VMs). Every later execution of the sandbox
    /// (resume, migration, relaunch) runs on a worker of the same substrate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::openapi::SubstrateSchema>))]
    pub substrate: Option<Substrate>,
}

/// The execution serving a sandbox, as shown to users.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutionView {
    /// Generation.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub generation: Generation,
    /// Execution ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
    pub execution_id: ExecutionId,
    /// Worker.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::WorkerIdSchema))]
    pub worker: WorkerId,
    /// Substrate.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SubstrateSchema))]
    pub substrate: Substrate,
    /// Activation attempt.
    pub activation: u32,
}

/// A sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sandbox {
    /// ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
    pub id: SandboxId,
    /// State.
    pub state: SandboxState,
    /// Template.
    pub template: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// RFC 3339, UTC, when a TTL was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The current execution, when one runs.
    pub execution: Option<ExecutionView>,
    /// Caller's metadata.
    pub metadata: serde_json::Value,
    /// While `migrating`: the step under way ("archiving", "transferring 12.0 MiB to
    /// w2", …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Its resource limits, the same for every execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsView>,
    /// Its network policy, the same for every execution (mode `none`: loopback only).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::NetworkSchema))]
    pub network: Policy,
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv.
    pub cmd: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Text written to stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Bytes written to stdin (standard base64, padded), which is then closed; for
    /// stdin that is not text. At most one of `stdin` and `stdin_base64`; either holds
    /// at most [`MAX_EXEC_STDIN`] bytes (more: 413, or the streaming exec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Kill after this many seconds.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Cap on each of stdout and stderr, in bytes of the answer's JSON
    /// ([`DEFAULT_MAX_OUTPUT_BYTES`] when absent, at most [`MAX_OUTPUT_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Run as this account of the sandbox (a name of its `/etc/passwd`, or a uid);
    /// the sandbox's root when absent. An unknown name: 400 `unknown_user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<User>,
    /// Run under a new pseudo-terminal of this size (streaming exec only: a plain
    /// exec with it is 400 `bad_request`). Its output, stdout and stderr merged, comes
    /// tagged as stdout; a client text message `{"rows","cols"}` resizes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TerminalSize>,
}

/// The size of a terminal in character cells; each side is clamped to
/// [`TerminalSize::MIN`]..=[`TerminalSize::MAX`] where it is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl TerminalSize {
    /// The smallest side.
    pub const MIN: u16 = 1;
    /// The largest side.
    pub const MAX: u16 = 1000;

    /// This size with each side clamped to [`Self::MIN`]..=[`Self::MAX`], as the agent
    /// takes it.
    pub fn clamped(self) -> crate::guest::PtySize {
        crate::guest::PtySize {
            rows: self.rows.clamp(Self::MIN, Self::MAX),
            cols: self.cols.clamp(Self::MIN, Self::MAX),
        }
    }
}

/// Largest stdin of a non-streaming exec, in bytes (decoded): 64 MiB. The streaming
/// exec takes stdin of any size, as it is produced.
pub const MAX_EXEC_STDIN: usize = 64 << 20;

/// Largest body of a non-streaming exec request: room for [`MAX_EXEC_STDIN`] bytes of
/// stdin in base64 (4/3 of it) and the rest of the request.
pub const MAX_EXEC_BODY: usize = 96 << 20;

/// Default cap on each output stream of a non-streaming exec: bytes of the stream's
/// JSON string in the answer (for text, its size; a control character counts as its
/// escape, `\u0000` six bytes). Output past it is read and dropped; the answer says
/// `"truncated": true`. Streaming exec has no cap.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 16 << 20;

/// Largest `max_output_bytes` an exec may ask for: its answer is then at most about
/// 64 MiB of JSON, which the worker and the edge each hold about twice at worst.
pub const MAX_OUTPUT_BYTES: u64 = 32 << 20;

/// Exec timeout when the request names none.
pub const DEFAULT_EXEC_TIMEOUT_SECS: u64 = 300;

/// Answer to an exec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecResponse {
    /// Exit code; `128 + signal` when killed by a signal (as a shell reports it).
    pub exit_code: i32,
    /// Killing signal, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether the timeout killed it.
    #[serde(default)]
    pub timed_out: bool,
    /// Whether the kernel killed a process of it for the sandbox's memory limit.
    #[serde(default)]
    pub oom_killed: bool,
    /// The sandbox's memory limit in MiB, when `oom_killed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u64>,
    /// Whether stdout or stderr went past `max_output_bytes` (the rest was dropped).
    #[serde(default)]
    pub truncated: bool,
    /// Whether stdout went past `max_output_bytes`.
    #[serde(default)]
    pub stdout_truncated: bool,
    /// Whether stderr went past `max_output_bytes`.
    #[serde(default)]
    pub stderr_truncated: bool,
    /// stdout (lossy UTF-8).
    pub stdout: String,
    /// stderr (lossy UTF-8).
    pub stderr: String,
    /// The execution that ran it.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
    pub execution_id: ExecutionId,
}

/// `GET /v1/sandboxes/{id}/events`: what the platform refused the sandbox recently
/// (its network policy's refusals on its current execution), newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    /// The events (at most 256 are kept per execution).
    pub events: Vec<SandboxEvent>,
}

/// One event of a sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxEvent {
    /// RFC 3339, UTC.
    pub at: String,
    /// `network_refused`.
    pub kind: String,
    /// How it was asked for: `dns`, `http` or `tls`.
    pub via: String,
    /// The name or `address:port` asked for.
    pub target: String,
    /// Which list refused: `global` (the operator's), `sandbox` (its own deny list or
    /// its allow list), `mode` (network off) or `proxy` (what the proxy cannot judge).
    pub layer: String,
    /// The rule that refused, or why.
    pub rule: String,
}

/// `POST /v1/sandboxes/{id}/capabilities`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CapabilityRequest {
    /// Access wanted.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::openapi::AccessSchema>))]
    pub access: Vec<Access>,
    /// `control` or `service_port`.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::PurposeSchema))]
    pub purpose: Purpose,
    /// For `service_port`.
    #[serde(default)]
    pub port: Option<u16>,
    /// For `service_port`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::openapi::ProtocolSchema>))]
    pub protocol: Option<Protocol>,
    /// How long to wait, in milliseconds, for a sandbox in a transition (migrating,
    /// starting, restarting) to have an acknowledged execution before answering
    /// `503 transitioning` (default: the control plane's, 10 s; at most 30 s; 0 answers
    /// at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// For a rebuilt attempt, the one retry after a RefreshRoute: the control plane then
    /// holds the next freeze of the execution named (a snapshot, a migration) until the
    /// attempt had time to arrive (250 ms), so it is not refused a second time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilt: bool,
}

/// The route a capability selects, with where to send it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteView {
    /// Sandbox.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
    pub sandbox: SandboxId,
    /// Generation.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub generation: Generation,
    /// Execution ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
    pub execution_id: ExecutionId,
    /// Worker.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::WorkerIdSchema))]
    pub worker: WorkerId,
    /// Substrate.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SubstrateSchema))]
    pub substrate: Substrate,
    /// Activation attempt.
    pub activation: u32,
    /// Kubernetes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::openapi::PodUidSchema>))]
    pub pod_uid: Option<PodUid>,
    /// The worker's node-api base URL (direct mode).
    pub worker_url: String,
}

impl RouteView {
    /// The route it names, as the route cache and recovery rules compare it.
    pub fn route(&self) -> Route {
        Route {
            sandbox: self.sandbox,
            execution: Execution {
                generation: self.generation,
                id: self.execution_id,
            },
            placement: Placement {
                worker: self.worker.clone(),
                substrate: self.substrate,
                activation: self.activation,
                pod_uid: self.pod_uid,
            },
        }
    }
}

/// A capability as handed to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CapabilityResponse {
    /// base64url token for `Authorization: SpaceCap …`.
    pub token: String,
    /// The route it selects.
    pub route: RouteView,
    /// Unix seconds.
    pub expires_at: u64,
}

/// A registered worker, as listed by `GET /v1/workers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerView {
    /// ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::WorkerIdSchema))]
    pub id: WorkerId,
    /// node-api base URL.
    pub address: String,
    /// `active`, `draining` or `dead`.
    pub state: String,
    /// Sandboxes placed there.
    pub sandboxes: u32,
    /// Capacity.
    pub capacity: u32,
    /// Substrate.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SubstrateSchema))]
    pub substrate: Substrate,
}

/// Control plane → worker: enrollment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    /// The worker's ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::WorkerIdSchema))]
    pub worker: WorkerId,
    /// Its node-api base URL.
    pub url: String,
    /// Its substrate.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SubstrateSchema))]
    pub substrate: Substrate,
    /// How many sandboxes it takes.
    pub capacity: u32,
    /// The shared enrollment secret.
    pub enroll_secret: String,
    /// The credential of an earlier enrollment: re-enrolling a worker ID that is
    /// enrolled already needs it (the enrollment secret alone only enrolls a new ID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// Enrollment answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollResponse {
    /// The worker's credential for later calls (`Authorization: Bearer …`).
    pub credential: String,
    /// base64url of the trust anchor's public key: the only key whose bundles and
    /// updates the worker accepts.
    pub anchor: String,
}

/// What a worker must run for one execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InstallExecution {
    /// Sandbox.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
    pub sandbox: SandboxId,
    /// Generation.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub generation: Generation,
    /// Execution ID.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
    pub execution_id: ExecutionId,
    /// Substrate.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SubstrateSchema))]
    pub substrate: Substrate,
    /// Activation attempt.
    pub activation: u32,
    /// Template name.
    pub template: String,
    /// Environment for every process.
    pub env: BTreeMap<String, String>,
    /// Limits.
    pub limits: Limits,
    /// The execution continues a sandbox that has files (every execution after its
    /// first: a restart, a replacement, a migration's or a snapshot's target): the
    /// worker must hold the sandbox's writable layer and refuses the install
    /// otherwise, rather than start the sandbox empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_layer: bool,
    /// The sandbox's exposed service ports, by port: netgtw admits a connection only
    /// to one of these, with its protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ports::ExposedPort>,
    /// The sandbox's network policy: in mode `egress` the worker gives the execution
    /// its link and rules before its first process starts.
    #[serde(default, skip_serializing_if = "is_no_network")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::NetworkSchema))]
    pub network: Policy,
}

/// Whether a policy is the default one (mode `none`, no rules): left out of an install.
fn is_no_network(p: &Policy) -> bool {
    *p == Policy::none()
}

impl InstallExecution {
    /// The execution it installs.
    pub fn execution(&self) -> Execution {
        Execution {
            generation: self.generation,
            id: self.execution_id,
        }
    }
}

/// One identity update for one worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Update {
    /// Install and launch an execution.
    Install(InstallExecution),
    /// Retire an execution (keep a tombstone).
    Retire {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
    },
    /// Freeze an execution in place (same execution; memory kept).
    Pause {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
    },
    /// Thaw a paused execution.
    Resume {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
    },
    /// Freeze an execution and hand over its writable layer (answered with the
    /// archive, not an ack).
    Snapshot {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
    },
    /// Thaw an execution frozen for a snapshot that will not be used (a migration
    /// that failed).
    Unfreeze {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
    },
    /// The archive in the request body is the sandbox's writable layer for its next
    /// execution here; its BLAKE3 digest must be `digest` (hex).
    Layer {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// BLAKE3 of the archive, lowercase hex.
        digest: String,
        /// Its length.
        size: u64,
    },
    /// The archive in the request body is the template `digest` (`sha256:<hex>`) for
    /// this worker's template store: a tar of `manifest.json` (the template's
    /// canonical manifest, whose sha256 is `digest`) followed by the layer blobs as
    /// `blobs/sha256/<hex>`, in the manifest's order; `size` is the archive's length.
    /// Every blob is verified against the manifest as it is unpacked.
    Template {
        /// The template's digest, `sha256:<hex>`.
        digest: String,
        /// The archive's length.
        size: u64,
    },
    /// The templates the control plane still has (`sha256:<hex>` digests, at most
    /// [`MAX_KEPT_TEMPLATES`]): the worker removes from its store every template it
    /// received before it asked for the sync carrying this list, that the list does
    /// not name and that no execution on the worker runs on — and the layers and
    /// blobs no template left uses. Only in a sync's list (refused on its own: the
    /// worker's time of asking is what tells a template sent after the list was made).
    Templates {
        /// The digests.
        keep: Vec<String>,
    },
    /// The sandbox's exposed service ports are now `ports` (by port), for this
    /// execution; netgtw closes connections to a port no longer listed.
    Ports {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
        /// Every exposed port.
        ports: Vec<ports::ExposedPort>,
    },
    /// The sandbox's network policy is now `network`, for this execution: new
    /// connections and DNS questions are judged by it (established ones are kept).
    Network {
        /// Sandbox.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::SandboxIdSchema))]
        sandbox: SandboxId,
        /// Generation.
        #[cfg_attr(feature = "openapi", schema(value_type = u64))]
        generation: Generation,
        /// Execution ID.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ExecutionIdSchema))]
        execution_id: ExecutionId,
        /// The policy.
        #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::NetworkSchema))]
        network: Policy,
    },
    /// Install a signed key bundle (base64url).
    Bundle {
        /// The signed bundle.
        bundle: String,
    },
}

/// The most digests an [`Update::Templates`] list holds.
pub const MAX_KEPT_TEMPLATES: usize = 100_000;

/// The signed envelope: `body` is the JSON of an [`UpdateBody`], as signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignedUpdate {
    /// base64url of the body's bytes.
    pub body: String,
    /// base64url of the anchor's signature over them.
    pub signature: String,
}

/// Oldest (by `issued_at`) a signed update may be when a worker receives it, in
/// seconds. The control plane signs an update just before it sends it; a minute
/// covers a slow transfer and a busy worker, and bounds how long a captured update
/// could be replayed before it is refused by age alone.
pub const UPDATE_MAX_AGE_SECS: u64 = 60;

/// Header of `POST /internal/v1/updates` carrying the signed [`Delivery`] of its body:
/// `<base64url of the descriptor's JSON>.<base64url of the anchor's signature>`
/// (`space_identity::verify_delivery`). The worker checks it before it reads a byte
/// of the body, then reads exactly `size` bytes and compares their digest.
pub const DELIVERY_HEADER: &str = "space-delivery";

/// Largest update body a worker reads (an install carries the sandbox's environment:
/// at most 256 variables of 32 KiB).
pub const MAX_UPDATE_BODY: u64 = 16 << 20;

/// What the control plane signs about the request that carries an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    /// The worker it is for.
    pub worker: String,
    /// Unix seconds; as fresh as an update's `issued_at`.
    pub issued_at: u64,
    /// Length of the body in bytes (at most [`MAX_UPDATE_BODY`]).
    pub size: u64,
    /// BLAKE3 of the body, lowercase hex.
    pub digest: String,
    /// Random, hex: every delivery header is new, so a worker remembers each as used
    /// (a replayed header is refused before its body is read).
    pub nonce: String,
}

/// Clock difference between control plane and worker tolerated either way, in seconds
/// (as for capabilities).
pub const UPDATE_CLOCK_SKEW_SECS: u64 = 15;

/// What the control plane signs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateBody {
    /// The worker it is for; any other refuses it.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::WorkerIdSchema))]
    pub worker: WorkerId,
    /// Unix seconds; the worker refuses an update issued more than
    /// [`UPDATE_MAX_AGE_SECS`] (plus [`UPDATE_CLOCK_SKEW_SECS`]) ago or more than the
    /// skew ahead of its clock.
    pub issued_at: u64,
    /// This worker's update sequence number, handed out once by the control plane
    /// (starting at 1); the worker applies each number at most once, durably.
    pub seq: u64,
    /// The update.
    pub update: Update,
}

/// What an update came to at the worker (`UpdateAck.state`; on the wire its lowercase
/// name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AckState {
    /// The execution runs (an install, a resume or an unfreeze).
    Running,
    /// The execution is frozen in place.
    Paused,
    /// The execution is retired (a tombstone is kept).
    Retired,
    /// A bundle or a layer is installed.
    Installed,
    /// The install failed (`message` says why).
    Failed,
}

impl AckState {
    /// Its wire form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Retired => "retired",
            Self::Installed => "installed",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for AckState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The worker's acknowledgement, sent only after the update is durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateAck {
    /// What the update came to.
    pub state: AckState,
    /// For a failed install, why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The worker's bundle version after the update.
    pub bundle_version: u64,
    /// Warm jails the worker has ready after the update (placement prefers workers
    /// that can start a sandbox from one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_ready: Option<u32>,
}

#[cfg(test)]
mod tests;
