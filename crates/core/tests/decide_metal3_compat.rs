//! Clients written for metal3's baremetal-operator (CAPM3, scripts, people) work unchanged:
//! annotation values as Go decodes them, CAPM3's remediation annotation, a hard request that
//! keeps its mode, `spec.disablePowerOff`, deprovisioning by removing `spec.image`, and the
//! status fields metal3 clients read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hostcycle_api::reasons::{condition as cond, condition_reason, event_reason as ev};
use hostcycle_api::{
    BareMetalHostStatus, PowerActionState, PowerActionTrigger, PowerOffMode, PowerTarget,
    ProvisioningState,
};
use hostcycle_core::bmh::{
    Action, AnnotationRemovalReason, BmcFailure, BmcFailureKind, Decision, EventType,
    ObservedPower, PowerCallResult, StatusUpdate, after_power_call, apply_status_updates, decide,
};
use serde_json::json;

const REMEDIATION: &str =
    "reboot.metal3.io/metal3-remediation-0f8c1d2e-9a7b-4c3d-8e1f-2a3b4c5d6e7f";
const CAPM3_VALUE: &str = r#"{"mode":"hard","force":false}"#;
const SUFFIXLESS: &str = "reboot.metal3.io";

fn warnings(d: &Decision) -> Vec<&str> {
    d.events()
        .filter(|e| e.type_ == EventType::Warning)
        .map(|e| e.reason)
        .collect()
}

fn power_off_mode(d: &Decision) -> Option<PowerOffMode> {
    d.actions.iter().find_map(|a| match a {
        Action::PowerOff { mode } => Some(*mode),
        _ => None,
    })
}

