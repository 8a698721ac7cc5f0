//! The unmodified E2B SDKs — `e2b` from PyPI and from npm, installed by
//! `.ci/e2b-sdks` under `target/e2b-sdk` — against a real `space up` through its E2B
//! front: `E2B_API_URL` and `E2B_SANDBOX_URL` are the edge's URL, the key one minted
//! with `POST /v1/keys {"format": "e2b"}`. The scenarios are in `e2b/python_sdk.py`
//! and `e2b/js_sdk.mjs`; each checks what the SDK gives back. Where the SDKs are not
//! installed the tests say so and skip, unless `SPACE_REQUIRE_E2B=1` (CI) makes that
//! a failure.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use space_testkit::cluster::{Cluster, can_run_jails, http};

/// How long one SDK scenario may run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(240);

fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2b-sdk")
}

/// `what` at `path`, or `None` (a skip, said) where it is not installed.
fn installed(path: PathBuf, what: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let why = format!(
        "{what} is not installed at {} (run .ci/e2b-sdks, which fetches it from its registry)",
        path.display()
    );
    if std::env::var_os("SPACE_REQUIRE_E2B").is_some_and(|v| v == "1") {
        panic!("{why}; SPACE_REQUIRE_E2B=1 makes this a failure");
    }
    eprintln!("skipped: {why}");
    None
}

fn python() -> Option<PathBuf> {
    installed(sdk_dir().join("venv/bin/python"), "the e2b Python SDK")
}

fn node_modules() -> Option<PathBuf> {
    installed(
        sdk_dir().join("js/node_modules/e2b"),
        "the e2b JavaScript SDK",
    )
    .map(|p| p.parent().map(Path::to_path_buf).unwrap_or(p))
}

fn cluster() -> Option<Cluster> {
    if !can_run_jails() {
        eprintln!("skipped: needs root and Linux namespaces to run jails");
        return None;
    }
    Some(Cluster::start())
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

/// A key in E2B's format for the admin's tenant.
fn e2b_key(c: &Cluster) -> String {
    let (status, body) = http(
        "POST",
        &format!("{}/v1/keys", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        br#"{"format": "e2b"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let key = json(&body)["api_key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("e2b_"), "{key}");
    key
}

/// The environment an SDK process gets: the edge for both URLs, nothing else of
/// E2B's (no debug mode, no domain of E2B's).
fn sdk_command(program: &Path, c: &Cluster, key: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", &c.url)
        .env("E2B_SANDBOX_URL", &c.url)
        .env("E2B_DOMAIN", "localhost");
    cmd
}

/// Runs `scenario` of the Python script to its end: its `RESULT`.
fn python_scenario(c: &Cluster, py: &Path, key: &str, scenario: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/python_sdk.py");
    let mut cmd = sdk_command(py, c, key);
    cmd.arg(script).arg(scenario);
    finish(cmd, scenario)
}

fn finish(mut cmd: Command, scenario: &str) -> serde_json::Value {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the SDK's interpreter starts");
    let deadline = Instant::now() + SCENARIO_LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "scenario {scenario} hung; stdout: {} stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scenario {scenario} failed: stdout: {stdout} stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("scenario {scenario} printed no RESULT: {stdout}"));
    serde_json::from_str(line).expect("RESULT is JSON")
}

#[test]
fn the_python_sdk_runs_commands_streams_their_output_and_follows_background_ones() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let r = python_scenario(&c, &py, &key, "commands");
    // Killed by SIGKILL: envd's exit code for a signal.
    assert_eq!(r["killed_exit"], -1, "{r}");
    assert!(r["pid"].as_u64().unwrap() > 1, "{r}");
}

#[test]
fn the_python_sdk_reads_writes_lists_renames_removes_and_watches_files() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let r = python_scenario(&c, &py, &key, "files");
    assert_eq!(
        r["refused_as_user"],
        serde_json::json!({"read": true, "info": true, "list": true, "remove": true}),
        "{r}"
    );
    assert!(
        r["watched"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "new.txt"),
        "{r}"
    );
}

#[test]
fn the_python_sdk_opens_a_terminal_types_into_it_and_resizes_it() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    python_scenario(&c, &py, &key, "pty");
}

#[test]
fn the_python_sdk_pauses_connects_lists_sets_timeouts_and_kills() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let r = python_scenario(&c, &py, &key, "lifecycle");
    // What the SDK saw is what SPACE has: the sandbox is stopped.
    let id = r["id"].as_str().unwrap();
    assert_eq!(c.sandbox(id)["state"], "stopped");
}

