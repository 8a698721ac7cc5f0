//! SQL shared by both backends, and the schema migrations.
//!
//! Statements use PostgreSQL's `$n` placeholders; the SQLite backend rewrites them to
//! `?n`, which SQLite reads as the same numbered parameter. Everything else here is
//! the common subset of both dialects (`RETURNING`, `ON CONFLICT … DO UPDATE … WHERE`),
//! so one text serves both and the two backends cannot drift apart.

/// One schema step. The two texts create the same tables with each database's types.
#[derive(Debug)]
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

/// Every migration, in order. Append only: a released step is never edited, because
/// databases that already applied it would not see the change.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial schema",
        sqlite: r#"
CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants (id),
    hash BLOB NOT NULL,
    admin INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    substrate TEXT NOT NULL,
    capacity INTEGER NOT NULL,
    state TEXT NOT NULL,
    credential_hash BLOB NOT NULL,
    registered_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL
);
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants (id),
    template TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    metadata TEXT NOT NULL,
    env TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 0)
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant);
CREATE TABLE executions (
    sandbox TEXT NOT NULL REFERENCES sandboxes (id),
    generation INTEGER NOT NULL CHECK (generation > 0),
    execution_id TEXT NOT NULL UNIQUE,
    worker TEXT NOT NULL,
    substrate TEXT NOT NULL,
    activation INTEGER NOT NULL,
    pod_uid TEXT,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (sandbox, generation)
);
CREATE INDEX executions_by_worker ON executions (worker, state);
CREATE TABLE signing_keys (
    key_id TEXT PRIMARY KEY,
    seed BLOB NOT NULL,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    not_before INTEGER NOT NULL,
    not_after INTEGER NOT NULL
);
CREATE TABLE key_bundle (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    version INTEGER NOT NULL,
    bytes BLOB NOT NULL
);
CREATE TABLE kv (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"#,
        postgres: r#"
CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants (id),
    hash BYTEA NOT NULL,
    admin BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    substrate TEXT NOT NULL,
    capacity BIGINT NOT NULL,
    state TEXT NOT NULL,
    credential_hash BYTEA NOT NULL,
    registered_at BIGINT NOT NULL,
    last_seen BIGINT NOT NULL
);
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants (id),
    template TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    metadata TEXT NOT NULL,
    env TEXT NOT NULL,
    generation BIGINT NOT NULL CHECK (generation >= 0)
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant);
CREATE TABLE executions (
    sandbox TEXT NOT NULL REFERENCES sandboxes (id),
    generation BIGINT NOT NULL CHECK (generation > 0),
    execution_id TEXT NOT NULL UNIQUE,
    worker TEXT NOT NULL,
    substrate TEXT NOT NULL,
    activation BIGINT NOT NULL,
    pod_uid TEXT,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (sandbox, generation)
);
CREATE INDEX executions_by_worker ON executions (worker, state);
CREATE TABLE signing_keys (
    key_id TEXT PRIMARY KEY,
    seed BYTEA NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    not_before BIGINT NOT NULL,
    not_after BIGINT NOT NULL
);
CREATE TABLE key_bundle (
    singleton BIGINT PRIMARY KEY CHECK (singleton = 1),
    version BIGINT NOT NULL,
    bytes BYTEA NOT NULL
);
CREATE TABLE kv (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"#,
    },
    Migration {
        version: 2,
        name: "per-worker update sequence",
        sqlite: r#"
CREATE TABLE update_sequences (
    worker TEXT PRIMARY KEY,
    last INTEGER NOT NULL CHECK (last >= 0)
);
"#,
        postgres: r#"
CREATE TABLE update_sequences (
    worker TEXT PRIMARY KEY,
    last BIGINT NOT NULL CHECK (last >= 0)
);
"#,
    },
    Migration {
        version: 3,
        name: "sandbox limits",
        sqlite: "ALTER TABLE sandboxes ADD COLUMN limits TEXT;",
        postgres: "ALTER TABLE sandboxes ADD COLUMN limits TEXT;",
    },
    Migration {
        version: 4,
        name: "service ports and one-time links",
        sqlite: r#"
CREATE TABLE service_ports (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    protocol TEXT NOT NULL,
    public INTEGER NOT NULL,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
CREATE TABLE port_links (
    code_hash TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    FOREIGN KEY (sandbox_id, port) REFERENCES service_ports (sandbox_id, port)
);
CREATE INDEX port_links_by_port ON port_links (sandbox_id, port);
CREATE INDEX port_links_by_expiry ON port_links (expires_at);
"#,
        postgres: r#"
CREATE TABLE service_ports (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    port BIGINT NOT NULL CHECK (port BETWEEN 1 AND 65535),
    protocol TEXT NOT NULL,
    public BOOLEAN NOT NULL,
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
CREATE TABLE port_links (
    code_hash TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    port BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    FOREIGN KEY (sandbox_id, port) REFERENCES service_ports (sandbox_id, port)
);
CREATE INDEX port_links_by_port ON port_links (sandbox_id, port);
CREATE INDEX port_links_by_expiry ON port_links (expires_at);
"#,
    },
    // The default is the JSON of `Policy::none()` (a unit test holds them together):
    // every sandbox stored before this step had no network.
    Migration {
        version: 5,
        name: "sandbox network policy",
        sqlite: r#"ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"mode":"none","allow":[],"deny":[]}';"#,
        postgres: r#"ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"mode":"none","allow":[],"deny":[]}';"#,
    },
    // Templates published by the control plane: a name and tag bound to one digest
    // (`sha256:<hex>` of the manifest's canonical JSON), the manifest itself and the
    // bytes of its blobs. A sandbox names its template as `NAME:TAG@sha256:<hex>`.
    Migration {
        version: 6,
        name: "templates",
        sqlite: r#"
CREATE TABLE templates (
    name TEXT NOT NULL,
    tag TEXT NOT NULL,
    digest TEXT NOT NULL,
    manifest TEXT NOT NULL,
    size INTEGER NOT NULL CHECK (size >= 0),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (name, tag)
);
CREATE INDEX templates_by_digest ON templates (digest);
"#,
        postgres: r#"
CREATE TABLE templates (
    name TEXT NOT NULL,
    tag TEXT NOT NULL,
    digest TEXT NOT NULL,
    manifest TEXT NOT NULL,
    size BIGINT NOT NULL CHECK (size >= 0),
    created_at BIGINT NOT NULL,
    PRIMARY KEY (name, tag)
);
CREATE INDEX templates_by_digest ON templates (digest);
"#,
    },
    // A sandbox's catch-all port record (port 0: every HTTP port without a record of
    // its own — what the E2B front gives its sandboxes). Its own table, with the
    // columns of `service_ports`, since that one's CHECK keeps port 0 out.
    Migration {
        version: 7,
        name: "every http port",
        sqlite: r#"
CREATE TABLE every_http_ports (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    port INTEGER NOT NULL CHECK (port = 0),
    protocol TEXT NOT NULL CHECK (protocol = 'http'),
    public INTEGER NOT NULL,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
"#,
        postgres: r#"
CREATE TABLE every_http_ports (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    port BIGINT NOT NULL CHECK (port = 0),
    protocol TEXT NOT NULL CHECK (protocol = 'http'),
    public BOOLEAN NOT NULL,
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
"#,
    },
];

/// The newest schema version this build knows.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

pub(crate) const CREATE_MIGRATIONS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL)";
pub(crate) const APPLIED_VERSIONS: &str = "SELECT version FROM schema_migrations ORDER BY version";
pub(crate) const RECORD_MIGRATION: &str =
    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)";

pub(crate) const INSERT_TENANT: &str =
    "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)";

pub(crate) const INSERT_API_KEY: &str = "INSERT INTO api_keys (id, tenant, hash, admin, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, $6)";
pub(crate) const REVOKE_API_KEY: &str =
    "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";
pub(crate) const API_KEY_EXISTS: &str = "SELECT 1 FROM api_keys WHERE id = $1";

/// Re-enrolment replaces everything the worker reports but keeps the time it first
/// registered.
pub(crate) const UPSERT_WORKER: &str = "INSERT INTO workers (id, url, substrate, capacity, state, credential_hash, registered_at, last_seen) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (id) DO UPDATE SET url = excluded.url, substrate = excluded.substrate, \
     capacity = excluded.capacity, state = excluded.state, \
     credential_hash = excluded.credential_hash, last_seen = excluded.last_seen";
/// First enrollment of a worker ID: a row that exists already is left alone (the
/// caller refuses: re-enrolling needs the worker's own credential).
pub(crate) const ENROLL_NEW_WORKER: &str = "INSERT INTO workers (id, url, substrate, capacity, state, credential_hash, registered_at, last_seen) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING";
/// Re-enrollment: only while the stored credential hash is the one the worker proved
/// it holds (a compare-and-set, so a concurrent change of credential wins or loses
/// whole); the credential and the first registration time stay.
pub(crate) const REENROLL_WORKER: &str = "UPDATE workers SET url = $2, substrate = $3, capacity = $4, state = $5, last_seen = $7 \
     WHERE id = $1 AND credential_hash = $6";
/// Reserves the next `$2` update sequence numbers of worker `$1` and returns the
/// highest: one atomic increment under the row's lock, so two control-plane replicas
/// never hand out the same number, and numbers survive restarts.
pub(crate) const RESERVE_UPDATE_SEQ: &str = "INSERT INTO update_sequences (worker, last) VALUES ($1, $2) \
     ON CONFLICT (worker) DO UPDATE SET last = update_sequences.last + excluded.last RETURNING last";
pub(crate) const SET_WORKER_STATE: &str = "UPDATE workers SET state = $2 WHERE id = $1";
pub(crate) const TOUCH_WORKER: &str = "UPDATE workers SET last_seen = $2 WHERE id = $1";

pub(crate) const INSERT_SANDBOX: &str = "INSERT INTO sandboxes (id, tenant, template, state, created_at, expires_at, metadata, env, generation, limits, network) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
/// Replaces the network policy of a sandbox that is not stopped (a stopped one keeps
/// the policy it had: nothing runs under it again).
pub(crate) const SET_SANDBOX_NETWORK: &str =
    "UPDATE sandboxes SET network = $2 WHERE id = $1 AND state <> 'stopped'";
/// Replaces the expiry (unix seconds, or NULL: none) of a sandbox that is not stopped.
pub(crate) const SET_SANDBOX_EXPIRY: &str =
    "UPDATE sandboxes SET expires_at = $2 WHERE id = $1 AND state <> 'stopped'";
/// Sandboxes of tenant `$1` that are not stopped (what its sandbox quota counts).
pub(crate) const COUNT_LIVE_BY_TENANT: &str =
    "SELECT COUNT(*) FROM sandboxes WHERE tenant = $1 AND state <> 'stopped'";
pub(crate) const SET_SANDBOX_STATE: &str = "UPDATE sandboxes SET state = $2 WHERE id = $1";
pub(crate) const SET_SANDBOX_STATE_IF: &str =
    "UPDATE sandboxes SET state = $2 WHERE id = $1 AND state = $3";
pub(crate) const SANDBOX_EXISTS: &str = "SELECT 1 FROM sandboxes WHERE id = $1";

/// Counts, per worker, the sandboxes that are not stopped and whose current execution
/// (the highest pending or running generation) is there.
/// The standby tenant `$1`'s sandboxes that are not stopped, by the worker of their
/// current execution and their template (ones with no execution yet are left out).
/// Standby sandboxes by worker, template and network mode; `mode` is the backend's
/// [`network_mode`] of `s.network`.
pub(crate) fn count_standby_by_worker(mode: &str) -> String {
    format!(
        "SELECT e.worker, s.template, {mode}, COUNT(*) FROM sandboxes s \
         JOIN executions e ON e.sandbox = s.id \
         WHERE s.tenant = $1 AND s.state <> 'stopped' AND e.state IN ('pending', 'running') \
         AND e.generation = (SELECT MAX(x.generation) FROM executions x \
             WHERE x.sandbox = s.id AND x.state IN ('pending', 'running')) \
         GROUP BY e.worker, s.template, {mode} ORDER BY e.worker, s.template, {mode}"
    )
}

/// The network mode (`none`, `egress`) of the policy in column `column` (JSON text):
/// SQLite's and PostgreSQL's spelling.
pub(crate) fn network_mode(backend: Backend, column: &str) -> String {
    match backend {
        // `->>` with a label (not a `$` path: `$` starts this crate's placeholders).
        Backend::Sqlite => format!("({column} ->> 'mode')"),
        Backend::Postgres => format!("({column}::json ->> 'mode')"),
    }
}

/// Which database a statement is written for, where their SQL differs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backend {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

pub(crate) const COUNT_ACTIVE_BY_WORKER: &str = "SELECT e.worker, COUNT(*) FROM sandboxes s \
     JOIN executions e ON e.sandbox = s.id \
     WHERE s.state <> 'stopped' AND e.state IN ('pending', 'running') \
     AND e.generation = (SELECT MAX(x.generation) FROM executions x \
         WHERE x.sandbox = s.id AND x.state IN ('pending', 'running')) \
     GROUP BY e.worker ORDER BY e.worker";

/// The one statement that hands out generations: the row lock it takes serialises
/// concurrent allocations for a sandbox (across processes on PostgreSQL, across
/// connections on SQLite), and the counter lives on the sandbox row, so a generation
/// whose execution failed is never handed out again. Stopped sandboxes get nothing.
pub(crate) const NEXT_GENERATION: &str = "UPDATE sandboxes SET generation = generation + 1 \
     WHERE id = $1 AND state <> 'stopped' RETURNING generation";
pub(crate) const INSERT_EXECUTION: &str = "INSERT INTO executions (sandbox, generation, execution_id, worker, substrate, activation, pod_uid, state, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
pub(crate) const SET_EXECUTION_STATE: &str =
    "UPDATE executions SET state = $3, updated_at = $4 WHERE sandbox = $1 AND generation = $2";
pub(crate) const SET_EXECUTION_STATE_IF: &str = "UPDATE executions SET state = $3, updated_at = $4 \
     WHERE sandbox = $1 AND generation = $2 AND state = $5";
pub(crate) const SET_EXECUTION_ACTIVATION: &str = "UPDATE executions SET activation = $3, pod_uid = $4, updated_at = $5 \
     WHERE sandbox = $1 AND generation = $2";
pub(crate) const EXECUTION_EXISTS: &str =
    "SELECT 1 FROM executions WHERE sandbox = $1 AND generation = $2";

pub(crate) const INSERT_SIGNING_KEY: &str = "INSERT INTO signing_keys (key_id, seed, state, created_at, not_before, not_after) \
     VALUES ($1, $2, $3, $4, $5, $6)";
pub(crate) const SET_SIGNING_KEY_STATE: &str =
    "UPDATE signing_keys SET state = $2 WHERE key_id = $1";

/// One row holds the newest bundle; the `WHERE` turns an older or equal version into a
/// no-op under the row lock, so two writers cannot roll it back between them.
pub(crate) const STORE_BUNDLE: &str = "INSERT INTO key_bundle (singleton, version, bytes) VALUES (1, $1, $2) \
     ON CONFLICT (singleton) DO UPDATE SET version = excluded.version, bytes = excluded.bytes \
     WHERE key_bundle.version < excluded.version";
pub(crate) const LATEST_BUNDLE: &str = "SELECT version, bytes FROM key_bundle WHERE singleton = 1";

pub(crate) const KV_GET: &str = "SELECT value FROM kv WHERE name = $1";
pub(crate) const KV_SET: &str = "INSERT INTO kv (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value";
pub(crate) const KV_INSERT_IF_ABSENT: &str =
    "INSERT INTO kv (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";

/// The statements of one table of port records: `service_ports`, or
/// `every_http_ports` for port 0 (the catch-all), which has the same columns.
pub(crate) struct PortTable {
    /// A new port of sandbox `$1`; a row that exists already is left alone (changed
    /// 0), and `replace` then replaces it. Two statements rather than one upsert so
    /// the caller learns, in the common dialect, whether the port was new.
    pub insert: &'static str,
    pub replace: &'static str,
    pub delete: &'static str,
    /// Every row of sandbox `$1`.
    pub delete_all: &'static str,
}

pub(crate) const SERVICE_PORTS: PortTable = PortTable {
    insert: "INSERT INTO service_ports (sandbox_id, port, protocol, public, token_hash, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (sandbox_id, port) DO NOTHING",
    replace: "UPDATE service_ports SET protocol = $3, public = $4, token_hash = $5, created_at = $6 \
     WHERE sandbox_id = $1 AND port = $2",
    delete: "DELETE FROM service_ports WHERE sandbox_id = $1 AND port = $2",
    delete_all: "DELETE FROM service_ports WHERE sandbox_id = $1",
};

pub(crate) const EVERY_HTTP_PORTS: PortTable = PortTable {
    insert: "INSERT INTO every_http_ports (sandbox_id, port, protocol, public, token_hash, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (sandbox_id, port) DO NOTHING",
    replace: "UPDATE every_http_ports SET protocol = $3, public = $4, token_hash = $5, created_at = $6 \
     WHERE sandbox_id = $1 AND port = $2",
    delete: "DELETE FROM every_http_ports WHERE sandbox_id = $1 AND port = $2",
    delete_all: "DELETE FROM every_http_ports WHERE sandbox_id = $1",
};

/// The table a record of `port` lives in.
pub(crate) fn port_table(port: u16) -> &'static PortTable {
    if port == 0 {
        &EVERY_HTTP_PORTS
    } else {
        &SERVICE_PORTS
    }
}

