//! Reading a review from its body: typed, skipping what the decision does not read. The
//! decision on what is read equals the decision on the whole JSON tree for everything the
//! API server sends; objects of the wrong shape are refused in the AdmissionReview, naming
//! the field; the lists that are kept are bounded, and deep nesting costs no stack.
#![allow(clippy::unwrap_used)]

use hostcycle_webhook::decide::decide_review;
use hostcycle_webhook::review::{
    API_VERSION_V1, API_VERSION_V1BETA1, AdmissionRequest, ReviewError, read_review,
};
use hostcycle_webhook::{Outcome, Policy, ServiceAccountName, decide, operator_service_account};
use proptest::prelude::*;
use serde_json::{Value, json};

fn allow_list() -> Policy {
    Policy::allow_list(
        ["alice".to_string()],
        ["power-admins".to_string()],
        ["tenant:rebooter".parse::<ServiceAccountName>().unwrap()],
        [operator_service_account()],
    )
}

fn review(operation: &str, user: &str, object: Value, old_object: Value) -> Value {
    json!({
        "apiVersion": API_VERSION_V1,
        "kind": "AdmissionReview",
        "request": {
            "uid": "6a5b0f0e-2222-4a4a-9c9c-000000000002",
            "kind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
            "resource": {"group": "metal3.io", "version": "v1alpha1", "resource": "baremetalhosts"},
            "requestKind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
            "name": "worker-1",
            "namespace": "metal3",
            "operation": operation,
            "userInfo": {"username": user, "uid": "42", "groups": ["system:authenticated"],
                         "extra": {"scopes": ["a", "b"]}},
            "object": object,
            "oldObject": old_object,
            "dryRun": false,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl"}
        }
    })
}

/// A BareMetalHost as the API server sends it: much the decision does not read.
fn host(annotations: &[(String, String)], online: Option<bool>, bmc: Value) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut spec = json!({
        "bmc": bmc,
        "bootMACAddress": "52:54:00:00:00:01",
        "image": {"url": "http://images/x.qcow2", "checksum": "abc"},
        "rootDeviceHints": {"deviceName": "/dev/sda"},
        "consumerRef": {"kind": "Machine", "name": "m-1", "namespace": "metal3"},
    });
    if let Some(online) = online {
        spec["online"] = json!(online);
    }
    json!({
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {
            "name": "worker-1", "namespace": "metal3", "uid": "u-1", "resourceVersion": "7",
            "labels": {"rack": "r1"}, "annotations": annotations,
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:online": {}}}}],
            "finalizers": ["baremetalhost.metal3.io"]
        },
        "spec": spec,
        "status": {"poweredOn": true, "operationalStatus": "OK",
                   "hardware": {"nics": [{"mac": "x", "ip": "10.0.0.2"}], "cpu": {"count": 8}}}
    })
}

/// The decision on the whole JSON tree, as before typed reading.
fn decide_on_tree(policy: &Policy, body: &Value) -> hostcycle_webhook::Verdict {
    let request: AdmissionRequest = serde_json::from_value(body["request"].clone()).unwrap();
    decide(policy, &request)
}

fn annotations() -> impl Strategy<Value = Vec<(String, String)>> {
    let key = prop::sample::select(vec![
        "reboot.metal3.io",
        "reboot.metal3.io/maint",
        "reboot.metal3.io/",
        "baremetalhost.metal3.io/paused",
        "baremetalhost.metal3.io/detached",
        "baremetalhost.metal3.io/status",
        "example.com/reboot.metal3.io",
    ]);
    let value = prop::sample::select(vec![
        "",
        r#"{"mode":"hard"}"#,
        r#"{"mode":"soft"}"#,
        "garbage",
        r#"{"mode":"hard","mode":null}"#,
        "  ",
    ]);
    prop::collection::vec(
        (key.prop_map(String::from), value.prop_map(String::from)),
        0..5,
    )
}

