//! Service ports end to end: servers in real sandboxes of a real `space up`, reached
//! through the edge's URLs (`{port}-{sandbox}.localhost:{edge port}`), its routing
//! headers and `CONNECT` — authorization, refusals, metrics, and the same URL across
//! migrations, snapshots and restarts. Every connection goes to 127.0.0.1 with a
//! `Host` the test writes (no DNS).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use space_testkit::wait::wait_for;
use support::{Cluster, can_run_jails, http};
use wire::{Answer, Conn};

#[path = "ports/wire.rs"]
mod wire;

/// An HTTP/1.1 server: `/headers` echoes the request's headers, `/who` its tag.
const HTTP_APP: &str = include_str!("ports/http_app.py");
/// A TCP echo server.
const TCP_ECHO: &str = include_str!("ports/tcp_echo.py");
/// An RFC 6455 echo server.
const WS_ECHO: &str = include_str!("ports/ws_echo.py");

/// How long a server started in a sandbox has to accept connections.
const SERVER_START: Duration = Duration::from_secs(30);

/// How much later than the migrate command's return a connection to the old
/// execution may end.
const CLOSE_SLACK: Duration = Duration::from_millis(100);

fn edge(c: &Cluster) -> SocketAddr {
    c.url
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the edge's URL is not http://ip:port: {}", c.url))
}

/// The host name of `port` of `id` at this cluster's edge (with the edge's port).
fn port_host(c: &Cluster, port: u16, id: &str) -> String {
    format!("{port}-{id}.localhost:{}", edge(c).port())
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

/// An API call at the edge with the admin key.
fn api(c: &Cluster, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, body) = http(
        method,
        &format!("{}{path}", c.url),
        Some(&bearer(&c.admin_key)),
        body.as_bytes(),
    );
    let value = if body.is_empty() {
        serde_json::Value::Null
    } else {
        json(&body)
    };
    (status, value)
}

/// `POST /v1/sandboxes/{id}/ports`: the exposed port (with its token and link).
fn expose(c: &Cluster, id: &str, port: u16, protocol: &str, public: bool) -> serde_json::Value {
    let body = serde_json::json!({"port": port, "protocol": protocol, "public": public});
    let (status, view) = api(
        c,
        "POST",
        &format!("/v1/sandboxes/{id}/ports"),
        &body.to_string(),
    );
    assert!(status == 201 || status == 200, "{status} {view}");
    view
}

/// `GET /v1/sandboxes/{id}/ports`: the ports listed.
fn listed(c: &Cluster, id: &str) -> Vec<serde_json::Value> {
    let (status, list) = api(c, "GET", &format!("/v1/sandboxes/{id}/ports"), "");
    assert_eq!(status, 200, "{list}");
    list["ports"].as_array().cloned().unwrap_or_default()
}