/// The name of [`port_table`]'s table, for a `SELECT`.
pub(crate) fn port_table_name(port: u16) -> &'static str {
    if port == 0 {
        "every_http_ports"
    } else {
        "service_ports"
    }
}

/// Every port record of sandbox `$1` (both tables), by port.
pub(crate) const LIST_PORTS: &str = "SELECT sandbox_id, port, protocol, public, token_hash, created_at FROM every_http_ports WHERE sandbox_id = $1 \
     UNION ALL SELECT sandbox_id, port, protocol, public, token_hash, created_at FROM service_ports WHERE sandbox_id = $1 ORDER BY port";

pub(crate) const INSERT_PORT_LINK: &str =
    "INSERT INTO port_links (code_hash, sandbox_id, port, expires_at) VALUES ($1, $2, $3, $4)";
pub(crate) const DELETE_PORT_LINKS_OF_PORT: &str =
    "DELETE FROM port_links WHERE sandbox_id = $1 AND port = $2";
pub(crate) const DELETE_PORT_LINKS_OF_SANDBOX: &str =
    "DELETE FROM port_links WHERE sandbox_id = $1";
/// Takes a link whole in one statement: of two callers racing for one code, the
/// second finds the row gone (the first's delete holds its lock until commit), so a
/// link is used at most once. An expired link is deleted too; the caller refuses it.
pub(crate) const TAKE_PORT_LINK: &str =
    "DELETE FROM port_links WHERE code_hash = $1 RETURNING sandbox_id, port, expires_at";
