//! netgtw, the per-sandbox network gateway for service ports (`IDENTITY.md` §3, §6):
//! a tunnel admitted by node-api (capability for this port and protocol, compared
//! with the sandbox's trusted record) is bound to that one sandbox, execution and
//! port. Its connection into the sandbox is a socket created inside the sandbox's
//! network namespace and connected to the port on its loopback — the sandbox gets no
//! routable address. A VM's loopback is its own kernel's: there the connection is one
//! the guest's agent makes to the port and hands over, on a verified agent
//! connection of the execution (`Operation::ConnectPort`).
//!
//! - `tcp`: the tunnel's bytes are the port's.
//! - `http`: every request on the tunnel is read and checked — one naming another
//!   sandbox or port is refused (421) and the tunnel closes; an upgrade to anything
//!   but WebSocket is refused (403 `wrong_protocol`); a WebSocket upgrade the server
//!   does not accept (no 101) closes the tunnel — then forwarded on a connection into
//!   the same execution (opened again when the server closed the last one).
//!
//! Every tunnel holds the execution's lease: when the worker retires or replaces the
//! execution, or the port stops being exposed, the tunnel and everything bridged
//! through it end at once. An activation-attempt-only change keeps it (the lease is
//! the execution's, not the activation's).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Either;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use space_http::proxy::{self, Counted, Forwarded, UpgradeAsk};
use space_identity::{Protocol, SandboxId, ServicePort};
use space_proto::api::ports::{PORT_HEADER, SANDBOX_HEADER, exposure, port_host};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;

use super::metrics::PortBytes;
use super::node_api::refusal::Refusal;
use super::state::{Slot, Worker};

/// How long connecting to the port inside the sandbox may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a client of an `http` tunnel may take to send a request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Tunnels one sandbox may hold open at once at this worker.
pub const MAX_TUNNELS_PER_SANDBOX: usize = 1024;

/// Tunnels one VM sandbox may hold open at once: each is a stream of the VM's one
/// link to its agent, and half the link's streams stay for everything else (exec,
/// files, watches), so a browser opening many connections cannot lock the sandbox's
/// owner out of it.
pub const MAX_VM_TUNNELS_PER_SANDBOX: usize = space_proto::vm::MAX_STREAMS / 2;

/// The tunnels a sandbox of `worker` may hold open at once.
fn max_tunnels(worker: &Worker) -> usize {
    match worker.kind() {
        space_identity::Substrate::Vm => MAX_VM_TUNNELS_PER_SANDBOX,
        _ => MAX_TUNNELS_PER_SANDBOX,
    }
}

/// The body of an answer through an `http` tunnel: the server's, or netgtw's own.
type Body = Either<Incoming, Full<Bytes>>;

/// A tunnel admitted for one execution and port, with its first connection into the
/// sandbox open.
#[derive(Debug)]
pub(crate) struct Tunnel {
    worker: Arc<Worker>,
    slot: Arc<Slot>,
    port: ServicePort,
    first: Inside,
    counts: PortBytes,
    /// Shared with the bridges of the tunnel's WebSocket upgrades, which outlive it.
    held: Arc<TunnelPermit>,
}

/// One of a sandbox's [`MAX_TUNNELS_PER_SANDBOX`] places.
#[derive(Debug)]
struct TunnelPermit {
    worker: Arc<Worker>,
    sandbox: SandboxId,
}

impl TunnelPermit {
    fn take(worker: &Arc<Worker>, sandbox: SandboxId, most: usize) -> Option<Self> {
        let mut held = worker.tunnels.lock().ok()?;
        let n = held.entry(sandbox).or_insert(0);
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(Self {
            worker: Arc::clone(worker),
            sandbox,
        })
    }
}

impl Drop for TunnelPermit {
    fn drop(&mut self) {
        if let Ok(mut held) = self.worker.tunnels.lock() {
            if let Some(n) = held.get_mut(&self.sandbox) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.remove(&self.sandbox);
                }
            }
        }
    }
}

/// Whether `slot` still serves `port`: its execution is the sandbox's current one,
/// live, and exposes the port with that protocol.
fn still_serves(worker: &Worker, slot: &Slot, port: ServicePort) -> bool {
    if *slot.lease.borrow() {
        return false;
    }
    worker.slot(&slot.record.sandbox).is_some_and(|now| {
        now.record.execution() == slot.record.execution()
            && exposure(&now.record.ports, port.port, port.protocol).is_some()
    })
}

