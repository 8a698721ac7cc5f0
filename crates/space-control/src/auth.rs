//! API keys: `space_<id>_<secret>`, or in E2B's format `e2b_<hex>` (the same id and a
//! secret of its own, for the E2B SDKs). Only the BLAKE3 hash of the secret is
//! stored; lookups are by the public id and the hash is compared in constant time.

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

/// Which form a new key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyFormat {
    /// `space_<id>_<secret>` (base32).
    #[default]
    Space,
    /// `e2b_` and 60 lowercase hex digits: the id's 10 bytes, then a 160-bit secret
    /// (what E2B's SDKs take for a key).
    E2b,
}

/// Bytes of the secret of an E2B-format key.
const E2B_SECRET_BYTES: usize = 20;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `2 × N` lowercase hex digits as bytes.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Makes a new random key in `format`.
pub fn issue_key_as(format: KeyFormat) -> IssuedKey {
    match format {
        KeyFormat::Space => issue_key(),
        KeyFormat::E2b => {
            let id_bytes = random_bytes::<10>();
            let secret = hex(&random_bytes::<E2B_SECRET_BYTES>());
            IssuedKey {
                id: format!("ak{}", base32(&id_bytes)),
                text: format!("e2b_{}{secret}", hex(&id_bytes)),
                hash: *blake3::hash(secret.as_bytes()).as_bytes(),
            }
        }
    }
}

/// Splits a presented key into (id, hash of secret). `None` for anything malformed.
pub fn parse_key(text: &str) -> Option<(String, [u8; 32])> {
    if let Some(digits) = text.strip_prefix("e2b_") {
        if digits.len() != 20 + 2 * E2B_SECRET_BYTES || !digits.is_ascii() {
            return None;
        }
        let (id, secret) = digits.split_at(20);
        let id_bytes = unhex::<10>(id)?;
        unhex::<E2B_SECRET_BYTES>(secret)?;
        return Some((
            format!("ak{}", base32(&id_bytes)),
            *blake3::hash(secret.as_bytes()).as_bytes(),
        ));
    }
    let rest = text.strip_prefix("space_")?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b));
    if !id.starts_with("ak") || !ok(&id[2..], 16) || !ok(secret, 52) {
        return None;
    }
    Some((id.to_owned(), *blake3::hash(secret.as_bytes()).as_bytes()))
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

    #[test]
    fn an_e2b_format_key_is_e2b_and_hex_and_parses_back_to_its_id_and_hash() {
        let k = issue_key_as(KeyFormat::E2b);
        let digits = k.text.strip_prefix("e2b_").unwrap();
        assert_eq!(digits.len(), 60);
        assert!(
            digits
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let (id, hash) = parse_key(&k.text).unwrap();
        assert_eq!(id, k.id);
        assert!(id.starts_with("ak") && id.len() == 18);
        assert!(hashes_equal(&hash, &k.hash));
    }

    #[test]
    fn malformed_e2b_keys_are_refused_and_a_forged_secret_hashes_differently() {
        let k = issue_key_as(KeyFormat::E2b);
        for bad in [
            "e2b_",
            &k.text[..k.text.len() - 1],
            &format!("{}0", k.text),
            &k.text.to_uppercase(),
            &k.text.replace("e2b_", "e3b_"),
            &format!("e2b_{}g", &k.text[4..k.text.len() - 1]),
            // A character of several bytes across the id's end: refused, no panic.
            &format!("e2b_{}é{}", "a".repeat(19), "b".repeat(39)),
        ] {
            assert!(parse_key(bad).is_none(), "{bad:?}");
        }
        let other = issue_key_as(KeyFormat::E2b);
        let forged = format!("{}{}", &k.text[..24], &other.text[24..]);
        let (id, hash) = parse_key(&forged).unwrap();
        assert_eq!(id, k.id);
        assert!(!hashes_equal(&hash, &k.hash));
    }
}
