//! Service ports: exposing, listing and closing a sandbox's ports (durable in the
//! store first, then pushed signed to the worker running the sandbox, whose netgtw
//! admits connections only to listed ports), their access tokens, one-time browser
//! links, and the cookies those links set.
//!
//! A port's access token is shown once (in the answer that exposed it); the store
//! keeps its BLAKE3 hash. A link's code is kept the same way and used once. The
//! cookie a link sets is stateless: `v1.{port}.{expiry}.{mac}` where the mac is a
//! keyed BLAKE3 (the key is a control-plane secret in the store) over the sandbox,
//! the port, the token hash and the expiry — exposing the port again (a new token)
//! invalidates every cookie and link of the old one.
//!
//! A record for port [`EVERY_HTTP_PORT`] (0) stands for every HTTP port without a
//! record of its own: the E2B front makes one for each sandbox it creates, since
//! E2B's sandboxes answer on any port (`get_host(port)`). It is not listed among the
//! ports; a port it covers reads as a record of that port with its settings, and its
//! token is the sandbox's traffic token ([`ControlPlane::traffic_token`]).

use space_identity::{Protocol, SandboxId};
use space_proto::api::Update;
use space_proto::api::ports::{
    EVERY_HTTP_PORT, ExposePort, ExposedPort, LINK_LIFETIME_SECS, LINK_PARAM,
    MAX_PORTS_PER_SANDBOX, PortView, port_url,
};
use space_store::{ExecutionState, PortRecord, SandboxRecord, SandboxState};

use super::plane::ControlPlane;
pub use super::port_urls::PortUrls;
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

/// How long a cookie set by a one-time link lets a browser in (a day).
pub const COOKIE_LIFETIME_SECS: u64 = 24 * 3600;

