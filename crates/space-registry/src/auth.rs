//! Registry authentication, as Docker does it: a `401` names its scheme in
//! `WWW-Authenticate`. `Bearer realm=…,service=…,scope=…` sends us to a token
//! endpoint (anonymously, or with the user's credentials as Basic auth) for a token
//! the request is retried with; `Basic` takes the credentials on the request itself.
//! Credentials are the ones given (`--username` and a password), else the `auth` entry
//! of `~/.docker/config.json` for the registry (credential helpers are not run).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use base64::Engine as _;
use hyper::header::HeaderValue;
use serde::Deserialize;

use crate::error::{RegistryError, Result};
use crate::reference::DOCKER_HUB;
use crate::url::{Url, encode_query_value};

/// A registry user and password (or token). Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// A user (not empty, no `:`) and a password (not empty).
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Result<Self> {
        let (username, password) = (username.into(), password.into());
        if username.is_empty() || username.contains(':') || username.chars().any(char::is_control) {
            return Err(RegistryError::Credentials(
                "a user name is not empty and has no ':' or control characters".into(),
            ));
        }
        if password.is_empty() {
            return Err(RegistryError::Credentials("an empty password".into()));
        }
        Ok(Self { username, password })
    }

    /// The user.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// `Authorization: Basic …`, marked sensitive (never logged by hyper).
    pub(crate) fn basic(&self) -> HeaderValue {
        let raw = format!("{}:{}", self.username, self.password);
        let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
        let mut v = HeaderValue::from_str(&format!("Basic {encoded}"))
            .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
        v.set_sensitive(true);
        v
    }
}

// ---- ~/.docker/config.json ---------------------------------------------------------

/// The largest Docker config file read.
const MAX_DOCKER_CONFIG: u64 = 1 << 20;

/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn docker_config_path(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(dir) = env("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    let home = env("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".docker").join("config.json"))
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
}

/// The host a Docker config key names: `https://ghcr.io/v1/` → `ghcr.io`.
fn config_key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// The credentials a Docker config (its bytes) holds for `registry` (`host[:port]`;
/// Docker Hub under any of its names), if any. An entry without `auth` (a credential
/// helper's) is none; an `auth` that is not base64 of `user:password` is an error.
pub fn from_docker_config(json: &[u8], registry: &str) -> Result<Option<Credentials>> {
    let bad = |why: &str| RegistryError::Credentials(format!("docker config: {why}"));
    let config: DockerConfig = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
    let hub = registry == DOCKER_HUB;
    let wanted = |host: &str| {
        host.eq_ignore_ascii_case(registry)
            || (hub && ["index.docker.io", "docker.io"].contains(&host))
    };
    for (key, entry) in &config.auths {
        if !wanted(config_key_host(key)) {
            continue;
        }
        let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) else {
            continue;
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad(&format!("the auth of {key:?} is not base64")))?;
        let raw =
            String::from_utf8(raw).map_err(|_| bad(&format!("the auth of {key:?} is not text")))?;
        let (user, password) = raw
            .split_once(':')
            .ok_or_else(|| bad(&format!("the auth of {key:?} is not user:password")))?;
        return Credentials::new(user, password).map(Some);
    }
    Ok(None)
}

/// The Docker config's credentials for `registry`, if the file exists and has some.
pub fn docker_config_credentials(
    registry: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<Option<Credentials>> {
    let Some(path) = docker_config_path(env) else {
        return Ok(None);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RegistryError::io(path, e)),
    };
    if bytes.len() as u64 > MAX_DOCKER_CONFIG {
        return Err(RegistryError::Credentials(format!(
            "{}: larger than 1 MiB",
            path.display()
        )));
    }
    from_docker_config(&bytes, registry)
}

// ---- WWW-Authenticate --------------------------------------------------------------

/// One challenge of a `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// The scheme, lowercased (`bearer`, `basic`).
    pub(crate) scheme: String,
    /// Its parameters, names lowercased.
    pub(crate) params: Vec<(String, String)>,
}

impl Challenge {
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// The challenges of a `WWW-Authenticate` value (RFC 9110's grammar, leniently: a
/// parameter that does not parse ends its challenge).
pub(crate) fn parse_challenges(value: &str) -> Vec<Challenge> {
    let b = value.as_bytes();
    let mut i = 0;
    let mut out: Vec<Challenge> = Vec::new();
    let skip = |i: &mut usize, also_comma: bool| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t' || (also_comma && b[*i] == b',')) {
            *i += 1;
        }
    };
    let token = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && is_tchar(b[*i]) {
            *i += 1;
        }
        &value[start..*i]
    };
    loop {
        skip(&mut i, true);
        let scheme = token(&mut i);
        if scheme.is_empty() {
            break;
        }
        let mut challenge = Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params: Vec::new(),
        };
        loop {
            skip(&mut i, true);
            let mark = i;
            let name = token(&mut i);
            skip(&mut i, false);
            if name.is_empty() || i >= b.len() || b[i] != b'=' {
                // The next challenge's scheme (or the end).
                i = mark;
                break;
            }
            i += 1;
            skip(&mut i, false);
            let v = if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = Vec::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    v.push(b[i]);
                    i += 1;
                }
                // The closing quote (absent at the end of a truncated value).
                i = (i + 1).min(b.len());
                String::from_utf8_lossy(&v).into_owned()
            } else {
                // Unquoted: up to the next comma or space (leniently: a realm's `:`).
                let start = i;
                while i < b.len() && b[i] != b',' && !b[i].is_ascii_whitespace() {
                    i += 1;
                }
                value[start..i].to_owned()
            };
            challenge.params.push((name.to_ascii_lowercase(), v));
        }
        // Each turn takes at least the scheme's token: the loop ends.
        out.push(challenge);
    }
    out
}

