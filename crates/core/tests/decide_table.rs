//! Single-step rules of `decide`, as a table: one snapshot in, the expected power action,
//! annotation removals, events and requeue out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hostcycle_api::reasons::event_reason as ev;
use hostcycle_api::{
    ErrorType, OperationalStatus, PowerActionState, PowerActionTrigger, PowerOffMode, PowerTarget,
    ProvisioningState,
};
use hostcycle_core::bmh::{
    Action, BmcFailure, BmcFailureKind, BmcObservation, ObservedPower, StatusUpdate, decide,
};

const SUFFIXLESS: &str = "reboot.metal3.io";
const KEY_A: &str = "reboot.metal3.io/a";
const KEY_B: &str = "reboot.metal3.io/b";
const HARD: &str = r#"{"mode":"hard"}"#;

struct Case {
    name: &'static str,
    host: Host,
    now_ms: i64,
    power: Option<Action>,
    removes: &'static [&'static str],
    /// Event reasons that must appear (in this order, others may be interleaved).
    events: &'static [&'static str],
    /// Event reasons that must not appear.
    no_events: &'static [&'static str],
    requeue: Option<Duration>,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            host: host_on(),
            now_ms: 0,
            power: None,
            removes: &[],
            events: &[],
            no_events: &[],
            requeue: SLOW,
        }
    }
}

fn off(mode: PowerOffMode) -> Option<Action> {
    Some(Action::PowerOff { mode })
}

