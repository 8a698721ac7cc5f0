//! The worker's egress services: the HTTP and TLS proxy ([`super::proxy`]) and the
//! resolver ([`super::resolver`]), one listener each (the resolver's port bound for
//! UDP and TCP alike) shared by every sandbox: the table redirects a sandbox's TCP 80,
//! TCP 443 and DNS to these ports on its pair's host side, and admits nothing else
//! there.
//!
//! Every connection and datagram is first matched to a tenant by its (peer, local)
//! addresses through the [`Directory`]; anything else — the host's own processes, a
//! sandbox at another pair's host side — is closed or dropped unanswered and counted
//! ([`Services::unknown_peers`]). The services are never an open proxy.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use space_egress::GlobalDeny;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};

use super::nft::HostPorts;
pub use super::shared::Limits;
use super::shared::{Admitted, Shared, Unknown};
use super::tenant::Directory;
use super::upstream::Upstream;
use super::{proxy, resolver};

/// What the services are started with.
#[derive(Debug, Clone)]
pub struct ServicesConfig {
    /// Where the listeners bind: `0.0.0.0` in production (the table admits only
    /// sandbox links to these ports). IPv4 only.
    pub bind: IpAddr,
    /// The DNS servers the platform asks (by default [`host_nameservers`] of the
    /// host's `/etc/resolv.conf`).
    pub upstream: Vec<SocketAddr>,
    pub global: Arc<GlobalDeny>,
    pub limits: Limits,
}

impl ServicesConfig {
    /// Bound on `0.0.0.0`, with the default limits.
    pub fn new(upstream: Vec<SocketAddr>, global: Arc<GlobalDeny>) -> Self {
        ServicesConfig {
            bind: Ipv4Addr::UNSPECIFIED.into(),
            upstream,
            global,
            limits: Limits::default(),
        }
    }
}

/// The running services; dropping them (or [`Services::stop`]) ends every listener
/// and connection.
#[derive(Debug)]
pub struct Services {
    ports: HostPorts,
    stop: watch::Sender<bool>,
    shared: Arc<Shared>,
}

/// Attempts at finding a port free for both UDP and TCP.
const DNS_PORT_ATTEMPTS: usize = 16;

