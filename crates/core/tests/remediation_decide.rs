//! Rules of remediation's `decide`, as tables (one observation in, the whole decision out:
//! record, actions in order, events with their warning flags, phase, blocker), then whole
//! remediations replayed through `decide` against a small simulated world (both triggers,
//! withdrawals, crashes between the record and the actions, retries and escalations, slots
//! and the reboot queue), then properties over arbitrary observations.
//!
//! Every decision in this file also goes through [`assert_safe`]: no DeleteNode unless the
//! host is confirmed off and carries this remediation's power-off, no ReleasePowerOff before
//! the remediation started, and a step never moves backwards except the retry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::reasons::remediation::event_reason as ev;
use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::HostReference;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HostRemediationStatus, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, NODE_SPEC_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, REMEDIATION_FAILED_ANNOTATION,
    REMEDIATION_HOST_ANNOTATION, REMEDIATION_HOST_BMC_ANNOTATION, REMEDIATION_JOINED_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION, REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION, RemediationPhase, RemediationStep,
};
use hostcycle_core::binding::BoundHost;
use hostcycle_core::remediation::escalation::allocate_slots;
use hostcycle_core::remediation::{
    Action, Blocker, Decision, Escalation, Observation, Record, RemediationHostView,
    RemediationNodeView, Trigger, acting_host, decide, off_confirmed,
};
use jiff::Timestamp;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Builders.

const NODE: &str = "worker-0";
const HOST: &str = "machines/host-0";
const HOST_UID: &str = "0b5e-host-uid";
const TIMEOUT: Duration = Duration::from_secs(600);
/// How long a power-off may take to be confirmed (deadline 300 s after the request).
const OFF_TIMEOUT: Duration = Duration::from_secs(300);
/// `lastUpdated` of a host status written after every request in the tables (staleness has
/// tables of its own).
const FRESH: i64 = 1_000_000;

/// 2025-01-01T00:00:00Z plus `s` seconds.
fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600 + s).unwrap()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The Node before the remediation: kubelet labels plus ones people and operators added.
fn node() -> RemediationNodeView {
    RemediationNodeView {
        labels: map(&[
            ("kubernetes.io/hostname", NODE),
            ("node-role.kubernetes.io/worker", ""),
            ("topology.kubernetes.io/zone", "rack-1"),
            ("example.com/team", "storage"),
        ]),
        annotations: map(&[
            (
                "machine.openshift.io/machine",
                "openshift-machine-api/worker-0",
            ),
            ("example.com/owner", "ops"),
        ]),
        ready: true,
        unschedulable: false,
        taints: Vec::new(),
        boot_id: None,
        volumes_in_use: 0,
    }
}

/// The same Node registered again by the kubelet: fresh labels only, one of which
/// (`topology.kubernetes.io/zone`) differs from the backup, and not Ready yet.
fn fresh_node() -> RemediationNodeView {
    RemediationNodeView {
        labels: map(&[
            ("kubernetes.io/hostname", NODE),
            ("kubernetes.io/arch", "amd64"),
            ("topology.kubernetes.io/zone", "rack-2"),
        ]),
        annotations: map(&[("node.alpha.kubernetes.io/ttl", "0")]),
        ready: false,
        unschedulable: false,
        taints: Vec::new(),
        boot_id: None,
        volumes_in_use: 0,
    }
}

