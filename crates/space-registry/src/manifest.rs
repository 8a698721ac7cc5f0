//! The documents a registry serves, read as hostile input: media types checked,
//! digests parsed before any use, sizes bounded, a platform chosen from an index.
//! Everything here is pure (bytes in, a checked plan out).

use std::collections::HashMap;

use serde::Deserialize;
use space_image::limits::{MAX_INDEX_DEPTH, MAX_JSON, MAX_LAYERS};
use space_image::{Digest, ImageLimits};

use crate::error::{RegistryError, Result};
use crate::platform::{IndexPlatform, Platform};

/// OCI's image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker's manifest list.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// OCI's image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker's image manifest, schema 2.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Docker's schema 1 manifests (`…v1+json`, `…v1+prettyjws`): refused.
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// The `Accept` of a manifest request: every type pulled.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// The image config media types pulled.
pub const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// How deep indexes may nest (the importer's bound).
pub const MAX_DEPTH: usize = MAX_INDEX_DEPTH;

pub(crate) fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_LIST
}

fn is_manifest(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

/// A descriptor as a registry writes it (nothing in it trusted yet).
#[derive(Debug, Deserialize)]
struct RawDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<IndexPlatform>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// A checked descriptor: a sha256 digest, a size within its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blob {
    pub(crate) digest: Digest,
    pub(crate) size: u64,
    pub(crate) media_type: Option<String>,
}

fn digest(d: &str, what: &str) -> Result<Digest> {
    d.parse().map_err(|_| {
        RegistryError::format(
            what,
            format!(
                "{:?} is not a sha256 digest (sha256: and 64 lowercase hex digits)",
                d.chars().take(80).collect::<String>()
            ),
        )
    })
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| RegistryError::format(what, e.to_string()))
}

/// The media type of a manifest answer: the document's own `mediaType`, else a
/// known `Content-Type`, else told by its fields (OCI allows the field to be absent).
/// A document and a header that disagree, or a type not pulled, are refused.
pub(crate) fn media_type(bytes: &[u8], content_type: Option<&str>, what: &str) -> Result<String> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "schemaVersion", default)]
        schema_version: Option<u64>,
        #[serde(rename = "mediaType", default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe = parse(bytes, what)?;
    let header = content_type
        .map(|c| c.split(';').next().unwrap_or(c).trim())
        .filter(|c| is_index(c) || is_manifest(c) || c.starts_with(DOCKER_SCHEMA1));
    if probe.schema_version == Some(1) || header.is_some_and(|h| h.starts_with(DOCKER_SCHEMA1)) {
        return Err(RegistryError::format(
            what,
            "a Docker schema 1 manifest (deprecated since 2017) is not pulled",
        ));
    }
    let media = match (probe.media_type, header) {
        (Some(m), Some(h)) if m != h => {
            return Err(RegistryError::format(
                what,
                format!(
                    "the answer says {h:?}, the document {:?}",
                    m.chars().take(100).collect::<String>()
                ),
            ));
        }
        (Some(m), _) => m,
        (None, Some(h)) => h.to_owned(),
        (None, None) if probe.manifests.is_some() => OCI_INDEX.to_owned(),
        (None, None) => OCI_MANIFEST.to_owned(),
    };
    if !is_index(&media) && !is_manifest(&media) {
        return Err(RegistryError::media_type(what, &media));
    }
    Ok(media)
}

/// The manifest of an index for `platform`: build attestations and `unknown`
/// platforms are not images; an index of one entry without a platform is that
/// entry. Its digest is parsed and its size bounded by [`MAX_JSON`].
pub(crate) fn choose(index: &[u8], platform: &Platform) -> Result<Blob> {
    #[derive(Deserialize)]
    struct Index {
        manifests: Vec<RawDescriptor>,
    }
    let index: Index = parse(index, "the image index")?;
    let images: Vec<&RawDescriptor> = index
        .manifests
        .iter()
        .filter(|d| {
            d.annotations
                .get("vnd.docker.reference.type")
                .map(String::as_str)
                != Some("attestation-manifest")
                && d.platform.as_ref().is_none_or(|p| p.os != "unknown")
        })
        .collect();
    let chosen = match images.as_slice() {
        [only] if only.platform.is_none() => Some(*only),
        _ => images
            .iter()
            .find(|d| d.platform.as_ref().is_some_and(|p| platform.matches(p)))
            .copied(),
    };
    let Some(d) = chosen else {
        let listed: Vec<String> = images
            .iter()
            .take(32)
            .map(|d| {
                d.platform
                    .as_ref()
                    .map_or_else(|| "no platform".into(), |p| p.to_string())
            })
            .collect();
        return Err(RegistryError::NoPlatform {
            wanted: platform.to_string(),
            listed: if listed.is_empty() {
                "nothing".into()
            } else {
                listed.join(", ")
            },
        });
    };
    let blob = checked(d, "the image index's manifest", MAX_JSON)?;
    if let Some(m) = &blob.media_type {
        if !is_index(m) && !is_manifest(m) {
            return Err(RegistryError::media_type("the image index's manifest", m));
        }
    }
    Ok(blob)
}

