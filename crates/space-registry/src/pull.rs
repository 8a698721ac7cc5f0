//! A pull: the manifest by tag or digest (an index followed to the platform's
//! manifest), every document and blob checked (see [`crate::manifest`],
//! [`crate::layout`]), written as an OCI image layout.
//!
//! A manifest asked for by digest must have it; one asked for by tag has its digest
//! recorded (and a `Docker-Content-Digest` the registry states must agree). The
//! manifest's bytes are kept as they came, so its digest and its layers' stay the
//! registry's.

use std::path::{Path, PathBuf};

use space_image::limits::MAX_JSON;
use space_image::{Digest, ImageLimits};

use crate::auth::Credentials;
use crate::client::RegistryClient;
use crate::error::{RegistryError, Result};
use crate::http::{Timeouts, Transport};
use crate::layout::{Layout, ManifestEntry};
use crate::manifest::{self, ACCEPT, Blob, MAX_DEPTH};
use crate::platform::Platform;
use crate::reference::Reference;
use crate::url::{Scheme, Url};

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The platform chosen from an image index (and required of the image's config).
    pub platform: Platform,
    /// Plain HTTP (only to a loopback registry).
    pub plain_http: bool,
    /// A PEM file of CA certificates trusted besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Credentials for the registry.
    pub credentials: Option<Credentials>,
    /// The bounds on blob sizes (the importer's).
    pub limits: ImageLimits,
    /// Connection and read timeouts.
    pub timeouts: Timeouts,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            platform: Platform::host(),
            plain_http: false,
            ca_file: None,
            credentials: None,
            limits: ImageLimits::default(),
            timeouts: Timeouts::default(),
        }
    }
}

/// What a pull tells as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The manifest is known: what will be fetched.
    Resolved {
        /// The manifest's digest.
        digest: Digest,
        /// Its layers.
        layers: usize,
        /// The config's and layers' bytes together.
        bytes: u64,
    },
    /// Bytes of a blob received so far.
    Blob {
        /// `config`, or `layer i/n`.
        what: String,
        /// The blob.
        digest: Digest,
        /// Received so far.
        received: u64,
        /// Its size.
        size: u64,
    },
}

/// A completed pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The reference pulled, in full.
    pub reference: String,
    /// The image manifest's digest.
    pub digest: Digest,
    /// Its media type.
    pub media_type: String,
    /// The image config's platform.
    pub platform: String,
    /// Its layers.
    pub layers: usize,
    /// The blobs' bytes.
    pub bytes: u64,
}

impl PullOptions {
    /// What can be refused about pulling `reference` so before any connection: plain
    /// HTTP to a registry that is not loopback. ([`pull`] checks it again.)
    pub fn check(&self, reference: &Reference) -> Result<()> {
        let scheme = if self.plain_http {
            Scheme::Http
        } else {
            Scheme::Https
        };
        Url::registry(reference.registry(), scheme)?.check_scheme(self.plain_http)
    }
}

struct Fetched {
    bytes: Vec<u8>,
    digest: Digest,
    media_type: String,
}

