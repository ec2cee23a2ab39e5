//! The contracts with the other remediators and checkers, as tables: whose the annotation
//! trigger is (OpenShift's CAPBM, `--remediation-triggers`), the MachineHealthCheck's
//! `nodeStartupTimeout`, CAPBM's "delete only while the Node is absent", CAPM3's unhealthy
//! mark and Cluster API's conditions, and NodeHealthCheck's escalation and orphan rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::reasons::remediation::event_reason;
use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::remediation::{
    CAPM3_UNHEALTHY_ANNOTATION, CAPM3_UNHEALTHY_DEPRECATED_ANNOTATION,
    EXTERNAL_REMEDIATION_ANNOTATION, NHC_NODE_NAME_ANNOTATION, NODE_LABELS_BACKUP_ANNOTATION,
    POWER_ON_TIMEOUT_ANNOTATION, POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION, REMEDIATION_HOST_ANNOTATION, REMEDIATION_STARTED_ANNOTATION,
    RemediationPhase, RemediationStep, unhealthy_mark,
};
use hostcycle_core::remediation::contracts::{
    MachineClaim, MachineFacts, MhcView, Triggers, is_capbm_provider, is_nhc_request,
    machine_claim, node_startup_timeout, parse_go_duration, permanent_node_deletion_expected,
    selector_matches,
};
use hostcycle_core::remediation::escalation::{
    ConditionsLayout, EscalationFacts, MachineKind, capi_gave_up_patch, capi_remediated_patch,
    choose_escalation,
};
use hostcycle_core::remediation::{
    Action, Blocker, Escalation, Observation, Record, RemediationHostView, RemediationNodeView,
    Trigger, decide, start_blocker, wants_slot,
};
use jiff::Timestamp;
use serde_json::{Value, json};

/// name, Machine annotations, hostcycle's stored record, host power-off, CAPBM provider,
/// flags, expected claim.
type ClaimCase<'a> = (
    &'a str,
    Vec<(&'a str, &'a str)>,
    bool,
    bool,
    bool,
    Triggers,
    &'a str,
);
/// name, MachineHealthChecks, expected (name, seconds).
type MhcCase<'a> = (&'a str, Vec<MhcView>, Option<(String, u64)>);

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600 + s).unwrap()
}

// ---------------------------------------------------------------------------------------
// One remediator per trigger.

#[test]
fn the_triggers_flag_parses_and_refuses_what_makes_no_sense() {
    let default = Triggers::default();
    assert!(default.machine_annotation && default.requests && !default.capbm_machines);
    assert_eq!(default.to_string(), "machine-annotation,requests");
    for (text, ok) in [
        ("machine-annotation,requests", Some((true, true, false))),
        ("requests", Some((false, true, false))),
        ("machine-annotation", Some((true, false, false))),
        (
            "machine-annotation,capbm-machines,requests",
            Some((true, true, true)),
        ),
        (" requests , machine-annotation ", Some((true, true, false))),
        ("capbm-machines", None),
        ("capbm-machines,requests", None),
        ("annotation", None),
        ("", None),
        (",", None),
    ] {
        let parsed: Result<Triggers, String> = text.parse();
        match (parsed, ok) {
            (Ok(t), Some((a, r, c))) => {
                assert_eq!(
                    (t.machine_annotation, t.requests, t.capbm_machines),
                    (a, r, c),
                    "{text:?}"
                );
                assert_eq!(
                    t.to_string().parse::<Triggers>(),
                    Ok(t),
                    "{text:?} round-trips"
                );
            }
            (Err(e), None) => assert!(!e.is_empty(), "{text:?}"),
            (other, want) => panic!("{text:?}: {other:?}, wanted {want:?}"),
        }
    }
}

