//! Drives `decide` through whole reboots against a fake BMC with realistic latencies,
//! with remediation-style clients, and checks the reboot API's guarantees:
//!
//! - exactly one power-off and one power-on per reboot;
//! - no power-on while any `reboot.metal3.io/{key}` annotation exists;
//! - a client that waits for "off" finds the host really off (it may delete the Node);
//! - at the end `lastPoweredOn > pendingRebootSince`, and every process running when the
//!   reboot was requested has stopped (the host went off after the request).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::reasons::event_reason as ev;
use hostcycle_api::{
    BareMetalHost, BareMetalHostSpec, BareMetalHostStatus, BmcDetails, PowerOffMode,
    ProvisionStatus, ProvisioningState,
};
use hostcycle_core::bmh::{
    Action, BmcObservation, DecideConfig, HostSnapshot, ObservedPower, PowerCallResult,
    after_power_call, apply_status_updates, decide,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;

const TICK_MS: i64 = 100;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000)
        .unwrap()
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap()
}

/// A host's power as the BMC sees it, with latency.
struct FakeBmc {
    on: bool,
    /// Target power and when it is reached.
    transition: Option<(bool, i64)>,
    /// Soft power-off is ignored by the OS: the BMC layer falls back to hard after 5 s.
    ignores_acpi: bool,
    last_off_at: Option<i64>,
    boots: u32,
    offs: Vec<(i64, PowerOffMode)>,
    ons: Vec<i64>,
}

impl FakeBmc {
    fn tick(&mut self, now: i64) {
        if let Some((target, ready)) = self.transition
            && now >= ready
        {
            self.on = target;
            self.transition = None;
            if target {
                self.boots += 1;
            } else {
                self.last_off_at = Some(now);
            }
        }
    }

    fn observe(&self) -> ObservedPower {
        match (self.transition, self.on) {
            (Some(_), _) => ObservedPower::Transitioning,
            (None, true) => ObservedPower::On,
            (None, false) => ObservedPower::Off,
        }
    }

    fn power_off(&mut self, now: i64, mode: PowerOffMode) -> Option<String> {
        self.offs.push((now, mode));
        let (delay, fallback) = match mode {
            PowerOffMode::Hard => (500, None),
            PowerOffMode::Soft if self.ignores_acpi => {
                (5_500, Some("host ignored ACPI shutdown for 5s".to_owned()))
            }
            PowerOffMode::Soft => (3_000, None),
        };
        if self.on {
            self.transition = Some((false, now + delay));
        }
        fallback
    }

    fn power_on(&mut self, now: i64) {
        self.ons.push(now);
        if !self.on {
            // Power-on takes 1–11 s on real BMCs.
            self.transition = Some((true, now + 7_000));
        }
    }
}

/// A client of the keyed form, like CAPM3 remediation: annotate, wait for off, delete the
/// Node, remove the annotation.
struct KeyedClient {
    key: &'static str,
    value: &'static str,
    request_at: i64,
    /// Extra time the client needs while the host is off.
    work_ms: i64,
    requested: bool,
    saw_off_at: Option<i64>,
    node_deleted_while_off: Option<bool>,
    released: bool,
}

impl KeyedClient {
    fn new(key: &'static str, value: &'static str, request_at: i64, work_ms: i64) -> Self {
        Self {
            key,
            value,
            request_at,
            work_ms,
            requested: false,
            saw_off_at: None,
            node_deleted_while_off: None,
            released: false,
        }
    }

    fn tick(&mut self, now: i64, host: &mut BareMetalHost, bmc: &FakeBmc) -> bool {
        let annotations = host.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if !self.requested && now >= self.request_at {
            annotations.insert(self.key.to_owned(), self.value.to_owned());
            self.requested = true;
            return true;
        }
        if self.requested && !self.released {
            let st = host.status.clone().unwrap_or_default();
            let prov = &st.provisioning;
            let held_off =
                st.powered_on == Some(false) && prov.pending_reboot_since > prov.last_powered_on;
            if held_off && self.saw_off_at.is_none() {
                self.saw_off_at = Some(now);
                // "Delete the Node": only safe if the host is really off.
                self.node_deleted_while_off = Some(!bmc.on && bmc.transition.is_none());
            }
            if let Some(seen) = self.saw_off_at
                && now >= seen + self.work_ms
            {
                annotations.remove(self.key);
                self.released = true;
                return true;
            }
        }
        false
    }
}

