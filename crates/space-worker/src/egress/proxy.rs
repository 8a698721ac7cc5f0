//! The platform's HTTP and TLS proxy for sandboxes: TCP 80 and 443 from a sandbox link
//! arrive here (redirected by the table), whatever address the sandbox connected to.
//! The proxy judges the name the client asks for — every request's `Host` on port 80,
//! the ClientHello's SNI on 443 — resolves that name itself through the upstream,
//! judges the address it got (`decide_named`), and dials it. Where the sandbox meant
//! to connect is never used, so a sandbox's own DNS answers or `/etc/hosts` change
//! nothing. TLS is never terminated: after the ClientHello, bytes are spliced.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use space_egress::sniff::{self, MAX_TLS_PEEK, Sniff};
use space_egress::{Decision, DnsName, decide_addr, decide_name, decide_named};
use space_http::proxy::{Count, Counted, Forwarded, backend, forward, splice_bridge};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::{Mutex, watch};

use super::shared::{Admitted, Shared};
use super::tenant::{LAYER_PROXY, Tenant, Via};
use super::upstream::UpstreamError;

/// The rule text of a ClientHello without SNI.
pub const NO_SNI: &str = "no SNI in the ClientHello";
/// The rule text of bytes on port 443 that are no ClientHello.
pub const NOT_TLS: &str = "not a TLS ClientHello";

/// When a connection last moved a byte, to close it once idle.
#[derive(Debug)]
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> std::time::Duration {
        let last = self.last_ms.load(Ordering::Relaxed);
        let now = self.start.elapsed().as_millis() as u64;
        std::time::Duration::from_millis(now.saturating_sub(last))
    }
}

/// A stop for one connection: set when the services stop or the connection has been
/// idle for `Limits::idle_timeout`; the watchdog ends when the connection does.
fn watchdog(shared: &Shared, activity: &Arc<Activity>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let mut global = shared.stop.clone();
    let idle = shared.limits.idle_timeout;
    let activity = Arc::clone(activity);
    tokio::spawn(async move {
        let tick = (idle / 4).max(std::time::Duration::from_millis(10));
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {
                    if activity.idle_for() >= idle {
                        break;
                    }
                }
                _ = global.wait_for(|s| *s) => break,
                () = tx.closed() => return,
            }
        }
        tx.send_replace(true);
    });
    rx
}

/// Counts a client stream's bytes into its tenant (read from the sandbox: out).
struct Meter {
    tenant: Arc<Tenant>,
    activity: Arc<Activity>,
}

impl Count for Meter {
    fn read(&self, n: u64) {
        self.tenant.count_bytes(n, 0);
        self.activity.touch();
    }

    fn written(&self, n: u64) {
        self.tenant.count_bytes(0, n);
        self.activity.touch();
    }
}

/// Why no connection to the destination was made.
#[derive(Debug)]
enum DialError {
    /// The policy or the global list refused (recorded as a refusal).
    Refused { rule: String },
    /// The name did not resolve, or to no IPv4 address.
    Unresolved(String),
    /// The connection failed or timed out.
    Failed(String),
}

/// Resolves `name` through the upstream and connects to the first address
/// `decide_named` allows on `port`; a refusal is recorded on `tenant`.
async fn dial_named(
    shared: &Shared,
    tenant: &Tenant,
    via: Via,
    name: &DnsName,
    port: u16,
) -> Result<TcpStream, DialError> {
    let resolved = shared.upstream.resolve_a(name).await.map_err(|e| match e {
        UpstreamError::NxDomain => {
            DialError::Unresolved(format!("{} does not exist", name.as_str()))
        }
        e => DialError::Unresolved(format!("{}: {e}", name.as_str())),
    })?;
    let policy = tenant.policy();
    let mut refusal = None;
    for &addr in &resolved.addrs {
        match decide_named(&policy, &shared.global, name, addr.into(), port) {
            Decision::Allow => return dial(shared, SocketAddrV4::new(addr, port).into()).await,
            denied => {
                refusal.get_or_insert(denied);
            }
        }
    }
    match refusal {
        Some(denied) => {
            tenant.refused_by(via, name.as_str(), &denied);
            let Decision::Deny { rule, .. } = denied else {
                unreachable!("only refusals are kept")
            };
            Err(DialError::Refused { rule })
        }
        None => Err(DialError::Unresolved(format!(
            "{} has no IPv4 address",
            name.as_str()
        ))),
    }
}