#[test]
fn whose_the_annotation_trigger_is() {
    let trigger = [(EXTERNAL_REMEDIATION_ANNOTATION, "")];
    let both = Triggers::default();
    let requests_only: Triggers = "requests".parse().unwrap();
    let capbm: Triggers = "machine-annotation,capbm-machines,requests"
        .parse()
        .unwrap();
    #[rustfmt::skip]
    let cases: Vec<ClaimCase> = vec![
        ("trigger only, plain Machine → ours", trigger.to_vec(), false, false, false, both, "ours"),
        ("no trigger, no record → not ours", vec![], false, false, false, both, "not"),
        ("trigger, annotation trigger switched off → not ours", trigger.to_vec(), false, false, false, requests_only, "not"),
        ("hostcycle's stored record, trigger switched off → ours (the flow is finished)",
            trigger.to_vec(), true, false, false, requests_only, "ours"),
        ("hostcycle's stored record, trigger withdrawn → ours (withdrawal handled by the flow)",
            vec![], true, false, false, both, "ours"),
        ("hostcycle's stored record, CAPBM's markers (hostcycle writes them too) → ours",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, "")], true, true, false, both, "ours"),
        ("hostcycle's markers without its stored record, trigger → held: never read as a record (forged, or a flow that gave up)",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (REMEDIATION_STARTED_ANNOTATION, "x"), (REMEDIATION_HOST_ANNOTATION, "other-ns/h/u")], false, false, false, both, "held"),
        ("hostcycle's failure marker without its record, trigger → held until someone removes it",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (REMEDIATION_FAILED_ANNOTATION, "why")], false, false, false, both, "held"),
        ("hostcycle's markers without its record, no trigger → not ours (never a flow to finish)",
            vec![(REMEDIATION_STARTED_ANNOTATION, "x"), (REMEDIATION_HOST_ANNOTATION, "other-ns/h/u")], false, false, false, both, "not"),
        ("CAPBM's powered-off marker without hostcycle's record → held elsewhere",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, "")], false, false, false, both, "held"),
        ("CAPBM's node backup without hostcycle's record → held elsewhere",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (NODE_LABELS_BACKUP_ANNOTATION, "{}")], false, false, false, both, "held"),
        ("CAPBM's power-on timeout without hostcycle's record → held elsewhere",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (POWER_ON_TIMEOUT_ANNOTATION, "2025-01-01T00:00:00Z")], false, false, false, both, "held"),
        ("host carries capbm-requested-power-off, Machine has no record → held elsewhere", trigger.to_vec(), false, true, false, both, "held"),
        ("CAPBM's leftovers after its flow, no trigger → not ours (never read as a withdrawn flow)",
            vec![(POWERED_OFF_FOR_REMEDIATION_ANNOTATION, ""), (NODE_LABELS_BACKUP_ANNOTATION, "{}")], false, false, false, both, "not"),
        ("CAPBM provider, default flags → held elsewhere (CAPBM remediates it)", trigger.to_vec(), false, false, true, both, "held"),
        ("CAPBM provider, capbm-machines → ours", trigger.to_vec(), false, false, true, capbm, "ours"),
        ("CAPBM provider, capbm-machines, CAPBM's markers → still held elsewhere",
            vec![(EXTERNAL_REMEDIATION_ANNOTATION, ""), (POWERED_OFF_FOR_REMEDIATION_ANNOTATION, "")], false, false, true, capbm, "held"),
        ("CAPBM provider, hostcycle's stored record (started before) → ours",
            trigger.to_vec(), true, true, true, both, "ours"),
    ];
    for (name, annotations, own_record, host_power_off, capbm_provider, triggers, want) in cases {
        let annotations = map(&annotations);
        let claim = machine_claim(
            &triggers,
            &MachineFacts {
                annotations: &annotations,
                own_record,
                host_power_off,
                capbm_provider,
            },
        );
        let got = match &claim {
            MachineClaim::Ours => "ours",
            MachineClaim::NotOurs => "not",
            MachineClaim::HeldElsewhere(why) => {
                assert!(
                    (why.contains("CAPBM") || why.contains("no record of a flow"))
                        && why.len() > 40,
                    "{name}: the Warning says who and why: {why}"
                );
                "held"
            }
        };
        assert_eq!(got, want, "{name}: {claim:?}");
    }
}

#[test]
fn a_capbm_machine_is_recognised_by_its_provider_spec() {
    for (spec, want) in [
        (
            json!({ "providerSpec": { "value": {
                "apiVersion": "baremetal.cluster.k8s.io/v1alpha1",
                "kind": "BareMetalMachineProviderSpec",
                "image": { "url": "http://x" } } } }),
            true,
        ),
        (
            json!({ "providerSpec": { "value": { "kind": "BareMetalMachineProviderSpec" } } }),
            true,
        ),
        (
            json!({ "providerSpec": { "value": { "apiVersion": "baremetal.cluster.k8s.io/v1alpha1" } } }),
            true,
        ),
        (
            json!({ "providerSpec": { "value": {
                "apiVersion": "machine.openshift.io/v1beta1", "kind": "AWSMachineProviderConfig" } } }),
            false,
        ),
        (
            json!({ "infrastructureRef": { "kind": "Metal3Machine" } }),
            false,
        ),
        (json!({}), false),
        (Value::Null, false),
    ] {
        assert_eq!(is_capbm_provider(&spec), want, "{spec}");
    }
}

