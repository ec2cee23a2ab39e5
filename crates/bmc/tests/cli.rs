//! `hostcycle bmc …` end to end (argument parsing → drivers → report) against the real
//! emulators.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;
use common::*;
use hostcycle_bmc::PowerState;
use hostcycle_bmc::cli::{BmcArgs, CliReport, OutputFormat, execute};
use hostcycle_bmc::soft_off::OffPath;
use hostcycle_testkit::bmc_emulators::{
    FakeIpmiBmc, FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};

/// What the `hostcycle` binary wraps: `hostcycle bmc <args>`.
#[derive(Debug, Parser)]
struct Bmc {
    #[command(flatten)]
    args: BmcArgs,
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

async fn run(argv: &[&str]) -> anyhow::Result<CliReport> {
    let cli = Bmc::try_parse_from(std::iter::once("bmc").chain(argv.iter().copied()))?;
    execute(&cli.args).await
}

async fn emulator(power: FakePower) -> RedfishEmulator {
    init_tracing();
    RedfishEmulator::start(RedfishEmulatorOptions {
        systems: vec![FakeSystem::new("host-0", power)],
        basic_auth: Some((USER.into(), PASSWORD.into())),
        tls: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("starting sushy-emulator: {e}"))
}

#[tokio::test]
async fn status_with_a_ca_file_as_json() {
    let emulator = emulator(FakePower::Off).await;
    let files = Files::new();
    let password = files.write("password", &format!("{PASSWORD}\n"));
    let ca = files.write("ca.pem", emulator.ca_pem().unwrap());
    let address = emulator.system_address(0).unwrap();
    let report = run(&[
        "status",
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        &path(&password),
        "--ca-file",
        &path(&ca),
        "-o",
        "json",
    ])
    .await
    .unwrap();
    assert_eq!(report.power_state, PowerState::Off);
    let json: serde_json::Value =
        serde_json::from_str(&report.render(OutputFormat::Json).unwrap()).unwrap();
    assert_eq!(json["command"], "status");
    assert_eq!(json["power_state"], "off");
    assert_eq!(json["address"], address);
    assert_no_secret(&json.to_string());
}

#[tokio::test]
async fn insecure_skips_verification_and_without_it_the_certificate_error_is_clear() {
    let emulator = emulator(FakePower::On).await;
    let files = Files::new();
    let password = files.write("password", PASSWORD);
    let address = emulator.system_address(0).unwrap();
    let base = [
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        &path(&password),
    ];

    let report = run(&[&["status", "--insecure"][..], &base[..]].concat())
        .await
        .unwrap();
    assert_eq!(report.power_state, PowerState::On);
    let text = report.render(OutputFormat::Text).unwrap();
    assert!(
        text.starts_with("power: on\nbmc: redfish https://127.0.0.1:"),
        "{text}"
    );

    let err = run(&[&["status"][..], &base[..]].concat())
        .await
        .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("TLS certificate of BMC"), "{message}");
    assert!(message.contains("--insecure"), "{message}");
}

#[tokio::test]
async fn cycle_hard_goes_off_then_on() {
    let emulator = emulator(FakePower::On).await;
    let files = Files::new();
    let password = files.write("password", PASSWORD);
    let ca = files.write("ca.pem", emulator.ca_pem().unwrap());
    let address = emulator.system_address(0).unwrap();
    let report = run(&[
        "cycle",
        "--hard",
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        &path(&password),
        "--ca-file",
        &path(&ca),
        "--poll-interval",
        "500ms",
        "--wait-timeout",
        "30s",
    ])
    .await
    .unwrap();
    assert_eq!(report.power_state, PowerState::On);
    assert_eq!(report.off_path, Some(OffPath::Hard));
    let actions: Vec<_> = report
        .actions
        .iter()
        .map(|a| a.action.clone().unwrap())
        .collect();
    assert_eq!(actions, ["ResetType=ForceOff", "ResetType=On"]);
    assert_eq!(emulator.power_state(0).await.unwrap(), "On");
}

#[tokio::test]
async fn off_is_soft_and_on_waits_for_on() {
    let emulator = emulator(FakePower::On).await;
    let files = Files::new();
    let password = files.write("password", PASSWORD);
    let ca = files.write("ca.pem", emulator.ca_pem().unwrap());
    let address = emulator.system_address(0).unwrap();
    let common = [
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        &path(&password),
        "--ca-file",
        &path(&ca),
        "--poll-interval",
        "500ms",
        "--wait-timeout",
        "30s",
    ];
    // The soft timeout is longer than the emulator's longest delay: the soft path wins.
    let report = run(&[&["off", "--soft-timeout", "25s"][..], &common[..]].concat())
        .await
        .unwrap();
    assert_eq!(report.off_path, Some(OffPath::Soft));
    assert_eq!(
        report.actions[0].action.as_deref(),
        Some("ResetType=GracefulShutdown")
    );
    assert_eq!(emulator.power_state(0).await.unwrap(), "Off");

    let report = run(&[&["on"][..], &common[..]].concat()).await.unwrap();
    assert_eq!(report.power_state, PowerState::On);
    assert_eq!(emulator.power_state(0).await.unwrap(), "On");
}

#[tokio::test]
async fn ipmi_status_and_hard_off() {
    init_tracing();
    let bmc = FakeIpmiBmc::start(USER, PASSWORD, FakePower::On)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let files = Files::new();
    let password = files.write("password", PASSWORD);
    let base = [
        "--address",
        &bmc.address(),
        "--username",
        USER,
        "--password-file",
        &path(&password),
    ];
    let report = run(&[&["status"][..], &base[..]].concat()).await.unwrap();
    assert_eq!(report.power_state, PowerState::On);
    let report = run(&[
        &["off", "--hard", "--poll-interval", "200ms"][..],
        &base[..],
    ]
    .concat())
    .await
    .unwrap();
    assert_eq!(report.off_path, Some(OffPath::Hard));
    assert_eq!(bmc.power_state().unwrap(), FakePower::Off);
}

#[tokio::test]
async fn wrong_password_and_missing_password_file_are_clear_errors() {
    let emulator = emulator(FakePower::Off).await;
    let files = Files::new();
    let wrong = files.write("password", "definitely-wrong");
    let ca = files.write("ca.pem", emulator.ca_pem().unwrap());
    let address = emulator.system_address(0).unwrap();
    let err = run(&[
        "status",
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        &path(&wrong),
        "--ca-file",
        &path(&ca),
    ])
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("rejected the credentials (HTTP 401"),
        "{message}"
    );
    assert!(!message.contains("definitely-wrong"), "{message}");

    let err = run(&[
        "status",
        "--address",
        &address,
        "--username",
        USER,
        "--password-file",
        "/nonexistent/pw",
    ])
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("could not read the BMC password file /nonexistent/pw"),
        "{err:#}"
    );
}

#[tokio::test]
async fn a_bad_address_lists_the_supported_schemes() {
    let files = Files::new();
    let password = files.write("password", PASSWORD);
    let err = run(&[
        "status",
        "--address",
        "http://10.0.0.1/",
        "--username",
        USER,
        "--password-file",
        &path(&password),
    ])
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("unsupported scheme \"http\""), "{message}");
    assert!(message.contains("idrac-redfish"), "{message}");
}
