//! The strict body codec: postcard, with exactly one accepted encoding per value.
//!
//! postcard alone tolerates trailing bytes (with `take_from_bytes`) and over-long
//! varints. We refuse both: after decoding, the value is encoded again and must
//! reproduce the input byte for byte. That costs one encode per message and buys a
//! canonical wire form, so two different byte strings never mean the same message.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not a valid encoding of the expected type (unknown variant, truncated, bad UTF-8 …).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A valid value followed by extra bytes.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A valid value in a non-canonical spelling (e.g. an over-long varint).
    #[error("non-canonical encoding")]
    NonCanonical,
}

/// Encodes a message body.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising our own types to a Vec cannot fail: they contain no maps with
    // non-string keys, no unsized sequences and no custom errors.
    postcard::to_stdvec(value).unwrap_or_default()
}

/// Decodes a message body strictly: the whole input, in its canonical form.
pub fn decode<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes::<T>(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    if postcard::to_stdvec(&value).ok().as_deref() != Some(bytes) {
        return Err(DecodeError::NonCanonical);
    }
    Ok(value)
}

/// Serde adapters for the wire form of fields.
pub(crate) mod wire {
    /// Byte strings as one length-prefixed run instead of a sequence of integers:
    /// postcard then decodes a 64 KiB chunk with one copy rather than 64 Ki visits.
    pub(crate) mod bytes {
        use serde::de::{Error, SeqAccess, Visitor};
        use serde::{Deserializer, Serializer};
        use std::fmt;

        pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Vec<u8>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                    Ok(v.to_vec())
                }
                fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                    Ok(v)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(b) = seq.next_element()? {
                        out.push(b);
                    }
                    Ok(out)
                }
            }
            d.deserialize_byte_buf(V)
        }
    }

    /// Optional byte strings, as [`bytes`].
    pub(crate) mod opt_bytes {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        #[derive(Serialize, Deserialize)]
        struct Wrap(#[serde(with = "super::bytes")] Vec<u8>);

        pub(crate) fn serialize<S: Serializer>(
            v: &Option<Vec<u8>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match v {
                Some(b) => s.serialize_some(&Wrap(b.clone())),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<u8>>, D::Error> {
            Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
        }
    }

    /// Identifiers as their 16 raw bytes: compact on a hop where every agent frame names
    /// its execution. (Their text form is for JSON, logs and URLs.)
    macro_rules! raw_id {
        ($module:ident, $ty:ty) => {
            pub(crate) mod $module {
                use serde::{Deserialize, Deserializer, Serialize, Serializer};

                pub(crate) fn serialize<S: Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                    v.as_bytes().serialize(s)
                }

                pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
                    d: D,
                ) -> Result<$ty, D::Error> {
                    <[u8; 16]>::deserialize(d).map(<$ty>::from_bytes)
                }
            }
        };
    }

    raw_id!(sandbox_id, space_identity::SandboxId);
    raw_id!(execution_id, space_identity::ExecutionId);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        n: u64,
        #[serde(with = "wire::bytes")]
        data: Vec<u8>,
    }

    #[test]
    fn over_long_varint_is_refused_as_non_canonical() {
        // 0x80 0x00 is a two-byte spelling of 0; postcard itself accepts it.
        let canonical = encode(&Sample {
            n: 0,
            data: vec![1],
        });
        assert_eq!(canonical, [0x00, 0x01, 0x01]);
        assert_eq!(decode::<Sample>(&canonical).unwrap().data, [1]);
        let long = [0x80, 0x00, 0x01, 0x01];
        assert_eq!(decode::<Sample>(&long), Err(DecodeError::NonCanonical));
    }

    #[test]
    fn trailing_byte_is_refused() {
        let mut bytes = encode(&Sample { n: 7, data: vec![] });
        bytes.push(0);
        assert_eq!(decode::<Sample>(&bytes), Err(DecodeError::TrailingBytes(1)));
    }

    #[test]
    fn bytes_are_one_length_prefixed_run() {
        let bytes = encode(&Sample {
            n: 1,
            data: vec![0xff; 200],
        });
        // n, a two-byte varint length (200), then the raw bytes.
        assert_eq!(bytes.len(), 1 + 2 + 200);
    }
}
