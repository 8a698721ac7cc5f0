//! Content digests (`sha256:<hex>`) and a reader that hashes what passes through it.

use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A sha256 content digest, written `sha256:<64 lowercase hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The 64 hex digits (the file name of the blob or layer it names).
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
        s
    }

    /// Parses 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let bytes = hex.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(Self(out))
    }

    /// The OCI chain ID of a layer stacked on the layers whose chain ID is `parent`
    /// (`None`: the bottom layer, whose chain ID is its `diff_id`). An unpacked layer
    /// is named by it: what a layer unpacks to depends on the layers below (a path
    /// through their symbolic links), so one `diff_id` over two bases is two layers.
    pub fn chain(parent: Option<&Digest>, diff_id: &Digest) -> Self {
        match parent {
            None => *diff_id,
            Some(p) => Self::of(format!("{p} {diff_id}").as_bytes()),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A string that is not `sha256:<64 lowercase hex>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a sha256 digest: {0:?}")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix("sha256:")
            .and_then(Self::from_hex)
            .ok_or_else(|| BadDigest(s.chars().take(80).collect()))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Reads through `inner`, hashing and counting every byte read.
#[derive(Debug)]
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    /// Hashes what is read from `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads `inner` to its end (hashing the rest), then gives the digest and the byte
    /// count of everything read.
    pub fn finish(mut self) -> io::Result<(Digest, u64, R)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            Digest(self.hasher.finalize().into()),
            self.count,
            self.inner,
        ))
    }

    /// The inner reader.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_round_trips_through_its_text_form() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.to_string(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
    }

    #[test]
    fn uppercase_short_and_foreign_digests_are_refused() {
        let hex = Digest::of(b"x").hex();
        assert!(
            format!("sha256:{}", hex.to_uppercase())
                .parse::<Digest>()
                .is_err()
        );
        assert!(format!("sha256:{}", &hex[1..]).parse::<Digest>().is_err());
        assert!(format!("sha512:{hex}").parse::<Digest>().is_err());
        assert!("sha256:../../etc/passwd".parse::<Digest>().is_err());
    }

    #[test]
    fn the_hashing_reader_hashes_what_is_left_unread_too() {
        let mut r = HashingReader::new(&b"hello world"[..]);
        let mut first = [0u8; 5];
        r.read_exact(&mut first).unwrap_or_else(|e| panic!("{e}"));
        let (d, n, _) = r.finish().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((d, n), (Digest::of(b"hello world"), 11));
    }
}