async fn dial(shared: &Shared, to: SocketAddr) -> Result<TcpStream, DialError> {
    // The global list holds the host's addresses of when the worker started; one it
    // gained since (a new interface, a lease) is refused here all the same.
    if is_local_now(to.ip()) {
        return Err(DialError::Refused {
            rule: format!("{} is an address of this host", to.ip()),
        });
    }
    match tokio::time::timeout(shared.limits.dial_timeout, TcpStream::connect(to)).await {
        Ok(Ok(tcp)) => {
            let _ = tcp.set_nodelay(true);
            Ok(tcp)
        }
        Ok(Err(e)) => Err(DialError::Failed(format!("{to}: {e}"))),
        Err(_) => Err(DialError::Failed(format!("{to}: timed out"))),
    }
}

/// Whether `ip` is an address of one of the host's interfaces at this moment, or a
/// loopback address (the list is asked of the kernel each time: a few microseconds
/// against a connection's setup). A list that cannot be read counts as a match.
fn is_local_now(ip: IpAddr) -> bool {
    let ip = space_egress::canonical(ip);
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return true;
    };
    addrs.filter_map(|a| a.address).any(|sa| {
        sa.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())) == Some(ip)
            || sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())) == Some(ip)
    })
}

type ProxyBody = Either<Incoming, Full<Bytes>>;

/// A plain-text answer of the proxy's own, one line naming why.
fn own_answer(status: StatusCode, line: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "space egress: {line}\n"
    )))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Where a request goes: a name, or an address literal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    Name(DnsName),
    Addr(IpAddr),
}

impl Destination {
    fn shown(&self) -> String {
        match self {
            Destination::Name(n) => n.as_str().to_owned(),
            Destination::Addr(IpAddr::V6(a)) => format!("[{a}]:80"),
            Destination::Addr(a) => format!("{a}:80"),
        }
    }
}

/// The destination of a request: its absolute-form authority and its `Host`, which
/// must agree when both are there; no userinfo, no port but 80.
fn destination<B>(req: &Request<B>) -> Result<Destination, String> {
    let from_uri = req.uri().authority().cloned();
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let from_header = match (hosts.next(), hosts.next()) {
        (None, _) => None,
        (Some(h), None) => Some(
            h.to_str()
                .ok()
                .and_then(|h| h.parse::<hyper::http::uri::Authority>().ok())
                .ok_or("a Host that is no host")?,
        ),
        (Some(_), Some(_)) => return Err("more than one Host".into()),
    };
    let authority = match (from_uri, from_header) {
        (None, None) => return Err("a request without Host".into()),
        (Some(a), Some(b)) if !a.host().eq_ignore_ascii_case(b.host()) => {
            return Err(format!(
                "the request's target ({}) and Host ({}) differ",
                a.host(),
                b.host()
            ));
        }
        (Some(a), _) | (None, Some(a)) => a,
    };
    if authority.as_str().contains('@') {
        return Err("userinfo in the request's authority".into());
    }
    if let Some(port) = authority.port_u16()
        && port != 80
    {
        return Err(format!("port {port} (this proxy serves port 80)"));
    }
    let host = authority.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        // Sandboxes are IPv4 only (the table drops their IPv6, and IPv6 rules have no
        // effect): the proxy must not open, from the worker's own IPv6, what the
        // packet filter keeps closed. A mapped IPv4 address is its IPv4 address.
        return match space_egress::canonical(ip) {
            v4 @ IpAddr::V4(_) => Ok(Destination::Addr(v4)),
            IpAddr::V6(_) => Err(format!(
                "{host} is an IPv6 address (sandboxes are IPv4 only)"
            )),
        };
    }
    DnsName::parse(host)
        .map(Destination::Name)
        .map_err(|e| format!("{host:?} is no host name ({e})"))
}

/// A client connection's backend: one per destination, made anew for another.
struct Backend {
    to: Destination,
    sender: SendRequest<Incoming>,
}

struct HttpConn {
    shared: Arc<Shared>,
    /// The connection's places (the tenant's and the services'), held by the bridges of
    /// its WebSocket upgrades too, which outlive it.
    admitted: Arc<Admitted>,
    tenant: Arc<Tenant>,
    backend: Mutex<Option<Backend>>,
    stop: watch::Receiver<bool>,
}

