//! Our own description of a template — its layers and the image's defaults — and the
//! names templates go by. The template's digest is the sha256 of the manifest's
//! canonical JSON ([`TemplateManifest::canonical_json`]): the same image imported
//! anywhere, under any name, has the same digest.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::limits::MAX_LAYERS;

/// The manifest's format version.
pub const SCHEMA: u32 = 1;

/// A template: its layers, bottom first, and the defaults of its processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateManifest {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The image's architecture (`amd64`, `arm64`, …).
    pub architecture: String,
    /// The image's OS (`linux`).
    pub os: String,
    /// When the image says it was created (RFC 3339), if it does.
    pub created: Option<String>,
    /// The defaults of the image's config.
    pub config: ImageDefaults,
    /// The layers, bottom first (the image's order).
    pub layers: Vec<LayerRecord>,
}

/// The process defaults an image's config gives (`Env`, `WorkingDir`, `User`,
/// `Entrypoint`, `Cmd`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageDefaults {
    /// `NAME=value` pairs.
    pub env: Vec<String>,
    /// The working directory, if set.
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`, if set.
    pub user: Option<String>,
    /// The entrypoint, if set.
    pub entrypoint: Option<Vec<String>>,
    /// The command (or the entrypoint's arguments), if set.
    pub cmd: Option<Vec<String>>,
}

/// One layer: its blob as stored and the digest of its uncompressed tar stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerRecord {
    /// The blob's digest (compressed, as imported).
    pub digest: Digest,
    /// The uncompressed tar stream's digest: the unpacked layer's name.
    pub diff_id: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// The blob's media type.
    pub media_type: String,
}

impl TemplateManifest {
    /// The canonical JSON the digest is taken of (fields in declaration order, no
    /// whitespace).
    pub fn canonical_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The template's digest.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.canonical_json())
    }

    /// Checks what a manifest from elsewhere must hold to.
    pub fn validate(&self) -> Result<()> {
        if self.schema != SCHEMA {
            return Err(ImageError::Format(format!(
                "template manifest schema {} (this store reads {SCHEMA})",
                self.schema
            )));
        }
        if self.layers.is_empty() {
            return Err(ImageError::Format("a template with no layer".into()));
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(ImageError::limit("the number of layers", MAX_LAYERS as u64));
        }
        Ok(())
    }

    /// The chain ID of each layer, bottom first (the names of its unpacked layers).
    pub fn chain_ids(&self) -> Vec<Digest> {
        let mut out: Vec<Digest> = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let c = Digest::chain(out.last(), &l.diff_id);
            out.push(c);
        }
        out
    }

    /// The unpacked size is not part of the manifest; this is the blobs' total.
    pub fn blob_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

/// A template's name and tag: `name[:tag]`, the tag `latest` when none is given.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TemplateRef {
    /// Lowercase `[a-z0-9._-]`, starting with a letter or digit, at most 128.
    pub name: String,
    /// The same alphabet and length.
    pub tag: String,
}

/// The longest name, and the longest tag.
pub const MAX_NAME: usize = 128;

impl TemplateRef {
    /// Parses `name[:tag]`.
    pub fn parse(reference: &str) -> Result<Self> {
        let bad = |why| ImageError::InvalidName {
            reference: reference.chars().take(300).collect(),
            why,
        };
        let (name, tag) = match reference.split_once(':') {
            Some((n, t)) => (n, t),
            None => (reference, "latest"),
        };
        check_part(name).map_err(&bad)?;
        check_part(tag).map_err(bad)?;
        Ok(Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }
}

fn check_part(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("an empty name or tag");
    }
    if s.len() > MAX_NAME {
        return Err("a name or tag longer than 128");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("a name or tag may hold only a-z, 0-9, '.', '_' and '-'");
    }
    if !s.as_bytes()[0].is_ascii_alphanumeric() {
        return Err("a name or tag starts with a letter or a digit");
    }
    Ok(())
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_without_a_tag_is_latest() {
        let r = TemplateRef::parse("ubuntu-22.04").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.to_string(), "ubuntu-22.04:latest");
        let r = TemplateRef::parse("py:3.12_slim").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.name.as_str(), r.tag.as_str()), ("py", "3.12_slim"));
    }

    #[test]
    fn names_outside_the_alphabet_or_too_long_are_refused() {
        for bad in [
            "",
            "Ubuntu",
            "a/b",
            "..",
            ".hidden",
            "-x",
            "a:b:c",
            "a:",
            ":b",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(TemplateRef::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(TemplateRef::parse(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn the_digest_is_that_of_the_canonical_json() {
        let m = TemplateManifest {
            schema: SCHEMA,
            architecture: "amd64".into(),
            os: "linux".into(),
            created: None,
            config: ImageDefaults::default(),
            layers: vec![LayerRecord {
                digest: Digest::of(b"blob"),
                diff_id: Digest::of(b"tar"),
                size: 4,
                media_type: "application/vnd.oci.image.layer.v1.tar".into(),
            }],
        };
        let json = m.canonical_json();
        assert_eq!(m.digest(), Digest::of(&json));
        let back: TemplateManifest =
            serde_json::from_slice(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.digest(), m.digest());
    }
}