#[test]
fn get_host_reaches_any_port_of_a_sandbox_and_a_private_one_needs_its_traffic_token() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let r = python_scenario(&c, &py, &key, "ports");
    let served = |what: &str, port: u16| {
        assert_eq!(r[what][0], 200, "{what}: {}", r[what]);
        assert_eq!(r[what][1], format!("served-from-{port}\n"), "{what}");
    };
    served("by_host", 8000);
    served("by_headers", 8000);
    served("private_with_token", 8080);
    // Nothing listening: the gateway says so; a killed sandbox's port is gone.
    assert_eq!(r["closed_port"], 502, "{r}");
    assert!(r["after_kill"].as_u64().is_some_and(|s| s >= 400), "{r}");
    // SPACE refuses a private port without its token with 401 (E2B says 403).
    for refused in [
        "private_without_token",
        "private_wrong_token",
        "other_sandboxs_token",
    ] {
        assert_eq!(r[refused], 401, "{refused}: {r}");
    }
}

#[test]
fn the_code_interpreter_sdk_runs_stateful_python_streams_output_and_keeps_contexts_apart() {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let r = python_scenario(&c, &py, &key, "interpreter");
    assert_eq!(r["template"], "code-interpreter-v1", "{r}");
    assert_eq!(r["metadata"], serde_json::json!({}), "{r}");
    assert_eq!(
        r["first"],
        serde_json::json!({"stdout": ["hi\n"], "stderr": ["oops\n"], "text": "42", "error": false, "count": 1}),
        "{r}"
    );
    assert_eq!(r["streamed"], serde_json::json!(["hi\n"]), "{r}");
    assert_eq!(r["kept"], "41", "{r}");
    assert_eq!(r["error"]["name"], "ValueError", "{r}");
    assert_eq!(r["error"]["value"], "bad value", "{r}");
    assert_eq!(r["error"]["traceback_names_the_cell"], true, "{r}");
    assert_eq!(r["env"], "'hello'", "{r}");
    assert_eq!(
        r["context"],
        serde_json::json!({"cwd": "'/tmp'", "separate": "False", "listed": true, "restarted": "False", "removed": true}),
        "{r}"
    );
    assert!(
        r["other_language"]
            .as_str()
            .is_some_and(|m| m.contains("python only")),
        "{r}"
    );
    assert_eq!(r["after_pause"], "41", "{r}");
    assert_eq!(r["after_restart"], "(False, 42)", "{r}");
}

/// The `moved` scenario: the SDK creates a sandbox and keeps its handle; `moving`
/// then gives the sandbox a new execution on the other worker (and answers the
/// sandbox afterwards); the SDK's old token must be refused and `connect` serve.
fn token_refused_after(moving: impl Fn(&Cluster, &str, &str) -> serde_json::Value) {
    let (Some(py), Some(c)) = (python(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/python_sdk.py");
    let mut cmd = sdk_command(&py, &c, &key);
    cmd.arg(script).arg("moved").stdin(Stdio::piped());
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let token_line = lines
        .by_ref()
        .map(|l| l.expect("a line"))
        .find(|l| l.starts_with("TOKEN "))
        .expect("the scenario created its sandbox");
    let id = json(&token_line.as_bytes()["TOKEN ".len()..])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = c.sandbox(&id);
    let old_execution = before["execution"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let from = before["execution"]["worker"].as_str().unwrap().to_owned();
    let to = if from == "w1" { "w2" } else { "w1" };
    let after = moving(&c, &id, to);
    assert_ne!(after["execution"]["execution_id"], old_execution.as_str());
    assert_eq!(after["execution"]["worker"], to, "{after}");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap_or_default()).collect();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "stdout: {rest:?} stderr: {stderr}");
    let result = rest
        .iter()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a RESULT");
    let r: serde_json::Value = serde_json::from_str(result).unwrap();
    assert!(
        r["refused"].as_str().unwrap().contains("new execution"),
        "the refusal says why: {r}"
    );
}

/// `POST /v1/sandboxes/{id}/{what}` with the admin key: the answer, which must be 200.
fn admin_post(c: &Cluster, id: &str, what: &str, body: &str) -> serde_json::Value {
    let (status, answer) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/{what}", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{what}: {}", String::from_utf8_lossy(&answer));
    json(&answer)
}

