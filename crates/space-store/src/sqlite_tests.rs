//! SQLite-only behaviour: connection settings, and refusing what this build cannot read.

use std::borrow::Cow;

use super::*;

async fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db")).await.unwrap();
    (dir, store)
}

fn raw<T: Send + 'static>(store: &SqliteStore, f: impl FnOnce(&Connection) -> T) -> T {
    f(&store.conn.lock().unwrap())
}

#[tokio::test]
async fn the_connection_uses_wal_full_sync_foreign_keys_and_a_busy_timeout() {
    let (_dir, store) = store().await;
    let (mode, sync, fk, timeout) = raw(&store, |c| {
        let get = |p: &str| -> String {
            c.query_row(&format!("PRAGMA {p}"), [], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map(|v| format!("{v:?}"))
            .unwrap()
        };
        (
            get("journal_mode"),
            get("synchronous"),
            get("foreign_keys"),
            get("busy_timeout"),
        )
    });
    assert_eq!(mode, r#"Text("wal")"#);
    assert_eq!(sync, "Integer(2)", "synchronous must be FULL");
    assert_eq!(fk, "Integer(1)");
    assert_eq!(timeout, format!("Integer({})", BUSY_TIMEOUT.as_millis()));
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_build_is_refused() {
    let (_dir, store) = store().await;
    raw(&store, |c| {
        c.execute(
            "INSERT INTO schema_migrations (version, name) VALUES (999, 'future')",
            [],
        )
        .unwrap()
    });
    let err = store.migrate().await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Backend(m) if m.contains("999")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_row_with_an_unknown_state_is_an_error_not_a_guess() {
    let (_dir, store) = store().await;
    raw(&store, |c| {
        c.execute_batch(
            "INSERT INTO tenants VALUES ('ten_a', 'a', 0);
             INSERT INTO sandboxes VALUES ('sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa', 'ten_a', 'default',
                 'exploded', 0, NULL, 'null', '{}', 0, NULL, '{\"mode\":\"none\"}');",
        )
        .unwrap()
    });
    let id: SandboxId = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa".parse().unwrap();
    let err = store.get_sandbox(&id).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Backend(m) if m.contains("sandbox state")),
        "{err:?}"
    );
}

#[test]
fn placeholders_become_sqlite_numbered_parameters() {
    assert_eq!(
        dollar_to_question("UPDATE t SET a = $2 WHERE b = $1 AND c = $10"),
        "UPDATE t SET a = ?2 WHERE b = ?1 AND c = ?10"
    );
    assert!(matches!(dollar_to_question("SELECT 1"), Cow::Borrowed(_)));
}

#[tokio::test]
async fn opening_creates_the_data_directory_and_reopening_finds_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new/data/dir/store.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store.kv_set("k", "v").await.unwrap();
    drop(store);
    let again = crate::Store::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    assert_eq!(again.kv_get("k").await.unwrap().as_deref(), Some("v"));
}

#[tokio::test]
async fn a_failed_write_in_a_group_commit_leaves_the_others_committed() {
    let (_dir, store) = store().await;
    store
        .create_tenant(&Tenant {
            id: "taken".into(),
            name: "first".into(),
            created_at: 1,
        })
        .await
        .unwrap();
    // Writes sent at once are committed in groups; the duplicates fail alone.
    let writes: Vec<_> = (0..60)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let id = if i % 3 == 0 {
                    "taken".to_owned()
                } else {
                    format!("t{i}")
                };
                let t = Tenant {
                    id,
                    name: format!("n{i}"),
                    created_at: i,
                };
                (i, store.create_tenant(&t).await)
            })
        })
        .collect();
    for w in writes {
        let (i, result) = w.await.unwrap();
        if i % 3 == 0 {
            assert!(
                matches!(result, Err(StoreError::Conflict(_))),
                "{i}: {result:?}"
            );
        } else {
            result.unwrap();
            // Answered means durable and visible to every reader.
            assert_eq!(
                store.get_tenant(&format!("t{i}")).await.unwrap().created_at,
                i
            );
        }
    }
    let all = store.list_tenants().await.unwrap();
    assert_eq!(all.len(), 1 + 40);
    assert_eq!(store.get_tenant("taken").await.unwrap().name, "first");
    // A fresh connection (another process) finds the same rows on disk.
    let other = Connection::open(store.path()).unwrap();
    let n: i64 = other
        .query_row("SELECT count(*) FROM tenants", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 41);
}

#[tokio::test]
async fn a_sandbox_stored_before_network_policies_reads_as_none_after_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        // The database as a build that knew migrations 1 to 4 left it.
        let c = Connection::open(&path).unwrap();
        c.execute(sql::CREATE_MIGRATIONS_TABLE, []).unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version <= 4) {
            c.execute_batch(m.sqlite).unwrap();
            c.execute(
                &dollar_to_question(sql::RECORD_MIGRATION),
                rusqlite::params![m.version, m.name],
            )
            .unwrap();
        }
        c.execute_batch(
            "INSERT INTO tenants VALUES ('ten_a', 'a', 0);
             INSERT INTO sandboxes (id, tenant, template, state, created_at, expires_at, metadata, env, generation, limits)
                 VALUES ('sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa', 'ten_a', 'default', 'running', 0, NULL, 'null', '{}', 3, NULL);",
        )
        .unwrap();
    }
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.schema_versions().await.unwrap(),
        vec![1, 2, 3, 4, 5, 6, 7]
    );
    let id: SandboxId = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa".parse().unwrap();
    let s = store.get_sandbox(&id).await.unwrap();
    assert_eq!(s.network, crate::records::Policy::none());
    assert_eq!(s.generation, Generation(3));
}
