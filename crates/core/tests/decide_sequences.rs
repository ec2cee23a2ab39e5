//! Multi-step rules: each test walks a host through a sequence of snapshots, applying every
//! decision as the operator would, and checks each step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hostcycle_api::reasons::{condition as cond, condition_reason, event_reason as ev};
use hostcycle_api::{
    BareMetalHostStatus, ErrorType, HardFallbackSource, OperationalStatus, PowerActionState,
    PowerActionTrigger, PowerOffMode, PowerTarget, ProvisioningState,
};
use hostcycle_core::bmh::{
    Action, AnnotationRemovalReason, BmcFailure, BmcFailureKind, DecideConfig, ObservedPower,
    PowerCallResult, StatusUpdate, after_power_call, decide,
};

const SUFFIXLESS: &str = "reboot.metal3.io";
const KEY_A: &str = "reboot.metal3.io/a";
const KEY_B: &str = "reboot.metal3.io/b";
const HARD: &str = r#"{"mode":"hard"}"#;

#[test]
fn soft_reboot_lifecycle_step_by_step() {
    let mut h = host_on().annotate(SUFFIXLESS, "");
    let before = h.last_powered_on().unwrap();

    // 1. Noticed: pendingRebootSince = now, soft power-off requested (write-ahead record first).
    let d = h.step(t(0));
    assert_eq!(
        status_changes(&d),
        vec![
            StatusUpdate::SetPendingRebootSince(t(0)),
            StatusUpdate::RecordPowerRequest(requested(
                PowerTarget::Off,
                Some(PowerOffMode::Soft),
                PowerActionTrigger::RebootRequested,
                t(0)
            )),
        ]
    );
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    assert_eq!(d.event_reasons(), vec![ev::REBOOT_REQUESTED, ev::POWER_OFF]);
    assert_eq!(
        condition(&h, cond::REBOOT_PENDING),
        Some(("True", condition_reason::AWAITING_POWER_OFF))
    );

    // 2. Still shutting down: nothing new, look again soon.
    let d = h.step(t(1_000));
    assert!(d.actions.is_empty(), "{d:#?}");
    assert_eq!(d.requeue_after, FAST);
    let d = h.clone().bmc(ObservedPower::Transitioning).step(t(2_000));
    assert!(d.actions.is_empty());

    // 3. Off: action completed, suffixless removed, but no power-on from this snapshot.
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(9_000));
    assert!(d.status.contains(&StatusUpdate::SetPoweredOn(false)));
    assert!(
        d.status
            .contains(&StatusUpdate::CompletePowerAction { at: t(9_000) })
    );
    assert_eq!(
        effects(&d),
        vec![Action::RemoveAnnotations {
            keys: vec![SUFFIXLESS.into()],
            reason: AnnotationRemovalReason::RebootPoweredOff
        }]
    );
    assert!(h.annotations.is_empty());

    // 4. No annotation left: power on; requested after pendingRebootSince.
    let d = h.step(t(9_500));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    let on = recorded_request(&d).unwrap();
    assert_eq!(on.requested_at, t(9_500));
    assert_eq!(on.trigger, PowerActionTrigger::SpecOnline);
    assert_eq!(
        h.last_powered_on(),
        Some(before),
        "not yet: power-on not confirmed"
    );
    assert_eq!(
        condition(&h, cond::REBOOT_PENDING),
        Some(("True", condition_reason::AWAITING_POWER_ON))
    );

    // 5. BMC still says off (power-on takes seconds): wait, no second power-on.
    let d = h.step(t(10_500));
    assert!(d.actions.is_empty(), "{d:#?}");

    // 6. On: lastPoweredOn = the power-on's request time, reboot complete.
    h = h.bmc(ObservedPower::On);
    let d = h.step(t(20_000));
    assert!(d.status.contains(&StatusUpdate::SetLastPoweredOn(t(9_500))));
    assert_eq!(d.event_reasons(), vec![ev::REBOOT_COMPLETED]);
    assert!(h.last_powered_on().unwrap() > h.pending().unwrap());
    assert_eq!(
        condition(&h, cond::REBOOT_PENDING),
        Some(("False", condition_reason::NO_REBOOT_PENDING))
    );
    assert_eq!(h.last_action().unwrap().state, PowerActionState::Completed);

    // 7. A second reading confirms the On run (read within a second), then steady.
    h.step(t(21_000));
    let d = h.step(t(80_000));
    assert!(d.is_noop(), "{d:#?}");
    assert_eq!(d.requeue_after, SLOW);
}

