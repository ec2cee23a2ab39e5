//! Rules of the reboot queue's `plan`, as tables: one snapshot in, the whole plan out
//! (starts, removals, waits with their reasons, entries in progress, stopped drains, stray
//! cordons). Every case checks every field of the plan, so a rule cannot leak into another.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use hostcycle_api::queue::{EntryPhase, HostReference, RebootMethod, RebootQueueSpec};
use hostcycle_api::remediation::RemediationStep;
use hostcycle_core::queue::away::{AwayFacts, AwayMachine, AwayRequest, HeldHost, away_nodes};
use hostcycle_core::queue::commands::{CommandSet, CommandSets};
use hostcycle_core::queue::{
    AwayNode, AwayRef, DequeueReason, EntryView, Plan, QueueConfig, QueueNodeView, QueueSnapshot,
    RebootConfig, RebootTarget, WaitReason, plan, resolve_method,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Builders.

/// A fixed instant plus `s` seconds.
fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn now() -> Timestamp {
    ts(0)
}

/// A Ready worker node with a fresh heartbeat.
fn node(name: &str) -> QueueNodeView {
    QueueNodeView {
        name: name.to_string(),
        api_server: false,
        ready: true,
        ready_heartbeat: Some(ts(-10)),
        boot_id: Some(format!("boot-{name}")),
        unschedulable: false,
        cordoned_by_queue: false,
        volumes_in_use: 0,
        address: format!("{name}.example"),
        reported_addresses: vec![format!("{name}.example")],
    }
}

/// A Ready API-server (control-plane) node.
fn api(name: &str) -> QueueNodeView {
    node(name).api_server()
}

trait NodeBuild {
    fn api_server(self) -> Self;
    /// Ready condition not True (False, Unknown or absent: all the same to the queue).
    fn not_ready(self) -> Self;
    /// Cordoned by the queue (carries the annotation).
    fn queue_cordoned(self) -> Self;
    /// Cordoned by an administrator (no annotation).
    fn admin_cordoned(self) -> Self;
}

impl NodeBuild for QueueNodeView {
    fn api_server(mut self) -> Self {
        self.api_server = true;
        self
    }
    fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }
    fn queue_cordoned(mut self) -> Self {
        self.unschedulable = true;
        self.cordoned_by_queue = true;
        self
    }
    fn admin_cordoned(mut self) -> Self {
        self.unschedulable = true;
        self.cordoned_by_queue = false;
        self
    }
}

/// A queued entry with the canonical name.
fn entry(index: u64, node: &str) -> EntryView {
    EntryView {
        name: format!("rqe-{index:010}"),
        uid: Some(format!("uid-{index}")),
        node: node.to_string(),
        index,
        cancel: false,
        phase: EntryPhase::Queued,
        last_transition: None,
        backoff_count: 0,
        backoff_expire: None,
        last_drain_failure: None,
        reboot: None,
        boot_timed_out: false,
        message: String::new(),
    }
}

trait EntryBuild {
    fn phase(self, phase: EntryPhase) -> Self;
    fn draining(self) -> Self;
    fn rebooting(self) -> Self;
    fn cancelled(self) -> Self;
    /// Backed off until `now + until_s` after `failures` failed drains.
    fn backed_off(self, until_s: i64, failures: u32) -> Self;
    fn named(self, name: &str) -> Self;
}