/// An observation of an annotation flow with the target ready to start.
fn annotation_obs() -> Observation {
    let host = RemediationHostView {
        name: "openshift-machine-api/h0".into(),
        uid: "uid-h0".into(),
        powered_on: Some(true),
        last_updated: Some(t(0)),
        observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
        spec_bmc: hostcycle_api::ObservedBmc::default(),
        power_off_requested: false,
        online: true,
        externally_provisioned: false,
        error: None,
        cannot_power_off: None,
        marked_unhealthy: None,
    };
    Observation {
        trigger: Trigger::MachineAnnotation,
        requested: true,
        target: Ok(host.clone()),
        bound: None,
        node_name: Some("w0".into()),
        node: Some(RemediationNodeView {
            ready: false,
            ..Default::default()
        }),
        record: Record::default(),
        retry_limit: 0,
        power_on_timeout: Duration::from_secs(600),
        power_off_timeout: Duration::from_secs(300),
        slot_free: true,
        queue_reboot_until: None,
        escalation: Escalation::DeleteMachine,
        held_elsewhere: None,
        joined_running: None,
        clock_untrusted: None,
        release_strategy: Ok(hostcycle_core::remediation::release::ReleaseStrategy::DeleteNode),
        out_of_service_served: false,
        workloads: None,
        leave_off: false,
    }
}

#[test]
fn a_machine_held_elsewhere_is_never_acted_on_and_takes_no_slot() {
    let mut o = annotation_obs();
    o.held_elsewhere = Some("another remediator (CAPBM) holds this Machine".into());
    for step in [
        RemediationStep::NotStarted,
        RemediationStep::PowerOffRequested,
        RemediationStep::NodeReleased,
        RemediationStep::PowerOnRequested,
    ] {
        o.record.step = step;
        let d = decide(&o, t(100));
        assert_eq!(d.record, None, "{step:?}: nothing recorded");
        assert!(d.actions.is_empty(), "{step:?}: no action: {:?}", d.actions);
        assert_eq!(d.blocked, Some(event_reason::HELD_ELSEWHERE), "{step:?}");
        assert_eq!(d.phase, RemediationPhase::Pending, "{step:?}");
        assert!(
            d.events
                .iter()
                .any(|e| e.is_warning() && e.reason == "RemediationHeldElsewhere"),
            "{step:?}: {:?}",
            d.events
        );
    }
    o.record.step = RemediationStep::NotStarted;
    assert!(!wants_slot(&o, t(100)));
    o.held_elsewhere = None;
    assert!(wants_slot(&o, t(100)));
}

// ---------------------------------------------------------------------------------------
// The power-on timeout: the MachineHealthCheck's nodeStartupTimeout.

#[test]
fn go_durations_parse_as_kubernetes_writes_them() {
    for (text, want) in [
        ("10m", Some(600.0)),
        ("0", Some(0.0)),
        ("0s", Some(0.0)),
        ("1h30m", Some(5400.0)),
        ("1.5h", Some(5400.0)),
        ("300ms", Some(0.3)),
        ("45s", Some(45.0)),
        ("2h45m10s", Some(9910.0)),
        ("", None),
        ("10", None),
        ("m", None),
        ("-5m", None),
        ("10 m", None),
        ("5d", None),
    ] {
        assert_eq!(
            parse_go_duration(text).map(|d| d.as_secs_f64()),
            want,
            "{text:?}"
        );
    }
}

