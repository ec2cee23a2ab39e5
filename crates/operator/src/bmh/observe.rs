//! Observe: what the BMC says about a host, through a cached driver per host.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use hostcycle_api::{BareMetalHost, CredentialsStatus};
use hostcycle_bmc::destination::{
    ADDRESSES_ANNOTATION, DestinationRefused, MAX_ADDRESSES_ANNOTATION,
};
use hostcycle_bmc::{
    AddressesAnnotation, BmcAddress, BmcConnector, BmcCredentials, BmcError, CredentialsError,
    CredentialsSecret, HostConnectOptions, PowerDriver, PowerOutcome, PowerState,
    read_credentials_secret,
};
use hostcycle_core::bmh::{
    BmcFailure, BmcFailureKind, BmcObservation, ObservedPower, PowerCallResult,
};
use k8s_openapi::api::core::v1::{Secret, SecretReference};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::metrics::{BmcErrorLabels, BmcRequestLabels, Metrics};

/// The credentials Secrets hosts name, fetched once per `resourceVersion`, of which only
/// what hostcycle uses is kept ([`CredentialsSecret`]: the username and password, the
/// addresses annotation, the label's verdict, the identity).
///
/// The operator watches only the *metadata* of Secrets (no Secret's data is streamed to it),
/// and GETs a Secret only when a host names it and the watch shows a `resourceVersion` the
/// cache does not hold yet. A fixed Secret therefore takes effect at once (its metadata event
/// triggers its hosts' reconciles and the changed `resourceVersion` a fresh GET), while a
/// steady-state reconcile reads the Secret from memory. With `--bmc-credentials-label` the
/// watch lists only labelled Secrets, and a Secret it does not show is never fetched: an
/// unlabelled Secret costs no GET, however often its hosts are reconciled.
pub struct SecretCache {
    watched: Store<PartialObjectMeta<Secret>>,
    /// Whether the metadata watch has listed once (`true` from the start for a cache built
    /// on a filled store).
    listed: tokio::sync::watch::Receiver<bool>,
    fetched: Mutex<HashMap<(String, String), Arc<CredentialsSecret>>>,
}

/// A Secret as the cache finds it.
#[derive(Debug)]
pub enum SecretLookup {
    Found(Arc<CredentialsSecret>),
    /// The API server has no Secret of that name.
    NotFound,
    /// Not among the labelled Secrets the watch lists (absent or unlabelled); not fetched.
    NotLabelled,
}

/// How long a reconcile waits for the Secret watch's first list before it gives up (the
/// host is read again after its backoff).
const SECRET_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the cache could not say.
#[derive(Debug, thiserror::Error)]
pub enum SecretCacheError {
    #[error(
        "the operator has not listed the labelled BMC credentials Secrets yet (waited {}s; \
         its log says why its Secret watch fails); the host is read again shortly",
        SECRET_LIST_WAIT.as_secs()
    )]
    NotListedYet,
    // Described by `text::api_error`: a parse error's own message may quote the Secret.
    #[error("reading the Secret: {}", crate::text::api_error(.0, "get", "secrets", ""))]
    Read(#[from] kube::Error),
}

impl SecretCache {
    /// A cache over `watched`, a store the watch has already filled (tests).
    pub fn new(watched: Store<PartialObjectMeta<Secret>>) -> Self {
        let (_, listed) = tokio::sync::watch::channel(true);
        Self::watching(watched, listed)
    }

    /// A cache over `watched`, filled by a watch that sets `listed` once it has listed.
    pub fn watching(
        watched: Store<PartialObjectMeta<Secret>>,
        listed: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        SecretCache {
            watched,
            listed,
            fetched: Mutex::default(),
        }
    }

