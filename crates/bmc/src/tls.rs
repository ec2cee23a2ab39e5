//! rustls client configurations for Redfish, always with the ring provider passed explicitly
//! (no process-wide default provider is needed or installed).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_platform_verifier::BuilderVerifierExt;

use crate::error::BmcError;

/// How a BMC's certificate is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum TlsVerification {
    /// Against the system's trust store (the default).
    #[default]
    SystemRoots,
    /// Against exactly these CA certificates (PEM bundle).
    CaBundle(Vec<u8>),
    /// Not at all (`disableCertificateVerification`). The handshake is still encrypted.
    Disabled,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration for `verification`, HTTP/1.1 only (what BMCs speak).
pub fn client_config(verification: &TlsVerification) -> Result<ClientConfig, BmcError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| BmcError::Config(format!("TLS protocol versions: {e}")))?;
    let mut config = match verification {
        TlsVerification::SystemRoots => builder
            .with_platform_verifier()
            .map_err(|e| BmcError::Config(format!("loading the system trust store: {e}")))?
            .with_no_client_auth(),
        TlsVerification::CaBundle(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| {
                    BmcError::Config(format!("the CA bundle is not valid PEM: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    BmcError::Config(format!("the CA bundle has a bad certificate: {e}"))
                })?;
            }
            if roots.is_empty() {
                return Err(BmcError::Config(
                    "the CA bundle contains no certificate".into(),
                ));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsVerification::Disabled => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider())))
            .with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts any server certificate but still checks the handshake signatures, so the session
/// is encrypted to whoever holds the presented key. Only used when verification is disabled.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A readable reason for a rejected certificate, with rustls' name for it.
pub(crate) fn describe_certificate_error(error: &rustls::CertificateError) -> String {
    use rustls::CertificateError as E;
    let reason = match error {
        E::UnknownIssuer => "it is not signed by a trusted CA",
        E::NotValidForName | E::NotValidForNameContext { .. } => {
            "it is not valid for the host name or IP in the address"
        }
        E::Expired | E::ExpiredContext { .. } => "it has expired",
        E::NotValidYet | E::NotValidYetContext { .. } => "it is not valid yet (check the clocks)",
        E::Revoked => "it has been revoked",
        E::BadSignature => "its signature is invalid",
        _ => "it is invalid",
    };
    format!("{reason} ({error:?})")
}

/// Finds a rustls error in an error's source chain (reqwest → hyper → io::Error → rustls).
pub(crate) fn find_tls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // io::Error::source() skips the error it wraps (and io errors nest), so step into it.
        current = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bad_ca_bundles_are_config_errors() {
        let err = client_config(&TlsVerification::CaBundle(b"not pem".to_vec())).unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
    }

    #[test]
    fn disabled_and_system_configs_build() {
        assert!(client_config(&TlsVerification::Disabled).is_ok());
        // The system store exists on every machine this runs on (ca-certificates).
        assert!(client_config(&TlsVerification::SystemRoots).is_ok());
    }
}
