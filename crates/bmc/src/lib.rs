//! hostcycle's BMC power layer: Redfish, IPMI and command drivers behind one interface,
//! [`PowerDriver`].
//!
//! The operator keeps one [`BmcConnector`] for the process (it owns the HTTP connection
//! pools and the per-endpoint concurrency limits) and one `Arc<dyn PowerDriver>` per host:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use hostcycle_bmc::{BmcAddress, BmcConnector, BmcCredentials, ConnectorOptions, HostConnectOptions};
//! use hostcycle_bmc::soft_off::{power_off_with_fallback, SoftOffPolicy};
//!
//! let connector = BmcConnector::new(ConnectorOptions::default());
//! let address = BmcAddress::parse("redfish://10.0.0.5/redfish/v1/Systems/1")?;
//! let credentials = BmcCredentials::new("admin", "secret")?;
//! let driver = connector.connect(&address, credentials, &HostConnectOptions::default())?;
//! println!("{} is {}", driver.description(), driver.power_state().await?);
//! let report = power_off_with_fallback(
//!     driver.as_ref(), hostcycle_bmc::PowerOffMode::Soft, &SoftOffPolicy::default(), None).await?;
//! println!("went off via {:?}", report.path);
//! # Ok(()) }
//! ```

pub mod address;
pub mod bounded;
pub mod cli;
pub mod command;
pub mod credentials;
pub mod deadline;
pub mod destination;
pub mod driver;
pub mod error;
pub mod ipmi;
pub mod malloc;
pub mod redfish;
pub mod resolve;
pub mod retry;
pub mod soft_off;
pub mod text;
pub mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Semaphore;

pub use address::{AddressError, BmcAddress, BmcHost, IpmiAddress, RedfishAddress, RedfishFlavor};
pub use command::{CommandDriver, CommandDriverConfig};
pub use credentials::{
    AddressesAnnotation, BmcCredentials, CredentialsError, CredentialsSecret,
    credentials_from_secret, load_credentials, read_credentials_secret,
};
pub use driver::{
    BmcOperations, DriverDescription, DriverKind, PowerDriver, PowerOffMode, PowerOutcome,
    PowerReading, PowerRequest, PowerState, identity_of,
};
pub use error::BmcError;
pub use ipmi::{IpmiDriver, IpmiOptions};
pub use redfish::{RedfishAuthMode, RedfishDriver, RedfishOptions};
pub use retry::RetryPolicy;
pub use soft_off::{OffPath, PowerOffReport, SoftOffPolicy, power_off_with_fallback};
pub use tls::TlsVerification;

/// Per-host settings, from the BareMetalHost's `spec.bmc`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostConnectOptions {
    /// `disableCertificateVerification`: skip the BMC certificate check (Redfish).
    pub disable_certificate_verification: bool,
    /// Trust exactly these CAs (PEM) instead of the system store (Redfish).
    pub ca_bundle_pem: Option<Vec<u8>>,
    pub redfish_auth: RedfishAuthMode,
}

impl HostConnectOptions {
    fn tls_verification(&self) -> TlsVerification {
        if self.disable_certificate_verification {
            TlsVerification::Disabled
        } else if let Some(pem) = &self.ca_bundle_pem {
            TlsVerification::CaBundle(pem.clone())
        } else {
            TlsVerification::SystemRoots
        }
    }
}

/// [`ConnectorOptions::idle_timeout`] by default: what [`idle_timeout_for_polls`] gives for
/// the operator's default polls (60 s at rest, 1 s during a change).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest steady interval whose connections are kept from one steady read to the
/// next ([`idle_timeout_for_polls`]).
pub const MAX_STEADY_IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Transition polls an idle connection outlives, at least ([`idle_timeout_for_polls`]).
pub const TRANSITION_POLLS_KEPT: u32 = 3;

/// The idle timeout for a process that reads each BMC every `steady_poll` at rest and every
/// `transition_poll` while a change is pending:
///
/// `max(3 × transition_poll, 1.25 × steady_poll if that is at most 15 s, 1 s)`.
///
/// * **While a change is watched** (a reboot: a read every `transition_poll`) the
///   connection must be reused, so the timeout is never below three transition intervals:
///   a late poll or a slow reconcile still finds the connection open.
/// * **At rest** a connection is reused only if it outlives the steady interval (plus the
///   operator's 10 % jitter): worth it for frequent steady polls (up to 12 s), not for the
///   default minute — a connection kept idle for part of it is never reused and only holds
///   memory and a connection slot on the BMC. At 5,000 hosts the old rule (a quarter of the
///   steady interval, up to 15 s) kept ~1,000–2,000 idle connections open that no read
///   would use (docs/benchmarks.md).
///
/// With the operator's defaults (60 s, 1 s) this is 3 s ([`DEFAULT_IDLE_TIMEOUT`]).
pub fn idle_timeout_for_polls(steady_poll: Duration, transition_poll: Duration) -> Duration {
    let watched = transition_poll.saturating_mul(TRANSITION_POLLS_KEPT);
    let steady_reuse = steady_poll.saturating_add(steady_poll / 4);
    let at_rest = if steady_reuse <= MAX_STEADY_IDLE_TIMEOUT {
        steady_reuse
    } else {
        Duration::ZERO
    };
    watched.max(at_rest).max(Duration::from_secs(1))
}

