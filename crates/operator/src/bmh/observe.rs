//! Observe: what the BMC says about a host, through a cached driver per host.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use hostcycle_api::{BareMetalHost, CredentialsStatus};
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, BmcError, CredentialsError, HostConnectOptions, PowerDriver,
    PowerOutcome, PowerState, credentials_from_secret,
};
use hostcycle_core::bmh::{
    BmcFailure, BmcFailureKind, BmcObservation, ObservedPower, PowerCallResult,
};
use k8s_openapi::api::core::v1::{Secret, SecretReference};
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::metrics::{BmcErrorLabels, BmcRequestLabels, Metrics};

/// What the driver cache keys a driver on: a change to any of these makes a new driver.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DriverKey {
    address: String,
    disable_certificate_verification: bool,
    secret_resource_version: Option<String>,
}

/// Drivers by host UID, with what each was built from.
type DriverMap = HashMap<String, (DriverKey, Arc<dyn PowerDriver>)>;

/// One driver per host, rebuilt when its address, TLS setting or credentials Secret changes.
pub struct DriverCache {
    connector: BmcConnector,
    drivers: Mutex<DriverMap>,
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
        }
    }

    /// Keeps only the drivers of `live` hosts (by UID): hosts deleted without a finalizer
    /// are never seen with a deletion timestamp.
    pub fn retain_hosts(&self, live: &std::collections::HashSet<String>) {
        self.lock().retain(|uid, _| live.contains(uid));
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
    }

    /// Logs every cached driver out of its BMC (closes the Redfish sessions), all at once,
    /// waiting at most `deadline`; for shutdown, since a dropped driver's logout does not
    /// outlive the process. The cache is empty afterwards.
    pub async fn close_all(&self, deadline: std::time::Duration) {
        let drivers: Vec<Arc<dyn PowerDriver>> =
            self.lock().drain().map(|(_, (_, driver))| driver).collect();
        let closes = futures::future::join_all(drivers.iter().map(|d| async move {
            if let Err(e) = d.close().await {
                tracing::info!(bmc = %d.description(), error = %e, "could not log out of the BMC");
            }
        }));
        if tokio::time::timeout(deadline, closes).await.is_err() {
            tracing::info!(
                after = ?deadline,
                "logging out of the BMCs timed out; their sessions expire on their own"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DriverMap> {
        match self.drivers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The driver for `host`, loading its credentials Secret.
    pub async fn driver_for(
        &self,
        client: &Client,
        host: &BareMetalHost,
    ) -> Result<HostBmc, BmcFailure> {
        let ns = host.namespace().unwrap_or_default();
        let bmc = host.spec.bmc.as_ref().ok_or_else(|| BmcFailure {
            kind: BmcFailureKind::Other,
            message: "spec.bmc is not set; set spec.bmc.address and spec.bmc.credentialsName"
                .into(),
        })?;
        let secret_name = bmc.credentials_name.trim();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let secret = match secrets.get_opt(secret_name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(credentials_failure(CredentialsError::SecretNotFound {
                    namespace: ns.clone(),
                    name: secret_name.to_string(),
                }));
            }
            Err(e) => {
                return Err(BmcFailure {
                    kind: BmcFailureKind::Other,
                    message: format!("reading BMC credentials Secret {ns}/{secret_name}: {e}"),
                });
            }
        };
        let key = DriverKey {
            address: bmc.address.clone(),
            disable_certificate_verification: bmc.disable_certificate_verification.unwrap_or(false),
            secret_resource_version: secret.metadata.resource_version.clone(),
        };
        let credentials = CredentialsStatus {
            credentials: Some(SecretReference {
                name: Some(secret_name.to_string()),
                namespace: Some(ns.clone()),
            }),
            credentials_version: secret.metadata.resource_version.clone(),
        };
        let uid = host.uid().unwrap_or_default();
        if let Some((cached_key, driver)) = self.lock().get(&uid)
            && *cached_key == key
        {
            return Ok(HostBmc {
                driver: driver.clone(),
                credentials,
            });
        }
        let creds: BmcCredentials =
            credentials_from_secret(&secret).map_err(credentials_failure)?;
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
        self.lock().insert(uid, (key, driver.clone()));
        Ok(HostBmc {
            driver,
            credentials,
        })
    }
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
        BmcError::AuthenticationFailed { .. } => BmcFailureKind::Credentials,
        BmcError::Connection { .. } | BmcError::Certificate { .. } | BmcError::Timeout { .. } => {
            BmcFailureKind::Unreachable
        }
        BmcError::RetriesExhausted { last, .. } => failure_kind(last),
        _ => BmcFailureKind::Other,
    }
}

/// Reads the power state, timing the request for metrics.
pub async fn read_power(driver: &dyn PowerDriver, metrics: &Metrics) -> BmcObservation {
    let started = Instant::now();
    let result = driver.power_state().await;
    let kind = driver.description().kind.to_string();
    metrics
        .bmc_request_duration
        .get_or_create(&BmcRequestLabels {
            driver: kind.clone(),
            operation: "read_power".into(),
        })
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(PowerState::On) => BmcObservation::Power(ObservedPower::On),
        Ok(PowerState::Off) => BmcObservation::Power(ObservedPower::Off),
        Ok(PowerState::Transitioning) => BmcObservation::Power(ObservedPower::Transitioning),
        Ok(PowerState::Unknown) => BmcObservation::Power(ObservedPower::Unknown),
        Err(e) => {
            metrics
                .bmc_errors
                .get_or_create(&BmcErrorLabels {
                    driver: kind,
                    operation: "read_power".into(),
                    kind: e.reason().into(),
                })
                .inc();
            BmcObservation::Failed(failure_from(&e))
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
        cache.lock().insert("uid".to_string(), (key, driver));
        for _ in 0..5 {
            let driver = cache.lock().get("uid").unwrap().1.clone();
            assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
        }
        assert_eq!(server.logins(), 1, "one session for every reconcile");
        cache.close_all(std::time::Duration::from_secs(5)).await;
        assert_eq!(server.open_sessions(), 0);
        assert!(cache.is_empty());
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
            cache.lock().insert(uid.to_string(), (key, driver));
        }
        cache.retain_hosts(&["a".to_string(), "c".to_string()].into_iter().collect());
        let mut left: Vec<String> = cache.lock().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["a", "c"]);
    }
}