/// The mode of the power-off each value asks for, and never a Warning.
#[test]
fn values_metal3_clients_write_are_read_as_metal3_reads_them() {
    let cases = [
        (r#"{"Mode":"hard"}"#, PowerOffMode::Hard),
        (r#"{"MODE":"hard","Force":true}"#, PowerOffMode::Hard),
        (CAPM3_VALUE, PowerOffMode::Hard),
        (r#"{"mode":""}"#, PowerOffMode::Soft),
        ("null", PowerOffMode::Soft),
        (r#"{"mode":"","force":true}"#, PowerOffMode::Soft),
        (r#"{"mode":null}"#, PowerOffMode::Soft),
    ];
    for key in [SUFFIXLESS, REMEDIATION] {
        for (value, mode) in cases {
            let mut h = host_on().annotate(key, value);
            let d = h.step(t(0));
            assert_eq!(power_off_mode(&d), Some(mode), "{key}={value}: {d:#?}");
            assert_eq!(warnings(&d), Vec::<&str>::new(), "{key}={value}");
            // The whole hold (and its release) stays free of warnings too.
            h = h.bmc(ObservedPower::Off);
            let d = h.step(t(1_000));
            assert_eq!(warnings(&d), Vec::<&str>::new(), "{key}={value}");
        }
    }
}

/// CAPM3's remediation: the annotation exactly as CAPM3 writes it is a hard reboot that holds
/// the host off until CAPM3 removes it; added again after the cycle it is a second full cycle
/// with a new `pendingRebootSince`.
#[test]
fn capm3_remediation_annotation_cycles_twice() {
    let mut h = host_on();
    let mut previous_pending = None;
    for (round, start) in [(1, 0), (2, 100_000)] {
        h = h.annotate(REMEDIATION, CAPM3_VALUE);
        let d = h.step(t(start));
        assert_eq!(
            power_off_mode(&d),
            Some(PowerOffMode::Hard),
            "round {round}"
        );
        assert_eq!(warnings(&d), Vec::<&str>::new(), "round {round}");
        let pending = h.pending().unwrap();
        assert_eq!(pending, t(start), "round {round}: a new pendingRebootSince");
        assert!(previous_pending.is_none_or(|p| pending > p));
        previous_pending = Some(pending);

        // Off: held by CAPM3's annotation; nothing is powered on.
        h = h.bmc(ObservedPower::Off);
        let d = h.step(t(start + 2_000));
        assert_eq!(d.power_action(), None);
        assert!(
            d.removed_annotations().is_empty(),
            "keyed: CAPM3 removes it"
        );
        assert_eq!(
            condition(&h, cond::REBOOT_PENDING),
            Some(("True", condition_reason::HELD_BY_ANNOTATIONS))
        );

        // CAPM3 removes it: power on, then the reboot is complete.
        h = h.unannotate(REMEDIATION);
        let d = h.step(t(start + 5_000));
        assert_eq!(effects(&d), vec![Action::PowerOn]);
        h = h.bmc(ObservedPower::On);
        let d = h.step(t(start + 9_000));
        assert_eq!(d.event_reasons(), vec![ev::REBOOT_COMPLETED]);
        assert!(h.last_powered_on().unwrap() > pending);
        assert_eq!(warnings(&d), Vec::<&str>::new());
        h.assert_settled(t(start + 10_000));
    }
}

/// The hard request is noticed while the host is transitioning (no power decision yet) and its
/// annotation is gone before the power-off is sent: the power-off is still hard, because the
/// mode was written with `pendingRebootSince`, before any side effect.
#[test]
fn hard_mode_survives_removal_before_the_power_off() {
    let mut h = host_on()
        .annotate(REMEDIATION, CAPM3_VALUE)
        .bmc(ObservedPower::Transitioning);
    let d = h.step(t(0));
    assert_eq!(d.power_action(), None);
    assert_eq!(
        status_changes(&d)
            .into_iter()
            .filter(|u| matches!(
                u,
                StatusUpdate::SetPendingRebootSince(_) | StatusUpdate::MarkPendingRebootHard
            ))
            .collect::<Vec<_>>(),
        vec![
            StatusUpdate::SetPendingRebootSince(t(0)),
            StatusUpdate::MarkPendingRebootHard
        ]
    );
    assert_eq!(
        h.snapshot.status.provisioning.pending_reboot_mode,
        Some(PowerOffMode::Hard)
    );

    h = h.unannotate(REMEDIATION).bmc(ObservedPower::On);
    let d = h.step(t(1_000));
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Hard), "{d:#?}");
    assert_eq!(h.last_action().unwrap().mode, Some(PowerOffMode::Hard));
}

/// Same after a failed power call: the retry after the backoff is hard although the only hard
/// annotation was removed meanwhile (a soft one remains).
#[test]
fn hard_mode_survives_removal_across_a_failed_call() {
    let mut h = host_on()
        .annotate(REMEDIATION, CAPM3_VALUE)
        .annotate("reboot.metal3.io/other", "");
    let d = h.step(t(0));
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Hard));
    let failed = after_power_call(
        &h.snapshot.status,
        &PowerCallResult::Failed(BmcFailure {
            kind: BmcFailureKind::Unreachable,
            message: "connection refused".into(),
        }),
        t(100),
        &default_config(),
    );
    h.apply(&failed, t(100));
    assert_eq!(h.last_action().unwrap().state, PowerActionState::Failed);

    h = h.unannotate(REMEDIATION);
    let d = h.step(t(60_000));
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Hard), "{d:#?}");
}

