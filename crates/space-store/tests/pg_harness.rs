//! The throwaway PostgreSQL server cleans up after itself.

use std::net::TcpStream;

use space_store::testing::PgServer;

#[test]
fn dropping_the_server_stops_it_and_removes_its_directory() {
    let Some(pg) = PgServer::start().expect("start PostgreSQL") else {
        return;
    };
    let dir = pg.socket_dir().to_owned();
    let port = pg.port();
    assert!(
        dir.join(format!(".s.PGSQL.{port}")).exists(),
        "no socket in {dir:?}"
    );
    TcpStream::connect(("127.0.0.1", port)).expect("server accepts TCP");

    drop(pg);
    assert!(!dir.exists(), "{dir:?} left behind");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "server still listening on {port}"
    );
}

#[test]
fn two_servers_run_side_by_side() {
    let (Some(a), Some(b)) = (
        PgServer::start().expect("start PostgreSQL"),
        PgServer::start().expect("start PostgreSQL"),
    ) else {
        return;
    };
    assert_ne!(a.port(), b.port());
    assert_ne!(a.socket_dir(), b.socket_dir());
    assert_ne!(a.url(), b.url());
}

/// A lifecycle change announced on the database by another replica (here: a bare
/// `pg_notify`, as another process's store sends it) wakes a waiter of this process.
#[tokio::test]
async fn a_change_announced_by_another_replica_wakes_a_waiter_here() {
    let Some(pg) = PgServer::start().expect("start PostgreSQL") else {
        return;
    };
    let _store = space_store::Store::open(&pg.url()).await.expect("open");
    let sandbox = space_identity::SandboxId::from_bytes([0x5a; 16]);
    let mut changes = space_store::changes::subscribe(&sandbox);
    let (other, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .expect("a second connection");
    tokio::spawn(connection);
    // The store's LISTEN connection may still be starting: announce until it is woken.
    let woken = async {
        loop {
            other
                .execute(
                    "SELECT pg_notify('space_lifecycle', $1)",
                    &[&sandbox.to_string()],
                )
                .await
                .expect("notify");
            if tokio::time::timeout(std::time::Duration::from_millis(200), changes.changed())
                .await
                .is_ok()
            {
                return;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), woken)
        .await
        .expect("the waiter was woken by the other replica's announcement");
}
