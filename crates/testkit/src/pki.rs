//! A throwaway certificate authority for local clusters and TLS emulators.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::TestkitError;

fn pki_error(what: &str, e: rcgen::Error) -> TestkitError {
    TestkitError::Other {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// A CA that signs serving certificates for loopback components.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and key written to disk.
#[derive(Debug, Clone)]
pub struct PemFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(common_name: &str) -> Result<Self, TestkitError> {
        let key = KeyPair::generate().map_err(|e| pki_error("generating CA key", e))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| pki_error("building CA parameters", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key)
            .map_err(|e| pki_error("self-signing the CA", e))?;
        Ok(TestCa { issuer })
    }

    /// A TLS client configuration (ring provider) that trusts only this CA.
    pub fn client_config(&self) -> rustls::ClientConfig {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        let cert = CertificateDer::from_pem_slice(self.cert_pem().as_bytes())
            .expect("the test CA's own certificate parses");
        roots
            .add(cert)
            .expect("the test CA's certificate is a valid root");
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Issues a serving certificate for `names` (DNS names or IP literals).
    pub fn issue_server_cert(
        &self,
        common_name: &str,
        names: &[&str],
    ) -> Result<(String, String), TestkitError> {
        let key = KeyPair::generate().map_err(|e| pki_error("generating server key", e))?;
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(|e| pki_error("building server certificate parameters", e))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| pki_error("signing server certificate", e))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key` for a serving certificate.
    pub fn write_server_cert(
        &self,
        dir: &Path,
        stem: &str,
        names: &[&str],
    ) -> Result<PemFiles, TestkitError> {
        let (cert, key) = self.issue_server_cert(stem, names)?;
        let files = PemFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        write_private(&files.cert, &cert)?;
        write_private(&files.key, &key)?;
        Ok(files)
    }
}

/// A fresh private key (PKCS#8 PEM) and its public key (PEM), e.g. for service-account tokens.
pub fn key_pair_pem() -> Result<(String, String), TestkitError> {
    let key = KeyPair::generate().map_err(|e| pki_error("generating key pair", e))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// Writes a file readable by its owner only: these hold private keys, tokens and
/// kubeconfigs.
pub fn write_private(path: &Path, contents: &str) -> Result<(), TestkitError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TestkitError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // `mode` only applies to a new file; an existing one is narrowed too.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)
}
