//! What can go wrong in a pull. Messages are short, name what was refused and why,
//! and never carry a credential.

use std::path::PathBuf;

/// A pull's error.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// An image reference that is not one.
    #[error("invalid image reference {reference:?}: {why}")]
    Reference {
        /// The reference (its first 300 characters).
        reference: String,
        /// Why.
        why: &'static str,
    },
    /// A `--platform` that is not `os/arch[/variant]`.
    #[error("invalid platform {0:?}: expected os/arch[/variant] (linux/amd64, linux/arm/v7)")]
    Platform(String),
    /// Plain HTTP asked for (or redirected to) where it is not allowed.
    #[error("{url}: {why}")]
    PlainHttp {
        /// The URL refused.
        url: String,
        /// Why.
        why: &'static str,
    },
    /// A URL a registry sent (a redirect, a token realm) that cannot be used.
    #[error("{url:?}: {why}")]
    Url {
        /// The URL (its first 300 characters).
        url: String,
        /// Why.
        why: &'static str,
    },
    /// The trust roots could not be read.
    #[error("TLS trust roots: {0}")]
    Roots(String),
    /// No connection could be made.
    #[error("connect to {authority}: {why}")]
    Connect {
        /// `host:port`.
        authority: String,
        /// Why.
        why: String,
    },
    /// A connection or a read took too long.
    #[error("{url}: no answer within {secs} s ({during})")]
    Timeout {
        /// The URL.
        url: String,
        /// The bound.
        secs: u64,
        /// What was awaited.
        during: &'static str,
    },
    /// The connection failed mid-request.
    #[error("{url}: {why}")]
    Http {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The registry answered with an error status.
    #[error("{url}: HTTP {status}{message}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// `: ` and the start of its message (printable characters only), or nothing.
        message: String,
    },
    /// Too many redirects in a row.
    #[error("{url}: more than {limit} redirects")]
    TooManyRedirects {
        /// The last URL redirected from.
        url: String,
        /// The bound.
        limit: usize,
    },
    /// A redirect that is not followed.
    #[error("redirect from {from} refused: {why}")]
    Redirect {
        /// The URL redirected from.
        from: String,
        /// Why.
        why: String,
    },
    /// Authentication failed or could not be attempted.
    #[error("{registry}: authentication: {why}")]
    Auth {
        /// The registry.
        registry: String,
        /// Why.
        why: String,
    },
    /// Something sent is larger than its bound.
    #[error("{what}: more than {} (refused)", human(*.limit))]
    TooLarge {
        /// What.
        what: String,
        /// The bound, in bytes.
        limit: u64,
    },
    /// A blob whose byte count is not its descriptor's.
    #[error("{what}: {why} than its descriptor's size of {size} bytes (refused)")]
    Size {
        /// What.
        what: String,
        /// `more bytes` / `fewer bytes`.
        why: &'static str,
        /// The descriptor's size.
        size: u64,
    },
    /// Bytes whose digest is not the one they were asked by.
    #[error("{what}: the bytes received have digest {actual}, not {expected} (refused)")]
    Digest {
        /// What.
        what: String,
        /// The digest asked for.
        expected: String,
        /// The digest of what came.
        actual: String,
    },
    /// A media type that is not pulled.
    #[error("{what}: unsupported media type {media_type:?}")]
    MediaType {
        /// What.
        what: String,
        /// The media type (its first 100 characters).
        media_type: String,
    },
    /// A document that is not what it should be.
    #[error("{what}: {why}")]
    Format {
        /// What.
        what: String,
        /// Why.
        why: String,
    },
    /// An image index without a manifest for the platform asked.
    #[error("the image index has no manifest for {wanted} (it has: {listed})")]
    NoPlatform {
        /// `os/arch[/variant]`.
        wanted: String,
        /// The platforms it has.
        listed: String,
    },
    /// A file of the layout could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Credentials that cannot be read.
    #[error("registry credentials: {0}")]
    Credentials(String),
}

/// A pull's result.
pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

impl RegistryError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(what: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Format {
            what: what.into(),
            why: why.into(),
        }
    }

    pub(crate) fn media_type(what: impl Into<String>, media_type: &str) -> Self {
        Self::MediaType {
            what: what.into(),
            media_type: media_type.chars().take(100).collect(),
        }
    }
}

/// `4 MiB`, `512 KiB`, `123 bytes`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// At most `max` characters of `text` a registry sent, printable ASCII only (a
/// hostile registry does not get to write escape sequences to a terminal).
pub(crate) fn printable(text: &[u8], max: usize) -> String {
    String::from_utf8_lossy(text)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                ' '
            }
        })
        .take(max)
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_worded_in_binary_units_when_exact() {
        assert_eq!(human(4 << 20), "4 MiB");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(1000), "1000 bytes");
    }

    #[test]
    fn a_registry_message_loses_its_control_characters() {
        assert_eq!(
            printable(b"bad\x1b[31m thing\n\n here", 100),
            "bad [31m thing here"
        );
        assert_eq!(printable(b"abcdef", 3), "abc");
    }
}
