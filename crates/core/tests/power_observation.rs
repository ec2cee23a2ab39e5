//! The host controller's record of BMC readings (`status.powerObservation`): a table of runs,
//! and the sequences that make or break a confirmation (issue 24: "power evidence = recorded
//! observations").
#![allow(clippy::unwrap_used)]

mod common;

use common::{confirmed_run, host_on, lab_bmc, t};
use hostcycle_api::{ObservedBmc, ObservedPowerState, PowerObservation};
use hostcycle_core::bmh::observation::{after_reading, restarted};
use hostcycle_core::bmh::{
    BmcFailure, BmcFailureKind, BmcObservation, ObservedPower, StatusUpdate,
};

const OFF: ObservedPowerState = ObservedPowerState::Off;
const ON: ObservedPowerState = ObservedPowerState::On;

fn run(
    state: ObservedPowerState,
    readings: u32,
    since: i64,
    confirmed: Option<i64>,
) -> PowerObservation {
    PowerObservation {
        state,
        bmc: lab_bmc(),
        readings,
        since: Some(t(since)),
        confirmed_at: confirmed.map(t),
    }
}

#[test]
fn each_reading_extends_restarts_or_confirms_the_run() {
    let other_bmc = ObservedBmc {
        address: "redfish://192.0.2.99/redfish/v1/Systems/1".into(),
        ..lab_bmc()
    };
    let other_identity = ObservedBmc {
        identity: Some("uuid:ffff".into()),
        ..lab_bmc()
    };
    let restarted_off = restarted(&run(OFF, 2, 0, Some(1_000)));
    #[rustfmt::skip]
    // (case, the run before, the reading's state, its BMC, when, the run after or None)
    type Reading = (
        &'static str,
        Option<PowerObservation>,
        ObservedPowerState,
        ObservedBmc,
        i64,
        Option<PowerObservation>,
    );
    let cases: Vec<Reading> = vec![
        (
            "no run yet → first reading",
            None,
            OFF,
            lab_bmc(),
            5_000,
            Some(run(OFF, 1, 5_000, None)),
        ),
        (
            "one Off, another Off 1 s later → confirmed",
            Some(run(OFF, 1, 5_000, None)),
            OFF,
            lab_bmc(),
            6_000,
            Some(run(OFF, 2, 5_000, Some(6_000))),
        ),
        (
            "one Off, another 999 ms later → not yet (no write)",
            Some(run(OFF, 1, 5_000, None)),
            OFF,
            lab_bmc(),
            5_999,
            None,
        ),
        (
            "one Off, then On → a new run",
            Some(run(OFF, 1, 5_000, None)),
            ON,
            lab_bmc(),
            6_000,
            Some(run(ON, 1, 6_000, None)),
        ),
        (
            "confirmed, the same again → nothing to write",
            Some(run(OFF, 2, 5_000, Some(6_000))),
            OFF,
            lab_bmc(),
            60_000,
            None,
        ),
        (
            "confirmed Off, then On → a new run",
            Some(run(OFF, 2, 5_000, Some(6_000))),
            ON,
            lab_bmc(),
            60_000,
            Some(run(ON, 1, 60_000, None)),
        ),
        (
            "Off from another address → a new run of that BMC",
            Some(run(OFF, 2, 5_000, Some(6_000))),
            OFF,
            other_bmc.clone(),
            7_000,
            Some(PowerObservation {
                bmc: other_bmc.clone(),
                ..run(OFF, 1, 7_000, None)
            }),
        ),
        (
            "another identity at the address → a new run",
            Some(run(OFF, 2, 5_000, Some(6_000))),
            OFF,
            other_identity.clone(),
            7_000,
            Some(PowerObservation {
                bmc: other_identity.clone(),
                ..run(OFF, 1, 7_000, None)
            }),
        ),
        (
            "restarted (a request or a failed read) → the next reading is the first",
            Some(restarted_off.clone()),
            OFF,
            lab_bmc(),
            9_000,
            Some(run(OFF, 1, 9_000, None)),
        ),
        (
            "Transitioning is a run of its own (never Off)",
            Some(run(OFF, 1, 5_000, None)),
            ObservedPowerState::Transitioning,
            lab_bmc(),
            6_000,
            Some(run(ObservedPowerState::Transitioning, 1, 6_000, None)),
        ),
    ];
    for (name, prev, state, bmc, now, want) in cases {
        assert_eq!(
            after_reading(prev.as_ref(), state, &bmc, t(now)),
            want,
            "{name}"
        );
    }
    assert!(run(OFF, 2, 5_000, Some(6_000)).confirmed());
    assert!(
        !run(OFF, 2, 5_000, Some(5_500)).confirmed(),
        "less than a second apart"
    );
    assert!(!run(OFF, 1, 5_000, None).confirmed());
    assert!(!restarted_off.confirmed());
}

