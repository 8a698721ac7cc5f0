//! Fresh stores for each case, on either backend, and fixed test data.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use space_identity::{ExecutionId, Generation, SandboxId, Substrate, WorkerId};
use space_store::testing::PgServer;
use space_store::{SandboxRecord, SandboxState, Store, Tenant, WorkerRecord, WorkerState};

/// Where a case's stores live. Every `open` reaches the same database, so a case can
/// reopen it or run two stores (two control planes) side by side.
pub enum Fixture {
    Sqlite(tempfile::TempDir),
    Postgres(PgServer),
}

impl Fixture {
    pub fn sqlite() -> Self {
        Self::Sqlite(tempfile::tempdir().expect("tempdir"))
    }

    /// `None` when PostgreSQL is not installed (the harness says so on stderr).
    pub fn postgres() -> Option<Self> {
        PgServer::start()
            .expect("the throwaway PostgreSQL server failed to start")
            .map(Self::Postgres)
    }

    pub fn location(&self) -> String {
        match self {
            Self::Sqlite(dir) => format!("sqlite:{}", dir.path().join("store.db").display()),
            Self::Postgres(pg) => pg.url(),
        }
    }

    /// A new store instance (for PostgreSQL: with its own connection pool).
    pub async fn open(&self) -> Store {
        Store::open(&self.location()).await.expect("open store")
    }
}

pub const NOW: i64 = 1_700_000_000;

/// Distinct execution IDs across every case in this binary.
pub fn execution_id() -> ExecutionId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut bytes = [0x5a; 16];
    bytes[8..].copy_from_slice(&n.to_be_bytes());
    ExecutionId::from_bytes(bytes)
}

pub fn sandbox_id(n: u8) -> SandboxId {
    SandboxId::from_bytes([n; 16])
}

pub fn worker_id(name: &str) -> WorkerId {
    name.parse().expect("worker id")
}

pub fn tenant(id: &str) -> Tenant {
    Tenant {
        id: id.into(),
        name: format!("tenant {id}"),
        created_at: NOW,
    }
}

pub fn worker(name: &str) -> WorkerRecord {
    WorkerRecord {
        id: worker_id(name),
        url: format!("http://127.0.0.1:7100/{name}"),
        substrate: Substrate::Jail,
        capacity: 8,
        state: WorkerState::Active,
        credential_hash: [7; 32],
        registered_at: NOW,
        last_seen: NOW,
    }
}

pub fn sandbox(n: u8, tenant: &str) -> SandboxRecord {
    SandboxRecord {
        id: sandbox_id(n),
        tenant: tenant.into(),
        template: "default".into(),
        state: SandboxState::Starting,
        created_at: NOW + i64::from(n),
        expires_at: Some(NOW + 3600),
        metadata: serde_json::json!({ "owner": "agent-7", "tags": ["a", "b"], "n": n }),
        env: BTreeMap::from([
            ("LANG".into(), "C.UTF-8".into()),
            ("N".into(), n.to_string()),
        ]),
        generation: Generation(0),
        // Odd sandboxes carry limits, even ones are stored as before limits existed.
        limits: (n % 2 == 1).then_some(space_store::SandboxLimits {
            memory_bytes: u64::from(n) << 20,
            pids: 64,
            cpu_millis: 1500,
            disk_bytes: 3 << 30,
        }),
        // Every third sandbox has a network; the others are loopback only.
        network: if n % 3 == 0 {
            egress(
                &["pypi.org", "*.githubusercontent.com", "203.0.113.0/24"],
                &["10.0.0.0/8"],
            )
        } else {
            space_store::Policy::none()
        },
    }
}

/// An `egress` policy with these rules.
pub fn egress(allow: &[&str], deny: &[&str]) -> space_store::Policy {
    space_store::Policy::parse(space_egress::NetworkMode::Egress, allow, deny).expect("policy")
}

impl Fixture {
    /// Runs `sql` on the database directly, as another program (or an older build)
    /// would, past the store.
    pub async fn execute_raw(&self, sql: &str) {
        match self {
            Self::Sqlite(dir) => {
                let c = rusqlite::Connection::open(dir.path().join("store.db")).expect("open");
                c.execute_batch(sql).expect("raw SQL");
            }
            Self::Postgres(pg) => {
                let (client, connection) =
                    tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                let conn = tokio::spawn(connection);
                client.batch_execute(sql).await.expect("raw SQL");
                drop(client);
                let _ = conn.await;
            }
        }
    }
}

/// A store with tenant `ten_a` and sandbox `n` of it.
pub async fn with_sandbox(store: &Store, n: u8) -> SandboxId {
    match store.create_tenant(&tenant("ten_a")).await {
        Ok(()) | Err(space_store::StoreError::Conflict(_)) => {}
        Err(e) => panic!("create tenant: {e}"),
    }
    store
        .create_sandbox(&sandbox(n, "ten_a"))
        .await
        .expect("create sandbox");
    sandbox_id(n)
}
