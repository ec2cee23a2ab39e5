//! The IPMI driver (ipmitool -I lanplus -C 3) against a real pyghmi BMC. Needs
//! `scripts/install-prereqs.sh` (ipmitool and the venv); fails (never skips) without them.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, BmcError, ConnectorOptions, HostConnectOptions, IpmiOptions,
    PowerOffMode, PowerState,
};
use hostcycle_testkit::bmc_emulators::{FakeIpmiBmc, FakePower};

async fn bmc(power: FakePower) -> FakeIpmiBmc {
    init_tracing();
    hostcycle_testkit::require_program("ipmitool", Path::new("/usr/bin/ipmitool"))
        .unwrap_or_else(|e| panic!("{e}"));
    FakeIpmiBmc::start(USER, PASSWORD, power)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn driver(bmc: &FakeIpmiBmc) -> std::sync::Arc<dyn hostcycle_bmc::PowerDriver> {
    connect(&bmc.address(), &HostConnectOptions::default())
}

#[tokio::test]
async fn reads_power_state() {
    let off = bmc(FakePower::Off).await;
    let on = bmc(FakePower::On).await;
    assert_eq!(driver(&off).power_state().await.unwrap(), PowerState::Off);
    assert_eq!(driver(&on).power_state().await.unwrap(), PowerState::On);
    let description = driver(&on).description().to_string();
    assert_eq!(
        description,
        format!("ipmi {} (lanplus, cipher suite 3)", on.address())
    );
}

/// A reading carries the BMC's System GUID (`ipmitool mc guid`): one per machine, the same
/// on every reading, another for another BMC.
#[tokio::test]
async fn readings_carry_the_bmcs_system_guid() {
    let a = bmc(FakePower::On).await;
    let b = bmc(FakePower::Off).await;
    let reading = driver(&a).power_reading().await.unwrap();
    assert_eq!(reading.state, PowerState::On);
    let identity = reading.identity.expect("a GUID");
    assert!(identity.starts_with("guid:"), "{identity}");
    assert_eq!(
        driver(&a)
            .power_reading()
            .await
            .unwrap()
            .identity
            .as_deref(),
        Some(identity.as_str())
    );
    let other = driver(&b).power_reading().await.unwrap();
    assert_eq!(other.state, PowerState::Off);
    assert_ne!(other.identity.as_deref(), Some(identity.as_str()));
}

#[tokio::test]
async fn powers_on_and_off_soft_and_hard() {
    let bmc = bmc(FakePower::Off).await;
    let driver = driver(&bmc);

    let outcome = driver.power_on().await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("chassis power on"));
    assert_eq!(bmc.power_state().unwrap(), FakePower::On);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(driver.power_on().await.unwrap().action, None, "already on");

    let outcome = driver.power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("chassis power soft"));
    assert!(!outcome.fell_back_to_hard());
    assert_eq!(bmc.power_state().unwrap(), FakePower::Off);

    driver.power_on().await.unwrap();
    let outcome = driver.power_off(PowerOffMode::Hard).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("chassis power off"));
    assert_eq!(bmc.power_state().unwrap(), FakePower::Off);
    assert_eq!(
        driver.power_off(PowerOffMode::Hard).await.unwrap().action,
        None,
        "already off"
    );
}

#[tokio::test]
async fn reboot_resets_a_running_host_and_starts_a_stopped_one() {
    let bmc = bmc(FakePower::On).await;
    let driver = driver(&bmc);
    let outcome = driver.reboot(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("chassis power reset"));
    assert_eq!(
        outcome.hard_fallback.as_deref(),
        Some("IPMI has no graceful restart")
    );

    driver.power_off(PowerOffMode::Hard).await.unwrap();
    let outcome = driver.reboot(PowerOffMode::Hard).await.unwrap();
    assert_eq!(
        outcome.action.as_deref(),
        Some("chassis power on (host was off)")
    );
    assert_eq!(bmc.power_state().unwrap(), FakePower::On);
}