pub(crate) const PURGE_PORT_LINKS: &str = "DELETE FROM port_links WHERE expires_at < $1";

/// Hands the oldest running sandbox of the standby tenant `$1`, template `$6` and
/// network mode `$8` to tenant `$2`, with its creation time, expiry, metadata and
/// network policy (`$3`–`$5`, `$7`); returns its row. On PostgreSQL the row is taken
/// `FOR UPDATE SKIP LOCKED` (concurrent claims take different rows); SQLite's writes
/// are serialised.
pub(crate) fn claim_standby(columns: &str, backend: Backend) -> String {
    let mode = network_mode(backend, "network");
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::Postgres => "FOR UPDATE SKIP LOCKED",
    };
    format!(
        "UPDATE sandboxes SET tenant = $2, created_at = $3, expires_at = $4, metadata = $5, network = $7 \
         WHERE tenant = $1 AND id = (SELECT id FROM sandboxes WHERE tenant = $1 AND state = 'running' \
         AND template = $6 AND {mode} = $8 ORDER BY created_at, id LIMIT 1 {lock}) RETURNING {columns}"
    )
}

/// `SELECT <columns> FROM <table> <tail>`, for the reads whose column list lives in
/// [`crate::rows`].
pub(crate) fn select(columns: &str, table: &str, tail: &str) -> String {
    format!("SELECT {columns} FROM {table} {tail}")
}

/// `state IN ($first, $first+1, …)` for a filter of `n` states.
pub(crate) fn state_in(first: usize, n: usize) -> String {
    let list: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    format!("state IN ({})", list.join(", "))
}

/// The executions on worker `$1`, in the `n_states` states `$2…` (any state when
/// none is given).
pub(crate) fn executions_on_worker_sql(n_states: usize) -> String {
    let filter = if n_states == 0 {
        String::new()
    } else {
        format!(" AND {}", state_in(2, n_states))
    };
    select(
        crate::rows::EXECUTION_COLUMNS,
        "executions",
        &format!("WHERE worker = $1{filter} ORDER BY sandbox, generation"),
    )
}