/// The token endpoint's URL: the realm with `service` and `scope` added to its query.
pub(crate) fn token_url(realm: &str, service: Option<&str>, scope: &str) -> Result<Url> {
    let mut url = Url::parse(realm)?;
    let mut query = Vec::new();
    if let Some(s) = service {
        query.push(format!("service={}", encode_query_value(s)));
    }
    query.push(format!("scope={}", encode_query_value(scope)));
    let sep = if url.path.contains('?') { '&' } else { '?' };
    url.path = format!("{}{sep}{}", url.path, query.join("&"));
    Ok(url)
}

/// A token endpoint's answer.
#[derive(Deserialize)]
pub(crate) struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl TokenAnswer {
    /// `Authorization: Bearer …`, if the answer has a token that fits in a header.
    pub(crate) fn bearer(self) -> Option<HeaderValue> {
        let t = self.token.filter(|t| !t.is_empty()).or(self.access_token)?;
        let mut v = HeaderValue::from_str(&format!("Bearer {t}")).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn a_bearer_challenge_gives_realm_service_and_scope() {
        let c = parse_challenges(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].scheme, "bearer");
        assert_eq!(c[0].param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c[0].param("service"), Some("registry.docker.io"));
        assert_eq!(c[0].param("scope"), Some("repository:library/alpine:pull"));
    }

    #[test]
    fn several_challenges_quoted_escapes_and_tokens_are_read() {
        let c = parse_challenges(
            r#"Basic realm="a \"b\", c" , Bearer realm=https://x/t,error=insufficient_scope"#,
        );
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].scheme, "basic");
        assert_eq!(c[0].param("realm"), Some(r#"a "b", c"#));
        assert_eq!(c[1].param("realm"), Some("https://x/t"));
        assert_eq!(c[1].param("error"), Some("insufficient_scope"));
        assert_eq!(parse_challenges("Basic")[0].scheme, "basic");
        assert!(parse_challenges("").is_empty());
        // Junk ends the parse; it does not loop.
        let _ = parse_challenges(r#"Bearer realm="unterminated"#);
        let _ = parse_challenges("=== ,,, \"");
    }

    #[test]
    fn the_token_url_adds_service_and_scope_to_the_realm() {
        let u = token_url(
            "https://auth.io/token?x=1",
            Some("reg"),
            "repository:a/b:pull",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            u.path,
            "/token?x=1&service=reg&scope=repository%3Aa%2Fb%3Apull"
        );
        assert!(token_url("ftp://auth.io/", None, "s").is_err());
    }

    #[test]
    fn docker_config_auths_are_found_by_host_and_docker_hub_by_any_of_its_names() {
        let config = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "ghcr.io": {{"auth": "{}"}},
                "localhost:5000": {{}},
                "https://reg.example:8443/v2/": {{"auth": "{}"}}
            }}, "credsStore": "desktop"}}"#,
            b64("hubuser:hubpass"),
            b64("gh:tok:with:colons"),
            b64("u:p")
        );
        let get = |r: &str| {
            from_docker_config(config.as_bytes(), r)
                .unwrap_or_else(|e| panic!("{e}"))
                .map(|c| (c.username, c.password))
        };
        assert_eq!(get(DOCKER_HUB), Some(("hubuser".into(), "hubpass".into())));
        assert_eq!(
            get("ghcr.io"),
            Some(("gh".into(), "tok:with:colons".into()))
        );
        assert_eq!(get("reg.example:8443"), Some(("u".into(), "p".into())));
        assert_eq!(get("localhost:5000"), None);
        assert_eq!(get("quay.io"), None);
        let bad = format!(
            r#"{{"auths": {{"ghcr.io": {{"auth": "{}"}}}}}}"#,
            b64("nocolon")
        );
        assert!(from_docker_config(bad.as_bytes(), "ghcr.io").is_err());
        assert!(from_docker_config(b"{}", "ghcr.io").is_ok_and(|c| c.is_none()));
    }

    #[test]
    fn the_docker_config_path_follows_docker_config_then_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            docker_config_path(env(&[("DOCKER_CONFIG", "/d"), ("HOME", "/h")])),
            Some(PathBuf::from("/d/config.json"))
        );
        assert_eq!(
            docker_config_path(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.docker/config.json"))
        );
        assert_eq!(docker_config_path(env(&[])), None);
    }

    #[test]
    fn credentials_never_show_their_password() {
        let c = Credentials::new("me", "s3cret").unwrap_or_else(|e| panic!("{e}"));
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(c.basic().is_sensitive());
        assert!(Credentials::new("a:b", "p").is_err());
        assert!(Credentials::new("a", "").is_err());
    }
}