/// Serves HTTP/1.1 from a sandbox until it closes, the services stop or it is idle.
pub(crate) async fn serve_http(shared: Arc<Shared>, tcp: TcpStream, admitted: &Arc<Admitted>) {
    let tenant = Arc::clone(admitted.slot.tenant());
    tenant.count(Via::Http);
    let activity = Activity::new();
    let stop = watchdog(&shared, &activity);
    let io = Counted::new(
        tcp,
        Meter {
            tenant: Arc::clone(&tenant),
            activity,
        },
    );
    let conn = Arc::new(HttpConn {
        shared: Arc::clone(&shared),
        admitted: Arc::clone(admitted),
        tenant,
        backend: Mutex::new(None),
        stop: stop.clone(),
    });
    let service = hyper::service::service_fn(move |req| {
        let conn = Arc::clone(&conn);
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.limits.hello_timeout)
        .max_buf_size(sniff::MAX_HTTP_HEAD.max(8192))
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut stop = stop;
    tokio::select! {
        _ = served => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

impl HttpConn {
    async fn handle(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let to = match destination(&req) {
            Ok(to) => to,
            Err(why) => return own_answer(StatusCode::BAD_REQUEST, &why),
        };
        let policy = self.tenant.policy();
        let decision = match &to {
            Destination::Name(name) => decide_name(&policy, name),
            Destination::Addr(ip) => decide_addr(&policy, &self.shared.global, *ip, 80),
        };
        if let Decision::Deny { rule, .. } = &decision {
            self.tenant.refused_by(Via::Http, &to.shown(), &decision);
            return own_answer(StatusCode::FORBIDDEN, &format!("{rule} ({})", to.shown()));
        }
        // The backend gets origin-form with the Host of the destination.
        if req.uri().authority().is_some() {
            let path = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let host = req.uri().authority().map(|a| a.as_str().to_owned());
            if let (Ok(uri), Some(host)) = (path.parse(), host) {
                *req.uri_mut() = uri;
                if let Ok(v) = HeaderValue::from_str(&host) {
                    req.headers_mut().insert(header::HOST, v);
                }
            }
        }
        let mut slot = self.backend.lock().await;
        if slot
            .as_ref()
            .is_some_and(|b| b.to != to || b.sender.is_closed())
        {
            *slot = None;
        }
        if slot.is_none() {
            let dialed = match &to {
                Destination::Name(name) => {
                    dial_named(&self.shared, &self.tenant, Via::Http, name, 80).await
                }
                Destination::Addr(ip) => dial(&self.shared, SocketAddr::new(*ip, 80)).await,
            };
            let tcp = match dialed {
                Ok(tcp) => tcp,
                Err(DialError::Refused { rule }) => {
                    return own_answer(StatusCode::FORBIDDEN, &format!("{rule} ({})", to.shown()));
                }
                Err(DialError::Unresolved(why) | DialError::Failed(why)) => {
                    return own_answer(StatusCode::BAD_GATEWAY, &why);
                }
            };
            match backend(tcp).await {
                Ok(sender) => {
                    *slot = Some(Backend {
                        to: to.clone(),
                        sender,
                    })
                }
                Err(e) => return own_answer(StatusCode::BAD_GATEWAY, &e.to_string()),
            }
        }
        let Some(b) = slot.as_mut() else {
            return own_answer(StatusCode::BAD_GATEWAY, "no backend");
        };
        match forward(
            &mut b.sender,
            req,
            self.stop.clone(),
            Arc::clone(&self.admitted),
        )
        .await
        {
            Ok(Forwarded::Answer(resp)) => resp.map(Either::Left),
            Ok(Forwarded::Last(resp) | Forwarded::Upgraded(resp)) => {
                *slot = None;
                resp.map(Either::Left)
            }
            Err(e) => {
                *slot = None;
                own_answer(
                    StatusCode::BAD_GATEWAY,
                    &format!("the server of {} failed: {e}", to.shown()),
                )
            }
        }
    }
}

/// The address the sandbox connected to, before the table redirected it here.
fn original_destination(tcp: &TcpStream) -> Option<SocketAddrV4> {
    let sa = nix::sys::socket::getsockopt(tcp, nix::sys::socket::sockopt::OriginalDst).ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

/// Reads a ClientHello (within `Limits::hello_timeout`, at most [`MAX_TLS_PEEK`]
/// bytes), judges its SNI, dials the name on 443 and splices the two connections.
pub(crate) async fn serve_tls(shared: Arc<Shared>, mut tcp: TcpStream, admitted: &Admitted) {
    let tenant = Arc::clone(admitted.slot.tenant());
    tenant.count(Via::Tls);
    let mut hello = Vec::with_capacity(2048);
    let read = async {
        loop {
            if hello.len() == MAX_TLS_PEEK {
                return Some(Sniff::NotThisProtocol);
            }
            let mut chunk = [0u8; 4096];
            let room = (MAX_TLS_PEEK - hello.len()).min(chunk.len());
            let n = tcp.read(&mut chunk[..room]).await.ok()?;
            if n == 0 {
                return None;
            }
            hello.extend_from_slice(&chunk[..n]);
            match sniff::tls_sni(&hello) {
                Sniff::NeedMore => {}
                other => return Some(other),
            }
        }
    };
    let Ok(Some(sniffed)) = tokio::time::timeout(shared.limits.hello_timeout, read).await else {
        return;
    };
    let asked = || {
        original_destination(&tcp).map_or_else(|| "(unknown address)".to_owned(), |a| a.to_string())
    };
    let sni = match sniffed {
        Sniff::Complete(sni) => sni,
        Sniff::NoName => return tenant.refuse(Via::Tls, &asked(), LAYER_PROXY, NO_SNI),
        Sniff::NotThisProtocol | Sniff::NeedMore => {
            return tenant.refuse(Via::Tls, &asked(), LAYER_PROXY, NOT_TLS);
        }
    };
    let Ok(name) = DnsName::parse(&sni) else {
        let rule = format!("SNI {sni:?} is no host name");
        return tenant.refuse(Via::Tls, &asked(), LAYER_PROXY, &rule);
    };
    let decision = decide_name(&tenant.policy(), &name);
    if !decision.is_allow() {
        return tenant.refused_by(Via::Tls, name.as_str(), &decision);
    }
    let upstream = match dial_named(&shared, &tenant, Via::Tls, &name, 443).await {
        Ok(tcp) => tcp,
        Err(e) => {
            tracing::debug!(sandbox = %tenant.sandbox(), name = name.as_str(), error = ?e, "egress: TLS dial failed");
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let activity = Activity::new();
    let stop = watchdog(&shared, &activity);
    splice_bridge(
        tcp,
        Bytes::from(hello),
        upstream,
        Bytes::new(),
        stop,
        |out, back| {
            tenant.count_bytes(out, back);
            activity.touch();
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_connection_is_seen_idle_and_a_touch_wakes_it() {
        let a = Activity::new();
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(a.idle_for() >= std::time::Duration::from_millis(30));
        a.touch();
        assert!(a.idle_for() < std::time::Duration::from_millis(30));
    }

    fn host(h: &str) -> Result<Destination, String> {
        let req = Request::builder()
            .uri("/")
            .header(header::HOST, h)
            .body(())
            .unwrap();
        destination(&req)
    }

    #[test]
    fn an_address_of_this_host_is_known_as_one_whenever_it_is_asked() {
        assert!(is_local_now(IpAddr::from([127, 0, 0, 1])));
        // TEST-NET-3 is on no interface here.
        assert!(!is_local_now(IpAddr::from([203, 0, 113, 250])));
    }

    #[test]
    fn an_ipv6_literal_is_refused_and_a_mapped_ipv4_one_is_its_ipv4_address() {
        let Err(e) = host("[2001:db8::5]") else {
            panic!("an IPv6 literal was let through")
        };
        assert!(e.contains("IPv4 only"), "{e}");
        assert!(host("[::1]").is_err());
        match host("[::ffff:198.51.100.7]") {
            Ok(Destination::Addr(ip)) => assert_eq!(ip, IpAddr::from([198, 51, 100, 7])),
            other => panic!("{:?}", other.map(|d| d.shown())),
        }
        assert!(matches!(host("198.51.100.7"), Ok(Destination::Addr(_))));
        assert!(matches!(host("a.test"), Ok(Destination::Name(_))));
    }
}
