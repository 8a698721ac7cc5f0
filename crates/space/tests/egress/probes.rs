//! What a sandbox of the egress tests runs — a script, `curl`, a line over TCP, a name
//! lookup, a DNS question sent by hand, a look at its routes and address — and what
//! the platform says of it afterwards: its refusal events (an API call at the edge)
//! and its counters in the worker's metrics.

use serde_json::Value;
use space_testkit::cluster::{Cluster, http};

/// How long a refused connection may take to fail: the client's own timeout.
pub const CONNECT_TIMEOUT_SECS: u32 = 3;

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// An API call at the edge with the admin key.
pub fn api(c: &Cluster, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = http(
        method,
        &format!("{}{path}", c.url),
        Some(&bearer(&c.admin_key)),
        body.as_bytes(),
    );
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, value)
}

/// `sh -c script` in the sandbox: its exit code, stdout and stderr.
pub fn run(c: &Cluster, id: &str, script: &str) -> (i32, String, String) {
    let out = c.cli(&["exec", id, "--", "sh", "-c", script]);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sh -c script` that must succeed: its stdout.
pub fn sh(c: &Cluster, id: &str, script: &str) -> String {
    let (code, out, err) = run(c, id, script);
    assert_eq!(code, 0, "{script}: {out}{err}");
    out
}

/// What one `curl` in a sandbox did.
#[derive(Debug)]
pub struct Curl {
    /// curl's exit code (0, 6 = could not resolve, 7 = could not connect, 28 =
    /// timeout, 35 / 56 = TLS or receive failure, …).
    pub exit: i32,
    /// The HTTP status (0 without an answer).
    pub status: u16,
    pub body: String,
    pub stderr: String,
}

impl std::fmt::Display for Curl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "curl exit {} status {} body {:?} stderr {:?}",
            self.exit, self.status, self.body, self.stderr
        )
    }
}

/// `curl args` in the sandbox (args are the test's own, not quoted further).
pub fn curl(c: &Cluster, id: &str, args: &str) -> Curl {
    let script = format!(
        "curl -sS --connect-timeout {CONNECT_TIMEOUT_SECS} --max-time 10 -w '\\n%{{http_code}}' \
         {args} 2>/tmp/curl.err; echo \" $?\"; cat /tmp/curl.err >&2"
    );
    let (code, out, err) = run(c, id, &script);
    assert_eq!(code, 0, "{script}: {out}{err}");
    let (body, tail) = out
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("no status line from curl: {out:?} {err}"));
    let (status, exit) = tail
        .split_once(' ')
        .unwrap_or_else(|| panic!("no exit code from curl: {out:?}"));
    Curl {
        exit: exit.trim().parse().expect("curl's exit code"),
        status: status.trim().parse().expect("curl's status"),
        body: body.to_owned(),
        stderr: err,
    }
}

/// `curl` that must be answered 200 by test host `name`.
pub fn reached(c: &Cluster, id: &str, args: &str, name: &str) {
    let got = curl(c, id, args);
    assert_eq!(
        (got.exit, got.status, got.body.trim_end()),
        (0, 200, name),
        "{args}: {got}"
    );
}

/// `curl` that the platform's proxy must answer 403 with a body naming `rule`.
pub fn forbidden(c: &Cluster, id: &str, args: &str, rule: &str) {
    let got = curl(c, id, args);
    assert_eq!(got.status, 403, "{args}: {got}");
    assert!(
        got.body.starts_with("space egress: ") && got.body.contains(rule),
        "{args}: the refusal does not name {rule:?}: {got}"
    );
}

/// A line to `addr:port` from the sandbox (the test hosts' echo answers
/// `<name> hello`): the answer, or why not.
pub fn tcp(
    c: &Cluster,
    id: &str,
    addr: impl std::fmt::Display,
    port: u16,
) -> Result<String, String> {
    let script = format!(
        "python3 -c \"import socket\ns = socket.create_connection(('{addr}', {port}), \
         timeout={CONNECT_TIMEOUT_SECS})\ns.settimeout({CONNECT_TIMEOUT_SECS})\n\
         s.sendall(b'hello\\n')\nprint(s.makefile().readline().strip())\""
    );
    let (code, out, err) = run(c, id, &script);
    if code == 0 {
        Ok(out.trim().to_owned())
    } else {
        Err(format!("exit {code}: {}", err.trim()))
    }
}

/// `getent hosts name` in the sandbox: the address, or `None` when it fails.
pub fn getent(c: &Cluster, id: &str, name: &str) -> Option<String> {
    let (code, out, _) = run(c, id, &format!("getent hosts {name}"));
    (code == 0).then(|| out.split_whitespace().next().unwrap_or("").to_owned())
}

/// A DNS question for `name` (type A) sent from the sandbox to `server:53` by hand:
/// `(rcode, answer count)`, or why no answer came.
pub fn dig(c: &Cluster, id: &str, name: &str, server: &str) -> Result<(u8, u16), String> {
    let script = format!(
        "python3 -c \"import socket, struct\n\
         q = struct.pack('>HHHHHH', 4660, 256, 1, 0, 0, 0)\n\
         q += b''.join(bytes([len(l)]) + l.encode() for l in '{name}'.split('.')) + b'\\0'\n\
         q += struct.pack('>HH', 1, 1)\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.settimeout({CONNECT_TIMEOUT_SECS})\n\
         s.sendto(q, ('{server}', 53))\n\
         r = s.recv(512)\n\
         print(r[3] & 15, struct.unpack('>H', r[6:8])[0])\""
    );
    let (code, out, err) = run(c, id, &script);
    if code != 0 {
        return Err(format!("exit {code}: {}", err.trim()));
    }
    let mut words = out.split_whitespace();
    let rcode = words.next().and_then(|w| w.parse().ok());
    let count = words.next().and_then(|w| w.parse().ok());
    rcode.zip(count).ok_or(format!("unexpected output {out:?}"))
}

/// The sandbox's default gateway (the host side of its link).
pub fn gateway(c: &Cluster, id: &str) -> String {
    let routes = sh(c, id, "ip -4 route show default");
    routes
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .unwrap_or_else(|| panic!("no default route in the sandbox: {routes:?}"))
        .to_owned()
}

/// The sandbox's own address on `eth0`.
pub fn own_addr(c: &Cluster, id: &str) -> String {
    let line = sh(c, id, "ip -4 -o addr show dev eth0");
    line.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("no address on eth0: {line:?}"))
        .to_owned()
}

/// `GET /v1/sandboxes/{id}/events` at the edge: the refusals, newest first.
pub fn events(c: &Cluster, id: &str) -> Vec<Value> {
    let path = format!("/v1/sandboxes/{id}/events");
    let (status, body) = api(c, "GET", &path, "");
    assert_eq!(status, 200, "events at the edge: {body}");
    body["events"].as_array().cloned().unwrap_or_default()
}

/// Asserts that the sandbox's events hold a `network_refused` of `target` by `via`
/// whose rule contains `rule`.
pub fn refused_event(c: &Cluster, id: &str, via: &str, target: &str, rule: &str) {
    let list = events(c, id);
    assert!(
        list.iter().any(|e| e["kind"] == "network_refused"
            && e["via"] == via
            && e["target"].as_str().is_some_and(|t| t.contains(target))
            && e["rule"].as_str().is_some_and(|r| r.contains(rule))),
        "no refusal of {target} by {via} under {rule:?} in {list:?}"
    );
}

/// The sum of worker `worker`'s samples of `name` for sandbox `id` whose labels also
/// contain `more`.
pub fn egress_metric(c: &Cluster, worker: &str, name: &str, id: &str, more: &str) -> f64 {
    let (_, url) = c
        .worker_urls()
        .into_iter()
        .find(|(w, _)| w == worker)
        .unwrap_or_else(|| panic!("no worker {worker}"));
    let (status, body) = http("GET", &format!("{url}/metrics"), None, b"");
    assert_eq!(status, 200);
    let sandbox = format!("sandbox=\"{id}\"");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&sandbox) && l.contains(more))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
