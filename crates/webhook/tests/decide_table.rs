//! The webhook's decision, case by case: values (always checked), the allow-list (who may
//! request power changes), what is not looked at, and the answer's shape.
#![allow(clippy::unwrap_used)]

use hostcycle_webhook::review::{AdmissionRequest, GroupVersionResource, Operation, UserInfo};
use hostcycle_webhook::{
    ACCEPTED_VALUES, Outcome, Policy, PowerChange, ServiceAccountName, decide,
    operator_service_account, power_changes,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const KEYED: &str = "reboot.metal3.io/maint";
const SUFFIXLESS: &str = "reboot.metal3.io";
const HARD: &str = r#"{"mode":"hard"}"#;

fn host(annotations: &[(&str, &str)], online: bool) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": { "name": "worker-1", "namespace": "metal3", "annotations": annotations },
        "spec": { "online": online, "bmc": { "address": "redfish://10.0.0.1/redfish/v1/Systems/1" } },
    })
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        username: name.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    }
}

fn mallory() -> UserInfo {
    user("mallory", &["system:authenticated", "hosts-editors"])
}

fn request(
    operation: Operation,
    who: UserInfo,
    old: Option<Value>,
    new: Option<Value>,
) -> AdmissionRequest {
    AdmissionRequest {
        uid: "6a5b0f0e-1111-4a4a-9c9c-000000000001".to_string(),
        resource: GroupVersionResource {
            group: "metal3.io".to_string(),
            version: "v1alpha1".to_string(),
            resource: "baremetalhosts".to_string(),
        },
        sub_resource: None,
        name: Some("worker-1".to_string()),
        namespace: Some("metal3".to_string()),
        operation,
        user_info: who,
        object: new,
        old_object: old,
        dry_run: Some(false),
    }
}

fn update(who: UserInfo, old: Value, new: Value) -> AdmissionRequest {
    request(Operation::Update, who, Some(old), Some(new))
}

fn create(who: UserInfo, new: Value) -> AdmissionRequest {
    // The API server sends no name for generateName creates; here it is known.
    request(Operation::Create, who, None, Some(new))
}

fn allow_list() -> Policy {
    Policy::allow_list(
        ["alice".to_string()],
        ["power-admins".to_string()],
        ["tenant:rebooter".parse::<ServiceAccountName>().unwrap()],
        [operator_service_account()],
    )
}

// ---- values ---------------------------------------------------------------------------------

#[test]
fn valid_values_are_accepted_on_create_and_update() {
    let policy = Policy::validate_only();
    for value in [
        "",
        "null",
        "{}",
        HARD,
        r#"{"mode":"soft"}"#,
        r#"{"mode":""}"#,
        r#"{"Mode":"hard","force":true}"#,
    ] {
        for key in [SUFFIXLESS, KEYED] {
            let created = decide(&policy, &create(mallory(), host(&[(key, value)], true)));
            assert_eq!(
                created.outcome,
                Outcome::Allowed,
                "{key}={value:?}: {created:?}"
            );
            let updated = decide(
                &policy,
                &update(mallory(), host(&[], true), host(&[(key, value)], true)),
            );
            assert_eq!(
                updated.outcome,
                Outcome::Allowed,
                "{key}={value:?}: {updated:?}"
            );
            assert!(updated.warnings.is_empty());
        }
    }
}

