//! The platform's DNS client: asks the upstream servers for a name's `A` records, for
//! the resolver's answers and the proxy's own dials (a sandbox's DNS answers and its
//! `/etc/hosts` play no part in where the proxy connects).
//!
//! Each question goes over UDP from a fresh socket (a random source port) with a
//! random ID, to a connected socket (only the server's datagrams arrive); an answer
//! counts only if its ID, question name and type match, anything else is ignored until
//! the timeout. A truncated answer is asked again over TCP. No answer in time: once
//! more, to the next server. Answers are cached by name for their TTL (capped), in a
//! bounded cache.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use space_egress::DnsName;
use space_egress::dns::{self, Rcode, TYPE_A};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// How long one attempt waits for an answer.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts after the first when no answer comes in time.
pub const DEFAULT_RETRIES: usize = 1;
/// Longest TTL kept (in the cache, and given to sandboxes).
pub const MAX_TTL: u32 = 300;
/// Most names cached.
pub const MAX_CACHED_NAMES: usize = 4096;
/// Largest answer read over UDP (EDNS is not asked for, so servers send 512 at most;
/// a bigger buffer only tolerates servers that ignore that).
const MAX_UDP_ANSWER: usize = 4096;
/// Largest answer read over TCP.
const MAX_TCP_ANSWER: usize = 16 << 10;
/// Most datagrams that do not match read for one attempt before giving up on it.
const MAX_IGNORED: usize = 64;

/// Why no addresses came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("no upstream DNS server is configured")]
    NoServer,
    #[error("the name does not exist")]
    NxDomain,
    #[error("the upstream answered {0:?}")]
    Failed(Rcode),
    #[error("no answer from the upstream in time")]
    Timeout,
    #[error("upstream: {0}")]
    Io(String),
    #[error("upstream sent a malformed answer: {0}")]
    Malformed(String),
}

/// A name's `A` records, their TTL capped at [`MAX_TTL`] (the smallest of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub addrs: Vec<Ipv4Addr>,
    pub ttl: u32,
}

#[derive(Debug)]
struct Cached {
    addrs: Vec<Ipv4Addr>,
    expires: Instant,
}

/// The upstream DNS client.
#[derive(Debug)]
pub struct Upstream {
    servers: Vec<SocketAddr>,
    timeout: Duration,
    retries: usize,
    cache: Mutex<HashMap<String, Cached>>,
}

