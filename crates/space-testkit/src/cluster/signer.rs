//! Acting as a second control-plane replica on a cluster's store: signed updates and
//! delivery headers, under update numbers the platform itself will not use.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;

use super::http::post_delivered;
use super::up::Cluster;
use crate::clock::unix_now;
use crate::rng::rand_u128;

/// URL-safe base64 without padding, as the platform writes signed envelopes.
fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The trust anchor of a cluster (its seed read from `control.db`), and the next
/// update sequence number of a worker reserved the way the control plane reserves them
/// (so the test's signed updates never collide with the platform's own).
#[derive(Debug)]
pub struct Signer {
    anchor: space_identity::BundleSigner,
    db: PathBuf,
}

impl Signer {
    /// The signer of `c`.
    pub fn of(c: &Cluster) -> Self {
        let db = c.data_dir().join("control.db");
        let seed_hex: String = rusqlite::Connection::open(&db)
            .expect("open control.db")
            .query_row("SELECT value FROM kv WHERE name = 'anchor_seed'", [], |r| {
                r.get(0)
            })
            .expect("the anchor's seed");
        let seed: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&seed_hex[2 * i..2 * i + 2], 16).expect("hex seed"))
            .collect();
        Self {
            anchor: space_identity::BundleSigner::from_seed(
                seed.try_into().expect("a 32-byte seed"),
            ),
            db,
        }
    }

    /// Reserves the next update sequence number of `worker`.
    pub fn next_seq(&self, worker: &str) -> u64 {
        let conn = rusqlite::Connection::open(&self.db).expect("open control.db");
        conn.busy_timeout(Duration::from_secs(30))
            .expect("set a busy timeout");
        let last: i64 = conn
            .query_row(
                "INSERT INTO update_sequences (worker, last) VALUES (?1, 1) \
                 ON CONFLICT (worker) DO UPDATE SET last = update_sequences.last + 1 RETURNING last",
                [worker],
                |r| r.get(0),
            )
            .expect("reserve an update number");
        last as u64
    }

    /// The signed envelope (JSON text) of `body` (the JSON of an update body).
    pub fn sign(&self, body: &str) -> String {
        serde_json::json!({
            "body": b64(body.as_bytes()),
            "signature": b64(&self.anchor.sign_update(body.as_bytes())),
        })
        .to_string()
    }

    /// The signed delivery header (`space-delivery`) of an update request body for
    /// `worker`, as the control plane makes it.
    pub fn delivery(&self, worker: &str, body: &[u8]) -> String {
        let descriptor = serde_json::json!({
            "worker": worker,
            "issued_at": unix_now(),
            "size": body.len(),
            "digest": blake3::hash(body).to_hex().to_string(),
            "nonce": format!("{:032x}", rand_u128()),
        })
        .to_string();
        let signature = self.anchor.sign_delivery(descriptor.as_bytes());
        format!("{}.{}", b64(descriptor.as_bytes()), b64(&signature))
    }

    /// POSTs an update request body to a worker's `/internal/v1/updates` with a valid
    /// delivery header for `worker`, as the control plane does.
    pub fn post_update(&self, url: &str, worker: &str, body: &[u8]) -> (u16, Vec<u8>) {
        post_delivered(url, &self.delivery(worker, body), body)
    }

    /// A signed update for `worker` issued now, under a freshly reserved number.
    pub fn update(&self, worker: &str, update: serde_json::Value) -> String {
        self.update_at(worker, unix_now(), update)
    }

    /// A signed update for `worker` issued at `issued_at`, under a freshly reserved
    /// number.
    pub fn update_at(&self, worker: &str, issued_at: u64, update: serde_json::Value) -> String {
        let body = serde_json::json!({
            "worker": worker,
            "issued_at": issued_at,
            "seq": self.next_seq(worker),
            "update": update,
        });
        self.sign(&body.to_string())
    }
}