#[test]
fn a_token_from_before_a_move_to_another_worker_is_refused_and_connect_gives_a_new_one() {
    token_refused_after(|c, id, to| {
        admin_post(c, id, "migrate", &format!(r#"{{"worker": "{to}"}}"#))
    });
}

#[test]
fn a_token_from_before_a_resume_on_another_worker_is_refused_and_connect_gives_a_new_one() {
    token_refused_after(|c, id, to| {
        // A snapshot the control plane keeps, then a resume from it on the other
        // worker: a new execution there.
        admin_post(c, id, "snapshot", "");
        admin_post(c, id, "resume", &format!(r#"{{"worker": "{to}"}}"#))
    });
}

#[test]
fn the_javascript_sdk_runs_the_calls_it_shares_with_the_python_one() {
    let (Some(modules), Some(c)) = (node_modules(), cluster()) else {
        return;
    };
    let key = e2b_key(&c);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/js_sdk.mjs");
    // The script runs from a copy beside the SDK's node_modules, where `import 'e2b'`
    // resolves.
    let dir = modules.parent().expect("the SDK's directory").to_path_buf();
    let copy = dir.join(format!("scenario-{}.mjs", std::process::id()));
    std::fs::copy(&script, &copy).expect("copy the scenario");
    let mut cmd = sdk_command(Path::new("node"), &c, &key);
    cmd.arg(&copy).current_dir(&dir);
    let r = finish(cmd, "js");
    let _ = std::fs::remove_file(&copy);
    assert_eq!(c.sandbox(r["id"].as_str().unwrap())["state"], "stopped");
}

fn refs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// One raw call to the front: status and JSON body.
fn raw(
    c: &Cluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, serde_json::Value) {
    let mut h = headers.to_vec();
    if !h
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        h.push(("content-type", "application/json"));
    }
    let client = space_http::HttpClient::new(Duration::from_secs(30));
    let url = format!("{}{path}", c.url);
    let a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(client.call(
            method.parse().unwrap(),
            &url,
            &h,
            bytes::Bytes::copy_from_slice(body),
        ))
        .expect("answered");
    let v = if a.body.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&a.body).unwrap_or_else(|_| {
            panic!(
                "{method} {path}: not JSON: {}",
                String::from_utf8_lossy(&a.body)
            )
        })
    };
    (a.status.as_u16(), v)
}

#[test]
fn bad_input_gets_e2b_shaped_errors_never_a_panic_or_a_500() {
    let Some(c) = cluster() else {
        return;
    };
    // A key from the CLI (`space keys create --e2b`) is one the front takes.
    let out = c.cli(&["keys", "create", "--e2b"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("e2b_") && key.len() == 64, "{key}");
    let k = [("x-api-key", key.as_str())];
    // REST: E2B's {"code": <status>, "message"}.
    let (s, v) = raw(
        &c,
        "GET",
        "/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa",
        &k,
        b"",
    );
    assert_eq!((s, v["code"].as_u64()), (404, Some(404)), "{v}");
    let (s, v) = raw(&c, "GET", "/sandboxes/not-an-id", &k, b"");
    assert_eq!((s, v["code"].as_u64()), (404, Some(404)), "{v}");
    let (s, v) = raw(
        &c,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", "e2b_0000")],
        b"{}",
    );
    assert_eq!((s, v["code"].as_u64()), (401, Some(401)), "{v}");
    let (s, v) = raw(&c, "POST", "/v2/sandboxes", &[], b"{}");
    assert_eq!((s, v["code"].as_u64()), (401, Some(401)), "{v}");
    let (s, v) = raw(&c, "POST", "/v2/sandboxes", &k, b"{not json");
    assert_eq!((s, v["code"].as_u64()), (400, Some(400)), "{v}");
    assert!(v["message"].as_str().unwrap().contains("JSON"), "{v}");
    let (s, v) = raw(
        &c,
        "POST",
        "/v2/sandboxes",
        &k,
        br#"{"templateID": "no-such-template"}"#,
    );
    assert_eq!((s, v["code"].as_u64()), (400, Some(400)), "{v}");
    let (s, v) = raw(&c, "POST", "/v2/sandboxes", &k, br#"{"timeout": 0}"#);
    assert_eq!((s, v["code"].as_u64()), (400, Some(400)), "{v}");
    // A real sandbox, for envd's errors.
    let (s, created) = raw(
        &c,
        "POST",
        "/v2/sandboxes",
        &k,
        br#"{"templateID": "base"}"#,
    );
    assert_eq!(s, 201, "{created}");
    let id = created["sandboxID"].as_str().unwrap();
    let token = created["envdAccessToken"].as_str().unwrap();
    let envd = |t: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("e2b-sandbox-id", id.to_owned()),
            ("e2b-sandbox-port", "49983".into()),
            ("x-access-token", t.to_owned()),
        ]
    };
    let good = vec![
        ("e2b-sandbox-id", id.to_owned()),
        ("e2b-sandbox-port", "49983".to_owned()),
        ("x-access-token", token.to_owned()),
    ];
    // Connect-RPC: {"code": "<name>", "message"} with the protocol's status.
    let (s, v) = raw(
        &c,
        "POST",
        "/filesystem.Filesystem/Stat",
        &refs(&envd("sxt1.forged.AAAA")),
        br#"{"path": "/"}"#,
    );
    assert_eq!(
        (s, v["code"].as_str()),
        (401, Some("unauthenticated")),
        "{v}"
    );
    let (s, v) = raw(
        &c,
        "POST",
        "/filesystem.Filesystem/Stat",
        &refs(&good),
        br#"{"path": "/nope/none"}"#,
    );
    assert_eq!((s, v["code"].as_str()), (404, Some("not_found")), "{v}");
    let (s, v) = raw(
        &c,
        "POST",
        "/filesystem.Filesystem/Stat",
        &refs(&good),
        b"[1,2",
    );
    assert_eq!(
        (s, v["code"].as_str()),
        (400, Some("invalid_argument")),
        "{v}"
    );
    let (s, v) = raw(
        &c,
        "POST",
        "/filesystem.Filesystem/NoSuchMethod",
        &refs(&good),
        b"{}",
    );
    assert_eq!((s, v["code"].as_str()), (501, Some("unimplemented")), "{v}");
    let (s, v) = raw(
        &c,
        "POST",
        "/process.Process/SendSignal",
        &refs(&good),
        br#"{"process": {"pid": 4242}, "signal": "SIGNAL_SIGKILL"}"#,
    );
    assert_eq!((s, v["code"].as_str()), (404, Some("not_found")), "{v}");
    // A token of another sandbox routed to this one.
    let (s, other) = raw(&c, "POST", "/v2/sandboxes", &k, b"{}");
    assert_eq!(s, 201, "{other}");
    let mut crossed = good.clone();
    crossed[2].1 = other["envdAccessToken"].as_str().unwrap().to_owned();
    let (s, v) = raw(
        &c,
        "POST",
        "/filesystem.Filesystem/Stat",
        &refs(&crossed),
        br#"{"path": "/"}"#,
    );
    assert_eq!(
        (s, v["code"].as_str()),
        (401, Some("unauthenticated")),
        "{v}"
    );
    // envd HTTP: {"code": <status>, "message"}.
    let (s, v) = raw(&c, "GET", "/files?path=/nope/none", &refs(&good), b"");
    assert_eq!((s, v["code"].as_u64()), (404, Some(404)), "{v}");
    let (s, v) = raw(
        &c,
        "POST",
        "/files?path=/tmp/x",
        &[
            refs(&good),
            vec![("content-type", "multipart/form-data; boundary=zz")],
        ]
        .concat(),
        b"garbage",
    );
    assert_eq!((s, v["code"].as_u64()), (400, Some(400)), "{v}");
}

/// One answer read off a raw HTTP/1.1 connection: status and body (by its
/// `content-length`, or its chunks).
fn read_answer(r: &mut BufReader<std::net::TcpStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
        chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).map_err(std::io::Error::other)?;
            let mut chunk = vec![0; n + 2];
            std::io::Read::read_exact(r, &mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let mut b = vec![0; length.unwrap_or(0)];
        std::io::Read::read_exact(r, &mut b)?;
        body = b;
    }
    Ok((status, body))
}

