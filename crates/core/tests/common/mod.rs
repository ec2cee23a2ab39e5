//! Builders shared by the decision tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::{
    BareMetalHostStatus, LastPowerAction, ObservedBmc, ObservedPowerState, OperationalStatus,
    PowerActionState, PowerActionTrigger, PowerObservation, PowerOffMode, PowerTarget,
    ProvisioningState, RebootRequests,
};
use hostcycle_core::bmh::{
    Action, BmcObservation, DecideConfig, Decision, HostSnapshot, ObservedPower, StatusUpdate,
    apply_status_updates, decide,
};
use jiff::{SignedDuration, Timestamp};

pub const FAST: Option<Duration> = Some(Duration::from_secs(1));
pub const SLOW: Option<Duration> = Some(Duration::from_secs(60));

/// 2025-01-01T00:00:00Z plus `ms` milliseconds.
pub fn t(ms: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600)
        .unwrap()
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap()
}

/// The BMC the fixtures' hosts are read with.
pub fn lab_bmc() -> ObservedBmc {
    ObservedBmc {
        address: "redfish://192.0.2.10/redfish/v1/Systems/1".into(),
        credentials_name: "bmc-secret".into(),
        identity: Some("uuid:0a1b2c3d-0000-4000-8000-000000000001".into()),
    }
}

/// A run of readings of `state` confirmed long ago (a settled host).
pub fn confirmed_run(state: ObservedPowerState) -> PowerObservation {
    PowerObservation {
        state,
        bmc: lab_bmc(),
        readings: 2,
        since: Some(t(-3_700_000)),
        confirmed_at: Some(t(-3_699_000)),
    }
}

/// A provisioned, registered host that is on and settled (conditions already recorded).
pub fn host_on() -> Host {
    let mut h = Host {
        snapshot: HostSnapshot {
            generation: Some(1),
            online: true,
            externally_provisioned: false,
            has_consumer: true,
            bmc_configured: true,
            disable_power_off: false,
            image: None,
            paused: false,
            detached: false,
            command_reboot: false,
            reboot_requests: RebootRequests::default(),
            status: BareMetalHostStatus {
                powered_on: Some(true),
                operational_status: Some(OperationalStatus::Ok),
                provisioning: hostcycle_api::ProvisionStatus {
                    state: Some(ProvisioningState::Provisioned),
                    last_powered_on: Some(t(-3_600_000)),
                    ..Default::default()
                },
                power_observation: Some(confirmed_run(ObservedPowerState::On)),
                ..Default::default()
            },
            bmc: BmcObservation::Power(ObservedPower::On),
            read_with: lab_bmc(),
            credentials: None,
        },
        annotations: BTreeMap::new(),
    };
    h.settle(t(-1_000));
    h
}

/// Same, but off with `online: false`.
pub fn host_off_offline() -> Host {
    let mut h = host_on();
    h.snapshot.online = false;
    h.snapshot.status.powered_on = Some(false);
    h.snapshot.status.power_observation = Some(confirmed_run(ObservedPowerState::Off));
    h.snapshot.bmc = BmcObservation::Power(ObservedPower::Off);
    h.settle(t(-900));
    h
}

/// A host object plus what the BMC says, as the operator would see it.
#[derive(Clone, Debug)]
pub struct Host {
    pub snapshot: HostSnapshot,
    pub annotations: BTreeMap<String, String>,
}