#[tokio::test]
async fn wrong_password_is_a_clear_authentication_error_and_not_retried() {
    let bmc = bmc(FakePower::On).await;
    let driver = BmcConnector::new(options())
        .connect_str(
            &bmc.address(),
            BmcCredentials::new(USER, "not-the-password").unwrap(),
            &HostConnectOptions::default(),
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
    assert!(message.contains("RAKP 2 HMAC is invalid"), "{message}");
    assert!(!message.contains("not-the-password"), "{message}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(bmc.power_state().unwrap(), FakePower::On);
}

#[test]
fn passwords_longer_than_ipmi_allows_are_rejected_up_front() {
    let err = BmcConnector::new(options())
        .connect_str(
            "ipmi://127.0.0.1:623",
            BmcCredentials::new(USER, "a-password-of-21-byte").unwrap(),
            &HostConnectOptions::default(),
        )
        .unwrap_err();
    // The message does not say how long the password is.
    assert_eq!(
        err.to_string(),
        "invalid BMC connection settings: the password for ipmi://127.0.0.1:623 is longer than \
         the 20 bytes IPMI allows; use a shorter BMC password or a Redfish address"
    );
    assert!(!err.to_string().contains("21"), "{err}");
}

#[tokio::test]
async fn a_missing_ipmitool_is_reported_with_the_fix() {
    let bmc = bmc(FakePower::On).await;
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool: "/nonexistent/ipmitool".into(),
            ..IpmiOptions::default()
        },
        ..options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            &bmc.address(),
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    let err = driver.power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::IpmitoolMissing { .. }), "{err:?}");
    assert!(
        err.to_string().contains("install the `ipmitool` package"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unreachable_bmc_times_out_with_a_clear_error() {
    init_tracing();
    // Nothing listens on this UDP port.
    let port = hostcycle_testkit::free_udp_port().unwrap();
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            packet_timeout_secs: 1,
            packet_retries: 1,
            command_timeout: Duration::from_secs(10),
            ..IpmiOptions::default()
        },
        retry: hostcycle_bmc::RetryPolicy {
            max_attempts: 2,
            ..options().retry
        },
        ..options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            &format!("ipmi://127.0.0.1:{port}"),
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    let err = driver.power_state().await.unwrap_err();
    let message = err.to_string();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        message.contains("still failing after 2 attempts"),
        "{message}"
    );
    assert!(
        message.contains(&format!("ipmi://127.0.0.1:{port}")),
        "{message}"
    );
    assert_no_secret(&format!("{err} {err:?}"));
}

/// A stand-in ipmitool that records its argv, its environment's passwords and its stdin.
fn recording_ipmitool(dir: &std::path::Path) -> std::path::PathBuf {
    let script = dir.join("ipmitool");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {dir}/argv\n\
             printf '%s' \"$IPMI_PASSWORD$IPMITOOL_PASSWORD\" > {dir}/env\n\
             cat > {dir}/stdin\n\
             echo 'Chassis Power is on'\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

/// The password reaches ipmitool through a pipe on its stdin (`-f /dev/stdin`): never its
/// command line, nor its environment (which other processes of the operator's user, reboot
/// commands among them, could read in /proc).
#[tokio::test]
async fn the_password_goes_through_a_pipe_not_the_command_line_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool: recording_ipmitool(dir.path()),
            cipher_suite: 17,
            ..IpmiOptions::default()
        },
        ..options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            "ipmi://[fd00::7]:6230",
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    assert_no_secret(&argv.join(" "));
    assert_eq!(
        argv,
        [
            "-I",
            "lanplus",
            "-C",
            "17",
            "-H",
            "fd00::7",
            "-p",
            "6230",
            "-U",
            USER,
            "-f",
            "/dev/stdin",
            "-N",
            "2",
            "-R",
            "3",
            "-v",
            "chassis",
            "power",
            "status"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("env")).unwrap(),
        "",
        "no password in ipmitool's environment"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("stdin")).unwrap(),
        format!("{PASSWORD}\n")
    );
    assert_no_secret(&format!("{driver:?}"));
}

/// ipmitool cuts the line it reads at a tab, CR or LF: such a password (rare, but metal3
/// Secrets may hold one) still works, through the environment (`-E`) as before.
#[tokio::test]
async fn a_password_ipmitool_cannot_read_from_a_line_goes_through_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool: recording_ipmitool(dir.path()),
            ..IpmiOptions::default()
        },
        ..options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            "ipmi://127.0.0.1:6230",
            BmcCredentials::new(USER, "tab\tpass").unwrap(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
    assert!(argv.lines().any(|a| a == "-E"), "{argv}");
    assert!(!argv.contains("tab\tpass"), "{argv}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("env")).unwrap(),
        "tab\tpasstab\tpass"
    );
}