/// A call refused before its body is read (a token that does not serve) while the
/// client is still sending that body: the refusal must reach the client, and the
/// connection stay usable. Answered with the body unread, the server closed the
/// connection under the client's writes, and the SDK saw a broken pipe instead of
/// the refusal that tells it to reconnect (a failure of the token test on a stale
/// token's `commands.run`).
#[test]
fn a_refused_call_whose_body_is_still_arriving_gets_its_refusal_on_a_connection_that_stays_open() {
    let Some(c) = cluster() else {
        return;
    };
    let addr = c
        .url
        .strip_prefix("http://")
        .expect("an http URL")
        .to_owned();
    let conn = std::net::TcpStream::connect(&addr).expect("connect to the edge");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    let id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    // A Start request's one message, in its 5-byte frame.
    let message = br#"{"process": {"cmd": "true"}}"#;
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    // Two Start calls on one connection, then an upload (refused as early).
    let rounds: [(&str, &str, &[u8]); 3] = [
        ("/process.Process/Start", "application/connect+json", &frame),
        ("/process.Process/Start", "application/connect+json", &frame),
        (
            "/files?path=/root/x",
            "application/octet-stream",
            &[7u8; 100_000],
        ),
    ];
    for (round, (path, content_type, body)) in rounds.into_iter().enumerate() {
        write!(
            w,
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ne2b-sandbox-id: {id}\r\n\
             e2b-sandbox-port: 49983\r\nx-access-token: not-a-token\r\n\
             content-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        // The headers and a little, then the rest a while later, as a client
        // streaming its body.
        w.write_all(&body[..3]).unwrap();
        w.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        w.write_all(&body[3..])
            .unwrap_or_else(|e| panic!("round {round}: the body could not be sent: {e}"));
        let (status, body) = read_answer(&mut r)
            .unwrap_or_else(|e| panic!("round {round}: no answer to a refused call: {e}"));
        let text = String::from_utf8_lossy(&body);
        let refused = if path.starts_with("/files") {
            status == 401
        } else {
            status == 200 && text.contains("unauthenticated")
        };
        assert!(refused, "round {round}: {status} {text}");
    }
}
