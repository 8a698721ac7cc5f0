//! The URLs a pull connects to (the registry's, a redirect's, a token realm's) and
//! the one rule for plain HTTP: only when asked for, and only to a loopback host.

use std::fmt;
use std::net::IpAddr;

use crate::error::{RegistryError, Result};

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

/// An absolute `http(s)` URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    pub(crate) scheme: Scheme,
    /// The host, without the brackets of an IPv6 address.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `/path?query`.
    pub(crate) path: String,
}

/// The longest URL taken from a registry.
const MAX_URL: usize = 8 << 10;

fn bad(url: &str, why: &'static str) -> RegistryError {
    RegistryError::Url {
        url: url.chars().take(300).collect(),
        why,
    }
}

impl Url {
    /// The registry's base: `https://host[:port]` (or `http://` with plain HTTP).
    pub(crate) fn registry(authority: &str, scheme: Scheme) -> Result<Self> {
        let s = match scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        Self::parse(&format!("{s}://{authority}/"))
    }

    /// Parses an absolute `http` or `https` URL.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        if text.len() > MAX_URL {
            return Err(bad(text, "longer than 8 KiB"));
        }
        let uri: hyper::Uri = text.parse().map_err(|_| bad(text, "not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some("https") => Scheme::Https,
            Some("http") => Scheme::Http,
            _ => return Err(bad(text, "not an http or https URL")),
        };
        let authority = uri.authority().ok_or_else(|| bad(text, "no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad(text, "a URL with credentials in it"));
        }
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(bad(text, "no host"));
        }
        let port = match (authority.port_u16(), scheme) {
            (Some(p), _) => p,
            (None, Scheme::Https) => 443,
            (None, Scheme::Http) => 80,
        };
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        Ok(Self {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            path,
        })
    }

    /// `self` with another path (`/v2/…`).
    pub(crate) fn with_path(&self, path: &str) -> Self {
        Self {
            path: path.to_owned(),
            ..self.clone()
        }
    }

    /// A `Location` resolved against this URL: absolute, scheme-relative (`//host/…`)
    /// or absolute-path (`/…`); a relative path is taken from this URL's directory.
    pub(crate) fn join(&self, location: &str) -> Result<Self> {
        if location.len() > MAX_URL {
            return Err(bad(location, "longer than 8 KiB"));
        }
        if location.contains("://") {
            return Self::parse(location);
        }
        if let Some(rest) = location.strip_prefix("//") {
            let s = match self.scheme {
                Scheme::Http => "http",
                Scheme::Https => "https",
            };
            return Self::parse(&format!("{s}://{rest}"));
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = base.rsplit_once('/').map_or("", |(d, _)| d);
            format!("{dir}/{location}")
        };
        // Checked as a whole URL (the characters a request line may carry).
        Self::parse(&format!("{}{path}", self.origin()))
    }

    /// `scheme://authority`: what decides whether credentials go along.
    pub(crate) fn origin(&self) -> String {
        let s = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{s}://{}", self.authority())
    }

    /// `host[:port]` as a `Host` header says it (the port only when not the scheme's).
    pub(crate) fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = match self.scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// Whether the host is loopback by its name: `localhost`, 127.0.0.0/8 or `::1`
    /// (what `localhost` resolves to is checked again when connecting).
    pub(crate) fn is_loopback(&self) -> bool {
        is_loopback_host(&self.host)
    }

    /// Plain HTTP only when `plain_http` was asked for, and only to a loopback host;
    /// checked before any connection.
    pub(crate) fn check_scheme(&self, plain_http: bool) -> Result<()> {
        if self.scheme == Scheme::Https {
            return Ok(());
        }
        let why = if !plain_http {
            "plain HTTP needs --plain-http (and a loopback registry)"
        } else if !self.is_loopback() {
            "plain HTTP is allowed only to a loopback address (127.0.0.0/8, ::1, localhost); \
             use HTTPS"
        } else {
            return Ok(());
        };
        Err(RegistryError::PlainHttp {
            url: self.to_string(),
            why,
        })
    }
}

/// `localhost`, an address in 127.0.0.0/8, or `::1`.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Query strings (signed CDN URLs) are left out of messages.
        let path = self.path.split('?').next().unwrap_or("/");
        write!(f, "{}{path}", self.origin())
    }
}

/// `s` percent-encoded for a query string (everything but unreserved characters).
pub(crate) fn encode_query_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn urls_are_split_with_default_ports_and_unbracketed_hosts() {
        let u = url("https://Ghcr.IO/v2/?x=1");
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("ghcr.io", 443, "/v2/?x=1")
        );
        assert_eq!(u.authority(), "ghcr.io");
        let u = url("http://[::1]:5000");
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 5000, "/")
        );
        assert_eq!(u.origin(), "http://[::1]:5000");
        assert!(Url::parse("ftp://x/").is_err());
        assert!(Url::parse("https://user:pw@x/").is_err());
        assert!(Url::parse("/relative").is_err());
    }

    #[test]
    fn locations_resolve_against_the_url_redirected_from() {
        let base = url("https://r.io:8443/v2/a/blobs/sha256:1?x");
        assert_eq!(
            base.join("/other").map(|u| u.to_string()).ok(),
            Some("https://r.io:8443/other".into())
        );
        assert_eq!(
            base.join("//cdn.io/p?sig=1").map(|u| (u.host, u.path)).ok(),
            Some(("cdn.io".into(), "/p?sig=1".into()))
        );
        assert_eq!(
            base.join("next").map(|u| u.path).ok(),
            Some("/v2/a/blobs/next".into())
        );
        assert_eq!(
            base.join("http://cdn.io/p").map(|u| u.scheme).ok(),
            Some(Scheme::Http)
        );
    }

    #[test]
    fn plain_http_is_refused_without_the_flag_and_to_any_non_loopback_host() {
        for ok in [
            "http://127.0.0.1:5000/",
            "http://127.9.8.7/",
            "http://[::1]/",
            "http://LocalHost:1/",
        ] {
            assert!(url(ok).check_scheme(true).is_ok(), "{ok}");
            assert!(url(ok).check_scheme(false).is_err(), "{ok}");
        }
        for refused in [
            "http://10.0.0.1/",
            "http://registry.example/",
            "http://[::2]/",
            "http://localhost.evil.io/",
            "http://128.0.0.1/",
        ] {
            let e = url(refused).check_scheme(true).err().map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains("only to a loopback")),
                "{refused}: {e:?}"
            );
        }
        assert!(url("https://10.0.0.1/").check_scheme(false).is_ok());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            encode_query_value("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
    }
}