/// A hard request added while a soft reboot is pending and then removed before anything was
/// sent still makes the power-off hard; the mark is reset by the next reboot.
#[test]
fn hard_request_joining_a_pending_reboot_is_kept_then_reset_by_the_next_one() {
    let mut h = host_on()
        .annotate("reboot.metal3.io/a", "")
        .bmc(ObservedPower::Transitioning);
    h.step(t(0));
    assert_eq!(h.snapshot.status.provisioning.pending_reboot_mode, None);
    h = h.annotate("reboot.metal3.io/b", r#"{"Mode":"hard"}"#);
    let d = h.step(t(500));
    assert!(d.status.contains(&StatusUpdate::MarkPendingRebootHard));
    h = h.unannotate("reboot.metal3.io/b").bmc(ObservedPower::On);
    let d = h.step(t(1_000));
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Hard));

    // Finish the cycle, then a soft request is soft again.
    h = h.bmc(ObservedPower::Off).unannotate("reboot.metal3.io/a");
    let d = h.step(t(2_000));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    h = h.bmc(ObservedPower::On);
    h.step(t(5_000));
    assert!(h.last_powered_on().unwrap() > h.pending().unwrap());
    h = h.annotate(SUFFIXLESS, "");
    let d = h.step(t(10_000));
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Soft));
    assert_eq!(h.snapshot.status.provisioning.pending_reboot_mode, None);
}

fn no_power_off(h: &Host) -> Host {
    let mut h = h.clone();
    h.snapshot.disable_power_off = true;
    h
}

fn restart_mode(d: &Decision) -> Option<PowerOffMode> {
    d.actions.iter().find_map(|a| match a {
        Action::Restart { mode } => Some(*mode),
        _ => None,
    })
}

/// `spec.disablePowerOff`: a reboot is one BMC restart in the request's mode, never a
/// power-off; the BMC accepting it completes the reboot.
#[test]
fn disable_power_off_turns_reboots_into_bmc_restarts() {
    for (value, mode) in [("", PowerOffMode::Soft), (CAPM3_VALUE, PowerOffMode::Hard)] {
        let mut h = no_power_off(&host_on()).annotate(SUFFIXLESS, value);
        let d = h.step(t(0));
        assert_eq!(power_off_mode(&d), None, "{d:#?}");
        assert_eq!(restart_mode(&d), Some(mode));
        // Write-ahead: the restart is recorded before it is sent, the suffixless annotation is
        // removed before the call.
        let recorded = recorded_request(&d).unwrap();
        assert!(recorded.restart);
        assert_eq!(recorded.action, PowerTarget::On);
        assert_eq!(recorded.mode, Some(mode));
        assert_eq!(recorded.trigger, PowerActionTrigger::RebootRequested);
        assert!(recorded.requested_at > h.pending().unwrap());
        assert_eq!(
            effects(&d),
            vec![
                Action::RemoveAnnotations {
                    keys: vec![SUFFIXLESS.into()],
                    reason: AnnotationRemovalReason::RebootRestarted
                },
                Action::Restart { mode }
            ]
        );
        assert_eq!(
            condition(&h, cond::REBOOT_PENDING),
            Some(("True", condition_reason::AWAITING_RESTART))
        );
        assert!(d.event_reasons().contains(&ev::POWER_RESTART));

        // Seen on before the BMC answered (or after a crash): not complete, not sent again.
        let d = h.step(t(100));
        assert_eq!(d.power_action(), None, "{d:#?}");
        assert!(h.last_powered_on().unwrap() < h.pending().unwrap());

        // The BMC accepted it: the reboot is complete.
        let accepted = after_power_call(
            &h.snapshot.status,
            &PowerCallResult::Accepted {
                hard_fallback: None,
            },
            t(200),
            &default_config(),
        );
        assert_eq!(accepted.event_reasons(), vec![ev::REBOOT_COMPLETED]);
        h.apply(&accepted, t(200));
        assert!(h.last_powered_on().unwrap() > h.pending().unwrap());
        assert_eq!(h.last_action().unwrap().state, PowerActionState::Completed);
        let d = h.step(t(1_000));
        assert_eq!(d.power_action(), None);
        assert_eq!(
            condition(&h, cond::REBOOT_PENDING),
            Some(("False", condition_reason::NO_REBOOT_PENDING))
        );
        h.assert_settled(t(2_000));
    }
}

