//! What an E2B-style front needs of a worker, against a real `space up` (issue 17):
//! the streaming exec's `started` message with the pid, a PTY of a given size that a
//! resize changes, signals by message (and a bad one refused); `stat`, `mkdir` and
//! `rename` of paths, and listings with modes, owners, groups, times and link targets
//! — through the edge, and at the worker with a capability of the access each needs.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn started() -> Option<(Cluster, String)> {
    if !can_run_jails() {
        return None;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    Some((c, id))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An HTTP call through the edge with the admin key: the whole answer.
fn call(c: &Cluster, method: &str, pq: &str, body: &[u8]) -> space_http::Answer {
    call_as(&c.url, &format!("Bearer {}", c.admin_key), method, pq, body)
}

fn call_as(base: &str, auth: &str, method: &str, pq: &str, body: &[u8]) -> space_http::Answer {
    let headers = [
        ("content-type", "application/json"),
        ("authorization", auth),
    ];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(space_http::HttpClient::new(Duration::from_secs(60)).call(
            method.parse().unwrap(),
            &format!("{base}{pq}"),
            &headers,
            bytes::Bytes::copy_from_slice(body),
        ))
        .expect("the call is answered")
}

fn json_of(a: &space_http::Answer) -> Value {
    serde_json::from_slice(&a.body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&a.body)))
}

/// Runs `script` in the sandbox (through the CLI); panics unless it succeeds.
fn sh(c: &Cluster, id: &str, script: &str) {
    let out = c.cli(&["exec", id, "--", "sh", "-c", script]);
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The streaming exec of sandbox `id` through the edge, its request sent.
async fn exec_stream(c: &Cluster, id: &str, request: Value) -> Socket {
    let mut req = format!(
        "{}/v1/sandboxes/{id}/exec/stream",
        c.url.replacen("http", "ws", 1)
    )
    .into_client_request()
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", c.admin_key).parse().unwrap(),
    );
    let mut s = tokio_tungstenite::connect_async(req).await.unwrap().0;
    s.send(Message::Text(request.to_string().into()))
        .await
        .unwrap();
    s
}

/// The next message that is not a ping or pong, within 15 s.
async fn next(s: &mut Socket) -> Message {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(15), s.next())
            .await
            .expect("timed out waiting for a message")
            .expect("stream ended")
            .expect("stream error");
        if !matches!(m, Message::Ping(_) | Message::Pong(_)) {
            return m;
        }
    }
}

/// The pid of the `started` message `m`.
fn started_pid(m: &Message) -> u64 {
    let Message::Text(t) = m else {
        panic!("expected the started message first, got {m:?}")
    };
    let v: Value = serde_json::from_str(t.as_str()).unwrap();
    assert_eq!(v["type"], "started", "{v}");
    v["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {v}"))
}