fn bmc() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        json!(null),
        json!({}),
        json!({"address": "redfish://10.0.0.1/redfish/v1/Systems/1", "credentialsName": "c"}),
        json!({"address": "ipmi://10.9.9.9", "credentialsName": "c",
               "disableCertificateVerification": true}),
        json!({"address": "ipmi://10.9.9.9", "credentialsName": "",
               "disableCertificateVerification": false}),
    ])
}

proptest! {
    /// Everything the API server sends is decided the same, read typed or as a tree.
    #[test]
    fn typed_reading_decides_like_the_whole_tree(
        old in annotations(), new in annotations(),
        was_online in proptest::option::of(any::<bool>()), online in proptest::option::of(any::<bool>()),
        old_bmc in bmc(), new_bmc in bmc(),
        create: bool, strict: bool, user in prop::sample::select(vec!["alice", "mallory"]),
    ) {
        let (operation, old_object) = if create {
            ("CREATE", Value::Null)
        } else {
            ("UPDATE", host(&old, was_online, old_bmc))
        };
        let body = review(operation, user, host(&new, online, new_bmc), old_object);
        for policy in [
            Policy::validate_only(),
            allow_list(),
            Policy { restrict_bmc_on_create: strict, ..allow_list() },
        ] {
            let parsed = read_review(body.to_string().as_bytes()).unwrap();
            prop_assert!(parsed.shape_problems.is_empty(), "{:?}", parsed.shape_problems);
            prop_assert_eq!(decide_review(&policy, &parsed), decide_on_tree(&policy, &body));
        }
    }
}

fn consumer() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        json!(null),
        json!({}),
        json!({"kind": "Machine", "name": "m-1", "namespace": "metal3"}),
        json!({"kind": "Machine", "name": "m-2", "namespace": "metal3", "uid": "u-2"}),
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
               "name": "m-1", "namespace": "other", "resourceVersion": "9", "fieldPath": ""}),
        json!({"kind": "Machine", "name": "m-1", "namespace": null}),
    ])
}

proptest! {
    /// `spec.consumerRef` read typed is decided as on the whole tree: added, changed, removed,
    /// or only its unread fields changed.
    #[test]
    fn typed_reading_decides_consumer_refs_like_the_whole_tree(
        old_consumer in consumer(), new_consumer in consumer(),
        create: bool, strict: bool, user in prop::sample::select(vec!["alice", "mallory"]),
    ) {
        let with = |consumer: Value| {
            let mut object = host(&[], Some(true), json!({"address": "ipmi://10.0.0.1"}));
            object["spec"]["consumerRef"] = consumer;
            object
        };
        let (operation, old_object) = if create {
            ("CREATE", Value::Null)
        } else {
            ("UPDATE", with(old_consumer))
        };
        let body = review(operation, user, with(new_consumer), old_object);
        for policy in [
            Policy::validate_only(),
            allow_list(),
            Policy { restrict_consumer_ref_on_create: strict, ..allow_list() },
        ] {
            let parsed = read_review(body.to_string().as_bytes()).unwrap();
            prop_assert!(parsed.shape_problems.is_empty(), "{:?}", parsed.shape_problems);
            prop_assert_eq!(decide_review(&policy, &parsed), decide_on_tree(&policy, &body));
        }
    }
}

#[test]
fn only_what_names_the_consumer_is_kept() {
    let mut object = host(&[], None, json!(null));
    object["spec"]["consumerRef"] = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
        "name": "m-1", "namespace": "metal3", "uid": "u-1", "resourceVersion": "9",
        "fieldPath": "x".repeat(10_000),
    });
    let body = review("CREATE", "alice", object, Value::Null);
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert!(
        parsed.shape_problems.is_empty(),
        "{:?}",
        parsed.shape_problems
    );
    assert_eq!(
        parsed.request.object.unwrap()["spec"]["consumerRef"],
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
               "name": "m-1", "namespace": "metal3"})
    );
    // A null consumerRef is none at all.
    let mut object = host(&[], None, json!(null));
    object["spec"]["consumerRef"] = Value::Null;
    let body = review("CREATE", "alice", object, Value::Null);
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        parsed.request.object.unwrap()["spec"].get("consumerRef"),
        None
    );
}