fn checked(d: &RawDescriptor, what: &str, limit: u64) -> Result<Blob> {
    let digest = digest(&d.digest, what)?;
    if d.size > limit {
        return Err(RegistryError::TooLarge {
            what: format!("{what} {digest} (its descriptor's size)"),
            limit,
        });
    }
    Ok(Blob {
        digest,
        size: d.size,
        media_type: d.media_type.clone(),
    })
}

/// What an image manifest says to fetch, checked.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) config: Blob,
    pub(crate) layers: Vec<Blob>,
}

impl Plan {
    /// The blobs' total size.
    pub(crate) fn bytes(&self) -> u64 {
        self.config.size + self.layers.iter().map(|l| l.size).sum::<u64>()
    }
}

/// An image manifest's plan: a config within [`MAX_JSON`], 1 to [`MAX_LAYERS`]
/// layers of types the importer takes, each within `limits`' layer bound and all
/// within its image bound.
pub(crate) fn plan(manifest: &[u8], limits: &ImageLimits) -> Result<Plan> {
    #[derive(Deserialize)]
    struct Manifest {
        config: RawDescriptor,
        layers: Vec<RawDescriptor>,
    }
    let m: Manifest = parse(manifest, "the image manifest")?;
    let config = checked(&m.config, "the image config", MAX_JSON)?;
    let ct = config.media_type.as_deref().unwrap_or_default();
    if !CONFIG_TYPES.contains(&ct) {
        return Err(RegistryError::media_type("the image config", ct));
    }
    if m.layers.is_empty() {
        return Err(RegistryError::format("the image manifest", "no layer"));
    }
    if m.layers.len() > MAX_LAYERS {
        return Err(RegistryError::format(
            "the image manifest",
            format!("{} layers (at most {MAX_LAYERS})", m.layers.len()),
        ));
    }
    let mut total: u64 = 0;
    let mut layers = Vec::with_capacity(m.layers.len());
    for (i, d) in m.layers.iter().enumerate() {
        let what = format!("layer {}", i + 1);
        let layer = checked(d, &what, limits.max_layer_bytes)?;
        let mt = layer.media_type.as_deref().unwrap_or_default();
        if !space_image::oci::LAYER_TYPES.contains(&mt) {
            return Err(RegistryError::media_type(what, mt));
        }
        total = total.saturating_add(layer.size);
        if total > limits.max_image_bytes {
            return Err(RegistryError::TooLarge {
                what: "the image's layers (their descriptors' sizes)".into(),
                limit: limits.max_image_bytes,
            });
        }
        layers.push(layer);
    }
    Ok(Plan { config, layers })
}