    fn fetched(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<CredentialsSecret>>> {
        match self.fetched.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Drops fetched Secrets the metadata watch no longer shows.
    pub fn retain_watched(&self) {
        let watched = &self.watched;
        self.fetched()
            .retain(|(ns, name), _| watched.get(&ObjectRef::new(name).within(ns)).is_some());
    }

    /// How many Secrets are held with their credentials.
    pub fn len(&self) -> usize {
        self.fetched().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Secret `namespace/name`: from memory when the watch shows the `resourceVersion` held,
    /// else by one GET (a Secret the watch has not shown yet, or one that changed). With
    /// `label` (`--bmc-credentials-label`, which the watch selects by), a Secret the watch
    /// does not show is [`SecretLookup::NotLabelled`] without a GET.
    pub async fn get(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        label: Option<(&str, &str)>,
    ) -> Result<SecretLookup, SecretCacheError> {
        let key = (namespace.to_string(), name.to_string());
        if label.is_some() {
            self.wait_listed().await?;
        }
        let watched_version = self
            .watched
            .get(&ObjectRef::new(name).within(namespace))
            .map(|m| m.metadata.resource_version.clone());
        if label.is_some() && watched_version.is_none() {
            self.fetched().remove(&key);
            return Ok(SecretLookup::NotLabelled);
        }
        if let Some(Some(version)) = &watched_version
            && let Some(secret) = self.fetched().get(&key)
            && secret.resource_version.as_ref() == Some(version)
        {
            return Ok(SecretLookup::Found(secret.clone()));
        }
        match read_credentials_secret(client, namespace, name, label).await? {
            Some(secret) => {
                let secret = Arc::new(secret);
                self.fetched().insert(key, secret.clone());
                Ok(SecretLookup::Found(secret))
            }
            None => {
                self.fetched().remove(&key);
                Ok(SecretLookup::NotFound)
            }
        }
    }

    async fn wait_listed(&self) -> Result<(), SecretCacheError> {
        if *self.listed.borrow() {
            return Ok(());
        }
        let mut listed = self.listed.clone();
        match tokio::time::timeout(SECRET_LIST_WAIT, listed.wait_for(|l| *l)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(SecretCacheError::NotListedYet),
        }
    }
}

/// What the driver cache keys a driver on: a change to any of these makes a new driver.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DriverKey {
    address: String,
    disable_certificate_verification: bool,
    secret_resource_version: Option<String>,
}

/// Drivers by host UID, with what each was built from and the host's `namespace/name` (for
/// the log).
type DriverMap = HashMap<String, (DriverKey, Arc<dyn PowerDriver>, String)>;

/// One driver per host, rebuilt when its address, TLS setting or credentials Secret changes.
pub struct DriverCache {
    connector: BmcConnector,
    drivers: Mutex<DriverMap>,
    /// The last networks refusal logged per host UID ([`DriverCache::log_networks_refusal`]).
    refusals_logged: Mutex<HashMap<String, String>>,
}

/// A host's driver and the credentials it uses, or why there is none.
pub struct HostBmc {
    pub driver: Arc<dyn PowerDriver>,
    pub credentials: CredentialsStatus,
}

impl DriverCache {
    pub fn new(connector: BmcConnector) -> Self {
        DriverCache {
            connector,
            drivers: Mutex::default(),
            refusals_logged: Mutex::default(),
        }
    }

    /// Keeps only the drivers of `live` hosts (by UID): hosts deleted without a finalizer
    /// are never seen with a deletion timestamp.
    pub fn retain_hosts(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|uid, _| live(uid));
        self.refusals().retain(|uid, _| live(uid));
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        match self.refusals_logged.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// How many drivers are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets a deleted host's driver.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
        self.refusals().remove(uid);
    }

    /// Logs every cached driver out of its BMC (closes the Redfish sessions), all at once,
    /// waiting at most `deadline`; for shutdown, since a dropped driver's logout does not
    /// outlive the process. The cache is empty afterwards.
    pub async fn close_all(&self, deadline: std::time::Duration) {
        let drivers: Vec<(Arc<dyn PowerDriver>, String)> = self
            .lock()
            .drain()
            .map(|(_, (_, driver, host))| (driver, host))
            .collect();
        let closes = futures::future::join_all(drivers.iter().map(|(d, host)| async move {
            if let Err(e) = d.close().await {
                tracing::info!(%host, bmc = %d.description(), error = %e, "could not log out of the BMC");
            }
        }));
        if tokio::time::timeout(deadline, closes).await.is_err() {
            tracing::info!(
                after = ?deadline,
                "logging out of the BMCs timed out; their sessions expire on their own"
            );
        }
    }

    /// Logs a refusal by the BMC networks with what the host's status leaves out (the
    /// configured networks), once per host and message: a reconcile repeats it every poll.
    /// Returns whether it logged.
    fn log_networks_refusal(
        &self,
        host: &BareMetalHost,
        policy: &super::CredentialsPolicy,
        message: &str,
    ) -> bool {
        let uid = host.uid().unwrap_or_default();
        {
            let mut logged = self.refusals();
            if logged.get(&uid).is_some_and(|m| m == message) {
                return false;
            }
            logged.insert(uid, message.to_string());
        }
        tracing::warn!(
            host = %format!("{}/{}", host.namespace().unwrap_or_default(), host.name_any()),
            bmc_networks = %policy.destinations.networks_text(),
            refusal = %message,
            "BMC credentials refused: the BMC address is outside --bmc-networks"
        );
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DriverMap> {
        match self.drivers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The driver for `host`, with its credentials Secret from `secrets`.
    pub async fn driver_for(
        &self,
        client: &Client,
        secrets: &SecretCache,
        policy: &super::CredentialsPolicy,
        host: &BareMetalHost,
    ) -> Result<HostBmc, BmcFailure> {
        let ns = host.namespace().unwrap_or_default();
        let bmc = host.spec.bmc.as_ref().ok_or_else(|| BmcFailure {
            kind: BmcFailureKind::Other,
            message: "spec.bmc is not set; set spec.bmc.address and spec.bmc.credentialsName"
                .into(),
        })?;
        bmc.check_bounds().map_err(|refused| BmcFailure {
            kind: BmcFailureKind::Credentials,
            message: refused.to_string(),
        })?;
        let secret_name = bmc.credentials_name.trim();
        if secret_name.is_empty() {
            return Err(credentials_failure(CredentialsError::NoSecretName));
        }
        // Where the credentials would go is checked before the Secret is read: a refusal
        // that depends on the address alone needs no GET and says nothing about the Secret.
        let parsed_address = BmcAddress::parse(&bmc.address).ok();
        if let Some(address) = &parsed_address {
            check_tls_choice(policy, address, bmc.disable_certificate_verification)?;
        }
        if let Some(address) = &parsed_address
            && let Err(refused) = check_destination(policy, address)
        {
            if refused.outside_networks {
                let _logged = self.log_networks_refusal(host, policy, &refused.failure.message);
            }
            return Err(refused.failure);
        }
        let label = policy.label.as_ref().map(|(k, v)| (k.as_str(), v.as_str()));
        let host_label = format!("{ns}/{}", host.name_any());
        let unusable =
            |reason: String| unusable_secret(policy, &host_label, &ns, secret_name, &reason);
        let secret = match secrets.get(client, &ns, secret_name, label).await {
            Ok(SecretLookup::Found(s)) => s,
            Ok(SecretLookup::NotFound) => return Err(unusable("no Secret of that name".into())),
            Ok(SecretLookup::NotLabelled) => {
                let (key, value) = label.unwrap_or_default();
                return Err(unusable(format!(
                    "no Secret of that name is labelled {key}={value} (--bmc-credentials-label): \
                     it does not exist or lacks the label"
                )));
            }
            Err(SecretCacheError::NotListedYet) => {
                return Err(BmcFailure {
                    kind: BmcFailureKind::Other,
                    message: SecretCacheError::NotListedYet.to_string(),
                });
            }
            Err(SecretCacheError::Read(e)) => {
                return Err(BmcFailure {
                    kind: BmcFailureKind::Other,
                    message: format!(
                        "reading BMC credentials Secret {ns}/{secret_name}: {}",
                        crate::text::api_error(&e, "get", "secrets", &ns)
                    ),
                });
            }
        };
        if !secret.labelled {
            let (key, value) = label.unwrap_or_default();
            return Err(unusable(format!(
                "it is not labelled {key}={value} (--bmc-credentials-label)"
            )));
        }
        if let Some(address) = &parsed_address {
            let listed = match &secret.addresses {
                AddressesAnnotation::Absent => None,
                AddressesAnnotation::Listed(list) => Some(list.as_str()),
                AddressesAnnotation::TooLong => {
                    return Err(unusable(format!(
                        "its {ADDRESSES_ANNOTATION} annotation is longer than \
                         {MAX_ADDRESSES_ANNOTATION} bytes"
                    )));
                }
            };
            policy
                .destinations
                .check(address, listed)
                .map_err(|refused| unusable(refused.to_string()))?;
        }
        let key = DriverKey {
            address: bmc.address.clone(),
            disable_certificate_verification: bmc.disable_certificate_verification.unwrap_or(false),
            secret_resource_version: secret.resource_version.clone(),
        };
        let credentials = CredentialsStatus {
            credentials: Some(SecretReference {
                name: Some(secret_name.to_string()),
                namespace: Some(ns.clone()),
            }),
            credentials_version: secret.resource_version.clone(),
        };
        let uid = host.uid().unwrap_or_default();
        if let Some((cached_key, driver, _)) = self.lock().get(&uid)
            && *cached_key == key
        {
            return Ok(HostBmc {
                driver: driver.clone(),
                credentials,
            });
        }
        let creds: BmcCredentials = match &secret.credentials {
            Ok(creds) => creds.clone(),
            Err(e) => return Err(unusable(e.to_string())),
        };
        let options = HostConnectOptions {
            disable_certificate_verification: key.disable_certificate_verification,
            ..HostConnectOptions::default()
        };
        let driver = self
            .connector
            .connect_str(&bmc.address, creds, &options)
            .map_err(|e| BmcFailure {
                kind: BmcFailureKind::Other,
                message: e.to_string(),
            })?;
        let host_id = format!("{ns}/{}", host.name_any());
        self.lock().insert(uid, (key, driver.clone(), host_id));
        Ok(HostBmc {
            driver,
            credentials,
        })
    }
}

/// The status message of a host refused by `--refuse-unverified-bmc-tls`.
pub const UNVERIFIED_TLS_REFUSED: &str = "spec.bmc.disableCertificateVerification is true, and \
     the operator sends BMC credentials only to BMCs whose TLS certificate it verifies \
     (--refuse-unverified-bmc-tls): give the BMC a certificate the operator trusts and set \
     the field to false";

/// Whether a host may skip the BMC's certificate check: always, unless the operator
/// refuses it. Only Redfish over HTTPS has a certificate; IPMI and plain HTTP (refused or
/// allowed on its own flag) ignore the field, as metal3 does.
fn check_tls_choice(
    policy: &super::CredentialsPolicy,
    address: &BmcAddress,
    disable_certificate_verification: Option<bool>,
) -> Result<(), BmcFailure> {
    let skips_check = disable_certificate_verification == Some(true)
        && matches!(address, BmcAddress::Redfish(r) if r.base_url.scheme() == "https");
    if skips_check && policy.refuse_unverified_tls {
        return Err(BmcFailure {
            kind: BmcFailureKind::Credentials,
            message: UNVERIFIED_TLS_REFUSED.to_string(),
        });
    }
    Ok(())
}

/// Why `check_destination` refused.
struct DestinationCheckRefused {
    failure: BmcFailure,
    /// Refused by `--bmc-networks`: the operator logs the networks the status leaves out.
    outside_networks: bool,
}

/// Whether credentials may be sent to `address` at all, before any Secret is read (see
/// `hostcycle_bmc::destination`); the Secret's own `hostcycle.io/bmc-addresses` narrowing is
/// checked once it is read.
fn check_destination(
    policy: &super::CredentialsPolicy,
    address: &BmcAddress,
) -> Result<(), DestinationCheckRefused> {
    policy
        .destinations
        .check(address, None)
        .map_err(|refused| DestinationCheckRefused {
            outside_networks: matches!(
                refused,
                DestinationRefused::OutsideNetworks { .. } | DestinationRefused::NoNetworks { .. }
            ),
            failure: BmcFailure {
                kind: BmcFailureKind::Credentials,
                message: refused.to_string(),
            },
        })
}

/// A credentials Secret that cannot be used for a host, whatever the reason (absent, not
/// labelled, missing or unusable keys, an addresses annotation that does not list the BMC):
/// the host's status gets one message for all of them, so that someone who may edit hosts
/// but not read Secrets learns nothing of a Secret by naming it; the operator's log gets
/// `reason` (which names keys and the annotation's verdict, never a value).
fn unusable_secret(
    policy: &super::CredentialsPolicy,
    host: &str,
    namespace: &str,
    secret: &str,
    reason: &str,
) -> BmcFailure {
    tracing::warn!(
        %host,
        secret = %format_args!("{namespace}/{secret}"),
        %reason,
        "BMC credentials Secret cannot be used"
    );
    BmcFailure {
        kind: BmcFailureKind::Credentials,
        message: unusable_secret_message(policy, namespace, secret),
    }
}

/// The status message of [`unusable_secret`]: the Secret's name, what a usable one is, and
/// the flag and annotation involved.
pub fn unusable_secret_message(
    policy: &super::CredentialsPolicy,
    namespace: &str,
    secret: &str,
) -> String {
    let label = match &policy.label {
        Some((key, value)) => {
            format!(", not labelled {key}={value} (hostcycle operator --bmc-credentials-label)")
        }
        None => String::new(),
    };
    format!(
        "BMC credentials Secret {namespace}/{secret} cannot be used for this host: it is \
         missing, incomplete{label}, or its {ADDRESSES_ANNOTATION} annotation does not list \
         this BMC. The operator's log says which; fix the Secret (someone who may edit it) or \
         spec.bmc.credentialsName"
    )
}

fn credentials_failure(e: CredentialsError) -> BmcFailure {
    BmcFailure {
        kind: BmcFailureKind::Credentials,
        message: e.to_string(),
    }
}

/// What a power call did, for `after_power_call`. A call whose outcome is unknown (timed out
/// after the request was sent) counts as accepted: the in-flight timeout then decides whether
/// to send it again, so it is never sent twice in a hurry.
pub fn power_call_result(result: &Result<PowerOutcome, BmcError>) -> PowerCallResult {
    match result {
        Ok(outcome) => PowerCallResult::Accepted {
            hard_fallback: outcome.hard_fallback.clone(),
        },
        Err(BmcError::OutcomeUnknown { .. }) => PowerCallResult::Accepted {
            hard_fallback: None,
        },
        Err(e) => PowerCallResult::Failed(failure_from(e)),
    }
}

/// Classifies a BMC error for status.
pub fn failure_from(e: &BmcError) -> BmcFailure {
    BmcFailure {
        kind: failure_kind(e),
        message: e.to_string(),
    }
}

fn failure_kind(e: &BmcError) -> BmcFailureKind {
    match e {
        BmcError::AuthenticationFailed { .. } | BmcError::DestinationRefused(_) => {
            BmcFailureKind::Credentials
        }
        BmcError::Connection { .. } | BmcError::Certificate { .. } | BmcError::Timeout { .. } => {
            BmcFailureKind::Unreachable
        }
        BmcError::RetriesExhausted { last, .. } => failure_kind(last),
        _ => BmcFailureKind::Other,
    }
}

/// Reads the power state within `deadline` (retries included), timing the request for
/// metrics, with the identity the BMC reported. A BMC that does not answer in time is
/// reported unreachable.
pub async fn read_power(
    driver: &dyn PowerDriver,
    metrics: &Metrics,
    deadline: std::time::Duration,
) -> (BmcObservation, Option<String>) {
    let started = Instant::now();
    let result = match tokio::time::timeout(deadline, driver.power_reading()).await {
        Ok(result) => result,
        Err(_elapsed) => Err(BmcError::Timeout {
            what: format!(
                "reading the power state from {}",
                driver.description().endpoint
            ),
            after: deadline,
        }),
    };
    let kind = driver.description().kind.to_string();
    metrics
        .bmc_request_duration
        .get_or_create(&BmcRequestLabels {
            driver: kind.clone(),
            operation: "read_power".into(),
        })
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(reading) => (
            BmcObservation::Power(match reading.state {
                PowerState::On => ObservedPower::On,
                PowerState::Off => ObservedPower::Off,
                PowerState::Transitioning => ObservedPower::Transitioning,
                PowerState::Unknown => ObservedPower::Unknown,
            }),
            reading.identity,
        ),
        Err(e) => {
            metrics
                .bmc_errors
                .get_or_create(&BmcErrorLabels {
                    driver: kind,
                    operation: "read_power".into(),
                    kind: e.reason().into(),
                })
                .inc();
            (BmcObservation::Failed(failure_from(&e)), None)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hostcycle_bmc::ConnectorOptions;

    #[test]
    fn bmc_errors_are_classified_for_status() {
        use std::time::Duration;
        let auth = BmcError::AuthenticationFailed {
            endpoint: "e".into(),
            detail: "401".into(),
        };
        let refused = BmcError::Connection {
            endpoint: "e".into(),
            detail: "refused".into(),
        };
        let timeout = BmcError::Timeout {
            what: "GET".into(),
            after: Duration::from_secs(1),
        };
        let missing = BmcError::SystemNotFound {
            endpoint: "e".into(),
            path: "/redfish/v1/Systems/9".into(),
        };
        let exhausted = BmcError::RetriesExhausted {
            operation: "GET".into(),
            attempts: 4,
            elapsed: Duration::from_secs(9),
            last: Box::new(BmcError::Connection {
                endpoint: "e".into(),
                detail: "reset".into(),
            }),
        };
        #[rustfmt::skip]
        let cases = [
            (auth, BmcFailureKind::Credentials),
            (refused, BmcFailureKind::Unreachable),
            (timeout, BmcFailureKind::Unreachable),
            (missing, BmcFailureKind::Other),
            (exhausted, BmcFailureKind::Unreachable),
            (
                BmcError::DestinationRefused(DestinationRefused::ResolvesOutsideNetworks {
                    host: "r12.oob".into(),
                    address: "10.96.4.7".into(),
                }),
                BmcFailureKind::Credentials,
            ),
        ];
        for (error, kind) in cases {
            let failure = failure_from(&error);
            assert_eq!(failure.kind, kind, "{error}");
            assert_eq!(failure.message, error.to_string());
        }
    }

    #[test]
    fn power_call_results() {
        use hostcycle_bmc::{PowerOffMode, PowerRequest};
        use std::time::Duration;
        let fell_back = PowerOutcome {
            hard_fallback: Some("GracefulShutdown not offered".into()),
            ..PowerOutcome::sent(PowerRequest::Off(PowerOffMode::Soft), "ResetType=ForceOff")
        };
        assert_eq!(
            power_call_result(&Ok(fell_back)),
            PowerCallResult::Accepted {
                hard_fallback: Some("GracefulShutdown not offered".into())
            }
        );
        let unknown = BmcError::OutcomeUnknown {
            what: "POST reset".into(),
            after: Duration::from_secs(30),
        };
        assert_eq!(
            power_call_result(&Err(unknown)),
            PowerCallResult::Accepted {
                hard_fallback: None
            }
        );
        let refused = BmcError::Connection {
            endpoint: "e".into(),
            detail: "refused".into(),
        };
        assert!(matches!(
            power_call_result(&Err(refused)),
            PowerCallResult::Failed(BmcFailure {
                kind: BmcFailureKind::Unreachable,
                ..
            })
        ));
    }

    /// Steady-state reconciles read the Secret from memory: one GET per resourceVersion the
    /// metadata watch shows, a fresh GET once it changes (a fixed Secret), none for a host
    /// whose Secret is unchanged.
    #[tokio::test]
    async fn secrets_are_fetched_once_per_resource_version() {
        use crate::testing::{fake_client, status};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        use kube::core::PartialObjectMetaExt;
        use kube::runtime::{reflector, watcher};
        use std::sync::atomic::{AtomicUsize, Ordering};

        let gets = Arc::new(AtomicUsize::new(0));
        let version = Arc::new(Mutex::new(Some("1".to_string())));
        let client = {
            let (gets, version) = (gets.clone(), version.clone());
            fake_client(move |req| {
                let (gets, version) = (gets.clone(), version.clone());
                async move {
                    assert_eq!(req.method, http::Method::GET);
                    assert_eq!(req.path, "/api/v1/namespaces/ns1/secrets/creds");
                    gets.fetch_add(1, Ordering::SeqCst);
                    match version.lock().unwrap().clone() {
                        Some(rv) => (
                            200,
                            serde_json::json!({
                                "apiVersion": "v1", "kind": "Secret",
                                "metadata": { "name": "creds", "namespace": "ns1", "resourceVersion": rv },
                                "stringData": { "username": "u", "password": "p" },
                            }),
                        ),
                        None => status(404, "NotFound"),
                    }
                }
            })
        };
        let (store, mut writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let meta = |rv: &str| {
            ObjectMeta {
                name: Some("creds".into()),
                namespace: Some("ns1".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            }
            .into_response_partial::<Secret>()
        };
        writer.apply_watcher_event(&watcher::Event::Apply(meta("1")));
        let cache = SecretCache::new(store);

        let get = || async {
            match cache.get(&client, "ns1", "creds", None).await.unwrap() {
                SecretLookup::Found(secret) => Some(secret),
                SecretLookup::NotFound => None,
                SecretLookup::NotLabelled => panic!("no label asked for"),
            }
        };
        for _ in 0..5 {
            let secret = get().await.unwrap();
            assert_eq!(secret.resource_version.as_deref(), Some("1"));
        }
        assert_eq!(
            gets.load(Ordering::SeqCst),
            1,
            "one GET for five reconciles"
        );

        // The Secret is fixed: the watch shows a new resourceVersion, the next read fetches it.
        *version.lock().unwrap() = Some("2".into());
        writer.apply_watcher_event(&watcher::Event::Apply(meta("2")));
        for _ in 0..3 {
            let secret = get().await.unwrap();
            assert_eq!(secret.resource_version.as_deref(), Some("2"));
        }
        assert_eq!(gets.load(Ordering::SeqCst), 2);

        // Deleted: the watch drops it, the cache asks the API server (which says 404).
        *version.lock().unwrap() = None;
        writer.apply_watcher_event(&watcher::Event::Delete(meta("2")));
        assert!(get().await.is_none());
        cache.retain_watched();
        assert!(
            cache.is_empty(),
            "no Secret data kept for a Secret that is gone"
        );
    }

    /// One cached driver per host: every reconcile's call reuses its Redfish session, and
    /// shutdown logs them all out.
    #[tokio::test]
    async fn cached_drivers_reuse_one_session_and_close_it_at_shutdown() {
        use hostcycle_testkit::redfish_vendor::{VendorServer, VendorServerOptions};
        let server = VendorServer::start("openbmc", VendorServerOptions::default())
            .await
            .unwrap();
        let cache = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        let c = &server.profile().credentials;
        let driver = cache
            .connector
            .connect_str(
                &server.address(),
                BmcCredentials::new(&c.username, &c.password).unwrap(),
                &HostConnectOptions::default(),
            )
            .unwrap();
        let key = DriverKey {
            address: server.address(),
            disable_certificate_verification: false,
            secret_resource_version: None,
        };
        cache
            .lock()
            .insert("uid".to_string(), (key, driver, "ns/h".to_string()));
        for _ in 0..5 {
            let driver = cache.lock().get("uid").unwrap().1.clone();
            assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
        }
        assert_eq!(server.logins(), 1, "one session for every reconcile");
        cache.close_all(std::time::Duration::from_secs(5)).await;
        assert_eq!(server.open_sessions(), 0);
        assert!(cache.is_empty());
    }

    /// The host's status names the refused address and the flag; the networks go to the
    /// operator's log, once per host and message.
    #[test]
    fn a_networks_refusal_leaves_the_networks_out_of_the_status_and_is_logged_once() {
        let policy = crate::bmh::CredentialsPolicy {
            destinations: hostcycle_bmc::destination::CredentialDestinations {
                networks: ["10.99.0.0/16", ".bmc.example"]
                    .iter()
                    .map(|n| n.parse().unwrap())
                    .collect(),
                allow_plain_http: false,
            },
            refuse_unverified_tls: false,
            label: None,
        };
        let refused = check_destination(
            &policy,
            &BmcAddress::parse("redfish://10.0.1.5/redfish/v1/Systems/1").unwrap(),
        )
        .err()
        .unwrap();
        assert!(refused.outside_networks);
        assert_eq!(refused.failure.kind, BmcFailureKind::Credentials);
        let message = &refused.failure.message;
        assert!(message.contains("10.0.1.5"), "{message}");
        assert!(message.contains("--bmc-networks"), "{message}");
        assert!(!message.contains("10.99.0.0/16"), "{message}");
        assert!(!message.contains(".bmc.example"), "{message}");
        // Plain HTTP is not a networks refusal: nothing to log.
        let plain = check_destination(
            &policy,
            &BmcAddress::parse("redfish+http://10.99.0.5").unwrap(),
        )
        .err()
        .unwrap();
        assert!(!plain.outside_networks);

        let cache = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        let mut host = BareMetalHost::new("h", Default::default());
        host.metadata.namespace = Some("ns".into());
        host.metadata.uid = Some("u1".into());
        assert!(cache.log_networks_refusal(&host, &policy, message));
        assert!(!cache.log_networks_refusal(&host, &policy, message), "once");
        assert!(cache.log_networks_refusal(&host, &policy, "another refusal"));
        cache.forget("u1");
        assert!(cache.log_networks_refusal(&host, &policy, "another refusal"));
        host.metadata.uid = Some("u2".into());
        assert!(cache.log_networks_refusal(&host, &policy, "another refusal"));
    }

    /// Issue 25 point 2: an operator may require verified BMC certificates; by default a
    /// host may skip the check, as metal3's hosts do.
    #[test]
    fn unverified_bmc_tls_is_refused_only_when_the_operator_says_so() {
        let redfish = BmcAddress::parse("redfish://10.0.1.5/redfish/v1/Systems/1").unwrap();
        let ipmi = BmcAddress::parse("ipmi://10.0.1.5").unwrap();
        let plain = BmcAddress::parse("redfish+http://10.0.1.5/redfish/v1/Systems/1").unwrap();
        let policy = |refuse| crate::bmh::CredentialsPolicy {
            refuse_unverified_tls: refuse,
            ..Default::default()
        };
        for (refuse, address, disable, refused) in [
            (false, &redfish, Some(true), false),
            (false, &redfish, None, false),
            (true, &redfish, Some(true), true),
            (true, &redfish, Some(false), false),
            (true, &redfish, None, false),
            (true, &ipmi, Some(true), false),
            (true, &plain, Some(true), false),
        ] {
            let result = check_tls_choice(&policy(refuse), address, disable);
            assert_eq!(result.is_err(), refused, "{refuse} {address:?} {disable:?}");
            if let Err(failure) = result {
                assert_eq!(failure.kind, BmcFailureKind::Credentials);
                assert_eq!(failure.message, UNVERIFIED_TLS_REFUSED);
            }
        }
    }

    #[test]
    fn drivers_of_deleted_hosts_are_dropped() {
        let cache = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        for uid in ["a", "b", "c"] {
            let driver = cache
                .connector
                .connect_str(
                    "redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
                    BmcCredentials::new("u", "p").unwrap(),
                    &HostConnectOptions::default(),
                )
                .unwrap();
            let key = DriverKey {
                address: String::new(),
                disable_certificate_verification: false,
                secret_resource_version: None,
            };
            cache
                .lock()
                .insert(uid.to_string(), (key, driver, format!("ns/{uid}")));
        }
        cache.retain_hosts(|uid| ["a", "c"].contains(&uid));
        let mut left: Vec<String> = cache.lock().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["a", "c"]);
    }
}