#[test]
fn hard_reboot_goes_straight_to_hard() {
    let mut h = host_on().annotate(SUFFIXLESS, HARD);
    let d = h.step(t(0));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Hard
        }]
    );
    assert_eq!(h.last_action().unwrap().mode, Some(PowerOffMode::Hard));
    h = h.bmc(ObservedPower::Off);
    h.step(t(1_000));
    let d = h.step(t(1_100));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
}

/// Two keyed clients release in either order; the host is powered on only after both.
#[test]
fn two_keyed_clients_release_in_either_order() {
    for (first, second) in [(KEY_A, KEY_B), (KEY_B, KEY_A)] {
        let mut h = host_on().annotate(KEY_A, "").annotate(KEY_B, HARD);
        let d = h.step(t(0));
        assert_eq!(
            effects(&d),
            vec![Action::PowerOff {
                mode: PowerOffMode::Hard
            }]
        );
        h = h.bmc(ObservedPower::Off);

        // Off and held: nothing removed by the controller, no power-on; read again within a
        // second to confirm the first Off reading, then slow requeue.
        let d = h.step(t(5_000));
        assert_eq!(effects(&d), vec![]);
        assert_eq!(d.requeue_after, FAST);
        let d = h.step(t(6_000));
        assert_eq!(effects(&d), vec![]);
        assert!(
            h.snapshot
                .status
                .power_observation
                .as_ref()
                .is_some_and(|o| o.confirmed()),
            "two Off readings a second apart confirm the run"
        );
        assert_eq!(d.requeue_after, SLOW);
        assert_eq!(
            condition(&h, cond::REBOOT_PENDING),
            Some(("True", condition_reason::HELD_BY_ANNOTATIONS))
        );
        assert!(
            h.step(t(600_000)).actions.is_empty(),
            "held however long it takes"
        );

        h = h.unannotate(first);
        let d = h.step(t(700_000));
        assert_eq!(d.power_action(), None, "{second} still holds the host off");

        h = h.unannotate(second);
        let d = h.step(t(800_000));
        assert_eq!(
            effects(&d),
            vec![Action::PowerOn],
            "order {first} then {second}"
        );
        h = h.bmc(ObservedPower::On);
        h.step(t(805_000));
        assert_eq!(h.last_powered_on(), Some(t(800_000)));
        assert!(h.last_powered_on() > h.pending());
    }
}

#[test]
fn suffixless_and_keyed_together_hold_until_the_keyed_one_goes() {
    let mut h = host_on().annotate(SUFFIXLESS, "").annotate(KEY_A, "");
    h.step(t(0));
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(3_000));
    assert_eq!(
        d.removed_annotations(),
        vec![SUFFIXLESS],
        "the suffixless one goes once off"
    );
    assert_eq!(d.power_action(), None);
    let d = h.step(t(4_000));
    assert!(
        effects(&d).is_empty(),
        "keyed form takes priority: still held"
    );
    h = h.unannotate(KEY_A);
    let d = h.step(t(60_000));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
}

#[test]
fn keyed_annotation_on_an_already_off_host_keeps_it_off_then_completes() {
    let mut h = host_off_offline().online(true).annotate(KEY_A, "");
    let d = h.step(t(0));
    assert!(
        d.status
            .contains(&StatusUpdate::SetPendingRebootSince(t(0)))
    );
    assert_eq!(
        d.power_action(),
        None,
        "already off: no power-off, never a power-on"
    );
    for i in 1..5 {
        assert_eq!(h.step(t(i * 10_000)).power_action(), None);
    }
    h = h.unannotate(KEY_A);
    let d = h.step(t(100_000));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    h = h.bmc(ObservedPower::On);
    h.step(t(103_000));
    assert!(h.last_powered_on().unwrap() > h.pending().unwrap());
}

#[test]
fn suffixless_on_an_already_off_host_powers_it_on_once() {
    let mut h = host_off_offline().online(true).annotate(SUFFIXLESS, "");
    let d = h.step(t(0));
    assert_eq!(d.removed_annotations(), vec![SUFFIXLESS]);
    assert_eq!(d.power_action(), None);
    let d = h.step(t(500));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    h = h.bmc(ObservedPower::On);
    h.step(t(4_000));
    assert!(h.last_powered_on().unwrap() > h.pending().unwrap());
    assert!(h.step(t(5_000)).actions.is_empty());
}