#[test]
fn unusable_values_are_refused_with_what_is_accepted() {
    let policy = Policy::validate_only();
    for (value, why) in [
        ("hard", "value is not JSON"),
        (r#""hard""#, "value is not a JSON object"),
        ("[1]", "value is not a JSON object"),
        (r#"{"mode":"HARD"}"#, r#"unknown mode "HARD""#),
        (r#"{"mode":"reboot"}"#, r#"unknown mode "reboot""#),
        (r#"{"mode":5}"#, "mode is not a string"),
        (r#"{"force":"yes"}"#, r#""force" is not true or false"#),
        ("  ", "value is only whitespace"),
        (
            r#"{"mode":"hard","mode":null}"#,
            "\"mode\" is repeated and metal3 reads hard where hostcycle reads soft",
        ),
    ] {
        for verdict in [
            decide(&policy, &create(mallory(), host(&[(KEYED, value)], true))),
            decide(
                &policy,
                &update(mallory(), host(&[], true), host(&[(KEYED, value)], true)),
            ),
            decide(
                &policy,
                &update(
                    mallory(),
                    host(&[(KEYED, HARD)], true),
                    host(&[(KEYED, value)], true),
                ),
            ),
        ] {
            assert_eq!(
                verdict.outcome,
                Outcome::InvalidValue,
                "{value:?}: {verdict:?}"
            );
            assert!(!verdict.is_allowed());
            let expected = format!(
                "invalid reboot annotation value on BareMetalHost metal3/worker-1: {KEYED}: {why}"
            );
            assert!(
                verdict.message.starts_with(&expected),
                "{value:?}: {}",
                verdict.message
            );
            assert!(
                verdict.message.ends_with(&format!("({ACCEPTED_VALUES})")),
                "{}",
                verdict.message
            );
        }
    }
}

#[test]
fn an_unusable_value_left_as_it_was_is_let_through_with_a_warning() {
    let policy = Policy::validate_only();
    // Set before the webhook existed; the host controller still removes other annotations.
    let old = host(&[(KEYED, "garbage"), (SUFFIXLESS, "")], true);
    let new = host(&[(KEYED, "garbage")], true);
    let verdict = decide(&policy, &update(operator_user(), old.clone(), new));
    assert_eq!(verdict.outcome, Outcome::Allowed);
    assert_eq!(
        verdict.warnings,
        [format!(
            "{KEYED} keeps an unusable value (value is not JSON); the controller reads it as a soft request"
        )]
    );
    // Changing it to another unusable value is refused; removing it is fine.
    let changed = decide(
        &policy,
        &update(mallory(), old.clone(), host(&[(KEYED, "worse")], true)),
    );
    assert_eq!(changed.outcome, Outcome::InvalidValue);
    let removed = decide(&policy, &update(mallory(), old, host(&[], true)));
    assert_eq!(removed.outcome, Outcome::Allowed);
    assert!(removed.warnings.is_empty());
}

#[test]
fn other_annotations_are_not_checked() {
    let policy = allow_list();
    let garbage = "not json";
    for key in [
        "reboot.metal3.iox",
        "example.com/reboot.metal3.io",
        "Reboot.metal3.io",
        "hostcycle.io/reboot-queue-request",
    ] {
        let verdict = decide(
            &policy,
            &update(mallory(), host(&[], true), host(&[(key, garbage)], true)),
        );
        assert_eq!(verdict.outcome, Outcome::Allowed, "{key}");
    }
}

#[test]
fn odd_keys_and_values_are_refused() {
    let policy = Policy::validate_only();
    let verdict = decide(
        &policy,
        &create(mallory(), host(&[("reboot.metal3.io/", "")], true)),
    );
    assert_eq!(verdict.outcome, Outcome::InvalidValue);
    assert!(
        verdict.message.contains("the key has nothing after"),
        "{}",
        verdict.message
    );

    let mut object = host(&[], true);
    object["metadata"]["annotations"][KEYED] = json!(5);
    let verdict = decide(&policy, &create(mallory(), object));
    assert_eq!(verdict.outcome, Outcome::InvalidValue);
    assert!(
        verdict.message.contains("the value is not a string"),
        "{}",
        verdict.message
    );
}

#[test]
fn long_values_are_not_repeated_in_full() {
    let mode = "x".repeat(100_000);
    let value = format!(r#"{{"mode":"{mode}"}}"#);
    let verdict = decide(
        &Policy::validate_only(),
        &create(mallory(), host(&[(KEYED, &value)], true)),
    );
    assert_eq!(verdict.outcome, Outcome::InvalidValue);
    assert!(
        verdict.message.len() < 1000,
        "{} bytes",
        verdict.message.len()
    );
    assert!(
        verdict.message.contains("unknown mode \"xxx"),
        "{}",
        verdict.message
    );
    assert!(verdict.message.contains("…"), "{}", verdict.message);
}

#[test]
fn many_problems_are_listed_then_counted() {
    let keys: Vec<String> = (0..8).map(|i| format!("reboot.metal3.io/k{i}")).collect();
    let annotations: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "x")).collect();
    let verdict = decide(
        &Policy::validate_only(),
        &create(mallory(), host(&annotations, true)),
    );
    assert_eq!(verdict.outcome, Outcome::InvalidValue);
    assert!(
        verdict
            .message
            .contains("reboot.metal3.io/k5: value is not JSON, and 2 more"),
        "{}",
        verdict.message
    );
}

// ---- who ------------------------------------------------------------------------------------

fn operator_user() -> UserInfo {
    user(
        "system:serviceaccount:hostcycle-system:hostcycle-operator",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:hostcycle-system",
            "system:authenticated",
        ],
    )
}

#[test]
fn unlisted_users_may_not_request_power_changes() {
    let policy = allow_list();
    let cases = [
        (
            "add",
            host(&[], true),
            host(&[(KEYED, "")], true),
            "add reboot.metal3.io/maint",
        ),
        (
            "add suffixless",
            host(&[], true),
            host(&[(SUFFIXLESS, HARD)], true),
            "add reboot.metal3.io",
        ),
        (
            "remove",
            host(&[(KEYED, "")], true),
            host(&[], true),
            "remove reboot.metal3.io/maint",
        ),
        (
            "change",
            host(&[(KEYED, "")], true),
            host(&[(KEYED, HARD)], true),
            "change reboot.metal3.io/maint",
        ),
        (
            "offline",
            host(&[], true),
            host(&[], false),
            "set spec.online to false",
        ),
    ];
    for (case, old, new, what) in cases {
        let verdict = decide(&policy, &update(mallory(), old, new));
        assert_eq!(
            verdict.outcome,
            Outcome::Unauthorized,
            "{case}: {verdict:?}"
        );
        assert_eq!(
            verdict.message,
            format!(
                "user \"mallory\" may not {what} on BareMetalHost metal3/worker-1: adding, removing \
                 or changing reboot.metal3.io annotations and setting spec.online to false are \
                 allowed only to {LISTED}"
            ),
            "{case}"
        );
        let response = verdict.response("uid-1");
        assert!(!response.allowed);
        assert_eq!(response.uid, "uid-1");
        assert_eq!(response.status.unwrap().code, 403);
    }
}

#[test]
fn unlisted_users_may_still_edit_everything_else() {
    let policy = allow_list();
    let with_hold = host(&[(KEYED, HARD)], true);
    let mut relabelled = with_hold.clone();
    relabelled["metadata"]["labels"] = json!({"rack": "r12"});
    relabelled["metadata"]["annotations"]["example.com/note"] = json!("hi");
    for (case, old, new) in [
        ("labels with a hold in place", with_hold.clone(), relabelled),
        ("power on", host(&[], false), host(&[], true)),
        (
            "stays off",
            host(&[], false),
            host(&[("example.com/x", "y")], false),
        ),
    ] {
        let verdict = decide(&policy, &update(mallory(), old, new));
        assert_eq!(verdict.outcome, Outcome::Allowed, "{case}: {verdict:?}");
        assert!(verdict.changes.is_empty(), "{case}");
    }
    let verdict = decide(&policy, &create(mallory(), host(&[], true)));
    assert_eq!(verdict.outcome, Outcome::Allowed);
}

#[test]
fn creating_a_host_off_or_with_a_reboot_request_is_a_power_request() {
    let policy = allow_list();
    let off = decide(&policy, &create(mallory(), host(&[], false)));
    assert_eq!(off.outcome, Outcome::Unauthorized);
    assert!(
        off.message.contains("may not set spec.online to false"),
        "{}",
        off.message
    );
    let annotated = decide(&policy, &create(mallory(), host(&[(KEYED, "")], true)));
    assert_eq!(annotated.outcome, Outcome::Unauthorized);
    let mut no_online = host(&[], true);
    no_online["spec"].as_object_mut().unwrap().remove("online");
    assert_eq!(
        power_changes(None, &no_online),
        [PowerChange::SetOffline],
        "a missing online is false, as metal3 reads it"
    );
}

#[test]
fn listed_identities_may() {
    let policy = allow_list();
    for who in [
        user("alice", &["system:authenticated"]),
        user("bob", &["system:authenticated", "power-admins"]),
        user(
            "system:serviceaccount:tenant:rebooter",
            &["system:serviceaccounts"],
        ),
        operator_user(),
    ] {
        for (old, new) in [
            (host(&[], true), host(&[(KEYED, HARD)], true)),
            (
                host(&[(KEYED, HARD), (SUFFIXLESS, "")], true),
                host(&[], true),
            ),
            (host(&[], true), host(&[], false)),
        ] {
            let verdict = decide(&policy, &update(who.clone(), old, new));
            assert_eq!(
                verdict.outcome,
                Outcome::Allowed,
                "{}: {verdict:?}",
                who.username
            );
            assert!(!verdict.changes.is_empty());
        }
    }
    let other_sa = user(
        "system:serviceaccount:tenant:other",
        &["system:serviceaccounts"],
    );
    let verdict = decide(
        &policy,
        &update(other_sa, host(&[], true), host(&[(KEYED, "")], true)),
    );
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert!(
        verdict
            .message
            .starts_with("user \"system:serviceaccount:tenant:other\" may not add")
    );
}

#[test]
fn listed_users_values_are_still_checked_and_unlisted_users_hear_both() {
    let policy = allow_list();
    let alice = user("alice", &[]);
    let verdict = decide(
        &policy,
        &update(alice, host(&[], true), host(&[(KEYED, "hard")], true)),
    );
    assert_eq!(verdict.outcome, Outcome::InvalidValue);
    assert_eq!(verdict.response("u").status.unwrap().code, 400);

    let verdict = decide(
        &policy,
        &update(mallory(), host(&[], true), host(&[(KEYED, "hard")], false)),
    );
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert!(
        verdict
            .message
            .contains("may not add reboot.metal3.io/maint, set spec.online to false on"),
        "{}",
        verdict.message
    );
    assert!(
        verdict.message.ends_with(
            "; invalid reboot annotation values too: reboot.metal3.io/maint: value is not JSON"
        ),
        "{}",
        verdict.message
    );
}

#[test]
fn without_an_allow_list_anyone_may() {
    let verdict = decide(
        &Policy::validate_only(),
        &update(
            mallory(),
            host(&[(SUFFIXLESS, "")], true),
            host(&[(KEYED, HARD)], false),
        ),
    );
    assert_eq!(verdict.outcome, Outcome::Allowed);
    assert_eq!(
        verdict.changes,
        [
            PowerChange::AddAnnotation(KEYED.to_string()),
            PowerChange::RemoveAnnotation(SUFFIXLESS.to_string()),
            PowerChange::SetOffline
        ]
    );
}

// ---- what is not looked at, and broken reviews ----------------------------------------------

#[test]
fn only_host_creates_and_updates_are_checked() {
    let policy = allow_list();
    let bad = host(&[(KEYED, "garbage")], false);
    let mut delete = request(Operation::Delete, mallory(), Some(bad.clone()), None);
    assert_eq!(decide(&policy, &delete).outcome, Outcome::NotChecked);
    delete.operation = Operation::Connect;
    assert_eq!(decide(&policy, &delete).outcome, Outcome::NotChecked);

    let mut status = update(mallory(), host(&[], true), bad.clone());
    status.sub_resource = Some("status".to_string());
    assert_eq!(decide(&policy, &status).outcome, Outcome::NotChecked);

    let mut pod = create(mallory(), bad);
    pod.resource = GroupVersionResource {
        group: String::new(),
        version: "v1".to_string(),
        resource: "pods".to_string(),
    };
    let verdict = decide(&policy, &pod);
    assert_eq!(verdict.outcome, Outcome::NotChecked);
    assert!(verdict.response("u").allowed);
    assert!(verdict.response("u").status.is_none());
}

#[test]
fn reviews_missing_their_objects_are_refused() {
    let policy = Policy::validate_only();
    let verdict = decide(&policy, &request(Operation::Create, mallory(), None, None));
    assert_eq!(verdict.outcome, Outcome::Malformed);
    assert_eq!(
        verdict.message,
        "the CREATE review of BareMetalHost metal3/worker-1 carries no object"
    );
    let verdict = decide(
        &policy,
        &request(Operation::Update, mallory(), None, Some(host(&[], true))),
    );
    assert_eq!(verdict.outcome, Outcome::Malformed);
    assert!(verdict.message.contains("carries no oldObject"));
}

#[test]
fn objects_without_annotations_or_spec_do_not_break_anything() {
    let policy = allow_list();
    let bare = json!({"metadata": {"name": "x"}});
    let verdict = decide(&policy, &update(mallory(), bare.clone(), bare.clone()));
    assert_eq!(verdict.outcome, Outcome::Allowed);
    let verdict = decide(&policy, &update(mallory(), json!(null), json!([1, 2])));
    assert_eq!(
        verdict.outcome,
        Outcome::Allowed,
        "nothing to read is no change"
    );
}

// ---- properties -----------------------------------------------------------------------------

fn annotations() -> impl Strategy<Value = Vec<(String, String)>> {
    let key = prop::sample::select(vec![
        SUFFIXLESS,
        KEYED,
        "reboot.metal3.io/other",
        "example.com/a",
    ]);
    let value = prop::sample::select(vec![
        "",
        HARD,
        r#"{"mode":"soft"}"#,
        "garbage",
        r#"{"mode":"HARD"}"#,
    ]);
    prop::collection::vec(
        (key.prop_map(String::from), value.prop_map(String::from)),
        0..4,
    )
}

fn object(annotations: &[(String, String)], online: bool) -> Value {
    let pairs: Vec<(&str, &str)> = annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    host(&pairs, online)
}

proptest! {
    /// The allow-list never changes what a listed identity may do, and refuses an unlisted
    /// one exactly when the edit requests a power change.
    #[test]
    fn the_allow_list_only_restricts_power_requests(
        old in annotations(), new in annotations(), was_online: bool, online: bool,
    ) {
        let old = object(&old, was_online);
        let new = object(&new, online);
        let open = decide(&Policy::validate_only(), &update(user("alice", &[]), old.clone(), new.clone()));
        let listed = decide(&allow_list(), &update(user("alice", &[]), old.clone(), new.clone()));
        prop_assert_eq!(&open, &listed);
        let unlisted = decide(&allow_list(), &update(mallory(), old.clone(), new.clone()));
        let requests_power = !power_changes(Some(&old), &new).is_empty();
        prop_assert_eq!(unlisted.outcome == Outcome::Unauthorized, requests_power);
        if !requests_power {
            prop_assert_eq!(&unlisted, &open);
        }
    }

    /// Nothing the API server could send makes the decision panic.
    #[test]
    fn any_json_is_decided(old in any::<Option<String>>(), new in any::<String>()) {
        let as_object = |text: String| json!({"metadata": {"annotations": {KEYED: text}}, "spec": {"online": "yes"}});
        let request = update(mallory(), old.map(as_object).unwrap_or(Value::Null), as_object(new));
        let _ = decide(&allow_list(), &request);
        let _ = decide(&Policy::validate_only(), &request);
    }
}

// ---- who: the host's BMC and metal3's paused / detached ---------------------------------

const PAUSED: &str = "baremetalhost.metal3.io/paused";
const DETACHED: &str = "baremetalhost.metal3.io/detached";
/// Who may, in a denial: the flags, never the identities (issue 25 changed this from the
/// identities themselves; the webhook's log names them).
const LISTED: &str = "identities on the webhook's allow-list (--allow-user, --allow-group, \
     --allow-service-account; the webhook's log names them)";
const CONTROL: &str = "changing spec.bmc and adding, removing or changing the \
     baremetalhost.metal3.io/paused and baremetalhost.metal3.io/detached annotations";

/// `host` with `spec.bmc` replaced.
fn with_bmc(annotations: &[(&str, &str)], bmc: Value) -> Value {
    let mut object = host(annotations, true);
    object["spec"]["bmc"] = bmc;
    object
}

fn full_bmc() -> Value {
    json!({
        "address": "redfish://10.0.0.1/redfish/v1/Systems/1",
        "credentialsName": "worker-1-bmc",
        "disableCertificateVerification": false,
    })
}

fn listed_identities() -> Vec<UserInfo> {
    vec![
        user("alice", &["system:authenticated"]),
        user("bob", &["system:authenticated", "power-admins"]),
        user(
            "system:serviceaccount:tenant:rebooter",
            &["system:serviceaccounts"],
        ),
        operator_user(),
    ]
}

#[test]
fn unlisted_users_may_not_change_a_hosts_bmc() {
    let policy = allow_list();
    let mut other_address = full_bmc();
    other_address["address"] = json!("redfish://10.9.9.9/redfish/v1/Systems/1");
    let mut other_secret = full_bmc();
    other_secret["credentialsName"] = json!("stolen-bmc");
    let mut insecure = full_bmc();
    insecure["disableCertificateVerification"] = json!(true);
    let mut no_secret = full_bmc();
    no_secret.as_object_mut().unwrap().remove("credentialsName");
    let cases = [
        ("address", other_address, "change spec.bmc.address"),
        (
            "credentials",
            other_secret,
            "change spec.bmc.credentialsName",
        ),
        (
            "certificate checks off",
            insecure,
            "change spec.bmc.disableCertificateVerification",
        ),
        (
            "credentials removed",
            no_secret,
            "change spec.bmc.credentialsName",
        ),
        (
            "bmc removed",
            Value::Null,
            "change spec.bmc.address, change spec.bmc.credentialsName",
        ),
    ];
    for (case, bmc, what) in cases {
        let old = with_bmc(&[], full_bmc());
        let new = with_bmc(&[], bmc);
        let verdict = decide(&policy, &update(mallory(), old.clone(), new.clone()));
        assert_eq!(
            verdict.outcome,
            Outcome::Unauthorized,
            "{case}: {verdict:?}"
        );
        assert_eq!(
            verdict.message,
            format!(
                "user \"mallory\" may not {what} on BareMetalHost metal3/worker-1: {CONTROL} are \
                 allowed only to {LISTED}"
            ),
            "{case}"
        );
        assert_eq!(verdict.response("u").status.unwrap().code, 403);
        for who in listed_identities() {
            let verdict = decide(&policy, &update(who.clone(), old.clone(), new.clone()));
            assert_eq!(
                verdict.outcome,
                Outcome::Allowed,
                "{case}: {}",
                who.username
            );
            assert!(!verdict.changes.is_empty(), "{case}: logged as a change");
        }
        let open = decide(&Policy::validate_only(), &update(mallory(), old, new));
        assert_eq!(open.outcome, Outcome::Allowed, "{case}: no allow-list");
    }
}

#[test]
fn writing_out_a_bmc_fields_zero_value_is_no_change() {
    let policy = allow_list();
    let mut implicit = full_bmc();
    implicit
        .as_object_mut()
        .unwrap()
        .remove("disableCertificateVerification");
    for (old, new) in [
        (implicit.clone(), full_bmc()),
        (full_bmc(), implicit.clone()),
        (
            json!({"address": "ipmi://10.0.0.1", "credentialsName": null}),
            json!({"address": "ipmi://10.0.0.1", "credentialsName": ""}),
        ),
    ] {
        let verdict = decide(
            &policy,
            &update(mallory(), with_bmc(&[], old), with_bmc(&[], new)),
        );
        assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
        assert!(verdict.changes.is_empty());
    }
    // Other spec fields stay RBAC's business.
    let mut relabelled = with_bmc(&[], full_bmc());
    relabelled["spec"]["bootMACAddress"] = json!("52:54:00:00:00:01");
    relabelled["spec"]["bmc"]["unknownField"] = json!("x");
    let verdict = decide(
        &policy,
        &update(mallory(), with_bmc(&[], full_bmc()), relabelled),
    );
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
}

#[test]
fn unlisted_users_may_not_pause_or_detach_a_host() {
    let policy = allow_list();
    for key in [PAUSED, DETACHED] {
        let cases = [
            ("add", host(&[], true), host(&[(key, "")], true), "add"),
            (
                "remove",
                host(&[(key, "")], true),
                host(&[], true),
                "remove",
            ),
            (
                "change",
                host(&[(key, "")], true),
                host(&[(key, "by-mallory")], true),
                "change",
            ),
        ];
        for (case, old, new, verb) in cases {
            let verdict = decide(&policy, &update(mallory(), old.clone(), new.clone()));
            assert_eq!(
                verdict.outcome,
                Outcome::Unauthorized,
                "{key} {case}: {verdict:?}"
            );
            assert_eq!(
                verdict.message,
                format!(
                    "user \"mallory\" may not {verb} {key} on BareMetalHost metal3/worker-1: \
                     {CONTROL} are allowed only to {LISTED}"
                )
            );
            for who in listed_identities() {
                let verdict = decide(&policy, &update(who.clone(), old.clone(), new.clone()));
                assert_eq!(verdict.outcome, Outcome::Allowed, "{key} {case}");
            }
            let open = decide(&Policy::validate_only(), &update(mallory(), old, new));
            assert_eq!(
                open.outcome,
                Outcome::Allowed,
                "{key} {case}: no allow-list"
            );
            assert!(open.warnings.is_empty());
        }
        // Created paused or detached: adding it.
        let created = decide(&policy, &create(mallory(), host(&[(key, "")], true)));
        assert_eq!(created.outcome, Outcome::Unauthorized);
        assert!(
            created.message.contains(&format!("may not add {key} on")),
            "{}",
            created.message
        );
        // Other edits of a paused host are not restricted, nor are its values checked.
        let paused = host(&[(key, "anything")], true);
        let mut labelled = paused.clone();
        labelled["metadata"]["labels"] = json!({"rack": "r1"});
        let verdict = decide(&policy, &update(mallory(), paused, labelled));
        assert_eq!(verdict.outcome, Outcome::Allowed);
    }
    // Look-alike keys are not metal3's.
    for key in [
        "baremetalhost.metal3.io/pausedx",
        "example.com/paused",
        "baremetalhost.metal3.io/status",
    ] {
        let verdict = decide(
            &policy,
            &update(mallory(), host(&[], true), host(&[(key, "")], true)),
        );
        assert_eq!(verdict.outcome, Outcome::Allowed, "{key}");
    }
}

#[test]
fn a_refusal_of_power_and_control_changes_names_both() {
    let policy = allow_list();
    let mut new = with_bmc(&[(KEYED, ""), (PAUSED, "")], full_bmc());
    new["spec"]["bmc"]["address"] = json!("ipmi://10.9.9.9");
    let verdict = decide(&policy, &update(mallory(), with_bmc(&[], full_bmc()), new));
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert_eq!(
        verdict.message,
        format!(
            "user \"mallory\" may not add {KEYED}, add {PAUSED}, change spec.bmc.address on \
             BareMetalHost metal3/worker-1: adding, removing or changing reboot.metal3.io \
             annotations, setting spec.online to false, and {CONTROL} are allowed only to {LISTED}"
        )
    );
    assert_eq!(
        verdict.changes,
        [
            PowerChange::AddAnnotation(KEYED.to_string()),
            PowerChange::AddAnnotation(PAUSED.to_string()),
            PowerChange::ChangeBmc("address"),
        ]
    );
}

#[test]
fn creating_a_host_with_a_bmc_is_restricted_only_when_asked() {
    // By default (compatible with hosts as metal3 users write them): RBAC decides who may
    // create hosts, BMC included.
    let verdict = decide(&allow_list(), &create(mallory(), with_bmc(&[], full_bmc())));
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
    assert!(verdict.changes.is_empty());

    let strict = Policy {
        restrict_bmc_on_create: true,
        ..allow_list()
    };
    let verdict = decide(&strict, &create(mallory(), with_bmc(&[], full_bmc())));
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert_eq!(
        verdict.message,
        format!(
            "user \"mallory\" may not set spec.bmc.address, set spec.bmc.credentialsName on \
             BareMetalHost metal3/worker-1: setting or changing spec.bmc and adding, removing \
             or changing the baremetalhost.metal3.io/paused and \
             baremetalhost.metal3.io/detached annotations are allowed only to {LISTED}"
        )
    );
    let mut insecure = full_bmc();
    insecure["disableCertificateVerification"] = json!(true);
    let verdict = decide(&strict, &create(mallory(), with_bmc(&[], insecure)));
    assert_eq!(
        verdict.changes,
        [
            PowerChange::SetBmc("address"),
            PowerChange::SetBmc("credentialsName"),
            PowerChange::SetBmc("disableCertificateVerification"),
        ]
    );
    // A host without a BMC yet, a listed identity, or no allow-list at all: allowed.
    let verdict = decide(&strict, &create(mallory(), with_bmc(&[], json!({}))));
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
    for who in listed_identities() {
        let verdict = decide(&strict, &create(who, with_bmc(&[], full_bmc())));
        assert_eq!(verdict.outcome, Outcome::Allowed);
    }
    let open = Policy {
        restrict_bmc_on_create: true,
        ..Policy::validate_only()
    };
    let verdict = decide(&open, &create(mallory(), with_bmc(&[], full_bmc())));
    assert_eq!(verdict.outcome, Outcome::Allowed);
    // Updates are restricted either way: the flag is about creates.
    let mut moved = full_bmc();
    moved["address"] = json!("ipmi://10.9.9.9");
    let verdict = decide(
        &allow_list(),
        &update(mallory(), with_bmc(&[], full_bmc()), with_bmc(&[], moved)),
    );
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
}

fn bmc_variant() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        json!(null),
        json!({}),
        full_bmc(),
        json!({"address": "ipmi://10.9.9.9", "credentialsName": "worker-1-bmc"}),
        json!({"address": "redfish://10.0.0.1/redfish/v1/Systems/1", "credentialsName": "other",
               "disableCertificateVerification": true}),
    ])
}

