//! P10: HTTP and TCP to servers in a sandbox through edge + netgtw, against the same
//! load client run inside the sandbox's network namespace (`nsenter --net`) straight
//! to the same servers, in one run.
//!
//! The servers are this executable's (`space bench serve http|tcp`, uploaded into the
//! sandbox and started detached), fast enough that the platform's path is what is
//! measured; python's `http.server` (one connection per request: it speaks HTTP/1.0)
//! is measured alongside as information. The load client is `space bench load` (see
//! [`load`]) in a process of its own on both paths: the proxied run from the host to
//! the edge with the owner's API key on a private port, the direct one connecting to
//! `127.0.0.1:PORT` inside the namespace.

pub mod load;
pub mod serve;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::de::DeserializeOwned;
use space_identity::{Protocol, SandboxId};
use space_proto::api::ports::ExposePort;
use space_proto::api::{CreateSandbox, LimitsRequest};
use tokio::process::Command;

use super::platform::Platform;
use super::row::Row;
use load::{HttpReport, KEY_ENV, TcpReport};

/// The bench HTTP server's port inside the sandbox.
const HTTP_PORT: u16 = 8080;
/// python's `http.server` port.
const PYTHON_PORT: u16 = 8081;
/// The sink's port.
const TCP_PORT: u16 = 9090;
/// MiB pushed through each TCP path.
const TCP_MIB: u64 = 256;
/// Where the servers' files live in the sandbox.
const DIR: &str = "/root/p10";
/// Where this executable is uploaded (the directory must exist before a put).
const EXE: &str = "/root/space-bench";
/// Longest one load client may run.
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Why this host cannot run P10, if it cannot: jails and `nsenter --net` need root.
fn missing_requirement() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (jails; nsenter into the sandbox's network namespace)".into());
    }
    if nsenter().is_none() {
        return Some("needs nsenter (util-linux) for the direct baseline".into());
    }
    None
}