#[test]
fn offline_host_with_a_pending_reboot_stays_off() {
    // Suffixless: removal needs online: true, so the annotation stays while offline.
    let mut h = host_on().online(false).annotate(SUFFIXLESS, HARD);
    let d = h.step(t(0));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Hard
        }],
        "reboot mode wins over offline soft"
    );
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(5_000));
    assert!(d.removed_annotations().is_empty());
    assert_eq!(d.power_action(), None);
    assert!(h.step(t(100_000)).actions.is_empty());

    // Back online: the suffixless request completes with a power-on.
    h = h.online(true);
    let d = h.step(t(200_000));
    assert_eq!(d.removed_annotations(), vec![SUFFIXLESS]);
    let d = h.step(t(200_100));
    assert_eq!(effects(&d), vec![Action::PowerOn]);

    // Keyed: released by its owner while offline → host stays off, reboot still pending.
    let mut h = host_on().online(false).annotate(KEY_A, "");
    h.step(t(0));
    h = h.bmc(ObservedPower::Off).unannotate(KEY_A);
    let d = h.step(t(5_000));
    assert_eq!(d.power_action(), None);
    assert!(h.pending() > h.last_powered_on());
    assert_eq!(
        condition(&h, cond::REBOOT_PENDING),
        Some(("True", condition_reason::OFFLINE))
    );
    h = h.online(true);
    let d = h.step(t(9_000));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
}

#[test]
fn malformed_value_warns_and_reboots_soft() {
    let mut h = host_on().annotate(KEY_A, "5f1a0b7c-uid-not-json");
    let d = h.step(t(0));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    let warnings: Vec<_> = d
        .events()
        .filter(|e| e.reason == ev::INVALID_REBOOT_ANNOTATION)
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per annotation per decision");
    assert!(warnings[0].message.contains(KEY_A));
    // Value preserved: the controller never rewrites it.
    assert_eq!(h.annotations[KEY_A], "5f1a0b7c-uid-not-json");
}

#[test]
fn leaving_provisioned_clears_annotations_then_finishes_the_reboot() {
    let mut h = host_on().annotate(KEY_A, "").annotate(SUFFIXLESS, "");
    h.step(t(0));
    h = h.bmc(ObservedPower::Off);
    h.step(t(5_000)); // suffixless removed, KEY_A holds
    assert_eq!(h.annotations.len(), 1);

    h.snapshot.has_consumer = false;
    let d = h.step(t(10_000));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Deprovisioning
    )));
    assert_eq!(
        effects(&d),
        vec![Action::RemoveAnnotations {
            keys: vec![KEY_A.into()],
            reason: AnnotationRemovalReason::HostDeprovisioned
        }]
    );
    let removed: Vec<_> = d
        .events()
        .filter(|e| e.reason == ev::REBOOT_ANNOTATION_REMOVED)
        .collect();
    assert_eq!(removed.len(), 1);
    assert!(removed[0].message.contains(KEY_A));

    // Next: available; the pending reboot ends with a power-on (online: true).
    let d = h.step(t(11_000));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Available
    )));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
}

#[test]
fn annotation_added_during_deprovisioning_is_removed_too() {
    let mut h = host_on();
    h.snapshot.has_consumer = false;
    // Deprovisioning powers the host off first (as metal3 does), whatever spec.online says.
    let d = h.step(t(0));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Deprovisioning)
    );
    assert_eq!(d.power_action(), Some(PowerTarget::Off), "{d:#?}");
    h = h.annotate(KEY_B, "");
    let d = h.step(t(100));
    assert_eq!(d.removed_annotations(), vec![KEY_B]);
    assert_eq!(d.power_action(), None, "the power-off is under way");
    // Available only once two Off readings a second apart confirm the host off.
    h = h.bmc(ObservedPower::Off);
    h.step(t(200));
    h.step(t(1_300));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Deprovisioning),
        "not available before the readings confirm the host off"
    );
    let d = h.step(t(1_400));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Available)
    );
    // Available: spec.online (true) decides again, in the same pass.
    assert_eq!(d.power_action(), Some(PowerTarget::On), "{d:#?}");
}