fn any_annotations() -> impl Strategy<Value = Vec<(String, String)>> {
    let key = prop::sample::select(vec![SUFFIXLESS, KEYED, PAUSED, DETACHED, "example.com/a"]);
    let value = prop::sample::select(vec!["", HARD, "x"]);
    prop::collection::vec(
        (key.prop_map(String::from), value.prop_map(String::from)),
        0..4,
    )
}

fn full_object(annotations: &[(String, String)], online: bool, bmc: Value) -> Value {
    let mut object = object(annotations, online);
    object["spec"]["bmc"] = bmc;
    object
}

proptest! {
    /// With the BMC and metal3's annotations in play too, an unlisted identity is refused
    /// exactly when the edit makes a restricted change, and a listed one decides as if there
    /// were no allow-list.
    #[test]
    fn the_allow_list_restricts_exactly_the_restricted_changes(
        old in any_annotations(), new in any_annotations(), was_online: bool, online: bool,
        old_bmc in bmc_variant(), new_bmc in bmc_variant(),
    ) {
        let old = full_object(&old, was_online, old_bmc);
        let new = full_object(&new, online, new_bmc);
        let open = decide(&Policy::validate_only(), &update(user("alice", &[]), old.clone(), new.clone()));
        let listed = decide(&allow_list(), &update(user("alice", &[]), old.clone(), new.clone()));
        prop_assert_eq!(&open, &listed);
        let unlisted = decide(&allow_list(), &update(mallory(), old.clone(), new.clone()));
        let restricted = !power_changes(Some(&old), &new).is_empty();
        prop_assert_eq!(unlisted.outcome == Outcome::Unauthorized, restricted);
        if !restricted {
            prop_assert_eq!(&unlisted, &open);
        }
    }
}