#[test]
fn only_what_the_decision_reads_is_kept() {
    let annotations = [
        ("reboot.metal3.io/maint".to_string(), "".to_string()),
        ("example.com/note".to_string(), "x".repeat(1000)),
        ("baremetalhost.metal3.io/paused".to_string(), "".to_string()),
    ];
    let body = review(
        "UPDATE",
        "alice",
        host(
            &annotations,
            Some(true),
            json!({"address": "ipmi://10.0.0.1"}),
        ),
        json!({"metadata": {"name": "worker-1"}}),
    );
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert_eq!(parsed.api_version, API_VERSION_V1);
    let request = &parsed.request;
    assert_eq!(request.uid, "6a5b0f0e-2222-4a4a-9c9c-000000000002");
    assert_eq!(request.user_info.username, "alice");
    assert_eq!(request.user_info.groups, ["system:authenticated"]);
    assert!(request.user_info.extra.is_empty(), "extra is not read");
    assert_eq!(request.object_name(), "metal3/worker-1");
    assert_eq!(
        request.object.as_ref().unwrap(),
        &json!({
            "metadata": {
                "name": "worker-1", "namespace": "metal3",
                "annotations": {"reboot.metal3.io/maint": "", "baremetalhost.metal3.io/paused": ""}
            },
            "spec": {
                "online": true,
                "bmc": {"address": "ipmi://10.0.0.1"},
                "consumerRef": {"kind": "Machine", "name": "m-1", "namespace": "metal3"}
            }
        })
    );
    assert_eq!(
        request.old_object.as_ref().unwrap(),
        &json!({"metadata": {"name": "worker-1"}})
    );

    // v1beta1 is answered in kind; a generateName create is named by its prefix.
    let mut body = review(
        "CREATE",
        "alice",
        json!({"metadata": {"generateName": "worker-"}}),
        Value::Null,
    );
    body["apiVersion"] = json!(API_VERSION_V1BETA1);
    body["request"]["name"] = json!("");
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert_eq!(parsed.api_version, API_VERSION_V1BETA1);
    assert_eq!(parsed.request.object_name(), "metal3/worker-");
    assert!(parsed.request.old_object.is_none());
}

