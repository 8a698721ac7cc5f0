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
