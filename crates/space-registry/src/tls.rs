//! Trust for a pull's HTTPS: the system's CA bundle (`SSL_CERT_FILE` if set, else
//! Debian's or Red Hat's path) and, for a private registry, a PEM file of its CA.
//! Certificates are always verified (there is no switch to turn that off); rustls
//! with `ring` is the only TLS and crypto stack used.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::error::{RegistryError, Result};

/// The variable that names a CA bundle instead of the system's.
pub const SSL_CERT_FILE: &str = "SSL_CERT_FILE";

/// Where systems keep their CA bundle (Debian and derivatives; Red Hat and derivatives).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// The system bundle to read: `ssl_cert_file` when set (it must exist then), else
/// the first of [`SYSTEM_BUNDLES`] that `exists`.
pub(crate) fn system_bundle(
    ssl_cert_file: Option<PathBuf>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if let Some(p) = ssl_cert_file.filter(|p| !p.as_os_str().is_empty()) {
        return Some(p);
    }
    SYSTEM_BUNDLES.iter().map(PathBuf::from).find(|p| exists(p))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let why = |e: &dyn std::fmt::Display| RegistryError::Roots(format!("{}: {e}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| why(&e))?;
    CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| why(&e))
}

/// The roots: the system bundle (see [`system_bundle`]) and every certificate of
/// `ca_file`. A `ca_file` certificate that cannot be a root is an error; in the
/// system bundle, such entries are skipped (bundles carry odd ones). No root at all
/// is an error.
pub fn load_roots(ca_file: Option<&Path>) -> Result<RootCertStore> {
    let env = std::env::var_os(SSL_CERT_FILE).map(PathBuf::from);
    load_roots_from(system_bundle(env, Path::exists).as_deref(), ca_file)
}

pub(crate) fn load_roots_from(
    system: Option<&Path>,
    ca_file: Option<&Path>,
) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    if let Some(bundle) = system {
        let (added, skipped) = roots.add_parsable_certificates(read_certs(bundle)?);
        tracing::debug!(bundle = %bundle.display(), added, skipped, "system trust roots");
    }
    if let Some(ca) = ca_file {
        let certs = read_certs(ca)?;
        if certs.is_empty() {
            return Err(RegistryError::Roots(format!(
                "{}: no PEM certificate in it",
                ca.display()
            )));
        }
        for c in certs {
            roots.add(c).map_err(|e| {
                RegistryError::Roots(format!("{}: not a CA certificate: {e}", ca.display()))
            })?;
        }
    }
    if roots.is_empty() {
        return Err(RegistryError::Roots(format!(
            "no CA bundle found (set {SSL_CERT_FILE}, install one at {}, or pass --ca-file)",
            SYSTEM_BUNDLES.join(" or ")
        )));
    }
    Ok(roots)
}

/// A client configuration over `roots`: TLS 1.2 and 1.3 with ring's safe defaults,
/// HTTP/1.1.
pub(crate) fn client_config(roots: RootCertStore) -> Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RegistryError::Roots(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_cert_file_wins_then_the_first_system_bundle_present() {
        let none = |_: &Path| false;
        let all = |_: &Path| true;
        assert_eq!(
            system_bundle(Some("/x.pem".into()), none),
            Some(PathBuf::from("/x.pem"))
        );
        assert_eq!(
            system_bundle(None, all),
            Some(PathBuf::from(SYSTEM_BUNDLES[0]))
        );
        let redhat = |p: &Path| p == Path::new(SYSTEM_BUNDLES[1]);
        assert_eq!(
            system_bundle(Some("".into()), redhat),
            Some(PathBuf::from(SYSTEM_BUNDLES[1]))
        );
        assert_eq!(system_bundle(None, none), None);
    }

    #[test]
    fn no_roots_at_all_is_an_error_and_a_ca_file_without_certificates_too() {
        let e = load_roots_from(None, None).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("no CA bundle")));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap_or_else(|e| panic!("{e}"));
        let e = load_roots_from(None, Some(&empty))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("no PEM certificate")));
        let missing = dir.path().join("missing.pem");
        assert!(load_roots_from(Some(&missing), None).is_err());
    }
}