/// The platform an image config states, checked against the one asked for.
pub(crate) fn check_config_platform(config: &[u8], wanted: &Platform) -> Result<String> {
    #[derive(Deserialize)]
    struct Config {
        #[serde(default)]
        os: String,
        #[serde(default)]
        architecture: String,
        #[serde(default)]
        variant: Option<String>,
    }
    let c: Config = parse(config, "the image config")?;
    let stated = IndexPlatform {
        os: c.os,
        architecture: c.architecture,
        variant: c.variant,
    };
    if !wanted.matches(&stated) {
        return Err(RegistryError::format(
            "the image config",
            format!("the image is for {stated}, not {wanted} (choose with --platform)"),
        ));
    }
    Ok(stated.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn platform(s: &str) -> Platform {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Ok(v) => panic!("accepted: {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn index() -> String {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", hex('a')), "size": 10,
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", hex('b')), "size": 11,
                 "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
                {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", hex('c')), "size": 12,
                 "platform": {"os": "unknown", "architecture": "unknown"},
                 "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
            ]
        })
        .to_string()
    }

    #[test]
    fn an_index_gives_the_manifest_of_the_platform_asked_for() {
        let i = index();
        let amd = choose(i.as_bytes(), &platform("linux/amd64")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((amd.digest.hex(), amd.size), (hex('a'), 10));
        let arm = choose(i.as_bytes(), &platform("linux/arm64")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(arm.digest.hex(), hex('b'));
        let e = err(choose(i.as_bytes(), &platform("linux/s390x")));
        assert!(
            e.contains("linux/s390x") && e.contains("linux/amd64, linux/arm64/v8"),
            "{e}"
        );
    }

    #[test]
    fn an_index_entry_with_a_path_for_a_digest_is_refused() {
        let i = serde_json::json!({"manifests": [{"mediaType": OCI_MANIFEST,
            "digest": "sha256:../../../../etc/passwd", "size": 1}]})
        .to_string();
        let e = err(choose(i.as_bytes(), &Platform::host()));
        assert!(e.contains("not a sha256 digest"), "{e}");
    }

    #[test]
    fn an_index_entry_larger_than_a_manifest_may_be_is_refused() {
        let i = serde_json::json!({"manifests": [{"mediaType": OCI_MANIFEST,
            "digest": format!("sha256:{}", hex('d')), "size": MAX_JSON + 1}]})
        .to_string();
        assert!(err(choose(i.as_bytes(), &Platform::host())).contains("more than 4 MiB"));
    }

    #[test]
    fn media_types_come_from_the_document_then_the_header_and_must_agree() {
        let m = format!(r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}"}}"#);
        assert_eq!(
            media_type(m.as_bytes(), Some("application/json"), "m")
                .ok()
                .as_deref(),
            Some(DOCKER_MANIFEST)
        );
        assert!(err(media_type(m.as_bytes(), Some(OCI_MANIFEST), "m")).contains("the answer says"));
        assert_eq!(
            media_type(br#"{"manifests":[]}"#, None, "m")
                .ok()
                .as_deref(),
            Some(OCI_INDEX)
        );
        assert_eq!(
            media_type(b"{}", Some(&format!("{DOCKER_LIST}; charset=utf-8")), "m")
                .ok()
                .as_deref(),
            Some(DOCKER_LIST)
        );
        assert!(err(media_type(br#"{"schemaVersion":1}"#, None, "m")).contains("schema 1"));
        let signed = "application/vnd.docker.distribution.manifest.v1+prettyjws";
        assert!(err(media_type(b"{}", Some(signed), "m")).contains("schema 1"));
        assert!(
            err(media_type(br#"{"mediaType":"text/html"}"#, None, "m"))
                .contains("unsupported media type")
        );
    }

    fn manifest(layers: serde_json::Value) -> String {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": CONFIG_TYPES[0], "digest": format!("sha256:{}", hex('c')), "size": 100},
            "layers": layers,
        })
        .to_string()
    }

    fn layer(d: &str, size: u64, mt: &str) -> serde_json::Value {
        serde_json::json!({"mediaType": mt, "digest": d, "size": size})
    }

    #[test]
    fn a_manifest_plan_checks_digests_media_types_and_sizes_before_any_fetch() {
        let limits = ImageLimits {
            max_image_bytes: 1000,
            max_layer_bytes: 600,
        };
        let gz = "application/vnd.oci.image.layer.v1.tar+gzip";
        let good = format!("sha256:{}", hex('1'));
        let m = manifest(serde_json::json!([layer(&good, 500, gz)]));
        let p = plan(m.as_bytes(), &limits).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.layers.len(), p.bytes()), (1, 600));
        let cases = [
            (
                manifest(serde_json::json!([layer("sha256:../x", 1, gz)])),
                "not a sha256 digest",
            ),
            (
                manifest(serde_json::json!([layer(&good, 700, gz)])),
                "more than 600 bytes",
            ),
            (
                manifest(serde_json::json!([
                    layer(&good, 600, gz),
                    layer(&good, 600, gz)
                ])),
                "the image's layers",
            ),
            (
                manifest(serde_json::json!([layer(&good, 1, "application/x-evil")])),
                "unsupported media type",
            ),
            (manifest(serde_json::json!([])), "no layer"),
        ];
        for (m, want) in cases {
            let e = err(plan(m.as_bytes(), &limits));
            assert!(e.contains(want), "{want}: {e}");
        }
        let too_many: Vec<_> = (0..=MAX_LAYERS).map(|_| layer(&good, 1, gz)).collect();
        let e = err(plan(
            manifest(serde_json::json!(too_many)).as_bytes(),
            &ImageLimits::default(),
        ));
        assert!(e.contains("at most 128"), "{e}");
    }

    #[test]
    fn a_config_for_another_platform_is_refused() {
        let c = br#"{"os":"linux","architecture":"arm64"}"#;
        assert_eq!(
            check_config_platform(c, &platform("linux/arm64"))
                .ok()
                .as_deref(),
            Some("linux/arm64")
        );
        assert!(err(check_config_platform(c, &platform("linux/amd64"))).contains("--platform"));
    }
}
