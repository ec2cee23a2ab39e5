//! Where a remediation's record lives, as tables: the Machine's annotations (the annotation
//! flow, with metal3's keys and JSON map backups) and a HostRemediation's status (requests).
//! Every step round-trips; what a store does not keep is named; malformed annotation values
//! are read as absent and never lead `decide` into an unsafe step.
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

/// What the Machine's annotations keep of a record: no retries (the annotation flow has
/// none), the cycle's start is the remediation's start.
fn as_kept_on_a_machine(r: &Record) -> Record {
    Record {
        retry_count: 0,
        cycle_started_at: r.started_at,
        ..r.clone()
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

#[test]
fn every_step_round_trips_through_the_machine_annotations() {
    struct Case {
        name: &'static str,
        record: Record,
        /// This remediation's power-off is on the host.
        on_host: bool,
        read: Record,
    }
    let cases = [
        Case {
            name: "NotStarted",
            record: not_started(),
            on_host: false,
            read: not_started(),
        },
        Case {
            name: "PowerOffRequested, not on the host yet",
            record: powering_off(),
            on_host: false,
            read: powering_off(),
        },
        Case {
            name: "PowerOffRequested, on the host",
            record: powering_off(),
            on_host: true,
            read: powering_off(),
        },
        Case {
            name: "PowerOffRequested, backed up",
            record: backed_up(),
            on_host: true,
            read: as_kept_on_a_machine(&backed_up()),
        },
        Case {
            name: "NodeReleased",
            record: released(),
            on_host: true,
            read: as_kept_on_a_machine(&released()),
        },
        Case {
            name: "PowerOnRequested, the release not done yet",
            record: powering_on(),
            on_host: true,
            read: as_kept_on_a_machine(&powering_on()),
        },
        Case {
            name: "PowerOnRequested",
            record: powering_on(),
            on_host: false,
            read: as_kept_on_a_machine(&powering_on()),
        },
        Case {
            name: "PowerOnRequested, restored",
            record: restored(),
            on_host: false,
            read: as_kept_on_a_machine(&restored()),
        },
        Case {
            name: "GaveUp (only the failure and the backups are kept)",
            record: gave_up(),
            on_host: false,
            read: Record {
                started_at: None,
                cycle_started_at: None,
                powered_off_at: None,
                node_released_at: None,
                power_on_timeout_at: None,
                ..as_kept_on_a_machine(&gave_up())
            },
        },
        Case {
            name: "GaveUp, the power-off still on the host → still GaveUp (the failure wins)",
            record: gave_up(),
            on_host: true,
            read: Record {
                started_at: None,
                cycle_started_at: None,
                powered_off_at: None,
                node_released_at: None,
                power_on_timeout_at: None,
                ..as_kept_on_a_machine(&gave_up())
            },
        },
        Case {
            name: "Cancelled, released → nothing left: NotStarted (the trigger is gone)",
            record: cancelled(),
            on_host: false,
            read: not_started(),
        },
        Case {
            name: "Cancelled, the release not done yet → PowerOffRequested again (decide cancels again and releases)",
            record: cancelled(),
            on_host: true,
            read: Record {
                step: RemediationStep::PowerOffRequested,
                ..Record::default()
            },
        },
    ];
    for c in cases {
        let mut annotations = machine();
        apply(&mut annotations, &c.record);
        let read = Record::from_machine_annotations(&annotations, c.on_host);
        assert_eq!(read, c.read, "{}: {annotations:#?}", c.name);
        // Someone else's annotations and the trigger are left alone.
        assert_eq!(annotations["example.com/unrelated"], "kept", "{}", c.name);
        assert!(
            annotations.contains_key(EXTERNAL_REMEDIATION_ANNOTATION),
            "{}",
            c.name
        );
        // Written again from what was read, nothing changes (a restart's write).
        let mut again = annotations.clone();
        apply(&mut again, &read);
        assert_eq!(again, annotations, "{}: a second write", c.name);
    }
}

#[test]
fn done_leaves_the_markers_to_finish_annotation_flow_so_a_restart_does_not_remediate_again() {
    let mut annotations = machine();
    apply(&mut annotations, &restored());
    let before = annotations.clone();
    apply(&mut annotations, &done());
    assert_eq!(annotations, before, "Done changes no annotation");
    let read = Record::from_machine_annotations(&annotations, false);
    assert_eq!(
        read.step,
        RemediationStep::PowerOnRequested,
        "still mid-flow, not NotStarted"
    );
}

#[test]
fn the_step_is_read_from_the_markers_present() {
    // Including the markers OpenShift's own remediation (CAPBM) writes: no started-at.
    // (name, Machine annotations, the power-off on the host, step read)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        bool,
        RemediationStep,
    );
    let cases: [Case; 9] = [
        ("nothing", &[], false, RemediationStep::NotStarted),
        (
            "only the trigger",
            &[(EXTERNAL_REMEDIATION_ANNOTATION, "")],
            false,
            RemediationStep::NotStarted,
        ),
        (
            "the power-off on the host (CAPBM started)",
            &[],
            true,
            RemediationStep::PowerOffRequested,
        ),
        (
            "started-at",
            &[(REMEDIATION_STARTED_ANNOTATION, T0)],
            false,
            RemediationStep::PowerOffRequested,
        ),
        (
            "a labels backup (CAPBM backed up)",
            &[(NODE_LABELS_BACKUP_ANNOTATION, "{}")],
            false,
            RemediationStep::PowerOffRequested,
        ),
        (
            "powered-off-for-remediation",
            &[(POWERED_OFF_FOR_REMEDIATION_ANNOTATION, "")],
            true,
            RemediationStep::NodeReleased,
        ),
        (
            "power-on-will-timeout-at wins over powered-off",
            &[
                (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
                (POWER_ON_TIMEOUT_ANNOTATION, T640),
            ],
            false,
            RemediationStep::PowerOnRequested,
        ),
        (
            "failed wins over everything",
            &[
                (REMEDIATION_STARTED_ANNOTATION, T0),
                (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
                (POWER_ON_TIMEOUT_ANNOTATION, T640),
                (REMEDIATION_FAILED_ANNOTATION, "why"),
            ],
            true,
            RemediationStep::GaveUp,
        ),
        (
            "unrelated annotations",
            &[
                ("metal3.io/BareMetalHost", "machines/host-0"),
                ("remediation.metal3.io/other", ""),
            ],
            false,
            RemediationStep::NotStarted,
        ),
    ];
    for (name, pairs, on_host, step) in cases {
        let r = Record::from_machine_annotations(&map(pairs), on_host);
        assert_eq!(r.step, step, "{name}");
        assert_eq!(r.retry_count, 0, "{name}");
    }
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
        let mut annotations = machine();
        apply(&mut annotations, &record);
        let read = Record::from_machine_annotations(&annotations, true);
        assert_eq!(read.labels_backup, Some(backup.clone()), "{name}");
        assert_eq!(read.annotations_backup, Some(backup), "{name}");
    }
    // Written by metal3 (Go's json.Marshal) or by hand, with spaces: read the same.
    for text in [
        r#"{"a":"1","kubernetes.io/hostname":"w"}"#,
        "{ \"a\" : \"1\",\n  \"kubernetes.io/hostname\": \"w\" }",
    ] {
        let read =
            Record::from_machine_annotations(&map(&[(NODE_LABELS_BACKUP_ANNOTATION, text)]), false);
        assert_eq!(
            read.labels_backup,
            Some(map(&[("a", "1"), ("kubernetes.io/hostname", "w")])),
            "{text}"
        );
    }
}

#[test]
fn times_are_rfc3339_and_read_in_any_offset() {
    let cases: [(&str, Option<Timestamp>); 7] = [
        ("2025-01-01T00:10:40Z", Some(t(640))),
        ("2025-01-01T02:10:40+02:00", Some(t(640))),
        (
            "2025-01-01T00:10:40.5Z",
            Some(
                t(640)
                    .checked_add(jiff::SignedDuration::from_millis(500))
                    .unwrap(),
            ),
        ),
        ("  2025-01-01T00:10:40Z\n", Some(t(640))),
        ("2025-01-01 00:10:40Z", Some(t(640))),
        ("1735690240", None),
        ("2025-01-01T00:10:40", None),
    ];
    for (text, time) in cases {
        let read = Record::from_machine_annotations(
            &map(&[
                (POWER_ON_TIMEOUT_ANNOTATION, text),
                (REMEDIATION_STARTED_ANNOTATION, text),
                (REMEDIATION_POWERED_OFF_AT_ANNOTATION, text),
                (REMEDIATION_NODE_RELEASED_AT_ANNOTATION, text),
            ]),
            false,
        );
        assert_eq!(read.power_on_timeout_at, time, "{text:?}");
        assert_eq!(read.started_at, time, "{text:?}");
        assert_eq!(read.powered_off_at, time, "{text:?}");
        assert_eq!(read.node_released_at, time, "{text:?}");
        assert_eq!(read.step, RemediationStep::PowerOnRequested, "{text:?}");
    }
    // Written with second precision when the time has it, as metal3 does.
    assert_eq!(
        powering_on().machine_annotations()[POWER_ON_TIMEOUT_ANNOTATION].as_deref(),
        Some(T640)
    );
}

/// What `decide` does with a record read from malformed annotations, in the annotation flow:
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

#[test]
fn malformed_annotation_values_are_read_as_absent_and_stay_safe() {
    struct Case {
        name: &'static str,
        annotations: &'static [(&'static str, &'static str)],
        on_host: bool,
        step: RemediationStep,
        labels: Option<BTreeMap<String, String>>,
        annotations_backup: Option<BTreeMap<String, String>>,
        timeout: Option<Timestamp>,
        started: Option<Timestamp>,
    }
    let base = |name, annotations, on_host, step| Case {
        name,
        annotations,
        on_host,
        step,
        labels: None,
        annotations_backup: None,
        timeout: None,
        started: None,
    };
    let cases = [
        base(
            "labels backup not JSON",
            &[(
                NODE_LABELS_BACKUP_ANNOTATION,
                "kubernetes.io/hostname=worker-0",
            )],
            true,
            RemediationStep::PowerOffRequested,
        ),
        base(
            "labels backup with non-string values",
            &[(NODE_LABELS_BACKUP_ANNOTATION, r#"{"a":1,"b":true}"#)],
            true,
            RemediationStep::PowerOffRequested,
        ),
        base(
            "labels backup a list",
            &[(NODE_LABELS_BACKUP_ANNOTATION, r#"["a"]"#)],
            true,
            RemediationStep::PowerOffRequested,
        ),
        base(
            "labels backup null",
            &[(NODE_LABELS_BACKUP_ANNOTATION, "null")],
            true,
            RemediationStep::PowerOffRequested,
        ),
        base(
            "labels backup empty (metal3's nil map)",
            &[(NODE_LABELS_BACKUP_ANNOTATION, "")],
            true,
            RemediationStep::PowerOffRequested,
        ),
        Case {
            annotations_backup: None,
            labels: Some(map(&[("a", "1")])),
            ..base(
                "annotations backup truncated, labels fine",
                &[
                    (NODE_LABELS_BACKUP_ANNOTATION, r#"{"a":"1"}"#),
                    (NODE_ANNOTATIONS_BACKUP_ANNOTATION, r#"{"a":"#),
                ],
                true,
                RemediationStep::PowerOffRequested,
            )
        },
        base(
            "power-on-will-timeout-at not a time",
            &[
                (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
                (POWER_ON_TIMEOUT_ANNOTATION, "soon"),
            ],
            false,
            RemediationStep::PowerOnRequested,
        ),
        base(
            "power-on-will-timeout-at empty",
            &[
                (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
                (POWER_ON_TIMEOUT_ANNOTATION, ""),
            ],
            false,
            RemediationStep::PowerOnRequested,
        ),
        base(
            "power-on-will-timeout-at out of range",
            &[(POWER_ON_TIMEOUT_ANNOTATION, "2025-13-45T99:00:00Z")],
            false,
            RemediationStep::PowerOnRequested,
        ),
        Case {
            started: Some(t(0)),
            ..base(
                "powered-off-at and node-released-at not times",
                &[
                    (REMEDIATION_STARTED_ANNOTATION, T0),
                    (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
                    (REMEDIATION_POWERED_OFF_AT_ANNOTATION, "at some point"),
                    (REMEDIATION_NODE_RELEASED_AT_ANNOTATION, "{}"),
                ],
                true,
                RemediationStep::NodeReleased,
            )
        },
        base(
            "started-at not a time",
            &[(REMEDIATION_STARTED_ANNOTATION, "yesterday")],
            false,
            RemediationStep::PowerOffRequested,
        ),
        base(
            "failed empty → still GaveUp",
            &[(REMEDIATION_FAILED_ANNOTATION, "")],
            false,
            RemediationStep::GaveUp,
        ),
    ];
    for c in cases {
        let name = c.name;
        let read = Record::from_machine_annotations(&map(c.annotations), c.on_host);
        assert_eq!(read.step, c.step, "{name}");
        assert_eq!(read.labels_backup, c.labels, "{name}");
        assert_eq!(read.annotations_backup, c.annotations_backup, "{name}");
        assert_eq!(read.power_on_timeout_at, c.timeout, "{name}");
        assert_eq!(read.started_at, c.started, "{name}");
        assert_eq!(
            (read.powered_off_at, read.node_released_at),
            (None, None),
            "{name}"
        );

        // Whatever the world, decide takes no unsafe step from it.
        for (host, node) in [
            (host(true, false), None),
            (host(true, true), Some(RemediationNodeView::default())),
            (host(false, true), Some(RemediationNodeView::default())),
            (host(false, true), None),
        ] {
            let off = host.powered_on == Some(false) && host.power_off_requested;
            let d = decide_on(read.clone(), host.clone(), node.clone());
            let ctx = format!(
                "{name}, host {:?}/{}, node {}",
                host.powered_on,
                host.power_off_requested,
                node.is_some()
            );
            assert!(
                !d.actions.iter().any(|a| matches!(a, Action::Escalate(_))),
                "{ctx}: escalated at once\n{d:#?}"
            );
            if read.step != RemediationStep::GaveUp {
                assert_ne!(d.phase, RemediationPhase::DeletingMachine, "{ctx}");
            }
            if d.actions.contains(&Action::DeleteNode) {
                assert!(off, "{ctx}: DeleteNode with the host not off\n{d:#?}");
                // What could not be read is backed up afresh from the Node (empty here).
                let r = d.record.as_ref().unwrap();
                assert_eq!(
                    r.labels_backup,
                    Some(read.labels_backup.clone().unwrap_or_default()),
                    "{ctx}"
                );
                assert_eq!(
                    r.annotations_backup,
                    Some(read.annotations_backup.clone().unwrap_or_default()),
                    "{ctx}"
                );
            }
        }
    }
}

#[test]
fn an_unreadable_power_on_deadline_starts_the_wait_instead_of_giving_up() {
    let read = Record::from_machine_annotations(
        &map(&[
            (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""),
            (POWER_ON_TIMEOUT_ANNOTATION, "soon"),
        ]),
        false,
    );
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
        message: "powering host machines/host-0 off".into(),
        conditions: vec![condition("Processing"), condition("Succeeded")],
    }
}

#[test]
fn every_step_round_trips_through_a_request_status() {
    let retried = Record {
        step: RemediationStep::PowerOffRequested,
        retry_count: 2,
        cycle_started_at: Some(t(1_300)),
        ..powering_on()
    };
    for record in [
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
        Record {
            labels_backup: Some(BTreeMap::new()),
            annotations_backup: None,
            ..backed_up()
        },
    ] {
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

/// The BMC a flow bound survives both homes of the record: a request's status and a Machine's
/// annotations; a record that ends removes it with the other markers.
#[test]
fn the_bound_bmc_round_trips_through_status_and_machine_annotations() {
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

    let annotations: BTreeMap<String, String> = record
        .machine_annotations()
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
    assert!(annotations.contains_key(REMEDIATION_HOST_BMC_ANNOTATION));
    let back = Record::from_machine_annotations(&annotations, true);
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
