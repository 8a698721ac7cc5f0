//! Small codecs shared by the identifiers and the binary formats.

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Text of a 16-byte ID in lowercase RFC 4648 base32 without padding (26 characters).
pub(crate) struct Base32Id([u8; 26]);

impl Base32Id {
    pub(crate) fn as_str(&self) -> &str {
        // The alphabet is ASCII, so this never fails.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

pub(crate) fn base32_encode_16(bytes: &[u8; 16]) -> Base32Id {
    let mut out = [0u8; 26];
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    let mut n = 0;
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out[n] = ALPHABET[((acc >> bits) & 31) as usize];
            n += 1;
        }
    }
    // 128 = 25 * 5 + 3: three bits remain, padded with two zero bits.
    out[n] = ALPHABET[((acc << (5 - bits)) & 31) as usize];
    Base32Id(out)
}

/// Strict inverse of [`base32_encode_16`]: exactly 26 characters of the lowercase
/// alphabet, and the two padding bits of the last character must be zero (so every ID
/// has one spelling).
pub(crate) fn base32_decode_16(s: &str) -> Option<[u8; 16]> {
    let s = s.as_bytes();
    if s.len() != 26 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    let mut n = 0;
    for (i, &c) in s.iter().enumerate() {
        let v = match c {
            b'a'..=b'z' => c - b'a',
            b'2'..=b'7' => c - b'2' + 26,
            _ => return None,
        };
        if i == 25 {
            if v & 0b11 != 0 {
                return None;
            }
            acc = (acc << 3) | u32::from(v >> 2);
            bits += 3;
        } else {
            acc = (acc << 5) | u32::from(v);
            bits += 5;
        }
        if bits >= 8 {
            bits -= 8;
            out[n] = (acc >> bits) as u8;
            n += 1;
        }
    }
    (n == 16).then_some(out)
}

/// Cursor over a byte slice for the strict binary decoders.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }
}

/// Implements `FromStr` for a fieldless enum with an `as_str` text form.
macro_rules! text_enum {
    ($ty:ident, $kind:literal, [$($variant:ident),+ $(,)?]) => {
        impl ::std::str::FromStr for $ty {
            type Err = $crate::ParseIdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $(if s == $ty::$variant.as_str() {
                    return Ok($ty::$variant);
                })+
                Err($crate::ParseIdError::new($kind))
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $crate::codec::serde_text!($ty);
    };
}
pub(crate) use text_enum;

/// Serde support through the text form (`Display` + `FromStr`), behind the `serde`
/// feature.
macro_rules! serde_text {
    ($ty:ty) => {
        #[cfg(feature = "serde")]
        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use serde_text;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_round_trips_every_byte_value() {
        for b in 0..=255u8 {
            let mut id = [b; 16];
            id[15] = b.wrapping_mul(7);
            let text = base32_encode_16(&id);
            assert_eq!(base32_decode_16(text.as_str()), Some(id));
        }
    }

    #[test]
    fn base32_refuses_wrong_lengths_and_characters() {
        assert_eq!(base32_decode_16(""), None);
        assert_eq!(base32_decode_16(&"a".repeat(25)), None);
        assert_eq!(base32_decode_16(&"a".repeat(27)), None);
        assert_eq!(base32_decode_16(&"1".repeat(26)), None);
        assert_eq!(base32_decode_16(&"A".repeat(26)), None);
    }
}