/// A restart whose outcome never came back is sent again only after the power-action timeout.
#[test]
fn disable_power_off_restart_not_confirmed_is_retried_after_the_timeout() {
    let mut h = no_power_off(&host_on()).annotate(SUFFIXLESS, "");
    let d = h.step(t(0));
    assert_eq!(restart_mode(&d), Some(PowerOffMode::Soft));
    let d = h.step(t(60_000));
    assert_eq!(d.power_action(), None);
    let d = h.step(t(301_000));
    assert_eq!(restart_mode(&d), Some(PowerOffMode::Soft), "{d:#?}");
    assert_eq!(h.last_action().unwrap().attempts, 2);
    assert!(h.last_action().unwrap().restart);
}

/// `online: false` on a host with power-off disabled is refused: no power-off, a Warning once
/// and a condition that stays while it is refused.
#[test]
fn disable_power_off_refuses_online_false() {
    let mut h = no_power_off(&host_on()).online(false);
    let d = h.step(t(0));
    assert_eq!(d.power_action(), None, "{d:#?}");
    assert_eq!(warnings(&d), vec![ev::POWER_OFF_REFUSED]);
    assert_eq!(
        condition(&h, cond::POWER_OFF_REFUSED),
        Some(("True", condition_reason::POWER_OFF_DISABLED))
    );
    let d = h.step(t(60_000));
    assert!(d.is_noop(), "refused once, not on every poll: {d:#?}");
    h = h.online(true);
    let d = h.step(t(61_000));
    assert_eq!(warnings(&d), Vec::<&str>::new());
    assert_eq!(
        condition(&h, cond::POWER_OFF_REFUSED),
        Some(("False", condition_reason::NOTHING_REFUSED))
    );
}

/// A keyed hold cannot be honoured: no reboot, no power-off, a Warning naming the annotation
/// and the condition, so a fencing client learns the host cannot be held off.
#[test]
fn disable_power_off_refuses_keyed_holds() {
    let mut h = no_power_off(&host_on()).annotate(REMEDIATION, CAPM3_VALUE);
    let d = h.step(t(0));
    assert_eq!(d.power_action(), None, "{d:#?}");
    assert_eq!(
        h.pending(),
        None,
        "no reboot is recorded for a refused hold"
    );
    assert_eq!(warnings(&d), vec![ev::POWER_OFF_REFUSED]);
    let message = d
        .events()
        .find(|e| e.reason == ev::POWER_OFF_REFUSED)
        .unwrap()
        .message
        .clone();
    assert!(message.contains(REMEDIATION), "{message}");
    let c = h
        .snapshot
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == cond::POWER_OFF_REFUSED)
        .unwrap();
    assert_eq!(c.status, "True");
    assert!(c.message.contains(REMEDIATION), "{}", c.message);
    assert!(h.step(t(60_000)).is_noop());

    // A suffixless request beside the refused hold is still a restart.
    h = h.annotate(SUFFIXLESS, "");
    let d = h.step(t(61_000));
    assert_eq!(restart_mode(&d), Some(PowerOffMode::Soft), "{d:#?}");
}

/// Without the flag nothing about it is written; a host that is off is powered on (power-on
/// is allowed, only power-off is not).
#[test]
fn disable_power_off_condition_only_when_it_matters() {
    let mut h = host_on();
    h.step(t(0));
    assert_eq!(condition(&h, cond::POWER_OFF_REFUSED), None);
    let mut off = no_power_off(&host_off_offline());
    let d = off.step(t(0));
    assert_eq!(effects(&d), vec![Action::PowerOn]);
    assert_eq!(warnings(&d), vec![ev::POWER_OFF_REFUSED]);
    // The flag cleared: the condition says so, and online: false powers the host off again.
    off.snapshot.disable_power_off = false;
    off = off.bmc(ObservedPower::On);
    let d = off.step(t(10_000));
    assert_eq!(
        condition(&off, cond::POWER_OFF_REFUSED),
        Some(("False", condition_reason::NOTHING_REFUSED))
    );
    assert_eq!(power_off_mode(&d), Some(PowerOffMode::Soft));
}

