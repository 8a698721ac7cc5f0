//! API keys: `space_<id>_<secret>`. Only the BLAKE3 hash of the secret is stored;
//! lookups are by the public id and the hash is compared in constant time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::random_bytes;

/// A key as handed to its owner once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedKey {
    /// Public part, stored.
    pub id: String,
    /// The whole key, shown once.
    pub text: String,
    /// BLAKE3 of the secret part, stored.
    pub hash: [u8; 32],
}

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

fn base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 8 / 5 + 1);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Makes a new random key: 80-bit public id, 256-bit secret.
pub fn issue_key() -> IssuedKey {
    let id = format!("ak{}", base32(&random_bytes::<10>()));
    let secret = base32(&random_bytes::<32>());
    let hash = *blake3::hash(secret.as_bytes()).as_bytes();
    IssuedKey {
        text: format!("space_{id}_{secret}"),
        id,
        hash,
    }
}

/// Splits a presented key into (id, hash of secret). `None` for anything malformed.
pub fn parse_key(text: &str) -> Option<(&str, [u8; 32])> {
    let rest = text.strip_prefix("space_")?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b));
    if !id.starts_with("ak") || !ok(&id[2..], 16) || !ok(secret, 52) {
        return None;
    }
    Some((id, *blake3::hash(secret.as_bytes()).as_bytes()))
}

/// Who a valid key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Tenant ID.
    pub tenant: String,
    /// The key's id.
    pub key_id: String,
    /// Whether the key may administer (create tenants and keys, rotate signing keys).
    pub admin: bool,
}

/// A short-lived cache of verified keys, so the store is not read on every request.
/// Its lifetime bounds how long a revoked key keeps working (on other replicas; the
/// replica that revokes drops the entry at once).
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<HashMap<KeyRef, (Caller, Instant)>>,
}

/// A key's id and the hash of the secret presented with it.
type KeyRef = (String, [u8; 32]);

impl KeyCache {
    /// A cache whose entries live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// A cached caller for this key, if fresh.
    pub fn get(&self, id: &str, hash: &[u8; 32]) -> Option<Caller> {
        let entries = self.entries.lock().ok()?;
        let (caller, at) = entries.get(&(id.to_owned(), *hash))?;
        (at.elapsed() < self.ttl).then(|| caller.clone())
    }

    /// Remembers a verified caller.
    pub fn put(&self, id: &str, hash: [u8; 32], caller: Caller) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() > 10_000 {
                entries.retain(|_, (_, at)| at.elapsed() < self.ttl);
            }
            entries.insert((id.to_owned(), hash), (caller, Instant::now()));
        }
    }

    /// Forgets every entry of key `id` (on revocation).
    pub fn forget(&self, id: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|(k, _), _| k != id);
        }
    }
}

/// Constant-time equality of two hashes.
pub fn hashes_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    blake3::Hash::from(*a) == blake3::Hash::from(*b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_key_parses_back_to_its_id_and_hash() {
        let k = issue_key();
        let (id, hash) = parse_key(&k.text).unwrap();
        assert_eq!(id, k.id);
        assert!(hashes_equal(&hash, &k.hash));
    }

    #[test]
    fn malformed_keys_are_refused() {
        let k = issue_key();
        for bad in [
            "",
            "space_",
            &k.text[..k.text.len() - 1],
            &format!("{}a", k.text),
            &k.text.replace("space_", "spice_"),
            &k.text.to_uppercase(),
        ] {
            assert!(parse_key(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn another_secret_with_the_same_id_hashes_differently() {
        let a = issue_key();
        let b = issue_key();
        let forged = format!("space_{}_{}", a.id, b.text.rsplit('_').next().unwrap());
        let (_, hash) = parse_key(&forged).unwrap();
        assert!(!hashes_equal(&hash, &a.hash));
    }
}