fn upload(c: &Cluster, id: &str, path: &str, bytes: &[u8]) {
    let out = c.cli_with_stdin(&["fs", "put", id, "-", path], bytes);
    assert!(
        out.status.success(),
        "fs put {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sh -c script` in the sandbox; its stdout.
fn sh(c: &Cluster, id: &str, script: &str) -> String {
    let out = c.cli(&["exec", id, "--", "sh", "-c", script]);
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts `command` in the background in the sandbox (in `dir`), logging to
/// `/tmp/{port}.log`, and waits until something accepts on `port` there.
fn start(c: &Cluster, id: &str, dir: &str, command: &str, port: u16) {
    sh(
        c,
        id,
        &format!("cd {dir} && (nohup {command} > /tmp/{port}.log 2>&1 < /dev/null &)"),
    );
    let probe =
        format!("import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()");
    let up = wait_for(SERVER_START, Duration::from_millis(100), || {
        c.cli(&["exec", id, "--", "python3", "-c", &probe])
            .status
            .success()
            .then_some(())
    });
    if up.is_none() {
        let log = c.cli(&["exec", id, "--", "cat", &format!("/tmp/{port}.log")]);
        panic!(
            "nothing accepts on {port} in {id} after {SERVER_START:?}: {}",
            String::from_utf8_lossy(&log.stdout)
        );
    }
}

/// The HTTP app on `port`, answering `/who` with `tag`.
fn start_app(c: &Cluster, id: &str, port: u16, tag: &str) {
    upload(c, id, "/root/http_app.py", HTTP_APP.as_bytes());
    start(
        c,
        id,
        "/root",
        &format!("python3 /root/http_app.py {port} {tag}"),
        port,
    );
}

fn start_tcp_echo(c: &Cluster, id: &str, port: u16) {
    upload(c, id, "/root/tcp_echo.py", TCP_ECHO.as_bytes());
    start(
        c,
        id,
        "/root",
        &format!("python3 /root/tcp_echo.py {port}"),
        port,
    );
}

/// A fresh connection to the edge, one GET on it.
fn get(c: &Cluster, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    Conn::open(edge(c)).get(host, path, headers)
}

/// `/who` of `port` of `id` through its URL with the admin key.
fn who(c: &Cluster, id: &str, port: u16) -> Answer {
    get(
        c,
        &port_host(c, port, id),
        "/who",
        &[("Authorization", &bearer(&c.admin_key))],
    )
}

/// A raw `CONNECT {id}:{port}` with the admin key: the tunnel once answered 200.
fn connect(c: &Cluster, id: &str, port: u16, auth: &str) -> (Answer, Conn) {
    let mut conn = Conn::open(edge(c));
    let target = format!("{id}:{port}");
    let a = conn.request("CONNECT", &target, &target, &[("Authorization", auth)]);
    (a, conn)
}

/// The sum of a worker's samples of counter `name` for `port` of `id` whose labels
/// also contain `more`.
fn port_counter(c: &Cluster, worker: &str, name: &str, id: &str, port: u16, more: &str) -> f64 {
    let (_, url) = c
        .worker_urls()
        .into_iter()
        .find(|(w, _)| w == worker)
        .unwrap_or_else(|| panic!("no worker {worker}"));
    let (status, body) = http("GET", &format!("{url}/metrics"), None, b"");
    assert_eq!(status, 200);
    let sandbox = format!("sandbox=\"{id}\"");
    let port = format!("port=\"{port}\"");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&sandbox) && l.contains(&port) && l.contains(more))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The header names a request reached the `/headers` app with, and their values.
fn seen_headers(a: &Answer) -> Vec<(String, String)> {
    assert_eq!(a.status, 200, "{a}");
    serde_json::from_slice::<Vec<(String, String)>>(&a.body)
        .unwrap_or_else(|_| panic!("not the app's header list: {a}"))
}

fn has(headers: &[(String, String)], name: &str) -> bool {
    headers.iter().any(|(n, _)| n == name)
}

/// Incompressible bytes, the same every run.
fn noise(n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    blake3::Hasher::new()
        .update(b"space ports test")
        .finalize_xof()
        .fill(&mut out);
    out
}

#[test]
fn python_http_server_in_a_sandbox_is_reached_through_its_url_by_host_name_and_by_headers() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let key = bearer(&c.admin_key);
    let file = format!("served from {id}\n");
    sh(&c, &id, "mkdir -p /root/www");
    upload(&c, &id, "/root/www/index.txt", file.as_bytes());
    start(
        &c,
        &id,
        "/root/www",
        "python3 -m http.server 8000 --bind 127.0.0.1",
        8000,
    );
    start_app(&c, &id, 8001, "echo");
    let exposed = expose(&c, &id, 8000, "http", false);
    let host = port_host(&c, 8000, &id);
    assert_eq!(exposed["url"], format!("http://{host}/"), "{exposed}");
    let token = exposed["token"].as_str().expect("a token").to_owned();

    // By host name, with the owner's key and with the port's token.
    let mut served = 0;
    for credential in [
        ("Authorization", key.as_str()),
        ("X-Space-Port-Token", &token),
    ] {
        let a = get(&c, &host, "/index.txt", &[credential]);
        assert_eq!(
            (a.status, a.text()),
            (200, file.clone()),
            "{}: {a}",
            credential.0
        );
        served += 1;
    }
    // By headers, for a client without wildcard DNS.
    let plain = edge(&c).to_string();
    let a = get(
        &c,
        &plain,
        "/index.txt",
        &[
            ("X-Space-Sandbox", &id),
            ("X-Space-Port", "8000"),
            ("X-Space-Port-Token", &token),
        ],
    );
    assert_eq!((a.status, a.text()), (200, file.clone()), "{a}");
    served += 1;

    // The credential (and the routing headers) do not reach the server; the rest does.
    let echo = expose(&c, &id, 8001, "http", false);
    let echo_token = echo["token"].as_str().expect("a token").to_owned();
    let echo_host = port_host(&c, 8001, &id);
    let seen = seen_headers(&get(
        &c,
        &echo_host,
        "/headers",
        &[("Authorization", &key), ("X-Probe", "kept")],
    ));
    assert!(has(&seen, "x-probe"), "{seen:?}");
    assert!(
        !has(&seen, "authorization"),
        "the key reached the server: {seen:?}"
    );
    let seen = seen_headers(&get(
        &c,
        &echo_host,
        "/headers",
        &[("X-Space-Port-Token", &echo_token), ("X-Probe", "kept")],
    ));
    assert!(has(&seen, "x-probe"), "{seen:?}");
    assert!(
        !has(&seen, "x-space-port-token"),
        "the token reached the server: {seen:?}"
    );
    let seen = seen_headers(&get(
        &c,
        &plain,
        "/headers",
        &[
            ("X-Space-Sandbox", &id),
            ("X-Space-Port", "8001"),
            ("Authorization", &key),
            ("Cookie", "theme=dark"),
        ],
    ));
    for name in ["x-space-sandbox", "x-space-port", "authorization"] {
        assert!(!has(&seen, name), "{name} reached the server: {seen:?}");
    }
    assert!(
        seen.contains(&("cookie".into(), "theme=dark".into())),
        "{seen:?}"
    );

    // A one-time link: 303 with the cookie, which then opens the port; used once.
    let (status, linked) = api(
        &c,
        "POST",
        &format!("/v1/sandboxes/{id}/ports/8000/links"),
        "",
    );
    assert_eq!(status, 200, "{linked}");
    let link = linked["link"].as_str().expect("a link");
    let target = link
        .strip_prefix(&format!("http://{host}"))
        .unwrap_or_else(|| panic!("the link is not on the port's URL: {link}"))
        .to_owned();
    assert!(target.contains("space_link="), "{link}");
    let first = get(&c, &host, &target, &[]);
    assert_eq!(first.status, 303, "{first}");
    assert_eq!(first.header("location"), Some("/"), "{first}");
    let cookie = first
        .header("set-cookie")
        .and_then(|v| v.split(';').next())
        .expect("a cookie")
        .to_owned();
    assert!(cookie.starts_with("space_port_token="), "{cookie}");
    let a = get(&c, &host, "/index.txt", &[("Cookie", &cookie)]);
    assert_eq!((a.status, a.text()), (200, file.clone()), "{a}");
    served += 1;
    let seen = seen_headers(&get(
        &c,
        &echo_host,
        "/headers",
        &[
            ("Authorization", &key),
            ("Cookie", &format!("{cookie}; theme=dark")),
        ],
    ));
    assert!(
        seen.contains(&("cookie".into(), "theme=dark".into())),
        "the link's cookie reached the server: {seen:?}"
    );
    let again = get(&c, &host, &target, &[]);
    assert_eq!(
        (again.status, again.error()),
        (401, "unauthorized".into()),
        "{again}"
    );

    // A public port answers without credentials.
    expose(&c, &id, 8001, "http", true);
    let a = get(&c, &echo_host, "/who", &[]);
    assert_eq!((a.status, a.text()), (200, "echo".into()), "{a}");

    // The worker counted the traffic of port 8000: a connection into the sandbox at
    // least per request (http.server closes each), and every body byte.
    let worker = c.sandbox(&id)["execution"]["worker"]
        .as_str()
        .expect("a worker")
        .to_owned();
    let connections = port_counter(
        &c,
        &worker,
        "space_worker_port_connections_total",
        &id,
        8000,
        "",
    );
    assert!(connections >= f64::from(served), "{connections} < {served}");
    let from = port_counter(
        &c,
        &worker,
        "space_worker_port_bytes_total",
        &id,
        8000,
        "direction=\"from_sandbox\"",
    );
    let to = port_counter(
        &c,
        &worker,
        "space_worker_port_bytes_total",
        &id,
        8000,
        "direction=\"to_sandbox\"",
    );
    let bodies = f64::from(served) * file.len() as f64;
    assert!(
        from >= bodies,
        "{from} bytes from the sandbox, {bodies} in bodies"
    );
    assert!(to >= f64::from(served) * 16.0, "{to} bytes to the sandbox");

    // Listed by port, without tokens.
    let ports = listed(&c, &id);
    let summary: Vec<_> = ports
        .iter()
        .map(|p| {
            (
                p["port"].clone(),
                p["protocol"].clone(),
                p["public"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (8000.into(), "http".into(), false.into()),
            (8001.into(), "http".into(), true.into()),
        ],
        "{ports:?}"
    );
    assert_eq!(ports[0]["url"], format!("http://{host}/"));
    assert!(ports.iter().all(|p| p.get("token").is_none()), "{ports:?}");

    // Closed: the URL answers 404 port_not_exposed.
    let (status, body) = api(&c, "DELETE", &format!("/v1/sandboxes/{id}/ports/8000"), "");
    assert_eq!(status, 204, "{body}");
    let a = get(&c, &host, "/index.txt", &[("Authorization", &key)]);
    assert_eq!(
        (a.status, a.error()),
        (404, "port_not_exposed".into()),
        "{a}"
    );
    let left: Vec<_> = listed(&c, &id).iter().map(|p| p["port"].clone()).collect();
    assert_eq!(left, vec![serde_json::json!(8001)]);
}

#[test]
fn a_websocket_echo_server_in_a_sandbox_is_reached_through_its_url() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    upload(&c, &id, "/root/ws_echo.py", WS_ECHO.as_bytes());
    start(&c, &id, "/root", "python3 /root/ws_echo.py 8000", 8000);
    expose(&c, &id, 8000, "http", false);
    let host = port_host(&c, 8000, &id);
    let addr = edge(&c);
    let key = bearer(&c.admin_key);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut req = format!("ws://{host}/echo")
            .into_client_request()
            .expect("a request");
        req.headers_mut()
            .insert("authorization", key.parse().expect("a header value"));
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp)
            .await
            .expect("the WebSocket handshake through the edge");
        assert_eq!(resp.status(), 101);
        let messages = [
            Message::text("hello through the edge"),
            Message::binary(vec![0u8, 1, 2, 255]),
            // A 16-bit and a 64-bit length.
            Message::text("x".repeat(40_000)),
            Message::binary(noise(300_000)),
            Message::text("last"),
        ];
        for sent in messages {
            ws.send(sent.clone()).await.expect("send");
            let got = tokio::time::timeout(Duration::from_secs(20), ws.next())
                .await
                .expect("an echo in time")
                .expect("the socket is open")
                .expect("a message");
            assert!(got == sent, "sent {} bytes, got {got:?}", sent.len());
        }
        ws.close(None).await.expect("close");
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(m) = ws.next().await {
                if let Ok(Message::Close(_)) | Err(_) = m {
                    break;
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the close was not answered");
    });
}

/// `space port forward` running; killed when dropped.
struct Forward {
    child: Child,
    at: SocketAddr,
    /// Its stdout, kept open so that a later line does not fail on a closed pipe.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Forward {
    fn start(c: &Cluster, id: &str, port: u16) -> Self {
        let mut child = Command::new(support::space_bin())
            .args([
                "port",
                "forward",
                id,
                &port.to_string(),
                "--local",
                "127.0.0.1:0",
            ])
            .env("SPACE_URL", &c.url)
            .env("SPACE_API_KEY", &c.admin_key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn space port forward");
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let _ = stdout.read_line(&mut first);
        let want_tail = format!(" -> {id}:{port}");
        let at = first
            .trim_end()
            .strip_prefix("forwarding ")
            .and_then(|rest| rest.strip_suffix(&want_tail))
            .and_then(|a| a.parse().ok());
        let Some(at) = at else {
            let _ = child.kill();
            let status = child.wait().expect("its exit");
            panic!(
                "space port forward printed {first:?} and ended with {status} (its stderr above)"
            );
        };
        Self {
            child,
            at,
            _stdout: stdout,
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_tcp_echo_server_is_reached_through_port_forward() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    start_tcp_echo(&c, &id, 9000);
    let view = expose(&c, &id, 9000, "tcp", false);
    assert_eq!(view["protocol"], "tcp", "{view}");
    let forward = Forward::start(&c, &id, 9000);
    let mut stream = TcpStream::connect(forward.at).expect("connect to the forwarder");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(b"ping\n").expect("write");
    let mut back = [0u8; 5];
    stream.read_exact(&mut back).expect("the echo");
    assert_eq!(&back, b"ping\n");
    // 1 MiB both ways at once, intact.
    let data = noise(1 << 20);
    let mut writer = stream.try_clone().expect("clone");
    let sent = data.clone();
    let sending = std::thread::spawn(move || writer.write_all(&sent));
    let mut got = vec![0u8; data.len()];
    stream.read_exact(&mut got).expect("1 MiB back");
    sending.join().expect("the writer").expect("1 MiB sent");
    let first_difference = got.iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "the echo differs");
    // A second connection through the same forwarder is a tunnel of its own.
    let mut other = TcpStream::connect(forward.at).expect("connect again");
    other
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    other.write_all(b"again").expect("write");
    let mut back = [0u8; 5];
    other.read_exact(&mut back).expect("the echo");
    assert_eq!(&back, b"again");
}

#[test]
fn a_port_token_for_8080_does_not_open_8081() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    start_app(&c, &id, 8080, "a");
    start_app(&c, &id, 8081, "b");
    let a = expose(&c, &id, 8080, "http", false);
    let b = expose(&c, &id, 8081, "http", false);
    let token_a = a["token"].as_str().expect("a token");
    let token_b = b["token"].as_str().expect("a token");
    let at = |port: u16, token: &str| {
        get(
            &c,
            &port_host(&c, port, &id),
            "/who",
            &[("X-Space-Port-Token", token)],
        )
    };
    let own = at(8080, token_a);
    assert_eq!((own.status, own.text()), (200, "a".into()), "{own}");
    let own = at(8081, token_b);
    assert_eq!((own.status, own.text()), (200, "b".into()), "{own}");
    let other = at(8081, token_a);
    assert_eq!(
        (other.status, other.error()),
        (401, "unauthorized".into()),
        "{other}"
    );
}

#[test]
fn connect_to_an_http_port_and_http_to_a_tcp_port_are_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let key = bearer(&c.admin_key);
    start_app(&c, &id, 8000, "web");
    start_tcp_echo(&c, &id, 9000);
    expose(&c, &id, 8000, "http", false);
    expose(&c, &id, 9000, "tcp", false);
    // Each the right way: served.
    let (a, mut tunnel) = connect(&c, &id, 9000, &key);
    assert_eq!(a.status, 200, "{a}");
    tunnel.write(b"tcp");
    assert_eq!(tunnel.read_exact(3), b"tcp");
    let a = who(&c, &id, 8000);
    assert_eq!((a.status, a.text()), (200, "web".into()), "{a}");
    // Each the wrong way: refused.
    let (a, _) = connect(&c, &id, 8000, &key);
    assert_eq!((a.status, a.error()), (403, "deny".into()), "{a}");
    assert_eq!(a.json()["reason"], "wrong_protocol", "{a}");
    let a = get(
        &c,
        &port_host(&c, 9000, &id),
        "/",
        &[("Authorization", &key)],
    );
    assert_eq!((a.status, a.error()), (403, "deny".into()), "{a}");
    assert_eq!(a.json()["reason"], "wrong_protocol", "{a}");
}

#[test]
fn an_upgrade_to_another_protocol_than_websocket_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let key = bearer(&c.admin_key);
    start_app(&c, &id, 8000, "web");
    expose(&c, &id, 8000, "http", false);
    let host = port_host(&c, 8000, &id);
    let plain = get(&c, &host, "/who", &[("Authorization", &key)]);
    assert_eq!((plain.status, plain.text()), (200, "web".into()), "{plain}");
    let a = get(
        &c,
        &host,
        "/who",
        &[
            ("Authorization", &key),
            ("Connection", "Upgrade, HTTP2-Settings"),
            ("Upgrade", "h2c"),
            ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ],
    );
    assert_eq!((a.status, a.error()), (403, "deny".into()), "{a}");
    assert_eq!(a.json()["reason"], "wrong_protocol", "{a}");
}

