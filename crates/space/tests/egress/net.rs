//! Test hosts: python servers ([`HOST_SERVER`]) in network namespaces of their own
//! (`unshare --net`), each linked to the host by a veth with a `/31` of TEST-NET-2
//! (198.51.100.128/25: the worker's own egress tests take the low half first), the
//! route to it checked with `ip route get` before any traffic; servers the test binds
//! on the host; a test CA and a certificate for `a.test` made with `openssl`. Every
//! process, namespace and link is removed on drop (a namespace goes with its last
//! process, and the veth's host side with it; the link is deleted as well).

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// The test hosts' servers.
pub const HOST_SERVER: &str = include_str!("host_server.py");

/// Picks of /31s within this process are serialised (tests run on threads).
static PICK: Mutex<()> = Mutex::new(());

/// The `/31`s this file uses: 198.51.100.128 + 2k, for k in 0..64.
const PAIRS: u32 = 64;

/// What the egress tests need that this host lacks, if anything.
pub fn missing() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("root (network namespaces, veths, nftables)".into());
    }
    let missing: Vec<&str> = ["nft", "ip", "python3", "openssl", "curl", "unshare"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    (!missing.is_empty()).then(|| format!("{} on PATH", missing.join(", ")))
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
        })
    })
}

/// `ip args…`, which must succeed; its stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A python server process, killed on drop.
pub struct Server(Child);

impl Server {
    /// `python3 host_server.py args…`, in a network namespace of its own when
    /// `own_netns`; returns once it printed `ready`.
    pub fn start(own_netns: bool, args: &[&str]) -> Self {
        let mut command = if own_netns {
            let mut c = Command::new("unshare");
            c.args(["--net", "--", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        let mut child = command
            .arg("-c")
            .arg(HOST_SERVER)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the ready line");
        let server = Server(child);
        assert_eq!(line.trim(), "ready", "{args:?} did not start");
        server
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Deletes a host-side link on drop.
struct LinkGuard(String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", "dev", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// A test host: its servers in a namespace of their own, reached at `addr` through a
/// veth whose host side is `host_side`.
pub struct TestHost {
    pub addr: Ipv4Addr,
    pub host_side: Ipv4Addr,
    // Field order: the link is deleted after the server (and its namespace) is gone.
    _server: Server,
    _link: LinkGuard,
}

/// Ports every test host serves.
pub const HTTP: u16 = 80;
pub const TLS: u16 = 443;
pub const ECHO: u16 = 7000;

impl TestHost {
    /// Test host `name` (`a`, `b`, …) of test `test`, `index` 0 or 1 of that test:
    /// HTTP, the TCP echo, and TLS when `tls` (certificate, key) is given.
    pub fn start(test: u8, index: u8, name: &str, tls: Option<(&Path, &Path)>) -> Self {
        Self::serving(test, index, name, tls, None)
    }

    /// [`TestHost::start`] serving the files of `files` where a path names one.
    pub fn serving(
        test: u8,
        index: u8,
        name: &str,
        tls: Option<(&Path, &Path)>,
        files: Option<&Path>,
    ) -> Self {
        Self::serving_with(test, index, name, tls, files, false)
    }

    /// A test host over HTTP whose paths name files of `files` or nothing (404): an
    /// apt repository.
    pub fn repository(test: u8, index: u8, name: &str, files: &Path) -> Self {
        Self::serving_with(test, index, name, None, Some(files), true)
    }

    fn serving_with(
        test: u8,
        index: u8,
        name: &str,
        tls: Option<(&Path, &Path)>,
        files: Option<&Path>,
        only_files: bool,
    ) -> Self {
        let http = HTTP.to_string();
        let echo = ECHO.to_string();
        let tls_port = TLS.to_string();
        let files = files.map(|f| f.display().to_string());
        let mut args = vec![name, "--http", &http, "--echo", &echo];
        if let Some(f) = &files {
            args.extend(["--files", f]);
            if only_files {
                args.push("--only-files");
            }
        }
        let (cert, key);
        if let Some((c, k)) = tls {
            cert = c.display().to_string();
            key = k.display().to_string();
            args.extend(["--tls", &tls_port, "--cert", &cert, "--key", &key]);
        }
        let server = Server::start(true, &args);
        let _pick = PICK.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        let link = format!("et{}t{test}{index}", pid % 10_000_000);
        let guard = LinkGuard(link.clone());
        let (host_side, addr) = free_pair(u32::from(test) * 2 + u32::from(index) + pid * 20);
        let netns = format!("/proc/{}/ns/net", server.pid());
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host_side}/31"), "dev", &link]);
        ip(&["link", "set", "dev", &link, "up"]);
        for args in [
            vec!["addr", "add", &format!("{addr}/31"), "dev", "eth0"],
            vec!["link", "set", "dev", "eth0", "up"],
            vec!["link", "set", "dev", "lo", "up"],
        ] {
            let out = Command::new("nsenter")
                .arg(format!("--net={netns}"))
                .arg("ip")
                .args(&args)
                .output()
                .expect("nsenter");
            assert!(out.status.success(), "ip {args:?} in {name}: {out:?}");
        }
        let route = ip(&["route", "get", &addr.to_string()]);
        assert!(
            route.contains(&format!("dev {link} ")),
            "{addr} must be routed only into test host {name}: {route}"
        );
        TestHost {
            addr,
            host_side,
            _server: server,
            _link: guard,
        }
    }
}

/// A `/31` of 198.51.100.128/25 that no interface of the host has, starting the search
/// at `start` (modulo [`PAIRS`]): its host side and its other side.
fn free_pair(start: u32) -> (Ipv4Addr, Ipv4Addr) {
    let taken = ip(&["-4", "-o", "addr", "show"]);
    let routes = ip(&["-4", "route", "show"]);
    for k in 0..PAIRS {
        let n = 128 + 2 * ((start + k) % PAIRS);
        let host_side = Ipv4Addr::new(198, 51, 100, n as u8);
        let other = Ipv4Addr::new(198, 51, 100, n as u8 + 1);
        let used = [host_side, other].iter().any(|a| {
            let a = a.to_string();
            taken.contains(&format!("inet {a}/")) || routes.lines().any(|l| l.starts_with(&a))
        });
        if !used {
            return (host_side, other);
        }
    }
    panic!("every /31 of 198.51.100.128/25 is taken on this host");
}

/// A test CA and a certificate for `a.test` signed by it, in a temporary directory.
pub struct TestCa {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn make(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |f: &str| dir.path().join(f);
        let ext = p("ext.cnf");
        std::fs::write(&ext, format!("subjectAltName=DNS:{name}\n")).expect("ext file");
        let s = |p: &Path| p.display().to_string();
        for args in [
            vec![
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=space egress test CA",
                "-keyout",
                &s(&p("ca.key")),
                "-out",
                &s(&p("ca.pem")),
            ],
            vec![
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &s(&p("key.pem")),
                "-out",
                &s(&p("req.pem")),
            ],
            vec![
                "x509",
                "-req",
                "-in",
                &s(&p("req.pem")),
                "-CA",
                &s(&p("ca.pem")),
                "-CAkey",
                &s(&p("ca.key")),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &s(&ext),
                "-out",
                &s(&p("cert.pem")),
            ],
        ] {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        TestCa {
            ca: p("ca.pem"),
            cert: p("cert.pem"),
            key: p("key.pem"),
            _dir: dir,
        }
    }
}