#[test]
fn objects_of_the_wrong_shape_are_refused_naming_the_field() {
    let cases = [
        (
            json!([0, 0, 0]),
            "request.object: expected a JSON object, found an array",
        ),
        (
            json!("host"),
            "request.object: expected a JSON object, found a string",
        ),
        (
            json!({"metadata": []}),
            "request.object.metadata: expected a JSON object, found an array",
        ),
        (
            json!({"metadata": {"annotations": {"reboot.metal3.io": 5}}}),
            "request.object.metadata.annotations[\"reboot.metal3.io\"]: expected a string, found a number",
        ),
        (
            json!({"metadata": {"annotations": ["reboot.metal3.io"]}}),
            "request.object.metadata.annotations: expected a JSON object, found an array",
        ),
        (
            json!({"spec": {"online": "yes"}}),
            "request.object.spec.online: expected a boolean, found a string",
        ),
        (
            json!({"spec": {"bmc": {"address": {"host": "10.0.0.1"}}}}),
            "request.object.spec.bmc.address: expected a string, found a JSON object",
        ),
        (
            json!({"spec": {"bmc": {"disableCertificateVerification": "true"}}}),
            "request.object.spec.bmc.disableCertificateVerification: expected a boolean, found a string",
        ),
        (
            json!({"metadata": {"name": 7}}),
            "request.object.metadata.name: expected a string, found a number",
        ),
        (
            json!({"spec": {"consumerRef": "m-1"}}),
            "request.object.spec.consumerRef: expected a JSON object, found a string",
        ),
        (
            json!({"spec": {"consumerRef": {"name": 5}}}),
            "request.object.spec.consumerRef.name: expected a string, found a number",
        ),
        (
            json!({"spec": {"consumerRef": {"namespace": ["a"]}}}),
            "request.object.spec.consumerRef.namespace: expected a string, found an array",
        ),
    ];
    for (object, problem) in cases {
        let body = review("UPDATE", "alice", object.clone(), json!({}));
        let parsed = read_review(body.to_string().as_bytes()).unwrap();
        assert_eq!(parsed.shape_problems, [problem], "{object}");
        let verdict = decide_review(&Policy::validate_only(), &parsed);
        assert_eq!(verdict.outcome, Outcome::Malformed, "{object}");
        assert!(
            verdict.message.starts_with(
                "the UPDATE review of BareMetalHost metal3/worker-1 is not shaped like a \
                 BareMetalHost: "
            ) && verdict.message.ends_with(problem),
            "{}",
            verdict.message
        );
        let response = verdict.response(&parsed.request.uid);
        assert!(!response.allowed);
        assert_eq!(response.uid, "6a5b0f0e-2222-4a4a-9c9c-000000000002");
        assert_eq!(response.status.unwrap().code, 400);
        // parse_review, for callers that want the request only, refuses it.
        let err = hostcycle_webhook::review::parse_review(body.to_string().as_bytes());
        assert!(matches!(err, Err(ReviewError::WrongShape(_))), "{object}");
    }
    // The old object is checked too.
    let body = review("UPDATE", "alice", json!({}), json!({"spec": {"online": 1}}));
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        parsed.shape_problems,
        ["request.oldObject.spec.online: expected a boolean, found a number"]
    );
    // A review the webhook does not check is allowed whatever its objects.
    let mut body = review("UPDATE", "alice", json!([1]), json!([2]));
    body["request"]["resource"]["resource"] = json!("pods");
    let parsed = read_review(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        decide_review(&allow_list(), &parsed).outcome,
        Outcome::NotChecked
    );
}

#[test]
fn kept_lists_are_bounded_and_deep_nesting_is_skipped() {
    let groups: Vec<String> = (0..5000).map(|i| format!("g{i}")).collect();
    let mut body = review("UPDATE", "alice", json!({}), json!({}));
    body["request"]["userInfo"]["groups"] = json!(groups);
    let err = read_review(body.to_string().as_bytes()).unwrap_err();
    assert!(
        err.to_string()
            .contains("request.userInfo.groups has more than 4096 entries"),
        "{err}"
    );

    let annotations: Vec<(String, String)> = (0..300)
        .map(|i| (format!("reboot.metal3.io/k{i:03}"), "x".repeat(1000)))
        .collect();
    let body = review(
        "UPDATE",
        "alice",
        host(&annotations, Some(true), json!({})),
        json!({}),
    );
    let err = read_review(body.to_string().as_bytes()).unwrap_err();
    assert!(
        err.to_string()
            .contains("more than 262144 bytes of reboot, paused and detached"),
        "{err}"
    );

    // Deep nesting is skipped without recursion (serde_json ignores values iteratively): no
    // stack overflow, wherever it is.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let text = review("UPDATE", "alice", json!({"status": "DEEP"}), json!({}))
        .to_string()
        .replace("\"DEEP\"", &deep);
    let parsed = read_review(text.as_bytes()).unwrap();
    assert!(parsed.shape_problems.is_empty());
    let text = review(
        "UPDATE",
        "alice",
        json!({"spec": {"online": "DEEP"}}),
        json!({}),
    )
    .to_string()
    .replace("\"DEEP\"", &deep);
    let parsed = read_review(text.as_bytes()).unwrap();
    assert_eq!(
        parsed.shape_problems,
        ["request.object.spec.online: expected a boolean, found an array"]
    );
}
