//! Issue 15's figures: sandbox creates in network mode `egress` (P4's burst: creates
//! with a names-only policy while the default is `none`, each claiming a standby
//! sandbox whose link is made already (`--standby-egress`), which its worker gives the
//! create's policy before the answer; with an address rule, and claiming none, for
//! information), and TCP throughput from a sandbox to a host
//! outside it — through the worker's NAT (an address rule) and through its SNI proxy
//! (a name rule) — against the same transfer from the host, in one run.
//!
//! The "outside host" is a network namespace this bench creates, linked to the host by
//! a veth with the TEST-NET-2 pair `198.51.100.254/31` (routed only into it, checked
//! before any traffic), running this executable's sink (`space bench serve tcp` and
//! `tls-sink`); the name `sink.bench` is answered by a DNS server the bench runs on
//! 127.0.0.1, the platform's upstream for the run. Nothing leaves the machine. The
//! sandbox's side of each transfer is `space bench load tcp` run in the sandbox's
//! network namespace (`nsenter --net` of a process of the sandbox), so its packets
//! take the sandbox's link, rules and NAT exactly as a program inside would.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use space_egress::{NetworkMode, Policy, dns};
use space_proto::api::{CreateSandbox, LimitsRequest};
use tokio::process::{Child, Command};

use super::p10::load::TcpReport;
use super::platform::{Platform, PlatformOptions};
use super::row::Row;

/// The outside host's address and the host's side of its link.
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 255);
const OUTSIDE_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
/// The name the proxy is asked for.
const SINK_NAME: &str = "sink.bench";
/// The sink's ports in the outside host.
const SINK_PORT: u16 = 9090;
const TLS_PORT: u16 = 443;
/// MiB pushed through each path.
const MIB: u64 = 512;
/// The egress slot of the bench's platform (its workers take this one and the next).
const SLOT: &str = "250";
/// Standby sandboxes kept with their link made (`--standby-egress`): more than a burst.
const LINKED: usize = 64;

/// The pools of the bench's platform: warm jails per worker, standby sandboxes in all
/// (those without a link and those with one).
fn pools() -> (usize, usize) {
    (
        space_worker::daemon::DEFAULT_WARM_POOL,
        space_control::service::STANDBY_PER_WORKER * 2 + LINKED,
    )
}

/// Why this host cannot run the figures, if it cannot.
fn missing_requirement() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (jails, veth pairs, nftables)".into());
    }
    for tool in ["ip", "nft", "nsenter"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()));
        if !found {
            return Some(format!("needs `{tool}`"));
        }
    }
    None
}

/// A DNS server on 127.0.0.1 answering `sink.bench` with the outside host and
/// anything else with NXDOMAIN; runs until the bench ends.
async fn dns_server() -> Result<SocketAddr, String> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind the bench's DNS server: {e}"))?;
    let addr = socket.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let mut buf = [0u8; dns::MAX_UDP_MESSAGE];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let Ok(q) = dns::parse_query(&buf[..n]) else {
                continue;
            };
            let reply = if q.name == SINK_NAME {
                dns::answer(&q, &[IpAddr::V4(OUTSIDE)], 60)
            } else {
                dns::reply_without_records(&q, dns::Rcode::NxDomain)
            };
            let _ = socket.send_to(&reply, from).await;
        }
    });
    Ok(addr)
}

