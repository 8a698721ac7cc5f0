//! The platform an image is pulled for (`os/arch[/variant]`), and its choice among an
//! image index's manifests.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::error::RegistryError;

/// `os/architecture[/variant]`, as OCI names them (`linux/amd64`, `linux/arm/v7`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`, …
    pub architecture: String,
    /// `v7`, `v8`, … when one is asked for.
    pub variant: Option<String>,
}

impl Platform {
    /// The host's: `linux/<its architecture>`.
    pub fn host() -> Self {
        Self {
            os: "linux".into(),
            architecture: space_image::oci::host_architecture().into(),
            variant: None,
        }
    }

    /// Whether the platform of an index entry is this one. With no variant asked,
    /// any variant is; `arm64` with no variant stated is `arm64/v8`.
    pub(crate) fn matches(&self, p: &IndexPlatform) -> bool {
        if p.os != self.os || p.architecture != self.architecture {
            return false;
        }
        let Some(want) = &self.variant else {
            return true;
        };
        match p.variant.as_deref() {
            Some(v) => v == want,
            None => self.architecture == "arm64" && want == "v8",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || RegistryError::Platform(s.chars().take(100).collect());
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 32
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let parts: Vec<&str> = s.split('/').collect();
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(|p| part_ok(p)) {
            return Err(bad());
        }
        Ok(Self {
            os: parts[0].to_owned(),
            architecture: parts[1].to_owned(),
            variant: parts.get(2).map(|v| (*v).to_owned()),
        })
    }
}

/// An index entry's `platform`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct IndexPlatform {
    pub(crate) os: String,
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) variant: Option<String>,
}

impl fmt::Display for IndexPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (os, arch) = (printable(&self.os), printable(&self.architecture));
        match &self.variant {
            Some(v) => write!(f, "{os}/{arch}/{}", printable(v)),
            None => write!(f, "{os}/{arch}"),
        }
    }
}

fn printable(s: &str) -> String {
    crate::error::printable(s.as_bytes(), 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(os: &str, arch: &str, variant: Option<&str>) -> IndexPlatform {
        IndexPlatform {
            os: os.into(),
            architecture: arch.into(),
            variant: variant.map(Into::into),
        }
    }

    fn platform(s: &str) -> Platform {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_platform_is_os_arch_and_an_optional_variant() {
        assert_eq!(platform("linux/amd64").to_string(), "linux/amd64");
        assert_eq!(platform("linux/arm/v7").variant.as_deref(), Some("v7"));
        for bad in [
            "linux",
            "linux/",
            "/amd64",
            "linux/amd64/v1/x",
            "Linux/amd64",
            "linux/amd 64",
        ] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
        assert_eq!(Platform::host().os, "linux");
    }

    #[test]
    fn a_variant_is_matched_only_when_asked_for() {
        let arm7 = entry("linux", "arm", Some("v7"));
        assert!(platform("linux/arm").matches(&arm7));
        assert!(platform("linux/arm/v7").matches(&arm7));
        assert!(!platform("linux/arm/v6").matches(&arm7));
        assert!(!platform("linux/arm64").matches(&arm7));
        assert!(!platform("windows/arm").matches(&arm7));
        assert!(platform("linux/arm64/v8").matches(&entry("linux", "arm64", None)));
        assert!(!platform("linux/arm/v7").matches(&entry("linux", "arm", None)));
    }
}