// ---- who: the host's consumer -----------------------------------------------------------

const CONSUMER: &str = "adding, changing or removing spec.consumerRef";

/// `host` with `spec.consumerRef` set (`Value::Null`: none).
fn with_consumer(consumer: Value) -> Value {
    let mut object = host(&[], true);
    if !consumer.is_null() {
        object["spec"]["consumerRef"] = consumer;
    }
    object
}

/// CAPM3's consumer: the Metal3Machine of the host's namespace.
fn metal3_machine() -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "Metal3Machine",
        "namespace": "metal3",
        "name": "worker-1-m3m",
    })
}

/// `metal3_machine()` with one field replaced (`Value::Null`: removed).
fn metal3_machine_with(field: &str, value: Value) -> Value {
    let mut consumer = metal3_machine();
    match value {
        Value::Null => {
            consumer.as_object_mut().unwrap().remove(field);
        }
        value => consumer[field] = value,
    }
    consumer
}

/// Which Machine a host belongs to decides which node's remediation fences it: with an
/// allow-list, only listed identities add, change or remove `spec.consumerRef`.
#[test]
fn unlisted_users_may_not_add_change_or_remove_a_hosts_consumer_ref() {
    let policy = allow_list();
    let cases = [
        (
            "added",
            Value::Null,
            metal3_machine(),
            "add spec.consumerRef",
        ),
        (
            "removed (absent)",
            metal3_machine(),
            Value::Null,
            "remove spec.consumerRef",
        ),
        (
            "another name",
            metal3_machine(),
            metal3_machine_with("name", json!("worker-9-m3m")),
            "change spec.consumerRef.name",
        ),
        (
            "another namespace",
            metal3_machine(),
            metal3_machine_with("namespace", json!("tenant-b")),
            "change spec.consumerRef.namespace",
        ),
        (
            "another kind and API version",
            metal3_machine(),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                   "namespace": "metal3", "name": "worker-1-m3m"}),
            "change spec.consumerRef.apiVersion, change spec.consumerRef.kind",
        ),
        (
            "the namespace dropped",
            metal3_machine(),
            metal3_machine_with("namespace", Value::Null),
            "change spec.consumerRef.namespace",
        ),
    ];
    for (case, before, after, what) in cases {
        let old = with_consumer(before);
        let new = with_consumer(after);
        let verdict = decide(&policy, &update(mallory(), old.clone(), new.clone()));
        assert_eq!(
            verdict.outcome,
            Outcome::Unauthorized,
            "{case}: {verdict:?}"
        );
        assert_eq!(
            verdict.message,
            format!(
                "user \"mallory\" may not {what} on BareMetalHost metal3/worker-1: {CONSUMER} \
                 are allowed only to {LISTED}"
            ),
            "{case}"
        );
        assert_eq!(verdict.response("u").status.unwrap().code, 403);
        assert!(
            verdict.changes.iter().all(|c| !c.is_power_request()),
            "{case}: not a power request"
        );
        for who in listed_identities() {
            let verdict = decide(&policy, &update(who.clone(), old.clone(), new.clone()));
            assert_eq!(
                verdict.outcome,
                Outcome::Allowed,
                "{case}: {}",
                who.username
            );
            assert!(!verdict.changes.is_empty(), "{case}: logged as a change");
        }
        let open = decide(&Policy::validate_only(), &update(mallory(), old, new));
        assert_eq!(open.outcome, Outcome::Allowed, "{case}: no allow-list");
    }
    // Removed by writing null: the same as absent.
    let mut nulled = with_consumer(Value::Null);
    nulled["spec"]["consumerRef"] = Value::Null;
    let verdict = decide(
        &policy,
        &update(mallory(), with_consumer(metal3_machine()), nulled),
    );
    assert_eq!(verdict.changes, [PowerChange::RemoveConsumerRef]);
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
}