fn soft_off_in_flight(at_ms: i64) -> impl FnOnce(&mut hostcycle_api::BareMetalHostStatus) {
    move |st| {
        st.provisioning.pending_reboot_since = Some(t(at_ms));
        st.last_power_action = Some(requested(
            PowerTarget::Off,
            Some(PowerOffMode::Soft),
            PowerActionTrigger::RebootRequested,
            t(at_ms),
        ));
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "steady: on, online, no annotation → nothing",
            ..Default::default()
        },
        Case {
            name: "paused → nothing at all, not even a requeue",
            host: host_on()
                .annotate("baremetalhost.metal3.io/paused", "")
                .annotate(SUFFIXLESS, "")
                .online(false),
            requeue: None,
            ..Default::default()
        },
        Case {
            name: "detached → no power management, annotations left alone",
            host: host_on()
                .annotate("baremetalhost.metal3.io/detached", "")
                .annotate(KEY_A, "")
                .online(false),
            ..Default::default()
        },
        Case {
            name: "suffixless on a running host → soft power-off",
            host: host_on().annotate(SUFFIXLESS, ""),
            power: off(PowerOffMode::Soft),
            events: &[ev::REBOOT_REQUESTED, ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "hard suffixless → hard power-off",
            host: host_on().annotate(SUFFIXLESS, HARD),
            power: off(PowerOffMode::Hard),
            events: &[ev::REBOOT_REQUESTED, ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "mixed soft + hard clients → hard wins",
            host: host_on()
                .annotate(KEY_A, r#"{"mode":"soft"}"#)
                .annotate(KEY_B, HARD),
            power: off(PowerOffMode::Hard),
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "malformed value → soft + InvalidRebootAnnotation warning",
            host: host_on().annotate(KEY_A, "{'mode':'hard'}"),
            power: off(PowerOffMode::Soft),
            events: &[
                ev::REBOOT_REQUESTED,
                ev::INVALID_REBOOT_ANNOTATION,
                ev::POWER_OFF,
            ],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "unknown mode → soft + warning",
            host: host_on().annotate(SUFFIXLESS, r#"{"mode":"cold"}"#),
            power: off(PowerOffMode::Soft),
            events: &[ev::INVALID_REBOOT_ANNOTATION],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "non-reboot annotations are ignored",
            host: host_on()
                .annotate("reboot.metal3.ioX", HARD)
                .annotate("xreboot.metal3.io/a", ""),
            ..Default::default()
        },
        Case {
            name: "online: false → soft power-off (not a reboot)",
            host: host_on().online(false),
            power: off(PowerOffMode::Soft),
            events: &[ev::POWER_OFF],
            no_events: &[ev::REBOOT_REQUESTED, ev::POWER_STATE_CORRECTED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "online: true, off, no annotation → power on (no correction: we never saw it on... it was off by spec)",
            host: host_off_offline().online(true),
            power: Some(Action::PowerOn),
            events: &[ev::POWER_ON],
            no_events: &[ev::POWER_STATE_CORRECTED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "first sight of an off host that should be on → power on, no correction event",
            host: host_on()
                .bmc(ObservedPower::Off)
                .with_status(|st| st.powered_on = None),
            power: Some(Action::PowerOn),
            no_events: &[ev::POWER_STATE_CORRECTED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "powered off behind our back → corrected and reported",
            host: host_on().bmc(ObservedPower::Off),
            power: Some(Action::PowerOn),
            events: &[ev::POWER_STATE_CORRECTED, ev::POWER_ON],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "off while the reboot queue's command reboots it → left to the command: no power-on, no correction",
            host: host_on().bmc(ObservedPower::Off).annotate(
                hostcycle_core::queue::reboot::COMMAND_MARKER_ANNOTATION,
                "rqe-uid",
            ),
            no_events: &[ev::POWER_STATE_CORRECTED, ev::POWER_ON],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "the command's marker does not stop a reboot annotation's power-off",
            host: host_on()
                .annotate(
                    hostcycle_core::queue::reboot::COMMAND_MARKER_ANNOTATION,
                    "rqe-uid",
                )
                .annotate(SUFFIXLESS, HARD),
            power: off(PowerOffMode::Hard),
            events: &[ev::REBOOT_REQUESTED, ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "powered on behind our back while offline → corrected and reported",
            host: host_off_offline().bmc(ObservedPower::On),
            power: off(PowerOffMode::Soft),
            events: &[ev::POWER_STATE_CORRECTED, ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "keyed annotation on a host that is already off → no power-off sent, held; \
                   read again within a second (readings count only after the request)",
            host: host_off_offline().online(true).annotate(KEY_A, ""),
            events: &[ev::REBOOT_REQUESTED],
            no_events: &[ev::POWER_OFF, ev::POWER_ON],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "suffixless on a host that is already off, online → recorded and removed at once",
            host: host_off_offline().online(true).annotate(SUFFIXLESS, ""),
            removes: &[SUFFIXLESS],
            events: &[ev::REBOOT_REQUESTED, ev::REBOOT_ANNOTATION_REMOVED],
            no_events: &[ev::POWER_OFF, ev::POWER_ON],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "suffixless on an off host with online: false → recorded, kept, host stays off; \
                   read again within a second (readings count only after the request)",
            host: host_off_offline().annotate(SUFFIXLESS, ""),
            events: &[ev::REBOOT_REQUESTED],
            no_events: &[ev::REBOOT_ANNOTATION_REMOVED, ev::POWER_ON],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "soft off in flight, host still on → wait, do not ask again",
            host: host_on()
                .annotate(SUFFIXLESS, "")
                .with_status(soft_off_in_flight(-5_000)),
            no_events: &[ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "soft off in flight + hard request → escalate to hard at once",
            host: host_on()
                .annotate(SUFFIXLESS, "")
                .annotate(KEY_A, HARD)
                .with_status(soft_off_in_flight(-5_000)),
            power: off(PowerOffMode::Hard),
            events: &[ev::POWER_OFF_ESCALATED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "soft off in flight + hard request while transitioning → escalate",
            host: host_on()
                .annotate(KEY_A, HARD)
                .bmc(ObservedPower::Transitioning)
                .with_status(soft_off_in_flight(-5_000)),
            power: off(PowerOffMode::Hard),
            events: &[ev::POWER_OFF_ESCALATED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "hard off in flight + soft request → wait",
            host: host_on().annotate(KEY_A, "").with_status(|st| {
                st.provisioning.pending_reboot_since = Some(t(-5_000));
                st.last_power_action = Some(requested(
                    PowerTarget::Off,
                    Some(PowerOffMode::Hard),
                    PowerActionTrigger::RebootRequested,
                    t(-5_000),
                ));
            }),
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "soft off in flight just under the soft timeout → still wait",
            host: host_on()
                .annotate(KEY_A, "")
                .with_status(soft_off_in_flight(-179_999)),
            no_events: &[ev::POWER_OFF, ev::SOFT_POWER_OFF_FALLBACK],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "soft off, host still on after the soft timeout → hard, fallback reported",
            host: host_on()
                .annotate(KEY_A, "")
                .with_status(soft_off_in_flight(-180_000)),
            power: off(PowerOffMode::Hard),
            events: &[ev::SOFT_POWER_OFF_FALLBACK],
            no_events: &[ev::POWER_ACTION_TIMED_OUT],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "hard off in flight timed out → requested again, reported",
            host: host_on().annotate(KEY_A, HARD).with_status(|st| {
                st.provisioning.pending_reboot_since = Some(t(-300_000));
                st.last_power_action = Some(requested(
                    PowerTarget::Off,
                    Some(PowerOffMode::Hard),
                    PowerActionTrigger::RebootRequested,
                    t(-300_000),
                ));
            }),
            power: off(PowerOffMode::Hard),
            events: &[ev::POWER_ACTION_TIMED_OUT, ev::POWER_OFF],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "transitioning, nothing in flight → look again soon, no power call",
            host: host_on()
                .annotate(KEY_A, "")
                .bmc(ObservedPower::Transitioning),
            events: &[ev::REBOOT_REQUESTED],
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "unknown power state → no power call, slower re-check",
            host: host_on().online(false).bmc(ObservedPower::Unknown),
            requeue: Some(Duration::from_secs(10)),
            ..Default::default()
        },
        Case {
            name: "BMC unreachable → error, backoff, no power call",
            host: host_on().annotate(SUFFIXLESS, "").with_status(|st| {
                st.provisioning.pending_reboot_since = None;
            }),
            events: &[ev::BMC_ERROR],
            no_events: &[ev::REBOOT_REQUESTED],
            requeue: Some(Duration::from_secs(5)),
            ..Default::default()
        }
        .with_bmc(BmcObservation::Failed(BmcFailure {
            kind: BmcFailureKind::Unreachable,
            message: "connection refused".into(),
        })),
        Case {
            name: "BMC error backoff grows with the error count",
            host: host_on().with_status(|st| st.error_count = 3),
            events: &[ev::BMC_ERROR],
            requeue: Some(Duration::from_secs(40)),
            ..Default::default()
        }
        .with_bmc(BmcObservation::Failed(BmcFailure {
            kind: BmcFailureKind::Other,
            message: "HTTP 500".into(),
        })),
        Case {
            name: "BMC error backoff is capped",
            host: host_on().with_status(|st| st.error_count = 40),
            events: &[ev::BMC_ERROR],
            requeue: Some(Duration::from_secs(300)),
            ..Default::default()
        }
        .with_bmc(BmcObservation::Failed(BmcFailure {
            kind: BmcFailureKind::Credentials,
            message: "401".into(),
        })),
        Case {
            name: "BMC answers again → error cleared, reported",
            host: host_on().with_status(|st| {
                st.operational_status = Some(OperationalStatus::Error);
                st.error_type = Some(ErrorType::PowerManagementError);
                st.error_message = "connection refused".into();
                st.error_count = 4;
            }),
            events: &[ev::BMC_RECOVERED],
            ..Default::default()
        },
        Case {
            name: "consumer removed → every reboot annotation removed, one event each",
            host: host_on()
                .annotate(SUFFIXLESS, "")
                .annotate(KEY_A, "")
                .annotate(KEY_B, HARD)
                .with_status(soft_off_in_flight(-5_000))
                .without_consumer(),
            removes: &[SUFFIXLESS, KEY_A, KEY_B],
            events: &[
                ev::REBOOT_ANNOTATION_REMOVED,
                ev::REBOOT_ANNOTATION_REMOVED,
                ev::REBOOT_ANNOTATION_REMOVED,
            ],
            // The pending reboot still needs its "off", which is in flight: wait for it.
            requeue: FAST,
            ..Default::default()
        },
        Case {
            name: "no BMC address → discovered, no power management",
            host: host_on().online(false).annotate(KEY_A, "").without_bmc(),
            ..Default::default()
        },
    ]
}

impl Case {
    fn with_bmc(mut self, bmc: BmcObservation) -> Self {
        self.host.snapshot.bmc = bmc;
        self
    }
}

trait HostExt {
    fn without_consumer(self) -> Self;
    fn without_bmc(self) -> Self;
}

impl HostExt for Host {
    fn without_consumer(mut self) -> Self {
        self.snapshot.has_consumer = false;
        self
    }
    fn without_bmc(mut self) -> Self {
        self.snapshot.bmc_configured = false;
        self.snapshot.bmc = BmcObservation::NotQueried;
        self
    }
}

#[test]
fn decision_table() {
    for case in cases() {
        let d = decide(&case.host.snapshot, t(case.now_ms));
        let power: Vec<Action> = effects(&d)
            .into_iter()
            .filter(|a| matches!(a, Action::PowerOff { .. } | Action::PowerOn))
            .collect();
        assert_eq!(
            power,
            case.power.clone().into_iter().collect::<Vec<_>>(),
            "{}: power\n{d:#?}",
            case.name
        );
        assert_eq!(
            d.removed_annotations(),
            case.removes,
            "{}: removals",
            case.name
        );
        let reasons = d.event_reasons();
        let mut rest = reasons.iter();
        for expected in case.events {
            assert!(
                rest.any(|r| r == expected),
                "{}: expected event {expected} in order, got {reasons:?}",
                case.name
            );
        }
        for unexpected in case.no_events {
            assert!(
                !reasons.contains(unexpected),
                "{}: unexpected event {unexpected} in {reasons:?}",
                case.name
            );
        }
        assert_eq!(d.requeue_after, case.requeue, "{}: requeue", case.name);
        if case.power.is_some() {
            // Write-ahead: every power call comes with its record.
            let record = recorded_request(&d).expect("power call without a write-ahead record");
            assert_eq!(record.state, PowerActionState::Requested, "{}", case.name);
            assert_eq!(record.last_attempt_at, t(case.now_ms), "{}", case.name);
        }
    }
}

#[test]
fn paused_decision_is_empty() {
    let h = host_on()
        .annotate("baremetalhost.metal3.io/paused", "true")
        .bmc(ObservedPower::Off)
        .online(false);
    let d = decide(&h.snapshot, t(0));
    assert!(d.is_noop());
    assert_eq!(d.requeue_after, None);
}

#[test]
fn detached_sets_operational_status_and_drops_reading_evidence() {
    let h = host_on()
        .annotate("baremetalhost.metal3.io/detached", "")
        .online(false);
    let d = decide(&h.snapshot, t(0));
    // No BMC is read while detached: the last readings are not left standing as evidence.
    assert_eq!(
        d.status,
        vec![
            StatusUpdate::SetOperationalStatus(OperationalStatus::Detached),
            StatusUpdate::ClearPowerObservation
        ]
    );
    assert!(d.actions.is_empty());
}

#[test]
fn unmanaged_host_is_discovered() {
    let mut h = host_on().without_bmc().without_consumer();
    h.snapshot.status.provisioning.state = None;
    let d = decide(&h.snapshot, t(0));
    assert!(d.status.contains(&StatusUpdate::SetOperationalStatus(
        OperationalStatus::Discovered
    )));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Unmanaged
    )));
    assert_eq!(d.power_action(), None);
}

#[test]
fn bmc_errors_set_metal3_error_types() {
    let cases = [
        (
            BmcFailureKind::Credentials,
            true,
            ErrorType::ProvisionedRegistrationError,
        ),
        (
            BmcFailureKind::Credentials,
            false,
            ErrorType::RegistrationError,
        ),
        (
            BmcFailureKind::Unreachable,
            true,
            ErrorType::PowerManagementError,
        ),
        (
            BmcFailureKind::Other,
            false,
            ErrorType::PowerManagementError,
        ),
    ];
    for (kind, provisioned, expected) in cases {
        let mut h = host_on().with_status(|st| st.error_count = 1);
        h.snapshot.has_consumer = provisioned;
        if !provisioned {
            h.snapshot.status.provisioning.state = Some(ProvisioningState::Available);
        }
        h.snapshot.bmc = BmcObservation::Failed(BmcFailure {
            kind,
            message: "boom".into(),
        });
        let d = decide(&h.snapshot, t(0));
        assert!(
            d.status.contains(&StatusUpdate::SetError {
                error_type: expected,
                message: "boom".into(),
                count: 2
            }),
            "{kind:?}/{provisioned}: {d:#?}"
        );
        assert!(d.status.contains(&StatusUpdate::SetOperationalStatus(
            OperationalStatus::Error
        )));
        assert_eq!(d.requeue_after, Some(Duration::from_secs(10)));
    }
}

#[test]
fn new_host_registers_on_first_good_answer() {
    let mut h = host_on().without_consumer();
    h.snapshot.status = Default::default();
    let creds = hostcycle_api::CredentialsStatus {
        credentials: Some(k8s_openapi::api::core::v1::SecretReference {
            name: Some("bmc".into()),
            namespace: Some("ns".into()),
        }),
        credentials_version: Some("7".into()),
    };
    h.snapshot.credentials = Some(creds.clone());

    // Credentials rejected: registering, registration error.
    h.snapshot.bmc = BmcObservation::Failed(BmcFailure {
        kind: BmcFailureKind::Credentials,
        message: "401".into(),
    });
    let d = h.step(t(0));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Registering
    )));
    assert_eq!(
        h.snapshot.status.error_type,
        Some(ErrorType::RegistrationError)
    );

    // Fixed: available, goodCredentials recorded, error cleared.
    h.snapshot.bmc = BmcObservation::Power(ObservedPower::On);
    let d = h.step(t(10_000));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Available
    )));
    assert_eq!(h.snapshot.status.good_credentials, Some(creds));
    assert_eq!(h.snapshot.status.error_type, None);
    assert_eq!(h.snapshot.status.error_count, 0);
    assert_eq!(
        h.snapshot.status.operational_status,
        Some(OperationalStatus::Ok)
    );
}

/// Event notes carry no counter and no time: the same failure on every retry, or the same
/// timed-out power request, gives the same note, so the publisher folds the repeats into one
/// Event series instead of one Event per failed reconcile.
#[test]
fn repeated_failures_give_identical_event_notes() {
    let notes = |d: &hostcycle_core::bmh::Decision| -> Vec<String> {
        d.events().map(|e| e.message.clone()).collect()
    };
    let failing = |count: u32| {
        let mut h = host_on().with_status(|st| st.error_count = count);
        h.snapshot.bmc = BmcObservation::Failed(BmcFailure {
            kind: BmcFailureKind::Unreachable,
            message: "connection refused".into(),
        });
        notes(&decide(&h.snapshot, t(i64::from(count) * 1000)))
    };
    let first = failing(1);
    assert!(!first.is_empty());
    for count in [2, 3, 17] {
        assert_eq!(failing(count), first, "error count {count}");
    }
    for note in &first {
        assert!(
            !note.contains("error 2") && !note.contains("(error"),
            "{note}"
        );
    }

    // A power-off retried after it timed out: same notes on the 2nd and the 5th attempt,
    // and no timestamp (the status message keeps them).
    let timed_out = |attempts: u32| {
        let mut h = host_on().online(false);
        let first = h.step(t(0));
        assert!(recorded_request(&first).is_some());
        let at = t(10_000_000);
        h.snapshot
            .status
            .last_power_action
            .as_mut()
            .unwrap()
            .attempts = attempts;
        notes(&h.step(at))
    };
    let second = timed_out(1);
    assert!(!second.is_empty());
    assert_eq!(timed_out(4), second);
    for note in &second {
        assert!(
            !note.contains("attempt")
                && !note.contains("requested at")
                && !note.contains(&t(0).to_string()),
            "{note}"
        );
    }
}