#[test]
fn an_unexposed_port_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    start_app(&c, &id, 8000, "web");
    let capability = || {
        api(
            &c,
            "POST",
            &format!("/v1/sandboxes/{id}/capabilities"),
            r#"{"access":["service_port"],"purpose":"service_port","port":8000,"protocol":"http"}"#,
        )
    };
    // A server listens, but the port is not exposed.
    let a = who(&c, &id, 8000);
    assert_eq!(
        (a.status, a.error()),
        (404, "port_not_exposed".into()),
        "{a}"
    );
    let (status, body) = capability();
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "port_not_exposed", "{body}");
    // Exposed, both are served.
    expose(&c, &id, 8000, "http", false);
    let a = who(&c, &id, 8000);
    assert_eq!((a.status, a.text()), (200, "web".into()), "{a}");
    let (status, body) = capability();
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_request_for_sandbox_b_on_a_kept_alive_connection_opened_for_a_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let key = bearer(&c.admin_key);
    let a_id = c.create(&[]);
    let b_id = c.create(&[]);
    for (id, tag) in [(&a_id, "A"), (&b_id, "B")] {
        start_app(&c, id, 8000, tag);
        expose(&c, id, 8000, "http", false);
    }
    let b = who(&c, &b_id, 8000);
    assert_eq!(
        (b.status, b.text()),
        (200, "B".into()),
        "B on its own connection: {b}"
    );
    let mut conn = Conn::open(edge(&c));
    let auth = [("Authorization", key.as_str())];
    let first = conn.get(&port_host(&c, 8000, &a_id), "/who", &auth);
    assert_eq!((first.status, first.text()), (200, "A".into()), "{first}");
    assert!(!first.closes(), "kept alive: {first}");
    let again = conn.get(&port_host(&c, 8000, &a_id), "/who", &auth);
    assert_eq!((again.status, again.text()), (200, "A".into()), "{again}");
    let second = conn.get(&port_host(&c, 8000, &b_id), "/who", &auth);
    assert_eq!(
        (second.status, second.error()),
        (421, "misdirected".into()),
        "{second}"
    );
    assert!(
        conn.ended_within(Duration::from_secs(5)).is_ok(),
        "the connection stayed open after the misdirected request"
    );
}