impl EntryBuild for EntryView {
    fn phase(mut self, phase: EntryPhase) -> Self {
        self.phase = phase;
        self.last_transition = Some(ts(-100));
        self
    }
    fn draining(self) -> Self {
        self.phase(EntryPhase::Draining)
    }
    fn rebooting(self) -> Self {
        self.phase(EntryPhase::Rebooting)
    }
    fn cancelled(mut self) -> Self {
        self.cancel = true;
        self
    }
    fn backed_off(mut self, until_s: i64, failures: u32) -> Self {
        self.backoff_expire = Some(ts(until_s));
        self.backoff_count = failures;
        self
    }
    fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

fn config(max_concurrent: u32, max_unreachable: u32) -> QueueConfig {
    QueueConfig {
        max_concurrent_reboots: max_concurrent,
        max_unreachable_nodes: max_unreachable,
        ..QueueConfig::default()
    }
}

fn disabled() -> QueueConfig {
    QueueConfig {
        enabled: false,
        ..QueueConfig::default()
    }
}

fn host_ref(name: &str) -> HostReference {
    HostReference {
        namespace: "metal".into(),
        name: name.into(),
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// Expected wait reasons.

fn behind(free_slots: u32) -> WaitReason {
    WaitReason::BehindEarlierEntries { free_slots }
}
fn no_slot(in_progress: &[&str], max: u32) -> WaitReason {
    WaitReason::NoFreeSlot {
        in_progress: names(in_progress),
        max,
    }
}
fn after_workers(workers: &[&str]) -> WaitReason {
    WaitReason::ApiServerAfterWorkers {
        workers: names(workers),
    }
}
fn api_busy(node: &str) -> WaitReason {
    WaitReason::ApiServerInProgress {
        node: node.to_string(),
    }
}
fn one_at_a_time(first: &str) -> WaitReason {
    WaitReason::ApiServerOneAtATime {
        first: first.to_string(),
    }
}
fn unreachable(nodes: &[&str], max: u32) -> WaitReason {
    WaitReason::TooManyUnreachable {
        nodes: names(nodes),
        max,
        away: Vec::new(),
    }
}
fn backed_off(until_s: i64, failures: u32) -> WaitReason {
    WaitReason::BackedOff {
        until: ts(until_s),
        failures,
        last_failure: None,
    }
}
/// What `resolve_method` says about this target under this config.
fn cannot(config: &QueueConfig, target: &RebootTarget) -> WaitReason {
    WaitReason::CannotReboot {
        why: resolve_method(&config.reboot, target).unwrap_err(),
    }
}

// Who is away: Machines, remediations, held-off hosts (`queue::away`).

/// A Machine in namespace `capi` whose `status.nodeRef` is `node`.
#[derive(Debug, Clone, Default)]
struct TestMachine {
    name: String,
    node: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    host_power_off: bool,
}

fn machine(name: &str, node: &str) -> TestMachine {
    TestMachine {
        name: format!("Machine capi/{name}"),
        node: node.into(),
        ..TestMachine::default()
    }
}

impl TestMachine {
    fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
    fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
    /// Its host carries `reboot.metal3.io/capbm-requested-power-off`.
    fn host_powered_off(mut self) -> Self {
        self.host_power_off = true;
        self
    }
}

/// A HostRemediation `default/<node>` about `node`, at `step`.
#[derive(Debug, Clone)]
struct TestRequest {
    name: String,
    node: String,
    step: RemediationStep,
    labels_backup: Option<BTreeMap<String, String>>,
}

fn request(node: &str, step: RemediationStep) -> TestRequest {
    TestRequest {
        name: format!("HostRemediation default/{node}"),
        node: node.into(),
        step,
        labels_backup: None,
    }
}

impl TestRequest {
    /// The deleted Node's labels, as the remediation backed them up.
    fn backed_up_label(mut self, key: &str) -> Self {
        self.labels_backup = Some(BTreeMap::from([(key.to_string(), String::new())]));
        self
    }
}

/// A BareMetalHost `metal/<node>` bound to `node`, held off as `host` says
/// (`queue::away::held_off`).
fn held(node: &str, host: &hostcycle_api::BareMetalHost) -> HeldHost {
    HeldHost {
        host: host_ref(node),
        node: node.into(),
        why: hostcycle_core::queue::away::held_off(host).expect("a held-off host"),
    }
}

/// A host with a keyed reboot annotation: metal3 keeps it off until the annotation goes.
fn host_held_by_annotation(name: &str) -> hostcycle_api::BareMetalHost {
    let mut h = hostcycle_api::BareMetalHost::externally_provisioned(name, "redfish://x", "s");
    h.metadata.annotations = Some(BTreeMap::from([(
        "reboot.metal3.io/hold".to_string(),
        String::new(),
    )]));
    h
}

#[derive(Debug, Clone, Default)]
struct Facts {
    machines: Vec<TestMachine>,
    requests: Vec<TestRequest>,
    hosts: Vec<HeldHost>,
}

impl Facts {
    fn borrowed(&self) -> AwayFacts<'_> {
        AwayFacts {
            machines: self
                .machines
                .iter()
                .map(|m| AwayMachine {
                    name: m.name.clone(),
                    node: m.node.clone(),
                    labels: &m.labels,
                    annotations: &m.annotations,
                    host_power_off: m.host_power_off,
                })
                .collect(),
            requests: self
                .requests
                .iter()
                .map(|r| AwayRequest {
                    name: r.name.clone(),
                    node: r.node.clone(),
                    step: r.step,
                    labels_backup: r.labels_backup.as_ref(),
                })
                .collect(),
            hosts: self.hosts.clone(),
        }
    }
}

/// An away node as a wait names it (`has_node`: its Node object exists).
fn away(node: &str, why: &str, has_node: bool) -> AwayRef {
    AwayRef {
        node: node.into(),
        why: why.into(),
        has_node,
    }
}

fn unreachable_away(nodes: &[&str], max: u32, away: Vec<AwayRef>) -> WaitReason {
    WaitReason::TooManyUnreachable {
        nodes: names(nodes),
        max,
        away,
    }
}

fn api_away(away: AwayRef) -> WaitReason {
    WaitReason::ApiServerAway { away }
}

// ---------------------------------------------------------------------------------------
// The table machinery.

/// The plan, with entries named by index.
#[derive(Debug, Clone, PartialEq, Default)]
struct Want {
    start: Vec<u64>,
    dequeue: Vec<(u64, DequeueReason)>,
    waiting: Vec<(u64, WaitReason)>,
    in_progress: Vec<(u64, EntryPhase)>,
    stop_draining: Vec<u64>,
    /// Rebooting entries cancelled meanwhile (also in `in_progress`).
    cancel_rebooting: Vec<u64>,
    uncordon: Vec<&'static str>,
}

#[derive(Default)]
struct Case {
    name: &'static str,
    config: QueueConfig,
    nodes: Vec<QueueNodeView>,
    entries: Vec<EntryView>,
    targets: Vec<(&'static str, RebootTarget)>,
    /// Nodes a remediation is working on.
    remediating: Vec<&'static str>,
    /// Machines, remediations and held-off hosts: who is away (`queue::away`).
    facts: Facts,
    want: Want,
}

fn snapshot_of(case: &Case) -> QueueSnapshot {
    let nodes: BTreeMap<String, QueueNodeView> = case
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.clone()))
        .collect();
    QueueSnapshot {
        config: case.config.clone(),
        away: away_nodes(&nodes, &case.facts.borrowed()),
        nodes,
        entries: case.entries.clone(),
        being_remediated: case.remediating.iter().map(|n| n.to_string()).collect(),
        reboot_targets: case
            .targets
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect(),
    }
}

/// The plan in the table's terms (`uncordon` left empty: `run` compares it apart); also
/// checks every reference names the input entry.
fn project(p: &Plan, entries: &[EntryView]) -> Want {
    let by_index: BTreeMap<u64, &EntryView> = entries.iter().map(|e| (e.index, e)).collect();
    let check = |r: &hostcycle_core::queue::EntryRef| -> u64 {
        let e = by_index
            .get(&r.index)
            .unwrap_or_else(|| panic!("plan names an unknown entry {r:?}"));
        assert_eq!((&r.name, &r.node), (&e.name, &e.node), "reference {r:?}");
        r.index
    };
    Want {
        start: p.start_draining.iter().map(check).collect(),
        dequeue: p
            .dequeue
            .iter()
            .map(|d| {
                assert_eq!(d.phase, by_index[&d.entry.index].phase, "dequeue phase");
                (check(&d.entry), d.reason.clone())
            })
            .collect(),
        waiting: p
            .waiting
            .iter()
            .map(|w| (check(&w.entry), w.reason.clone()))
            .collect(),
        in_progress: p
            .in_progress
            .iter()
            .map(|(r, ph)| (check(r), *ph))
            .collect(),
        stop_draining: p.stop_draining.iter().map(check).collect(),
        cancel_rebooting: p.cancel_rebooting.iter().map(check).collect(),
        uncordon: Vec::new(),
    }
}

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        let snapshot = snapshot_of(&case);
        let p = plan(&snapshot, now());
        let got = project(&p, &case.entries);
        let want = Want {
            uncordon: Vec::new(),
            ..case.want.clone()
        };
        let got_uncordon: Vec<&str> = p.uncordon.iter().map(String::as_str).collect();
        if got != want || got_uncordon != case.want.uncordon {
            failures.push(format!(
                "case {:?}\n  want {:#?}\n  want uncordon {:?}\n  got  {:#?}\n  got uncordon {:?}",
                case.name, want, case.want.uncordon, got, got_uncordon
            ));
        }
        // Pure: the same snapshot and time give the same plan.
        assert_eq!(
            plan(&snapshot, now()),
            p,
            "case {:?}: not deterministic",
            case.name
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------------------
// 1. Removals.

#[test]
fn cancelled_missing_node_and_duplicate_entries_leave_the_queue() {
    run(vec![
        Case {
            name: "cancelled entries leave, a draining one uncordoned; a rebooting one stays in \
                   progress, cordoned (its power cycle may be under way: the controller \
                   withdraws the request or waits for the boot)",
            config: config(3, 0),
            nodes: vec![
                node("w1"),
                node("w2").queue_cordoned(),
                node("w3").queue_cordoned(),
            ],
            entries: vec![
                entry(1, "w1").cancelled(),
                entry(2, "w2").rebooting().cancelled(),
                entry(3, "w3").draining().cancelled(),
            ],
            remediating: vec![],
            want: Want {
                dequeue: vec![(1, DequeueReason::Cancelled), (3, DequeueReason::Cancelled)],
                in_progress: vec![(2, EntryPhase::Rebooting)],
                cancel_rebooting: vec![2],
                uncordon: vec!["w3"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an entry whose node does not exist leaves the queue; the next one starts",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "ghost"), entry(2, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                dequeue: vec![(1, DequeueReason::NodeNotFound)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a missing node's entry leaves even when rebooting",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "ghost").rebooting(), entry(2, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                dequeue: vec![(1, DequeueReason::NodeNotFound)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "later entries for a queued node are duplicates of the first index",
            config: config(3, 0),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1"), entry(2, "w1"), entry(3, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                dequeue: vec![
                    (2, DequeueReason::Duplicate { first_index: 1 }),
                    (3, DequeueReason::Duplicate { first_index: 1 }),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the first index wins whatever the input order",
            config: config(3, 0),
            nodes: vec![node("w1")],
            entries: vec![entry(7, "w1"), entry(3, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![3],
                dequeue: vec![(7, DequeueReason::Duplicate { first_index: 3 })],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a cancelled entry does not count as the first: the later one is live",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").cancelled(), entry(2, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                dequeue: vec![(1, DequeueReason::Cancelled)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a cancelled first and a queued duplicate: the second live one is the duplicate",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").cancelled(), entry(2, "w1"), entry(3, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                dequeue: vec![
                    (1, DequeueReason::Cancelled),
                    (3, DequeueReason::Duplicate { first_index: 2 }),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a cancelled entry still rebooting stays the first for its node: a new one is \
                   a duplicate, never a second drain of a node mid-cycle",
            config: config(3, 0),
            nodes: vec![node("w1").queue_cordoned()],
            entries: vec![entry(1, "w1").rebooting().cancelled(), entry(2, "w1")],
            remediating: vec![],
            want: Want {
                dequeue: vec![(2, DequeueReason::Duplicate { first_index: 1 })],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                cancel_rebooting: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an in-progress duplicate leaves and frees its slot for the first",
            nodes: vec![node("w1").queue_cordoned()],
            entries: vec![entry(1, "w1"), entry(2, "w1").draining()],
            remediating: vec![],
            want: Want {
                start: vec![1],
                dequeue: vec![(2, DequeueReason::Duplicate { first_index: 1 })],
                // w1 starts draining again under entry 1: its cordon stays.
                uncordon: vec![],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

#[test]
fn dequeue_records_the_phase_the_entry_had() {
    let case = Case {
        nodes: vec![node("w1"), node("w2"), node("w3")],
        entries: vec![
            entry(1, "w1").cancelled(),
            entry(2, "w2").draining().cancelled(),
            entry(3, "w3").rebooting().cancelled(),
        ],
        ..Default::default()
    };
    let p = plan(&snapshot_of(&case), now());
    let phases: Vec<EntryPhase> = p.dequeue.iter().map(|d| d.phase).collect();
    assert_eq!(phases, vec![EntryPhase::Queued, EntryPhase::Draining]);
    assert_eq!(
        p.dequeue
            .iter()
            .map(|d| d.reason.code())
            .collect::<Vec<_>>(),
        vec!["Cancelled", "Cancelled"]
    );
    assert_eq!(
        p.cancel_rebooting
            .iter()
            .map(|e| e.index)
            .collect::<Vec<_>>(),
        vec![3],
        "the rebooting one is the controller's to withdraw or wait for"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Disabled.

#[test]
fn disabled_queue_starts_nothing_stops_drains_and_lets_reboots_finish() {
    run(vec![
        Case {
            name: "disabled: queued entries wait with Disabled, nothing starts",
            config: disabled(),
            nodes: vec![node("w1"), api("cp1")],
            entries: vec![entry(1, "w1"), entry(2, "cp1")],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, WaitReason::Disabled), (2, WaitReason::Disabled)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "disabled: a draining entry stops, waits as Disabled, and its node is uncordoned",
            config: disabled(),
            nodes: vec![node("w1").queue_cordoned()],
            entries: vec![entry(1, "w1").draining()],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, WaitReason::Disabled)],
                stop_draining: vec![1],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "disabled: a rebooting entry carries on and keeps its cordon",
            config: disabled(),
            nodes: vec![node("w1").queue_cordoned(), node("w2")],
            entries: vec![entry(1, "w1").rebooting(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, WaitReason::Disabled)],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "disabled: cancels, missing nodes and duplicates are still removed",
            config: disabled(),
            nodes: vec![node("w1"), node("w2")],
            entries: vec![
                entry(1, "w1").cancelled(),
                entry(2, "ghost"),
                entry(3, "w2"),
                entry(4, "w2"),
            ],
            remediating: vec![],
            want: Want {
                dequeue: vec![
                    (1, DequeueReason::Cancelled),
                    (2, DequeueReason::NodeNotFound),
                    (4, DequeueReason::Duplicate { first_index: 3 }),
                ],
                waiting: vec![(3, WaitReason::Disabled)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "disabled: Disabled is the reason even for a backed-off entry",
            config: disabled(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").backed_off(60, 1)],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, WaitReason::Disabled)],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// 3. maxConcurrentReboots.

#[test]
fn max_concurrent_reboots_limits_draining_plus_rebooting() {
    run(vec![
        Case {
            name: "one slot (default): the first starts, the next waits behind it",
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                waiting: vec![(2, behind(1))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "several start at once, up to the free slots, in index order",
            config: config(3, 0),
            nodes: vec![node("w1"), node("w2"), node("w3"), node("w4")],
            entries: vec![
                entry(1, "w1"),
                entry(2, "w2"),
                entry(3, "w3"),
                entry(4, "w4"),
            ],
            remediating: vec![],
            want: Want {
                start: vec![1, 2, 3],
                waiting: vec![(4, behind(3))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "every slot taken: NoFreeSlot names the entries in progress",
            config: config(2, 0),
            nodes: vec![node("w1"), node("w2"), node("w3")],
            entries: vec![
                entry(1, "w1").draining(),
                entry(2, "w2").rebooting(),
                entry(3, "w3"),
            ],
            remediating: vec![],
            want: Want {
                waiting: vec![(3, no_slot(&["w1", "w2"], 2))],
                in_progress: vec![(1, EntryPhase::Draining), (2, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "partly full: the remaining slots are filled, the rest waits behind",
            config: config(3, 0),
            nodes: vec![node("w1"), node("w2"), node("w3"), node("w4")],
            entries: vec![
                entry(1, "w1").rebooting(),
                entry(2, "w2"),
                entry(3, "w3"),
                entry(4, "w4"),
            ],
            remediating: vec![],
            want: Want {
                start: vec![2, 3],
                waiting: vec![(4, behind(2))],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "more in progress than the (lowered) maximum: nothing starts",
            config: config(1, 0),
            nodes: vec![node("w1"), node("w2"), node("w3")],
            entries: vec![
                entry(1, "w1").draining(),
                entry(2, "w2").draining(),
                entry(3, "w3"),
            ],
            remediating: vec![],
            want: Want {
                waiting: vec![(3, no_slot(&["w1", "w2"], 1))],
                in_progress: vec![(1, EntryPhase::Draining), (2, EntryPhase::Draining)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a later in-progress entry still takes its slot from an earlier queued one",
            config: config(1, 0),
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2").rebooting()],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, no_slot(&["w2"], 1))],
                in_progress: vec![(2, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an Unknown phase (a newer writer) is treated as Queued",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").phase(EntryPhase::Unknown)],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// Backoff.

#[test]
fn backed_off_entries_neither_count_nor_block() {
    run(vec![
        Case {
            name: "a backed-off entry waits with its expiry and failures; the next one starts",
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1").backed_off(60, 2), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                waiting: vec![(1, backed_off(60, 2))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "backed-off entries take no slot",
            config: config(1, 0),
            nodes: vec![node("w1"), node("w2"), node("w3")],
            entries: vec![
                entry(1, "w1").backed_off(600, 1),
                entry(2, "w2").backed_off(1, 3),
                entry(3, "w3"),
            ],
            remediating: vec![],
            want: Want {
                start: vec![3],
                waiting: vec![(1, backed_off(600, 1)), (2, backed_off(1, 3))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an expired backoff no longer holds",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").backed_off(-1, 4)],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a backoff expiring exactly now has expired",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").backed_off(0, 1)],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a backed-off worker does not hold back an API server",
            nodes: vec![node("w1"), api("cp1")],
            entries: vec![entry(1, "w1").backed_off(60, 1), entry(2, "cp1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                waiting: vec![(1, backed_off(60, 1))],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// API servers.

#[test]
fn api_servers_go_last_alone_and_one_at_a_time() {
    run(vec![
        Case {
            name: "an API server queued first still waits for every eligible worker",
            config: config(3, 0),
            nodes: vec![api("cp1"), node("w1"), node("w2")],
            entries: vec![entry(1, "cp1"), entry(2, "w1"), entry(3, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![2, 3],
                waiting: vec![(1, after_workers(&["w1", "w2"]))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an API server never starts while a worker is in progress, even with free slots",
            config: config(3, 0),
            nodes: vec![node("w1"), api("cp1")],
            entries: vec![entry(1, "w1").rebooting(), entry(2, "cp1")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, after_workers(&["w1"]))],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "workers waiting for a slot also hold the API server back",
            config: config(1, 0),
            nodes: vec![node("w1"), node("w2"), api("cp1")],
            entries: vec![entry(1, "w1").draining(), entry(2, "cp1"), entry(3, "w2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, after_workers(&["w1", "w2"])), (3, no_slot(&["w1"], 1))],
                in_progress: vec![(1, EntryPhase::Draining)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "API servers alone in the queue: only the first starts, even with free slots",
            config: config(3, 0),
            nodes: vec![api("cp1"), api("cp2"), api("cp3")],
            entries: vec![entry(1, "cp1"), entry(2, "cp2"), entry(3, "cp3")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                waiting: vec![(2, one_at_a_time("cp1")), (3, one_at_a_time("cp1"))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an API server in progress holds back the other API servers",
            config: config(3, 0),
            nodes: vec![api("cp1"), api("cp2")],
            entries: vec![entry(1, "cp1").rebooting(), entry(2, "cp2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, api_busy("cp1"))],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an API server in progress holds back workers too",
            config: config(3, 0),
            nodes: vec![api("cp1"), node("w1"), node("w2")],
            entries: vec![entry(1, "cp1").draining(), entry(2, "w1"), entry(3, "w2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, api_busy("cp1")), (3, api_busy("cp1"))],
                in_progress: vec![(1, EntryPhase::Draining)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "API servers may go while the workers are only backed off",
            config: config(3, 0),
            nodes: vec![node("w1"), node("w2"), api("cp1"), api("cp2")],
            entries: vec![
                entry(1, "w1").backed_off(30, 1),
                entry(2, "cp1"),
                entry(3, "w2").backed_off(90, 2),
                entry(4, "cp2"),
            ],
            remediating: vec![],
            want: Want {
                start: vec![2],
                waiting: vec![
                    (1, backed_off(30, 1)),
                    (3, backed_off(90, 2)),
                    (4, one_at_a_time("cp1")),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a backed-off API server does not hold back the next API server",
            nodes: vec![api("cp1"), api("cp2")],
            entries: vec![entry(1, "cp1").backed_off(30, 1), entry(2, "cp2")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                waiting: vec![(1, backed_off(30, 1))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the API server goes once the last worker has left the queue",
            nodes: vec![node("w1").queue_cordoned(), api("cp1")],
            entries: vec![entry(1, "w1").draining().cancelled(), entry(2, "cp1")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                dequeue: vec![(1, DequeueReason::Cancelled)],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a cancelled worker still rebooting holds the API server back",
            nodes: vec![node("w1").queue_cordoned(), api("cp1")],
            entries: vec![entry(1, "w1").rebooting().cancelled(), entry(2, "cp1")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, after_workers(&["w1"]))],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                cancel_rebooting: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

#[test]
fn master_label_and_control_plane_label_both_make_an_api_server() {
    let node_json = |name: &str, label: Option<&str>| -> Node {
        let mut labels = serde_json::Map::new();
        labels.insert("kubernetes.io/hostname".into(), name.into());
        if let Some(l) = label {
            labels.insert(l.into(), "".into());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": name, "labels": labels },
            "status": { "conditions": [
                { "type": "Ready", "status": "True",
                  "lastHeartbeatTime": "2025-06-15T14:00:00Z" }
            ] }
        }))
        .unwrap()
    };
    let nodes = vec![
        node_json("old-master", Some(hostcycle_core::queue::MASTER_LABEL)),
        node_json("cp", Some(hostcycle_core::queue::CONTROL_PLANE_LABEL)),
        node_json("w", None),
    ];
    let entries = vec![
        hostcycle_api::queue::RebootQueueEntry::for_node("old-master", 1),
        hostcycle_api::queue::RebootQueueEntry::for_node("cp", 2),
        hostcycle_api::queue::RebootQueueEntry::for_node("w", 3),
    ];
    let queue = hostcycle_api::queue::RebootQueue::new(
        "default",
        RebootQueueSpec {
            max_concurrent_reboots: Some(5),
            ..Default::default()
        },
    );
    let snapshot = QueueSnapshot::from_objects(Some(&queue), &nodes, &entries);
    let p = plan(&snapshot, now());
    assert_eq!(
        p.start_draining
            .iter()
            .map(|e| e.node.as_str())
            .collect::<Vec<_>>(),
        vec!["w"],
        "only the worker starts"
    );
    let reasons: Vec<(&str, &WaitReason)> = p
        .waiting
        .iter()
        .map(|w| (w.entry.node.as_str(), &w.reason))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("old-master", &after_workers(&["w"])),
            ("cp", &after_workers(&["w"])),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// 4. The unreachable gate.

#[test]
fn too_many_unreachable_nodes_block_every_start() {
    run(vec![
        Case {
            name: "a NotReady node outside the queue blocks every start (max 0)",
            config: config(3, 0),
            nodes: vec![node("w1"), node("w2"), api("cp1"), node("x").not_ready()],
            entries: vec![entry(1, "w1"), entry(2, "w2"), entry(3, "cp1")],
            remediating: vec![],
            want: Want {
                waiting: vec![
                    (1, unreachable(&["x"], 0)),
                    (2, unreachable(&["x"], 0)),
                    (3, unreachable(&["x"], 0)),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "as many unreachable nodes as allowed: starts go on",
            config: config(1, 1),
            nodes: vec![node("w1"), node("x").not_ready()],
            entries: vec![entry(1, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "one more than allowed: blocked, every unreachable node named",
            config: config(1, 1),
            nodes: vec![node("w1"), node("x").not_ready(), node("y").not_ready()],
            entries: vec![entry(1, "w1")],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, unreachable(&["x", "y"], 1))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the candidate itself counts when it is unreachable",
            nodes: vec![node("w1").not_ready()],
            entries: vec![entry(1, "w1")],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, unreachable(&["w1"], 0))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "powered-off node being rebooted is not counted: the next drain may start",
            config: config(2, 0),
            nodes: vec![node("w1").not_ready().queue_cordoned(), node("w2")],
            entries: vec![entry(1, "w1").rebooting(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a draining node that went unreachable is not counted either",
            config: config(2, 0),
            nodes: vec![node("w1").not_ready(), node("w2")],
            entries: vec![entry(1, "w1").draining(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                in_progress: vec![(1, EntryPhase::Draining)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "unreachable node whose drain was cancelled counts again and blocks",
            config: config(2, 0),
            nodes: vec![node("w1").not_ready().queue_cordoned(), node("w2")],
            entries: vec![entry(1, "w1").draining().cancelled(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                dequeue: vec![(1, DequeueReason::Cancelled)],
                waiting: vec![(2, unreachable(&["w1"], 0))],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "powered-off node whose reboot was cancelled mid-cycle is still in progress, \
                   not counted",
            config: config(2, 0),
            nodes: vec![node("w1").not_ready().queue_cordoned(), node("w2")],
            entries: vec![entry(1, "w1").rebooting().cancelled(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                start: vec![2],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                cancel_rebooting: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "powered-off node with only a queued entry blocks everyone, itself included",
            config: config(2, 0),
            nodes: vec![node("w1").not_ready(), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, unreachable(&["w1"], 0)), (2, unreachable(&["w1"], 0))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the gate does not touch entries already in progress",
            config: config(2, 0),
            nodes: vec![node("w1"), node("w2"), node("x").not_ready()],
            entries: vec![entry(1, "w1").draining(), entry(2, "w2")],
            remediating: vec![],
            want: Want {
                waiting: vec![(2, unreachable(&["x"], 0))],
                in_progress: vec![(1, EntryPhase::Draining)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a backed-off entry keeps its own reason behind the gate",
            nodes: vec![node("w1"), node("x").not_ready()],
            entries: vec![entry(1, "w1").backed_off(60, 1)],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, backed_off(60, 1))],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// Stray cordons.

#[test]
fn the_queue_uncordons_only_its_own_stray_cordons() {
    run(vec![
        Case {
            name: "a queue cordon with no entry is lifted",
            nodes: vec![node("w1").queue_cordoned(), node("w2")],
            remediating: vec![],
            want: Want {
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an administrator's cordon is never lifted",
            nodes: vec![node("w1").admin_cordoned()],
            remediating: vec![],
            want: Want::default(),
            ..Default::default()
        },
        Case {
            name: "nodes draining or rebooting keep the queue's cordon",
            config: config(2, 0),
            nodes: vec![node("w1").queue_cordoned(), node("w2").queue_cordoned()],
            entries: vec![entry(1, "w1").draining(), entry(2, "w2").rebooting()],
            remediating: vec![],
            want: Want {
                in_progress: vec![(1, EntryPhase::Draining), (2, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a node starting to drain now keeps the queue's cordon",
            nodes: vec![node("w1").queue_cordoned()],
            entries: vec![entry(1, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "queued nodes that wait (behind others or backed off) lose the queue's cordon",
            nodes: vec![
                node("w1"),
                node("w2").queue_cordoned(),
                node("w3").queue_cordoned(),
            ],
            entries: vec![
                entry(1, "w1"),
                entry(2, "w2"),
                entry(3, "w3").backed_off(60, 1),
            ],
            remediating: vec![],
            want: Want {
                start: vec![1],
                waiting: vec![(2, behind(1)), (3, backed_off(60, 1))],
                uncordon: vec!["w2", "w3"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "nodes of dequeued in-progress entries are uncordoned; a cancelled reboot \
                   keeps its cordon",
            config: config(3, 0),
            nodes: vec![
                node("w1").queue_cordoned(),
                node("w2").queue_cordoned(),
                node("w3").queue_cordoned(),
            ],
            entries: vec![
                entry(1, "w1").draining().cancelled(),
                entry(2, "w2").rebooting().cancelled(),
                entry(3, "w3").rebooting(),
            ],
            remediating: vec![],
            want: Want {
                dequeue: vec![(1, DequeueReason::Cancelled)],
                in_progress: vec![(2, EntryPhase::Rebooting), (3, EntryPhase::Rebooting)],
                cancel_rebooting: vec![2],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "nodes of stopped drains (queue disabled) are uncordoned, rebooting ones not",
            config: disabled(),
            nodes: vec![node("w1").queue_cordoned(), node("w2").queue_cordoned()],
            entries: vec![entry(1, "w1").draining(), entry(2, "w2").rebooting()],
            remediating: vec![],
            want: Want {
                waiting: vec![(1, WaitReason::Disabled)],
                in_progress: vec![(2, EntryPhase::Rebooting)],
                stop_draining: vec![1],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// CannotReboot.

fn unusable(name: &str) -> RebootTarget {
    RebootTarget::UnusableHost {
        host: host_ref(name),
        why: "is paused".into(),
    }
}

fn with_commands(method: Option<RebootMethod>) -> QueueConfig {
    QueueConfig {
        reboot: RebootConfig {
            method,
            commands: Ok(CommandSet {
                reboot: names(&["ipmi-reboot"]),
                boot_check: names(&["check-boot"]),
            }),
            ..QueueConfig::default().reboot
        },
        ..QueueConfig::default()
    }
}

#[test]
fn entries_that_cannot_be_rebooted_wait_without_taking_a_slot() {
    let plain = QueueConfig::default();
    let commands = with_commands(None);
    run(vec![
        Case {
            name: "no host and no commands: CannotReboot; the next entry starts",
            config: plain.clone(),
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            targets: vec![
                ("w1", RebootTarget::NoHost),
                ("w2", RebootTarget::Host(host_ref("w2"))),
            ],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![2],
                waiting: vec![(1, cannot(&plain, &RebootTarget::NoHost))],
                ..Default::default()
            },
        },
        Case {
            name: "unusable host: CannotReboot naming it",
            config: plain.clone(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            targets: vec![("w1", unusable("w1"))],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![(1, cannot(&plain, &unusable("w1")))],
                ..Default::default()
            },
        },
        Case {
            name: "no host but both commands set: starts (Command method)",
            config: commands.clone(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            targets: vec![("w1", RebootTarget::NoHost)],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![1],
                ..Default::default()
            },
        },
        Case {
            name: "reboot target unknown (offline snapshot): the plan does not wait for it",
            config: plain.clone(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            remediating: vec![],
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a worker that cannot be rebooted does not hold back an API server",
            config: plain.clone(),
            nodes: vec![node("w1"), api("cp1")],
            entries: vec![entry(1, "w1"), entry(2, "cp1")],
            targets: vec![
                ("w1", RebootTarget::NoHost),
                ("cp1", RebootTarget::Host(host_ref("cp1"))),
            ],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![2],
                waiting: vec![(1, cannot(&plain, &RebootTarget::NoHost))],
                ..Default::default()
            },
        },
        Case {
            name: "an API server that cannot be rebooted waits as CannotReboot",
            config: plain.clone(),
            nodes: vec![api("cp1"), api("cp2")],
            entries: vec![entry(1, "cp1"), entry(2, "cp2")],
            targets: vec![("cp1", unusable("cp1"))],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![2],
                waiting: vec![(1, cannot(&plain, &unusable("cp1")))],
                ..Default::default()
            },
        },
        Case {
            name: "backed off wins over CannotReboot",
            config: plain.clone(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").backed_off(60, 1)],
            targets: vec![("w1", RebootTarget::NoHost)],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![(1, backed_off(60, 1))],
                ..Default::default()
            },
        },
        Case {
            name: "entries in progress are not re-judged",
            config: plain.clone(),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").rebooting()],
            targets: vec![("w1", RebootTarget::NoHost)],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
        },
    ]);
}

/// A node rebooted by command whose address (from its Node status, written by its kubelet)
/// is not an IP or a DNS name waits, `Blocked` with `UnsafeNodeAddress`: it is never drained
/// for a command that must not run. Nodes rebooted through their BareMetalHost are not
/// concerned (no command gets their address).
#[test]
fn a_node_rebooted_by_command_with_an_unsafe_address_waits_unsafe_node_address() {
    let with_address = |name: &str, address: &str| QueueNodeView {
        address: address.to_string(),
        ..node(name)
    };
    let refusal = |address: &str, why: &str| WaitReason::UnsafeNodeAddress {
        address: format!("{address:?}"),
        why: why.to_string(),
    };
    let option = "it starts with '-' (a command reads it as an option)";
    let commands = with_commands(None);
    let by_command = with_commands(Some(RebootMethod::Command));
    run(vec![
        Case {
            name: "no host, commands set: `-o…` waits (without a slot); a safe IP starts",
            config: commands.clone(),
            nodes: vec![
                with_address("w1", "-oProxyCommand=x"),
                with_address("w2", "10.0.0.2"),
            ],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            targets: vec![("w1", RebootTarget::NoHost), ("w2", RebootTarget::NoHost)],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![2],
                waiting: vec![(1, refusal("-oProxyCommand=x", option))],
                ..Default::default()
            },
        },
        Case {
            name: "method Command, even with a host; offline (no targets) too",
            config: by_command.clone(),
            nodes: vec![with_address("w1", "$(x)"), with_address("w2", "-x")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            targets: vec![("w1", RebootTarget::Host(host_ref("w1")))],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![
                    (
                        1,
                        refusal(
                            "$(x)",
                            "it holds '$', which is neither a lowercase letter, a digit, '-' nor '.'",
                        ),
                    ),
                    (2, refusal("-x", option)),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "rebooted through the host: the address is not used",
            config: commands.clone(),
            nodes: vec![with_address("w1", "-oProxyCommand=x")],
            entries: vec![entry(1, "w1")],
            targets: vec![("w1", RebootTarget::Host(host_ref("w1")))],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![1],
                ..Default::default()
            },
        },
    ]);
    let blocked = refusal("-x", option).blocked().unwrap();
    assert_eq!(blocked.event_reason, "UnsafeNodeAddress");
    assert_eq!(blocked.condition_reason, "UnsafeNodeAddress");
    let text = refusal("-x", option).to_string();
    assert!(
        text.starts_with("cannot be rebooted by command: its address \"-x\" (from the Node's"),
        "{text}"
    );
    let other = WaitReason::CannotReboot { why: "x".into() }
        .blocked()
        .unwrap();
    assert_eq!(other.event_reason, "RebootBlocked");
    assert_eq!(WaitReason::Disabled.blocked(), None);
}

/// A node whose kubelet reports `addresses` (InternalIP first; none: its name is its address).
fn reporting(name: &str, addresses: &[&str]) -> QueueNodeView {
    QueueNodeView {
        address: addresses
            .first()
            .map_or_else(|| name.to_string(), |a| a.to_string()),
        reported_addresses: addresses.iter().map(|a| a.to_string()).collect(),
        ..node(name)
    }
}

/// No BareMetalHost for any of `nodes`.
fn no_host(nodes: &[&'static str]) -> Vec<(&'static str, RebootTarget)> {
    nodes.iter().map(|n| (*n, RebootTarget::NoHost)).collect()
}

/// A node rebooted by command whose address another Node reports too — a kubelet may write
/// another node's address as its own — waits, `Blocked` with `AmbiguousNodeAddress`: the
/// commands could reboot (and boot-check) the other node, undrained. Both nodes wait, since
/// which one owns the address is unknown. IPs are compared in canonical form.
#[test]
fn a_node_rebooted_by_command_with_another_nodes_address_waits_ambiguous_node_address() {
    let shared = |address: &str, other: &str| WaitReason::AmbiguousNodeAddress {
        address: format!("{address:?}"),
        other: other.to_string(),
    };
    let commands = with_commands(None);
    run(vec![
        Case {
            name: "w1 reports w2's IP: both wait, each naming the other",
            config: commands.clone(),
            nodes: vec![
                reporting("w1", &["10.0.0.2"]),
                reporting("w2", &["10.0.0.2"]),
            ],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            targets: no_host(&["w1", "w2"]),
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![(1, shared("10.0.0.2", "w2")), (2, shared("10.0.0.2", "w1"))],
                ..Default::default()
            },
        },
        Case {
            name: "IPs in canonical form: an IPv4-mapped IPv6 and a zero-padded IPv6",
            config: commands.clone(),
            nodes: vec![
                reporting("w1", &["::ffff:10.0.0.2"]),
                reporting("w2", &["10.0.0.2", "fd00::2"]),
                reporting("w3", &["fd00:0:0::2"]),
            ],
            entries: vec![entry(1, "w1"), entry(3, "w3")],
            targets: no_host(&["w1", "w3"]),
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![
                    (1, shared("::ffff:10.0.0.2", "w2")),
                    (3, shared("fd00:0:0::2", "w2")),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "another node's ExternalIP or Hostname counts, and a node unqueued blocks too",
            config: commands.clone(),
            nodes: vec![
                reporting("w1", &["203.0.113.9"]),
                reporting("w2", &["10.0.0.2", "203.0.113.9"]),
                reporting("w3", &["w4.lab"]),
                reporting("w4", &["10.0.0.4", "W4.Lab."]),
                reporting("w5", &["w6"]),
                reporting("w6", &[]),
            ],
            entries: vec![entry(1, "w1"), entry(3, "w3"), entry(5, "w5")],
            targets: no_host(&["w1", "w3", "w5"]),
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![
                    (1, shared("203.0.113.9", "w2")),
                    (3, shared("w4.lab", "w4")),
                    (5, shared("w6", "w6")),
                ],
                ..Default::default()
            },
        },
    ]);
    let blocked = shared("10.0.0.2", "w2").blocked().unwrap();
    assert_eq!(blocked.event_reason, "AmbiguousNodeAddress");
    assert_eq!(blocked.condition_reason, "AmbiguousNodeAddress");
    assert_eq!(
        shared("10.0.0.2", "w2").to_string(),
        "cannot be rebooted by command: its address \"10.0.0.2\" (from the Node's status) is \
         also an address of node w2; the commands are not run with it"
    );
}

/// Addresses of their own, a shared address the commands do not use, and an unsafe one (which
/// is refused as such) are not `AmbiguousNodeAddress`.
#[test]
fn only_a_command_address_another_node_reports_is_ambiguous() {
    let commands = with_commands(None);
    run(vec![
        Case {
            name: "distinct addresses start; a node's own addresses are not another's",
            config: QueueConfig {
                max_concurrent_reboots: 2,
                ..commands.clone()
            },
            nodes: vec![
                reporting("w1", &["10.0.0.1", "10.0.0.1", "w1"]),
                reporting("w2", &["10.0.0.2"]),
            ],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            targets: no_host(&["w1", "w2"]),
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![1, 2],
                ..Default::default()
            },
        },
        Case {
            name: "rebooted through the host: the address is not used",
            config: commands.clone(),
            nodes: vec![
                reporting("w1", &["10.0.0.2"]),
                reporting("w2", &["10.0.0.2"]),
            ],
            entries: vec![entry(1, "w1")],
            targets: vec![("w1", RebootTarget::Host(host_ref("w1")))],
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                start: vec![1],
                ..Default::default()
            },
        },
        Case {
            name: "an unsafe address is refused as such, whoever else reports it",
            config: commands.clone(),
            nodes: vec![reporting("w1", &["-x"]), reporting("w2", &["-x"])],
            entries: vec![entry(1, "w1")],
            targets: no_host(&["w1"]),
            remediating: vec![],
            facts: Facts::default(),
            want: Want {
                waiting: vec![(
                    1,
                    WaitReason::UnsafeNodeAddress {
                        address: "\"-x\"".into(),
                        why: "it starts with '-' (a command reads it as an option)".into(),
                    },
                )],
                ..Default::default()
            },
        },
    ]);
}

/// (name, config, target, the method or words the reason must contain)
type MethodCase<'a> = (
    &'a str,
    &'a QueueConfig,
    &'a RebootTarget,
    Result<RebootMethod, &'a [&'a str]>,
);

#[test]
fn resolve_method_picks_bmc_for_hosts_and_command_only_when_a_command_set_is_configured() {
    let host = RebootTarget::Host(host_ref("h"));
    let unusable_host = unusable("h");
    let no_host = RebootTarget::NoHost;
    let configured = |value: &str| {
        let data = [("default".to_string(), value.to_string())]
            .into_iter()
            .collect();
        CommandSets::from_config_map_data(Some(&data))
    };
    let only_reboot = QueueConfig::resolve(
        &RebootQueueSpec::default(),
        &configured("rebootCommand: [reboot]\n"),
    );
    let no_config_map = QueueConfig::resolve(&RebootQueueSpec::default(), &CommandSets::Absent);
    let bmc = QueueConfig {
        reboot: RebootConfig {
            method: Some(RebootMethod::Bmc),
            ..QueueConfig::default().reboot
        },
        ..QueueConfig::default()
    };
    let command_without_commands = QueueConfig {
        reboot: RebootConfig {
            method: Some(RebootMethod::Command),
            ..QueueConfig::default().reboot
        },
        ..QueueConfig::default()
    };
    let plain = QueueConfig::default();
    let cmds = with_commands(None);
    let bmc_cmds = with_commands(Some(RebootMethod::Bmc));
    let command_cmds = with_commands(Some(RebootMethod::Command));
    #[rustfmt::skip]
    let cases: Vec<MethodCase> = vec![
        ("unset + usable host → BMC", &plain, &host, Ok(RebootMethod::Bmc)),
        ("unset + usable host + commands → BMC", &cmds, &host, Ok(RebootMethod::Bmc)),
        ("unset + no host + commands → Command", &cmds, &no_host, Ok(RebootMethod::Command)),
        ("unset + no host, commands not read → Err", &plain, &no_host, Err(&["no BareMetalHost", "no reboot command", "not known"])),
        ("unset + no host, no ConfigMap → Err", &no_config_map, &no_host, Err(&["no BareMetalHost", "hostcycle-reboot-commands", "\"default\""])),
        ("unset + no host + reboot command only → Err", &only_reboot, &no_host, Err(&["is invalid", "bootCheckCommand"])),
        ("unset + unusable host → Err naming the host", &plain, &unusable_host, Err(&["metal/h", "is paused"])),
        ("unset + unusable host + commands → Err (the host's method)", &cmds, &unusable_host, Err(&["metal/h", "is paused"])),
        ("BMC + usable host → BMC", &bmc, &host, Ok(RebootMethod::Bmc)),
        ("BMC + no host → Err", &bmc, &no_host, Err(&["no BareMetalHost found"])),
        ("BMC + no host + commands → Err", &bmc_cmds, &no_host, Err(&["no BareMetalHost found"])),
        ("BMC + unusable host → Err", &bmc, &unusable_host, Err(&["metal/h", "is paused"])),
        ("Command + commands + usable host → Command", &command_cmds, &host, Ok(RebootMethod::Command)),
        ("Command + commands + unusable host → Command", &command_cmds, &unusable_host, Ok(RebootMethod::Command)),
        ("Command + commands + no host → Command", &command_cmds, &no_host, Ok(RebootMethod::Command)),
        ("Command without commands → Err", &command_without_commands, &host, Err(&["method is Command", "cannot run"])),
    ];
    for (name, config, target, want) in cases {
        let got = resolve_method(&config.reboot, target);
        match (want, got) {
            (Ok(w), Ok(g)) => assert_eq!(g, w, "{name}"),
            (Err(words), Err(why)) => {
                for word in words {
                    assert!(why.contains(word), "{name}: {why:?} lacks {word:?}");
                }
            }
            (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// FIFO.

#[test]
fn fifo_by_index_regardless_of_input_order_and_object_names() {
    // Names sort the other way round from indexes: only the index may decide.
    run(vec![Case {
        name: "reverse input, reverse names",
        config: config(2, 0),
        nodes: vec![
            node("w1"),
            node("w2"),
            node("w3"),
            node("w4"),
            node("w5"),
            node("w6"),
        ],
        entries: vec![
            entry(60, "w6").named("a-six").draining(),
            entry(50, "w5").named("b-five"),
            entry(40, "w4").named("c-four"),
            entry(30, "w3").named("d-three"),
            entry(20, "w2").named("e-two"),
            entry(10, "w1").named("f-one").cancelled(),
            entry(11, "w1").named("g-one-again"),
            entry(12, "w1").named("h-dup"),
        ],
        remediating: vec![],
        want: Want {
            start: vec![11],
            dequeue: vec![
                (10, DequeueReason::Cancelled),
                (12, DequeueReason::Duplicate { first_index: 11 }),
            ],
            waiting: vec![
                (20, behind(1)),
                (30, behind(1)),
                (40, behind(1)),
                (50, behind(1)),
            ],
            in_progress: vec![(60, EntryPhase::Draining)],
            ..Default::default()
        },
        ..Default::default()
    }]);
}

// ---------------------------------------------------------------------------------------
// Texts.

#[test]
fn wait_and_dequeue_reasons_read_as_sentences() {
    #[rustfmt::skip]
    let cases: Vec<(WaitReason, &[&str])> = vec![
        (WaitReason::Disabled, &["disabled"]),
        (backed_off(60, 1), &["backed off", "1 failed attempt ", "until 2025-06-15T15:07:40Z"]),
        (backed_off(60, 3), &["3 failed attempts"]),
        (no_slot(&["w1"], 1), &["all 1 slot (maxConcurrentReboots)", "w1"]),
        (no_slot(&["w1", "w2"], 2), &["2 slots", "w1, w2"]),
        (behind(1), &["the 1 free slot goes to entries queued earlier"]),
        (behind(3), &["the 3 free slots go to entries queued earlier"]),
        (after_workers(&["w1", "w2"]), &["API-server", "worker", "w1, w2"]),
        (api_busy("cp1"), &["API-server node cp1 is being processed"]),
        (one_at_a_time("cp1"), &["one at a time", "cp1 is first"]),
        (unreachable(&["x"], 0), &["1 unreachable node not being rebooted (x) exceeds maxUnreachableNodes=0"]),
        (unreachable(&["x", "y"], 1), &["2 unreachable nodes", "(x, y) exceed maxUnreachableNodes=1"]),
        (
            unreachable(&["a", "b", "c", "d", "e", "f", "g"], 0),
            &["a, b, c, d, e and 2 more"],
        ),
        (WaitReason::CannotReboot { why: "its BareMetalHost metal/h is paused".into() },
            &["cannot be rebooted: its BareMetalHost metal/h is paused"]),
        (unreachable_away(&["cp-0", "x"], 1, vec![away("cp-0", NO_NODE_CP0, false)]),
            &["2 unreachable nodes", "(cp-0, x) exceed maxUnreachableNodes=1",
              "; node cp-0 is absent (Machine capi/m-cp-0 has nodeRef cp-0 but no Node exists)"]),
        (unreachable_away(&["w0"], 0, vec![away("w0", "its BareMetalHost metal/w0 is offline", true)]),
            &["node w0 is away (its BareMetalHost metal/w0 is offline)"]),
        (api_away(away("cp-0", NO_NODE_CP0, false)),
            &["API-server node cp-0 is absent (Machine capi/m-cp-0 has nodeRef cp-0 but no Node exists)",
              "one at a time"]),
    ];
    for (reason, words) in cases {
        let text = reason.to_string();
        for word in words {
            assert!(text.contains(word), "{reason:?}: {text:?} lacks {word:?}");
        }
        assert!(!text.contains("{"), "{text:?} looks like Debug output");
    }
    assert_eq!(DequeueReason::Cancelled.to_string(), "cancelled");
    assert!(
        DequeueReason::NodeNotFound
            .to_string()
            .contains("not found")
    );
    let dup = DequeueReason::Duplicate { first_index: 7 };
    assert!(dup.to_string().contains("entry 7"));
    assert_eq!(dup.code(), "Duplicate");
    assert_eq!(DequeueReason::NodeNotFound.code(), "NodeNotFound");
}

// ---------------------------------------------------------------------------------------
// Properties over random snapshots.

const NODE_NAMES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];
/// Nodes that may be away: the six, and two without a Node object.
const AWAY_NAMES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "gone-0", "gone-1"];

fn arb_node(name: &'static str) -> impl Strategy<Value = QueueNodeView> {
    (any::<bool>(), prop::bool::weighted(0.8), any::<bool>()).prop_map(
        move |(api_server, ready, cordoned)| {
            let mut n = node(name);
            n.api_server = api_server;
            n.ready = ready;
            n.cordoned_by_queue = cordoned;
            n.unschedulable = cordoned;
            n
        },
    )
}

fn arb_target() -> impl Strategy<Value = Option<RebootTarget>> {
    prop_oneof![
        3 => Just(None),
        3 => Just(Some(RebootTarget::Host(host_ref("h")))),
        1 => Just(Some(RebootTarget::NoHost)),
        1 => Just(Some(unusable("h"))),
    ]
}

fn arb_entry() -> impl Strategy<Value = EntryView> {
    (
        // Node: one of the six, or one that does not exist.
        0..NODE_NAMES.len() + 1,
        prop_oneof![
            4 => Just(EntryPhase::Queued),
            2 => Just(EntryPhase::Draining),
            2 => Just(EntryPhase::Rebooting),
            1 => Just(EntryPhase::Unknown),
        ],
        prop::bool::weighted(0.15),
        prop::option::weighted(0.3, -100_i64..100),
        0_u32..5,
    )
        .prop_map(|(n, phase, cancel, expire, failures)| {
            let node = NODE_NAMES.get(n).copied().unwrap_or("ghost");
            let mut e = entry(0, node).phase(phase);
            e.cancel = cancel;
            e.backoff_expire = expire.map(ts);
            e.backoff_count = failures;
            e
        })
}

fn arb_snapshot() -> impl Strategy<Value = QueueSnapshot> {
    let nodes = (
        arb_node(NODE_NAMES[0]),
        arb_node(NODE_NAMES[1]),
        arb_node(NODE_NAMES[2]),
        arb_node(NODE_NAMES[3]),
        arb_node(NODE_NAMES[4]),
        arb_node(NODE_NAMES[5]),
    );
    let targets = prop::collection::vec(arb_target(), NODE_NAMES.len());
    let entries = prop::collection::vec(arb_entry(), 0..10)
        // Unique indexes, handed out in a shuffled order; object names from another
        // shuffle, so that they need not sort like the indexes.
        .prop_flat_map(|entries| {
            let n = entries.len() as u64;
            (
                Just(entries),
                Just((1..=n).collect::<Vec<u64>>()).prop_shuffle(),
                Just((1..=n).collect::<Vec<u64>>()).prop_shuffle(),
                any::<bool>(),
            )
        })
        .prop_map(|(mut entries, indexes, name_order, canonical)| {
            for ((e, i), k) in entries.iter_mut().zip(indexes).zip(name_order) {
                e.index = i * 10;
                e.name = if canonical {
                    format!("rqe-{:010}", e.index)
                } else {
                    format!("entry-{k}")
                };
            }
            entries
        });
    (
        nodes,
        targets,
        entries,
        prop::bool::weighted(0.85),
        1_u32..4,
        0_u32..3,
        any::<bool>(),
        // Away: each of the six nodes, or one without a Node object, maybe, as an API server
        // or not.
        prop::collection::vec(
            prop::option::weighted(0.15, any::<bool>()),
            AWAY_NAMES.len(),
        ),
    )
        .prop_map(
            |(nodes, targets, entries, enabled, max_concurrent, max_unreachable, cmds, away)| {
                let mut config = if cmds {
                    with_commands(None)
                } else {
                    QueueConfig::default()
                };
                config.enabled = enabled;
                config.max_concurrent_reboots = max_concurrent;
                config.max_unreachable_nodes = max_unreachable;
                let (a, b, c, d, e, f) = nodes;
                let nodes: BTreeMap<String, QueueNodeView> = [a, b, c, d, e, f]
                    .into_iter()
                    .map(|n| (n.name.clone(), n))
                    .collect();
                let away = AWAY_NAMES
                    .iter()
                    .zip(away)
                    .filter_map(|(n, api)| {
                        let node = nodes.get(*n);
                        let away = AwayNode {
                            why: "test".into(),
                            // An existing Node's labels decide (`away_nodes`).
                            api_server: node.map_or(api?, |n| n.api_server),
                            has_node: node.is_some(),
                        };
                        Some((n.to_string(), away))
                    })
                    .collect();
                QueueSnapshot {
                    config,
                    away,
                    nodes,
                    entries,
                    being_remediated: Default::default(),
                    reboot_targets: NODE_NAMES
                        .iter()
                        .zip(targets)
                        .filter_map(|(n, t)| t.map(|t| (n.to_string(), t)))
                        .collect(),
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn plan_invariants(s in arb_snapshot()) {
        let now = now();
        let p = plan(&s, now);
        let is_api = |node: &str| s.nodes.get(node).is_some_and(|n| n.api_server);
        let max = s.config.max_concurrent_reboots as usize;

        let in_progress: Vec<&str> = p.in_progress.iter().map(|(r, _)| r.node.as_str()).collect();
        let starting: Vec<&str> = p.start_draining.iter().map(|r| r.node.as_str()).collect();

        // Never more than maxConcurrentReboots in progress once the starts are made (a
        // queue already over the limit, e.g. after the limit was lowered, starts nothing).
        let after = in_progress.len() + starting.len();
        prop_assert!(after <= max.max(in_progress.len()), "{after} > {max}: {p:#?}");
        if !starting.is_empty() {
            prop_assert!(after <= max, "{after} > {max}: {p:#?}");
        }

        // At most one API server in progress + starting (none added to one already there).
        let api_in_progress = in_progress.iter().filter(|n| is_api(n)).count();
        let api_starting = starting.iter().filter(|n| is_api(n)).count();
        prop_assert!(api_starting <= 1, "{p:#?}");
        if api_starting > 0 {
            prop_assert_eq!(api_in_progress, 0, "{:#?}", p);
            // Never an API server starting while any worker is in progress or starting.
            prop_assert!(in_progress.iter().all(|n| is_api(n)), "{:#?}", p);
            prop_assert_eq!(starting.len(), 1, "{:#?}", p);
        }
        // Nothing starts next to an API server in progress.
        if api_in_progress > 0 {
            prop_assert!(starting.is_empty(), "{:#?}", p);
        }

        // A started entry is live, queued, not backed off, not cancelled, not a duplicate,
        // and the queue is enabled.
        let by_index: BTreeMap<u64, &EntryView> = s.entries.iter().map(|e| (e.index, e)).collect();
        for r in &p.start_draining {
            let e = by_index[&r.index];
            prop_assert!(s.config.enabled);
            prop_assert!(!e.cancel);
            prop_assert!(!e.backed_off(now));
            prop_assert!(!e.phase.in_progress());
            prop_assert!(s.nodes.contains_key(&e.node));
            let earlier_live = s.entries.iter().any(|f| {
                f.node == e.node && !f.cancel && f.index < e.index
            });
            prop_assert!(!earlier_live, "started a duplicate: {r:?}");
            if let Some(target) = s.reboot_targets.get(&e.node) {
                prop_assert!(resolve_method(&s.config.reboot, target).is_ok());
            }
        }
        // Starts pass the unreachable gate.
        if !starting.is_empty() {
            let unreachable = s.nodes.values()
                .filter(|n| !n.ready && !in_progress.contains(&n.name.as_str()))
                .count();
            prop_assert!(unreachable <= s.config.max_unreachable_nodes as usize);
            // Away nodes count too, each node once.
            let counted: BTreeSet<&str> = s.nodes.values()
                .filter(|n| !n.ready)
                .map(|n| n.name.as_str())
                .chain(s.away.keys().map(String::as_str))
                .filter(|n| !in_progress.contains(n))
                .collect();
            prop_assert!(counted.len() <= s.config.max_unreachable_nodes as usize, "{:#?}", p);
        }
        // No API server starts while another API-server node is away (and not in progress).
        for started in starting.iter().filter(|n| is_api(n)) {
            let other_away = s.away.iter().find(|(n, a)| {
                a.api_server && n.as_str() != *started && !in_progress.contains(&n.as_str())
            });
            prop_assert!(other_away.is_none(), "{started} started, {other_away:?} away: {p:#?}");
        }

        // Every entry lands in exactly one of: dequeue, in progress, start, waiting; every
        // live queued entry (stopped drains included) in exactly one of start or waiting.
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for i in p.dequeue.iter().map(|d| d.entry.index)
            .chain(p.in_progress.iter().map(|(r, _)| r.index))
            .chain(p.start_draining.iter().map(|r| r.index))
            .chain(p.waiting.iter().map(|w| w.entry.index))
        {
            *seen.entry(i).or_default() += 1;
        }
        let indexes: BTreeSet<u64> = by_index.keys().copied().collect();
        prop_assert_eq!(seen.keys().copied().collect::<BTreeSet<u64>>(), indexes);
        prop_assert!(seen.values().all(|&n| n == 1), "{:?}", seen);
        let dequeued: BTreeSet<u64> = p.dequeue.iter().map(|d| d.entry.index).collect();
        for e in &s.entries {
            let queued_live = !dequeued.contains(&e.index)
                && (!e.phase.in_progress() || (!s.config.enabled && e.phase == EntryPhase::Draining));
            let in_start_or_wait = p.start_draining.iter().any(|r| r.index == e.index)
                || p.waiting.iter().any(|w| w.entry.index == e.index);
            prop_assert_eq!(queued_live, in_start_or_wait, "entry {}", e.index);
        }
        // Stopped drains only when disabled, and they are listed as waiting (Disabled).
        for r in &p.stop_draining {
            prop_assert!(!s.config.enabled);
            prop_assert!(p.waiting.iter().any(|w| w.entry == *r && w.reason == WaitReason::Disabled));
        }
        if !s.config.enabled {
            prop_assert!(starting.is_empty());
            prop_assert!(p.in_progress.iter().all(|(_, ph)| *ph == EntryPhase::Rebooting));
        }

        // Lists are in index order.
        let sorted = |v: Vec<u64>| v.windows(2).all(|w| w[0] < w[1]);
        prop_assert!(sorted(p.start_draining.iter().map(|r| r.index).collect()));
        prop_assert!(sorted(p.waiting.iter().map(|w| w.entry.index).collect()));
        prop_assert!(sorted(p.dequeue.iter().map(|d| d.entry.index).collect()));
        prop_assert!(sorted(p.in_progress.iter().map(|(r, _)| r.index).collect()));

        // Uncordon: only the queue's cordons, never a node in progress or starting.
        for n in &p.uncordon {
            prop_assert!(s.nodes[n].cordoned_by_queue);
            prop_assert!(!in_progress.contains(&n.as_str()));
            prop_assert!(!starting.contains(&n.as_str()));
        }

        // Pure.
        prop_assert_eq!(plan(&s, now), p);
    }
}

// Coordination with remediation.

#[test]
fn a_node_being_remediated_is_neither_drained_nor_started() {
    run(vec![
        Case {
            name: "queued: waits with BeingRemediated; the node counts as unreachable, so with \
                   maxUnreachableNodes 0 nothing else starts",
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            remediating: vec!["w1"],
            want: Want {
                waiting: vec![
                    (1, WaitReason::BeingRemediated),
                    (2, unreachable(&["w1"], 0)),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "queued, maxUnreachableNodes 1: the next entry takes the slot",
            config: config(1, 1),
            nodes: vec![node("w1"), node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            remediating: vec!["w1"],
            want: Want {
                start: vec![2],
                waiting: vec![(1, WaitReason::BeingRemediated)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a fenced node whose Node object is deleted still counts as unreachable",
            nodes: vec![node("cp2").api_server(), node("cp3").api_server()],
            entries: vec![entry(1, "cp2")],
            remediating: vec!["cp1"],
            want: Want {
                waiting: vec![(1, unreachable(&["cp1"], 0))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a fenced node that is also NotReady counts once",
            config: config(1, 1),
            nodes: vec![node("w1").not_ready(), node("w2")],
            entries: vec![entry(2, "w2")],
            remediating: vec!["w1"],
            want: Want {
                start: vec![2],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "draining: the drain stops (back to Queued) and its cordon is lifted",
            nodes: vec![node("w1").queue_cordoned()],
            entries: vec![entry(1, "w1").draining()],
            remediating: vec!["w1"],
            want: Want {
                stop_draining: vec![1],
                waiting: vec![(1, WaitReason::BeingRemediated)],
                uncordon: vec!["w1"],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "queued, Node released by the remediation: kept, waits with BeingRemediated \
                   (and counts as unreachable)",
            nodes: vec![node("w2")],
            entries: vec![entry(1, "w1"), entry(2, "w2")],
            remediating: vec!["w1"],
            want: Want {
                waiting: vec![
                    (1, WaitReason::BeingRemediated),
                    (2, unreachable(&["w1"], 0)),
                ],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "Node gone and no remediation: dequeued as NodeNotFound",
            nodes: vec![node("w2")],
            entries: vec![entry(1, "w1")],
            remediating: vec!["w2"],
            want: Want {
                dequeue: vec![(1, DequeueReason::NodeNotFound)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "rebooting: the reboot goes on (the remediation waits for it instead)",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1").rebooting()],
            remediating: vec!["w1"],
            want: Want {
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

// ---------------------------------------------------------------------------------------
// Who is away: nodes known to exist but absent, fenced or held off (rules 4 and 5).

const NO_NODE_W0: &str = "Machine capi/m-w0 has nodeRef w0 but no Node exists";
const FAILED: &str = "remediation.hostcycle.io/failed";
const OWN_HOST_RECORD: &str = "remediation.hostcycle.io/host";

#[test]
fn nodes_known_to_exist_but_away_count_as_unreachable() {
    let held_w0 = || held("w0", &host_held_by_annotation("w0"));
    run(vec![
        Case {
            name: "a Machine whose nodeRef names no Node counts (max 0), and says why",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(&["w0"], 0, vec![away("w0", NO_NODE_W0, false)]),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a Machine whose Node exists and is Ready does not count",
            nodes: vec![node("w0"), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a remediation that gave up, its Node still deleted, counts",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                requests: vec![request("w0", RemediationStep::GaveUp)],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "HostRemediation default/w0 ended (GaveUp) and no Node w0 exists",
                            false,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a remediation that is done (or gave up) with its Node back and Ready does \
                   not count",
            nodes: vec![node("w0"), node("w1"), node("w2")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                requests: vec![
                    request("w0", RemediationStep::Done),
                    request("w2", RemediationStep::GaveUp),
                ],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "hostcycle's annotation flow that gave up, its Node deleted: named by the \
                   failure",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![
                    machine("m-w0", "w0")
                        .annotate(OWN_HOST_RECORD, "metal/w0/uid")
                        .annotate(FAILED, "the Node did not come back"),
                ],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "hostcycle's remediation of Machine capi/m-w0 gave up (the Node did \
                             not come back) and no Node w0 exists",
                            false,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a remediation at work counts with its step, the Node gone",
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            remediating: vec!["w0"],
            facts: Facts {
                requests: vec![request("w0", RemediationStep::PowerOnRequested)],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "HostRemediation default/w0 is remediating it (step PowerOnRequested)",
                            false,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "another remediator's markers on a Machine count, its Node present and Ready",
            nodes: vec![node("w0"), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![
                    machine("m-w0", "w0")
                        .annotate("host.metal3.io/external-remediation", "")
                        .annotate("remediation.metal3.io/powered-off-for-remediation", ""),
                ],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "Machine capi/m-w0 carries remediation markers without hostcycle's \
                             record (another remediator's, or a remediation not started yet): \
                             host.metal3.io/external-remediation, \
                             remediation.metal3.io/powered-off-for-remediation",
                            true,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "CAPBM's power-off on the Machine's host counts",
            nodes: vec![node("w0"), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0").host_powered_off()],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "Machine capi/m-w0 carries remediation markers without hostcycle's \
                             record (another remediator's, or a remediation not started yet): \
                             its host's reboot.metal3.io/capbm-requested-power-off",
                            true,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a held-off host counts, its Node still Ready",
            nodes: vec![node("w0"), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                hosts: vec![held_w0()],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(
                        &["w0"],
                        0,
                        vec![away(
                            "w0",
                            "its BareMetalHost metal/w0 is held off (reboot.metal3.io/hold)",
                            true,
                        )],
                    ),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a NotReady node that is also away counts once: max 1 lets the next start",
            config: config(1, 1),
            nodes: vec![node("w0").not_ready(), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0").host_powered_off()],
                hosts: vec![held_w0()],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a present, Ready node named by a Machine and a finished remediation is not \
                   counted at all",
            nodes: vec![node("w0"), node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                requests: vec![request("w0", RemediationStep::Done)],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a node in progress is not counted as away: its host is off for the queue's \
                   own reboot",
            config: config(2, 0),
            nodes: vec![node("w0").not_ready().queue_cordoned(), node("w1")],
            entries: vec![entry(1, "w0").rebooting(), entry(2, "w1")],
            facts: Facts {
                hosts: vec![held_w0()],
                ..Default::default()
            },
            want: Want {
                start: vec![2],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "max 1: one absent node is tolerated",
            config: config(1, 1),
            nodes: vec![node("w1")],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "max 1: an absent node and a NotReady one are two",
            config: config(1, 1),
            nodes: vec![node("w1"), node("x").not_ready()],
            entries: vec![entry(1, "w1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    unreachable_away(&["w0", "x"], 1, vec![away("w0", NO_NODE_W0, false)]),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

const NO_NODE_CP0: &str = "Machine capi/m-cp-0 has nodeRef cp-0 but no Node exists";

#[test]
fn an_api_server_away_holds_back_every_other_api_server_whatever_max_unreachable() {
    let cp0_machine = || machine("m-cp-0", "cp-0").label("cluster.x-k8s.io/control-plane", "");
    let absent_cp0 = || away("cp-0", NO_NODE_CP0, false);
    run(vec![
        Case {
            name: "an absent API-server node (its Machine labelled control plane) blocks a \
                   second API server with maxUnreachableNodes 3",
            config: config(1, 3),
            nodes: vec![api("cp-1"), api("cp-2")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![cp0_machine()],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(1, api_away(absent_cp0()))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "workers still go (max 3): only API servers are held back",
            config: config(1, 3),
            nodes: vec![api("cp-1"), node("w1")],
            entries: vec![entry(1, "cp-1"), entry(2, "w1")],
            facts: Facts {
                machines: vec![cp0_machine()],
                ..Default::default()
            },
            want: Want {
                start: vec![2],
                waiting: vec![(1, api_away(absent_cp0()))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the role from OpenShift's Machine label (master)",
            config: config(1, 3),
            nodes: vec![api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![
                    machine("m-cp-0", "cp-0")
                        .label("machine.openshift.io/cluster-api-machine-role", "master"),
                ],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(1, api_away(absent_cp0()))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the role from a gave-up request's backup of the Node's labels (master)",
            config: config(1, 3),
            nodes: vec![api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                requests: vec![
                    request("cp-0", RemediationStep::GaveUp)
                        .backed_up_label("node-role.kubernetes.io/master"),
                ],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    api_away(away(
                        "cp-0",
                        "HostRemediation default/cp-0 ended (GaveUp) and no Node cp-0 exists",
                        false,
                    )),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the role from the annotation flow's labels backup on the Machine",
            config: config(1, 3),
            nodes: vec![api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![
                    machine("m-cp-0", "cp-0")
                        .annotate(OWN_HOST_RECORD, "metal/cp-0/uid")
                        .annotate(FAILED, "gave up")
                        .annotate(
                            "remediation.metal3.io/node-labels-backup",
                            r#"{"node-role.kubernetes.io/control-plane":""}"#,
                        ),
                ],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    api_away(away(
                        "cp-0",
                        "hostcycle's remediation of Machine capi/m-cp-0 gave up (gave up) and \
                         no Node cp-0 exists",
                        false,
                    )),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a fenced API-server node (Node present, being remediated) blocks a second \
                   one with max 3",
            config: config(1, 3),
            nodes: vec![api("cp-0"), api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            remediating: vec!["cp-0"],
            facts: Facts {
                requests: vec![request("cp-0", RemediationStep::PowerOffRequested)],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    api_away(away(
                        "cp-0",
                        "HostRemediation default/cp-0 is remediating it (step PowerOffRequested)",
                        true,
                    )),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "being remediated alone (no record of why) still holds back API servers",
            config: config(1, 3),
            nodes: vec![api("cp-0").not_ready(), api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            remediating: vec!["cp-0"],
            want: Want {
                waiting: vec![(
                    1,
                    api_away(away("cp-0", "a remediation is working on it", true)),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "a held-off API-server host blocks a second one",
            config: config(1, 3),
            nodes: vec![api("cp-0"), api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                hosts: vec![held("cp-0", &host_held_by_annotation("cp-0"))],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(
                    1,
                    api_away(away(
                        "cp-0",
                        "its BareMetalHost metal/cp-0 is held off (reboot.metal3.io/hold)",
                        true,
                    )),
                )],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an existing Node's labels decide: a worker Node whose Machine is labelled \
                   control plane does not hold API servers back",
            config: config(1, 3),
            nodes: vec![node("w0"), api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![
                    machine("m-w0", "w0")
                        .label("cluster.x-k8s.io/control-plane", "")
                        .host_powered_off(),
                ],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an absent worker does not hold API servers back (max 3)",
            config: config(1, 3),
            nodes: vec![api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![machine("m-w0", "w0")],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "with max 0 the unreachable gate speaks first",
            nodes: vec![api("cp-1")],
            entries: vec![entry(1, "cp-1")],
            facts: Facts {
                machines: vec![cp0_machine()],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(1, unreachable_away(&["cp-0"], 0, vec![absent_cp0()]))],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "an API server in progress whose host is off is in progress, not away",
            config: config(1, 3),
            nodes: vec![api("cp-0").not_ready().queue_cordoned(), api("cp-1")],
            entries: vec![entry(1, "cp-0").rebooting(), entry(2, "cp-1")],
            facts: Facts {
                hosts: vec![held("cp-0", &host_held_by_annotation("cp-0"))],
                ..Default::default()
            },
            want: Want {
                waiting: vec![(2, api_busy("cp-0"))],
                in_progress: vec![(1, EntryPhase::Rebooting)],
                ..Default::default()
            },
            ..Default::default()
        },
        Case {
            name: "the node away is not held back by itself (rule 4 counts it)",
            config: config(1, 3),
            nodes: vec![api("cp-0"), api("cp-1")],
            entries: vec![entry(1, "cp-0")],
            facts: Facts {
                hosts: vec![held("cp-0", &host_held_by_annotation("cp-0"))],
                ..Default::default()
            },
            want: Want {
                start: vec![1],
                ..Default::default()
            },
            ..Default::default()
        },
    ]);
}

/// Which hosts are held off (`queue::away::held_off`): a keyed reboot annotation,
/// `spec.online: false`, an observed `status.poweredOn: false`; not the suffixless reboot
/// request (a power cycle, not a hold), not a power state never observed.
#[test]
fn held_off_hosts() {
    use hostcycle_api::BareMetalHost;
    use hostcycle_core::queue::away::held_off;
    let base = || BareMetalHost::externally_provisioned("h", "redfish://x", "s");
    let with_status = |powered_on: bool, observed: bool| {
        let mut h = base();
        let mut status: hostcycle_api::BareMetalHostStatus =
            serde_json::from_value(serde_json::json!({ "poweredOn": powered_on })).unwrap();
        if observed {
            status.operational_status = Some(hostcycle_api::OperationalStatus::Ok);
        }
        h.status = Some(status);
        h
    };
    let offline = {
        let mut h = base();
        h.spec.online = false;
        h
    };
    let suffixless = {
        let mut h = base();
        h.metadata.annotations = Some(BTreeMap::from([(
            "reboot.metal3.io".to_string(),
            String::new(),
        )]));
        h
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, BareMetalHost, Option<&str>)> = vec![
        ("on, online, no annotation", with_status(true, true), None),
        ("keyed reboot annotation", host_held_by_annotation("h"), Some("is held off (reboot.metal3.io/hold)")),
        ("offline", offline, Some("is offline (spec.online: false)")),
        ("observed off", with_status(false, true), Some("is powered off (status.poweredOn: false)")),
        ("off never observed", with_status(false, false), None),
        ("the suffixless reboot request", suffixless, None),
    ];
    for (name, host, want) in cases {
        assert_eq!(held_off(&host).as_deref(), want, "{name}");
    }
}
