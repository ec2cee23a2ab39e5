//! `apply_status_updates` and `HostSnapshot::from_host`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::reasons::condition as cond;
use hostcycle_api::{
    BareMetalHost, BareMetalHostStatus, ErrorType, HardFallback, HardFallbackSource,
    LastPowerAction, OperationalStatus, PowerActionState, PowerActionTrigger, PowerOffMode,
    PowerTarget,
};
use hostcycle_core::bmh::{
    BmcObservation, ConditionUpdate, DecideConfig, HostSnapshot, ObservedPower, StatusUpdate,
    apply_status_updates,
};
use jiff::Timestamp;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn condition(status: &'static str, reason: &'static str) -> StatusUpdate {
    StatusUpdate::SetCondition(ConditionUpdate {
        type_: cond::REBOOT_PENDING,
        status,
        reason,
        message: String::new(),
    })
}

#[test]
fn condition_transition_time_moves_only_when_status_changes() {
    let mut st = BareMetalHostStatus::default();
    apply_status_updates(
        &mut st,
        &[condition("True", "AwaitingPowerOff")],
        ts(0),
        Some(3),
    );
    apply_status_updates(
        &mut st,
        &[condition("True", "HeldByAnnotations")],
        ts(10),
        Some(4),
    );
    assert_eq!(st.conditions.len(), 1);
    assert_eq!(st.conditions[0].last_transition_time.0, ts(0));
    assert_eq!(st.conditions[0].reason, "HeldByAnnotations");
    assert_eq!(st.conditions[0].observed_generation, Some(4));
    apply_status_updates(
        &mut st,
        &[condition("False", "NoRebootPending")],
        ts(20),
        Some(4),
    );
    assert_eq!(st.conditions[0].last_transition_time.0, ts(20));
}

#[test]
fn power_action_lifecycle_and_errors() {
    let mut st = BareMetalHostStatus::default();
    let record = LastPowerAction {
        action: PowerTarget::Off,
        mode: Some(PowerOffMode::Soft),
        trigger: PowerActionTrigger::RebootRequested,
        state: PowerActionState::Requested,
        requested_at: ts(0),
        last_attempt_at: ts(0),
        attempts: 1,
        completed_at: None,
        hard_fallback: None,
        failure: None,
        restart: false,
    };
    apply_status_updates(
        &mut st,
        &[
            StatusUpdate::RecordPowerRequest(record),
            StatusUpdate::FailPowerAction {
                message: "reset".into(),
            },
            StatusUpdate::SetOperationalStatus(OperationalStatus::Error),
            StatusUpdate::SetError {
                error_type: ErrorType::PowerManagementError,
                message: "reset".into(),
                count: 2,
            },
        ],
        ts(1),
        None,
    );
    let a = st.last_power_action.clone().unwrap();
    assert_eq!(
        (a.state, a.failure.as_deref()),
        (PowerActionState::Failed, Some("reset"))
    );
    assert_eq!(st.error_count, 2);

    apply_status_updates(
        &mut st,
        &[
            StatusUpdate::SetHardFallback(HardFallback {
                by: HardFallbackSource::Bmc,
                reason: "ACPI ignored".into(),
                at: Some(ts(2)),
            }),
            StatusUpdate::CompletePowerAction { at: ts(3) },
            StatusUpdate::ClearError,
            StatusUpdate::SetOperationalStatus(OperationalStatus::Ok),
        ],
        ts(3),
        None,
    );
    let a = st.last_power_action.clone().unwrap();
    assert_eq!(a.state, PowerActionState::Completed);
    assert_eq!(a.completed_at, Some(ts(3)));
    assert_eq!(a.failure, None);
    assert!(a.hard_fallback.is_some());
    assert_eq!(
        (st.error_type, st.error_count, st.error_message.as_str()),
        (None, 0, "")
    );
}

#[test]
fn error_backoff_doubles_and_caps() {
    let cfg = DecideConfig::default();
    let secs: Vec<u64> = (0..9).map(|n| cfg.error_backoff(n).as_secs()).collect();
    assert_eq!(secs, vec![5, 5, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(cfg.error_backoff(u32::MAX).as_secs(), 300);
}

#[test]
fn snapshot_from_a_metal3_style_object() {
    let yaml = r#"
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: w
  namespace: ns
  generation: 7
  annotations:
    reboot.metal3.io/b: '{"mode":"hard"}'
    reboot.metal3.io: ""
    baremetalhost.metal3.io/paused: ""
spec:
  online: true
  externallyProvisioned: true
  bmc: {address: "  ", credentialsName: s}
status:
  poweredOn: false
  provisioning: {state: externally provisioned, lastPoweredOn: "2025-01-01T00:00:00.25Z"}
"#;
    let host: BareMetalHost = serde_saphyr::from_str(yaml).unwrap();
    let s = HostSnapshot::from_host(&host, BmcObservation::Power(ObservedPower::Off), None);
    assert_eq!(s.generation, Some(7));
    assert!(s.online && s.externally_provisioned && !s.has_consumer);
    assert!(!s.bmc_configured, "blank address is no address");
    assert!(s.paused && !s.detached);
    assert!(s.reboot_requests.has_suffixless());
    assert_eq!(s.reboot_requests.keyed_keys(), vec!["b"]);
    assert_eq!(s.status.powered_on, Some(false));
    assert_eq!(
        s.status
            .provisioning
            .last_powered_on
            .unwrap()
            .subsec_nanosecond(),
        250_000_000
    );
}