/// Process-wide settings of the power layer.
#[derive(Clone, Debug)]
pub struct ConnectorOptions {
    /// Timeout of one HTTP request to a BMC.
    pub request_timeout: Duration,
    /// Timeout of establishing a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Retries and deadline of each exchange with a BMC.
    pub retry: RetryPolicy,
    /// Requests in flight at once to one Redfish endpoint (BMCs are small computers).
    pub max_requests_per_endpoint: usize,
    /// ipmitool sessions at once to one IPMI endpoint.
    pub max_ipmi_sessions_per_endpoint: usize,
    /// Idle connections kept per endpoint for reuse.
    pub idle_connections_per_endpoint: usize,
    /// How long an idle connection is kept ([`DEFAULT_IDLE_TIMEOUT`]). A process that polls
    /// on a schedule should derive it from its intervals with [`idle_timeout_for_polls`], so
    /// that connections survive between frequent polls but not between rare ones.
    pub idle_timeout: Duration,
    /// Largest Redfish response body read (1 MiB by default); larger ones are errors.
    pub max_response_bytes: usize,
    pub ipmi: IpmiOptions,
    /// The operator's `--bmc-networks`: how BMC names are resolved and which addresses they
    /// may resolve to ([`destination::NameResolution`], [`resolve`]). Default `any`: the
    /// system resolver, nothing checked (the `hostcycle bmc` CLI and the simulators).
    pub bmc_networks: Vec<destination::BmcNetwork>,
    /// The hosts file read before DNS under restricted networks ([`resolve::HOSTS_FILE`]).
    pub hosts_file: std::path::PathBuf,
}

impl Default for ConnectorOptions {
    fn default() -> Self {
        ConnectorOptions {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            max_requests_per_endpoint: 4,
            max_ipmi_sessions_per_endpoint: 1,
            idle_connections_per_endpoint: 1,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_response_bytes: bounded::DEFAULT_MAX_BODY_BYTES,
            ipmi: IpmiOptions::default(),
            bmc_networks: vec![destination::BmcNetwork::Any],
            hosts_file: std::path::PathBuf::from(resolve::HOSTS_FILE),
        }
    }
}