/// The operator restarts mid-reboot: the snapshot is rebuilt from the object (status and
/// annotations) only. No second power-off is sent.
#[test]
fn restart_mid_reboot_does_not_repeat_the_power_off() {
    let mut original = host_on().annotate(KEY_A, "");
    let d = original.step(t(0));
    assert_eq!(d.power_action(), Some(PowerTarget::Off));

    // "New process": only what was persisted survives.
    let persisted: BareMetalHostStatus = original.snapshot.status.clone();
    let mut restarted = host_on().annotate(KEY_A, "");
    restarted.snapshot.status = persisted;

    // BMC still on (ACPI shutdown under way): wait.
    for ms in [2_000, 3_000, 30_000, 170_000] {
        let d = restarted.step(t(ms));
        assert_eq!(d.power_action(), None, "at {ms} ms: {d:#?}");
        assert_eq!(d.requeue_after, FAST);
    }
    // BMC off: completed, still no power action (held by KEY_A).
    restarted = restarted.bmc(ObservedPower::Off);
    let d = restarted.step(t(175_000));
    assert_eq!(d.power_action(), None);
    assert_eq!(
        restarted.last_action().unwrap().state,
        PowerActionState::Completed
    );
}

/// Crash after the write-ahead record but before the BMC call: the request is lost; it is
/// sent again only after the in-flight timeout, keeping the chain's first request time.
#[test]
fn lost_request_is_retried_after_the_timeout() {
    let cfg = DecideConfig::default();
    let mut h = host_on().annotate(KEY_A, r#"{"mode":"hard"}"#);
    h.step(t(0)); // recorded; pretend the call never happened
    let timeout_ms = cfg.power_action_timeout.as_millis() as i64;
    assert_eq!(h.step(t(timeout_ms - 1)).power_action(), None);
    let d = h.step(t(timeout_ms));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Hard
        }]
    );
    assert!(d.event_reasons().contains(&ev::POWER_ACTION_TIMED_OUT));
    let record = h.last_action().unwrap();
    assert_eq!(
        (record.attempts, record.requested_at, record.last_attempt_at),
        (2, t(0), t(timeout_ms))
    );
    assert_eq!(
        h.snapshot.status.error_type,
        Some(ErrorType::PowerManagementError)
    );
    assert_eq!(
        h.snapshot.status.operational_status,
        Some(OperationalStatus::Error)
    );

    // The error stays until the change is seen, then clears.
    assert_eq!(h.step(t(timeout_ms + 1_000)).power_action(), None);
    assert_eq!(h.snapshot.status.error_count, 1);
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(timeout_ms + 5_000));
    assert!(d.status.contains(&StatusUpdate::ClearError));
    assert_eq!(
        h.snapshot.status.operational_status,
        Some(OperationalStatus::Ok)
    );
}

#[test]
fn failed_power_call_is_retried_with_backoff() {
    let cfg = DecideConfig::default();
    let mut h = host_on().online(false);
    h.step(t(0));
    let result = PowerCallResult::Failed(BmcFailure {
        kind: BmcFailureKind::Unreachable,
        message: "connection reset".into(),
    });
    let d = after_power_call(&h.snapshot.status, &result, t(100), &cfg);
    assert!(d.event_reasons().contains(&ev::BMC_ERROR));
    assert_eq!(d.requeue_after, Some(std::time::Duration::from_secs(5)));
    h.apply(&d, t(100));
    assert_eq!(h.last_action().unwrap().state, PowerActionState::Failed);
    assert_eq!(h.snapshot.status.error_count, 1);
    assert_eq!(
        condition(&h, cond::BMC_HEALTHY),
        Some(("False", condition_reason::POWER_ACTION_FAILED))
    );

    // Before the backoff: no retry, and the error (with its count) is kept.
    let d = h.step(t(2_000));
    assert_eq!(d.power_action(), None);
    assert_eq!(d.requeue_after, Some(std::time::Duration::from_secs(3)));
    assert_eq!(h.snapshot.status.error_count, 1);
    // After: retried, attempt 2.
    let d = h.step(t(5_000));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    assert_eq!(h.last_action().unwrap().attempts, 2);
    // Fails again: backoff doubles.
    let d = after_power_call(&h.snapshot.status, &result, t(5_100), &cfg);
    assert_eq!(d.requeue_after, Some(std::time::Duration::from_secs(10)));
    h.apply(&d, t(5_100));
    assert_eq!(h.step(t(14_000)).power_action(), None);
    assert_eq!(h.step(t(15_000)).power_action(), Some(PowerTarget::Off));
    // Works: host off, error cleared.
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(20_000));
    assert!(d.status.contains(&StatusUpdate::ClearError));
    assert_eq!(h.snapshot.status.error_count, 0);
}