#[test]
fn an_unchanged_consumer_ref_is_no_change() {
    let policy = allow_list();
    let mut relabelled = with_consumer(metal3_machine());
    relabelled["metadata"]["labels"] = json!({"rack": "r1"});
    // Fields the binding does not read, and a field's zero value written out, change nothing.
    relabelled["spec"]["consumerRef"]["uid"] = json!("6a5e");
    relabelled["spec"]["consumerRef"]["resourceVersion"] = json!("42");
    let mut zero = metal3_machine();
    zero["fieldPath"] = Value::Null;
    for (old, new) in [
        (with_consumer(metal3_machine()), relabelled),
        (with_consumer(Value::Null), with_consumer(Value::Null)),
        (
            with_consumer(metal3_machine_with("namespace", Value::Null)),
            with_consumer(metal3_machine_with("namespace", json!(""))),
        ),
        (with_consumer(metal3_machine()), with_consumer(zero)),
    ] {
        for who in [mallory(), user("alice", &[])] {
            let verdict = decide(&policy, &update(who, old.clone(), new.clone()));
            assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
            assert!(verdict.changes.is_empty(), "{verdict:?}");
        }
    }
}

#[test]
fn a_refusal_of_bmc_and_consumer_changes_names_both() {
    let policy = allow_list();
    let mut old = with_consumer(metal3_machine());
    old["spec"]["bmc"] = full_bmc();
    let mut new = with_consumer(metal3_machine_with("name", json!("other-m3m")));
    new["spec"]["bmc"] = full_bmc();
    new["spec"]["bmc"]["address"] = json!("ipmi://10.9.9.9");
    new["metadata"]["annotations"] = json!({KEYED: ""});
    let verdict = decide(&policy, &update(mallory(), old, new));
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert_eq!(
        verdict.message,
        format!(
            "user \"mallory\" may not add {KEYED}, change spec.bmc.address, change \
             spec.consumerRef.name on BareMetalHost metal3/worker-1: adding, removing or \
             changing reboot.metal3.io annotations, setting spec.online to false, {CONTROL}, \
             and {CONSUMER} are allowed only to {LISTED}"
        )
    );
    // Control and consumer alone.
    let mut old = with_consumer(Value::Null);
    old["spec"]["bmc"] = full_bmc();
    let mut new = with_consumer(metal3_machine());
    new["spec"]["bmc"] = full_bmc();
    new["metadata"]["annotations"] = json!({PAUSED: ""});
    let verdict = decide(&policy, &update(mallory(), old, new));
    assert_eq!(
        verdict.message,
        format!(
            "user \"mallory\" may not add {PAUSED}, add spec.consumerRef on BareMetalHost \
             metal3/worker-1: {CONTROL}, and {CONSUMER} are allowed only to {LISTED}"
        )
    );
}