/// `node` after a restore that adds what it lacks (keys already on it win).
fn merged(
    mut node: RemediationNodeView,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> RemediationNodeView {
    for (k, v) in labels {
        node.labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in annotations {
        node.annotations
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    node
}

/// An online host, on, without this remediation's power-off.
fn host_on() -> RemediationHostView {
    RemediationHostView {
        name: HOST.to_owned(),
        uid: HOST_UID.to_owned(),
        powered_on: Some(true),
        last_updated: Some(t(FRESH)),
        observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
        spec_bmc: hostcycle_api::ObservedBmc::default(),
        power_off_requested: false,
        online: true,
        externally_provisioned: false,
        error: None,
        cannot_power_off: None,
        marked_unhealthy: None,
    }
}

/// The binding `start` records.
fn bound() -> BoundHost {
    BoundHost {
        reference: HostReference {
            namespace: "machines".into(),
            name: "host-0".into(),
        },
        uid: HOST_UID.into(),
    }
}

/// Carries the power-off, still on.
fn host_requested_on() -> RemediationHostView {
    RemediationHostView {
        power_off_requested: true,
        ..host_on()
    }
}

/// Carries the power-off and is off.
fn host_off() -> RemediationHostView {
    RemediationHostView {
        powered_on: Some(false),
        ..host_requested_on()
    }
}

/// Powered on again (the power-off released).
fn host_back_on() -> RemediationHostView {
    host_on()
}

fn obs(trigger: Trigger) -> Observation {
    Observation {
        trigger,
        requested: true,
        target: Ok(host_on()),
        bound: None,
        power_off_timeout: OFF_TIMEOUT,
        node_name: Some(NODE.to_owned()),
        node: Some(node()),
        record: Record::default(),
        retry_limit: match trigger {
            Trigger::Request => 1,
            Trigger::MachineAnnotation => 0,
        },
        power_on_timeout: TIMEOUT,
        slot_free: true,
        queue_reboot_until: None,
        escalation: match trigger {
            Trigger::Request => Escalation::MarkOwnerRemediated,
            Trigger::MachineAnnotation => Escalation::DeleteMachine,
        },
        held_elsewhere: None,
        joined_running: None,
        clock_untrusted: None,
        release_strategy: Ok(hostcycle_core::remediation::release::ReleaseStrategy::DeleteNode),
        out_of_service_served: false,
        workloads: None,
        leave_off: false,
    }
}

trait ObsBuild {
    fn withdrawn(self) -> Self;
    fn host(self, host: RemediationHostView) -> Self;
    fn blocked_by(self, blocker: Blocker) -> Self;
    fn node(self, node: Option<RemediationNodeView>) -> Self;
    fn record(self, record: Record) -> Self;
    fn retry_limit(self, n: u32) -> Self;
    fn no_slot(self) -> Self;
    fn queue_until(self, s: i64) -> Self;
    fn escalation(self, e: Escalation) -> Self;
}

impl ObsBuild for Observation {
    fn withdrawn(mut self) -> Self {
        self.requested = false;
        self
    }
    fn host(mut self, host: RemediationHostView) -> Self {
        if self.record.host.is_some() {
            self.bound = Some(host.clone());
        }
        self.target = Ok(host);
        self
    }
    fn blocked_by(mut self, blocker: Blocker) -> Self {
        // A host not found is not there under the binding either.
        if matches!(blocker, Blocker::HostNotFound(_)) {
            self.bound = None;
        }
        self.target = Err(blocker);
        self
    }
    fn node(mut self, node: Option<RemediationNodeView>) -> Self {
        self.node = node;
        self
    }
    fn record(mut self, record: Record) -> Self {
        self.record = record;
        // The host under the binding is the one the lookup finds, unless a case says else.
        self.bound = match (&self.record.host, &self.target) {
            (Some(_), Ok(h)) => Some(h.clone()),
            _ => None,
        };
        self
    }
    fn retry_limit(mut self, n: u32) -> Self {
        self.retry_limit = n;
        self
    }
    fn no_slot(mut self) -> Self {
        self.slot_free = false;
        self
    }
    fn queue_until(mut self, s: i64) -> Self {
        self.queue_reboot_until = Some(t(s));
        self
    }
    fn escalation(mut self, e: Escalation) -> Self {
        self.escalation = e;
        self
    }
}

/// Started at -100 s on the host it bound, power-off requested.
fn powering_off() -> Record {
    Record {
        step: RemediationStep::PowerOffRequested,
        host: hostcycle_core::binding::BoundHost::parse(&format!("{HOST}/{HOST_UID}")),
        started_at: Some(t(-100)),
        cycle_started_at: Some(t(-100)),
        ..Record::default()
    }
}

/// Host seen off at -50 s and the Node's labels and annotations backed up.
fn backed_up() -> Record {
    Record {
        powered_off_at: Some(t(-50)),
        labels_backup: Some(node().labels),
        annotations_backup: Some(node().annotations),
        ..powering_off()
    }
}

/// The Node seen gone at -40 s.
fn released() -> Record {
    Record {
        step: RemediationStep::NodeReleased,
        node_released_at: Some(t(-40)),
        ..backed_up()
    }
}

/// Power-on requested at -30 s: waiting until +570 s.
fn powering_on() -> Record {
    Record {
        step: RemediationStep::PowerOnRequested,
        power_on_timeout_at: Some(t(570)),
        ..released()
    }
}

/// Backups restored (and forgotten): only waiting for Ready.
fn restored() -> Record {
    Record {
        labels_backup: None,
        annotations_backup: None,
        ..powering_on()
    }
}

fn with<F: FnOnce(&mut Record)>(mut r: Record, f: F) -> Record {
    f(&mut r);
    r
}

fn restore(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Action {
    Action::RestoreNode {
        labels: map(labels),
        annotations: map(annotations),
        cordon: false,
        taints: Vec::new(),
    }
}

/// The backup entries [`fresh_node`] lacks (its own `zone` wins).
fn restore_fresh() -> Action {
    restore(
        &[
            ("example.com/team", "storage"),
            ("node-role.kubernetes.io/worker", ""),
        ],
        &[
            ("example.com/owner", "ops"),
            (
                "machine.openshift.io/machine",
                "openshift-machine-api/worker-0",
            ),
        ],
    )
}

// ---------------------------------------------------------------------------------------
// Safety rules checked on every decision in this file.

fn rank(step: RemediationStep) -> u8 {
    match step {
        RemediationStep::NotStarted => 0,
        RemediationStep::PowerOffRequested => 1,
        RemediationStep::NodeReleased => 2,
        RemediationStep::PowerOnRequested => 3,
        RemediationStep::Done | RemediationStep::GaveUp | RemediationStep::Cancelled => 4,
    }
}

fn terminal(step: RemediationStep) -> bool {
    rank(step) == 4
}

fn assert_safe(obs: &Observation, d: &Decision, ctx: &str) {
    let host = acting_host(obs).host();
    // Off in a status written after the power-off request, without error, with the
    // power-off on the very host bound at the start.
    let off_and_fenced = host.is_some_and(|h| {
        h.powered_on == Some(false)
            && h.power_off_requested
            && h.error.is_none()
            && obs
                .record
                .cycle_started_at
                .is_some_and(|since| h.last_updated.is_some_and(|at| at > since))
    });
    if d.actions.contains(&Action::DeleteNode) {
        assert!(
            off_and_fenced,
            "{ctx}: DeleteNode while the host is not confirmed off with the power-off on it: {:?}\n{d:#?}",
            host
        );
        assert!(
            off_confirmed(host.unwrap(), &obs.record),
            "{ctx}: off_confirmed disagrees"
        );
        if let Some(bound) = &obs.record.host {
            assert_eq!(
                host.map(|h| h.uid.as_str()),
                Some(bound.uid.as_str()),
                "{ctx}: DeleteNode on a host other than the bound one"
            );
        }
        let written = d.record.as_ref().unwrap_or(&obs.record);
        assert!(
            written.labels_backup.is_some() && written.annotations_backup.is_some(),
            "{ctx}: DeleteNode without the backup in the record written ahead\n{d:#?}"
        );
        assert!(
            obs.requested || obs.record.labels_backup.is_some(),
            "{ctx}: a withdrawn remediation deleted a Node it had not backed up\n{d:#?}"
        );
    }
    if obs.record.step == RemediationStep::NotStarted {
        assert!(
            !d.actions.contains(&Action::ReleasePowerOff),
            "{ctx}: ReleasePowerOff before the remediation started\n{d:#?}"
        );
    }
    if obs.record.step == RemediationStep::PowerOffRequested
        && host.is_some_and(|h| h.power_off_requested)
    {
        assert!(
            !d.actions.contains(&Action::RequestPowerOff),
            "{ctx}: RequestPowerOff repeated although it is recorded and on the host\n{d:#?}"
        );
    }
    assert!(
        !(d.actions.contains(&Action::RequestPowerOff)
            && d.actions.contains(&Action::ReleasePowerOff)),
        "{ctx}: power-off requested and released at once\n{d:#?}"
    );
    if d.blocked.is_some() {
        assert!(
            d.record.is_none() && d.actions.is_empty(),
            "{ctx}: a blocked remediation did something\n{d:#?}"
        );
    }
    if let Some(next) = &d.record {
        let (from, to) = (obs.record.step, next.step);
        let retry = from == RemediationStep::PowerOnRequested
            && to == RemediationStep::PowerOffRequested
            && next.retry_count == obs.record.retry_count + 1;
        if terminal(from) {
            assert_eq!(from, to, "{ctx}: left a finished step\n{d:#?}");
        } else {
            assert!(
                rank(to) >= rank(from) || retry,
                "{ctx}: step moved backwards {from:?} → {to:?}\n{d:#?}"
            );
        }
        if !retry {
            assert_eq!(
                next.retry_count, obs.record.retry_count,
                "{ctx}: retry_count changed outside a retry\n{d:#?}"
            );
        } else {
            assert!(
                obs.requested && obs.record.retry_count < obs.retry_limit,
                "{ctx}: retried without retries left or without a request\n{d:#?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Table machinery.

struct Case {
    name: &'static str,
    obs: Observation,
    now: i64,
    record: Option<Record>,
    actions: Vec<Action>,
    /// Reasons and warning flags, exactly, in order.
    events: Vec<(&'static str, bool)>,
    phase: RemediationPhase,
    blocked: Option<&'static str>,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            obs: obs(Trigger::Request),
            now: 0,
            record: None,
            actions: Vec::new(),
            events: Vec::new(),
            phase: RemediationPhase::Pending,
            blocked: None,
        }
    }
}

fn check(cases: Vec<Case>) {
    for case in cases {
        let name = case.name;
        let d = decide(&case.obs, t(case.now));
        assert_safe(&case.obs, &d, name);
        assert_eq!(d.record, case.record, "{name}: record\n{d:#?}");
        assert_eq!(d.actions, case.actions, "{name}: actions\n{d:#?}");
        let events: Vec<(&str, bool)> = d
            .events
            .iter()
            .map(|e| (e.reason, e.is_warning()))
            .collect();
        assert_eq!(events, case.events, "{name}: events\n{d:#?}");
        assert_eq!(d.phase, case.phase, "{name}: phase\n{d:#?}");
        assert_eq!(d.blocked, case.blocked, "{name}: blocked\n{d:#?}");
        assert!(
            !d.message.is_empty(),
            "{name}: a decision always says what it does"
        );
        for e in &d.events {
            assert!(
                !e.message.is_empty(),
                "{name}: event {} without a message",
                e.reason
            );
        }
        // The same observation decided again gives the same decision (a restart before
        // anything was written changes nothing).
        assert_eq!(
            decide(&case.obs, t(case.now)),
            d,
            "{name}: not deterministic"
        );
    }
}

/// The record `start` writes at `now` (0).
fn started(base: Record) -> Record {
    Record {
        step: RemediationStep::PowerOffRequested,
        host: Some(bound()),
        bmc: Some(hostcycle_api::ObservedBmc::default()),
        started_at: base.started_at.or(Some(t(0))),
        cycle_started_at: Some(t(0)),
        release: Some(hostcycle_core::remediation::release::Release::DeleteNode),
        ..base
    }
}

const STARTED: (&str, bool) = (ev::STARTED, false);
const NODE_NOT_FOUND: (&str, bool) = (ev::NODE_NOT_FOUND, true);
const BLOCKED: (&str, bool) = (ev::BLOCKED, true);
const POWERED_OFF: (&str, bool) = (ev::POWERED_OFF, false);
const NODE_DELETED: (&str, bool) = (ev::NODE_DELETED, false);
const NODE_RELEASED: (&str, bool) = (ev::NODE_RELEASED, false);
const POWER_ON_REQUESTED: (&str, bool) = (ev::POWER_ON_REQUESTED, false);
const NODE_RESTORED: (&str, bool) = (ev::NODE_RESTORED, false);
const SUCCEEDED: (&str, bool) = (ev::SUCCEEDED, false);
const RETRYING: (&str, bool) = (ev::RETRYING, true);
const FAILED: (&str, bool) = (ev::FAILED, true);
const ESCALATED: (&str, bool) = (ev::ESCALATED, true);
const CANCELLED: (&str, bool) = (ev::CANCELLED, false);
const HOST_LOST: (&str, bool) = (ev::HOST_LOST, true);

// ---------------------------------------------------------------------------------------
// NotStarted.

#[test]
fn not_started_starts_with_a_hard_power_off_unless_blocked_or_waiting() {
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let o = || obs(trigger);
        cases.extend([
            Case {
                name: "not requested → nothing, no record, no event",
                obs: o().withdrawn(),
                ..Default::default()
            },
            Case {
                name: "requested, host on, Node present → record PowerOffRequested, then RequestPowerOff",
                obs: o(),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "the Node is already gone → started anyway (the host is still fenced) + NodeNotFound warning",
                obs: o().node(None),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED, NODE_NOT_FOUND],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "a start time already known (the request's creation) is kept; the cycle starts now",
                obs: o().record(Record {
                    started_at: Some(t(-30)),
                    ..Record::default()
                }),
                record: Some(started(Record {
                    started_at: Some(t(-30)),
                    ..Record::default()
                })),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host already off → only RequestPowerOff: the Node is never deleted in the start round",
                obs: o().host(RemediationHostView {
                    powered_on: Some(false),
                    ..host_on()
                }),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host off and already carrying the power-off (left over) → still only RequestPowerOff",
                obs: o().host(host_off()),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host controller reports an error → start anyway (the power-off may still work)",
                obs: o().host(RemediationHostView {
                    error: Some("BMC unreachable".into()),
                    ..host_on()
                }),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "no host named → blocked HostNotReferenced, Warning, nothing done",
                obs: o().blocked_by(Blocker::HostNotReferenced),
                events: vec![BLOCKED],
                blocked: Some("HostNotReferenced"),
                ..Default::default()
            },
            Case {
                name: "host missing → blocked HostNotFound, Warning, nothing done",
                obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
                events: vec![BLOCKED],
                blocked: Some("HostNotFound"),
                ..Default::default()
            },
            Case {
                name: "nodeRef unset → blocked NodeRefUnset, Warning, nothing done",
                obs: o().blocked_by(Blocker::NodeRefUnset),
                events: vec![BLOCKED],
                blocked: Some("NodeRefUnset"),
                ..Default::default()
            },
            Case {
                name: "host online: false → blocked HostOffline (it would never power back on)",
                obs: o().host(RemediationHostView {
                    online: false,
                    ..host_on()
                }),
                events: vec![BLOCKED],
                blocked: Some("HostOffline"),
                ..Default::default()
            },
            Case {
                name: "online: false also blocks when the host is already off",
                obs: o().host(RemediationHostView {
                    online: false,
                    powered_on: Some(false),
                    ..host_on()
                }),
                events: vec![BLOCKED],
                blocked: Some("HostOffline"),
                ..Default::default()
            },
            Case {
                name: "not requested wins over a blocker: no Warning for a remediation nobody asks for",
                obs: o().withdrawn().blocked_by(Blocker::HostNotFound(HOST.into())),
                ..Default::default()
            },
            Case {
                name: "blocked wins over a busy slot and a queue reboot: the Warning is shown at once",
                obs: o().blocked_by(Blocker::HostNotReferenced).no_slot().queue_until(300),
                events: vec![BLOCKED],
                blocked: Some("HostNotReferenced"),
                ..Default::default()
            },
            Case {
                name: "no free slot (maxConcurrentRemediations) → waits: no record, no event, not blocked",
                obs: o().no_slot(),
                ..Default::default()
            },
            Case {
                name: "the reboot queue is rebooting the node → waits until its boot deadline",
                obs: o().queue_until(300),
                ..Default::default()
            },
            Case {
                name: "queue reboot and no slot → waits",
                obs: o().queue_until(300).no_slot(),
                ..Default::default()
            },
            Case {
                name: "the queue's boot deadline is now → starts",
                obs: o().queue_until(0),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "the queue's boot deadline passed → starts",
                obs: o().queue_until(-5),
                record: Some(started(Record::default())),
                actions: vec![Action::RequestPowerOff],
                events: vec![STARTED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "the queue's boot deadline passed but no slot → waits for the slot",
                obs: o().queue_until(-5).no_slot(),
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn waiting_for_the_queue_looks_again_right_after_its_boot_deadline() {
    for (now, until) in [(0, 300), (100, 300), (299, 300)] {
        let d = decide(&obs(Trigger::Request).queue_until(until), t(now));
        let left = Duration::from_secs((until - now) as u64);
        let requeue = d.requeue.expect("a deadline to wake up at");
        assert!(
            requeue >= left && requeue <= left + Duration::from_secs(1),
            "now {now}, until {until}: requeue {requeue:?}"
        );
        assert!(d.message.contains(NODE), "{}", d.message);
    }
}

#[test]
fn a_blocker_message_says_what_to_fix() {
    for (blocker, needle) in [
        (Blocker::HostNotReferenced, "metal3.io/BareMetalHost"),
        (Blocker::HostNotFound(HOST.into()), HOST),
        (Blocker::NodeRefUnset, "nodeRef"),
    ] {
        let d = decide(&obs(Trigger::Request).blocked_by(blocker.clone()), t(0));
        assert!(d.message.contains(needle), "{blocker:?}: {}", d.message);
        assert!(
            d.events[0].message.contains(needle),
            "{blocker:?}: {:?}",
            d.events
        );
    }
    let d = decide(
        &obs(Trigger::Request).host(RemediationHostView {
            online: false,
            ..host_on()
        }),
        t(0),
    );
    assert!(
        d.message.contains("online: false") && d.message.contains(HOST),
        "{}",
        d.message
    );
}

// ---------------------------------------------------------------------------------------
// PowerOffRequested.

#[test]
fn power_off_requested_releases_the_node_only_once_the_host_is_off() {
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let o = || obs(trigger).record(powering_off());
        cases.extend([
            Case {
                name: "recorded but not on the host yet (crash before the annotation) → RequestPowerOff again, record unchanged",
                obs: o(),
                actions: vec![Action::RequestPowerOff],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host off for another reason but without the power-off → RequestPowerOff, never DeleteNode",
                obs: o().host(RemediationHostView {
                    powered_on: Some(false),
                    ..host_on()
                }),
                actions: vec![Action::RequestPowerOff],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "power-off on the host, host still on → waits (no duplicate RequestPowerOff)",
                obs: o().host(host_requested_on()),
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "power state unknown (poweredOn unset) → waits, never DeleteNode",
                obs: o().host(RemediationHostView {
                    powered_on: None,
                    ..host_requested_on()
                }),
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host controller failing while still on → waits",
                obs: o().host(RemediationHostView {
                    error: Some("BMC unreachable".into()),
                    ..host_requested_on()
                }),
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host off → back up the Node in the record, then DeleteNode",
                obs: o().host(host_off()),
                record: Some(with(powering_off(), |r| {
                    r.powered_off_at = Some(t(0));
                    r.labels_backup = Some(node().labels);
                    r.annotations_backup = Some(node().annotations);
                })),
                actions: vec![Action::DeleteNode],
                events: vec![POWERED_OFF, NODE_DELETED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "a Node without labels or annotations → empty backups (recorded), then DeleteNode",
                obs: o().host(host_off()).node(Some(RemediationNodeView::default())),
                record: Some(with(powering_off(), |r| {
                    r.powered_off_at = Some(t(0));
                    r.labels_backup = Some(BTreeMap::new());
                    r.annotations_backup = Some(BTreeMap::new());
                })),
                actions: vec![Action::DeleteNode],
                events: vec![POWERED_OFF, NODE_DELETED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "backup recorded, Node still there (deletion not seen yet) → DeleteNode again; backup and power-off time kept",
                obs: o().record(backed_up()).host(host_off()).node(Some(fresh_node())),
                record: Some(backed_up()),
                actions: vec![Action::DeleteNode],
                events: vec![NODE_DELETED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host off, Node gone → NodeReleased recorded, no action",
                obs: o().host(host_off()).node(None),
                record: Some(with(powering_off(), |r| {
                    r.step = RemediationStep::NodeReleased;
                    r.powered_off_at = Some(t(0));
                    r.node_released_at = Some(t(0));
                })),
                events: vec![POWERED_OFF, NODE_RELEASED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "backed up and the Node gone → NodeReleased, the backup kept",
                obs: o().record(backed_up()).host(host_off()).node(None),
                record: Some(with(backed_up(), |r| {
                    r.step = RemediationStep::NodeReleased;
                    r.node_released_at = Some(t(0));
                })),
                events: vec![NODE_RELEASED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host missing mid-flow → waits with a Warning, nothing done",
                obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
                events: vec![HOST_LOST],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "host missing after the backup → waits with a Warning, no DeleteNode",
                obs: o().record(backed_up()).blocked_by(Blocker::HostNotFound(HOST.into())),
                events: vec![HOST_LOST],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "no free slot once started → ignored",
                obs: o().no_slot().host(host_off()).node(None),
                record: Some(with(powering_off(), |r| {
                    r.step = RemediationStep::NodeReleased;
                    r.powered_off_at = Some(t(0));
                    r.node_released_at = Some(t(0));
                })),
                events: vec![POWERED_OFF, NODE_RELEASED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "a queue reboot once started → ignored",
                obs: o().queue_until(300).host(host_requested_on()),
                phase: RemediationPhase::Running,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn waiting_for_the_power_off_says_what_the_host_controller_reports() {
    let d = decide(
        &obs(Trigger::Request)
            .record(powering_off())
            .host(RemediationHostView {
                error: Some("BMC unreachable".into()),
                ..host_requested_on()
            }),
        t(0),
    );
    assert!(d.message.contains("BMC unreachable"), "{}", d.message);
    assert!(d.requeue.is_some(), "a stuck power-off is looked at again");
}

#[test]
fn a_trigger_withdrawn_before_the_node_is_backed_up_cancels_and_releases_the_host() {
    let mut cases = Vec::new();
    for (trigger, actions) in [
        (Trigger::Request, vec![Action::ReleasePowerOff]),
        (
            Trigger::MachineAnnotation,
            vec![Action::ReleasePowerOff, Action::FinishAnnotationFlow],
        ),
    ] {
        let o = || obs(trigger).record(powering_off()).withdrawn();
        let cancelled = || {
            Some(with(powering_off(), |r| {
                r.step = RemediationStep::Cancelled
            }))
        };
        cases.extend([
            Case {
                name: "power-off not on the host yet → Cancelled, release (idempotent)",
                obs: o(),
                record: cancelled(),
                actions: actions.clone(),
                events: vec![CANCELLED],
                ..Default::default()
            },
            Case {
                name: "host still on → Cancelled, released",
                obs: o().host(host_requested_on()),
                record: cancelled(),
                actions: actions.clone(),
                events: vec![CANCELLED],
                ..Default::default()
            },
            Case {
                name: "host already off, Node present → Cancelled, released; the Node is NOT deleted",
                obs: o().host(host_off()),
                record: cancelled(),
                actions: actions.clone(),
                events: vec![CANCELLED],
                ..Default::default()
            },
            Case {
                name: "host off, Node already gone by itself → Cancelled, released",
                obs: o().host(host_off()).node(None),
                record: cancelled(),
                actions: actions.clone(),
                events: vec![CANCELLED],
                ..Default::default()
            },
            Case {
                name: "host missing → Cancelled, release attempted",
                obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
                record: cancelled(),
                actions: actions.clone(),
                events: vec![CANCELLED],
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn a_trigger_withdrawn_after_the_backup_finishes_the_release_and_the_power_on() {
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let o = || obs(trigger).withdrawn();
        cases.extend([
            Case {
                name: "backed up, Node still there → DeleteNode (its deletion was decided and may have happened)",
                obs: o().record(backed_up()).host(host_off()),
                record: Some(backed_up()),
                actions: vec![Action::DeleteNode],
                events: vec![NODE_DELETED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "backed up, Node gone → NodeReleased",
                obs: o().record(backed_up()).host(host_off()).node(None),
                record: Some(with(backed_up(), |r| {
                    r.step = RemediationStep::NodeReleased;
                    r.node_released_at = Some(t(0));
                })),
                events: vec![NODE_RELEASED],
                phase: RemediationPhase::Running,
                ..Default::default()
            },
            Case {
                name: "NodeReleased → the power-on goes ahead",
                obs: o().record(released()).host(host_off()).node(None),
                record: Some(with(released(), |r| {
                    r.step = RemediationStep::PowerOnRequested;
                    r.power_on_timeout_at = Some(t(600));
                })),
                actions: vec![Action::ReleasePowerOff],
                events: vec![POWER_ON_REQUESTED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

// ---------------------------------------------------------------------------------------
// NodeReleased.

#[test]
fn node_released_records_the_deadline_then_releases_the_power_off() {
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let o = || obs(trigger).record(released()).host(host_off()).node(None);
        let powered_on = |timeout_s: i64| {
            Some(with(released(), |r| {
                r.step = RemediationStep::PowerOnRequested;
                r.power_on_timeout_at = Some(t(timeout_s));
            }))
        };
        cases.extend([
            Case {
                name: "→ PowerOnRequested with power-on-will-timeout-at = now + timeout, then ReleasePowerOff",
                obs: o(),
                record: powered_on(600),
                actions: vec![Action::ReleasePowerOff],
                events: vec![POWER_ON_REQUESTED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "the deadline follows the configured timeout",
                obs: Observation {
                    power_on_timeout: Duration::from_secs(120),
                    ..o()
                },
                now: 7,
                record: powered_on(127),
                actions: vec![Action::ReleasePowerOff],
                events: vec![POWER_ON_REQUESTED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "host missing → still records and releases (the host is never left off)",
                obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
                record: powered_on(600),
                actions: vec![Action::ReleasePowerOff],
                events: vec![POWER_ON_REQUESTED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "the Node already registered again → the power-on is still recorded first",
                obs: o().node(Some(fresh_node())),
                record: powered_on(600),
                actions: vec![Action::ReleasePowerOff],
                events: vec![POWER_ON_REQUESTED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

// ---------------------------------------------------------------------------------------
// PowerOnRequested.

#[test]
fn power_on_requested_restores_the_node_then_finishes_when_it_is_ready() {
    let mut cases = Vec::new();
    for (trigger, finish) in [
        // A request of a Cluster API Machine: its ExternallyRemediated condition goes.
        (Trigger::Request, vec![Action::ClearExternallyRemediated]),
        (
            Trigger::MachineAnnotation,
            vec![Action::FinishAnnotationFlow],
        ),
    ] {
        let o = || {
            obs(trigger)
                .record(powering_on())
                .host(host_back_on())
                .node(None)
        };
        let done = |r: Record| {
            Some(Record {
                step: RemediationStep::Done,
                labels_backup: None,
                annotations_backup: None,
                ..r
            })
        };
        cases.extend([
            Case {
                name: "the power-off still on the host (crash after the record) → ReleasePowerOff again, record unchanged",
                obs: o().host(host_off()),
                actions: vec![Action::ReleasePowerOff],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "the power-off still on the host and the deadline passed → release first, never give up with the host off",
                obs: o().host(host_off()),
                now: 10_000,
                actions: vec![Action::ReleasePowerOff],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "Node not registered yet → waits",
                obs: o(),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "Node registered again with fresh kubelet labels → RestoreNode with what it lacks (its own keys win); the backup stays recorded until the Node has it",
                obs: o().node(Some(fresh_node())),
                actions: vec![restore_fresh()],
                events: vec![NODE_RESTORED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "Node registered and Ready but not restored → restore first, not done yet",
                obs: o().node(Some(RemediationNodeView {
                    ready: true,
                    ..fresh_node()
                })),
                actions: vec![restore_fresh()],
                events: vec![NODE_RESTORED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "restored, not Ready yet → the backup is forgotten, waits for Ready",
                obs: o().node(Some(merged(
                    fresh_node(),
                    &node().labels,
                    &node().annotations,
                ))),
                record: Some(restored()),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "restored and Ready → Done (annotation flow: FinishAnnotationFlow)",
                obs: o().node(Some(RemediationNodeView {
                    ready: true,
                    ..merged(fresh_node(), &node().labels, &node().annotations)
                })),
                record: done(powering_on()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "backup forgotten earlier, Node Ready → Done",
                obs: o().record(restored()).node(Some(RemediationNodeView {
                    ready: true,
                    ..fresh_node()
                })),
                record: done(restored()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "backup forgotten, Node not Ready before the deadline → waits",
                obs: o().record(restored()).node(Some(fresh_node())),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "the Node was gone from the start (no backup), registers Ready → Done",
                obs: o()
                    .record(with(powering_on(), |r| {
                        r.labels_backup = None;
                        r.annotations_backup = None;
                    }))
                    .node(Some(RemediationNodeView {
                        ready: true,
                        ..fresh_node()
                    })),
                record: done(powering_on()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "withdrawn meanwhile → the flow still restores the Node",
                obs: o().withdrawn().node(Some(fresh_node())),
                actions: vec![restore_fresh()],
                events: vec![NODE_RESTORED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "withdrawn meanwhile → the flow still finishes (and cleans up)",
                obs: o().withdrawn().record(restored()).node(Some(node())),
                record: done(restored()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "the Node came back Ready just after the deadline (not noticed yet) → restore, no retry",
                obs: o().node(Some(RemediationNodeView {
                    ready: true,
                    ..fresh_node()
                })),
                now: 10_000,
                actions: vec![restore_fresh()],
                events: vec![NODE_RESTORED],
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "restored and Ready after the deadline → Done, no retry",
                obs: o().record(restored()).node(Some(node())),
                now: 10_000,
                record: done(restored()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "host missing before the deadline → waits",
                obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "no free slot once started → ignored",
                obs: o().no_slot().record(restored()).node(Some(node())),
                record: done(restored()),
                actions: finish.clone(),
                events: vec![SUCCEEDED],
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn power_on_requested_without_a_deadline_records_one_instead_of_giving_up() {
    // A lost or unreadable power-on-will-timeout-at (hand-edited, malformed) must not be
    // read as "timed out": that would escalate (delete the Machine) at once.
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let no_deadline = || with(powering_on(), |r| r.power_on_timeout_at = None);
        let o = || obs(trigger).record(no_deadline()).host(host_back_on());
        cases.extend([
            Case {
                name: "Node absent, no deadline → deadline = now + timeout recorded, waits",
                obs: o().node(None),
                now: 40,
                record: Some(with(no_deadline(), |r| r.power_on_timeout_at = Some(t(640)))),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
            Case {
                name: "Node back but not Ready, restored, no deadline → deadline recorded with the backup forgotten",
                obs: o()
                    .node(Some(merged(fresh_node(), &node().labels, &node().annotations))),
                record: Some(with(no_deadline(), |r| {
                    r.power_on_timeout_at = Some(t(600));
                    r.labels_backup = None;
                    r.annotations_backup = None;
                })),
                phase: RemediationPhase::Waiting,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn a_node_not_back_by_the_deadline_retries_while_retries_last_then_escalates() {
    let retried = |from: Record| {
        Some(Record {
            step: RemediationStep::PowerOffRequested,
            retry_count: from.retry_count + 1,
            cycle_started_at: Some(t(600)),
            powered_off_at: None,
            node_released_at: None,
            power_on_timeout_at: None,
            ..from
        })
    };
    let gave_up = |from: Record| {
        let r = Record {
            step: RemediationStep::GaveUp,
            ..from
        };
        Some(r)
    };
    let o = || {
        obs(Trigger::Request)
            .record(powering_on())
            .host(host_back_on())
            .node(None)
    };
    let cases = vec![
        Case {
            name: "one second before the deadline → waits",
            obs: o(),
            now: 569,
            phase: RemediationPhase::Waiting,
            ..Default::default()
        },
        Case {
            name: "at the deadline, retries left → another power cycle: PowerOffRequested, retry_count+1, cycle times reset, backups kept",
            obs: o(),
            now: 600,
            record: retried(powering_on()),
            actions: vec![Action::RequestPowerOff],
            events: vec![RETRYING],
            phase: RemediationPhase::Running,
            ..Default::default()
        },
        Case {
            name: "Node back but never Ready (restored) → retried too, the new cycle backs up the restored Node",
            obs: o()
                .record(restored())
                .node(Some(node()))
                .node(Some(RemediationNodeView {
                    ready: false,
                    ..node()
                })),
            now: 600,
            record: retried(restored()),
            actions: vec![Action::RequestPowerOff],
            events: vec![RETRYING],
            phase: RemediationPhase::Running,
            ..Default::default()
        },
        Case {
            name: "retry_limit 3, one retry done → retried again",
            obs: o()
                .retry_limit(3)
                .record(with(powering_on(), |r| r.retry_count = 1)),
            now: 600,
            record: retried(with(powering_on(), |r| r.retry_count = 1)),
            actions: vec![Action::RequestPowerOff],
            events: vec![RETRYING],
            phase: RemediationPhase::Running,
            ..Default::default()
        },
        Case {
            name: "retries exhausted, Cluster API Machine → GaveUp, host marked unhealthy (CAPM3), Escalate(MarkOwnerRemediated)",
            obs: o().record(with(powering_on(), |r| r.retry_count = 1)),
            now: 600,
            record: gave_up(with(powering_on(), |r| r.retry_count = 1)),
            actions: vec![
                Action::MarkHostUnhealthy,
                Action::Escalate(Escalation::MarkOwnerRemediated),
            ],
            events: vec![FAILED, ESCALATED],
            phase: RemediationPhase::Failed,
            ..Default::default()
        },
        Case {
            name: "retries exhausted, reprovisionable OpenShift Machine → GaveUp, Escalate(DeleteMachine), phase Deleting machine",
            obs: o()
                .escalation(Escalation::DeleteMachine)
                .record(with(powering_on(), |r| r.retry_count = 1)),
            now: 600,
            record: gave_up(with(powering_on(), |r| r.retry_count = 1)),
            actions: vec![Action::Escalate(Escalation::DeleteMachine)],
            events: vec![FAILED, ESCALATED],
            phase: RemediationPhase::DeletingMachine,
            ..Default::default()
        },
        Case {
            name: "retries exhausted, no escalation → GaveUp, no action, two Warnings (failed, why not escalated)",
            obs: o()
                .escalation(Escalation::None("no Machine".into()))
                .record(with(powering_on(), |r| r.retry_count = 1)),
            now: 600,
            record: gave_up(with(powering_on(), |r| r.retry_count = 1)),
            events: vec![FAILED, FAILED],
            phase: RemediationPhase::Failed,
            ..Default::default()
        },
        Case {
            name: "retry_limit 0 → gives up after the first cycle",
            obs: o().retry_limit(0),
            now: 600,
            record: gave_up(powering_on()),
            actions: vec![
                Action::MarkHostUnhealthy,
                Action::Escalate(Escalation::MarkOwnerRemediated),
            ],
            events: vec![FAILED, ESCALATED],
            phase: RemediationPhase::Failed,
            ..Default::default()
        },
        Case {
            name: "annotation flow (retry_limit 0) → gives up after one cycle, DeleteMachine",
            obs: obs(Trigger::MachineAnnotation)
                .record(powering_on())
                .host(host_back_on())
                .node(None),
            now: 600,
            record: gave_up(powering_on()),
            actions: vec![Action::Escalate(Escalation::DeleteMachine)],
            events: vec![FAILED, ESCALATED],
            phase: RemediationPhase::DeletingMachine,
            ..Default::default()
        },
        Case {
            name: "withdrawn with retries left → no retry, gives up without escalating",
            obs: o().withdrawn(),
            now: 600,
            record: gave_up(powering_on()),
            events: vec![FAILED, FAILED],
            phase: RemediationPhase::Failed,
            ..Default::default()
        },
        Case {
            name: "withdrawn, DeleteMachine configured → gives up without deleting the Machine",
            obs: o().withdrawn().escalation(Escalation::DeleteMachine),
            now: 600,
            record: gave_up(powering_on()),
            events: vec![FAILED, FAILED],
            phase: RemediationPhase::Failed,
            ..Default::default()
        },
        Case {
            name: "host missing at the deadline → retried (the power-off waits for the host)",
            obs: o().blocked_by(Blocker::HostNotFound(HOST.into())),
            now: 600,
            record: retried(powering_on()),
            actions: vec![Action::RequestPowerOff],
            events: vec![RETRYING],
            phase: RemediationPhase::Running,
            ..Default::default()
        },
    ];
    // The failure is recorded in words: fill the expected one from the decision's own
    // text after checking it says what happened.
    let cases = cases
        .into_iter()
        .map(|mut c| {
            if let Some(r) = c
                .record
                .as_mut()
                .filter(|r| r.step == RemediationStep::GaveUp)
            {
                let d = decide(&c.obs, t(c.now));
                let failure = d
                    .record
                    .as_ref()
                    .and_then(|r| r.failure.clone())
                    .unwrap_or_default();
                assert!(
                    failure.contains(NODE)
                        && failure
                            .contains(&format!("{} power cycle", c.obs.record.retry_count + 1)),
                    "{}: failure {failure:?}",
                    c.name
                );
                r.failure = Some(failure);
            }
            c
        })
        .collect();
    check(cases);
}

#[test]
fn the_retry_event_counts_power_cycles() {
    let d = decide(
        &obs(Trigger::Request)
            .retry_limit(3)
            .record(with(powering_on(), |r| r.retry_count = 1))
            .host(host_back_on())
            .node(None),
        t(600),
    );
    assert!(
        d.events[0].message.contains("power cycle 3 of 4"),
        "{:?}",
        d.events
    );
}

// ---------------------------------------------------------------------------------------
// Finished steps.

#[test]
fn finished_steps_do_nothing_but_release_a_host_left_off_and_restore_a_late_node() {
    let gave_up = || {
        with(powering_on(), |r| {
            r.step = RemediationStep::GaveUp;
            r.failure = Some("node worker-0 did not come back".into());
        })
    };
    let done = || with(restored(), |r| r.step = RemediationStep::Done);
    let cancelled = || with(powering_off(), |r| r.step = RemediationStep::Cancelled);
    let mut cases = Vec::new();
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let o = || obs(trigger).host(host_back_on());
        // The annotation flow's record of an end exists only while its finish has not gone
        // through (a restart between the record and FinishAnnotationFlow): finished again.
        let then_finish = |mut actions: Vec<Action>| {
            if trigger == Trigger::MachineAnnotation {
                actions.push(Action::FinishAnnotationFlow);
            }
            actions
        };
        cases.extend([
            Case {
                name: "Done → nothing (the annotation flow: its finish again)",
                obs: o().record(done()),
                actions: then_finish(vec![]),
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "Done, withdrawn → nothing (the annotation flow: its finish again)",
                obs: o().record(done()).withdrawn(),
                actions: then_finish(vec![]),
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "Done, Node gone again → nothing (a new remediation is a new trigger)",
                obs: o().record(done()).node(None),
                actions: then_finish(vec![]),
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "Cancelled → nothing (the annotation flow: its finish again)",
                obs: o().record(cancelled()),
                actions: then_finish(vec![]),
                ..Default::default()
            },
            Case {
                name: "Cancelled, the power-off still on the host (crash after the record) → ReleasePowerOff: the host is never left off",
                obs: o().record(cancelled()).withdrawn().host(host_off()),
                actions: then_finish(vec![Action::ReleasePowerOff]),
                ..Default::default()
            },
            Case {
                name: "Done, the power-off still on the host → ReleasePowerOff",
                obs: o().record(done()).host(host_off()),
                actions: then_finish(vec![Action::ReleasePowerOff]),
                phase: RemediationPhase::Succeeded,
                ..Default::default()
            },
            Case {
                name: "GaveUp, Node absent → nothing (escalation was done once)",
                obs: o().record(gave_up()).node(None),
                phase: if trigger == Trigger::Request {
                    RemediationPhase::Failed
                } else {
                    RemediationPhase::DeletingMachine
                },
                ..Default::default()
            },
            Case {
                name: "GaveUp, the host came back and still carries the power-off → ReleasePowerOff",
                obs: o().record(gave_up()).node(None).host(host_off()),
                actions: vec![Action::ReleasePowerOff],
                phase: if trigger == Trigger::Request {
                    RemediationPhase::Failed
                } else {
                    RemediationPhase::DeletingMachine
                },
                ..Default::default()
            },
            Case {
                name: "GaveUp, the Node turns up late → its labels are restored (what it lacks), the backup kept until it has them",
                obs: o().record(gave_up()).node(Some(fresh_node())),
                actions: vec![restore_fresh()],
                phase: if trigger == Trigger::Request {
                    RemediationPhase::Failed
                } else {
                    RemediationPhase::DeletingMachine
                },
                ..Default::default()
            },
            Case {
                name: "GaveUp, the late Node has every backed-up key → the backup is forgotten",
                obs: o()
                    .record(gave_up())
                    .node(Some(merged(fresh_node(), &node().labels, &node().annotations))),
                record: Some(with(gave_up(), |r| {
                    r.labels_backup = None;
                    r.annotations_backup = None;
                })),
                phase: if trigger == Trigger::Request {
                    RemediationPhase::Failed
                } else {
                    RemediationPhase::DeletingMachine
                },
                ..Default::default()
            },
            Case {
                name: "GaveUp without an escalation → Failed",
                obs: o()
                    .record(gave_up())
                    .node(None)
                    .escalation(Escalation::None("no Machine".into())),
                phase: RemediationPhase::Failed,
                ..Default::default()
            },
        ]);
    }
    check(cases);
}

#[test]
fn the_gave_up_message_carries_the_recorded_failure() {
    let d = decide(
        &obs(Trigger::Request).record(with(powering_on(), |r| {
            r.step = RemediationStep::GaveUp;
            r.failure = Some("the BMC is on fire".into());
        })),
        t(0),
    );
    assert!(d.message.contains("the BMC is on fire"), "{}", d.message);
}

// ---------------------------------------------------------------------------------------
// A small world: the host's power follows the power-off, the Node goes when deleted and
// registers again (fresh kubelet labels, not Ready, then Ready) after the power-on; the
// record lives where the trigger keeps it (a request's status or the Machine's
// annotations) and is read back from there every round.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RequestPowerOff,
    ReleasePowerOff,
    DeleteNode,
    RestoreNode,
    FinishAnnotationFlow,
    MarkHostUnhealthy,
    ClearExternallyRemediated,
    Escalate,
    Release,
}

fn kind(a: &Action) -> Kind {
    match a {
        Action::RequestPowerOff => Kind::RequestPowerOff,
        Action::ReleasePowerOff => Kind::ReleasePowerOff,
        Action::DeleteNode => Kind::DeleteNode,
        Action::RestoreNode { .. } => Kind::RestoreNode,
        Action::FinishAnnotationFlow => Kind::FinishAnnotationFlow,
        Action::MarkHostUnhealthy => Kind::MarkHostUnhealthy,
        Action::ClearExternallyRemediated => Kind::ClearExternallyRemediated,
        Action::Escalate(_) => Kind::Escalate,
        Action::Release(_) => Kind::Release,
    }
}

#[derive(Debug, Clone)]
struct Round {
    now: i64,
    step: RemediationStep,
    decision: Decision,
}

#[derive(Debug, Clone)]
struct World {
    trigger: Trigger,
    now: i64,
    /// The request exists (request flow).
    request: bool,
    status: HostRemediationStatus,
    created: Timestamp,
    /// The Machine's annotations (annotation flow; the trigger and the markers hostcycle
    /// writes for other tools — never read back).
    machine: BTreeMap<String, String>,
    /// The annotation flow's record, where only hostcycle writes (a ConfigMap).
    stored: Option<hostcycle_api::remediation::MachineFlowRecord>,
    host_exists: bool,
    host_annotated: bool,
    powered_on: Option<bool>,
    /// When the host controller last wrote the host's status.
    host_written: Option<i64>,
    /// The BMC does not act while set.
    bmc_stuck: bool,
    node: Option<RemediationNodeView>,
    /// The Node registers again after a power-on.
    node_returns: bool,
    /// Ticks since the host was seen on with no Node (registration), or since registration.
    node_age: u32,
    retry_limit: u32,
    escalation: Escalation,
    slot_free: bool,
    queue_reboot_until: Option<Timestamp>,
    escalations: Vec<Escalation>,
    rounds: Vec<Round>,
}

const TICK: i64 = 10;

impl World {
    fn new(trigger: Trigger) -> World {
        let mut machine = map(&[("metal3.io/BareMetalHost", HOST)]);
        if trigger == Trigger::MachineAnnotation {
            machine.insert(EXTERNAL_REMEDIATION_ANNOTATION.into(), String::new());
        }
        World {
            trigger,
            now: 0,
            request: trigger == Trigger::Request,
            status: HostRemediationStatus::default(),
            created: t(-5),
            machine,
            stored: None,
            host_exists: true,
            host_annotated: false,
            powered_on: Some(true),
            host_written: Some(-1_000),
            bmc_stuck: false,
            node: Some(node()),
            node_returns: true,
            node_age: 0,
            retry_limit: obs(trigger).retry_limit,
            escalation: obs(trigger).escalation,
            slot_free: true,
            queue_reboot_until: None,
            escalations: Vec::new(),
            rounds: Vec::new(),
        }
    }

    fn requested(&self) -> bool {
        match self.trigger {
            Trigger::Request => self.request,
            Trigger::MachineAnnotation => {
                self.machine.contains_key(EXTERNAL_REMEDIATION_ANNOTATION)
            }
        }
    }

    fn withdraw(&mut self) {
        self.request = false;
        self.machine.remove(EXTERNAL_REMEDIATION_ANNOTATION);
    }

    fn record(&self) -> Record {
        match self.trigger {
            Trigger::Request => {
                let mut r = Record::from_status(&self.status);
                r.started_at = Some(self.created);
                r
            }
            Trigger::MachineAnnotation => self
                .stored
                .as_ref()
                .map(Record::from_machine_flow)
                .unwrap_or_default(),
        }
    }

    fn observe(&self) -> Observation {
        let host = RemediationHostView {
            name: HOST.into(),
            uid: HOST_UID.into(),
            powered_on: self.powered_on,
            last_updated: self.host_written.map(t),
            observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
            spec_bmc: hostcycle_api::ObservedBmc::default(),
            power_off_requested: self.host_annotated,
            online: true,
            externally_provisioned: false,
            error: None,
            cannot_power_off: None,
            marked_unhealthy: None,
        };
        Observation {
            trigger: self.trigger,
            requested: self.requested(),
            bound: self.host_exists.then(|| host.clone()),
            power_off_timeout: OFF_TIMEOUT,
            target: if self.host_exists {
                Ok(host)
            } else {
                Err(Blocker::HostNotFound(HOST.into()))
            },
            node_name: Some(NODE.into()),
            node: self.node.clone(),
            record: self.record(),
            retry_limit: self.retry_limit,
            power_on_timeout: TIMEOUT,
            slot_free: self.slot_free,
            queue_reboot_until: self.queue_reboot_until,
            escalation: self.escalation.clone(),
            held_elsewhere: None,
            joined_running: None,
            clock_untrusted: None,
            release_strategy: Ok(hostcycle_core::remediation::release::ReleaseStrategy::DeleteNode),
            out_of_service_served: false,
            workloads: None,
            leave_off: false,
        }
    }

    fn write(&mut self, record: &Record) {
        match self.trigger {
            Trigger::Request => record.apply_to_status(&mut self.status),
            Trigger::MachineAnnotation => {
                // As the operator: the record first (an end too: its FinishAnnotationFlow
                // then removes it), then the markers.
                self.stored = Some(record.to_machine_flow("machine.openshift.io/ns/m", "uid-m"));
                for (k, v) in record.machine_annotations() {
                    match v {
                        Some(v) => self.machine.insert(k.to_owned(), v),
                        None => self.machine.remove(k),
                    };
                }
            }
        }
    }

    fn act(&mut self, action: &Action) {
        match action {
            // Neither changes power or the Node: the world does not model them.
            Action::MarkHostUnhealthy | Action::ClearExternallyRemediated => {}
            Action::RequestPowerOff => self.host_annotated = self.host_exists,
            Action::ReleasePowerOff => self.host_annotated = false,
            Action::DeleteNode => self.node = None,
            Action::RestoreNode {
                labels,
                annotations,
                ..
            } => {
                if let Some(n) = self.node.take() {
                    self.node = Some(merged(n, labels, annotations));
                }
            }
            Action::FinishAnnotationFlow => {
                for key in [
                    EXTERNAL_REMEDIATION_ANNOTATION,
                    POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
                    POWER_ON_TIMEOUT_ANNOTATION,
                    NODE_LABELS_BACKUP_ANNOTATION,
                    NODE_ANNOTATIONS_BACKUP_ANNOTATION,
                    NODE_SPEC_BACKUP_ANNOTATION,
                    REMEDIATION_HOST_ANNOTATION,
                    REMEDIATION_HOST_BMC_ANNOTATION,
                    REMEDIATION_JOINED_ANNOTATION,
                    REMEDIATION_STARTED_ANNOTATION,
                    REMEDIATION_POWERED_OFF_AT_ANNOTATION,
                    REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
                    REMEDIATION_FAILED_ANNOTATION,
                ] {
                    self.machine.remove(key);
                }
                self.stored = None;
            }
            Action::Escalate(e) => self.escalations.push(e.clone()),
            // The world runs DeleteNode flows only (release flows: remediation_release.rs).
            Action::Release(_) => {}
        }
    }

    /// Time passes: the BMC follows the power-off, the kubelet follows the power.
    fn tick(&mut self) {
        self.now += TICK;
        if self.host_exists && !self.bmc_stuck {
            let was_on = self.powered_on == Some(true);
            self.powered_on = Some(!self.host_annotated);
            // The host controller read the BMC and wrote the status (after any request of
            // the round that just passed).
            self.host_written = Some(self.now);
            match (&mut self.node, self.powered_on) {
                (Some(n), Some(false)) => {
                    n.ready = false;
                    self.node_age = 0;
                }
                (None, Some(true)) if was_on && self.node_returns => {
                    self.node = Some(fresh_node());
                    self.node_age = 0;
                }
                (Some(n), Some(true)) if was_on => {
                    self.node_age += 1;
                    if self.node_age >= 1 {
                        n.ready = true;
                    }
                }
                _ => {}
            }
        }
    }

    /// One round: observe, decide, write the record, act (unless it crashes after the
    /// write), then time passes.
    fn round(&mut self, crash_after_write: bool) -> Decision {
        let o = self.observe();
        let d = decide(&o, t(self.now));
        let ctx = format!(
            "{:?} round {} at {}s",
            self.trigger,
            self.rounds.len(),
            self.now
        );
        assert_safe(&o, &d, &ctx);
        if let Some(r) = &d.record {
            self.write(r);
        }
        if !crash_after_write {
            for a in &d.actions {
                self.act(a);
            }
        }
        self.rounds.push(Round {
            now: self.now,
            step: o.record.step,
            decision: d.clone(),
        });
        self.tick();
        d
    }

    fn settled(&self) -> bool {
        let o = self.observe();
        let d = decide(&o, t(self.now));
        (terminal(o.record.step) || (o.record.step == RemediationStep::NotStarted && !o.requested))
            && d.actions.is_empty()
            && d.record.is_none()
    }

    fn run(&mut self) {
        self.run_crashing_at(None);
    }

    fn run_crashing_at(&mut self, crash: Option<usize>) {
        for _ in 0..1_000 {
            if self.settled() {
                return;
            }
            let crashing = crash == Some(self.rounds.len());
            self.round(crashing);
        }
        panic!(
            "{:?}: never settled\n{:#?}",
            self.trigger,
            self.rounds.last()
        );
    }

    fn actions(&self) -> Vec<Kind> {
        self.rounds
            .iter()
            .flat_map(|r| r.decision.actions.iter().map(kind))
            .collect()
    }

    fn count(&self, k: Kind) -> usize {
        self.actions().iter().filter(|a| **a == k).count()
    }

    fn steps(&self) -> Vec<RemediationStep> {
        let mut steps: Vec<RemediationStep> = self.rounds.iter().map(|r| r.step).collect();
        steps.push(self.record().step);
        steps.dedup();
        steps
    }

    fn events(&self) -> Vec<&'static str> {
        self.rounds
            .iter()
            .flat_map(|r| r.decision.events.iter().map(|e| e.reason))
            .collect()
    }

    /// Markers the annotation flow leaves on the Machine (the trigger included).
    fn machine_markers(&self) -> Vec<&str> {
        self.machine
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "metal3.io/BareMetalHost")
            .collect()
    }
}

/// The Node at the end of a successful remediation: the fresh kubelet labels, plus every
/// backed-up key it lacked (its own values win).
fn restored_node() -> RemediationNodeView {
    RemediationNodeView {
        ready: true,
        ..merged(fresh_node(), &node().labels, &node().annotations)
    }
}

#[test]
fn a_whole_remediation_for_each_trigger_fences_releases_powers_on_and_restores() {
    use Kind::*;
    for (trigger, actions) in [
        (
            Trigger::Request,
            // The request's Cluster API Machine loses its ExternallyRemediated condition.
            vec![
                RequestPowerOff,
                DeleteNode,
                ReleasePowerOff,
                RestoreNode,
                ClearExternallyRemediated,
            ],
        ),
        (
            Trigger::MachineAnnotation,
            vec![
                RequestPowerOff,
                DeleteNode,
                ReleasePowerOff,
                RestoreNode,
                FinishAnnotationFlow,
            ],
        ),
    ] {
        let mut w = World::new(trigger);
        w.run();
        let name = format!("{trigger:?}");
        assert_eq!(w.actions(), actions, "{name}: actions\n{:#?}", w.rounds);
        assert_eq!(
            w.steps(),
            vec![
                RemediationStep::NotStarted,
                RemediationStep::PowerOffRequested,
                RemediationStep::NodeReleased,
                RemediationStep::PowerOnRequested,
                match trigger {
                    // The annotation flow's record is gone once it is done.
                    Trigger::MachineAnnotation => RemediationStep::NotStarted,
                    Trigger::Request => RemediationStep::Done,
                },
            ],
            "{name}: steps"
        );
        assert_eq!(
            w.events(),
            vec![
                ev::STARTED,
                ev::POWERED_OFF,
                ev::NODE_DELETED,
                ev::NODE_RELEASED,
                ev::POWER_ON_REQUESTED,
                ev::NODE_RESTORED,
                ev::SUCCEEDED,
            ],
            "{name}: events"
        );
        // The Node was deleted only while the host was off.
        let delete_round = w
            .rounds
            .iter()
            .position(|r| r.decision.actions.contains(&Action::DeleteNode))
            .unwrap();
        let off_round = w
            .rounds
            .iter()
            .position(|r| {
                r.decision
                    .events
                    .iter()
                    .any(|e| e.reason == ev::POWERED_OFF)
            })
            .unwrap();
        assert!(off_round <= delete_round, "{name}");
        // The end state: host on without the power-off, the Node back with its labels.
        assert_eq!(
            (w.powered_on, w.host_annotated),
            (Some(true), false),
            "{name}"
        );
        assert_eq!(w.node, Some(restored_node()), "{name}: node");
        assert_eq!(
            w.node.as_ref().unwrap().labels["topology.kubernetes.io/zone"],
            "rack-2",
            "{name}: keys on the new Node win"
        );
        assert!(w.escalations.is_empty(), "{name}");
        let last = w.rounds.last().unwrap();
        assert_eq!(last.decision.phase, RemediationPhase::Succeeded, "{name}");
        match trigger {
            Trigger::Request => {
                assert_eq!(w.status.step, RemediationStep::Done);
                assert_eq!(w.status.retry_count, 0);
                assert_eq!(w.status.node_labels_backup, None);
                assert_eq!(w.status.node_annotations_backup, None);
                assert!(w.status.powered_off_at.is_some() && w.status.node_released_at.is_some());
                assert!(w.status.power_on_timeout_at.is_some());
            }
            Trigger::MachineAnnotation => {
                assert_eq!(
                    w.machine_markers(),
                    Vec::<&str>::new(),
                    "trigger and markers removed"
                );
            }
        }
    }
}

#[test]
fn the_annotation_flow_keeps_metal3s_markers_on_the_machine_while_it_runs() {
    let mut w = World::new(Trigger::MachineAnnotation);
    let mut seen = Vec::new();
    while !w.settled() {
        w.round(false);
        seen.push((w.record().step, w.machine_markers().join(",")));
    }
    let at = |step| {
        seen.iter()
            .find(|(s, _)| *s == step)
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| panic!("{step:?} not seen: {seen:#?}"))
    };
    let mut expected = [
        EXTERNAL_REMEDIATION_ANNOTATION,
        REMEDIATION_HOST_ANNOTATION,
        REMEDIATION_HOST_BMC_ANNOTATION,
        NODE_ANNOTATIONS_BACKUP_ANNOTATION,
        NODE_LABELS_BACKUP_ANNOTATION,
        POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
        REMEDIATION_STARTED_ANNOTATION,
        REMEDIATION_POWERED_OFF_AT_ANNOTATION,
        REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
    ];
    expected.sort_unstable();
    assert_eq!(at(RemediationStep::NodeReleased), expected.join(","));
    assert!(at(RemediationStep::PowerOnRequested).contains(POWER_ON_TIMEOUT_ANNOTATION));
}

#[test]
fn the_node_already_gone_is_warned_about_and_the_host_is_fenced_anyway() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut w = World::new(trigger);
        w.node = None;
        w.run();
        assert_eq!(
            w.count(Kind::DeleteNode),
            0,
            "{trigger:?}: nothing to delete"
        );
        assert_eq!(w.count(Kind::RequestPowerOff), 1, "{trigger:?}: fenced");
        assert_eq!(
            w.count(Kind::RestoreNode),
            0,
            "{trigger:?}: nothing to restore"
        );
        assert!(w.events().contains(&ev::NODE_NOT_FOUND), "{trigger:?}");
        assert_eq!(
            w.node,
            Some(RemediationNodeView {
                ready: true,
                ..fresh_node()
            }),
            "{trigger:?}"
        );
        assert_eq!((w.powered_on, w.host_annotated), (Some(true), false));
    }
}

#[test]
fn a_trigger_withdrawn_before_the_node_is_deleted_releases_the_host_and_stops() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        for (name, stuck) in [
            ("while the host is still powering off", true),
            ("once the host is off", false),
        ] {
            let mut w = World::new(trigger);
            w.bmc_stuck = stuck;
            w.round(false); // RequestPowerOff; the host goes off unless stuck
            assert_eq!(w.powered_on, Some(stuck), "{trigger:?} {name}");
            w.withdraw();
            w.bmc_stuck = false;
            w.run();
            let ctx = format!("{trigger:?} {name}");
            assert_eq!(
                w.count(Kind::DeleteNode),
                0,
                "{ctx}: the Node stays\n{:#?}",
                w.rounds
            );
            assert_eq!(w.count(Kind::ReleasePowerOff), 1, "{ctx}");
            assert!(w.events().contains(&ev::CANCELLED), "{ctx}");
            assert_eq!(
                (w.powered_on, w.host_annotated),
                (Some(true), false),
                "{ctx}: host on"
            );
            assert_eq!(
                w.node.as_ref().map(|n| &n.labels),
                Some(&node().labels),
                "{ctx}"
            );
            match trigger {
                Trigger::Request => assert_eq!(w.status.step, RemediationStep::Cancelled),
                Trigger::MachineAnnotation => {
                    assert_eq!(w.machine_markers(), Vec::<&str>::new(), "{ctx}")
                }
            }
        }
    }
}

#[test]
fn a_trigger_withdrawn_after_the_node_is_deleted_finishes_power_on_and_cleanup() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        // Withdrawn right after each round from the one that deletes the Node on.
        for extra in 0..6 {
            let mut w = World::new(trigger);
            while !w
                .rounds
                .iter()
                .any(|r| r.decision.actions.contains(&Action::DeleteNode))
            {
                w.round(false);
            }
            for _ in 0..extra {
                w.round(false);
            }
            w.withdraw();
            w.run();
            let ctx = format!("{trigger:?}, withdrawn {extra} round(s) after DeleteNode");
            assert_eq!(
                (w.powered_on, w.host_annotated),
                (Some(true), false),
                "{ctx}: host on"
            );
            assert_eq!(w.node, Some(restored_node()), "{ctx}: node restored");
            assert!(w.escalations.is_empty(), "{ctx}");
            assert!(!w.events().contains(&ev::CANCELLED), "{ctx}");
            match trigger {
                Trigger::Request => assert_eq!(w.status.step, RemediationStep::Done, "{ctx}"),
                Trigger::MachineAnnotation => {
                    assert_eq!(w.machine_markers(), Vec::<&str>::new(), "{ctx}")
                }
            }
        }
    }
}

#[test]
fn a_trigger_withdrawn_after_the_backup_but_before_the_deletion_was_done_still_finishes() {
    // DeleteNode decided and its record written, then a crash before the deletion; the
    // trigger goes away meanwhile. The deletion may have happened unseen: finish the flow.
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut w = World::new(trigger);
        w.round(false); // RequestPowerOff
        let d = w.round(true); // backup recorded, DeleteNode not done
        assert_eq!(d.actions, vec![Action::DeleteNode], "{trigger:?}");
        w.withdraw();
        w.run();
        assert_eq!(w.count(Kind::DeleteNode), 2, "{trigger:?}: decided again");
        assert_eq!(
            (w.powered_on, w.host_annotated),
            (Some(true), false),
            "{trigger:?}"
        );
        assert_eq!(w.node, Some(restored_node()), "{trigger:?}");
    }
}

#[test]
fn a_restart_after_any_record_write_resumes_without_a_second_power_cycle_and_keeps_the_labels() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut clean = World::new(trigger);
        clean.run();
        for crash in 0..clean.rounds.len() {
            let mut w = World::new(trigger);
            w.run_crashing_at(Some(crash));
            let ctx = format!("{trigger:?}, crash after the write of round {crash}");
            assert_eq!(
                (w.powered_on, w.host_annotated),
                (Some(true), false),
                "{ctx}: host on"
            );
            assert_eq!(
                w.node,
                Some(restored_node()),
                "{ctx}: labels kept\n{:#?}",
                w.rounds
            );
            assert!(w.escalations.is_empty(), "{ctx}");
            // One power cycle: the power-off was requested in one round (repeated only
            // while it was not on the host) and released once it had been acted on.
            let off_rounds: Vec<usize> = w
                .rounds
                .iter()
                .enumerate()
                .filter(|(_, r)| r.decision.actions.contains(&Action::RequestPowerOff))
                .map(|(i, _)| i)
                .collect();
            assert!(
                off_rounds.len() == 1 || (off_rounds.len() == 2 && off_rounds[0] == crash),
                "{ctx}: RequestPowerOff in rounds {off_rounds:?}"
            );
            match trigger {
                Trigger::Request => assert_eq!(w.status.step, RemediationStep::Done, "{ctx}"),
                Trigger::MachineAnnotation => {
                    assert_eq!(w.machine_markers(), Vec::<&str>::new(), "{ctx}")
                }
            }
        }
    }
}

#[test]
fn a_restart_after_the_cancel_is_written_still_releases_the_host() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut w = World::new(trigger);
        w.round(false); // RequestPowerOff, host off
        w.withdraw();
        let d = w.round(true); // Cancelled written, ReleasePowerOff lost
        assert!(d.actions.contains(&Action::ReleasePowerOff), "{trigger:?}");
        assert!(w.host_annotated);
        w.run();
        assert_eq!(
            (w.powered_on, w.host_annotated),
            (Some(true), false),
            "{trigger:?}: host on"
        );
        assert_eq!(w.count(Kind::DeleteNode), 0, "{trigger:?}");
    }
}

#[test]
fn the_same_record_fed_again_gives_the_same_next_step() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut w = World::new(trigger);
        while !w.settled() {
            // Before acting: decide twice on what is observed, and once more on the record
            // as read back after the write (a restart right after it).
            let o = w.observe();
            let first = decide(&o, t(w.now));
            assert_eq!(decide(&o, t(w.now)), first, "{trigger:?}");
            let mut replay = w.clone();
            if let Some(r) = &first.record {
                replay.write(r);
            }
            let again = decide(&replay.observe(), t(w.now));
            let written = first.record.clone().unwrap_or(o.record.clone());
            let reread = replay.observe().record;
            // Both stores (a request's status, the annotation flow's record) keep every step.
            let expected = written.step;
            assert_eq!(
                reread.step, expected,
                "{trigger:?}: the step survives its store"
            );
            if let Some(next) = &again.record {
                assert!(
                    rank(next.step) >= rank(reread.step),
                    "{trigger:?}: {:?} after {:?}",
                    next.step,
                    reread.step
                );
            }
            // A power-off that is recorded and on the host is never requested again.
            if reread.step == RemediationStep::PowerOffRequested && replay.host_annotated {
                assert!(
                    !again.actions.contains(&Action::RequestPowerOff),
                    "{trigger:?}"
                );
            }
            w.round(false);
        }
    }
}

#[test]
fn a_node_that_never_returns_is_retried_then_escalated() {
    struct Esc {
        trigger: Trigger,
        retry_limit: u32,
        escalation: Escalation,
        escalated: Vec<Escalation>,
        phase: RemediationPhase,
    }
    let cases = [
        Esc {
            trigger: Trigger::Request,
            retry_limit: 2,
            escalation: Escalation::MarkOwnerRemediated,
            escalated: vec![Escalation::MarkOwnerRemediated],
            phase: RemediationPhase::Failed,
        },
        Esc {
            trigger: Trigger::Request,
            retry_limit: 1,
            escalation: Escalation::DeleteMachine,
            escalated: vec![Escalation::DeleteMachine],
            phase: RemediationPhase::DeletingMachine,
        },
        Esc {
            trigger: Trigger::Request,
            retry_limit: 0,
            escalation: Escalation::None("no Machine".into()),
            escalated: vec![],
            phase: RemediationPhase::Failed,
        },
        Esc {
            trigger: Trigger::MachineAnnotation,
            retry_limit: 0,
            escalation: Escalation::DeleteMachine,
            escalated: vec![Escalation::DeleteMachine],
            phase: RemediationPhase::DeletingMachine,
        },
        Esc {
            trigger: Trigger::MachineAnnotation,
            retry_limit: 0,
            escalation: Escalation::None("control-plane Machine".into()),
            escalated: vec![],
            phase: RemediationPhase::Failed,
        },
    ];
    for c in cases {
        let ctx = format!(
            "{:?} retry_limit {} {:?}",
            c.trigger, c.retry_limit, c.escalation
        );
        let mut w = World::new(c.trigger);
        w.node_returns = false;
        w.retry_limit = c.retry_limit;
        w.escalation = c.escalation.clone();
        w.run();
        let cycles = c.retry_limit as usize + 1;
        assert_eq!(w.count(Kind::RequestPowerOff), cycles, "{ctx}");
        assert_eq!(w.count(Kind::ReleasePowerOff), cycles, "{ctx}");
        assert_eq!(
            w.count(Kind::DeleteNode),
            1,
            "{ctx}: the Node is deleted once"
        );
        assert_eq!(w.escalations, c.escalated, "{ctx}: escalated once");
        assert_eq!(
            w.events().iter().filter(|e| **e == ev::RETRYING).count(),
            c.retry_limit as usize,
            "{ctx}"
        );
        assert_eq!(
            (w.powered_on, w.host_annotated),
            (Some(true), false),
            "{ctx}: host left on"
        );
        let record = w.record();
        assert_eq!(record.step, RemediationStep::GaveUp, "{ctx}");
        assert_eq!(w.rounds.last().unwrap().decision.phase, c.phase, "{ctx}");
        // Gave up no earlier than the last cycle's deadline.
        let gave_up = w
            .rounds
            .iter()
            .find(|r| {
                r.decision
                    .record
                    .as_ref()
                    .is_some_and(|r| r.step == RemediationStep::GaveUp)
            })
            .unwrap();
        let last_power_on = w
            .rounds
            .iter()
            .rev()
            .find(|r| r.decision.actions.contains(&Action::ReleasePowerOff))
            .unwrap();
        assert!(
            gave_up.now >= last_power_on.now + TIMEOUT.as_secs() as i64,
            "{ctx}"
        );
        match c.trigger {
            Trigger::Request => {
                assert_eq!(w.status.retry_count, c.retry_limit, "{ctx}");
                // The backup stays for a Node that turns up late.
                assert_eq!(w.status.node_labels_backup, Some(node().labels), "{ctx}");
            }
            Trigger::MachineAnnotation => {
                assert!(
                    w.machine.contains_key(REMEDIATION_FAILED_ANNOTATION),
                    "{ctx}"
                );
                assert!(
                    w.machine.contains_key(NODE_LABELS_BACKUP_ANNOTATION),
                    "{ctx}"
                );
                assert!(
                    !w.machine.contains_key(POWER_ON_TIMEOUT_ANNOTATION),
                    "{ctx}"
                );
            }
        }
        // The Node turns up after all: its labels come back, nothing else happens.
        w.node = Some(RemediationNodeView {
            ready: true,
            ..fresh_node()
        });
        w.run();
        assert_eq!(w.node, Some(restored_node()), "{ctx}: late node restored");
        assert_eq!(w.escalations, c.escalated, "{ctx}: not escalated again");
        assert_eq!(
            w.record().labels_backup,
            None,
            "{ctx}: backup forgotten once restored"
        );
    }
}

#[test]
fn a_retry_cycle_where_the_node_came_back_not_ready_backs_it_up_and_deletes_it_again() {
    let mut w = World::new(Trigger::Request);
    w.retry_limit = 1;
    // Comes back, never Ready: the kubelet registers, the Node stays NotReady.
    while w.record().step != RemediationStep::PowerOnRequested || w.node.is_none() {
        w.round(false);
    }
    w.bmc_stuck = true; // keep the node NotReady: no further power changes
    while w.record().step == RemediationStep::PowerOnRequested {
        if let Some(n) = &mut w.node {
            n.ready = false;
        }
        w.round(false);
    }
    assert_eq!(w.record().step, RemediationStep::PowerOffRequested);
    assert_eq!(w.record().retry_count, 1);
    w.bmc_stuck = false;
    w.run();
    assert_eq!(
        w.count(Kind::DeleteNode),
        2,
        "deleted again in the retry\n{:#?}",
        w.rounds
    );
    assert_eq!(w.status.step, RemediationStep::Done);
    assert_eq!(w.node, Some(restored_node()));
}

#[test]
fn remediations_share_max_concurrent_slots_and_start_in_order() {
    // Three requests, one slot: each starts only once the one before is finished.
    let mut worlds: Vec<World> = (0..3).map(|_| World::new(Trigger::Request)).collect();
    let max = 1;
    let mut starts = Vec::new();
    let mut finishes = Vec::new();
    for round in 0..300 {
        if worlds.iter().all(World::settled) {
            break;
        }
        for i in 0..worlds.len() {
            // The controller looks at one remediation at a time, counting the others.
            let in_flight = worlds.iter().filter(|w| w.record().in_flight()).count();
            assert!(in_flight <= max, "round {round}: {in_flight} in flight");
            let waiting: Vec<usize> = (0..worlds.len())
                .filter(|j| {
                    worlds[*j].requested()
                        && worlds[*j].record().step == RemediationStep::NotStarted
                })
                .collect();
            let allowed = allocate_slots(in_flight, max, &waiting);
            let w = &mut worlds[i];
            if w.settled() {
                continue;
            }
            w.slot_free = allowed.contains(&i);
            let before = w.record().step;
            let d = w.round(false);
            if before == RemediationStep::NotStarted {
                if w.slot_free {
                    assert_eq!(
                        d.actions,
                        vec![Action::RequestPowerOff],
                        "round {round} #{i}"
                    );
                    starts.push((round, i));
                } else {
                    assert!(
                        d.actions.is_empty() && d.record.is_none(),
                        "round {round} #{i}"
                    );
                    assert_eq!(d.phase, RemediationPhase::Pending);
                    assert!(d.message.contains("slot"), "{}", d.message);
                }
            }
            if w.record().step == RemediationStep::Done && before != RemediationStep::Done {
                finishes.push((round, i));
            }
        }
    }
    assert_eq!(
        starts.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(
        finishes.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Each starts in the round its predecessor finished at the earliest (looked at after
    // it); `in_flight <= max` above holds at every decision.
    for i in 1..3 {
        assert!(
            starts[i].0 >= finishes[i - 1].0,
            "#{i} started before #{} finished",
            i - 1
        );
    }
    for w in &worlds {
        assert_eq!(w.node, Some(restored_node()));
    }
}

#[test]
fn a_node_rebooting_in_the_queue_is_remediated_only_after_its_boot_deadline() {
    let mut w = World::new(Trigger::Request);
    w.queue_reboot_until = Some(t(95));
    while w.now < 95 {
        let d = w.round(false);
        assert!(
            d.actions.is_empty() && d.record.is_none(),
            "at {}s: {d:#?}",
            w.now
        );
        assert_eq!(d.phase, RemediationPhase::Pending);
        assert!(d.message.contains("reboot queue"), "{}", d.message);
        assert!(
            d.requeue.is_some_and(|r| r <= Duration::from_secs(96)),
            "{d:#?}"
        );
    }
    // The queue's reboot brought the node back in time: the deadline went with it; or
    // not: the remediation starts at its deadline.
    let d = w.round(false);
    assert_eq!(d.actions, vec![Action::RequestPowerOff], "{d:#?}");
    assert_eq!(w.rounds.last().unwrap().now, 100);
    w.run();
    assert_eq!(w.status.step, RemediationStep::Done);
}

// ---------------------------------------------------------------------------------------
// Properties over arbitrary observations.

fn step() -> impl Strategy<Value = RemediationStep> {
    prop_oneof![
        Just(RemediationStep::NotStarted),
        Just(RemediationStep::PowerOffRequested),
        Just(RemediationStep::NodeReleased),
        Just(RemediationStep::PowerOnRequested),
        Just(RemediationStep::Done),
        Just(RemediationStep::GaveUp),
        Just(RemediationStep::Cancelled),
    ]
}

fn opt_t() -> impl Strategy<Value = Option<Timestamp>> {
    prop::option::of((-2_000_i64..2_000).prop_map(t))
}

fn small_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("c".to_owned())
        ],
        prop_oneof![
            Just(String::new()),
            Just("x".to_owned()),
            Just("y".to_owned())
        ],
        0..3,
    )
}

fn record() -> impl Strategy<Value = Record> {
    (
        step(),
        0_u32..4,
        (opt_t(), opt_t(), opt_t(), opt_t(), opt_t()),
        prop::option::of(small_map()),
        prop::option::of(small_map()),
        prop::option::of(Just("failed".to_owned())),
    )
        .prop_map(
            |(step, retry_count, times, labels, annotations, failure)| Record {
                step,
                retry_count,
                host: (retry_count % 2 == 0).then(bound),
                bmc: None,
                joined: None,
                node_spec_backup: None,
                started_at: times.0,
                cycle_started_at: times.1,
                powered_off_at: times.2,
                node_released_at: times.3,
                power_on_timeout_at: times.4,
                labels_backup: labels,
                annotations_backup: annotations,
                failure,
                release: None,
                fenced_boot_id: None,
                release_started_at: None,
            },
        )
}

fn target() -> impl Strategy<Value = Result<RemediationHostView, Blocker>> {
    prop_oneof![
        4 => (
            prop::option::of(any::<bool>()),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::option::of(Just("BMC error".to_owned())),
            (opt_t(), prop_oneof![Just(HOST_UID.to_owned()), Just("other-uid".to_owned())]),
        )
            .prop_map(|(powered_on, power_off_requested, online, externally_provisioned, error, (last_updated, uid))| {
                Ok(RemediationHostView {
                    name: HOST.into(),
                    uid,
                    powered_on,
                    last_updated,
                    observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
                    spec_bmc: hostcycle_api::ObservedBmc::default(),
                    power_off_requested,
                    online,
                    externally_provisioned,
                    error,
                    cannot_power_off: None,
        marked_unhealthy: None,
                })
            }),
        1 => prop_oneof![
            Just(Blocker::HostNotReferenced),
            Just(Blocker::HostNotFound(HOST.into())),
            Just(Blocker::NodeRefUnset),
            Just(Blocker::HostOffline(HOST.into())),
        ]
        .prop_map(Err),
    ]
}

fn node_view() -> impl Strategy<Value = Option<RemediationNodeView>> {
    prop::option::of((small_map(), small_map(), any::<bool>()).prop_map(
        |(labels, annotations, ready)| RemediationNodeView {
            labels,
            annotations,
            ready,
            unschedulable: false,
            taints: Vec::new(),
            boot_id: None,
            volumes_in_use: 0,
        },
    ))
}

fn escalation() -> impl Strategy<Value = Escalation> {
    prop_oneof![
        Just(Escalation::DeleteMachine),
        Just(Escalation::MarkOwnerRemediated),
        Just(Escalation::None("why".into())),
    ]
}

fn observation() -> impl Strategy<Value = Observation> {
    (
        prop_oneof![Just(Trigger::Request), Just(Trigger::MachineAnnotation)],
        any::<bool>(),
        target(),
        prop::option::of(Just(NODE.to_owned())),
        node_view(),
        record(),
        0_u32..4,
        (1_u64..1_000).prop_map(Duration::from_secs),
        any::<bool>(),
        opt_t(),
        escalation(),
    )
        .prop_map(
            |(
                trigger,
                requested,
                target,
                node_name,
                node,
                record,
                retry_limit,
                power_on_timeout,
                slot_free,
                queue_reboot_until,
                escalation,
            )| Observation {
                trigger,
                requested,
                bound: target.as_ref().ok().cloned(),
                power_off_timeout: OFF_TIMEOUT,
                target,
                node_name,
                node,
                record,
                retry_limit,
                power_on_timeout,
                slot_free,
                queue_reboot_until,
                escalation,
                held_elsewhere: None,
                joined_running: None,
                clock_untrusted: None,
                release_strategy: Ok(
                    hostcycle_core::remediation::release::ReleaseStrategy::DeleteNode,
                ),
                out_of_service_served: false,
                workloads: None,
                leave_off: false,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    /// DeleteNode only when the host is off with the power-off on it; ReleasePowerOff never
    /// in NotStarted; a request withdrawn before a backup never deletes the Node; the step
    /// never moves backwards except the retry (see `assert_safe`).
    #[test]
    fn every_decision_is_safe(o in observation(), now in -2_000_i64..2_000) {
        let d = decide(&o, t(now));
        assert_safe(&o, &d, "proptest");
    }

    #[test]
    fn delete_node_only_when_the_host_is_off(o in observation(), now in -2_000_i64..2_000) {
        let d = decide(&o, t(now));
        if d.actions.contains(&Action::DeleteNode) {
            let h = acting_host(&o).host().unwrap();
            prop_assert_eq!(h.powered_on, Some(false));
            prop_assert!(h.power_off_requested);
            prop_assert!(h.error.is_none());
            prop_assert!(h.last_updated > o.record.cycle_started_at, "{:#?}", o);
        }
    }

    #[test]
    fn release_power_off_never_before_the_start(o in observation(), now in -2_000_i64..2_000) {
        let o = Observation { record: Record { step: RemediationStep::NotStarted, ..o.record }, ..o };
        let d = decide(&o, t(now));
        prop_assert!(!d.actions.contains(&Action::ReleasePowerOff));
    }

    #[test]
    fn a_withdrawn_request_before_the_backup_never_deletes_the_node(
        o in observation(),
        now in -2_000_i64..2_000,
    ) {
        let o = Observation {
            requested: false,
            record: Record { labels_backup: None, ..o.record },
            ..o
        };
        let d = decide(&o, t(now));
        prop_assert!(!d.actions.contains(&Action::DeleteNode), "{:#?}", d);
        // Nor later: a withdrawn request never records a backup either.
        if let Some(r) = &d.record {
            prop_assert!(r.labels_backup.is_none(), "{:#?}", d);
        }
    }

    #[test]
    fn steps_never_move_backwards_except_the_retry(o in observation(), now in -2_000_i64..2_000) {
        let d = decide(&o, t(now));
        if let Some(next) = &d.record {
            let retry = o.record.step == RemediationStep::PowerOnRequested
                && next.step == RemediationStep::PowerOffRequested
                && next.retry_count == o.record.retry_count + 1;
            prop_assert!(rank(next.step) >= rank(o.record.step) || retry, "{:?} → {:?}", o.record.step, next.step);
            if terminal(o.record.step) {
                prop_assert_eq!(next.step, o.record.step);
            }
            prop_assert!(next.retry_count == o.record.retry_count || retry);
        }
    }

    #[test]
    fn slots_and_the_queue_only_matter_before_the_start(
        o in observation(),
        now in -2_000_i64..2_000,
        until in opt_t(),
    ) {
        prop_assume!(o.record.step != RemediationStep::NotStarted);
        let a = decide(&Observation { slot_free: true, queue_reboot_until: None, ..o.clone() }, t(now));
        let b = decide(&Observation { slot_free: false, queue_reboot_until: until, ..o }, t(now));
        prop_assert_eq!(a, b);
    }

    #[test]
    fn the_node_is_deleted_only_with_its_backup_written_ahead(
        o in observation(),
        now in -2_000_i64..2_000,
    ) {
        let d = decide(&o, t(now));
        if d.actions.contains(&Action::DeleteNode) {
            let r = d.record.as_ref().expect("the backup is written before the deletion");
            prop_assert!(r.labels_backup.is_some() && r.annotations_backup.is_some());
        }
    }

    #[test]
    fn a_withdrawn_request_never_starts_nor_retries(o in observation(), now in -2_000_i64..2_000) {
        let o = Observation { requested: false, ..o };
        let d = decide(&o, t(now));
        if o.record.step == RemediationStep::NotStarted || o.record.step == RemediationStep::PowerOnRequested {
            prop_assert!(!d.actions.contains(&Action::RequestPowerOff), "{:#?}", d);
        }
        prop_assert!(!d.actions.iter().any(|a| matches!(a, Action::Escalate(_))), "{:#?}", d);
    }

    #[test]
    fn a_finished_remediation_only_releases_restores_or_forgets(
        o in observation(),
        finished in prop_oneof![
            Just(RemediationStep::Done),
            Just(RemediationStep::GaveUp),
            Just(RemediationStep::Cancelled),
        ],
        now in -2_000_i64..2_000,
    ) {
        let o = Observation { record: Record { step: finished, ..o.record }, ..o };
        let d = decide(&o, t(now));
        for a in &d.actions {
            // The annotation flow's end also finishes (trigger, markers, record removed).
            let finish = *a == Action::FinishAnnotationFlow
                && o.trigger == Trigger::MachineAnnotation
                && finished != RemediationStep::GaveUp;
            prop_assert!(
                matches!(a, Action::ReleasePowerOff | Action::RestoreNode { .. }) || finish,
                "{:?} after {:?}", a, o.record.step
            );
        }
        if d.actions.contains(&Action::ReleasePowerOff) {
            prop_assert!(acting_host(&o).host().is_some_and(|h| h.power_off_requested));
        }
    }

    /// Whatever the world does between rounds, a remediation replayed round after round
    /// never deletes the Node of a host that is on.
    #[test]
    fn replays_with_a_capricious_world_stay_safe(
        trigger in prop_oneof![Just(Trigger::Request), Just(Trigger::MachineAnnotation)],
        script in prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 0_u8..8), 1..60),
    ) {
        let mut w = World::new(trigger);
        for (stuck, crash, withdraw, node_back, jitter) in script {
            w.bmc_stuck = stuck;
            w.node_returns = node_back;
            if withdraw && jitter == 0 {
                w.withdraw();
            }
            if jitter == 7 {
                w.now += 700; // a long gap: deadlines pass
            }
            w.round(crash);
        }
    }
}