impl Upstream {
    pub fn new(servers: Vec<SocketAddr>, timeout: Duration, retries: usize) -> Self {
        Upstream {
            servers,
            timeout,
            retries,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The `A` records of `name` (an empty list when the name has none).
    pub async fn resolve_a(&self, name: &DnsName) -> Result<Resolved, UpstreamError> {
        if let Some(hit) = self.cached(name.as_str()) {
            return Ok(hit);
        }
        if self.servers.is_empty() {
            return Err(UpstreamError::NoServer);
        }
        let mut last = UpstreamError::Timeout;
        for attempt in 0..=self.retries {
            let server = self.servers[attempt % self.servers.len()];
            match ask(server, name.as_str(), TYPE_A, self.timeout).await {
                Ok(resolved) => {
                    self.store(name.as_str(), &resolved);
                    return Ok(resolved);
                }
                Err(e @ (UpstreamError::NxDomain | UpstreamError::Failed(Rcode::Refused))) => {
                    return Err(e);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn cached(&self, name: &str) -> Option<Resolved> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let hit = cache.get(name)?;
        if hit.expires <= now {
            cache.remove(name);
            return None;
        }
        let left = hit.expires.duration_since(now).as_secs().max(1);
        Some(Resolved {
            addrs: hit.addrs.clone(),
            ttl: u32::try_from(left).unwrap_or(MAX_TTL).min(MAX_TTL),
        })
    }

    fn store(&self, name: &str, resolved: &Resolved) {
        if resolved.ttl == 0 || resolved.addrs.is_empty() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if cache.len() >= MAX_CACHED_NAMES {
            cache.retain(|_, c| c.expires > now);
        }
        if cache.len() >= MAX_CACHED_NAMES {
            // Still full of live entries: start again rather than track recency.
            cache.clear();
        }
        cache.insert(
            name.to_owned(),
            Cached {
                addrs: resolved.addrs.clone(),
                expires: now + Duration::from_secs(u64::from(resolved.ttl)),
            },
        );
    }
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // getrandom(2) without flags blocks only before the pool is initialised at boot;
    // should it fail, the fresh source port still makes an answer hard to forge.
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u16::from_ne_bytes(b)
}

/// One attempt: UDP, then TCP if the answer was truncated.
async fn ask(
    server: SocketAddr,
    name: &str,
    qtype: u16,
    timeout: Duration,
) -> Result<Resolved, UpstreamError> {
    let id = random_id();
    let query = dns::build_query(id, name, qtype).map_err(|e| UpstreamError::Io(e.to_string()))?;
    let io = |e: std::io::Error| UpstreamError::Io(e.to_string());
    let local: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(server).await.map_err(io)?;
    socket.send(&query).await.map_err(io)?;
    let mut buf = vec![0u8; MAX_UDP_ANSWER];
    let deadline = tokio::time::Instant::now() + timeout;
    for _ in 0..MAX_IGNORED {
        let n = match tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            Err(_) => return Err(UpstreamError::Timeout),
            // An ICMP error (nothing listening) shows as a failed recv.
            Ok(Err(e)) => return Err(io(e)),
            Ok(Ok(n)) => n,
        };
        let Some(response) = matching(&buf[..n], id, name, qtype) else {
            continue;
        };
        if response.truncated {
            return ask_tcp(server, &query, id, name, qtype, deadline).await;
        }
        return resolved(response);
    }
    Err(UpstreamError::Timeout)
}

async fn ask_tcp(
    server: SocketAddr,
    query: &[u8],
    id: u16,
    name: &str,
    qtype: u16,
    deadline: tokio::time::Instant,
) -> Result<Resolved, UpstreamError> {
    let io = |e: std::io::Error| UpstreamError::Io(e.to_string());
    let exchange = async {
        let mut tcp = TcpStream::connect(server).await.map_err(io)?;
        let mut framed = Vec::with_capacity(query.len() + 2);
        framed.extend((query.len() as u16).to_be_bytes());
        framed.extend(query);
        tcp.write_all(&framed).await.map_err(io)?;
        let len = usize::from(tcp.read_u16().await.map_err(io)?);
        if len > MAX_TCP_ANSWER {
            return Err(UpstreamError::Malformed(format!(
                "a TCP answer of {len} bytes"
            )));
        }
        let mut msg = vec![0u8; len];
        tcp.read_exact(&mut msg).await.map_err(io)?;
        let response = matching(&msg, id, name, qtype)
            .ok_or_else(|| UpstreamError::Malformed("a TCP answer to another question".into()))?;
        resolved(response)
    };
    tokio::time::timeout_at(deadline, exchange)
        .await
        .unwrap_or(Err(UpstreamError::Timeout))
}

fn resolved(response: dns::Response) -> Result<Resolved, UpstreamError> {
    match response.rcode {
        Rcode::NoError => {}
        Rcode::NxDomain => return Err(UpstreamError::NxDomain),
        other => return Err(UpstreamError::Failed(other)),
    }
    let mut addrs = Vec::new();
    let mut ttl = MAX_TTL;
    for (addr, t) in response.addresses {
        if let IpAddr::V4(v4) = addr
            && !addrs.contains(&v4)
        {
            addrs.push(v4);
            ttl = ttl.min(t);
        }
    }
    Ok(Resolved { addrs, ttl })
}

/// `msg` parsed, if it is the answer to our question: same ID, one question with the
/// same name (any case) and type.
pub(crate) fn matching(msg: &[u8], id: u16, name: &str, qtype: u16) -> Option<dns::Response> {
    let response = dns::parse_response(msg).ok()?;
    if response.id != id {
        return None;
    }
    let (asked, asked_type) = first_question(msg)?;
    let name = name.strip_suffix('.').unwrap_or(name);
    (asked.eq_ignore_ascii_case(name) && asked_type == qtype).then_some(response)
}

/// The name (dot-separated, no trailing dot) and type of the single question of a
/// message, its name uncompressed.
fn first_question(msg: &[u8]) -> Option<(String, u16)> {
    if msg.get(4..6)? != [0, 1] {
        return None;
    }
    let mut at = 12;
    let mut name = String::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // A compressed name or an unknown label type cannot be the question we sent.
        if len > 63 {
            return None;
        }
        let label = msg.get(at..at + len)?;
        at += len;
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(std::str::from_utf8(label).ok()?);
        if name.len() > dns::MAX_WIRE_NAME {
            return None;
        }
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    Some((name, qtype))
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