fn image() -> serde_json::Value {
    json!({"url": "http://images/ubuntu.qcow2", "checksum": "http://images/ubuntu.qcow2.sha256sum"})
}

fn provisioned_with_image() -> Host {
    let mut h = host_on();
    h.snapshot.image = Some(image());
    let d = h.step(t(0));
    assert_eq!(
        status_changes(&d),
        vec![StatusUpdate::SetProvisionedImage(Some(image()))]
    );
    assert_eq!(
        h.snapshot.status.provisioning.extra.get("image"),
        Some(&image())
    );
    h
}

/// CAPM3 deleting a Metal3Machine: image removed, `online: false`, wait for the state to leave
/// `provisioned`, then `consumerRef` cleared. Removing the image deprovisions the host
/// (provisioned → deprovisioning → available) while `consumerRef` is still set.
#[test]
fn removing_the_image_deprovisions_as_capm3_expects() {
    let mut h = provisioned_with_image().annotate("reboot.metal3.io/capm3", "");
    h.step(t(100));
    // CAPM3: image removed and online: false.
    h.snapshot.image = None;
    h = h.online(false);
    let d = h.step(t(1_000));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Deprovisioning
    )));
    assert_eq!(
        d.removed_annotations(),
        vec!["reboot.metal3.io/capm3"],
        "reboot requests of the leaving consumer go"
    );
    h = h.bmc(ObservedPower::Off);
    // Available only once two Off readings a second apart confirm the host off: the first
    // reading, the confirming one, then the state.
    h.step(t(2_000));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Deprovisioning),
        "one Off reading is no evidence"
    );
    h.step(t(3_100));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Deprovisioning)
    );
    let d = h.step(t(3_200));
    assert!(d.status.contains(&StatusUpdate::SetProvisioningState(
        ProvisioningState::Available
    )));
    // Stays available (consumerRef still set, no image): CAPM3 now clears consumerRef.
    for i in 0..3 {
        h.step(t(4_000 + i));
        assert_eq!(
            h.snapshot.status.provisioning.state,
            Some(ProvisioningState::Available)
        );
    }
    h.snapshot.has_consumer = false;
    let d = h.step(t(10_000));
    assert_eq!(
        status_changes(&d),
        vec![StatusUpdate::SetProvisionedImage(None)]
    );
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Available)
    );
    assert_eq!(d.power_action(), None);
}

/// Setting an image again (same consumer) provisions the host again; a host that never had an
/// image keeps the simplified rule (consumerRef ⇒ provisioned).
#[test]
fn image_set_again_provisions_again_and_hosts_without_images_are_unchanged() {
    let mut h = provisioned_with_image();
    h.snapshot.image = None;
    // Deprovisioning powers the running host off (metal3 does), whatever spec.online says.
    let d = h.step(t(1_000));
    assert_eq!(d.power_action(), Some(PowerTarget::Off), "{d:#?}");
    h = h.bmc(ObservedPower::Off);
    h.step(t(2_000));
    h.step(t(3_100));
    h.step(t(3_200));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Available)
    );
    h.snapshot.image = Some(json!({"url": "http://images/other.qcow2"}));
    h.step(t(4_000));
    assert_eq!(
        h.snapshot.status.provisioning.state,
        Some(ProvisioningState::Provisioned)
    );
    assert_eq!(
        h.snapshot.status.provisioning.image_url(),
        Some("http://images/other.qcow2")
    );

    let mut plain = host_on();
    plain.step(t(0));
    assert_eq!(
        plain.snapshot.status.provisioning.state,
        Some(ProvisioningState::Provisioned)
    );
    assert!(
        !plain
            .snapshot
            .status
            .provisioning
            .extra
            .contains_key("image")
    );
}