/// Lowercase hex BLAKE3 of a secret.
pub fn secret_hash(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// Whether `presented` is the secret `hash` was made from (constant time in the hash).
pub fn secret_matches(presented: &str, hash: &str) -> bool {
    let Ok(want) = blake3::Hash::from_hex(hash) else {
        return false;
    };
    blake3::hash(presented.as_bytes()) == want
}

fn protocol_of(p: &PortRecord) -> Protocol {
    p.protocol.parse().unwrap_or(Protocol::Http)
}

/// The worker's view of a sandbox's ports.
pub fn exposed_of(ports: &[PortRecord]) -> Vec<ExposedPort> {
    ports
        .iter()
        .map(|p| ExposedPort {
            port: p.port,
            protocol: protocol_of(p),
        })
        .collect()
}

/// A random secret with a readable prefix: 32 bytes, lowercase hex.
fn secret(prefix: &str) -> String {
    let bytes: [u8; 32] = random_bytes();
    let mut s = String::with_capacity(prefix.len() + 64);
    s.push_str(prefix);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The mac of a link cookie (pure: key and fields in).
pub fn cookie_mac(
    key: &[u8; 32],
    sandbox: &SandboxId,
    port: u16,
    token_hash: &str,
    expires: u64,
) -> String {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"space/port-cookie/v1\0");
    h.update(sandbox.to_string().as_bytes());
    h.update(&port.to_be_bytes());
    h.update(token_hash.as_bytes());
    h.update(&expires.to_be_bytes());
    h.finalize().to_hex().to_string()
}

/// Whether `cookie` lets a browser into `port` of `sandbox` (exposed with
/// `token_hash`) at `now` (pure).
pub fn cookie_valid(
    key: &[u8; 32],
    cookie: &str,
    sandbox: &SandboxId,
    port: u16,
    token_hash: &str,
    now: u64,
) -> bool {
    let mut parts = cookie.split('.');
    let (Some("v1"), Some(p), Some(exp), Some(mac), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Ok(p), Ok(exp)) = (p.parse::<u16>(), exp.parse::<u64>()) else {
        return false;
    };
    if p != port || exp < now {
        return false;
    }
    let want = cookie_mac(key, sandbox, port, token_hash, exp);
    // Compared as BLAKE3 hashes: constant time.
    match (blake3::Hash::from_hex(&want), blake3::Hash::from_hex(mac)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl ControlPlane {
    /// Where port URLs point.
    pub fn port_urls(&self) -> PortUrls {
        self.port_urls.read().map(|u| u.clone()).unwrap_or_default()
    }

    /// Sets where port URLs point (the server does, once it knows its address).
    pub fn set_port_urls(&self, urls: PortUrls) {
        if let Ok(mut u) = self.port_urls.write() {
            *u = urls;
        }
    }

    /// The key link cookies are made with.
    pub(super) async fn cookie_key(&self) -> Result<[u8; 32], ControlError> {
        if let Some(k) = self.cookie_key.get() {
            return Ok(*k);
        }
        let fresh = secret("");
        self.store
            .kv_insert_if_absent("port_cookie_key", &fresh)
            .await?;
        let text = self
            .store
            .kv_get("port_cookie_key")
            .await?
            .ok_or_else(|| ControlError::Internal("the port cookie key vanished".into()))?;
        let hash = blake3::hash(text.as_bytes());
        let _ = self.cookie_key.set(*hash.as_bytes());
        Ok(*hash.as_bytes())
    }

    fn port_view(&self, p: &PortRecord) -> PortView {
        let urls = self.port_urls();
        PortView {
            port: p.port,
            protocol: protocol_of(p),
            public: p.public,
            url: port_url(p.port, &p.sandbox, &urls.domain, urls.edge_port),
            created_at: p.created_at.max(0) as u64,
            token: None,
            link: None,
        }
    }

    /// The exposed ports of a sandbox as its worker is told them.
    pub async fn exposed_ports(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<ExposedPort>, ControlError> {
        Ok(exposed_of(&self.store.list_ports(sandbox).await?))
    }

    /// Exposes (or exposes again, with a new token) a port of `s`; `true` when it
    /// was not exposed before. Durable before the worker is told.
    pub async fn expose_port(
        &self,
        s: &SandboxRecord,
        req: ExposePort,
    ) -> Result<(PortView, bool), ControlError> {
        if req.port == 0 {
            return Err(ControlError::BadRequest("port must be 1-65535".into()));
        }
        if s.state == SandboxState::Stopped {
            return Err(ControlError::Conflict("the sandbox is stopped".into()));
        }
        let existing: Vec<_> = self
            .store
            .list_ports(&s.id)
            .await?
            .into_iter()
            .filter(|p| p.port != EVERY_HTTP_PORT)
            .collect();
        if existing.len() >= MAX_PORTS_PER_SANDBOX && !existing.iter().any(|p| p.port == req.port) {
            return Err(ControlError::BadRequest(format!(
                "a sandbox exposes at most {MAX_PORTS_PER_SANDBOX} ports; close one first"
            )));
        }
        let token = secret("spt_");
        let record = PortRecord {
            sandbox: s.id,
            port: req.port,
            protocol: req.protocol.as_str().to_owned(),
            public: req.public,
            token_hash: secret_hash(&token),
            created_at: now_secs() as i64,
        };
        let new = self.store.upsert_port(&record).await?;
        self.push_ports(&s.id).await;
        let mut view = self.port_view(&record);
        view.token = Some(token);
        view.link = Some(self.new_link(&record).await?);
        Ok((view, new))
    }

    /// The ports of `s`, by port (an [`EVERY_HTTP_PORT`] record is not one).
    pub async fn list_ports(&self, s: &SandboxRecord) -> Result<Vec<PortView>, ControlError> {
        Ok(self
            .store
            .list_ports(&s.id)
            .await?
            .iter()
            .filter(|p| p.port != EVERY_HTTP_PORT)
            .map(|p| self.port_view(p))
            .collect())
    }

    /// One exposed port (`404 port_not_exposed` otherwise): its own record, else, for
    /// a sandbox with an [`EVERY_HTTP_PORT`] record, that record's settings for it.
    pub async fn port(&self, sandbox: &SandboxId, port: u16) -> Result<PortRecord, ControlError> {
        if port == EVERY_HTTP_PORT {
            return Err(ControlError::PortNotExposed(port));
        }
        if let Some(own) = self.store.get_port(sandbox, port).await? {
            return Ok(own);
        }
        match self.store.get_port(sandbox, EVERY_HTTP_PORT).await? {
            Some(every) if every.protocol == Protocol::Http.as_str() => {
                Ok(PortRecord { port, ..every })
            }
            _ => Err(ControlError::PortNotExposed(port)),
        }
    }

    /// The [`EVERY_HTTP_PORT`] record of `sandbox`, if it has one.
    pub async fn every_http_port(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<PortRecord>, ControlError> {
        Ok(self.store.get_port(sandbox, EVERY_HTTP_PORT).await?)
    }

    /// Makes every HTTP port of `s` reachable (an [`EVERY_HTTP_PORT`] record), by
    /// anyone when `public`, else with [`Self::traffic_token`] as the port token.
    /// Durable before the worker is told.
    pub async fn expose_every_http_port(
        &self,
        s: &SandboxRecord,
        public: bool,
    ) -> Result<(), ControlError> {
        let token = self.traffic_token(&s.id).await?;
        let record = PortRecord {
            sandbox: s.id,
            port: EVERY_HTTP_PORT,
            protocol: Protocol::Http.as_str().to_owned(),
            public,
            token_hash: secret_hash(&token),
            created_at: now_secs() as i64,
        };
        self.store.upsert_port(&record).await?;
        self.push_ports(&s.id).await;
        Ok(())
    }

    /// The traffic token of `sandbox`: the port token of every port its
    /// [`EVERY_HTTP_PORT`] record covers (E2B's `trafficAccessToken`). Derived from a
    /// control-plane secret and the sandbox's ID, so every answer (create, connect)
    /// gives the same one and nothing more is stored.
    pub async fn traffic_token(&self, sandbox: &SandboxId) -> Result<String, ControlError> {
        let key = self.cookie_key().await?;
        let mut h = blake3::Hasher::new_keyed(&key);
        h.update(b"space/traffic-token/v1\0");
        h.update(sandbox.to_string().as_bytes());
        Ok(format!("spt_{}", h.finalize().to_hex()))
    }

    /// Closes a port: its token, links and cookies stop working, and netgtw closes
    /// its connections once the worker is told.
    pub async fn close_port(&self, s: &SandboxRecord, port: u16) -> Result<(), ControlError> {
        if !self.store.delete_port(&s.id, port).await? {
            return Err(ControlError::PortNotExposed(port));
        }
        self.push_ports(&s.id).await;
        Ok(())
    }

    /// A new one-time link to an exposed port.
    pub async fn port_link(&self, s: &SandboxRecord, port: u16) -> Result<PortView, ControlError> {
        let record = self.port(&s.id, port).await?;
        // A link is kept against a port's own record: one the catch-all covers gets
        // one, with the catch-all's settings (the same token and publicity).
        if self.store.get_port(&s.id, port).await?.is_none() {
            let own = self.list_ports(s).await?.len();
            if own >= MAX_PORTS_PER_SANDBOX {
                return Err(ControlError::BadRequest(format!(
                    "a sandbox exposes at most {MAX_PORTS_PER_SANDBOX} ports and a link needs port {port} exposed; close one first"
                )));
            }
            self.store.upsert_port(&record).await?;
            self.push_ports(&s.id).await;
        }
        let mut view = self.port_view(&record);
        view.link = Some(self.new_link(&record).await?);
        Ok(view)
    }

    async fn new_link(&self, p: &PortRecord) -> Result<String, ControlError> {
        let code = secret("spl_");
        let expires = now_secs() + LINK_LIFETIME_SECS;
        self.store
            .insert_port_link(&secret_hash(&code), &p.sandbox, p.port, expires as i64)
            .await?;
        let url = self.port_view(p).url;
        Ok(format!("{url}?{LINK_PARAM}={code}"))
    }

    /// Uses a one-time link's code: the port it leads to and the cookie value that
    /// lets a browser in from now on; `None` for an unknown, used or expired code.
    pub async fn take_link(
        &self,
        code: &str,
    ) -> Result<Option<(SandboxId, u16, String)>, ControlError> {
        let now = now_secs();
        let Some((sandbox, port)) = self
            .store
            .take_port_link(&secret_hash(code), now as i64)
            .await?
        else {
            return Ok(None);
        };
        let record = match self.port(&sandbox, port).await {
            Ok(r) => r,
            Err(ControlError::PortNotExposed(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let expires = now + COOKIE_LIFETIME_SECS;
        let key = self.cookie_key().await?;
        let mac = cookie_mac(&key, &sandbox, port, &record.token_hash, expires);
        Ok(Some((sandbox, port, format!("v1.{port}.{expires}.{mac}"))))
    }

    /// Whether a link cookie lets a browser into `p`.
    pub async fn cookie_opens(&self, p: &PortRecord, cookie: &str) -> Result<bool, ControlError> {
        let key = self.cookie_key().await?;
        Ok(cookie_valid(
            &key,
            cookie,
            &p.sandbox,
            p.port,
            &p.token_hash,
            now_secs(),
        ))
    }

    /// Tells the worker running `sandbox` its current ports. Failing is logged, not
    /// an error: the ports are durable, every later install and a worker's sync carry
    /// them, and the edge pushes them again when netgtw turns a connection away for a
    /// port the store lists. A sandbox whose execution changes meanwhile (a migration
    /// installing the next one) is told again, for the new one.
    pub async fn push_ports(&self, sandbox: &SandboxId) {
        let mut told = None;
        for _ in 0..3 {
            let exe = match self.store.current_execution(sandbox).await {
                Ok(Some(e))
                    if matches!(e.state, ExecutionState::Running | ExecutionState::Pending) =>
                {
                    e
                }
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox, error = %e, "ports not pushed");
                    return;
                }
            };
            if told == Some(exe.execution()) {
                return;
            }
            let ports = match self.exposed_ports(sandbox).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox, error = %e, "ports not pushed");
                    return;
                }
            };
            let worker = match self.store.get_worker(&exe.worker).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox, error = %e, "ports not pushed");
                    return;
                }
            };
            let update = Update::Ports {
                sandbox: *sandbox,
                generation: exe.generation,
                execution_id: exe.execution_id,
                ports,
            };
            if let Err(e) = self.deliver(&worker, update).await {
                tracing::warn!(sandbox = %sandbox, worker = %worker.id, error = %e, "ports not acknowledged; the next install or sync carries them");
                return;
            }
            told = Some(exe.execution());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sbx() -> SandboxId {
        SandboxId::from_bytes([3; 16])
    }

    #[test]
    fn a_link_cookie_opens_only_its_port_until_it_expires() {
        let key = [9u8; 32];
        let hash = secret_hash("spt_x");
        let mac = cookie_mac(&key, &sbx(), 8000, &hash, 1000);
        let cookie = format!("v1.8000.1000.{mac}");
        assert!(cookie_valid(&key, &cookie, &sbx(), 8000, &hash, 999));
        assert!(cookie_valid(&key, &cookie, &sbx(), 8000, &hash, 1000));
        assert!(
            !cookie_valid(&key, &cookie, &sbx(), 8000, &hash, 1001),
            "expired"
        );
        assert!(
            !cookie_valid(&key, &cookie, &sbx(), 8001, &hash, 999),
            "another port"
        );
        let other = SandboxId::from_bytes([4; 16]);
        assert!(
            !cookie_valid(&key, &cookie, &other, 8000, &hash, 999),
            "another sandbox"
        );
        let new_token = secret_hash("spt_y");
        assert!(
            !cookie_valid(&key, &cookie, &sbx(), 8000, &new_token, 999),
            "re-exposed"
        );
        assert!(
            !cookie_valid(&[8u8; 32], &cookie, &sbx(), 8000, &hash, 999),
            "another key"
        );
        let later = format!("v1.8000.99999.{mac}");
        assert!(
            !cookie_valid(&key, &later, &sbx(), 8000, &hash, 999),
            "expiry edited"
        );
        for junk in [
            "",
            "v1",
            "v1.8000.1000",
            &format!("v2.8000.1000.{mac}"),
            &format!("{cookie}.x"),
        ] {
            assert!(
                !cookie_valid(&key, junk, &sbx(), 8000, &hash, 999),
                "{junk}"
            );
        }
    }

    #[test]
    fn a_secret_matches_only_its_own_hash() {
        let h = secret_hash("spt_abc");
        assert!(secret_matches("spt_abc", &h));
        assert!(!secret_matches("spt_abd", &h));
        assert!(!secret_matches("spt_abc", "not hex"));
        assert_eq!(secret("spt_").len(), 4 + 64);
        assert_ne!(secret("spt_"), secret("spt_"));
    }
}