/// Makes drivers. Share one per process: drivers made by the same connector share HTTP
/// connection pools (one per TLS setting) and per-endpoint concurrency limits.
#[derive(Debug)]
pub struct BmcConnector {
    options: ConnectorOptions,
    /// Resolves BMC names for every driver (Redfish and IPMI), checked against the networks.
    resolver: resolve::BmcResolver,
    clients: Mutex<HashMap<TlsVerification, reqwest::Client>>,
    permits: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl BmcConnector {
    pub fn new(options: ConnectorOptions) -> Self {
        BmcConnector {
            resolver: resolve::BmcResolver::with_hosts_file(
                &options.bmc_networks,
                options.hosts_file.clone(),
            ),
            options,
            clients: Mutex::default(),
            permits: Mutex::default(),
        }
    }

    pub fn options(&self) -> &ConnectorOptions {
        &self.options
    }

    /// A driver for the host at `address`.
    pub fn connect(
        &self,
        address: &BmcAddress,
        credentials: BmcCredentials,
        host: &HostConnectOptions,
    ) -> Result<Arc<dyn PowerDriver>, BmcError> {
        match address {
            BmcAddress::Redfish(redfish) => {
                let http = self.http_client(&host.tls_verification())?;
                let permits = self
                    .endpoint_permits(&redfish.endpoint(), self.options.max_requests_per_endpoint);
                let options = RedfishOptions {
                    auth: host.redfish_auth,
                    request_timeout: self.options.request_timeout,
                    retry: self.options.retry.clone(),
                    max_body_bytes: self.options.max_response_bytes,
                };
                Ok(Arc::new(RedfishDriver::new(
                    redfish.clone(),
                    credentials,
                    http,
                    permits,
                    options,
                )))
            }
            BmcAddress::Ipmi(ipmi) => {
                let permits = self.endpoint_permits(
                    &ipmi.endpoint(),
                    self.options.max_ipmi_sessions_per_endpoint,
                );
                let mut options = self.options.ipmi.clone();
                options.retry = self.options.retry.clone();
                let driver = IpmiDriver::new(ipmi.clone(), credentials, permits, options)?
                    .with_resolver(self.resolver.clone());
                Ok(Arc::new(driver))
            }
        }
    }

    /// Parses `address` and connects.
    pub fn connect_str(
        &self,
        address: &str,
        credentials: BmcCredentials,
        host: &HostConnectOptions,
    ) -> Result<Arc<dyn PowerDriver>, BmcError> {
        self.connect(&BmcAddress::parse(address)?, credentials, host)
    }

    /// The shared client for a TLS setting, built on first use.
    fn http_client(&self, verification: &TlsVerification) -> Result<reqwest::Client, BmcError> {
        let mut clients = match self.clients.lock() {
            Ok(clients) => clients,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(client) = clients.get(verification) {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls::client_config(verification)?)
            .http1_only()
            .timeout(self.options.request_timeout)
            .connect_timeout(self.options.connect_timeout)
            .pool_max_idle_per_host(self.options.idle_connections_per_endpoint)
            .pool_idle_timeout(self.options.idle_timeout)
            .redirect(redfish::redirect_policy())
            // BMCs sit on management networks; a proxy from the environment must not see
            // their credentials.
            .no_proxy()
            // BMC names are resolved once, as absolute names, and every address checked
            // against the BMC networks before the socket is opened to it; the URL keeps the
            // name for TLS (SNI, certificate) and the Host header.
            .dns_resolver(resolve::CheckedResolver(self.resolver.clone()))
            .user_agent(concat!("hostcycle-bmc/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BmcError::Config(format!("building the HTTP client: {e}")))?;
        clients.insert(verification.clone(), client.clone());
        Ok(client)
    }

    fn endpoint_permits(&self, endpoint: &str, limit: usize) -> Arc<Semaphore> {
        let mut permits = match self.permits.lock() {
            Ok(permits) => permits,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(existing) = permits.get(endpoint).and_then(Weak::upgrade) {
            return existing;
        }
        // Forget endpoints no driver uses any more.
        permits.retain(|_, weak| weak.strong_count() > 0);
        let semaphore = Arc::new(Semaphore::new(limit.max(1)));
        permits.insert(endpoint.to_string(), Arc::downgrade(&semaphore));
        semaphore
    }
}

/// A driver from a one-off connector: for the CLI and tests. Long-running processes should
/// keep a [`BmcConnector`] so connections are reused.
pub fn connect(
    address: &str,
    credentials: BmcCredentials,
    host: &HostConnectOptions,
    options: ConnectorOptions,
) -> Result<Arc<dyn PowerDriver>, BmcError> {
    BmcConnector::new(options).connect_str(address, credentials, host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn idle_timeout_for_the_operator_defaults_is_the_connector_default() {
        assert_eq!(idle_timeout_for_polls(secs(60), secs(1)), secs(3));
        assert_eq!(
            ConnectorOptions::default().idle_timeout,
            DEFAULT_IDLE_TIMEOUT
        );
        assert_eq!(DEFAULT_IDLE_TIMEOUT, secs(3));
    }

    #[test]
    fn long_steady_polls_keep_no_connection_until_the_next_read() {
        for steady in [13, 20, 30, 60, 120, 300, 3600, 365 * 24 * 3600] {
            let idle = idle_timeout_for_polls(secs(steady), secs(1));
            assert_eq!(
                idle,
                secs(3),
                "steady {steady}s: only the transition polls count"
            );
            assert!(idle < secs(steady), "steady {steady}s: idle {idle:?}");
        }
    }

    #[test]
    fn watched_hosts_keep_their_connection_for_several_transition_polls() {
        for transition in [1, 2, 5, 10, 30] {
            let idle = idle_timeout_for_polls(secs(60), secs(transition));
            assert!(
                idle >= secs(transition) * TRANSITION_POLLS_KEPT,
                "transition {transition}s: idle {idle:?}"
            );
        }
        assert_eq!(idle_timeout_for_polls(secs(60), secs(10)), secs(30));
        // Sub-second transition polls.
        assert_eq!(
            idle_timeout_for_polls(secs(60), Duration::from_millis(500)),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn short_steady_polls_keep_connections_between_reads() {
        // A steady interval of a few transition polls: connections outlive it.
        assert_eq!(idle_timeout_for_polls(secs(2), secs(1)), secs(3));
        for steady in [4, 8, 12] {
            let idle = idle_timeout_for_polls(secs(steady), secs(1));
            assert!(
                idle > secs(steady) * 11 / 10,
                "steady {steady}s: idle {idle:?}"
            );
        }
        assert_eq!(idle_timeout_for_polls(secs(12), secs(1)), secs(15));
        // Degenerate flags still give a usable timeout, and huge ones do not overflow.
        assert_eq!(
            idle_timeout_for_polls(Duration::ZERO, Duration::ZERO),
            secs(1)
        );
        let huge = secs(365 * 24 * 3600);
        assert_eq!(idle_timeout_for_polls(huge, huge), huge * 3);
    }
}