struct Scenario {
    name: &'static str,
    clients: Vec<KeyedClient>,
    /// (time, annotation value) of a suffixless request.
    suffixless: Option<(i64, &'static str)>,
    ignores_acpi: bool,
    expect_mode: PowerOffMode,
}

fn new_host() -> BareMetalHost {
    let mut host = BareMetalHost::new(
        "worker-0",
        BareMetalHostSpec {
            online: true,
            bmc: Some(BmcDetails {
                address: "redfish://10.0.0.5/redfish/v1/Systems/1".into(),
                credentials_name: "worker-0-bmc".into(),
                disable_certificate_verification: None,
            }),
            consumer_ref: Some(ObjectReference {
                kind: Some("Metal3Machine".into()),
                name: Some("worker-0".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    host.metadata.generation = Some(1);
    host.status = Some(BareMetalHostStatus {
        powered_on: Some(true),
        provisioning: ProvisionStatus {
            state: Some(ProvisioningState::Provisioned),
            last_powered_on: Some(at(-86_400_000)),
            ..Default::default()
        },
        ..Default::default()
    });
    host
}

struct Outcome {
    bmc: FakeBmc,
    host: BareMetalHost,
    clients: Vec<KeyedClient>,
    power_on_with_keyed_annotation: bool,
    reconciles: u32,
    events: Vec<&'static str>,
}

fn run(mut sc: Scenario) -> Outcome {
    let cfg = DecideConfig::default();
    let mut host = new_host();
    let mut bmc = FakeBmc {
        on: true,
        transition: None,
        ignores_acpi: sc.ignores_acpi,
        last_off_at: None,
        boots: 0,
        offs: vec![],
        ons: vec![],
    };
    let mut next_reconcile = 0_i64;
    let mut changed = true;
    let mut power_on_with_keyed_annotation = false;
    let mut reconciles = 0;
    let mut events = vec![];

    for step in 0..(120_000 / TICK_MS) {
        let now = step * TICK_MS;
        bmc.tick(now);
        for client in &mut sc.clients {
            changed |= client.tick(now, &mut host, &bmc);
        }
        if let Some((when, value)) = sc.suffixless
            && now == when
        {
            host.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert("reboot.metal3.io".into(), value.into());
            changed = true;
        }
        if !changed && now < next_reconcile {
            continue;
        }
        // Reconcile: observe → decide → record (write-ahead) → act → record outcome.
        reconciles += 1;
        changed = false;
        let snapshot = HostSnapshot::from_host(&host, BmcObservation::Power(bmc.observe()), None);
        let d = decide(&snapshot, at(now));
        let mut status = host.status.clone().unwrap_or_default();
        apply_status_updates(&mut status, &d.status, at(now), host.metadata.generation);
        if !d.status.is_empty() {
            changed = true;
        }
        host.status = Some(status);
        events.extend(d.event_reasons());
        for action in &d.actions {
            match action {
                Action::RemoveAnnotations { keys, .. } => {
                    let annotations = host.metadata.annotations.get_or_insert_with(BTreeMap::new);
                    for k in keys {
                        annotations.remove(k);
                    }
                    changed = true;
                }
                Action::PowerOff { mode } => {
                    let fallback = bmc.power_off(now, *mode);
                    let status = host.status.as_mut().unwrap();
                    let follow = after_power_call(
                        status,
                        &PowerCallResult::Accepted {
                            hard_fallback: fallback,
                        },
                        at(now),
                        &cfg,
                    );
                    apply_status_updates(status, &follow.status, at(now), Some(1));
                    events.extend(follow.event_reasons());
                }
                Action::PowerOn => {
                    let keyed_present = host
                        .metadata
                        .annotations
                        .iter()
                        .flatten()
                        .any(|(k, _)| k.starts_with("reboot.metal3.io/"));
                    power_on_with_keyed_annotation |= keyed_present;
                    bmc.power_on(now);
                }
                Action::Restart { .. } => {
                    unreachable!("no simulated host has spec.disablePowerOff")
                }
                Action::EmitEvent(_) => {}
            }
        }
        next_reconcile = now + d.requeue_after.unwrap().as_millis() as i64;
    }
    Outcome {
        bmc,
        host,
        clients: sc.clients,
        power_on_with_keyed_annotation,
        reconciles,
        events,
    }
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "one keyed client (remediation), hard",
            clients: vec![KeyedClient::new(
                "reboot.metal3.io/capbm-requested-power-off",
                r#"{"mode":"hard"}"#,
                2_000,
                4_000,
            )],
            suffixless: None,
            ignores_acpi: false,
            expect_mode: PowerOffMode::Hard,
        },
        Scenario {
            name: "suffixless only, soft",
            clients: vec![],
            suffixless: Some((2_000, "")),
            ignores_acpi: false,
            expect_mode: PowerOffMode::Soft,
        },
        Scenario {
            name: "suffixless + two keyed clients releasing at different times",
            clients: vec![
                KeyedClient::new("reboot.metal3.io/a", "", 2_000, 10_000),
                KeyedClient::new("reboot.metal3.io/b", "", 2_300, 3_000),
            ],
            suffixless: Some((2_100, "")),
            ignores_acpi: false,
            expect_mode: PowerOffMode::Soft,
        },
        Scenario {
            name: "soft request, OS ignores ACPI: BMC layer falls back to hard",
            clients: vec![KeyedClient::new("reboot.metal3.io/a", "", 1_000, 2_000)],
            suffixless: None,
            ignores_acpi: true,
            expect_mode: PowerOffMode::Soft,
        },
        Scenario {
            name: "second client joins while the first power-off is in flight (soft → hard)",
            clients: vec![
                KeyedClient::new("reboot.metal3.io/a", "", 1_000, 5_000),
                KeyedClient::new("reboot.metal3.io/b", r#"{"mode":"hard"}"#, 1_500, 1_000),
            ],
            suffixless: None,
            ignores_acpi: true,
            expect_mode: PowerOffMode::Soft,
        },
    ]
}

#[test]
fn whole_reboots_keep_the_guarantees() {
    for sc in scenarios() {
        let name = sc.name;
        let expect_mode = sc.expect_mode;
        let escalates = name.contains("soft → hard");
        let first_request = sc
            .clients
            .iter()
            .map(|c| c.request_at)
            .chain(sc.suffixless.map(|(t, _)| t))
            .min()
            .unwrap();
        let out = run(sc);
        let status = out.host.status.clone().unwrap();
        let prov = &status.provisioning;

        // Exactly one power-off (plus one escalation) and one power-on.
        if escalates {
            assert_eq!(
                out.bmc.offs.iter().map(|o| o.1).collect::<Vec<_>>(),
                vec![PowerOffMode::Soft, PowerOffMode::Hard],
                "{name}"
            );
        } else {
            assert_eq!(out.bmc.offs.len(), 1, "{name}: offs {:?}", out.bmc.offs);
            assert_eq!(out.bmc.offs[0].1, expect_mode, "{name}");
        }
        assert_eq!(out.bmc.ons.len(), 1, "{name}: ons {:?}", out.bmc.ons);
        assert_eq!(out.bmc.boots, 1, "{name}");
        assert!(
            !out.power_on_with_keyed_annotation,
            "{name}: powered on while held"
        );

        // Every client found the host really off, and released before the power-on.
        for c in &out.clients {
            assert_eq!(c.node_deleted_while_off, Some(true), "{name}: {}", c.key);
            assert!(c.released, "{name}: {}", c.key);
        }

        // Timestamps: reboot complete, requested after the first annotation, and the host
        // went off after the request (processes running then have stopped).
        let pending = prov.pending_reboot_since.unwrap();
        let last_on = prov.last_powered_on.unwrap();
        assert!(last_on > pending, "{name}: {last_on} > {pending}");
        assert!(pending >= at(first_request), "{name}");
        let off_at = out.bmc.last_off_at.unwrap();
        assert!(at(off_at) > pending.checked_sub(SignedDuration::from_millis(1)).unwrap());
        assert!(
            at(off_at) < last_on,
            "{name}: off before the power-on request"
        );

        // Nothing left behind: annotations gone, host on, status clean.
        let annotations = out.host.metadata.annotations.clone().unwrap_or_default();
        assert!(
            !annotations
                .keys()
                .any(|k| k.starts_with("reboot.metal3.io")),
            "{name}"
        );
        assert!(out.bmc.on);
        assert_eq!(status.powered_on, Some(true), "{name}");
        assert_eq!(status.error_count, 0, "{name}");
        let count = |reason: &str| out.events.iter().filter(|r| **r == reason).count();
        assert_eq!(count(ev::REBOOT_REQUESTED), 1, "{name}: {:?}", out.events);
        assert_eq!(count(ev::REBOOT_COMPLETED), 1, "{name}: {:?}", out.events);
        assert_eq!(
            count(ev::POWER_OFF_ESCALATED),
            usize::from(escalates),
            "{name}"
        );
        if name.contains("ACPI") {
            assert_eq!(
                count(ev::SOFT_POWER_OFF_FALLBACK),
                1,
                "{name}: {:?}",
                out.events
            );
        }
        assert_eq!(count(ev::POWER_STATE_CORRECTED), 0, "{name}");
        assert_eq!(count(ev::POWER_ACTION_TIMED_OUT), 0, "{name}");
        assert!(
            out.reconciles < 600,
            "{name}: {} reconciles — hot loop?",
            out.reconciles
        );
    }
}

/// The reconcile after everything settled changes nothing, whatever the order.
#[test]
fn settled_host_is_a_fixed_point() {
    let out = run(scenarios().remove(0));
    let snapshot =
        HostSnapshot::from_host(&out.host, BmcObservation::Power(ObservedPower::On), None);
    let d = decide(&snapshot, at(200_000));
    assert!(d.is_noop(), "{d:#?}");
}