#[test]
fn a_private_port_without_credentials_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    start_app(&c, &id, 8000, "web");
    let view = expose(&c, &id, 8000, "http", false);
    let token = view["token"].as_str().expect("a token").to_owned();
    let (status, tenant) = api(&c, "POST", "/v1/tenants", r#"{"name":"mallory"}"#);
    assert_eq!(status, 201, "{tenant}");
    let mallory = bearer(tenant["api_key"].as_str().expect("an API key"));
    let host = port_host(&c, 8000, &id);
    // The owner's key and the token open it.
    for credential in [
        ("Authorization", bearer(&c.admin_key)),
        ("X-Space-Port-Token", token.clone()),
    ] {
        let a = get(&c, &host, "/who", &[(credential.0, &credential.1)]);
        assert_eq!(
            (a.status, a.text()),
            (200, "web".into()),
            "{}: {a}",
            credential.0
        );
    }
    // The last hex digit changed (a fixed replacement is the same token one time in 16).
    let last = if token.ends_with('0') { '1' } else { '0' };
    let wrong_token = format!("{}{last}", &token[..token.len() - 1]);
    assert_ne!(wrong_token, token);
    for (what, headers) in [
        ("nothing", vec![]),
        (
            "a wrong token",
            vec![("X-Space-Port-Token", wrong_token.as_str())],
        ),
        (
            "another tenant's key",
            vec![("Authorization", mallory.as_str())],
        ),
        (
            "a forged cookie",
            vec![("Cookie", "space_port_token=v1.8000.99999999999.00")],
        ),
    ] {
        let a = get(&c, &host, "/who", &headers);
        assert_eq!(
            (a.status, a.error()),
            (401, "unauthorized".into()),
            "{what}: {a}"
        );
    }
}

