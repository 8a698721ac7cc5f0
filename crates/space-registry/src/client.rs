//! GETs of one repository of one registry: authentication on a `401` (then one
//! retry), redirects followed (at most [`MAX_REDIRECTS`]; never from HTTPS to HTTP),
//! and the `Authorization` header sent only to the registry's own origin, never to
//! the host a redirect leads to (Docker Hub's blob CDN, or anyone's).

use hyper::StatusCode;
use hyper::header::{self, HeaderMap, HeaderValue};

use crate::auth::{Challenge, Credentials, TokenAnswer, parse_challenges, token_url};
use crate::error::{RegistryError, Result};
use crate::http::{Answer, Transport};
use crate::reference::Reference;
use crate::url::{Scheme, Url};

/// The most redirects followed for one request.
pub const MAX_REDIRECTS: usize = 5;

/// The largest token endpoint answer read.
const MAX_TOKEN_ANSWER: u64 = 1 << 20;

/// A client of one repository.
#[derive(Debug)]
pub(crate) struct RegistryClient {
    transport: Transport,
    base: Url,
    repository: String,
    credentials: Option<Credentials>,
    /// What authentication gave: a bearer token, or the Basic credentials.
    authorization: Option<HeaderValue>,
}

impl RegistryClient {
    /// A client of `reference`'s repository; a plain-HTTP registry that is not
    /// loopback is refused here, before any connection.
    pub(crate) fn new(
        reference: &Reference,
        transport: Transport,
        credentials: Option<Credentials>,
    ) -> Result<Self> {
        let scheme = if transport.plain_http() {
            Scheme::Http
        } else {
            Scheme::Https
        };
        let base = Url::registry(reference.registry(), scheme)?;
        base.check_scheme(transport.plain_http())?;
        Ok(Self {
            transport,
            base,
            repository: reference.repository().to_owned(),
            credentials,
            authorization: None,
        })
    }

    /// `/v2/<repository>/<rest>`.
    pub(crate) fn path(&self, rest: &str) -> String {
        format!("/v2/{}/{rest}", self.repository)
    }

    /// GET `path` of the registry: a `200` answer, after authenticating once if asked
    /// and following redirects.
    pub(crate) async fn get(&mut self, path: &str, accept: Option<&str>) -> Result<Answer> {
        let url = self.base.with_path(path);
        let mut authenticated = false;
        loop {
            let answer = self.follow(&url, accept).await?;
            let from_registry = answer.url.origin() == self.base.origin();
            if answer.status == StatusCode::UNAUTHORIZED && from_registry && !authenticated {
                let challenges: Vec<Challenge> = answer
                    .headers
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(parse_challenges)
                    .collect();
                drop(answer);
                self.authenticate(&challenges).await?;
                authenticated = true;
                continue;
            }
            if answer.status == StatusCode::OK {
                return Ok(answer);
            }
            let (status, at) = (answer.status.as_u16(), answer.url.to_string());
            let message = answer.message().await;
            if status == 401 {
                return Err(RegistryError::Auth {
                    registry: self.base.authority(),
                    why: format!("{at} refused the credentials (HTTP 401{message})"),
                });
            }
            return Err(RegistryError::Status {
                url: at,
                status,
                message,
            });
        }
    }

    /// GET `url`, following redirects.
    async fn follow(&self, url: &Url, accept: Option<&str>) -> Result<Answer> {
        let mut url = url.clone();
        let mut hops = 0;
        loop {
            let mut headers = HeaderMap::new();
            if let Some(a) = accept {
                let a = HeaderValue::from_str(a).map_err(|e| RegistryError::Http {
                    url: url.to_string(),
                    why: e.to_string(),
                })?;
                headers.insert(header::ACCEPT, a);
            }
            // Credentials go to the registry's origin only.
            if url.origin() == self.base.origin() {
                if let Some(auth) = &self.authorization {
                    headers.insert(header::AUTHORIZATION, auth.clone());
                }
            }
            let answer = self.transport.get(&url, headers).await?;
            let redirect = matches!(answer.status.as_u16(), 301 | 302 | 303 | 307 | 308);
            if !redirect {
                return Ok(answer);
            }
            let refused = |why: &str| RegistryError::Redirect {
                from: url.to_string(),
                why: why.to_owned(),
            };
            let location = answer
                .header(header::LOCATION)
                .ok_or_else(|| refused("no Location"))?;
            let next = url.join(location)?;
            if url.scheme == Scheme::Https && next.scheme == Scheme::Http {
                return Err(refused(&format!("to plain HTTP ({next})")));
            }
            if hops == MAX_REDIRECTS {
                return Err(RegistryError::TooManyRedirects {
                    url: url.to_string(),
                    limit: MAX_REDIRECTS,
                });
            }
            hops += 1;
            tracing::debug!(from = %url, to = %next, "registry redirect");
            url = next;
        }
    }

    async fn authenticate(&mut self, challenges: &[Challenge]) -> Result<()> {
        let registry = self.base.authority();
        let failed = |why: String| RegistryError::Auth {
            registry: registry.clone(),
            why,
        };
        if let Some(bearer) = challenges.iter().find(|c| c.scheme == "bearer") {
            let realm = bearer
                .param("realm")
                .ok_or_else(|| failed("a Bearer challenge without a realm".into()))?;
            let scope = bearer.param("scope").map_or_else(
                || format!("repository:{}:pull", self.repository),
                str::to_owned,
            );
            let url = token_url(realm, bearer.param("service"), &scope)?;
            let mut headers = HeaderMap::new();
            if let Some(c) = &self.credentials {
                headers.insert(header::AUTHORIZATION, c.basic());
            }
            // The realm is held to the same scheme rule (plain HTTP only to loopback,
            // with --plain-http); its redirects are not followed.
            let answer = self.transport.get(&url, headers).await?;
            if answer.status != StatusCode::OK {
                let status = answer.status.as_u16();
                let message = answer.message().await;
                return Err(failed(format!(
                    "the token endpoint {url} answered HTTP {status}{message}"
                )));
            }
            let bytes = answer
                .read_bounded(MAX_TOKEN_ANSWER, "the token endpoint's answer")
                .await?;
            let token: TokenAnswer = serde_json::from_slice(&bytes)
                .map_err(|e| failed(format!("the token endpoint's answer: {e}")))?;
            let value = token
                .bearer()
                .ok_or_else(|| failed("the token endpoint gave no usable token".into()))?;
            self.authorization = Some(value);
            return Ok(());
        }
        if challenges.iter().any(|c| c.scheme == "basic") {
            let c = self.credentials.as_ref().ok_or_else(|| {
                failed(
                    "the registry asks for a user and a password (--username with \
                     --password-stdin or SPACE_REGISTRY_PASSWORD)"
                        .into(),
                )
            })?;
            self.authorization = Some(c.basic());
            return Ok(());
        }
        Err(failed(
            "HTTP 401 without a Bearer or Basic challenge".into(),
        ))
    }
}
