//! The Redfish driver against the real sushy-tools emulator (fake driver) with basic auth and
//! TLS. Needs `scripts/install-prereqs.sh`; fails (never skips) without it.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use hostcycle_bmc::soft_off::{OffPath, SoftOffPolicy, power_off_with_fallback};
use hostcycle_bmc::{BmcError, HostConnectOptions, PowerOffMode, PowerState};
use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::pki::TestCa;

/// A TLS + basic-auth emulator with the given systems.
async fn emulator(systems: Vec<FakeSystem>) -> RedfishEmulator {
    init_tracing();
    RedfishEmulator::start(RedfishEmulatorOptions {
        systems,
        basic_auth: Some((USER.into(), PASSWORD.into())),
        tls: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("starting sushy-emulator: {e}"))
}

async fn one_host(power: FakePower) -> (RedfishEmulator, HostConnectOptions) {
    let emulator = emulator(vec![FakeSystem::new("host-0", power)]).await;
    let host = with_ca(emulator.ca_pem().unwrap());
    (emulator, host)
}

/// A reading carries the System's UUID: the identity fencing binds its readings to.
#[tokio::test]
async fn readings_carry_the_systems_uuid() {
    let emulator = emulator(vec![
        FakeSystem::new("a", FakePower::On),
        FakeSystem::new("b", FakePower::Off),
    ])
    .await;
    let host = with_ca(emulator.ca_pem().unwrap());
    for (i, state) in [(0, PowerState::On), (1, PowerState::Off)] {
        let reading = connect(&emulator.system_address(i).unwrap(), &host)
            .power_reading()
            .await
            .unwrap();
        assert_eq!(reading.state, state);
        let uuid = emulator.systems()[i].uuid.to_lowercase();
        assert_eq!(
            reading.identity.map(|id| id.to_lowercase()),
            Some(format!("uuid:{uuid}")),
            "system {i}"
        );
    }
}

#[tokio::test]
async fn reads_power_state_over_tls_with_basic_auth() {
    let emulator = emulator(vec![
        FakeSystem::new("off-host", FakePower::Off),
        FakeSystem::new("on-host", FakePower::On),
    ])
    .await;
    let host = with_ca(emulator.ca_pem().unwrap());
    let off = connect(&emulator.system_address(0).unwrap(), &host);
    let on = connect(&emulator.system_address(1).unwrap(), &host);
    assert_eq!(off.power_state().await.unwrap(), PowerState::Off);
    assert_eq!(on.power_state().await.unwrap(), PowerState::On);
    let description = off.description().to_string();
    assert!(
        description.starts_with("redfish https://127.0.0.1:"),
        "{description}"
    );
    assert!(
        description.contains(&emulator.systems()[0].uuid),
        "{description}"
    );
}

#[tokio::test]
async fn powers_on() {
    let (emulator, host) = one_host(FakePower::Off).await;
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    let outcome = driver.power_on().await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=On"));
    assert!(!outcome.fell_back_to_hard());
    wait_for(driver.as_ref(), PowerState::On).await;
    assert_eq!(emulator.power_state(0).await.unwrap(), "On");
    // Already on: nothing is sent.
    assert_eq!(driver.power_on().await.unwrap().action, None);
}

#[tokio::test]
async fn soft_power_off_uses_graceful_shutdown() {
    let (emulator, host) = one_host(FakePower::On).await;
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    let outcome = driver.power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(
        outcome.action.as_deref(),
        Some("ResetType=GracefulShutdown")
    );
    assert_eq!(outcome.hard_fallback, None);
    wait_for(driver.as_ref(), PowerState::Off).await;
    assert_eq!(emulator.power_state(0).await.unwrap(), "Off");
}

#[tokio::test]
async fn hard_power_off_uses_force_off() {
    let (emulator, host) = one_host(FakePower::On).await;
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    let outcome = driver.power_off(PowerOffMode::Hard).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOff"));
    wait_for(driver.as_ref(), PowerState::Off).await;
    assert_eq!(
        driver.power_off(PowerOffMode::Hard).await.unwrap().action,
        None
    );
}

#[tokio::test]
async fn soft_off_with_fallback_waits_until_off() {
    let (emulator, host) = one_host(FakePower::On).await;
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    // The soft timeout exceeds the emulator's longest delay, so the soft path must win.
    let policy = SoftOffPolicy {
        soft_timeout: Duration::from_secs(25),
        poll_interval: Duration::from_millis(500),
        hard_timeout: POWER_CHANGE_TIMEOUT,
    };
    let report = power_off_with_fallback(driver.as_ref(), PowerOffMode::Soft, &policy, None)
        .await
        .unwrap();
    assert_eq!(report.path, OffPath::Soft);
    assert_eq!(emulator.power_state(0).await.unwrap(), "Off");
}

#[tokio::test]
async fn reboot_restarts_a_running_host() {
    let (emulator, host) = one_host(FakePower::On).await;
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    let outcome = driver.reboot(PowerOffMode::Hard).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceRestart"));
    // sushy's fake driver shows the host off at once, then on after the delay.
    assert_eq!(driver.power_state().await.unwrap(), PowerState::Off);
    wait_for(driver.as_ref(), PowerState::On).await;
}

#[tokio::test]
async fn wrong_password_is_a_clear_authentication_error_and_not_retried() {
    let (emulator, host) = one_host(FakePower::Off).await;
    let driver = hostcycle_bmc::BmcConnector::new(options())
        .connect_str(
            &emulator.system_address(0).unwrap(),
            hostcycle_bmc::BmcCredentials::new(USER, "wrong-password").unwrap(),
            &host,
        )
        .unwrap();
    let start = Instant::now();
    let err = driver.power_state().await.unwrap_err();
    assert!(
        matches!(err, BmcError::AuthenticationFailed { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("rejected the credentials"), "{message}");
    assert!(message.contains("HTTP 401"), "{message}");
    assert!(message.contains("credentials Secret"), "{message}");
    assert!(!message.contains("wrong-password"), "{message}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "401 must not be retried"
    );
}

#[tokio::test]
async fn wrong_ca_is_a_clear_certificate_error() {
    let (emulator, _) = one_host(FakePower::Off).await;
    let other_ca = TestCa::new("some other CA").unwrap();
    let address = emulator.system_address(0).unwrap();
    let driver = connect(&address, &with_ca(&other_ca.cert_pem()));
    let err = driver.power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::Certificate { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("TLS certificate of BMC https://127.0.0.1:"),
        "{message}"
    );
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(
        message.contains("disableCertificateVerification"),
        "{message}"
    );
    assert_no_secret(&format!("{err} {err:?}"));

    // The system trust store does not know the test CA either.
    let driver = connect(&address, &HostConnectOptions::default());
    let err = driver.power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::Certificate { .. }), "{err:?}");
}

#[tokio::test]
async fn disabled_verification_accepts_the_certificate() {
    let (emulator, _) = one_host(FakePower::On).await;
    let host = HostConnectOptions {
        disable_certificate_verification: true,
        ..Default::default()
    };
    let driver = connect(&emulator.system_address(0).unwrap(), &host);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn unknown_system_is_a_not_found_error() {
    let (emulator, host) = one_host(FakePower::Off).await;
    let address = format!(
        "redfish://127.0.0.1:{}/redfish/v1/Systems/no-such-system",
        emulator.port()
    );
    let err = connect(&address, &host).power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::SystemNotFound { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("/redfish/v1/Systems/no-such-system (HTTP 404)"),
        "{err}"
    );
}

#[tokio::test]
async fn finds_the_only_system_and_refuses_to_guess_among_several() {
    let (single, host) = one_host(FakePower::On).await;
    let address = format!("redfish://127.0.0.1:{}", single.port());
    assert_eq!(
        connect(&address, &host).power_state().await.unwrap(),
        PowerState::On
    );

    let several = emulator(vec![
        FakeSystem::new("a", FakePower::On),
        FakeSystem::new("b", FakePower::On),
    ])
    .await;
    let address = format!("redfish://127.0.0.1:{}/", several.port());
    let err = connect(&address, &with_ca(several.ca_pem().unwrap()))
        .power_state()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BmcError::SystemAmbiguous { count: 2, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn follows_same_host_redirects_from_system_names() {
    // sushy answers /Systems/<name> with a 307 to /Systems/<uuid>.
    let (emulator, host) = one_host(FakePower::On).await;
    let address = format!(
        "redfish://127.0.0.1:{}/redfish/v1/Systems/host-0",
        emulator.port()
    );
    assert_eq!(
        connect(&address, &host).power_state().await.unwrap(),
        PowerState::On
    );
}

#[tokio::test]
async fn plain_http_without_auth() {
    init_tracing();
    let emulator = RedfishEmulator::start(RedfishEmulatorOptions::default())
        .await
        .unwrap();
    let address = emulator.system_address(0).unwrap();
    assert!(
        address.starts_with("redfish+http://127.0.0.1:"),
        "{address}"
    );
    let driver = connect(&address, &HostConnectOptions::default());
    assert_eq!(driver.power_state().await.unwrap(), PowerState::Off);
}