async fn run_ok(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The outside host: a namespace, its link, its sinks. Removed on drop.
struct Outside {
    netns: String,
    link: String,
    sinks: Vec<Child>,
}

impl Outside {
    async fn start() -> Result<Self, String> {
        let tag = std::process::id() % 100_000;
        let netns = format!("space-bench-{tag}");
        let link = format!("sbo{tag}");
        let mut o = Outside {
            netns: netns.clone(),
            link: link.clone(),
            sinks: Vec::new(),
        };
        run_ok("ip", &["netns", "add", &netns]).await?;
        run_ok(
            "ip",
            &[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        )
        .await?;
        run_ok(
            "ip",
            &[
                "addr",
                "add",
                &format!("{OUTSIDE_GATEWAY}/31"),
                "dev",
                &link,
            ],
        )
        .await?;
        run_ok("ip", &["link", "set", "dev", &link, "up"]).await?;
        for args in [
            vec!["addr", "add", "198.51.100.255/31", "dev", "eth0"],
            vec!["link", "set", "dev", "eth0", "up"],
            vec!["link", "set", "dev", "lo", "up"],
        ] {
            let mut all = vec!["-n", netns.as_str()];
            all.extend(args);
            run_ok("ip", &all).await?;
        }
        let route = run_ok("ip", &["route", "get", &OUTSIDE.to_string()]).await?;
        if !route.contains(&format!("dev {link} ")) {
            return Err(format!(
                "{OUTSIDE} is not routed into the bench's namespace only: {route}"
            ));
        }
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        for (kind, port) in [("tcp", SINK_PORT), ("tls-sink", TLS_PORT)] {
            let child = Command::new("ip")
                .args(["netns", "exec", &netns])
                .arg(&exe)
                .args(["bench", "serve", kind, "--listen"])
                .arg(format!("0.0.0.0:{port}"))
                .env("SPACE_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("start the sink: {e}"))?;
            o.sinks.push(child);
        }
        // Listening once a connection is accepted.
        for port in [SINK_PORT, TLS_PORT] {
            let addr = SocketAddr::from((OUTSIDE, port));
            let mut ready = false;
            for _ in 0..100 {
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !ready {
                return Err(format!("the sink at {addr} does not accept connections"));
            }
        }
        Ok(o)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        for c in &mut self.sinks {
            let _ = c.start_kill();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", "dev", &self.link])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// The platform of these figures: `space up` with egress on (its own slots), the
/// bench's DNS server upstream, the defaults otherwise.
async fn platform(dns: SocketAddr) -> Result<Platform, String> {
    let warm_pool = space_worker::daemon::DEFAULT_WARM_POOL;
    let standby = space_control::service::STANDBY_PER_WORKER * 2;
    eprintln!(
        "egress: starting space up (2 workers, egress on, slots {SLOT}+, {LINKED} standby sandboxes with links)"
    );
    Platform::start(PlatformOptions {
        workers: 2,
        warm_pool,
        standby,
        env: vec![
            ("SPACE_STANDBY_EGRESS".into(), LINKED.to_string()),
            ("SPACE_TENANT_SANDBOXES".into(), "100000".into()),
            ("SPACE_NO_EGRESS".into(), "0".into()),
            ("SPACE_EGRESS_SLOT".into(), SLOT.into()),
            ("SPACE_EGRESS_DNS".into(), dns.to_string()),
        ],
    })
    .await
}

/// The policy of the sandboxes measured: the outside host by address and by name.
fn policy() -> Policy {
    Policy::parse(
        NetworkMode::Egress,
        &[&format!("{OUTSIDE}/32"), SINK_NAME],
        &[] as &[&str],
    )
    .expect("a valid policy")
}

/// The policy of P4's creates: a name only.
fn names_policy() -> Policy {
    Policy::parse(NetworkMode::Egress, &[SINK_NAME], &[] as &[&str]).expect("a valid policy")
}

/// A sandbox in mode egress with a process whose host PID gives its network
/// namespace.
async fn sandbox(
    client: &space_client::Client,
) -> Result<(space_identity::SandboxId, i32), String> {
    let create = CreateSandbox {
        limits: Some(LimitsRequest {
            cpus: Some(2.0),
            ..LimitsRequest::default()
        }),
        network: Some(policy()),
        ..CreateSandbox::default()
    };
    let id = client
        .create_sandbox(&create)
        .await
        .map_err(|e| format!("create: {e}"))?
        .id;
    let marker = format!("egress-bench-{}", std::process::id());
    let script = format!(
        "setsid python3 -c 'import time; time.sleep(3600)' {marker} </dev/null >/dev/null 2>&1 &"
    );
    let out = client
        .exec(&id, &space_client::exec(["sh", "-c", &script]))
        .await
        .map_err(|e| format!("start a process in the sandbox: {e}"))?;
    if out.exit_code != 0 {
        return Err(format!(
            "start a process in the sandbox: {}",
            out.stderr.trim()
        ));
    }
    for _ in 0..100 {
        if let Some(pid) = pid_with_arg(&marker) {
            return Ok((id, pid));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("cannot find the sandbox's process on the host".into())
}

/// The host PID of a process with `arg` among its arguments.
fn pid_with_arg(arg: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if raw.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// `space bench load tcp` to `connect` (from the sandbox's namespace when `netns` is
/// given), with a ClientHello for `sni` first when given.
async fn push(
    netns: Option<i32>,
    connect: SocketAddr,
    sni: Option<&str>,
) -> Result<TcpReport, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut cmd = match netns {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/proc/{pid}/ns/net"))
                .arg("--")
                .arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["bench", "load", "tcp", "--connect"])
        .arg(connect.to_string())
        .args(["--mib", &MIB.to_string()]);
    if let Some(name) = sni {
        cmd.args(["--sni", name]);
    }
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        cmd.env("SPACE_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| "a transfer ran over 300 s".to_string())?
    .map_err(|e| format!("load client: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "load client to {connect}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(out.stdout.trim_ascii()).map_err(|e| format!("load report: {e}"))
}

/// The throughput rows of one run.
fn throughput_rows(host: f64, nat: f64, proxy: f64) -> Vec<Row> {
    let (nat_ratio, proxy_ratio) = (nat / host, proxy / host);
    vec![
        Row::new(
            "egress",
            "TCP from the host to an outside host (baseline)",
            format!("{host:.0} MiB/s"),
            "-",
        ),
        Row::new(
            "egress",
            "TCP from a sandbox through NAT (address rule) vs from the host",
            format!("{nat:.0} MiB/s ({:.0} %)", nat_ratio * 100.0),
            "≥ 80 %",
        )
        .ratio(nat_ratio)
        .pass(nat_ratio >= 0.8),
        Row::new(
            "egress",
            "TCP from a sandbox through the SNI proxy (name rule) vs from the host",
            format!("{proxy:.0} MiB/s ({:.0} %)", proxy_ratio * 100.0),
            "≥ 50 %",
        )
        .ratio(proxy_ratio)
        .pass(proxy_ratio >= 0.5),
    ]
}

/// Runs the figures: P4's burst in mode egress, then the three transfers.
pub async fn run() -> Result<Vec<Row>, String> {
    if let Some(why) = missing_requirement() {
        return Ok(vec![Row::new(
            "egress",
            "not measured",
            format!("skipped: {why}"),
            "-",
        )]);
    }
    let dns = dns_server().await?;
    let outside = Outside::start().await?;
    let p = platform(dns).await?;
    let result = measure(&p).await;
    p.stop().await;
    drop(outside);
    result
}

async fn measure(p: &Platform) -> Result<Vec<Row>, String> {
    let (warm, standby) = pools();
    p.wait_for_pools(warm, standby, Duration::from_secs(180))
        .await?;
    // What a burst costs when it cannot claim standby sandboxes at all (an environment
    // of its own), without a network: the part of the egress burst that is not egress.
    eprintln!("egress: 50 creates at once that claim no standby sandbox, without a network");
    let plain = CreateSandbox {
        env: Some([("SPACE_BENCH".to_owned(), "1".to_owned())].into()),
        ..CreateSandbox::default()
    };
    let unclaimed = super::p4::burst_of(&p.client(true), &plain).await?;
    p.wait_for_pools(warm, standby, Duration::from_secs(180))
        .await?;
    // The same burst in mode egress, claiming no standby sandbox either: what a link
    // adds to a launch.
    eprintln!("egress: 50 creates at once that claim no standby sandbox, names-only policy");
    let unclaimed_egress = CreateSandbox {
        network: Some(names_policy()),
        ..plain.clone()
    };
    let unclaimed_links = super::p4::burst_of(&p.client(true), &unclaimed_egress).await?;
    p.wait_for_pools(warm, standby, Duration::from_secs(180))
        .await?;
    // The headline: the usual policy names what it reaches (`--allow pypi.org`) while
    // the default stays `none`, so each create claims a standby sandbox with its link
    // made and has the worker give it the policy before the answer; its sandbox needs
    // no rules of its own in the worker's table. One with an address rule does.
    let mut rows = super::p4::run_with(p, warm, standby, Some(names_policy())).await?;
    p.wait_for_pools(warm, standby, Duration::from_secs(180))
        .await?;
    eprintln!("egress: 50 creates at once with an address rule");
    let with_address = CreateSandbox {
        network: Some(policy()),
        ..CreateSandbox::default()
    };
    let addressed = super::p4::burst_of(&p.client(true), &with_address).await?;
    rows.push(Row::new(
        "P4 egress",
        "create, 50 concurrent, with an address rule (information: each changes the worker's table)",
        format!(
            "p50 {:.1} ms, p99 {:.1} ms",
            super::row::quantile(&addressed, 0.5),
            super::row::quantile(&addressed, 0.99)
        ),
        "-",
    ));
    rows.push(Row::new(
        "P4 egress",
        "create, 50 concurrent, names-only policy, claiming no standby sandbox (information: a launch with its link)",
        format!(
            "p50 {:.1} ms, p99 {:.1} ms",
            super::row::quantile(&unclaimed_links, 0.5),
            super::row::quantile(&unclaimed_links, 0.99)
        ),
        "-",
    ));
    rows.push(Row::new(
        "P4 egress",
        "create, 50 concurrent, claiming no standby sandbox, no network (information: the same burst without egress)",
        format!(
            "p50 {:.1} ms, p99 {:.1} ms",
            super::row::quantile(&unclaimed, 0.5),
            super::row::quantile(&unclaimed, 0.99)
        ),
        "-",
    ));
    // The transfers once the bursts' refills are over: a pool refilling beside them
    // (launches, links) took the CPU from one path and not another.
    p.wait_for_pools(warm, standby, Duration::from_secs(180))
        .await?;
    let client = p.client(true);
    let (id, pid) = sandbox(&client).await?;
    eprintln!(
        "egress: {MIB} MiB from the host, then from the sandbox through NAT and the proxy, \
         {TRANSFER_ROUNDS} rounds"
    );
    // Rounds of the three in turn, each figure the median of its rounds: a machine
    // whose speed drifts during the run moves all three alike.
    let (mut host, mut nat, mut proxy) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=TRANSFER_ROUNDS {
        host.push(
            push(None, SocketAddr::from((OUTSIDE, SINK_PORT)), None)
                .await?
                .mib_per_s,
        );
        nat.push(
            push(Some(pid), SocketAddr::from((OUTSIDE, SINK_PORT)), None)
                .await?
                .mib_per_s,
        );
        // Any address on port 443 reaches the proxy, which dials the name it is given.
        proxy.push(
            push(
                Some(pid),
                SocketAddr::from((OUTSIDE, TLS_PORT)),
                Some(SINK_NAME),
            )
            .await?
            .mib_per_s,
        );
        eprintln!(
            "egress: round {round}: host {:.0}, NAT {:.0}, proxy {:.0} MiB/s",
            host[round - 1],
            nat[round - 1],
            proxy[round - 1]
        );
    }
    let _ = client.delete_sandbox(&id).await;
    rows.extend(throughput_rows(median(host), median(nat), median(proxy)));
    Ok(rows)
}

/// Rounds of the three transfers.
const TRANSFER_ROUNDS: usize = 9;

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_throughput_is_judged_against_the_hosts_of_the_same_run() {
        let rows = throughput_rows(1000.0, 850.0, 450.0);
        let verdicts: Vec<Option<bool>> = rows.iter().map(|r| r.pass).collect();
        assert_eq!(verdicts, [None, Some(true), Some(false)]);
        let rows = throughput_rows(100.0, 79.0, 51.0);
        let verdicts: Vec<Option<bool>> = rows.iter().map(|r| r.pass).collect();
        assert_eq!(verdicts, [None, Some(false), Some(true)]);
    }

    #[test]
    fn the_measured_policy_allows_the_outside_host_by_address_and_by_name() {
        let p = policy();
        assert_eq!(p.allow().len(), 2);
        assert_eq!(p.allowed_networks().count(), 1);
    }
}