/// Reads from `conn` in a thread until it ends: when it ended, or what came instead.
fn watch_end(mut conn: Conn) -> std::thread::JoinHandle<Result<Instant, String>> {
    std::thread::spawn(move || conn.ended_within(Duration::from_secs(60)))
}

#[test]
fn after_a_migration_the_same_url_reaches_the_new_execution_and_connections_to_the_old_one_close() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let key = bearer(&c.admin_key);
    let id = c.create(&["--worker", "w1"]);
    start_app(&c, &id, 8000, "first");
    start_tcp_echo(&c, &id, 9000);
    expose(&c, &id, 8000, "http", false);
    expose(&c, &id, 9000, "tcp", false);
    let host = port_host(&c, 8000, &id);
    // (a) a kept-alive HTTP connection that made one request.
    let mut kept = Conn::open(edge(&c));
    let a = kept.get(&host, "/who", &[("Authorization", &key)]);
    assert_eq!((a.status, a.text()), (200, "first".into()), "{a}");
    assert!(!a.closes(), "{a}");
    // (b) a CONNECT tunnel to the tcp echo port.
    let (a, mut tunnel) = connect(&c, &id, 9000, &key);
    assert_eq!(a.status, 200, "{a}");
    tunnel.write(b"before");
    assert_eq!(tunnel.read_exact(6), b"before");
    let kept = watch_end(kept);
    let tunnel = watch_end(tunnel);

    let started = Instant::now();
    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", "w2"]);
    let returned = Instant::now();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out.stdout)["execution"]["worker"], "w2");
    // The migration installs the target, then retires the source — whose lease ends
    // every netgtw tunnel admitted for it, and with them the client connections the
    // edge bridged through them — and only then answers: by the time the command
    // returns, both connections have ended (the slack is for the edge to pass the
    // close on).
    let mut late = Vec::new();
    for (what, watcher) in [
        ("the kept-alive connection", kept),
        ("the CONNECT tunnel", tunnel),
    ] {
        match watcher.join().expect("the watcher") {
            Ok(ended) if ended <= returned + CLOSE_SLACK => {}
            Ok(ended) => late.push(format!(
                "{what} ended {:?} after the migrate command returned",
                ended.saturating_duration_since(returned)
            )),
            Err(e) => late.push(format!("{what}: {e}")),
        }
    }
    assert!(
        late.is_empty(),
        "{late:?} (the migration ran {:?})",
        returned - started
    );
    // Processes do not survive a jail migration; files and exposed ports do.
    let ports: Vec<_> = listed(&c, &id).iter().map(|p| p["port"].clone()).collect();
    assert_eq!(
        ports,
        vec![serde_json::json!(8000), serde_json::json!(9000)]
    );
    start(
        &c,
        &id,
        "/root",
        "python3 /root/http_app.py 8000 second",
        8000,
    );
    let a = get(&c, &host, "/who", &[("Authorization", &key)]);
    assert_eq!((a.status, a.text()), (200, "second".into()), "{a}");
}

