//! How a remediation that gave up escalates, as tables: which OpenShift Machines may be
//! deleted, the `OwnerRemediated=False` patch a Cluster API Machine gets (both condition
//! formats, exactly, every other condition kept), and how `maxConcurrentRemediations` slots
//! are handed out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_core::remediation::escalation::{
    OPENSHIFT_MACHINE_ROLE_LABEL, OWNER_REMEDIATED, WAITING_FOR_REMEDIATION, allocate_slots,
    openshift_reprovisionable, owner_remediated_patch,
};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

/// 2025-01-01T00:00:00Z plus `ms` milliseconds.
fn t(ms: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600)
        .unwrap()
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// OpenShift: delete the Machine only when it can be reprovisioned.

#[test]
fn an_openshift_machine_is_deleted_only_when_its_owner_can_reprovision_it() {
    // (name, host externally provisioned, Machine has a controller owner, role label, Err says)
    type Case = (
        &'static str,
        bool,
        bool,
        Option<&'static str>,
        Result<(), &'static str>,
    );
    let cases: [Case; 10] = [
        (
            "worker in a MachineSet",
            false,
            true,
            Some("worker"),
            Ok(()),
        ),
        ("no role label", false, true, None, Ok(())),
        ("infra role", false, true, Some("infra"), Ok(())),
        ("empty role", false, true, Some(""), Ok(())),
        (
            "role compared exactly, as OpenShift does",
            false,
            true,
            Some("Master"),
            Ok(()),
        ),
        (
            "control plane → never",
            false,
            true,
            Some("master"),
            Err("control-plane"),
        ),
        (
            "externally provisioned host → a new Machine gets no new OS",
            true,
            true,
            Some("worker"),
            Err("externally provisioned"),
        ),
        (
            "no controller owner → nothing would replace it",
            false,
            false,
            Some("worker"),
            Err("controller owner"),
        ),
        (
            "no owner, control plane → the owner is named first",
            false,
            false,
            Some("master"),
            Err("controller owner"),
        ),
        (
            "everything wrong → the host is named first",
            true,
            false,
            Some("master"),
            Err("externally provisioned"),
        ),
    ];
    for (name, external, owner, role, expected) in cases {
        let got = openshift_reprovisionable(external, owner, role);
        match (expected, &got) {
            (Ok(()), Ok(())) => {}
            (Err(needle), Err(why)) => assert!(why.contains(needle), "{name}: {why}"),
            _ => panic!("{name}: expected {expected:?}, got {got:?}"),
        }
    }
    assert_eq!(
        OPENSHIFT_MACHINE_ROLE_LABEL,
        "machine.openshift.io/cluster-api-machine-role"
    );
}

// ---------------------------------------------------------------------------------------
// Cluster API: OwnerRemediated=False in both condition formats.

const AT: &str = "2025-01-01T00:00:00Z";
const MESSAGE: &str = "node worker-0 did not come back after 2 power cycles";

/// The v1beta1 condition (read by Cluster API up to v1.10): with a severity.
fn v1beta1() -> Value {
    json!({
        "type": "OwnerRemediated",
        "status": "False",
        "severity": "Warning",
        "reason": "WaitingForRemediation",
        "message": MESSAGE,
        "lastTransitionTime": AT,
    })
}

/// The v1beta2 condition (read by Cluster API v1.11 and later): no severity.
fn v1beta2() -> Value {
    json!({
        "type": "OwnerRemediated",
        "status": "False",
        "reason": "WaitingForRemediation",
        "message": MESSAGE,
        "lastTransitionTime": AT,
    })
}

fn cond(type_: &str, status: &str) -> Value {
    json!({
        "type": type_,
        "status": status,
        "reason": "Whatever",
        "lastTransitionTime": "2024-12-31T00:00:00Z",
    })
}

fn patch(v1: Vec<Value>, v2: Vec<Value>) -> Value {
    json!({ "status": { "conditions": v1, "v1beta2": { "conditions": v2 } } })
}

