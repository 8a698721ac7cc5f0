//! Every bound the importer and the unpacker hold to.

use crate::error::ImageError;

/// The largest JSON document read (an index, a manifest, an image config, our own
/// manifest or a name record).
pub const MAX_JSON: u64 = 4 << 20;

/// The most layers an image may have.
pub const MAX_LAYERS: usize = 128;

/// The most tar entries (extension headers included) in one layer.
pub const MAX_ENTRIES_PER_LAYER: u64 = 1 << 20;

/// The most members in an image archive (a tar of an OCI layout or a `docker save`).
pub const MAX_ARCHIVE_MEMBERS: usize = 1 << 16;

/// The longest path, or link target, of a layer entry (bytes; Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// The largest PAX extension header of one entry.
pub const MAX_PAX: u64 = 64 << 10;

/// The most directory entries the resolution of one layer's paths through symbolic
/// links may look at by default (every layer's, for every name): a layer of a million
/// entries each through a link of its own would otherwise make its unpack a search
/// of every lower layer a million times.
pub const MAX_LOOKUPS_PER_LAYER: u64 = 1 << 25;

/// How deep an OCI index may nest indexes.
pub const MAX_INDEX_DEPTH: usize = 4;

/// The default bound on uids and gids in a layer: the size of a sandbox's id range
/// (ids at or above it would map outside the sandbox's user namespace).
pub const DEFAULT_ID_LIMIT: u64 = 65_536;

/// The default bound on the unpacked bytes of one image: its layers' decompressed tar
/// streams together (16 GiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 16 << 30;

/// The default bound on the unpacked bytes of one layer's decompressed tar stream
/// (the image's: one layer may be the whole image).
pub const DEFAULT_MAX_LAYER_BYTES: u64 = DEFAULT_MAX_IMAGE_BYTES;

/// The environment variable that sets [`ImageLimits::max_image_bytes`].
pub const MAX_IMAGE_BYTES_VAR: &str = "SPACE_TEMPLATE_MAX_IMAGE_BYTES";

/// The environment variable that sets [`ImageLimits::max_layer_bytes`].
pub const MAX_LAYER_BYTES_VAR: &str = "SPACE_TEMPLATE_MAX_LAYER_BYTES";

/// How much an image may unpack to, wherever its layers are decompressed (the control
/// plane hashing them at import, a worker unpacking them). Enforced on the
/// decompressed stream as it is read: no byte past a bound is written anywhere, so a
/// small gzip or zstd blob of zeros (a decompression bomb) stops at the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// All layers of one image together.
    pub max_image_bytes: u64,
    /// One layer.
    pub max_layer_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
        }
    }
}

impl ImageLimits {
    /// The defaults with what `get` (an environment) sets: [`MAX_IMAGE_BYTES_VAR`] and
    /// [`MAX_LAYER_BYTES_VAR`], each a byte count with an optional binary suffix (`K`,
    /// `M`, `G`, `T`; `512M`, `16G`). A value that is not one, or is 0, is an error.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let base = Self::default();
        let read = |var: &str, default: u64| -> Result<u64, String> {
            match get(var) {
                None => Ok(default),
                Some(v) => parse_bytes(&v).ok_or_else(|| {
                    format!(
                        "{var}={v:?}: not a byte count above 0 (a number, optionally with \
                         K, M, G or T)"
                    )
                }),
            }
        };
        Ok(Self {
            max_image_bytes: read(MAX_IMAGE_BYTES_VAR, base.max_image_bytes)?,
            max_layer_bytes: read(MAX_LAYER_BYTES_VAR, base.max_layer_bytes)?,
        })
    }

    /// [`Self::from_vars`] of the process's environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

/// What one layer may unpack to: its own bound, or what is left of its image's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerBudget {
    /// The bytes it may unpack to.
    pub(crate) bytes: u64,
    /// Whether the image's bound is the nearer one.
    image: bool,
    limits: ImageLimits,
}

impl ImageLimits {
    /// The budget of a layer of an image whose layers below unpacked to `used` bytes.
    pub(crate) fn next_layer(&self, used: u64) -> LayerBudget {
        let left = self.max_image_bytes.saturating_sub(used);
        LayerBudget {
            bytes: left.min(self.max_layer_bytes),
            image: left < self.max_layer_bytes,
            limits: *self,
        }
    }
}

impl LayerBudget {
    /// The error of layer `layer` passing this budget.
    pub(crate) fn exceeded(&self, layer: &str) -> ImageError {
        if self.image {
            ImageError::Unpacked {
                what: format!("the image (its layers up to {layer})"),
                limit: self.limits.max_image_bytes,
                scope: "one image",
                setting: MAX_IMAGE_BYTES_VAR,
            }
        } else {
            ImageError::Unpacked {
                what: format!("layer {layer}"),
                limit: self.limits.max_layer_bytes,
                scope: "one layer",
                setting: MAX_LAYER_BYTES_VAR,
            }
        }
    }
}

/// `1234`, `64K`, `512M`, `16G`, `1T` (binary multiples; `KiB`… and `KB`… too).
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift).filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_limits_are_read_from_the_environment_and_bad_values_refused() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            ImageLimits::from_vars(vars(&[])),
            Ok(ImageLimits::default())
        );
        let l = ImageLimits::from_vars(vars(&[
            (MAX_IMAGE_BYTES_VAR, "32G"),
            (MAX_LAYER_BYTES_VAR, "512MiB"),
        ]))
        .unwrap_or_default();
        assert_eq!(
            (l.max_image_bytes, l.max_layer_bytes),
            (32 << 30, 512 << 20)
        );
        assert_eq!(parse_bytes("1234"), Some(1234));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        for bad in ["0", "", "-1", "12X", "G", "99999999999T"] {
            let e = ImageLimits::from_vars(|k| (k == MAX_LAYER_BYTES_VAR).then(|| bad.into()));
            assert!(
                e.as_ref().is_err_and(|e| e.contains(MAX_LAYER_BYTES_VAR)),
                "{bad:?}: {e:?}"
            );
        }
    }
}