/// Every status write stamps `lastUpdated`; `poweredOn` is always serialized.
#[test]
fn last_updated_on_every_write_and_powered_on_always_present() {
    let mut status = BareMetalHostStatus::default();
    apply_status_updates(&mut status, &[], t(0), Some(1));
    assert_eq!(status.last_updated, None, "no write, no stamp");
    apply_status_updates(
        &mut status,
        &[StatusUpdate::SetPoweredOn(false)],
        t(5),
        Some(1),
    );
    assert_eq!(status.last_updated, Some(t(5)));
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["poweredOn"], json!(false));
    assert!(json["lastUpdated"].is_string());

    let json = serde_json::to_value(BareMetalHostStatus::default()).unwrap();
    assert_eq!(json["poweredOn"], json!(false), "never omitted");

    // Every decision that writes also moves lastUpdated.
    let mut h = host_on().annotate(SUFFIXLESS, "");
    for (i, power) in [ObservedPower::On, ObservedPower::Off, ObservedPower::Off]
        .into_iter()
        .enumerate()
    {
        h = h.bmc(power);
        let now = t(1_000 * (i as i64 + 1));
        let d = decide(&h.snapshot, now);
        h.apply(&d, now);
        if !d.status.is_empty() {
            assert_eq!(h.snapshot.status.last_updated, Some(now));
        }
    }
}

/// `poweredOn: false` written before the first observation does not read as "observed off".
#[test]
fn powered_on_false_counts_only_once_observed() {
    let never = BareMetalHostStatus {
        powered_on: Some(false),
        ..Default::default()
    };
    assert_eq!(never.observed_powered_on(), None);
    let observed = BareMetalHostStatus {
        powered_on: Some(false),
        operational_status: Some(hostcycle_api::OperationalStatus::Ok),
        ..Default::default()
    };
    assert_eq!(observed.observed_powered_on(), Some(false));
    let on = BareMetalHostStatus {
        powered_on: Some(true),
        ..Default::default()
    };
    assert_eq!(on.observed_powered_on(), Some(true));
}

/// A BMC restart may show the host off for a while (sushy-tools does): that is the restart,
/// not a power loss to correct, unless it lasts past the power-action timeout.
#[test]
fn disable_power_off_host_seen_off_during_its_restart_is_left_alone() {
    let mut h = no_power_off(&host_on()).annotate(SUFFIXLESS, CAPM3_VALUE);
    h.step(t(0));
    let accepted = after_power_call(
        &h.snapshot.status,
        &PowerCallResult::Accepted {
            hard_fallback: None,
        },
        t(100),
        &default_config(),
    );
    h.apply(&accepted, t(100));
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(2_000));
    assert_eq!(d.power_action(), None, "{d:#?}");
    assert_eq!(warnings(&d), Vec::<&str>::new());
    h = h.bmc(ObservedPower::On);
    let d = h.step(t(9_000));
    assert_eq!(d.power_action(), None);
    assert!(h.last_powered_on().unwrap() > h.pending().unwrap());

    // Off for good: powered on again once the timeout has passed.
    h = h.bmc(ObservedPower::Off);
    assert_eq!(h.step(t(200_000)).power_action(), None);
    let d = h.step(t(301_000));
    assert_eq!(effects(&d), vec![Action::PowerOn], "{d:#?}");
}

/// A second reboot right after a restart is a second restart at once (the "coming back by
/// itself" wait is only for a host seen off).
#[test]
fn disable_power_off_second_reboot_soon_after_is_restarted_at_once() {
    let mut h = no_power_off(&host_on()).annotate(SUFFIXLESS, "");
    h.step(t(0));
    let accepted = after_power_call(
        &h.snapshot.status,
        &PowerCallResult::Accepted {
            hard_fallback: None,
        },
        t(100),
        &default_config(),
    );
    h.apply(&accepted, t(100));
    h.step(t(1_000));
    h = h.annotate(SUFFIXLESS, "");
    let d = h.step(t(5_000));
    assert_eq!(restart_mode(&d), Some(PowerOffMode::Soft), "{d:#?}");
    assert_eq!(h.pending(), Some(t(5_000)));
}