/// Waits until `id` runs and its agent answers.
fn wait_running(c: &Cluster, id: &str) {
    wait_for(Duration::from_secs(90), Duration::from_millis(200), || {
        (c.sandbox(id)["state"] == "running" && c.cli(&["exec", id, "--", "true"]).status.success())
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{id} did not come back: {}", c.sandbox(id)));
}

fn execution_of(c: &Cluster, id: &str) -> serde_json::Value {
    c.sandbox(id)["execution"]["execution_id"].clone()
}

/// After a change of execution (or none), `/who` through the URL: the server started
/// with `tag` when the execution is new, the one before (`old`) when it is not.
fn served_after(c: &Cluster, id: &str, before: &serde_json::Value, old: &str, tag: &str) {
    let now = execution_of(c, id);
    let ports: Vec<_> = listed(c, id).iter().map(|p| p["port"].clone()).collect();
    assert_eq!(ports, vec![serde_json::json!(8000)], "still exposed");
    assert_eq!(
        listed(c, id)[0]["url"],
        format!("http://{}/", port_host(c, 8000, id))
    );
    // Where the execution is the same (a crash whose jail was adopted again), the
    // server before still runs, and a second one cannot take its port.
    start_app(c, id, 8000, tag);
    let want = if &now == before { old } else { tag };
    let a = who(c, id, 8000);
    assert_eq!((a.status, a.text()), (200, want.into()), "{a}");
}

#[test]
fn exposed_ports_survive_snapshot_and_resume_and_a_restart_of_the_platform() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    start_app(&c, &id, 8000, "before");
    expose(&c, &id, 8000, "http", false);
    let a = who(&c, &id, 8000);
    assert_eq!((a.status, a.text()), (200, "before".into()), "{a}");

    // Restored from the snapshot (`--worker`: not a thaw of the paused execution).
    let before = execution_of(&c, &id);
    for step in [
        &["sandbox", "snapshot", &id][..],
        &["sandbox", "resume", &id, "--worker", "w1"],
    ] {
        let out = c.cli(step);
        assert!(
            out.status.success(),
            "{step:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_ne!(execution_of(&c, &id), before, "resumed as a new execution");
    served_after(&c, &id, &before, "before", "resumed");

    // The edge's port changes with a restart (`--listen 127.0.0.1:0`); the host name
    // stays.
    let before = execution_of(&c, &id);
    c.restart();
    wait_running(&c, &id);
    served_after(&c, &id, &before, "resumed", "restarted");

    let before = execution_of(&c, &id);
    c.crash_and_restart();
    wait_running(&c, &id);
    served_after(&c, &id, &before, "restarted", "crashed");
}

/// `POST {worker}/v1/sandboxes/{id}/netgtw` for port 8000 (http) with `token`.
fn netgtw(worker_url: &str, id: &str, token: &str) -> Answer {
    let authority = worker_url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http URL: {worker_url}"));
    let addr: SocketAddr = authority.parse().expect("a worker at ip:port");
    let auth = format!("SpaceCap {token}");
    Conn::open(addr).request(
        "POST",
        &format!("/v1/sandboxes/{id}/netgtw"),
        authority,
        &[
            ("authorization", &auth),
            ("space-port", "8000"),
            ("space-protocol", "http"),
            ("upgrade", "space-netgtw"),
            ("connection", "upgrade"),
        ],
    )
}

#[test]
fn an_old_executions_service_port_capability_is_refused_after_migration() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    start_app(&c, &id, 8000, "first");
    expose(&c, &id, 8000, "http", false);
    let (status, cap) = api(
        &c,
        "POST",
        &format!("/v1/sandboxes/{id}/capabilities"),
        r#"{"access":["service_port"],"purpose":"service_port","port":8000,"protocol":"http"}"#,
    );
    assert_eq!(status, 200, "{cap}");
    assert_eq!(cap["route"]["worker"], "w1", "{cap}");
    let old = cap["route"]["worker_url"]
        .as_str()
        .expect("a URL")
        .to_owned();
    let token = cap["token"].as_str().expect("a token").to_owned();
    // While its execution serves, it opens a tunnel.
    let a = netgtw(&old, &id, &token);
    assert_eq!(a.status, 101, "{a}");

    let out = c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = netgtw(&old, &id, &token);
    assert_eq!(
        (a.status, a.error()),
        (421, "refresh_route".into()),
        "the old worker: {a}"
    );
    let (_, new) = c
        .worker_urls()
        .into_iter()
        .find(|(w, _)| w == "w2")
        .expect("w2");
    let a = netgtw(&new, &id, &token);
    assert_eq!(
        (a.status, a.error()),
        (421, "refresh_route".into()),
        "the new worker: {a}"
    );
}