#[test]
fn soft_off_fallback_and_escalation_are_recorded() {
    let cfg = DecideConfig::default();
    let mut h = host_on().annotate(KEY_A, "");
    h.step(t(0));
    let d = after_power_call(
        &h.snapshot.status,
        &PowerCallResult::Accepted {
            hard_fallback: Some("no ACPI shutdown within 60s".into()),
        },
        t(61_000),
        &cfg,
    );
    assert_eq!(d.event_reasons(), vec![ev::SOFT_POWER_OFF_FALLBACK]);
    h.apply(&d, t(61_000));
    let fallback = h.last_action().unwrap().hard_fallback.clone().unwrap();
    assert_eq!(fallback.by, HardFallbackSource::Bmc);

    // Escalation: soft in flight, hard request arrives.
    let mut h = host_on().annotate(KEY_A, "");
    h.step(t(0));
    h = h.annotate(KEY_B, HARD);
    let d = h.step(t(2_000));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Hard
        }]
    );
    let record = h.last_action().unwrap();
    assert_eq!(record.mode, Some(PowerOffMode::Hard));
    assert_eq!(record.requested_at, t(0));
    assert_eq!(
        record.hard_fallback.as_ref().unwrap().by,
        HardFallbackSource::Escalation
    );
    assert!(
        record
            .hard_fallback
            .as_ref()
            .unwrap()
            .reason
            .contains(KEY_B)
    );
    // And not again.
    assert_eq!(h.step(t(3_000)).power_action(), None);
}

/// pendingRebootSince and lastPoweredOn in the same second: ordering is by the fraction.
#[test]
fn same_second_timestamps_are_ordered_by_fraction() {
    // Powered on at .100; a request noticed at .200 of the same second is a new reboot.
    let mut h = host_on().with_status(|st| st.provisioning.last_powered_on = Some(t(100)));
    h = h.annotate(SUFFIXLESS, "");
    let d = h.step(t(200));
    assert!(
        d.status
            .contains(&StatusUpdate::SetPendingRebootSince(t(200)))
    );
    assert_eq!(d.power_action(), Some(PowerTarget::Off));
    let json = serde_json::to_value(&h.snapshot.status).unwrap();
    assert_eq!(
        json["provisioning"]["lastPoweredOn"],
        "2025-01-01T00:00:00.1Z"
    );
    assert_eq!(
        json["provisioning"]["pendingRebootSince"],
        "2025-01-01T00:00:00.2Z"
    );

    // Controller clock behind lastPoweredOn (step, or another replica): still strictly later.
    let mut h = host_on().with_status(|st| st.provisioning.last_powered_on = Some(t(500)));
    h = h.annotate(SUFFIXLESS, "");
    h.step(t(400));
    let pending = h.pending().unwrap();
    assert!(pending > t(500));
    assert_eq!(pending.as_nanosecond() - t(500).as_nanosecond(), 1);

    // The power-on that completes it is likewise strictly later than pendingRebootSince.
    h = h.bmc(ObservedPower::Off);
    h.step(t(450));
    let d = h.step(t(460));
    let on = recorded_request(&d).unwrap();
    assert!(
        on.requested_at > pending,
        "{} > {}",
        on.requested_at,
        pending
    );
    h = h.bmc(ObservedPower::On);
    h.step(t(470));
    assert!(h.last_powered_on() > h.pending());
}

/// A reboot requested while a power-on is under way is not swallowed by it.
#[test]
fn request_during_power_on_gets_its_own_cycle() {
    let mut h = host_off_offline().online(true);
    let d = h.step(t(0));
    assert_eq!(d.power_action(), Some(PowerTarget::On));
    // Annotation noticed while the BMC still says off.
    h = h.annotate(KEY_A, "");
    let d = h.step(t(1_000));
    assert!(
        d.status
            .contains(&StatusUpdate::SetPendingRebootSince(t(1_000)))
    );
    assert_eq!(d.power_action(), None);
    // The power-on lands anyway: lastPoweredOn = t(0) < pendingRebootSince → power off again.
    h = h.bmc(ObservedPower::On);
    let d = h.step(t(3_000));
    assert!(d.status.contains(&StatusUpdate::SetLastPoweredOn(t(0))));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    assert!(h.pending() > h.last_powered_on());
}

/// A client that removes its annotation before the host went off does not skip the "off".
#[test]
fn early_release_still_goes_through_off() {
    let mut h = host_on().annotate(KEY_A, "");
    h.step(t(0));
    h = h.unannotate(KEY_A);
    let d = h.step(t(1_000));
    assert_eq!(
        d.power_action(),
        None,
        "off in flight: neither re-sent nor reversed"
    );
    assert!(h.pending() > h.last_powered_on());
    h = h.bmc(ObservedPower::Off);
    // Off observed and no annotation left: the reboot completes with a power-on.
    let d = h.step(t(5_000));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    assert!(recorded_request(&d).unwrap().requested_at > h.pending().unwrap());
}