/// A status write without a reading never changes the evidence; a request restarts it, so a
/// confirmed Off always consists of readings made after the request; a failed read between two
/// readings breaks them; a detach drops them.
#[test]
fn the_host_controller_confirms_off_only_with_two_readings_after_the_request() {
    // A held-off request arrives while the host is on: power-off sent, the run restarted.
    let mut h = host_on().annotate("reboot.metal3.io/remediation", r#"{"mode":"hard"}"#);
    let d = h.step(t(0));
    assert!(d.power_action().is_some());
    let o = h.snapshot.status.power_observation.clone().unwrap();
    assert_eq!(
        o.readings, 0,
        "a recorded power request restarts the run: {o:?}"
    );

    // First Off reading: one reading, read again within a second.
    h = h.bmc(ObservedPower::Off);
    let d = h.step(t(2_000));
    assert_eq!(d.requeue_after, common::FAST);
    assert!(
        !h.snapshot
            .status
            .power_observation
            .as_ref()
            .unwrap()
            .confirmed()
    );

    // The BMC fails once: the run restarts; the next Off is a first reading again.
    h.snapshot.bmc = BmcObservation::Failed(BmcFailure {
        kind: BmcFailureKind::Unreachable,
        message: "connection refused".into(),
    });
    let d = h.step(t(3_000));
    assert!(d.status.contains(&StatusUpdate::RestartPowerObservation));
    h = h.bmc(ObservedPower::Off);
    h.step(t(4_000));
    assert_eq!(
        h.snapshot
            .status
            .power_observation
            .as_ref()
            .unwrap()
            .readings,
        1
    );
    h.step(t(5_000));
    let o = h.snapshot.status.power_observation.clone().unwrap();
    assert!(o.confirmed(), "{o:?}");
    assert_eq!(o.since, Some(t(4_000)));

    // Detached: the evidence goes with it, whatever the rest of the status says.
    let mut detached = h.clone().annotate("baremetalhost.metal3.io/detached", "");
    detached.step(t(6_000));
    assert_eq!(detached.snapshot.status.power_observation, None);
    assert_eq!(
        detached.snapshot.status.powered_on,
        Some(false),
        "poweredOn is carried over"
    );

    // A steady, confirmed host costs no status write.
    let mut steady = host_on();
    assert_eq!(
        steady.snapshot.status.power_observation,
        Some(confirmed_run(ON))
    );
    assert!(steady.step(t(10_000)).is_noop());
}

/// Issue 24, case 2 (the host controller's half): worker-1's host held off for a remediation
/// gets worker-2's BMC address. The request was made of worker-1's machine: nothing is sent to
/// the new BMC (and its readings are not recorded as this host's) until the request is
/// withdrawn; then the host is managed through the new BMC as usual.
#[test]
fn a_bmc_changed_under_a_request_gets_no_power_action() {
    const HOLD: &str = "reboot.metal3.io/hostcycle-remediation-1";
    let moved = ObservedBmc {
        address: "redfish://192.0.2.20/redfish/v1/Systems/1".into(),
        identity: Some("uuid:0a1b2c3d-0000-4000-8000-000000000002".into()),
        ..lab_bmc()
    };
    // Held off, power-off sent; the old BMC stopped answering before it was seen off.
    let mut h = host_on().annotate(HOLD, r#"{"mode":"hard"}"#);
    assert!(h.step(t(0)).power_action().is_some());
    // The address now points at another machine, which is on.
    h.snapshot.read_with = moved.clone();
    h = h.bmc(ObservedPower::On);
    for at in [5_000, 65_000] {
        let d = h.step(t(at));
        assert_eq!(
            d.power_action(),
            None,
            "nothing reaches the new BMC: {d:#?}"
        );
        assert!(
            d.event_reasons()
                .contains(&hostcycle_api::reasons::event_reason::BMC_CHANGED_UNDER_REQUEST),
            "{d:#?}"
        );
        assert_eq!(
            h.snapshot.status.power_observation.as_ref().unwrap().bmc,
            lab_bmc(),
            "the new BMC's readings are not this host's evidence"
        );
    }
    assert_eq!(
        common::condition(&h, hostcycle_api::reasons::condition::BMC_HEALTHY),
        Some((
            "False",
            hostcycle_api::reasons::condition_reason::BMC_CHANGED_UNDER_REQUEST
        ))
    );
    // Another Secret, the same identity (a broken BMC's credentials fixed): the same machine.
    let mut fixed = host_on().annotate(HOLD, r#"{"mode":"hard"}"#);
    fixed.step(t(0));
    fixed.snapshot.read_with.credentials_name = "bmc-secret-rotated".into();
    fixed = fixed.bmc(ObservedPower::Off);
    let d = fixed.step(t(5_000));
    assert!(
        !d.event_reasons()
            .contains(&hostcycle_api::reasons::event_reason::BMC_CHANGED_UNDER_REQUEST),
        "{d:#?}"
    );
    // Another Secret and no identity to show it is the same machine: refused.
    let mut unknown = host_on().annotate(HOLD, r#"{"mode":"hard"}"#);
    unknown.snapshot.status.power_observation = Some(PowerObservation {
        bmc: ObservedBmc {
            identity: None,
            ..lab_bmc()
        },
        ..confirmed_run(ON)
    });
    unknown.snapshot.read_with.identity = None;
    unknown.step(t(0));
    unknown.snapshot.read_with.credentials_name = "bmc-secret-rotated".into();
    assert!(
        unknown
            .step(t(5_000))
            .event_reasons()
            .contains(&hostcycle_api::reasons::event_reason::BMC_CHANGED_UNDER_REQUEST)
    );
    // Only the identity changed (same address, another machine answers): refused too.
    let mut same_address = host_on().annotate(HOLD, r#"{"mode":"hard"}"#);
    same_address.step(t(0));
    same_address.snapshot.read_with.identity = Some("uuid:ffff".into());
    assert_eq!(same_address.step(t(5_000)).power_action(), None);

    // Withdrawn: the host is read through the new BMC (a new run) and managed as usual.
    h = h.unannotate(HOLD);
    let d = h.step(t(70_000));
    assert!(
        !d.event_reasons()
            .contains(&hostcycle_api::reasons::event_reason::BMC_CHANGED_UNDER_REQUEST)
    );
    assert_eq!(
        h.snapshot.status.power_observation.as_ref().unwrap().bmc,
        moved
    );

    // No request outstanding: an address change is an ordinary edit.
    let mut idle = host_on();
    idle.snapshot.read_with = ObservedBmc {
        address: "redfish://192.0.2.30/redfish/v1/Systems/1".into(),
        ..lab_bmc()
    };
    let d = idle.step(t(1_000));
    assert!(d.event_reasons().is_empty(), "{d:#?}");
    assert_eq!(
        idle.snapshot
            .status
            .power_observation
            .as_ref()
            .unwrap()
            .readings,
        1
    );
}