#[test]
fn label_selectors_select_as_kubernetes_does() {
    let labels = map(&[
        ("machine.openshift.io/cluster-api-machine-role", "worker"),
        ("zone", "a"),
    ]);
    #[rustfmt::skip]
    let cases = [
        (json!({}), true),
        (Value::Null, true),
        (json!({ "matchLabels": { "zone": "a" } }), true),
        (json!({ "matchLabels": { "zone": "b" } }), false),
        (json!({ "matchLabels": { "zone": "a", "missing": "x" } }), false),
        (json!({ "matchExpressions": [{ "key": "machine.openshift.io/cluster-api-machine-role", "operator": "In", "values": ["worker", "infra"] }] }), true),
        (json!({ "matchExpressions": [{ "key": "machine.openshift.io/cluster-api-machine-role", "operator": "NotIn", "values": ["master"] }] }), true),
        (json!({ "matchExpressions": [{ "key": "machine.openshift.io/cluster-api-machine-role", "operator": "NotIn", "values": ["worker"] }] }), false),
        (json!({ "matchExpressions": [{ "key": "zone", "operator": "Exists" }] }), true),
        (json!({ "matchExpressions": [{ "key": "zone", "operator": "DoesNotExist" }] }), false),
        (json!({ "matchExpressions": [{ "key": "missing", "operator": "DoesNotExist" }] }), true),
        (json!({ "matchExpressions": [{ "key": "zone", "operator": "Gt", "values": ["1"] }] }), false),
        (json!({ "matchLabels": { "zone": "a" }, "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["b"] }] }), false),
    ];
    for (selector, want) in cases {
        assert_eq!(selector_matches(&selector, &labels), want, "{selector}");
    }
}

#[test]
fn the_power_on_timeout_follows_the_selecting_machine_health_check() {
    let mhc = |name: &str, role: &str, timeout: Option<&str>| MhcView {
        name: name.into(),
        selector: json!({ "matchLabels": { "machine.openshift.io/cluster-api-machine-role": role } }),
        node_startup_timeout: timeout.map(str::to_string),
    };
    let worker = map(&[("machine.openshift.io/cluster-api-machine-role", "worker")]);
    let secs = |found: Option<(String, Duration)>| found.map(|(n, d)| (n, d.as_secs()));
    #[rustfmt::skip]
    let cases: Vec<MhcCase> = vec![
        ("no MachineHealthCheck → the flag's", vec![], None),
        ("one selects it → its nodeStartupTimeout", vec![mhc("workers", "worker", Some("7m"))], Some(("workers".into(), 420))),
        ("none selects it → the flag's", vec![mhc("masters", "master", Some("7m"))], None),
        ("nodeStartupTimeout 0 (startup checks off) → the flag's", vec![mhc("workers", "worker", Some("0"))], None),
        ("nodeStartupTimeout absent → the flag's", vec![mhc("workers", "worker", None)], None),
        ("unparsable → the flag's", vec![mhc("workers", "worker", Some("soon"))], None),
        ("two select it → the first by name",
            vec![mhc("z-workers", "worker", Some("3m")), mhc("a-workers", "worker", Some("9m"))], Some(("a-workers".into(), 540))),
    ];
    for (name, mhcs, want) in cases {
        assert_eq!(secs(node_startup_timeout(&mhcs, &worker)), want, "{name}");
    }
}

#[test]
fn the_power_on_deadline_is_recorded_from_the_observed_timeout() {
    // The controller puts the MachineHealthCheck's timeout into the observation; the step
    // that powers on records the deadline from it.
    let mut o = annotation_obs();
    o.record = Record {
        step: RemediationStep::NodeReleased,
        host: bound_h0(),
        started_at: Some(t(0)),
        cycle_started_at: Some(t(0)),
        ..Record::default()
    };
    o.bound = o.target.clone().ok();
    o.node = None;
    o.power_on_timeout = Duration::from_secs(420);
    let d = decide(&o, t(100));
    assert_eq!(d.record.unwrap().power_on_timeout_at, Some(t(520)));
    assert_eq!(d.actions, vec![Action::ReleasePowerOff]);
}

// ---------------------------------------------------------------------------------------
// Giving up: CAPBM's "only while the Node is absent", CAPM3's mark, NodeHealthCheck.

/// The host `annotation_obs` targets, as a record binds it.
fn bound_h0() -> Option<hostcycle_core::binding::BoundHost> {
    hostcycle_core::binding::BoundHost::parse("openshift-machine-api/h0/uid-h0")
}

fn timed_out(mut o: Observation, node: Option<RemediationNodeView>) -> Observation {
    o.record = Record {
        step: RemediationStep::PowerOnRequested,
        host: bound_h0(),
        started_at: Some(t(0)),
        cycle_started_at: Some(t(0)),
        powered_off_at: Some(t(10)),
        node_released_at: Some(t(20)),
        power_on_timeout_at: Some(t(600)),
        ..Record::default()
    };
    o.bound = o.target.clone().ok();
    o.node = node;
    o
}

#[test]
fn on_the_power_on_timeout_a_machine_is_deleted_only_while_its_node_is_absent() {
    let registered = RemediationNodeView {
        ready: false,
        ..Default::default()
    };
    #[rustfmt::skip]
    let cases = [
        ("reprovisionable, Node absent → deleted", Escalation::DeleteMachine, None, Some(Escalation::DeleteMachine), RemediationPhase::DeletingMachine),
        ("reprovisionable, Node registered, not Ready → kept, reported", Escalation::DeleteMachine, Some(registered.clone()), None, RemediationPhase::Failed),
        ("Cluster API, Node registered → still OwnerRemediated (its owner decides)", Escalation::MarkOwnerRemediated, Some(registered.clone()), Some(Escalation::MarkOwnerRemediated), RemediationPhase::Failed),
    ];
    for (name, escalation, node, want, phase) in cases {
        let mut o = timed_out(annotation_obs(), node);
        o.escalation = escalation;
        let d = decide(&o, t(601));
        assert_eq!(
            d.record.as_ref().unwrap().step,
            RemediationStep::GaveUp,
            "{name}"
        );
        let escalated = d.actions.iter().find_map(|a| match a {
            Action::Escalate(e) => Some(e.clone()),
            _ => None,
        });
        assert_eq!(escalated, want, "{name}: {:?}", d.actions);
        assert_eq!(d.phase, phase, "{name}");
        if want.is_none() {
            assert!(
                d.events
                    .iter()
                    .any(|e| e.is_warning() && e.message.contains("the Machine is kept")),
                "{name}: {:?}",
                d.events
            );
        }
    }
}

#[test]
fn a_cluster_api_remediation_that_gives_up_marks_its_host_as_capm3_does() {
    for trigger in [Trigger::Request, Trigger::MachineAnnotation] {
        let mut o = timed_out(annotation_obs(), None);
        o.trigger = trigger;
        o.escalation = Escalation::MarkOwnerRemediated;
        let d = decide(&o, t(601));
        assert_eq!(
            d.actions,
            vec![
                Action::MarkHostUnhealthy,
                Action::Escalate(Escalation::MarkOwnerRemediated)
            ],
            "{trigger:?}: the mark before the owner acts (so the new Machine avoids the host)"
        );
        // Not for OpenShift Machines nor NodeHealthCheck.
        for other in [
            Escalation::DeleteMachine,
            Escalation::None("NodeHealthCheck".into()),
        ] {
            o.escalation = other.clone();
            let d = decide(&o, t(601));
            assert!(
                !d.actions.contains(&Action::MarkHostUnhealthy),
                "{trigger:?} {other:?}: {:?}",
                d.actions
            );
        }
    }
}

#[test]
fn a_host_marked_unhealthy_under_either_key_is_not_remediated_again() {
    for key in [
        CAPM3_UNHEALTHY_ANNOTATION,
        CAPM3_UNHEALTHY_DEPRECATED_ANNOTATION,
    ] {
        assert_eq!(
            unhealthy_mark(&map(&[(key, "capm3/UnhealthyNode")])),
            Some(key)
        );
        let mut o = annotation_obs();
        if let Ok(h) = &mut o.target {
            h.marked_unhealthy = Some(key.into());
        }
        let blocker = start_blocker(&o).expect("blocked");
        assert!(
            matches!(blocker, Blocker::MarkedUnhealthy { .. }),
            "{blocker:?}"
        );
        assert_eq!(blocker.reason(), "HostMarkedUnhealthy");
        assert!(
            blocker.to_string().contains(&format!("{key}-")),
            "says how to clear it: {blocker}"
        );
        let d = decide(&o, t(1));
        assert!(d.actions.is_empty(), "{key}: {:?}", d.actions);
        assert_eq!(d.blocked, Some("HostMarkedUnhealthy"));
        assert!(
            !wants_slot(&o, t(1)),
            "{key}: a blocked remediation takes no slot"
        );
    }
    assert_eq!(unhealthy_mark(&map(&[("capm3.metal3.io/other", "")])), None);
}

#[test]
fn escalation_belongs_to_node_health_check_for_its_requests() {
    #[rustfmt::skip]
    let cases = [
        ("NodeHealthCheck request with an OpenShift Machine owner (reprovisionable) → no deletion", Some(MachineKind::OpenShift), true, true, None, "none"),
        ("NodeHealthCheck request without Machine → none", None, true, false, None, "none"),
        ("OpenShift Machine (MachineHealthCheck's), reprovisionable → delete", Some(MachineKind::OpenShift), false, true, Some("worker"), "delete"),
        ("OpenShift control-plane Machine → none", Some(MachineKind::OpenShift), false, true, Some("master"), "none"),
        ("OpenShift Machine without controller owner → none", Some(MachineKind::OpenShift), false, false, None, "none"),
        ("Cluster API Machine → OwnerRemediated", Some(MachineKind::ClusterApi), false, false, None, "owner"),
    ];
    for (name, machine, nhc, owner, role, want) in cases {
        let e = choose_escalation(&EscalationFacts {
            machine,
            nhc_request: nhc,
            host_externally_provisioned: false,
            machine_has_controller_owner: owner,
            machine_role: role,
        });
        let got = match &e {
            Escalation::DeleteMachine => "delete",
            Escalation::MarkOwnerRemediated => "owner",
            Escalation::None(why) => {
                assert!(!why.is_empty(), "{name}");
                "none"
            }
        };
        assert_eq!(got, want, "{name}: {e:?}");
    }
}

#[test]
fn node_health_check_requests_are_recognised() {
    let nhc_annotation = map(&[(NHC_NODE_NAME_ANNOTATION, "w0")]);
    let none = BTreeMap::new();
    assert!(is_nhc_request(&nhc_annotation, []));
    assert!(is_nhc_request(
        &none,
        [("remediation.medik8s.io/v1alpha1", "NodeHealthCheck")]
    ));
    assert!(!is_nhc_request(
        &none,
        [("cluster.x-k8s.io/v1beta1", "Machine")]
    ));
    assert!(!is_nhc_request(
        &none,
        [("example.com/v1", "NodeHealthCheck")]
    ));
}

#[test]
fn permanent_node_deletion_expected_keeps_a_gave_up_request_from_being_an_orphan() {
    let base = Record {
        started_at: Some(t(0)),
        cycle_started_at: Some(t(0)),
        ..Record::default()
    };
    let with = |step, backup: bool, released: bool| Record {
        step,
        labels_backup: backup.then(BTreeMap::new),
        node_released_at: released.then(|| t(20)),
        ..base.clone()
    };
    #[rustfmt::skip]
    let cases = [
        ("not started", with(RemediationStep::NotStarted, false, false), false, false),
        ("powering off, deletion not decided", with(RemediationStep::PowerOffRequested, false, false), true, false),
        ("powering off, deletion decided (backup written)", with(RemediationStep::PowerOffRequested, true, false), true, true),
        ("released, Node gone", with(RemediationStep::NodeReleased, true, true), false, true),
        ("powered on, Node not back", with(RemediationStep::PowerOnRequested, true, true), false, true),
        ("powered on, Node back", with(RemediationStep::PowerOnRequested, true, true), true, false),
        ("gave up with the Node still gone → True (NodeHealthCheck escalates, no orphan)", with(RemediationStep::GaveUp, false, true), false, true),
        ("gave up with the Node back → False", with(RemediationStep::GaveUp, false, true), true, false),
        ("gave up before the Node was deleted → False", with(RemediationStep::GaveUp, false, false), false, false),
        ("done", with(RemediationStep::Done, false, true), true, false),
        ("cancelled", with(RemediationStep::Cancelled, false, false), true, false),
    ];
    for (name, record, node_exists, want) in cases {
        assert_eq!(
            permanent_node_deletion_expected(&record, node_exists),
            want,
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Cluster API's conditions, in both API versions.

fn find<'a>(list: &'a Value, type_: &str) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|c| c["type"].as_str() == Some(type_))
}

#[test]
fn giving_up_writes_owner_remediated_and_externally_remediated_where_each_version_keeps_them() {
    let mhc_set = json!({ "type": "ExternallyRemediated", "status": "False", "reason": "WaitingForRemediation" });
    let health =
        json!({ "type": "HealthCheckSucceeded", "status": "False", "reason": "UnhealthyNode" });
    // v1beta1: v1beta1 conditions at status.conditions, v1beta2 at status.v1beta2.conditions.
    let status = json!({
        "conditions": [{ "type": "HealthCheckSucceeded", "status": "False", "severity": "Warning" }],
        "v1beta2": { "conditions": [health.clone(), mhc_set.clone()] },
    });
    let p = capi_gave_up_patch(&status, ConditionsLayout::V1Beta1, t(5), "gave up", true);
    let v1 = &p["status"]["conditions"];
    let v2 = &p["status"]["v1beta2"]["conditions"];
    assert_eq!(find(v1, "OwnerRemediated").unwrap()["severity"], "Warning");
    assert!(find(v1, "HealthCheckSucceeded").is_some(), "others kept");
    assert!(
        find(v1, "ExternallyRemediated").is_none(),
        "a v1beta2-only condition"
    );
    assert_eq!(
        find(v2, "OwnerRemediated").unwrap()["reason"],
        "WaitingForRemediation"
    );
    let ext = find(v2, "ExternallyRemediated").unwrap();
    assert_eq!(
        (ext["status"].as_str(), ext["reason"].as_str()),
        (Some("False"), Some("RemediationFailed"))
    );
    assert_eq!(ext["message"], "gave up");
    assert!(find(v2, "HealthCheckSucceeded").is_some());
    assert_eq!(
        v2.as_array().unwrap().len(),
        3,
        "ExternallyRemediated replaced, not added: {v2}"
    );

    // v1beta2: v1beta2 conditions at status.conditions, v1beta1 under status.deprecated.
    let status = json!({
        "conditions": [health, mhc_set],
        "deprecated": { "v1beta1": { "conditions": [] } },
    });
    let p = capi_gave_up_patch(&status, ConditionsLayout::V1Beta2, t(5), "gave up", true);
    let v2 = &p["status"]["conditions"];
    let v1 = &p["status"]["deprecated"]["v1beta1"]["conditions"];
    assert!(
        find(v2, "OwnerRemediated")
            .unwrap()
            .get("severity")
            .is_none()
    );
    assert_eq!(
        find(v2, "ExternallyRemediated").unwrap()["reason"],
        "RemediationFailed"
    );
    assert_eq!(find(v1, "OwnerRemediated").unwrap()["severity"], "Warning");
    assert!(
        p["status"].get("v1beta2").is_none(),
        "no v1beta2 block in v1beta2: {p}"
    );

    // The annotation flow (no request): ExternallyRemediated is not the flow's to write.
    let p = capi_gave_up_patch(
        &json!({}),
        ConditionsLayout::V1Beta1,
        t(5),
        "gave up",
        false,
    );
    assert!(
        find(
            &p["status"]["v1beta2"]["conditions"],
            "ExternallyRemediated"
        )
        .is_none()
    );
    assert_eq!(
        ConditionsLayout::of("cluster.x-k8s.io/v1beta2"),
        ConditionsLayout::V1Beta2
    );
    assert_eq!(
        ConditionsLayout::of("cluster.x-k8s.io/v1beta1"),
        ConditionsLayout::V1Beta1
    );
}

#[test]
fn a_successful_remediation_removes_externally_remediated() {
    let status = json!({ "v1beta2": { "conditions": [
        { "type": "ExternallyRemediated", "status": "False", "reason": "WaitingForRemediation" },
        { "type": "Ready", "status": "True" },
    ] } });
    let p = capi_remediated_patch(&status, ConditionsLayout::V1Beta1).unwrap();
    assert_eq!(
        p,
        json!({ "status": { "v1beta2": { "conditions": [{ "type": "Ready", "status": "True" }] } } })
    );
    let status = json!({ "conditions": [
        { "type": "ExternallyRemediated", "status": "False" },
    ] });
    let p = capi_remediated_patch(&status, ConditionsLayout::V1Beta2).unwrap();
    assert_eq!(p, json!({ "status": { "conditions": [] } }));
    assert_eq!(
        capi_remediated_patch(&json!({ "conditions": [] }), ConditionsLayout::V1Beta2),
        None,
        "nothing to remove: no write"
    );
}