/// Reads until the close; returns the stdout (tag 1) and stderr (tag 2) seen, and
/// the close frame's code and reason.
async fn drain(s: &mut Socket) -> (String, String, u16, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match next(s).await {
            Message::Binary(b) if b.first() == Some(&1) => out.extend_from_slice(&b[1..]),
            Message::Binary(b) if b.first() == Some(&2) => err.extend_from_slice(&b[1..]),
            Message::Close(Some(f)) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    String::from_utf8_lossy(&err).into_owned(),
                    f.code.into(),
                    f.reason.as_str().to_owned(),
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_streamed_exec_says_started_with_the_pid_its_shell_sees_before_any_output() {
    let Some((c, id)) = started() else { return };
    runtime().block_on(async {
        let mut s = exec_stream(&c, &id, json!({"cmd": ["sh", "-c", "echo $$; echo e >&2"]})).await;
        let pid = started_pid(&next(&mut s).await);
        let (out, err, code, reason) = drain(&mut s).await;
        assert_eq!(out, format!("{pid}\n"));
        assert_eq!(err, "e\n");
        assert_eq!((code, reason.as_str()), (1000, "exited 0"));
    });
}

#[test]
fn a_pty_exec_has_the_size_asked_for_merges_stderr_and_a_resize_changes_it() {
    let Some((c, id)) = started() else { return };
    runtime().block_on(async {
        let request = json!({
            "cmd": ["sh", "-c", "stty size; echo to-stderr >&2; read x; stty size"],
            "pty": {"rows": 30, "cols": 100},
        });
        let mut s = exec_stream(&c, &id, request).await;
        started_pid(&next(&mut s).await);
        let mut seen = String::new();
        while !(seen.contains("30 100") && seen.contains("to-stderr")) {
            match next(&mut s).await {
                // Under a PTY everything is the terminal's output: tag 1.
                Message::Binary(b) => {
                    assert_eq!(b.first(), Some(&1), "{b:?}");
                    seen.push_str(&String::from_utf8_lossy(&b[1..]));
                }
                other => panic!("unexpected {other:?} after {seen:?}"),
            }
        }
        s.send(Message::Text(r#"{"rows":40,"cols":120}"#.into()))
            .await
            .unwrap();
        s.send(Message::Binary(b"\n".to_vec().into()))
            .await
            .unwrap();
        let (out, err, code, reason) = drain(&mut s).await;
        assert!(out.contains("40 120"), "{out:?}");
        assert_eq!(err, "");
        assert_eq!((code, reason.as_str()), (1000, "exited 0"));
    });
}

#[test]
fn a_signal_message_ends_the_command_with_that_signal() {
    let Some((c, id)) = started() else { return };
    runtime().block_on(async {
        let mut s = exec_stream(&c, &id, json!({"cmd": ["sleep", "60"]})).await;
        started_pid(&next(&mut s).await);
        let sent = Instant::now();
        s.send(Message::Text(r#"{"signal":15}"#.into()))
            .await
            .unwrap();
        let (_, _, code, reason) = drain(&mut s).await;
        assert_eq!((code, reason.as_str()), (1000, "killed by signal 15"));
        assert!(sent.elapsed() < Duration::from_secs(10));
    });
}

#[test]
fn an_invalid_signal_closes_the_stream_with_4000_and_ends_the_command() {
    let Some((c, id)) = started() else { return };
    let pid = runtime().block_on(async {
        // The pid the started message gives is the one the command has in the
        // sandbox (a_streamed_exec_says_started_with_the_pid_its_shell_sees…); a
        // pid the shell wrote to a file would race the signal (the command may end
        // before it writes it, and `kill -0` of nothing is a usage error, not 1).
        let mut s = exec_stream(&c, &id, json!({"cmd": ["sleep", "60"]})).await;
        let pid = started_pid(&next(&mut s).await);
        s.send(Message::Text(r#"{"signal":99}"#.into()))
            .await
            .unwrap();
        let (_, _, code, reason) = drain(&mut s).await;
        assert_eq!((code, reason.as_str()), (4000, "invalid signal 99"));
        pid
    });
    // The stream's end ended its command.
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = format!("kill -0 {pid}");
    loop {
        let out = c.cli(&["exec", &id, "--", "sh", "-c", &probe]);
        if out.status.code() == Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the command outlived its stream");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_plain_exec_with_a_pty_is_refused_400_and_runs_nothing() {
    let Some((c, id)) = started() else { return };
    let body = json!({"cmd": ["touch", "/root/ran"], "pty": {"rows": 24, "cols": 80}});
    let a = call(
        &c,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        body.to_string().as_bytes(),
    );
    assert_eq!(
        a.status.as_u16(),
        400,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let v = json_of(&a);
    assert_eq!(v["error"], "bad_request");
    assert_eq!(v["message"], "pty is only for the streaming exec");
    let a = call(
        &c,
        "GET",
        &format!("/v1/sandboxes/{id}/files/stat?path=/root/ran"),
        b"",
    );
    assert_eq!(a.status.as_u16(), 404);
}

#[test]
fn stat_describes_a_file_a_directory_and_a_symlink_without_following_it() {
    let Some((c, id)) = started() else { return };
    sh(
        &c,
        &id,
        "mkdir -p /root/s/d && printf hello > /root/s/f && chmod 640 /root/s/f \
         && ln -s /root/s/f /root/s/l && touch -d @1700000000.123456789 /root/s/f",
    );
    let stat = |path: &str| {
        call(
            &c,
            "GET",
            &format!("/v1/sandboxes/{id}/files/stat?path={path}"),
            b"",
        )
    };

    let a = stat("/root/s/f");
    assert_eq!(
        a.status.as_u16(),
        200,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    assert!(a.headers.get("space-execution").is_some());
    assert_eq!(
        json_of(&a),
        json!({
            "name": "f", "path": "/root/s/f", "kind": "file", "size": 5, "mode": 0o640,
            "uid": 0, "gid": 0, "owner": "root", "group": "root",
            "modified": "2023-11-14T22:13:20.123456789Z",
        })
    );
    assert_eq!(json_of(&stat("/root/s/d"))["kind"], "dir");
    // A final symlink is described, not followed.
    let l = json_of(&stat("/root/s/l"));
    assert_eq!(l["kind"], "symlink");
    assert_eq!(l["symlink_target"], "/root/s/f");
    assert_eq!(l["size"], "/root/s/f".len());
    // A relative path is the agent's home's.
    assert_eq!(json_of(&stat("s/f"))["path"], "/root/s/f");

    // Names are the sandbox's own: uid 1000 is `user` there (whatever the host calls
    // it).
    let put = call(
        &c,
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/home/user/mine&user=user"),
        b"x",
    );
    assert_eq!(put.status.as_u16(), 204);
    let mine = json_of(&stat("/home/user/mine"));
    assert_eq!(
        (&mine["uid"], &mine["owner"], &mine["gid"], &mine["group"]),
        (&json!(1000), &json!("user"), &json!(1000), &json!("user"))
    );

    let missing = stat("/root/s/nothing");
    assert_eq!(missing.status.as_u16(), 404);
    assert_eq!(json_of(&missing)["error"], "not_found");
}

#[test]
fn mkdir_makes_a_directory_once_says_so_and_refuses_a_file_in_the_way() {
    let Some((c, id)) = started() else { return };
    let mkdir = |q: &str| {
        call(
            &c,
            "POST",
            &format!("/v1/sandboxes/{id}/files/mkdir?{q}"),
            b"",
        )
    };

    let a = mkdir("path=/root/new/deep");
    assert_eq!(
        a.status.as_u16(),
        201,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    assert!(a.headers.get("space-execution").is_some());
    assert_eq!(json_of(&a), json!({"created": true}));
    let a = mkdir("path=/root/new/deep");
    assert_eq!(a.status.as_u16(), 200);
    assert_eq!(json_of(&a), json!({"created": false}));

    sh(&c, &id, "printf x > /root/file");
    let a = mkdir("path=/root/file");
    assert_eq!(a.status.as_u16(), 409);
    assert_eq!(json_of(&a)["error"], "already_exists");

    // As an account: its own, and its permissions apply.
    let a = mkdir("path=/home/user/made/here&user=user");
    assert_eq!(a.status.as_u16(), 201);
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "stat",
        "-c",
        "%u %a",
        "/home/user/made",
        "/home/user/made/here",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1000 755\n1000 755\n");
    let a = mkdir("path=/root/not-for-user&user=user");
    assert_eq!(a.status.as_u16(), 403);
    assert_eq!(json_of(&a)["error"], "permission_denied");
    let a = mkdir("path=/root/x&user=nobody-here");
    assert_eq!(a.status.as_u16(), 400);
}

#[test]
fn rename_moves_a_path_and_a_missing_one_is_404() {
    let Some((c, id)) = started() else { return };
    sh(&c, &id, "mkdir -p /root/r && printf moved > /root/r/a");
    let rename = |body: Value| {
        call(
            &c,
            "POST",
            &format!("/v1/sandboxes/{id}/files/rename"),
            body.to_string().as_bytes(),
        )
    };
    let a = rename(json!({"from": "/root/r/a", "to": "/root/r/b"}));
    assert_eq!(
        a.status.as_u16(),
        204,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    assert!(a.headers.get("space-execution").is_some());
    let read = call(
        &c,
        "GET",
        &format!("/v1/sandboxes/{id}/files?path=/root/r/b"),
        b"",
    );
    assert_eq!(&read.body[..], b"moved");

    let a = rename(json!({"from": "/root/r/a", "to": "/root/r/c"}));
    assert_eq!(a.status.as_u16(), 404);
    assert_eq!(json_of(&a)["error"], "not_found");
    let a = rename(json!({"from": "", "to": "/root/r/c"}));
    assert_eq!(a.status.as_u16(), 400);
    let a = rename(json!({"from": "/root/r/b"}));
    assert_eq!(a.status.as_u16(), 400);
}

#[test]
fn list_entries_carry_mode_owner_group_time_and_link_target() {
    let Some((c, id)) = started() else { return };
    sh(
        &c,
        &id,
        "mkdir -p /root/ls/sub && printf abc > /root/ls/f && chmod 600 /root/ls/f \
         && touch -d @1700000000.5 /root/ls/f && ln -s f /root/ls/link",
    );
    let a = call(
        &c,
        "GET",
        &format!("/v1/sandboxes/{id}/files/list?path=/root/ls"),
        b"",
    );
    assert_eq!(
        a.status.as_u16(),
        200,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let mut entries: Vec<Value> = serde_json::from_slice(&a.body).unwrap();
    entries.sort_by_key(|e| e["name"].as_str().unwrap().to_owned());
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f", "link", "sub"]);
    assert_eq!(
        entries[0],
        json!({
            "name": "f", "kind": "file", "size": 3, "mode": 0o600, "uid": 0, "gid": 0,
            "owner": "root", "group": "root", "modified": "2023-11-14T22:13:20.500000000Z",
        })
    );
    assert_eq!(entries[1]["kind"], "symlink");
    assert_eq!(entries[1]["symlink_target"], "f");
    assert_eq!(entries[2]["kind"], "dir");
    assert!(entries[2].get("symlink_target").is_none());
}

#[test]
fn at_the_worker_stat_needs_fs_read_and_mkdir_and_rename_need_fs_write() {
    let Some((c, id)) = started() else { return };
    let capability = |access: &[&str]| {
        let body = json!({"access": access, "purpose": "control"}).to_string();
        let a = call(
            &c,
            "POST",
            &format!("/v1/sandboxes/{id}/capabilities"),
            body.as_bytes(),
        );
        assert_eq!(
            a.status.as_u16(),
            200,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
        let cap = json_of(&a);
        (
            cap["route"]["worker_url"].as_str().unwrap().to_owned(),
            format!("SpaceCap {}", cap["token"].as_str().unwrap()),
        )
    };
    let (worker, read) = capability(&["fs_read"]);
    let (_, write) = capability(&["fs_write"]);
    let at = |auth: &str, method: &str, pq: &str, body: &[u8]| {
        call_as(
            &worker,
            auth,
            method,
            &format!("/v1/sandboxes/{id}{pq}"),
            body,
        )
    };
    let rename = br#"{"from":"/root/a","to":"/root/b"}"#;

    // fs_read describes, but neither makes nor renames.
    assert_eq!(
        at(&read, "GET", "/files/stat?path=/root", b"")
            .status
            .as_u16(),
        200
    );
    for (pq, body) in [
        ("/files/mkdir?path=/root/a", &b""[..]),
        ("/files/rename", rename),
    ] {
        let a = at(&read, "POST", pq, body);
        assert_eq!(a.status.as_u16(), 403, "{pq}");
        assert_eq!(json_of(&a)["reason"], "access_denied", "{pq}");
    }
    // fs_write makes and renames, but does not describe.
    assert_eq!(
        at(&write, "POST", "/files/mkdir?path=/root/a", b"")
            .status
            .as_u16(),
        201
    );
    assert_eq!(
        at(&write, "POST", "/files/rename", rename).status.as_u16(),
        204
    );
    let a = at(&write, "GET", "/files/stat?path=/root/b", b"");
    assert_eq!(a.status.as_u16(), 403);
    assert_eq!(json_of(&a)["reason"], "access_denied");
}