#[test]
fn creating_a_host_with_a_consumer_ref_is_restricted_only_when_asked() {
    // By default (`clusterctl move`, installers): RBAC decides who may create hosts.
    let consumed = with_consumer(metal3_machine());
    let verdict = decide(&allow_list(), &create(mallory(), consumed.clone()));
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
    assert!(verdict.changes.is_empty());

    let strict = Policy {
        restrict_consumer_ref_on_create: true,
        ..allow_list()
    };
    let verdict = decide(&strict, &create(mallory(), consumed.clone()));
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
    assert_eq!(verdict.changes, [PowerChange::SetConsumerRef]);
    assert_eq!(
        verdict.message,
        format!(
            "user \"mallory\" may not set spec.consumerRef on BareMetalHost metal3/worker-1: \
             setting, changing or removing spec.consumerRef are allowed only to {LISTED}"
        )
    );
    // The BMC flag does not restrict consumers, nor this one BMCs.
    let bmc_only = Policy {
        restrict_bmc_on_create: true,
        ..allow_list()
    };
    let mut no_bmc = consumed.clone();
    no_bmc["spec"]["bmc"] = json!({});
    assert_eq!(
        decide(&bmc_only, &create(mallory(), no_bmc)).outcome,
        Outcome::Allowed
    );
    let mut bmc_no_consumer = with_consumer(Value::Null);
    bmc_no_consumer["spec"]["bmc"] = full_bmc();
    assert_eq!(
        decide(&strict, &create(mallory(), bmc_no_consumer)).outcome,
        Outcome::Allowed
    );
    // A host created without a consumer, a listed identity, or no allow-list: allowed.
    let verdict = decide(&strict, &create(mallory(), with_consumer(Value::Null)));
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
    for who in listed_identities() {
        let verdict = decide(&strict, &create(who, consumed.clone()));
        assert_eq!(verdict.outcome, Outcome::Allowed);
    }
    let open = Policy {
        restrict_consumer_ref_on_create: true,
        ..Policy::validate_only()
    };
    assert_eq!(
        decide(&open, &create(mallory(), consumed)).outcome,
        Outcome::Allowed
    );
    // Updates are restricted either way: the flag is about creates.
    let verdict = decide(
        &allow_list(),
        &update(
            mallory(),
            with_consumer(Value::Null),
            with_consumer(metal3_machine()),
        ),
    );
    assert_eq!(verdict.outcome, Outcome::Unauthorized);
}