fn nsenter() -> Option<&'static str> {
    ["/usr/bin/nsenter", "/bin/nsenter", "/usr/sbin/nsenter"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn token() -> String {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The shell script that starts the three servers detached (their own sessions,
/// standard streams on files, so the exec that starts them ends) and waits until
/// each listens.
fn start_script(token: &str) -> String {
    format!(
        r#"set -e
mkdir -p {DIR}/www
chmod 0755 {EXE}
printf 'hello, world\n' > {DIR}/www/hello.txt
cd {DIR}/www
setsid {EXE} bench serve http --listen 127.0.0.1:{HTTP_PORT} --ready {DIR}/http-{token}.ready </dev/null >{DIR}/http.log 2>&1 &
setsid {EXE} bench serve tcp --listen 127.0.0.1:{TCP_PORT} --ready {DIR}/tcp-{token}.ready </dev/null >{DIR}/tcp.log 2>&1 &
setsid python3 -m http.server {PYTHON_PORT} --bind 127.0.0.1 --directory {DIR}/www </dev/null >{DIR}/python.log 2>&1 &
i=0
while [ ! -e {DIR}/http-{token}.ready ] || [ ! -e {DIR}/tcp-{token}.ready ]; do
  i=$((i+1))
  if [ $i -gt 200 ]; then cat {DIR}/*.log >&2; echo "the bench servers did not listen within 10 s" >&2; exit 1; fi
  sleep 0.05
done
python3 -c '
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", {PYTHON_PORT}), 1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit("python http.server did not listen within 10 s")
'
"#
    )
}

/// The host PID of the process whose arguments include `serve` and `ready` (the
/// bench server started with that ready file).
fn server_pid(ready: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let mut args = raw.split(|b| *b == 0);
        if args.clone().any(|a| a == b"serve") && args.any(|a| a == ready.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Runs `space bench load ARGS` (inside the network namespace of `netns_pid`, when
/// given) and decodes its report.
async fn load<T: DeserializeOwned>(
    netns_pid: Option<i32>,
    args: &[String],
    key: Option<&str>,
) -> Result<T, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut cmd = match netns_pid {
        Some(pid) => {
            let mut c = Command::new(nsenter().ok_or("no nsenter")?);
            c.arg(format!("--net=/proc/{pid}/ns/net"))
                .arg("--")
                .arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["bench", "load"])
        .args(args)
        .env_remove(KEY_ENV)
        .env("SPACE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(key) = key {
        cmd.env(KEY_ENV, key);
    }
    let out = tokio::time::timeout(LOAD_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("the load client ran over {} s", LOAD_TIMEOUT.as_secs()))?
        .map_err(|e| format!("load client: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "load client ({}): {}",
            out.status,
            err.trim().lines().last().unwrap_or("no message")
        ));
    }
    serde_json::from_slice(out.stdout.trim_ascii())
        .map_err(|e| format!("load client's report: {e}"))
}

fn http_args(connect: &str, host: &str, path: &str) -> Vec<String> {
    ["http", "--connect", connect, "--host", host, "--path", path]
        .map(str::to_owned)
        .to_vec()
}

/// The host name (with the edge's port) of a port URL `http://{host}/`.
fn url_host(url: &str) -> Result<&str, String> {
    url.strip_prefix("http://")
        .map(|r| r.trim_end_matches('/'))
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .ok_or_else(|| format!("a port URL that is not http://HOST/: {url:?}"))
}

/// The sandbox P10 measures: this executable uploaded, the servers started, the
/// ports exposed (private). Returns the bench server's host PID.
async fn prepare(edge: &space_client::Client) -> Result<(SandboxId, i32), String> {
    let create = CreateSandbox {
        // Both cores: the server must not be what limits the direct baseline.
        limits: Some(LimitsRequest {
            cpus: Some(2.0),
            ..LimitsRequest::default()
        }),
        ..CreateSandbox::default()
    };
    let id = edge
        .create_sandbox(&create)
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    edge.write_file_from_path(&id, EXE, &exe)
        .await
        .map_err(|e| format!("upload {}: {e}", exe.display()))?;
    let token = token();
    let out = edge
        .exec(
            &id,
            &space_client::exec(["sh", "-c", &start_script(&token)]),
        )
        .await
        .map_err(|e| format!("start the servers: {e}"))?;
    if out.exit_code != 0 {
        return Err(format!(
            "start the servers: exit {}: {}",
            out.exit_code,
            out.stderr.trim()
        ));
    }
    let ready = format!("{DIR}/http-{token}.ready");
    let pid = server_pid(&ready).ok_or("cannot find the bench server's process on the host")?;
    for (port, protocol) in [
        (HTTP_PORT, Protocol::Http),
        (PYTHON_PORT, Protocol::Http),
        (TCP_PORT, Protocol::Tcp),
    ] {
        edge.expose_port(
            &id,
            ExposePort {
                port,
                protocol,
                public: false,
            },
        )
        .await
        .map_err(|e| format!("expose {port}: {e}"))?;
    }
    Ok((id, pid))
}

/// What P10 measured.
struct Measured {
    direct: HttpReport,
    proxied: HttpReport,
    /// Through two relays that only copy bytes.
    floor: HttpReport,
    python_direct: HttpReport,
    python_proxied: HttpReport,
    tcp_direct: TcpReport,
    /// Through two relays that only splice bytes.
    tcp_floor: TcpReport,
    tcp_proxied: TcpReport,
}

async fn measure(p: &Platform, id: SandboxId, pid: i32) -> Result<Measured, String> {
    let edge = p
        .url
        .strip_prefix("http://")
        .ok_or_else(|| format!("an edge URL that is not http://: {}", p.url))?
        .trim_end_matches('/');
    let key = Some(p.admin_key.as_str());
    let host = |port: u16| {
        let url = space_proto::api::ports::port_url(
            port,
            &id,
            "localhost",
            edge.rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(80),
        );
        url_host(&url).map(str::to_owned)
    };
    let local = |port: u16| format!("127.0.0.1:{port}");

    eprintln!("P10: HTTP to the bench server, direct in the sandbox's network namespace");
    let args = http_args(&local(HTTP_PORT), &local(HTTP_PORT), "/");
    let direct: HttpReport = load(Some(pid), &args, None)
        .await
        .map_err(|e| format!("direct HTTP: {e}"))?;
    eprintln!("P10: HTTP to the bench server through edge + netgtw");
    let args = http_args(edge, &host(HTTP_PORT)?, "/");
    let proxied: HttpReport = load(None, &args, key)
        .await
        .map_err(|e| format!("HTTP through the edge: {e}"))?;

    eprintln!("P10: HTTP through two byte-copying relays in the sandbox's namespace (the floor)");
    let floor = relayed(pid, &local(HTTP_PORT)).await?;

    eprintln!("P10: HTTP to python's http.server, direct, then through edge + netgtw");
    let args = http_args(&local(PYTHON_PORT), &local(PYTHON_PORT), "/hello.txt");
    let python_direct: HttpReport = load(Some(pid), &args, None)
        .await
        .map_err(|e| format!("direct HTTP to python: {e}"))?;
    let args = http_args(edge, &host(PYTHON_PORT)?, "/hello.txt");
    let python_proxied: HttpReport = load(None, &args, key)
        .await
        .map_err(|e| format!("HTTP to python through the edge: {e}"))?;

    eprintln!("P10: {TCP_MIB} MiB to the sink, direct, then through a CONNECT tunnel");
    let mib = TCP_MIB.to_string();
    let args = ["tcp", "--connect", &local(TCP_PORT), "--mib", &mib].map(str::to_owned);
    let tcp_direct: TcpReport = load(Some(pid), &args, None)
        .await
        .map_err(|e| format!("direct TCP: {e}"))?;
    let tcp_floor = relayed_tcp(pid, &local(TCP_PORT)).await?;
    let tunnel = format!("{id}:{TCP_PORT}");
    let args = ["tcp", "--connect", edge, "--tunnel", &tunnel, "--mib", &mib].map(str::to_owned);
    let tcp_proxied: TcpReport = load(None, &args, key)
        .await
        .map_err(|e| format!("TCP through the edge: {e}"))?;
    Ok(Measured {
        direct,
        proxied,
        floor,
        python_direct,
        python_proxied,
        tcp_direct,
        tcp_floor,
        tcp_proxied,
    })
}

/// First ports of the HTTP and the TCP relays inside the sandbox's network namespace
/// (each pair takes the port and the next).
const RELAY_PORTS: [u16; 2] = [18081, 18091];

/// Two relays in a row in the network namespace of `pid` (`space bench serve relay`,
/// which splices bytes and does nothing else), the first listening on
/// `127.0.0.1:{base}`, the second on `base + 1`, forwarding to `to`: the least two hops
/// in a row cost on this machine, whatever they do. Killed when dropped.
struct Relays {
    _children: Vec<tokio::process::Child>,
    _dir: tempfile::TempDir,
    /// Where a client connects.
    first: String,
}

impl Relays {
    async fn start(pid: i32, base: u16, to: &str) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let first = format!("127.0.0.1:{base}");
        let second = format!("127.0.0.1:{}", base + 1);
        let mut children = Vec::new();
        for (i, (listen, to)) in [(&first, second.as_str()), (&second, to)]
            .into_iter()
            .enumerate()
        {
            let ready = dir.path().join(format!("relay-{i}.ready"));
            children.push(
                Command::new(nsenter().ok_or("no nsenter")?)
                    .arg(format!("--net=/proc/{pid}/ns/net"))
                    .arg("--")
                    .arg(&exe)
                    .args([
                        "bench", "serve", "relay", "--listen", listen, "--to", to, "--ready",
                    ])
                    .arg(&ready)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| format!("relay: {e}"))?,
            );
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !ready.exists() {
                if std::time::Instant::now() > deadline {
                    return Err("a relay did not start".into());
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        Ok(Self {
            _children: children,
            _dir: dir,
            first,
        })
    }
}

/// The bench server through [`Relays`].
async fn relayed(pid: i32, server: &str) -> Result<HttpReport, String> {
    let relays = Relays::start(pid, RELAY_PORTS[0], server).await?;
    load(Some(pid), &http_args(&relays.first, server, "/"), None)
        .await
        .map_err(|e| format!("HTTP through two relays: {e}"))
}

/// The TCP sink through [`Relays`].
async fn relayed_tcp(pid: i32, sink: &str) -> Result<TcpReport, String> {
    let relays = Relays::start(pid, RELAY_PORTS[1], sink).await?;
    let mib = TCP_MIB.to_string();
    let args = ["tcp", "--connect", &relays.first, "--mib", &mib].map(str::to_owned);
    load(Some(pid), &args, None)
        .await
        .map_err(|e| format!("TCP through two relays: {e}"))
}

/// P10 on `p`.
pub async fn run(p: &Platform) -> Result<Vec<Row>, String> {
    if let Some(why) = missing_requirement() {
        eprintln!("P10: SKIPPED: {why}");
        return Ok(vec![skipped(&why)]);
    }
    let edge = p.client(false);
    eprintln!("P10: a sandbox with the bench servers and python's http.server");
    let (id, pid) = prepare(&edge).await?;
    let measured = measure(p, id, pid).await;
    let _ = edge.delete_sandbox(&id).await;
    Ok(rows(&measured?))
}

/// The row of a host P10 cannot run on (information only: not a failure).
fn skipped(why: &str) -> Row {
    Row::new(
        "P10",
        "HTTP and TCP through edge + netgtw",
        format!("skipped: {why}"),
        "-",
    )
}

fn http_text(r: &HttpReport) -> String {
    format!("p50 {:.3} ms, p99 {:.3} ms", r.p50_ms, r.p99_ms)
}

fn rps_text(r: &HttpReport) -> String {
    if r.failed == 0 {
        format!("{:.0} req/s", r.requests_per_s)
    } else {
        format!(
            "{:.0} req/s ({} failed: {})",
            r.requests_per_s, r.failed, r.first_failure
        )
    }
}

/// The table of `m`: the bench server's figures against their targets, python's
/// as information.
fn rows(m: &Measured) -> Vec<Row> {
    let (d, x) = (&m.direct, &m.proxied);
    let (pd, px) = (&m.python_direct, &m.python_proxied);
    let (td, tx) = (&m.tcp_direct, &m.tcp_proxied);
    let latency = x.p50_ms / d.p50_ms;
    let rate = x.requests_per_s / d.requests_per_s;
    let tcp = tx.mib_per_s / td.mib_per_s;
    vec![
        Row::new(
            "P10",
            "HTTP, 1 keep-alive connection, direct in the sandbox's namespace (baseline)",
            http_text(d),
            "-",
        ),
        Row::new(
            "P10",
            "HTTP, 1 keep-alive connection, client → edge → netgtw → server",
            http_text(x),
            "p50 ≤ 2 × direct",
        )
        .ratio(latency)
        .pass(latency <= 2.0),
        Row::new(
            "P10",
            "HTTP, 1 connection, through two relays that only copy bytes (the floor of two hops)",
            format!("{}; {}", http_text(&m.floor), rps_text(&m.floor)),
            "(information)",
        )
        .ratio(m.floor.p50_ms / d.p50_ms),
        Row::new(
            "P10",
            "HTTP, 16 keep-alive connections, direct (baseline)",
            rps_text(d),
            "-",
        ),
        Row::new(
            "P10",
            "HTTP, 16 keep-alive connections, through edge + netgtw",
            rps_text(x),
            "≥ 50 % of direct req/s",
        )
        .ratio(rate)
        .pass(rate >= 0.5 && x.failed == 0 && d.failed == 0),
        Row::new(
            "P10",
            "python http.server (a connection per request), direct (baseline)",
            format!("{}; {}", http_text(pd), rps_text(pd)),
            "-",
        ),
        Row::new(
            "P10",
            "python http.server (a connection per request), through edge + netgtw",
            format!("{}; {}", http_text(px), rps_text(px)),
            "(information) p50 ≤ 2 × direct",
        )
        .ratio(px.p50_ms / pd.p50_ms),
        Row::new(
            "P10",
            "TCP, 256 MiB to a sink, direct (baseline)",
            format!("{:.0} MiB/s", td.mib_per_s),
            "-",
        ),
        Row::new(
            "P10",
            "TCP, 256 MiB through two relays that only splice bytes (the floor of two hops)",
            format!("{:.0} MiB/s", m.tcp_floor.mib_per_s),
            "(information)",
        )
        .ratio(m.tcp_floor.mib_per_s / td.mib_per_s),
        Row::new(
            "P10",
            "TCP, 256 MiB through a CONNECT tunnel, edge + netgtw",
            format!("{:.0} MiB/s", tx.mib_per_s),
            "≥ 50 % of direct",
        )
        .ratio(tcp)
        .pass(tcp >= 0.5),
        // The same path against what two hops cost that do nothing but move bytes
        // (the targets above are out of reach of any two-hop path on a small machine;
        // see docs/benchmarks.md): at most half again the floor's latency, at least
        // half its requests per second, a tunnel at least 80 % of the floor's bytes.
        Row::new(
            "P10",
            "HTTP p50 through edge + netgtw, against the two-hop floor",
            http_text(x),
            "p50 ≤ 1.5 × floor",
        )
        .ratio(x.p50_ms / m.floor.p50_ms)
        .pass(x.p50_ms <= 1.5 * m.floor.p50_ms),
        Row::new(
            "P10",
            "HTTP req/s through edge + netgtw, against the two-hop floor",
            rps_text(x),
            "≥ 50 % of the floor",
        )
        .ratio(x.requests_per_s / m.floor.requests_per_s)
        .pass(x.requests_per_s >= 0.5 * m.floor.requests_per_s && x.failed == 0),
        Row::new(
            "P10",
            "TCP through edge + netgtw, against the two-hop floor",
            format!("{:.0} MiB/s", tx.mib_per_s),
            "≥ 80 % of the floor",
        )
        .ratio(tx.mib_per_s / m.tcp_floor.mib_per_s)
        .pass(tx.mib_per_s >= 0.8 * m.tcp_floor.mib_per_s),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(p50: f64, rps: f64, failed: u64) -> HttpReport {
        HttpReport {
            p50_ms: p50,
            p99_ms: p50 * 2.0,
            requests_per_s: rps,
            failed,
            first_failure: if failed > 0 {
                "status 502".into()
            } else {
                String::new()
            },
            connections: 17,
        }
    }

    fn measured(proxied: HttpReport, tcp_proxied: f64) -> Measured {
        Measured {
            direct: report(0.1, 10_000.0, 0),
            proxied,
            floor: report(0.15, 8000.0, 0),
            python_direct: report(1.0, 1000.0, 0),
            python_proxied: report(5.0, 200.0, 0),
            tcp_direct: TcpReport {
                mib_per_s: 2000.0,
                bytes: 256 << 20,
            },
            tcp_floor: TcpReport {
                mib_per_s: 1500.0,
                bytes: 256 << 20,
            },
            tcp_proxied: TcpReport {
                mib_per_s: tcp_proxied,
                bytes: 256 << 20,
            },
        }
    }

    fn verdicts(rows: &[Row]) -> Vec<Option<bool>> {
        rows.iter().map(|r| r.pass).collect()
    }

    #[test]
    fn each_target_is_judged_against_the_direct_run_of_the_same_run() {
        let met = rows(&measured(report(0.2, 5000.0, 0), 1000.0));
        assert_eq!(
            verdicts(&met),
            [
                None,
                Some(true),
                None,
                None,
                Some(true),
                None,
                None,
                None,
                None,
                Some(true),
                Some(true),
                Some(true),
                Some(false)
            ]
        );
        let missed = rows(&measured(report(0.21, 4999.0, 0), 999.0));
        assert_eq!(
            verdicts(&missed),
            [
                None,
                Some(false),
                None,
                None,
                Some(false),
                None,
                None,
                None,
                None,
                Some(false),
                Some(true),
                Some(true),
                Some(false)
            ]
        );
        assert_eq!(missed[1].ratio.map(|r| (r * 100.0).round()), Some(210.0));
        // python's rows and the floors are information: a ratio, no verdict.
        assert_eq!(met[6].ratio, Some(5.0));
        assert_eq!(met[2].ratio.map(|r| (r * 100.0).round()), Some(150.0));
        assert_eq!(met[8].ratio, Some(0.75));
    }

    #[test]
    fn the_floor_rows_are_judged_against_the_floor_of_the_same_run() {
        // Floor: p50 0.15 ms, 8000 req/s, 1500 MiB/s.
        let within = rows(&measured(report(0.224, 4000.0, 0), 1200.0));
        let past = rows(&measured(report(0.226, 3999.0, 0), 1199.0));
        assert_eq!(
            verdicts(&within)[10..],
            [Some(true), Some(true), Some(true)]
        );
        assert_eq!(
            verdicts(&past)[10..],
            [Some(false), Some(false), Some(false)]
        );
        assert_eq!(within[10].ratio.map(|r| (r * 100.0).round()), Some(149.0));
    }

    #[test]
    fn failed_requests_fail_the_throughput_row_whatever_its_rate() {
        let r = rows(&measured(report(0.1, 20_000.0, 3), 2000.0));
        assert_eq!(r[4].pass, Some(false));
        assert!(
            r[4].measured.contains("3 failed: status 502"),
            "{}",
            r[4].measured
        );
    }

    #[test]
    fn a_port_url_gives_the_host_the_edge_routes_by() {
        assert_eq!(
            url_host("http://8080-sbx_a.localhost:7070/"),
            Ok("8080-sbx_a.localhost:7070")
        );
        assert!(url_host("https://8080-sbx_a.localhost/").is_err());
        assert!(url_host("http://h/path").is_err());
    }

    #[test]
    fn the_start_script_waits_for_the_ready_files_it_names() {
        let s = start_script("abc");
        assert!(s.contains("--ready /root/p10/http-abc.ready"));
        assert!(s.contains("[ ! -e /root/p10/http-abc.ready ]"));
        assert!(s.contains("--ready /root/p10/tcp-abc.ready"));
        assert!(s.contains("[ ! -e /root/p10/tcp-abc.ready ]"));
    }
}
