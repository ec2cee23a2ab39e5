//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hostcycle_bmc::soft_off::wait_for_power_state;
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, ConnectorOptions, HostConnectOptions, PowerDriver, PowerState,
    RetryPolicy,
};

pub const USER: &str = "admin";
/// Distinctive, so tests can check it never shows up in errors or Debug output.
/// At most 20 bytes: the IPMI limit.
pub const PASSWORD: &str = "Sekr1t-xyzzy-4242";

/// sushy's fake driver applies power changes 1–11 s after a request.
pub const POWER_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

pub fn credentials() -> BmcCredentials {
    BmcCredentials::new(USER, PASSWORD).unwrap()
}

pub fn options() -> ConnectorOptions {
    ConnectorOptions {
        request_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(2),
            deadline: Duration::from_secs(30),
        },
        ..ConnectorOptions::default()
    }
}

pub fn connect(address: &str, host: &HostConnectOptions) -> Arc<dyn PowerDriver> {
    BmcConnector::new(options())
        .connect_str(address, credentials(), host)
        .unwrap()
}

pub fn with_ca(ca_pem: &str) -> HostConnectOptions {
    HostConnectOptions {
        ca_bundle_pem: Some(ca_pem.as_bytes().to_vec()),
        ..Default::default()
    }
}

pub async fn wait_for(driver: &dyn PowerDriver, expected: PowerState) {
    wait_for_power_state(
        driver,
        expected,
        POWER_CHANGE_TIMEOUT,
        Duration::from_millis(500),
    )
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", driver.description()));
}

/// Fails if `text` contains the password.
pub fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "the password leaked into: {text}");
}

/// Logs to the test output (shown for failing tests).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "hostcycle_bmc=debug".into()),
        )
        .with_test_writer()
        .try_init();
}
