//! Properties of `decide` over arbitrary snapshots: it never panics, never powers on a host
//! that carries a reboot annotation, never repeats a power request that is in flight, and
//! always writes the request ahead of the call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::{
    BareMetalHostStatus, ErrorType, LastPowerAction, OperationalStatus, PowerActionState,
    PowerActionTrigger, PowerOffMode, PowerTarget, ProvisionStatus, ProvisioningState,
    RebootRequests,
};
use hostcycle_core::bmh::{
    Action, BmcFailure, BmcFailureKind, BmcObservation, DecideConfig, HostSnapshot, ObservedPower,
    StatusUpdate, apply_status_updates, decide,
};
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000)
        .unwrap()
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap()
}

fn opt_ts() -> impl Strategy<Value = Option<Timestamp>> {
    prop::option::of((-400_000_i64..400_000).prop_map(ts))
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        Just("reboot.metal3.io".to_owned()),
        Just("reboot.metal3.io/a".to_owned()),
        Just("reboot.metal3.io/b".to_owned()),
        Just("reboot.metal3.io/".to_owned()),
        Just("reboot.metal3.ioX".to_owned()),
        Just("baremetalhost.metal3.io/paused".to_owned()),
        Just("baremetalhost.metal3.io/detached".to_owned()),
    ];
    let value = prop_oneof![
        Just(String::new()),
        Just(r#"{"mode":"hard"}"#.to_owned()),
        Just(r#"{"mode":"soft"}"#.to_owned()),
        Just("garbage".to_owned()),
    ];
    prop::collection::btree_map(key, value, 0..4)
}

fn last_action() -> impl Strategy<Value = Option<LastPowerAction>> {
    prop::option::of(
        (
            prop::bool::ANY,
            prop::option::of(prop_oneof![
                Just(PowerOffMode::Soft),
                Just(PowerOffMode::Hard)
            ]),
            prop_oneof![
                Just(PowerActionState::Requested),
                Just(PowerActionState::Completed),
                Just(PowerActionState::Failed)
            ],
            -400_000_i64..400_000,
            0_i64..300_000,
            1_u32..4,
        )
            .prop_map(
                |(on, mode, state, requested, delay, attempts)| LastPowerAction {
                    action: PowerTarget::from_powered_on(on),
                    mode: if on {
                        None
                    } else {
                        mode.or(Some(PowerOffMode::Soft))
                    },
                    trigger: PowerActionTrigger::RebootRequested,
                    state,
                    requested_at: ts(requested),
                    last_attempt_at: ts(requested + delay),
                    attempts,
                    completed_at: None,
                    hard_fallback: None,
                    failure: None,
                    restart: false,
                },
            ),
    )
}

fn observation() -> impl Strategy<Value = BmcObservation> {
    prop_oneof![
        4 => Just(BmcObservation::Power(ObservedPower::On)),
        4 => Just(BmcObservation::Power(ObservedPower::Off)),
        1 => Just(BmcObservation::Power(ObservedPower::Transitioning)),
        1 => Just(BmcObservation::Power(ObservedPower::Unknown)),
        1 => Just(BmcObservation::Failed(BmcFailure { kind: BmcFailureKind::Unreachable, message: "x".into() })),
        1 => Just(BmcObservation::Failed(BmcFailure { kind: BmcFailureKind::Credentials, message: "y".into() })),
    ]
}

prop_compose! {
    fn snapshot()(
        annotations in annotations(),
        online in prop::bool::ANY,
        has_consumer in prop::bool::weighted(0.8),
        externally in prop::bool::weighted(0.1),
        powered_on in prop::option::of(prop::bool::ANY),
        last_powered_on in opt_ts(),
        pending in opt_ts(),
        action in last_action(),
        error_count in 0_u32..6,
        power_error in prop::bool::ANY,
        previous in prop::option::of(prop_oneof![
            Just(ProvisioningState::Provisioned),
            Just(ProvisioningState::Deprovisioning),
            Just(ProvisioningState::Available),
        ]),
        bmc in observation(),
    ) -> (HostSnapshot, BTreeMap<String, String>) {
        let snapshot = HostSnapshot {
            generation: Some(1),
            online,
            externally_provisioned: externally,
            has_consumer,
            bmc_configured: true,
            disable_power_off: false,
            image: None,
            paused: hostcycle_api::is_paused(&annotations),
            detached: hostcycle_api::is_detached(&annotations),
            command_reboot: false,
            reboot_requests: RebootRequests::from_annotations(&annotations),
            status: BareMetalHostStatus {
                powered_on,
                operational_status: Some(if error_count > 0 { OperationalStatus::Error } else { OperationalStatus::Ok }),
                error_type: (error_count > 0).then_some(if power_error { ErrorType::PowerManagementError } else { ErrorType::RegistrationError }),
                error_count,
                provisioning: ProvisionStatus {
                    state: previous,
                    last_powered_on,
                    pending_reboot_since: pending,
                    ..Default::default()
                },
                last_power_action: action,
                ..Default::default()
            },
            bmc,
            credentials: None,
            read_with: Default::default(),
        };
        (snapshot, annotations)
    }
}

fn power_calls(actions: &[Action]) -> Vec<Action> {
    actions
        .iter()
        .filter(|a| matches!(a, Action::PowerOff { .. } | Action::PowerOn))
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decide_invariants((s, annotations) in snapshot(), now_ms in -10_000_i64..500_000) {
        let cfg = DecideConfig::default();
        let now = ts(now_ms);
        let d = decide(&s, now);

        if s.paused {
            prop_assert!(d.is_noop());
            prop_assert_eq!(d.requeue_after, None);
            return Ok(());
        }
        // No hot loop.
        prop_assert!(d.requeue_after.is_some_and(|r| r >= cfg.transition_requeue || r > std::time::Duration::ZERO));

        let calls = power_calls(&d.actions);
        prop_assert!(calls.len() <= 1, "{:?}", calls);
        if let Some(call) = calls.first() {
            // Write-ahead: the decision records the request it makes.
            let record = d.status.iter().find_map(|u| match u {
                StatusUpdate::RecordPowerRequest(a) => Some(a.clone()),
                _ => None,
            });
            let record = record.expect("power call without record");
            prop_assert_eq!(record.state, PowerActionState::Requested);
            prop_assert_eq!(record.last_attempt_at, now);
            prop_assert!(!s.detached);
            if *call == Action::PowerOn {
                // Never power on a host carrying a reboot annotation, nor in the decision
                // that removes one.
                prop_assert!(s.reboot_requests.is_empty(), "{:?}", annotations);
                prop_assert!(d.removed_annotations().is_empty());
                prop_assert!(s.online);
                let pending = d.status.iter().rev().find_map(|u| match u {
                    StatusUpdate::SetPendingRebootSince(p) => Some(*p),
                    _ => None,
                }).or(s.status.provisioning.pending_reboot_since);
                if let Some(p) = pending {
                    prop_assert!(record.requested_at > p, "power-on must postdate the reboot");
                }
            }
        }
        for u in &d.status {
            if let StatusUpdate::SetPendingRebootSince(p) = u
                && let Some(lpo) = s.status.provisioning.last_powered_on
            {
                prop_assert!(*p > lpo);
            }
        }

        // Never repeat: carry the decision out (status + annotation removals, no BMC change)
        // and decide again from the same BMC observation: the same call is not made again.
        let mut s2 = s.clone();
        apply_status_updates(&mut s2.status, &d.status, now, s.generation);
        let mut annotations2 = annotations.clone();
        for k in d.removed_annotations() {
            annotations2.remove(k);
        }
        s2.reboot_requests = RebootRequests::from_annotations(&annotations2);
        let d2 = decide(&s2, now.checked_add(SignedDuration::from_millis(500)).unwrap());
        if let Some(target) = d.power_action() {
            prop_assert!(
                d2.power_action() != Some(target),
                "repeated power {:?}\nfirst {:#?}\nsecond {:#?}", target, d, d2
            );
            if target == PowerTarget::On {
                prop_assert_eq!(d2.power_action(), None);
            }
        }
    }
}