fn consumer_variant() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        Value::Null,
        json!({}),
        metal3_machine(),
        metal3_machine_with("name", json!("other")),
        metal3_machine_with("namespace", Value::Null),
        json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
               "namespace": "metal3", "name": "worker-1-m3m"}),
    ])
}

proptest! {
    /// With consumers in play too, an unlisted identity is refused exactly when the edit makes
    /// a restricted change, and a listed one decides as if there were no allow-list.
    #[test]
    fn the_allow_list_restricts_exactly_the_restricted_changes_consumers_included(
        old in any_annotations(), new in any_annotations(), was_online: bool, online: bool,
        old_consumer in consumer_variant(), new_consumer in consumer_variant(),
    ) {
        let with = |annotations: &[(String, String)], online: bool, consumer: Value| {
            let mut object = object(annotations, online);
            if !consumer.is_null() {
                object["spec"]["consumerRef"] = consumer;
            }
            object
        };
        let old = with(&old, was_online, old_consumer);
        let new = with(&new, online, new_consumer);
        let open = decide(&Policy::validate_only(), &update(user("alice", &[]), old.clone(), new.clone()));
        let listed = decide(&allow_list(), &update(user("alice", &[]), old.clone(), new.clone()));
        prop_assert_eq!(&open, &listed);
        let unlisted = decide(&allow_list(), &update(mallory(), old.clone(), new.clone()));
        let restricted = !power_changes(Some(&old), &new).is_empty();
        prop_assert_eq!(unlisted.outcome == Outcome::Unauthorized, restricted);
        if !restricted {
            prop_assert_eq!(&unlisted, &open);
        }
    }
}