/// Pulls `reference` into an OCI image layout at `dir` (made if missing; empty or
/// new). On an error, what was written stays for the caller to remove (no partial
/// blob stays, and `index.json` is written only at the end).
pub async fn pull(
    reference: &Reference,
    dir: &Path,
    options: PullOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Pulled> {
    let transport = Transport::new(
        options.plain_http,
        options.ca_file.clone(),
        options.timeouts,
    );
    let mut client = RegistryClient::new(reference, transport, options.credentials.clone())?;
    let asked = reference.manifest_reference();
    let mut fetched = fetch_manifest(&mut client, &asked, reference.digest(), None).await?;
    let mut depth = 0;
    while manifest::is_index(&fetched.media_type) {
        if depth == MAX_DEPTH {
            return Err(RegistryError::format(
                "the image index",
                format!("indexes nested deeper than {MAX_DEPTH}"),
            ));
        }
        depth += 1;
        let chosen: Blob = manifest::choose(&fetched.bytes, &options.platform)?;
        let child = fetch_manifest(
            &mut client,
            &chosen.digest.to_string(),
            Some(&chosen.digest),
            Some(chosen.size),
        )
        .await?;
        if let Some(m) = chosen
            .media_type
            .as_deref()
            .filter(|m| *m != child.media_type)
        {
            return Err(RegistryError::format(
                "the image index's manifest",
                format!(
                    "the index says {m:?}, the manifest is {:?}",
                    child.media_type
                ),
            ));
        }
        fetched = child;
    }
    let plan = manifest::plan(&fetched.bytes, &options.limits)?;
    progress(&Progress::Resolved {
        digest: fetched.digest,
        layers: plan.layers.len(),
        bytes: plan.bytes(),
    });
    let layout = Layout::create(dir)?;
    fetch_blob(&mut client, &layout, &plan.config, "config", progress).await?;
    let config_path = layout.blob_path(&plan.config.digest);
    let config = std::fs::read(&config_path).map_err(|e| RegistryError::io(&config_path, e))?;
    let platform = manifest::check_config_platform(&config, &options.platform)?;
    let n = plan.layers.len();
    for (i, layer) in plan.layers.iter().enumerate() {
        if layout.has(&layer.digest) {
            continue;
        }
        let what = format!("layer {}/{n}", i + 1);
        fetch_blob(&mut client, &layout, layer, &what, progress).await?;
    }
    layout.write_blob(&fetched.digest, &fetched.bytes)?;
    layout.finish(&ManifestEntry {
        media_type: &fetched.media_type,
        digest: fetched.digest,
        size: fetched.bytes.len() as u64,
        ref_name: reference.tag(),
    })?;
    Ok(Pulled {
        reference: reference.to_string(),
        digest: fetched.digest,
        media_type: fetched.media_type,
        platform,
        layers: n,
        bytes: plan.bytes(),
    })
}

/// The manifest (or index) `asked` (a tag or a digest), read within [`MAX_JSON`],
/// checked against `digest` and `size` where given.
async fn fetch_manifest(
    client: &mut RegistryClient,
    asked: &str,
    digest: Option<&Digest>,
    size: Option<u64>,
) -> Result<Fetched> {
    let what = format!("the manifest {asked}");
    let path = client.path(&format!("manifests/{asked}"));
    let answer = client.get(&path, Some(ACCEPT)).await?;
    let content_type = answer
        .header(hyper::header::CONTENT_TYPE)
        .map(str::to_owned);
    let stated = answer
        .header(hyper::header::HeaderName::from_static(
            "docker-content-digest",
        ))
        .and_then(|d| d.parse::<Digest>().ok());
    let bytes = answer.read_bounded(MAX_JSON, &what).await?;
    let actual = Digest::of(&bytes);
    for expected in [digest.copied(), stated].into_iter().flatten() {
        if expected != actual {
            return Err(RegistryError::Digest {
                what,
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
    }
    if let Some(size) = size.filter(|&s| s != bytes.len() as u64) {
        let why = if (bytes.len() as u64) > size {
            "more bytes"
        } else {
            "fewer bytes"
        };
        return Err(RegistryError::Size { what, why, size });
    }
    let media_type = manifest::media_type(&bytes, content_type.as_deref(), &what)?;
    Ok(Fetched {
        bytes,
        digest: actual,
        media_type,
    })
}

async fn fetch_blob(
    client: &mut RegistryClient,
    layout: &Layout,
    blob: &Blob,
    what: &str,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<()> {
    let path = client.path(&format!("blobs/{}", blob.digest));
    let answer = client.get(&path, None).await?;
    let (digest, size) = (blob.digest, blob.size);
    let mut tell = |received: u64| {
        progress(&Progress::Blob {
            what: what.to_owned(),
            digest,
            received,
            size,
        });
    };
    tell(0);
    layout
        .receive(
            answer,
            &digest,
            size,
            &format!("{what} {digest}"),
            &mut tell,
        )
        .await
}
