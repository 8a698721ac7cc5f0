//! Image references as Docker reads them: `[registry[:port]/]path[:tag][@sha256:…]`.
//!
//! The first path component is a registry when it has a `.` or a `:`, is
//! `localhost`, or has an uppercase letter; otherwise the image is on Docker Hub
//! (`registry-1.docker.io`), where a one-component path is an official image
//! (`library/…`). A reference with neither tag nor digest means `:latest`; one with
//! both is pulled by its digest (the tag only names it). Only sha256 digests are
//! accepted: they are the only ones checked.

use std::fmt;
use std::str::FromStr;

use space_image::Digest;

use crate::error::RegistryError;

/// Docker Hub's registry endpoint.
pub const DOCKER_HUB: &str = "registry-1.docker.io";

/// The names Docker Hub goes by in references.
const DOCKER_HUB_ALIASES: &[&str] = &["docker.io", "index.docker.io", DOCKER_HUB];

/// The longest repository name with its registry (Docker's bound).
pub const MAX_NAME: usize = 255;

/// The longest tag (Docker's bound).
pub const MAX_TAG: usize = 128;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

type Why = &'static str;

impl Reference {
    /// Parses a reference (see the module).
    pub fn parse(text: &str) -> Result<Self, RegistryError> {
        parse(text).map_err(|why| RegistryError::Reference {
            reference: text.chars().take(300).collect(),
            why,
        })
    }

    /// The registry's `host[:port]` (Docker Hub's endpoint for Docker Hub).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository path within the registry (`library/alpine`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, if any (`latest` when the reference has neither tag nor digest).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, if the reference pins one.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What the manifest is asked by: the digest if there is one, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_owned(),
        }
    }

    /// Whether this is Docker Hub.
    pub fn is_docker_hub(&self) -> bool {
        self.registry == DOCKER_HUB
    }

    /// The template name a pull makes when none is given: the path's last component
    /// and the tag, lowercased (template names are); a digest-only reference is
    /// tagged `sha256-` and the digest's first 12 hex digits.
    pub fn default_template_name(&self) -> String {
        let last = self
            .repository
            .rsplit('/')
            .next()
            .unwrap_or(&self.repository);
        let tag = match (&self.tag, &self.digest) {
            (Some(t), _) => t.to_ascii_lowercase(),
            (None, Some(d)) => format!("sha256-{}", &d.hex()[..12]),
            (None, None) => "latest".to_owned(),
        };
        format!("{last}:{tag}")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl FromStr for Reference {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn parse(text: &str) -> Result<Reference, Why> {
    if text.is_empty() {
        return Err("empty");
    }
    // A name, a tag and a digest cannot be longer together; nothing longer is looked at.
    if text.len() > MAX_NAME + 1 + MAX_TAG + 1 + 71 {
        return Err("too long");
    }
    let (rest, digest) = match text.split_once('@') {
        Some((rest, d)) => {
            let digest = d
                .parse::<Digest>()
                .map_err(|_| "a digest is sha256: and 64 lowercase hex digits")?;
            (rest, Some(digest))
        }
        None => (text, None),
    };
    // A tag is after the last `:` only if no `/` follows it (`host:5000/r` has none).
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    if name.len() > MAX_NAME {
        return Err("the name is longer than 255 characters");
    }
    let (registry, path) = split_registry(name);
    let registry = match registry {
        Some(r) => {
            check_registry(r)?;
            r
        }
        None => DOCKER_HUB,
    };
    check_path(path)?;
    let hub = DOCKER_HUB_ALIASES.contains(&registry);
    let repository = if hub && !path.contains('/') {
        format!("library/{path}")
    } else {
        path.to_owned()
    };
    let tag = match (tag, &digest) {
        (Some(t), _) => Some(t.to_owned()),
        (None, Some(_)) => None,
        (None, None) => Some("latest".to_owned()),
    };
    Ok(Reference {
        registry: if hub { DOCKER_HUB } else { registry }.to_owned(),
        repository,
        tag,
        digest,
    })
}

/// The registry part of `name`, if its first component is one.
fn split_registry(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

/// `host[:port]`: DNS labels, an IPv4 address, or `[IPv6]`.
fn check_registry(r: &str) -> Result<(), Why> {
    let (host, port) = if let Some(inner) = r.strip_prefix('[') {
        let (addr, after) = inner
            .split_once(']')
            .ok_or("an unclosed [ in the registry")?;
        addr.parse::<std::net::Ipv6Addr>()
            .map_err(|_| "not an IPv6 address in [ ]")?;
        match after {
            "" => (None, None),
            p => (
                None,
                Some(p.strip_prefix(':').ok_or("junk after ] in the registry")?),
            ),
        }
    } else {
        match r.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(r), None),
        }
    };
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.is_empty() || !host.split('.').all(label_ok) {
            return Err("the registry is not a host name or an address");
        }
    }
    if let Some(p) = port {
        let valid = !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok_and(|n| n > 0);
        if !valid {
            return Err("the registry's port is not a number from 1 to 65535");
        }
    }
    Ok(())
}