impl Services {
    /// Binds the four listeners on ephemeral ports of `config.bind` and serves them.
    pub async fn start(
        config: ServicesConfig,
        directory: Arc<dyn Directory>,
    ) -> std::io::Result<Services> {
        let IpAddr::V4(bind) = config.bind else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the egress services bind an IPv4 address (sandboxes are IPv4 only)",
            ));
        };
        let http = TcpListener::bind((bind, 0)).await?;
        let tls = TcpListener::bind((bind, 0)).await?;
        let (udp, dns_tcp) = dns_sockets(bind).await?;
        nix::sys::socket::setsockopt(&udp, nix::sys::socket::sockopt::Ipv4PacketInfo, &true)
            .map_err(std::io::Error::from)?;
        let ports = HostPorts {
            http: http.local_addr()?.port(),
            tls: tls.local_addr()?.port(),
            dns: udp.local_addr()?.port(),
        };
        let (stop, stopped) = watch::channel(false);
        let limits = config.limits;
        let shared = Arc::new(Shared {
            directory,
            global: config.global,
            upstream: Upstream::new(
                config.upstream,
                limits.answer_timeout,
                limits.answer_retries,
            ),
            all: Arc::new(Semaphore::new(limits.connections)),
            questions: Arc::new(Semaphore::new(limits.questions)),
            limits,
            stop: stopped,
            unknown_peers: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
        });
        tokio::spawn(accept(Arc::clone(&shared), http, Kind::Http));
        tokio::spawn(accept(Arc::clone(&shared), tls, Kind::Tls));
        tokio::spawn(accept(Arc::clone(&shared), dns_tcp, Kind::Dns));
        tokio::spawn(resolver::serve_udp(Arc::clone(&shared), udp));
        Ok(Services {
            ports,
            stop,
            shared,
        })
    }

    /// The ports to render the table with; `dns` is bound for UDP and TCP.
    pub fn ports(&self) -> HostPorts {
        self.ports
    }

    /// Ends every listener and connection.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Connections and datagrams turned away because no tenant had their addresses.
    pub fn unknown_peers(&self) -> u64 {
        self.shared.unknown_peers.load(Ordering::Relaxed)
    }

    /// Connections and datagrams turned away (or cut short) by a limit.
    pub fn over_limit(&self) -> u64 {
        self.shared.over_limit.load(Ordering::Relaxed)
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn dns_sockets(bind: Ipv4Addr) -> std::io::Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..DNS_PORT_ATTEMPTS {
        let udp = UdpSocket::bind((bind, 0)).await?;
        let port = udp.local_addr()?.port();
        match TcpListener::bind((bind, port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port free for UDP and TCP")))
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Http,
    Tls,
    Dns,
}

async fn accept(shared: Arc<Shared>, listener: TcpListener, kind: Kind) {
    let mut stop = shared.stop.clone();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: do not spin.
                tracing::warn!(error = %e, "egress: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = admit(&shared, &tcp).map(Arc::new) else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut stop = shared.stop.clone();
            let served = async {
                match kind {
                    Kind::Http => proxy::serve_http(Arc::clone(&shared), tcp, &admitted).await,
                    Kind::Tls => proxy::serve_tls(Arc::clone(&shared), tcp, &admitted).await,
                    Kind::Dns => resolver::serve_tcp(Arc::clone(&shared), tcp, &admitted).await,
                }
            };
            tokio::select! {
                () = served => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            drop(admitted);
        });
    }
}

/// The tenant's slot for `tcp`, or `None` (the connection is then dropped: closed).
fn admit(shared: &Shared, tcp: &TcpStream) -> Option<Admitted> {
    let addrs = (tcp.peer_addr().ok()?, tcp.local_addr().ok()?);
    let (SocketAddr::V4(peer), SocketAddr::V4(local)) = addrs else {
        shared.unknown(Unknown::Peer);
        return None;
    };
    let Some(tenant) = shared.directory.tenant(*peer.ip(), *local.ip()) else {
        shared.unknown(Unknown::Peer);
        return None;
    };
    let Ok(all) = Arc::clone(&shared.all).try_acquire_owned() else {
        shared.unknown(Unknown::Limit);
        tracing::warn!(
            limit = shared.limits.connections,
            "egress: connection limit reached"
        );
        return None;
    };
    let Some(slot) = tenant.enter_connection(shared.limits.connections_per_tenant) else {
        shared.unknown(Unknown::Limit);
        return None;
    };
    Some(Admitted { slot, _all: all })
}

/// The `nameserver` lines of a `resolv.conf` (IPv4 and IPv6, port 53); addresses with
/// a zone (`fe80::1%eth0`) and malformed lines are left out.
pub fn host_nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let line = line.split(['#', ';']).next()?;
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let addr: IpAddr = words.next()?.parse().ok()?;
            Some(SocketAddr::new(addr, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_are_read_from_resolv_conf() {
        let conf = "# generated\nsearch example.internal\nnameserver 10.0.0.2\n\
                    nameserver   2001:db8::53  # v6\n;nameserver 10.9.9.9\n\
                    nameserver fe80::1%eth0\nnameserver\nnameserver bogus\n\
                    options edns0\n nameserver 127.0.0.53\n";
        let got = host_nameservers(conf);
        let want: Vec<SocketAddr> = ["10.0.0.2:53", "[2001:db8::53]:53", "127.0.0.53:53"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        assert!(host_nameservers("").is_empty());
    }

    #[test]
    fn the_default_limits_are_the_documented_ones() {
        let l = Limits::default();
        assert_eq!(l.hello_timeout, Duration::from_secs(10));
        assert_eq!(l.dial_timeout, Duration::from_secs(10));
        assert_eq!(l.idle_timeout, Duration::from_secs(900));
        assert_eq!((l.connections_per_tenant, l.connections), (256, 8192));
        assert_eq!(l.questions_per_tenant, 64);
        assert_eq!(
            (l.answer_timeout, l.answer_retries),
            (Duration::from_secs(3), 1)
        );
    }
}