#[test]
fn owner_remediated_false_is_written_in_both_formats_and_every_other_condition_is_kept() {
    let healthy = || cond("HealthCheckSucceeded", "False");
    let ready = || cond("Ready", "False");
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "status null",
            Value::Null,
            patch(vec![v1beta1()], vec![v1beta2()]),
        ),
        (
            "status empty",
            json!({}),
            patch(vec![v1beta1()], vec![v1beta2()]),
        ),
        (
            "no conditions: only the condition lists are patched, nothing else",
            json!({ "phase": "Running", "nodeRef": { "name": "worker-0" } }),
            patch(vec![v1beta1()], vec![v1beta2()]),
        ),
        (
            "v1beta1 conditions only (Cluster API ≤ v1.10): kept, v1beta2 created",
            json!({ "conditions": [ready(), healthy()] }),
            patch(vec![ready(), healthy(), v1beta1()], vec![v1beta2()]),
        ),
        (
            "both lists: others kept in order in each, the new one last",
            json!({
                "conditions": [ready(), healthy()],
                "v1beta2": { "conditions": [healthy(), cond("Available", "False"), ready()] },
            }),
            patch(
                vec![ready(), healthy(), v1beta1()],
                vec![healthy(), cond("Available", "False"), ready(), v1beta2()],
            ),
        ),
        (
            "an existing OwnerRemediated (True, from the MachineSet) is replaced, not duplicated",
            json!({
                "conditions": [cond("OwnerRemediated", "True"), healthy()],
                "v1beta2": { "conditions": [healthy(), cond("OwnerRemediated", "True")] },
            }),
            patch(vec![healthy(), v1beta1()], vec![healthy(), v1beta2()]),
        ),
        (
            "an OwnerRemediated already False is replaced by ours",
            json!({
                "conditions": [cond("OwnerRemediated", "False")],
                "v1beta2": { "conditions": [cond("OwnerRemediated", "False")] },
            }),
            patch(vec![v1beta1()], vec![v1beta2()]),
        ),
        (
            "v1beta2 without conditions",
            json!({ "conditions": [ready()], "v1beta2": {} }),
            patch(vec![ready(), v1beta1()], vec![v1beta2()]),
        ),
        (
            "null lists",
            json!({ "conditions": null, "v1beta2": { "conditions": null } }),
            patch(vec![v1beta1()], vec![v1beta2()]),
        ),
        (
            "v1beta2 conditions only",
            json!({ "v1beta2": { "conditions": [ready()] } }),
            patch(vec![v1beta1()], vec![ready(), v1beta2()]),
        ),
        (
            "an entry without a type is someone else's: kept",
            json!({ "conditions": [{ "status": "True" }] }),
            patch(
                vec![json!({ "status": "True" }), v1beta1()],
                vec![v1beta2()],
            ),
        ),
    ];
    for (name, status, expected) in cases {
        let got = owner_remediated_patch(&status, t(0), MESSAGE);
        assert_eq!(got, expected, "{name}:\n{got:#}");
    }
    assert_eq!(
        (OWNER_REMEDIATED, WAITING_FOR_REMEDIATION),
        ("OwnerRemediated", "WaitingForRemediation")
    );
}

#[test]
fn the_transition_time_has_second_precision_like_metav1_time() {
    for (ms, at) in [
        (0, "2025-01-01T00:00:00Z"),
        (999, "2025-01-01T00:00:00Z"),
        (61_500, "2025-01-01T00:01:01Z"),
    ] {
        let got = owner_remediated_patch(&Value::Null, t(ms), "m");
        assert_eq!(
            got["status"]["conditions"][0]["lastTransitionTime"], at,
            "{ms} ms"
        );
        assert_eq!(
            got["status"]["v1beta2"]["conditions"][0]["lastTransitionTime"], at,
            "{ms} ms"
        );
    }
}

/// RFC 7386 JSON merge patch, as the API server applies it.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Cluster API's `IsFalse(OwnerRemediated)` on one list.
fn owner_remediated_false(conditions: &Value) -> bool {
    conditions
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "OwnerRemediated" && c["status"] == "False")
}

#[test]
fn applied_as_a_merge_patch_both_cluster_api_generations_see_owner_remediated_false() {
    let mut machine = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "status": {
            "phase": "Running",
            "nodeRef": { "name": "worker-0" },
            "conditions": [cond("HealthCheckSucceeded", "False"), cond("OwnerRemediated", "True")],
            "v1beta2": { "conditions": [cond("HealthCheckSucceeded", "False")], "other": 1 },
        },
    });
    let p = owner_remediated_patch(&machine["status"], t(0), MESSAGE);
    merge(&mut machine, &p);
    let status = &machine["status"];
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["nodeRef"]["name"], "worker-0");
    assert_eq!(status["v1beta2"]["other"], 1);
    for list in [&status["conditions"], &status["v1beta2"]["conditions"]] {
        assert!(owner_remediated_false(list), "{list:#}");
        let types: Vec<&str> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["HealthCheckSucceeded", "OwnerRemediated"],
            "{list:#}"
        );
    }
    // Patching again changes nothing (a restart repeats the escalation harmlessly).
    let again = owner_remediated_patch(&machine["status"], t(0), MESSAGE);
    let before = machine.clone();
    merge(&mut machine, &again);
    assert_eq!(machine, before);
}

// ---------------------------------------------------------------------------------------
// maxConcurrentRemediations.

#[test]
fn slots_go_to_the_first_waiting_remediations_up_to_the_limit() {
    // (name, in flight, max, waiting, may start)
    type Case = (
        &'static str,
        usize,
        usize,
        &'static [&'static str],
        &'static [&'static str],
    );
    let cases: [Case; 9] = [
        (
            "one slot, two waiting → the first",
            0,
            1,
            &["a", "b"],
            &["a"],
        ),
        ("slot taken → none", 1, 1, &["a"], &[]),
        (
            "more in flight than allowed (limit lowered) → none",
            3,
            1,
            &["a"],
            &[],
        ),
        (
            "three slots, two waiting → both",
            0,
            3,
            &["a", "b"],
            &["a", "b"],
        ),
        (
            "three slots, one taken, four waiting → the first two",
            1,
            3,
            &["a", "b", "c", "d"],
            &["a", "b"],
        ),
        ("order is the caller's", 0, 2, &["z", "a", "m"], &["z", "a"]),
        ("limit 0 → none", 0, 0, &["a"], &[]),
        ("nobody waiting → none", 0, 2, &[], &[]),
        ("exactly the free slots", 2, 4, &["a", "b"], &["a", "b"]),
    ];
    for (name, in_flight, max, waiting, expected) in cases {
        assert_eq!(
            allocate_slots(in_flight, max, waiting),
            expected.to_vec(),
            "{name}"
        );
    }
}