/// Path components: `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn check_path(path: &str) -> Result<(), Why> {
    if path.is_empty() {
        return Err("no repository name");
    }
    if path.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("a repository name must be lowercase");
    }
    for c in path.split('/') {
        check_component(c)?;
    }
    Ok(())
}

fn check_component(c: &str) -> Result<(), Why> {
    const BAD: Why =
        "a path component is lowercase letters and digits, separated by '.', '_', '__' or '-'";
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Err(BAD);
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: `.`, `_`, `__`, or `-`+, followed by an alphanumeric.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|x| x == b'-');
        if !ok {
            return Err(BAD);
        }
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(t: &str) -> Result<(), Why> {
    if t.is_empty() {
        return Err("an empty tag");
    }
    if t.len() > MAX_TAG {
        return Err("a tag is at most 128 characters");
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    if !word(b[0]) || !b.iter().all(|&x| word(x) || x == b'.' || x == b'-') {
        return Err("a tag is letters, digits, '_', '.' and '-', not starting with '.' or '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(s: &str) -> String {
        Reference::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .to_string()
    }

    fn why(s: &str) -> String {
        match Reference::parse(s) {
            Ok(r) => panic!("{s:?} parsed as {r}"),
            Err(e) => e.to_string(),
        }
    }

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_bare_name_is_an_official_docker_hub_image_at_latest() {
        assert_eq!(full("alpine"), "registry-1.docker.io/library/alpine:latest");
        assert_eq!(
            full("alpine:3.20"),
            "registry-1.docker.io/library/alpine:3.20"
        );
        let r = Reference::parse("alpine").unwrap_or_else(|e| panic!("{e}"));
        assert!(r.is_docker_hub());
        assert_eq!(r.manifest_reference(), "latest");
    }

    #[test]
    fn docker_io_and_its_aliases_are_docker_hub() {
        assert_eq!(full("docker.io/x/y"), "registry-1.docker.io/x/y:latest");
        assert_eq!(
            full("index.docker.io/library/debian:12"),
            "registry-1.docker.io/library/debian:12"
        );
        assert_eq!(
            full("docker.io/busybox"),
            "registry-1.docker.io/library/busybox:latest"
        );
        assert_eq!(full("user/app"), "registry-1.docker.io/user/app:latest");
    }

    #[test]
    fn a_first_component_with_a_dot_a_port_or_localhost_is_the_registry() {
        assert_eq!(full("ghcr.io/o/r:tag"), "ghcr.io/o/r:tag");
        assert_eq!(full("localhost/r"), "localhost/r:latest");
        assert_eq!(full("localhost:5000/a/b"), "localhost:5000/a/b:latest");
        assert_eq!(full("[::1]:5000/r:1"), "[::1]:5000/r:1");
        assert_eq!(full("127.0.0.1:5000/r"), "127.0.0.1:5000/r:latest");
        // Not a registry: no dot, no port, not localhost, lowercase.
        let r = Reference::parse("myhost/r").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.registry(), DOCKER_HUB);
        assert_eq!(r.repository(), "myhost/r");
    }

    #[test]
    fn a_port_is_not_mistaken_for_a_tag() {
        let r = Reference::parse("host:5000/r").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("host:5000", "r", Some("latest"))
        );
        let r = Reference::parse("host:5000/r:5001").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.registry(), r.tag()), ("host:5000", Some("5001")));
    }

    #[test]
    fn a_digest_pins_the_manifest_and_the_tag_only_names_it() {
        let r = Reference::parse(&format!("host:5000/r@sha256:{HEX}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.tag(), None);
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));
        assert_eq!(r.default_template_name(), "r:sha256-0123456789ab");
        let r = Reference::parse(&format!("ghcr.io/o/r:v1@sha256:{HEX}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.tag(), Some("v1"));
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));
        assert_eq!(r.to_string(), format!("ghcr.io/o/r:v1@sha256:{HEX}"));
    }

    #[test]
    fn bad_digests_are_refused_before_any_use() {
        for bad in [
            format!("r@sha256:{}", HEX.to_uppercase()),
            format!("r@sha256:{}", &HEX[1..]),
            format!("r@sha512:{HEX}"),
            "r@sha256:../../../etc/passwd".to_owned(),
            "r@".to_owned(),
            format!("r@sha256:{HEX}@sha256:{HEX}"),
        ] {
            assert!(why(&bad).contains("digest"), "{bad}: {}", why(&bad));
        }
    }

    #[test]
    fn uppercase_repository_names_are_refused() {
        assert!(why("Alpine").contains("lowercase"));
        assert!(why("ghcr.io/Owner/r").contains("lowercase"));
        // An uppercase first component is a registry, as Docker reads it; the tag
        // may have uppercase letters.
        assert_eq!(full("Host/r:V1"), "Host/r:V1");
    }

    #[test]
    fn too_long_names_and_tags_are_refused() {
        let long = format!("ghcr.io/{}", "a".repeat(250));
        assert!(why(&long).contains("longer than 255"), "{}", why(&long));
        let tag = format!("r:{}", "t".repeat(129));
        assert!(why(&tag).contains("at most 128"));
        assert!(why(&"x".repeat(10_000)).contains("too long"));
        // At the bounds: accepted.
        full(&format!("ghcr.io/{}", "a".repeat(247)));
        full(&format!("r:{}", "t".repeat(128)));
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "",
            "r:",
            ":tag",
            "a//b",
            "/r",
            "r/",
            "-r",
            "r-",
            "a..b",
            "a___b",
            "a.-b",
            "r:.tag",
            "r:-tag",
            "r:ta/g",
            "r:t@g",
            "host:0/r",
            "host:65536/r",
            "host:port/r",
            "[::1/r",
            "[zz]:5000/r",
            "bad_host.io/r",
            "-h.io/r",
            "r!",
            "café",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} was accepted");
        }
        for good in [
            "a-b", "a--b", "a__b", "a_b", "a.b", "a/b/c/d", "0/1", "r:_x",
        ] {
            full(good);
        }
    }

    #[test]
    fn the_default_template_name_is_the_last_component_and_the_tag() {
        let name = |s: &str| {
            Reference::parse(s)
                .unwrap_or_else(|e| panic!("{e}"))
                .default_template_name()
        };
        assert_eq!(name("alpine"), "alpine:latest");
        assert_eq!(name("ghcr.io/o/team/app:V2"), "app:v2");
        assert_eq!(name("localhost:5000/r:1.0"), "r:1.0");
    }
}
