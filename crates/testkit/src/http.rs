//! The HTTP client for talking to test components (API server health endpoints, BMC
//! emulators, metrics), with the ring crypto provider given explicitly.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::TestkitError;

fn other(what: &str, e: impl std::fmt::Display) -> TestkitError {
    TestkitError::Other {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// A reqwest client that trusts exactly the CA certificates in `ca_pem` (plain HTTP only when
/// `None`). No proxy: everything it talks to is on loopback.
pub fn client(ca_pem: Option<&str>) -> Result<reqwest::Client, TestkitError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in ca_pem
        .map(|pem| CertificateDer::pem_slice_iter(pem.as_bytes()))
        .into_iter()
        .flatten()
    {
        let cert = cert.map_err(|e| other("parsing a CA certificate (PEM)", e))?;
        roots
            .add(cert)
            .map_err(|e| other("adding a CA certificate", e))?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| other("configuring TLS", e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .map_err(|e| other("building an HTTP client", e))
}