// ---- what a denial tells its reader -------------------------------------------------------

/// Issue 25, point 7: a denial reaches whoever made the refused change — any host editor — so
/// it names the refused change, the host and the flags to change, never who is allowed
/// (the webhook's log does).
#[test]
fn a_denial_names_no_allowed_identity() {
    let mut policy = allow_list();
    policy.restrict_bmc_on_create = true;
    policy.restrict_consumer_ref_on_create = true;
    let mut consumed = with_bmc(&[(KEYED, HARD)], full_bmc());
    consumed["spec"]["online"] = json!(false);
    consumed["spec"]["consumerRef"] = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "Metal3Machine", "namespace": "metal3", "name": "m-1",
    });
    let mut paused = host(&[(PAUSED, "")], true);
    paused["spec"]["bmc"] = json!({"address": "redfish://10.9.9.9/redfish/v1/Systems/1"});
    let requests = [
        (
            "power request",
            update(mallory(), host(&[], true), host(&[(KEYED, HARD)], true)),
        ),
        (
            "online false",
            update(mallory(), host(&[], true), host(&[], false)),
        ),
        ("bmc and paused", update(mallory(), host(&[], true), paused)),
        (
            "everything",
            update(mallory(), host(&[], true), consumed.clone()),
        ),
        ("create", create(mallory(), consumed)),
        (
            "invalid value too",
            update(
                mallory(),
                host(&[], true),
                host(&[(KEYED, "{not json")], true),
            ),
        ),
    ];
    let identities = [
        "alice",
        "power-admins",
        "tenant:rebooter",
        "rebooter",
        "hostcycle-system:hostcycle-operator",
        "hostcycle-operator",
    ];
    for (case, request) in requests {
        let verdict = decide(&policy, &request);
        assert_eq!(
            verdict.outcome,
            Outcome::Unauthorized,
            "{case}: {verdict:?}"
        );
        let message = &verdict.message;
        for identity in identities {
            assert!(
                !message.contains(identity),
                "{case}: the denial names the allowed identity {identity:?}: {message}"
            );
        }
        assert!(
            message.starts_with("user \"mallory\" may not ")
                && message.contains("on BareMetalHost metal3/worker-1"),
            "{case}: the denial names the user, the change and the host: {message}"
        );
        assert!(
            message.contains("--allow-user, --allow-group, --allow-service-account"),
            "{case}: the denial names the flags that grant the change: {message}"
        );
        assert!(message.contains("the webhook's log"), "{case}: {message}");
    }
}
