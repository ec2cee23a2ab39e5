//! HTTP clients for talking to loopback components, using the ring crypto provider explicitly.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::TestkitError;

/// A reqwest client that trusts exactly the CA certificates in `ca_pem`.
pub fn client_with_ca(ca_pem: &str) -> Result<reqwest::Client, TestkitError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| TestkitError::Other {
            what: "parsing CA PEM".into(),
            message: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| TestkitError::Other {
            what: "adding CA certificate".into(),
            message: e.to_string(),
        })?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TestkitError::Other {
        what: "configuring TLS".into(),
        message: e.to_string(),
    })?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| TestkitError::Other {
            what: "building HTTP client".into(),
            message: e.to_string(),
        })
}