/// Someone powers the host on while it is held for a keyed reboot: put back off, reported,
/// and lastPoweredOn untouched (we did not power it on).
#[test]
fn power_on_behind_our_back_during_hold_is_corrected() {
    let mut h = host_on().annotate(KEY_A, "");
    h.step(t(0));
    h = h.bmc(ObservedPower::Off);
    h.step(t(5_000));
    let lpo = h.last_powered_on();
    h = h.bmc(ObservedPower::On);
    let d = h.step(t(60_000));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    assert!(d.event_reasons().contains(&ev::POWER_STATE_CORRECTED));
    assert_eq!(h.last_powered_on(), lpo);
}

#[test]
fn status_written_by_decide_round_trips_through_json() {
    let mut h = host_on().annotate(KEY_A, HARD);
    h.step(t(123));
    let json = serde_json::to_string(&h.snapshot.status).unwrap();
    let back: BareMetalHostStatus = serde_json::from_str(&json).unwrap();
    assert_eq!(back, h.snapshot.status);
    assert!(
        json.contains(r#""lastPowerAction":{"action":"off","mode":"hard""#),
        "{json}"
    );
    // Same decision from the deserialized status.
    let mut again = h.clone();
    again.snapshot.status = back;
    assert_eq!(decide(&again.snapshot, t(500)), decide(&h.snapshot, t(500)));
}

/// Soft first; a host that ignores the ACPI shutdown for the whole soft timeout is powered
/// off hard, once, and the path taken is recorded. Works across an operator restart because
/// the soft request's time is in status.
#[test]
fn soft_power_off_falls_back_to_hard_after_the_soft_timeout() {
    let cfg = DecideConfig::default();
    let soft_ms = cfg.soft_power_off_timeout.as_millis() as i64;
    let mut h = host_on().annotate(KEY_A, "");
    assert_eq!(
        effects(&h.step(t(0))),
        vec![Action::PowerOff {
            mode: PowerOffMode::Soft
        }]
    );
    // The host ignores it; nothing is sent again before the soft timeout.
    for ms in [1_000, 60_000, soft_ms - 1] {
        assert_eq!(h.step(t(ms)).power_action(), None, "at {ms} ms");
    }
    let d = h.step(t(soft_ms));
    assert_eq!(
        effects(&d),
        vec![Action::PowerOff {
            mode: PowerOffMode::Hard
        }]
    );
    assert!(d.event_reasons().contains(&ev::SOFT_POWER_OFF_FALLBACK));
    let record = h.last_action().unwrap();
    assert_eq!(record.mode, Some(PowerOffMode::Hard));
    assert_eq!(
        record.hard_fallback.as_ref().map(|f| f.by),
        Some(hostcycle_api::HardFallbackSource::SoftTimeout)
    );
    // The hard request is in flight: not sent again.
    assert_eq!(h.step(t(soft_ms + 1_000)).power_action(), None);
    h = h.bmc(ObservedPower::Off);
    assert_eq!(h.step(t(soft_ms + 2_000)).power_action(), None);
    assert_eq!(h.last_action().unwrap().state, PowerActionState::Completed);
}

/// A malformed annotation added while the host is already held off by a valid one is
/// reported once (when the set of requests changes), not on every poll, and not ignored.
#[test]
fn malformed_annotation_added_during_a_hold_is_reported_once() {
    let mut h = host_on().annotate(KEY_A, "");
    h.step(t(0)); // soft power-off requested
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(5_000)); // off, held by KEY_A
    assert!(!d.event_reasons().contains(&ev::INVALID_REBOOT_ANNOTATION));
    h = h.annotate(KEY_B, "not json");
    let d = h.step(t(6_000));
    let warnings: Vec<_> = d
        .events()
        .filter(|e| e.reason == ev::INVALID_REBOOT_ANNOTATION)
        .collect();
    assert_eq!(warnings.len(), 1, "warned once: {:?}", d.event_reasons());
    assert!(warnings[0].message.contains(KEY_B));
    assert_eq!(d.power_action(), None, "still held off");
    // Polling again with nothing changed: no repeat.
    let d = h.step(t(7_000));
    assert!(!d.event_reasons().contains(&ev::INVALID_REBOOT_ANNOTATION));
}
