//! Where a simulated host learns whether it has power: its BMC.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

/// The power state of a simulated host, as its BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPower {
    On,
    Off,
}

/// Reads a host's power state.
#[async_trait]
pub trait PowerSource: Send + Sync {
    /// `Ok(None)` while the BMC reports a transition (PoweringOn/PoweringOff).
    async fn read(&self) -> Result<Option<HostPower>, String>;
    /// Human description for logs (never includes credentials).
    fn describe(&self) -> String;
}

/// Reads `PowerState` from a Redfish System resource.
pub struct RedfishPowerSource {
    http: reqwest::Client,
    system_url: String,
    basic_auth: Option<(String, String)>,
}

impl std::fmt::Debug for RedfishPowerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishPowerSource")
            .field("system_url", &self.system_url)
            .finish_non_exhaustive()
    }
}

impl RedfishPowerSource {
    /// `system_url` is the full URL of the System, e.g. `http://127.0.0.1:8000/redfish/v1/Systems/<id>`.
    pub fn new(
        http: reqwest::Client,
        system_url: String,
        basic_auth: Option<(String, String)>,
    ) -> Self {
        RedfishPowerSource {
            http,
            system_url,
            basic_auth,
        }
    }
}

#[async_trait]
impl PowerSource for RedfishPowerSource {
    async fn read(&self) -> Result<Option<HostPower>, String> {
        let mut req = self.http.get(&self.system_url);
        if let Some((user, pass)) = &self.basic_auth {
            req = req.basic_auth(user, Some(pass));
        }
        let resp = req.send().await.map_err(|e| e.without_url().to_string())?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| format!("malformed JSON: {e}"))?;
        match body.get("PowerState").and_then(|v| v.as_str()) {
            Some("On") => Ok(Some(HostPower::On)),
            Some("Off") => Ok(Some(HostPower::Off)),
            Some("PoweringOn" | "PoweringOff" | "Paused") => Ok(None),
            other => Err(format!("unexpected PowerState {other:?}")),
        }
    }

    fn describe(&self) -> String {
        format!("Redfish {}", self.system_url)
    }
}

/// A power source a test flips by hand (no BMC involved).
#[derive(Debug, Clone)]
pub struct ManualPowerSource(Arc<std::sync::atomic::AtomicBool>);

impl ManualPowerSource {
    pub fn new(on: bool) -> Self {
        ManualPowerSource(Arc::new(std::sync::atomic::AtomicBool::new(on)))
    }
    pub fn set(&self, on: bool) {
        self.0.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait]
impl PowerSource for ManualPowerSource {
    async fn read(&self) -> Result<Option<HostPower>, String> {
        Ok(Some(if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            HostPower::On
        } else {
            HostPower::Off
        }))
    }
    fn describe(&self) -> String {
        "manual switch".into()
    }
}

/// A reqwest client for BMC reads: ring crypto, optional extra CA, optional no verification
/// is deliberately not offered (the emulators in the lab speak plain HTTP or use our CA).
pub fn http_client(ca_pem: Option<&str>) -> Result<reqwest::Client, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("parsing CA PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("adding CA certificate: {e}"))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("configuring TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("building HTTP client: {e}"))
}
