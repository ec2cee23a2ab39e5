//! Where a remediation's record lives, as tables: the annotation flow's record (a ConfigMap
//! only hostcycle writes) and a HostRemediation's status (requests); the markers written onto
//! a Machine for other tools (metal3's keys and JSON map backups), never read back. Every step
//! round-trips; a record missing a field it needs gives up cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::HostReference;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HostRemediationStatus, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, NODE_SPEC_BACKUP_ANNOTATION, NodeSpecBackup,
    POWER_ON_TIMEOUT_ANNOTATION, POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION, REMEDIATION_HOST_ANNOTATION, REMEDIATION_HOST_BMC_ANNOTATION,
    REMEDIATION_JOINED_ANNOTATION, REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
    REMEDIATION_POWERED_OFF_AT_ANNOTATION, REMEDIATION_STARTED_ANNOTATION, RemediationPhase,
    RemediationStep, TaintBackup,
};
use hostcycle_core::binding::BoundHost;
use hostcycle_core::remediation::release::{Release, ReleaseStrategy};
use hostcycle_core::remediation::{
    Action, Escalation, Observation, Record, RemediationHostView, RemediationNodeView, Trigger,
    decide,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Builders.

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

fn labels() -> BTreeMap<String, String> {
    map(&[
        ("kubernetes.io/hostname", "worker-0"),
        ("node-role.kubernetes.io/worker", ""),
    ])
}

fn annotations() -> BTreeMap<String, String> {
    map(&[("example.com/owner", "ops \"on call\"")])
}

const LABELS_JSON: &str =
    r#"{"kubernetes.io/hostname":"worker-0","node-role.kubernetes.io/worker":""}"#;
const ANNOTATIONS_JSON: &str = r#"{"example.com/owner":"ops \"on call\""}"#;

/// The host bound at the start.
fn bound() -> BoundHost {
    BoundHost {
        reference: HostReference {
            namespace: "machines".into(),
            name: "host-0".into(),
        },
        uid: "0b5e-host-uid".into(),
    }
}
const HOST_VALUE: &str = "machines/host-0/0b5e-host-uid";

/// An administrator's cordon and taint, backed up with the labels.
fn spec_backup() -> NodeSpecBackup {
    NodeSpecBackup {
        unschedulable: true,
        taints: vec![TaintBackup {
            key: "example.com/dedicated".into(),
            value: Some("storage".into()),
            effect: "NoSchedule".into(),
        }],
    }
}
const SPEC_JSON: &str = r#"{"unschedulable":true,"taints":[{"key":"example.com/dedicated","value":"storage","effect":"NoSchedule"}]}"#;

/// Records as `decide` writes them, one per step, in the annotation flow (no retries).
fn not_started() -> Record {
    Record::default()
}

fn powering_off() -> Record {
    Record {
        step: RemediationStep::PowerOffRequested,
        host: Some(bound()),
        started_at: Some(t(0)),
        cycle_started_at: Some(t(0)),
        ..Record::default()
    }
}

fn backed_up() -> Record {
    Record {
        powered_off_at: Some(t(20)),
        labels_backup: Some(labels()),
        annotations_backup: Some(annotations()),
        node_spec_backup: Some(spec_backup()),
        ..powering_off()
    }
}

fn released() -> Record {
    Record {
        step: RemediationStep::NodeReleased,
        node_released_at: Some(t(30)),
        ..backed_up()
    }
}

fn powering_on() -> Record {
    Record {
        step: RemediationStep::PowerOnRequested,
        power_on_timeout_at: Some(t(640)),
        ..released()
    }
}

fn restored() -> Record {
    Record {
        labels_backup: None,
        annotations_backup: None,
        node_spec_backup: None,
        ..powering_on()
    }
}

fn gave_up() -> Record {
    Record {
        step: RemediationStep::GaveUp,
        failure: Some(
            "node worker-0 did not come back by 2025-01-01T00:10:40Z after 1 power cycle".into(),
        ),
        ..powering_on()
    }
}

fn done() -> Record {
    Record {
        step: RemediationStep::Done,
        ..restored()
    }
}

fn cancelled() -> Record {
    Record {
        step: RemediationStep::Cancelled,
        ..powering_off()
    }
}

/// A Machine's annotations before any remediation: the host reference, the trigger, and one
/// of someone else's.
fn machine() -> BTreeMap<String, String> {
    map(&[
        ("metal3.io/BareMetalHost", "machines/host-0"),
        (EXTERNAL_REMEDIATION_ANNOTATION, ""),
        ("example.com/unrelated", "kept"),
    ])
}

/// Applies a record's annotation patch like a JSON merge patch of `metadata.annotations`.
fn apply(annotations: &mut BTreeMap<String, String>, record: &Record) {
    for (k, v) in record.machine_annotations() {
        match v {
            Some(v) => annotations.insert(k.to_owned(), v),
            None => annotations.remove(k),
        };
    }
}

type Patch = Vec<(&'static str, Option<String>)>;

/// The markers' values, `None`: removed.
#[derive(Default)]
struct Markers {
    host: Option<&'static str>,
    spec: Option<&'static str>,
    started: Option<&'static str>,
    powered_off_at: Option<&'static str>,
    node_released_at: Option<&'static str>,
    powered_off: Option<&'static str>,
    timeout: Option<&'static str>,
    labels: Option<&'static str>,
    annotations: Option<&'static str>,
    failed: Option<&'static str>,
}

/// The patch of every marker: (key, value) in key order.
fn patch(m: Markers) -> Patch {
    let Markers {
        host,
        spec,
        started,
        powered_off_at,
        node_released_at,
        powered_off,
        timeout,
        labels,
        annotations,
        failed,
    } = m;
    let mut p: Patch = [
        (REMEDIATION_HOST_ANNOTATION, host),
        // The fixtures' records bind no BMC (as written before BMCs were bound) and join no
        // other remediation: removed.
        (REMEDIATION_HOST_BMC_ANNOTATION, None),
        (REMEDIATION_JOINED_ANNOTATION, None),
        (NODE_SPEC_BACKUP_ANNOTATION, spec),
        (REMEDIATION_STARTED_ANNOTATION, started),
        (REMEDIATION_POWERED_OFF_AT_ANNOTATION, powered_off_at),
        (REMEDIATION_NODE_RELEASED_AT_ANNOTATION, node_released_at),
        (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, powered_off),
        (POWER_ON_TIMEOUT_ANNOTATION, timeout),
        (NODE_LABELS_BACKUP_ANNOTATION, labels),
        (NODE_ANNOTATIONS_BACKUP_ANNOTATION, annotations),
        (REMEDIATION_FAILED_ANNOTATION, failed),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.map(str::to_owned)))
    .collect();
    p.sort_by_key(|(k, _)| *k);
    p
}

const T0: &str = "2025-01-01T00:00:00Z";
const T20: &str = "2025-01-01T00:00:20Z";
const T30: &str = "2025-01-01T00:00:30Z";
const T640: &str = "2025-01-01T00:10:40Z";
const FAILURE: &str = "node worker-0 did not come back by 2025-01-01T00:10:40Z after 1 power cycle";

// ---------------------------------------------------------------------------------------
// Machine annotations.

#[test]
fn each_step_writes_exactly_its_markers_on_the_machine() {
    struct Case {
        name: &'static str,
        record: Record,
        patch: Patch,
    }
    let backed = || Markers {
        host: Some(HOST_VALUE),
        spec: Some(SPEC_JSON),
        started: Some(T0),
        powered_off_at: Some(T20),
        labels: Some(LABELS_JSON),
        annotations: Some(ANNOTATIONS_JSON),
        ..Markers::default()
    };
    let released_markers = || Markers {
        node_released_at: Some(T30),
        powered_off: Some(""),
        ..backed()
    };
    let cases = [
        Case {
            name: "NotStarted → every marker removed",
            record: not_started(),
            patch: patch(Markers::default()),
        },
        Case {
            name: "PowerOffRequested → the bound host (namespace/name/uid) and started-at",
            record: powering_off(),
            patch: patch(Markers {
                host: Some(HOST_VALUE),
                started: Some(T0),
                ..Markers::default()
            }),
        },
        Case {
            name: "PowerOffRequested, backed up → started-at, powered-off-at and the JSON backups",
            record: backed_up(),
            patch: patch(backed()),
        },
        Case {
            name: "NodeReleased → node-released-at and powered-off-for-remediation (empty value) added",
            record: released(),
            patch: patch(released_markers()),
        },
        Case {
            name: "PowerOnRequested → power-on-will-timeout-at (RFC 3339) added",
            record: powering_on(),
            patch: patch(Markers {
                timeout: Some(T640),
                ..released_markers()
            }),
        },
        Case {
            name: "PowerOnRequested, restored → the backups removed",
            record: restored(),
            patch: patch(Markers {
                timeout: Some(T640),
                labels: None,
                annotations: None,
                spec: None,
                ..released_markers()
            }),
        },
        Case {
            name: "GaveUp → the failure; the binding and the backups kept for a late Node; the rest removed",
            record: gave_up(),
            patch: patch(Markers {
                host: Some(HOST_VALUE),
                spec: Some(SPEC_JSON),
                labels: Some(LABELS_JSON),
                annotations: Some(ANNOTATIONS_JSON),
                failed: Some(FAILURE),
                ..Markers::default()
            }),
        },
        Case {
            name: "GaveUp, the late Node restored → the backups removed too",
            record: Record {
                labels_backup: None,
                annotations_backup: None,
                node_spec_backup: None,
                ..gave_up()
            },
            patch: patch(Markers {
                host: Some(HOST_VALUE),
                failed: Some(FAILURE),
                ..Markers::default()
            }),
        },
        Case {
            name: "Done → nothing: the markers go with the trigger (FinishAnnotationFlow)",
            record: done(),
            patch: vec![],
        },
        Case {
            name: "Cancelled → every marker removed",
            record: cancelled(),
            patch: patch(Markers::default()),
        },
    ];
    for c in cases {
        let got: Patch = c.record.machine_annotations().into_iter().collect();
        assert_eq!(got, c.patch, "{}", c.name);
    }
}

/// A record at every step `decide` writes, a retried cycle included.
fn every_step() -> Vec<Record> {
    let retried = Record {
        step: RemediationStep::PowerOffRequested,
        retry_count: 2,
        cycle_started_at: Some(t(1_300)),
        ..powering_on()
    };
    vec![
        not_started(),
        powering_off(),
        backed_up(),
        released(),
        powering_on(),
        restored(),
        retried,
        gave_up(),
        done(),
        cancelled(),
    ]
}

/// The annotation flow's record (a ConfigMap only hostcycle writes) keeps every field of
/// every step, through JSON — an end too (its `FinishAnnotationFlow` then removes it).
#[test]
fn every_step_round_trips_through_the_flow_record() {
    let joined = Record {
        joined: Some("hostremediation/machines/worker-0".into()),
        ..not_started()
    };
    for record in every_step().into_iter().chain([joined]) {
        let name = format!("{:?} retry {}", record.step, record.retry_count);
        let stored = record.to_machine_flow("machine.openshift.io/machines/m-0", "uid-m");
        assert_eq!(
            stored.machine, "machine.openshift.io/machines/m-0",
            "{name}"
        );
        assert_eq!(stored.machine_uid, "uid-m", "{name}");
        let wire: hostcycle_api::remediation::MachineFlowRecord =
            serde_json::from_str(&serde_json::to_string(&stored).unwrap()).unwrap();
        assert_eq!(Record::from_machine_flow(&wire), record, "{name}");
    }
}

/// The markers written for other tools are a pure function of the record: writing them again
/// from the same record changes nothing, and someone else's annotations and the trigger are
/// left alone.
#[test]
fn markers_are_written_from_the_record_and_leave_the_rest_alone() {
    for record in every_step() {
        let name = format!("{:?}", record.step);
        let mut annotations = machine();
        apply(&mut annotations, &record);
        assert_eq!(annotations["example.com/unrelated"], "kept", "{name}");
        assert!(
            annotations.contains_key(EXTERNAL_REMEDIATION_ANNOTATION),
            "{name}"
        );
        let mut again = annotations.clone();
        apply(&mut again, &record);
        assert_eq!(again, annotations, "{name}: a second write");
    }
}

#[test]
fn done_leaves_the_markers_to_finish_annotation_flow() {
    let mut annotations = machine();
    apply(&mut annotations, &restored());
    let before = annotations.clone();
    apply(&mut annotations, &done());
    assert_eq!(annotations, before, "Done changes no annotation");
}

#[test]
fn backups_are_json_objects_of_strings_like_metal3s() {
    let cases: [(&str, BTreeMap<String, String>, &str); 4] = [
        ("one key", map(&[("k", "v")]), r#"{"k":"v"}"#),
        ("empty", BTreeMap::new(), "{}"),
        (
            "keys in order, empty values",
            map(&[("b", ""), ("a/b.c", "1")]),
            r#"{"a/b.c":"1","b":""}"#,
        ),
        (
            "quotes, backslashes and non-ASCII escaped",
            map(&[("q", "say \"hi\"\\"), ("ü", "ß")]),
            r#"{"q":"say \"hi\"\\","ü":"ß"}"#,
        ),
    ];
    for (name, backup, text) in cases {
        let record = Record {
            labels_backup: Some(backup.clone()),
            annotations_backup: Some(backup.clone()),
            ..powering_off()
        };
        let written = record.machine_annotations();
        assert_eq!(
            written[NODE_LABELS_BACKUP_ANNOTATION].as_deref(),
            Some(text),
            "{name}"
        );
        assert_eq!(
            written[NODE_ANNOTATIONS_BACKUP_ANNOTATION].as_deref(),
            Some(text),
            "{name}"
        );
        let back = Record::from_machine_flow(&record.to_machine_flow("g/ns/m", "u"));
        assert_eq!(back.labels_backup, Some(backup.clone()), "{name}");
        assert_eq!(back.annotations_backup, Some(backup), "{name}");
    }
}

#[test]
fn marker_times_are_rfc3339_with_second_precision_like_metal3s() {
    // Written with second precision when the time has it, as metal3 does.
    assert_eq!(
        powering_on().machine_annotations()[POWER_ON_TIMEOUT_ANNOTATION].as_deref(),
        Some(T640)
    );
}

/// What `decide` does with a record, in the annotation flow:
/// the host back on without the power-off, the Node absent, past every deadline a real record
/// could have had.
fn decide_on(
    record: Record,
    host: RemediationHostView,
    node: Option<RemediationNodeView>,
) -> hostcycle_core::remediation::Decision {
    let obs = Observation {
        trigger: Trigger::MachineAnnotation,
        requested: true,
        bound: record.host.as_ref().map(|_| host.clone()),
        target: Ok(host),
        power_off_timeout: Duration::from_secs(300),
        node_name: Some("worker-0".into()),
        node,
        record,
        retry_limit: 0,
        power_on_timeout: Duration::from_secs(600),
        slot_free: true,
        queue_reboot_until: None,
        escalation: Escalation::DeleteMachine,
        held_elsewhere: None,
        joined_running: None,
        clock_untrusted: None,
        release_strategy: Ok(ReleaseStrategy::DeleteNode),
        out_of_service_served: false,
        workloads: None,
        leave_off: false,
    };
    decide(&obs, t(10_000))
}

fn host(powered_on: bool, power_off_requested: bool) -> RemediationHostView {
    RemediationHostView {
        name: "machines/host-0".into(),
        uid: "0b5e-host-uid".into(),
        powered_on: Some(powered_on),
        // Written after every request in these tables.
        last_updated: Some(t(1_000_000)),
        observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
        spec_bmc: hostcycle_api::ObservedBmc::default(),
        power_off_requested,
        online: true,
        externally_provisioned: false,
        error: None,
        cannot_power_off: None,
        marked_unhealthy: None,
    }
}

/// A record under way that lacks the host it bound or when it began (an unreadable or
/// hand-edited record) gives up cleanly, whatever the world: its power-off is released when
/// it is on the host, nothing is deleted or escalated, and a Warning says why — it never
/// waits for ever holding a slot and the queue's gate.
#[test]
fn a_record_missing_a_field_it_needs_gives_up_cleanly() {
    let cases = [
        (
            "no host, powering off",
            Record {
                host: None,
                ..powering_off()
            },
            "the host it bound",
        ),
        (
            "no start, powering off",
            Record {
                started_at: None,
                ..powering_off()
            },
            "when it started",
        ),
        (
            "no host, Node released",
            Record {
                host: None,
                ..released()
            },
            "the host it bound",
        ),
        (
            "no start, powering on",
            Record {
                started_at: None,
                ..powering_on()
            },
            "when it started",
        ),
        (
            "an unreadable record (step only)",
            Record {
                step: RemediationStep::PowerOffRequested,
                ..Record::default()
            },
            "the host it bound",
        ),
    ];
    for (name, record, missing) in cases {
        assert_eq!(record.missing_field(), Some(missing), "{name}");
        for (host, node) in [
            (host(true, false), None),
            (host(true, true), Some(RemediationNodeView::default())),
            (host(false, true), Some(RemediationNodeView::default())),
            (host(false, true), None),
        ] {
            let annotated = host.power_off_requested;
            let d = decide_on(record.clone(), host, node.clone());
            let ctx = format!(
                "{name}, power-off on the host {annotated}, node {}",
                node.is_some()
            );
            let written = d.record.as_ref().expect("the give-up is recorded");
            assert_eq!(written.step, RemediationStep::GaveUp, "{ctx}");
            assert!(
                written
                    .failure
                    .as_deref()
                    .is_some_and(|f| f.contains(missing)),
                "{ctx}: {written:?}"
            );
            let want: Vec<Action> = if annotated {
                vec![Action::ReleasePowerOff]
            } else {
                vec![]
            };
            assert_eq!(
                d.actions, want,
                "{ctx}: only the release, nothing deleted or escalated"
            );
            assert_eq!(d.phase, RemediationPhase::Failed, "{ctx}");
            assert!(
                d.events.iter().any(|e| e.reason
                    == hostcycle_api::reasons::remediation::event_reason::RECORD_INCOMPLETE),
                "{ctx}: {:?}",
                d.events
            );
        }
    }
    // Complete records, and records not under way, lack nothing.
    for record in [
        not_started(),
        powering_off(),
        released(),
        powering_on(),
        gave_up(),
        done(),
        cancelled(),
    ] {
        assert_eq!(record.missing_field(), None, "{:?}", record.step);
    }
}

#[test]
fn a_missing_power_on_deadline_starts_the_wait_instead_of_giving_up() {
    let read = Record {
        power_on_timeout_at: None,
        ..powering_on()
    };
    let d = decide_on(read, host(true, false), None);
    assert_eq!(d.actions, vec![]);
    assert_eq!(d.phase, RemediationPhase::Waiting);
    let written = d.record.expect("a fresh deadline is recorded");
    assert_eq!(written.power_on_timeout_at, Some(t(10_600)));
    assert_eq!(
        written.machine_annotations()[POWER_ON_TIMEOUT_ANNOTATION].as_deref(),
        Some("2025-01-01T02:56:40Z")
    );
}

// ---------------------------------------------------------------------------------------
// A request's status.

fn condition(type_: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: "RemediationStarted".into(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time(t(0)),
    }
}

/// A status with what the caller keeps (phase, message, conditions, names) and a stale
/// record in it.
fn status() -> HostRemediationStatus {
    HostRemediationStatus {
        phase: Some(RemediationPhase::Running),
        step: RemediationStep::PowerOffRequested,
        node: Some("worker-0".into()),
        host: Some("machines/host-0".into()),
        host_uid: Some("stale-uid".into()),
        host_bmc: None,
        joined: None,
        retry_count: 7,
        last_remediated: Some(t(-1_000)),
        powered_off_at: Some(t(-900)),
        node_released_at: Some(t(-800)),
        power_on_timeout_at: Some(t(-700)),
        node_labels_backup: Some(map(&[("stale", "1")])),
        node_annotations_backup: Some(map(&[("stale", "1")])),
        node_spec_backup: Some(NodeSpecBackup {
            unschedulable: true,
            taints: vec![],
        }),
        failure: None,
        release: Some("ReleaseWorkloads".into()),
        fenced_boot_id: Some("stale-boot".into()),
        release_started_at: Some(t(-850)),
        message: "powering host machines/host-0 off".into(),
        conditions: vec![condition("Processing"), condition("Succeeded")],
    }
}

#[test]
fn every_step_round_trips_through_a_request_status() {
    let partial_backup = Record {
        labels_backup: Some(BTreeMap::new()),
        annotations_backup: None,
        ..backed_up()
    };
    let keeping_the_node = Record {
        release: Some(Release::OutOfServiceTaint),
        fenced_boot_id: Some("boot-1".into()),
        release_started_at: Some(t(-10)),
        ..backed_up()
    };
    for record in every_step()
        .into_iter()
        .chain([partial_backup, keeping_the_node])
    {
        let name = format!("{:?} retry {}", record.step, record.retry_count);
        let mut s = status();
        record.apply_to_status(&mut s);
        // The caller's fields are left alone.
        assert_eq!(s.phase, Some(RemediationPhase::Running), "{name}");
        assert_eq!(s.node.as_deref(), Some("worker-0"), "{name}");
        assert_eq!(s.host.as_deref(), Some("machines/host-0"), "{name}");
        assert_eq!(s.message, "powering host machines/host-0 off", "{name}");
        assert_eq!(s.conditions, status().conditions, "{name}");
        // The record, whole: the start time is the request's creation (set by the caller);
        // the failure is kept for a step that gave up only.
        let expected = Record {
            started_at: None,
            failure: record
                .failure
                .clone()
                .filter(|_| record.step == RemediationStep::GaveUp),
            ..record.clone()
        };
        assert_eq!(Record::from_status(&s), expected, "{name}");
        // Through the API server (JSON) too.
        let wire: HostRemediationStatus =
            serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(Record::from_status(&wire), expected, "{name}: JSON");
    }
}

#[test]
fn a_request_status_carries_the_record_in_camel_case_with_map_backups() {
    let mut s = HostRemediationStatus::default();
    Record {
        retry_count: 1,
        ..powering_on()
    }
    .apply_to_status(&mut s);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v,
        json!({
            "step": "PowerOnRequested",
            "host": "machines/host-0",
            "hostUID": "0b5e-host-uid",
            "nodeSpecBackup": {
                "unschedulable": true,
                "taints": [{ "key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule" }],
            },
            "retryCount": 1,
            "lastRemediated": "2025-01-01T00:00:00Z",
            "poweredOffAt": "2025-01-01T00:00:20Z",
            "nodeReleasedAt": "2025-01-01T00:00:30Z",
            "powerOnTimeoutAt": "2025-01-01T00:10:40Z",
            "nodeLabelsBackup": {
                "kubernetes.io/hostname": "worker-0",
                "node-role.kubernetes.io/worker": "",
            },
            "nodeAnnotationsBackup": { "example.com/owner": "ops \"on call\"" },
        })
    );
    // Cleared fields leave the status.
    restored().apply_to_status(&mut s);
    let v = serde_json::to_value(&s).unwrap();
    assert!(
        v.get("nodeLabelsBackup").is_none() && v.get("nodeAnnotationsBackup").is_none(),
        "{v}"
    );
    // An empty status reads as not started.
    assert_eq!(
        Record::from_status(&HostRemediationStatus::default()),
        Record::default()
    );
}

// ---------------------------------------------------------------------------------------
// What a record says about itself.

#[test]
fn in_flight_and_node_released_by_step() {
    let cases = [
        (RemediationStep::NotStarted, false, false),
        (RemediationStep::PowerOffRequested, true, false),
        (RemediationStep::NodeReleased, true, true),
        (RemediationStep::PowerOnRequested, true, true),
        (RemediationStep::Done, false, false),
        (RemediationStep::GaveUp, false, false),
        (RemediationStep::Cancelled, false, false),
    ];
    for (step, in_flight, node_released) in cases {
        let r = Record {
            step,
            ..Record::default()
        };
        assert_eq!(r.in_flight(), in_flight, "{step:?} in flight");
        assert_eq!(r.node_released(), node_released, "{step:?} node released");
    }
}

/// The BMC a flow bound survives both homes of the record: a request's status and the
/// annotation flow's record; a record that ends removes its marker with the others.
#[test]
fn the_bound_bmc_round_trips_through_status_and_the_flow_record() {
    let bmc = hostcycle_api::ObservedBmc {
        address: "redfish://192.0.2.10/redfish/v1/Systems/1".into(),
        credentials_name: "bmc-secret".into(),
        identity: Some("uuid:0a1b2c3d-0000-4000-8000-000000000001".into()),
    };
    let record = Record {
        step: RemediationStep::PowerOffRequested,
        host: BoundHost::parse("machines/host-0/uid-0"),
        bmc: Some(bmc.clone()),
        started_at: Some(t(-1_000)),
        cycle_started_at: Some(t(-1_000)),
        ..Record::default()
    };
    let mut status = HostRemediationStatus::default();
    record.apply_to_status(&mut status);
    assert_eq!(Record::from_status(&status).bmc, Some(bmc.clone()));

    assert!(
        record.machine_annotations()[REMEDIATION_HOST_BMC_ANNOTATION].is_some(),
        "the marker shows it"
    );
    let back = Record::from_machine_flow(&record.to_machine_flow("g/ns/m", "u"));
    assert_eq!(back.bmc, Some(bmc));

    let cancelled = Record {
        step: RemediationStep::Cancelled,
        ..record
    };
    assert_eq!(
        cancelled
            .machine_annotations()
            .get(REMEDIATION_HOST_BMC_ANNOTATION),
        Some(&None),
        "an ended flow removes its BMC binding"
    );
}