/// A connection into a sandbox, to a port on its loopback.
#[derive(Debug)]
enum Inside {
    /// A socket made in the sandbox's network namespace (a jail's).
    Tcp(TcpStream),
    /// An agent connection handed over to the port (a VM's).
    Agent(UnixStream),
}

/// [`proxy::bridge`] of a client socket that arrived with `early` bytes already read
/// past the upgrade (they go to the backend first).
async fn bridge_with_early<B>(
    client: TcpStream,
    early: Bytes,
    mut backend: B,
    stop: watch::Receiver<bool>,
) where
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    if !early.is_empty() && backend.write_all(&early).await.is_err() {
        return;
    }
    proxy::bridge(client, backend, stop).await;
}

impl tokio::io::AsyncRead for Inside {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Inside::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Inside::Agent(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Inside {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Inside::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Inside::Agent(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Inside::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Inside::Agent(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Inside::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Inside::Agent(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A connection to `port` on the loopback of `slot`'s sandbox: from inside its
/// network namespace, or — a VM's — made by its agent inside the guest.
async fn connect_inside(worker: &Worker, slot: &Arc<Slot>, port: u16) -> Result<Inside, Refusal> {
    if worker.kind() == space_identity::Substrate::Vm {
        // The guest connects within its own CONNECT_TIMEOUT; a guest that never
        // answers holds nothing past a little more.
        let lease = slot.lease();
        let asked = super::node_api::agent::connect_port(slot, port);
        return match tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(2), asked).await {
            Ok(Ok(stream)) => Ok(Inside::Agent(stream)),
            // A broken agent connection while the execution was retired is a stale
            // route, as for every other agent call.
            Ok(Err(r))
                if r.status() == hyper::StatusCode::BAD_GATEWAY
                    && matches!(r, Refusal::Bridge(_)) =>
            {
                Err(super::node_api::agent::stale_or(r, lease, slot).await)
            }
            Ok(Err(r)) => Err(r),
            Err(_) => Err(Refusal::PortClosed(format!(
                "the sandbox's agent did not connect to port {port} in time"
            ))),
        };
    }
    connect_in_namespace(worker, slot, port)
        .await
        .map(Inside::Tcp)
}

/// A connection to `port` on the loopback of `slot`'s sandbox, from inside its
/// network namespace.
async fn connect_in_namespace(
    worker: &Worker,
    slot: &Slot,
    port: u16,
) -> Result<TcpStream, Refusal> {
    let handle = slot
        .record
        .handle
        .clone()
        .ok_or_else(|| Refusal::Bridge("the execution has no processes".into()))?;
    let substrate = worker.driver();
    let fd = tokio::task::spawn_blocking(move || substrate.service_socket(&handle))
        .await
        .map_err(|e| Refusal::Internal(e.to_string()))?
        .map_err(|e| match e {
            crate::substrate::SubstrateError::Unsupported(m) => Refusal::Unsupported(m),
            crate::substrate::SubstrateError::NotRunning => {
                Refusal::Bridge("the sandbox is not running".into())
            }
            other => Refusal::Internal(other.to_string()),
        })?;
    let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let closed = || {
        Refusal::PortClosed(format!(
            "nothing accepts connections on port {port} in the sandbox"
        ))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(_)) | Err(_) => Err(closed()),
    }
}

impl Tunnel {
    /// Opens the first connection into the sandbox for an admitted tunnel; refused
    /// when the sandbox holds too many tunnels already or nothing listens.
    pub(crate) async fn open(
        worker: &Arc<Worker>,
        slot: Arc<Slot>,
        port: ServicePort,
    ) -> Result<Self, Refusal> {
        let most = max_tunnels(worker);
        let held = TunnelPermit::take(worker, slot.record.sandbox, most).ok_or_else(|| {
            Refusal::TooLarge(format!(
                "the sandbox has {most} service-port connections open already"
            ))
        })?;
        let first = connect_inside(worker, &slot, port.port).await?;
        // Counted under the entry that exposes it: ports reached through the
        // catch-all share its series.
        let label =
            exposure(&slot.record.ports, port.port, port.protocol).map_or(port.port, |e| e.port);
        worker.metrics.port_connected(&slot.record.sandbox, label);
        let counts = worker.metrics.port_bytes(&slot.record.sandbox, label);
        Ok(Self {
            worker: Arc::clone(worker),
            slot,
            port,
            first,
            counts,
            held: Arc::new(held),
        })
    }

    /// Runs the tunnel over `client` (the upgraded connection from the edge) until
    /// either side ends it or the execution stops serving the port.
    pub(crate) async fn run(self, client: hyper::upgrade::Upgraded) {
        let stop = self.stop_signal();
        if self.port.protocol == Protocol::Http {
            return self.serve_http(client, stop).await;
        }
        // The permit is held (with the rest of the tunnel) until the bridge ends.
        let Tunnel { first, counts, .. } = self;
        match (first, proxy::raw_tcp(client)) {
            // Kernel to kernel between the two sockets.
            (Inside::Tcp(first), Ok((client, early))) => {
                proxy::splice_bridge(client, early, first, Bytes::new(), stop, |to, from| {
                    use space_http::proxy::Count as _;
                    counts.written(to);
                    counts.read(from);
                })
                .await;
            }
            (Inside::Tcp(first), Err(client)) => {
                let backend = Counted::new(Inside::Tcp(first), counts);
                proxy::bridge(TokioIo::new(client), backend, stop).await;
            }
            (Inside::Agent(first), Ok((client, early))) => {
                let backend = Counted::new(Inside::Agent(first), counts);
                bridge_with_early(client, early, backend, stop).await;
            }
            (Inside::Agent(first), Err(client)) => {
                let backend = Counted::new(Inside::Agent(first), counts);
                proxy::bridge(TokioIo::new(client), backend, stop).await;
            }
        }
    }

    /// `true` once the execution is retired or replaced, or stops exposing the port.
    fn stop_signal(&self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        let worker = Arc::clone(&self.worker);
        let slot = Arc::clone(&self.slot);
        let port = self.port;
        let mut lease = slot.lease();
        let mut changes = worker.slot_changes.subscribe();
        tokio::spawn(async move {
            loop {
                if !still_serves(&worker, &slot, port) {
                    let _ = tx.send(true);
                    return;
                }
                tokio::select! {
                    _ = lease.wait_for(|replaced| *replaced) => {}
                    r = changes.changed() => if r.is_err() {
                        // The worker is going away: so is the tunnel.
                        let _ = tx.send(true);
                        return;
                    },
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }

    async fn serve_http(self, client: hyper::upgrade::Upgraded, stop: watch::Receiver<bool>) {
        let gate = Arc::new(Gate {
            worker: Arc::clone(&self.worker),
            slot: Arc::clone(&self.slot),
            port: self.port,
            counts: self.counts.clone(),
            stop: stop.clone(),
            backend: tokio::sync::Mutex::new(None),
            first: std::sync::Mutex::new(Some(self.first)),
            held: Arc::clone(&self.held),
        });
        let service = hyper::service::service_fn(move |req| {
            let gate = Arc::clone(&gate);
            async move { Ok::<_, std::convert::Infallible>(gate.handle(req).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(space_http::DEFAULT_MAX_HEAD.max(8192));
        let conn = builder.serve_connection(client, service).with_upgrades();
        tokio::select! {
            _ = conn => {}
            // The execution is gone: the tunnel ends now, not after the request.
            () = proxy::stopped(stop) => {}
        }
    }
}

/// The checks and the connection into the sandbox of one `http` tunnel.
struct Gate {
    worker: Arc<Worker>,
    slot: Arc<Slot>,
    port: ServicePort,
    counts: PortBytes,
    stop: watch::Receiver<bool>,
    backend: tokio::sync::Mutex<Option<SendRequest<Incoming>>>,
    first: std::sync::Mutex<Option<Inside>>,
    held: Arc<TunnelPermit>,
}

impl Gate {
    fn refuse(&self, status: StatusCode, code: &str, message: &str) -> Response<Body> {
        self.worker
            .metrics
            .port_refused(Some(&self.slot.record.sandbox), self.port.port, code);
        let mut resp: Response<Full<Bytes>> = proxy::refusal(status, code, message, true);
        let body = std::mem::take(resp.body_mut());
        resp.map(|_| Either::Right(body))
    }

    /// What a request names that is not this tunnel's sandbox and port, if anything.
    fn misdirected(&self, req: &Request<Incoming>) -> Option<String> {
        let h = req.headers();
        let sandbox = self.slot.record.sandbox;
        let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        if let Some(s) = header(SANDBOX_HEADER) {
            if s != sandbox.to_string() {
                return Some(format!("{SANDBOX_HEADER} names another sandbox"));
            }
        }
        if let Some(p) = header(PORT_HEADER) {
            if p.parse::<u16>().ok() != Some(self.port.port) {
                return Some(format!("{PORT_HEADER} names another port"));
            }
        }
        let host = header("host").or_else(|| req.uri().authority().map(|a| a.as_str()));
        if let Some((port, named)) = host.and_then(|h| port_host(h, None)) {
            if named != sandbox || port != self.port.port {
                return Some("the Host names another sandbox or port".into());
            }
        }
        None
    }

    async fn handle(&self, mut req: Request<Incoming>) -> Response<Body> {
        if *self.stop.borrow() || !still_serves(&self.worker, &self.slot, self.port) {
            return self.refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "refresh_route",
                "the execution this connection was bound to no longer serves the port",
            );
        }
        if let Some(why) = self.misdirected(&req) {
            return self.refuse(StatusCode::MISDIRECTED_REQUEST, "misdirected", &why);
        }
        let asked = proxy::upgrade_asked(req.headers());
        if let UpgradeAsk::Other(what) = asked {
            return self.refuse(
                StatusCode::FORBIDDEN,
                "wrong_protocol",
                &format!("an http service port upgrades only to websocket, not {what:?}"),
            );
        }
        for name in [SANDBOX_HEADER, PORT_HEADER] {
            req.headers_mut().remove(name);
        }
        let mut backend = self.backend.lock().await;
        let mut sender = match backend.take().filter(|s| !s.is_closed()) {
            Some(s) => s,
            None => match self.connect().await {
                Ok(s) => s,
                Err(r) => return r,
            },
        };
        // An upgraded stream keeps the tunnel's place while it is bridged.
        let held = (asked == UpgradeAsk::WebSocket).then(|| Arc::clone(&self.held));
        let forwarded = proxy::forward(&mut sender, req, self.stop.clone(), held).await;
        // Not kept after an answer the server closes its connection on: the next
        // request opens a new one rather than find this one dead.
        if matches!(forwarded, Ok(Forwarded::Answer(_))) {
            *backend = Some(sender);
        }
        match forwarded {
            Ok(Forwarded::Answer(resp) | Forwarded::Last(resp) | Forwarded::Upgraded(resp)) => {
                resp.map(Either::Left)
            }
            Err(e) => self.refuse(
                StatusCode::BAD_GATEWAY,
                "port_closed",
                &format!("the server in the sandbox failed the request: {e}"),
            ),
        }
    }

    /// A connection into the sandbox: the one opened at admission, then new ones —
    /// only while the execution still serves the port.
    async fn connect(&self) -> Result<SendRequest<Incoming>, Response<Body>> {
        let first = self.first.lock().ok().and_then(|mut f| f.take());
        let stream = match first {
            Some(s) => s,
            None => {
                if !still_serves(&self.worker, &self.slot, self.port) {
                    return Err(self.refuse(
                        StatusCode::MISDIRECTED_REQUEST,
                        "refresh_route",
                        "the execution this connection was bound to no longer serves the port",
                    ));
                }
                match connect_inside(&self.worker, &self.slot, self.port.port).await {
                    Ok(s) => {
                        self.worker
                            .metrics
                            .port_connected(&self.slot.record.sandbox, self.port.port);
                        s
                    }
                    Err(r) => {
                        return Err(self.refuse(r.status(), r.code(), &r.message()));
                    }
                }
            }
        };
        proxy::backend(Counted::new(stream, self.counts.clone()))
            .await
            .map_err(|e| {
                self.refuse(
                    StatusCode::BAD_GATEWAY,
                    "port_closed",
                    &format!("the server in the sandbox: {e}"),
                )
            })
    }
}

#[cfg(test)]
mod tests;