impl Host {
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self.sync();
        self
    }

    pub fn unannotate(mut self, key: &str) -> Self {
        self.annotations.remove(key);
        self.sync();
        self
    }

    pub fn bmc(mut self, power: ObservedPower) -> Self {
        self.snapshot.bmc = BmcObservation::Power(power);
        self
    }

    pub fn online(mut self, online: bool) -> Self {
        self.snapshot.online = online;
        self
    }

    pub fn with_status(mut self, f: impl FnOnce(&mut BareMetalHostStatus)) -> Self {
        f(&mut self.snapshot.status);
        self
    }

    fn sync(&mut self) {
        self.snapshot.reboot_requests = RebootRequests::from_annotations(&self.annotations);
        self.snapshot.paused = hostcycle_api::is_paused(&self.annotations);
        self.snapshot.detached = hostcycle_api::is_detached(&self.annotations);
        self.snapshot.command_reboot = self
            .annotations
            .contains_key(hostcycle_core::queue::reboot::COMMAND_MARKER_ANNOTATION);
    }

    /// Carries out a decision as the operator would, minus the BMC: status written,
    /// annotations removed.
    pub fn apply(&mut self, d: &Decision, now: Timestamp) {
        apply_status_updates(
            &mut self.snapshot.status,
            &d.status,
            now,
            self.snapshot.generation,
        );
        for action in &d.actions {
            if let Action::RemoveAnnotations { keys, .. } = action {
                for k in keys {
                    self.annotations.remove(k);
                }
            }
        }
        self.sync();
    }

    /// Decides and applies; returns the decision.
    pub fn step(&mut self, now: Timestamp) -> Decision {
        let d = decide(&self.snapshot, now);
        self.apply(&d, now);
        d
    }

    /// Applies decisions until one has no status update (BMC unchanged), asserting none
    /// powers anything.
    /// Nothing left to do at `now`, except the second reading that confirms the run of
    /// readings (at least a second after the first): then nothing a second later.
    pub fn assert_settled(&mut self, now: Timestamp) {
        let d = self.step(now);
        if d.is_noop() {
            return;
        }
        let only_confirms = d.actions.is_empty()
            && matches!(d.status.as_slice(), [StatusUpdate::SetPowerObservation(o)] if o.readings == 2);
        assert!(
            only_confirms,
            "only a confirming reading may be left: {d:#?}"
        );
        let d = self.step(
            now.checked_add(SignedDuration::from_secs(1))
                .expect("in range"),
        );
        assert!(d.is_noop(), "{d:#?}");
    }

    pub fn settle(&mut self, now: Timestamp) {
        for _ in 0..3 {
            let d = self.step(now);
            assert_eq!(
                d.power_action(),
                None,
                "settling must not change power: {d:#?}"
            );
            if d.status.is_empty() {
                return;
            }
        }
        panic!("host did not settle");
    }

    pub fn pending(&self) -> Option<Timestamp> {
        self.snapshot.status.provisioning.pending_reboot_since
    }

    pub fn last_powered_on(&self) -> Option<Timestamp> {
        self.snapshot.status.provisioning.last_powered_on
    }

    pub fn last_action(&self) -> Option<&LastPowerAction> {
        self.snapshot.status.last_power_action.as_ref()
    }
}

/// Actions other than events.
pub fn effects(d: &Decision) -> Vec<Action> {
    d.actions
        .iter()
        .filter(|a| !matches!(a, Action::EmitEvent(_)))
        .cloned()
        .collect()
}

/// Status updates other than conditions.
pub fn status_changes(d: &Decision) -> Vec<StatusUpdate> {
    d.status
        .iter()
        .filter(|u| !matches!(u, StatusUpdate::SetCondition(_)))
        .cloned()
        .collect()
}

pub fn recorded_request(d: &Decision) -> Option<&LastPowerAction> {
    d.status.iter().find_map(|u| match u {
        StatusUpdate::RecordPowerRequest(a) => Some(a),
        _ => None,
    })
}

pub fn condition<'a>(h: &'a Host, type_: &str) -> Option<(&'a str, &'a str)> {
    h.snapshot
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// A write-ahead record as decide() would have produced it.
pub fn requested(
    action: PowerTarget,
    mode: Option<PowerOffMode>,
    trigger: PowerActionTrigger,
    at: Timestamp,
) -> LastPowerAction {
    LastPowerAction {
        action,
        mode,
        trigger,
        state: PowerActionState::Requested,
        requested_at: at,
        last_attempt_at: at,
        attempts: 1,
        completed_at: None,
        hard_fallback: None,
        failure: None,
        restart: false,
    }
}

pub fn default_config() -> DecideConfig {
    DecideConfig::default()
}
