//! End-to-end: remediation's contracts with the other remediators and checkers in the field
//! (docs/remediation.md, "Running on OpenShift", "Giving up and escalation"), on a real control
//! plane with the real operator:
//! - one remediator per trigger: a Machine of OpenShift's bare-metal provider (CAPBM) and a
//!   Machine whose flow CAPBM already runs are never touched; `--remediation-triggers=requests`
//!   ignores the Machine annotation; the power-on timeout is the MachineHealthCheck's
//!   `nodeStartupTimeout`;
//! - a Cluster API remediation that gives up marks its host `capm3.metal3.io/unhealthy` and
//!   updates the Machine's conditions; the host controller ignores the mark;
//! - a NodeHealthCheck request never deletes the OpenShift Machine NodeHealthCheck names as an
//!   owner, and leaves the conditions NodeHealthCheck escalates on; a request created with
//!   `generateName` finds its Node through `remediation.medik8s.io/node-name`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::NS;
use common::queue::worker;
use common::remediation::*;
use hostcycle_api::remediation::{
    CAPM3_UNHEALTHY_ANNOTATION, HostRemediationTemplate, NHC_MULTIPLE_TEMPLATES_ANNOTATION,
    NHC_NODE_NAME_ANNOTATION, NODE_ANNOTATIONS_BACKUP_ANNOTATION, NODE_LABELS_BACKUP_ANNOTATION,
    POWER_ON_TIMEOUT_ANNOTATION, POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION, RemediationPhase, RemediationStep,
    is_remediation_power_off,
};
use hostcycle_testkit::machines::OPENSHIFT_MACHINE_ROLE_LABEL;
use hostcycle_testkit::{MachineKind, create_machine_object, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

/// hostcycle's own Machine annotations: none may appear on a Machine it must not touch.
fn own_markers(m: &DynamicObject) -> Vec<String> {
    m.annotations()
        .keys()
        .filter(|k| k.starts_with("remediation.hostcycle.io/"))
        .cloned()
        .collect()
}

/// Remediation's power-off annotations on a host.
async fn power_offs(lab: &RemediationLab, host: &str) -> Vec<String> {
    lab.lab
        .get(host)
        .await
        .annotations()
        .keys()
        .filter(|k| is_remediation_power_off(k))
        .cloned()
        .collect()
}

/// Neither the Machine nor its host nor its Node was touched: no hostcycle marker, no
/// power-off, the same Node, no RemediationStarted.
async fn assert_untouched(lab: &RemediationLab, m: &MachineRef, host: &str, node_uid: &str) {
    let machine = lab.machine(m).await;
    assert!(
        own_markers(&machine).is_empty(),
        "{m}: {:?}",
        machine.annotations()
    );
    assert!(
        power_offs(lab, host).await.is_empty(),
        "{m}: host {host} was asked to power off"
    );
    assert_eq!(
        lab.node(host).await.uid().unwrap(),
        node_uid,
        "{m}: Node {host} kept"
    );
    let events = lab.events_for("Machine", &m.name).await;
    assert!(
        !events.iter().any(|(_, r, _)| r == "RemediationStarted"),
        "{m}: {events:?}"
    );
}

fn mhc_api(lab: &RemediationLab) -> Api<DynamicObject> {
    Api::namespaced_with(
        lab.client.clone(),
        NS,
        &ApiResource {
            group: "machine.openshift.io".into(),
            version: "v1beta1".into(),
            api_version: "machine.openshift.io/v1beta1".into(),
            kind: "MachineHealthCheck".into(),
            plural: "machinehealthchecks".into(),
        },
    )
}

fn template_api(lab: &RemediationLab) -> Api<DynamicObject> {
    Api::namespaced_with(
        lab.client.clone(),
        NS,
        &ApiResource::erase::<HostRemediationTemplate>(&()),
    )
}

/// A HostRemediationTemplate with NodeHealthCheck's `multiple-templates-support` annotation.
async fn template(lab: &RemediationLab, name: &str, retry_limit: u32, timeout: u64) {
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediationTemplate",
        "metadata": { "name": name, "namespace": NS,
            "annotations": { NHC_MULTIPLE_TEMPLATES_ANNOTATION: "true" } },
        "spec": { "template": { "spec": { "strategy": {
            "type": "Reboot", "retryLimit": retry_limit, "timeoutSeconds": timeout } } } },
    }))
    .unwrap();
    template_api(lab)
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
}

/// What NodeHealthCheck creates for `node` from a template with multiple-templates support:
/// `generateName: <node>-`, the node-name and template-name annotations, its label, the
/// template's spec, and `owners`.
async fn nhc_request(
    lab: &RemediationLab,
    template: &str,
    node: &str,
    generate_name: bool,
    owners: Value,
) -> String {
    let tpl = template_api(lab).get(template).await.unwrap();
    let mut metadata = json!({
        "namespace": NS,
        "labels": { "app.kubernetes.io/part-of": "node-healthcheck-controller" },
        "annotations": {
            NHC_NODE_NAME_ANNOTATION: node,
            "remediation.medik8s.io/template-name": template,
        },
        "ownerReferences": owners,
    });
    if generate_name {
        metadata["generateName"] = json!(format!("{node}-"));
    } else {
        metadata["name"] = json!(node);
    }
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediation",
        "metadata": metadata,
        "spec": tpl.data["spec"]["template"]["spec"].clone(),
    }))
    .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(
        lab.client.clone(),
        NS,
        &ApiResource::erase::<hostcycle_api::remediation::HostRemediation>(&()),
    );
    api.create(&PostParams::default(), &body)
        .await
        .unwrap()
        .name_any()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_openshift_capbm_machines_are_left_to_capbm_and_the_mhc_node_startup_timeout_counts() {
    let lab = RemediationLab::start(
        &[worker("o-capbm"), worker("o-held"), worker("o-mhc")],
        &["--max-concurrent-remediations", "3"],
    )
    .await;
    let capbm_uid = lab.node("o-capbm").await.uid().unwrap();
    let held_uid = lab.node("o-held").await.uid().unwrap();

    // (a) A Machine of CAPBM's provider: CAPBM runs the same flow on it.
    let mut m = hostcycle_testkit::machine(
        MachineKind::OpenShift,
        NS,
        "o-capbm",
        Some((NS, "o-capbm")),
        Some("o-capbm"),
        &[],
    );
    m.data["spec"] = json!({ "providerSpec": { "value": {
        "apiVersion": "baremetal.cluster.k8s.io/v1alpha1",
        "kind": "BareMetalMachineProviderSpec",
    } } });
    create_machine_object(&lab.client, MachineKind::OpenShift, &m)
        .await
        .unwrap();
    let capbm = MachineRef {
        kind: MachineKind::OpenShift,
        namespace: NS.into(),
        name: "o-capbm".into(),
    };
    // (b) A Machine whose flow another remediator runs: metal3's markers, no hostcycle record.
    let held = lab
        .create_machine(
            MachineKind::OpenShift,
            NS,
            "o-held",
            "o-held",
            "o-held",
            &[],
        )
        .await;
    lab.patch_machine_annotations(
        &held,
        json!({
            POWERED_OFF_FOR_REMEDIATION_ANNOTATION: "",
            NODE_LABELS_BACKUP_ANNOTATION: "{}",
            NODE_ANNOTATIONS_BACKUP_ANNOTATION: "{}",
        }),
    )
    .await;
    // (c) A worker Machine selected by a MachineHealthCheck with nodeStartupTimeout 7m (the
    // flag's default is 20m).
    let mhc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "machine.openshift.io/v1beta1",
        "kind": "MachineHealthCheck",
        "metadata": { "name": "workers", "namespace": NS,
            "annotations": { "machine.openshift.io/remediation-strategy": "external-baremetal" } },
        "spec": {
            "selector": { "matchLabels": { OPENSHIFT_MACHINE_ROLE_LABEL: "worker" } },
            "nodeStartupTimeout": "7m",
            "unhealthyConditions": [{ "type": "Ready", "status": "False", "timeout": "300s" }],
        },
    }))
    .unwrap();
    mhc_api(&lab)
        .create(&PostParams::default(), &mhc)
        .await
        .unwrap();
    let selected = lab
        .create_machine(
            MachineKind::OpenShift,
            NS,
            "o-mhc",
            "o-mhc",
            "o-mhc",
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
        )
        .await;

    for m in [&capbm, &held, &selected] {
        lab.mark(m).await;
    }

    // (c) The deadline recorded at the power-on is 7 minutes after the Node's release.
    let m = lab
        .wait_machine(
            &selected,
            "the power-on deadline recorded",
            CYCLE_TIMEOUT,
            |o| o.annotations().contains_key(POWER_ON_TIMEOUT_ANNOTATION),
        )
        .await;
    let at = |key: &str| -> Timestamp { m.annotations()[key].parse().unwrap() };
    let waited = at(POWER_ON_TIMEOUT_ANNOTATION)
        .duration_since(at(REMEDIATION_NODE_RELEASED_AT_ANNOTATION))
        .as_secs();
    assert!(
        (415..=440).contains(&waited),
        "the power-on timeout is the MachineHealthCheck's 7m, not the flag's 20m: {waited}s ({:?})",
        m.annotations()
    );

    // (a), (b): a Warning each, and nothing done.
    for (m, host, node_uid, says) in [
        (
            &capbm,
            "o-capbm",
            &capbm_uid,
            "provider is OpenShift's bare-metal machine controller",
        ),
        (
            &held,
            "o-held",
            &held_uid,
            "remediation.metal3.io/powered-off-for-remediation",
        ),
    ] {
        let events = lab
            .wait_event_reasons("Machine", &m.name, &["RemediationHeldElsewhere"])
            .await;
        assert!(
            events.iter().any(|(t, r, note)| t == "Warning"
                && r == "RemediationHeldElsewhere"
                && note.contains(says)),
            "{m}: {events:?}"
        );
        assert_untouched(&lab, m, host, node_uid).await;
    }
    // CAPBM's markers are left as CAPBM wrote them.
    let after = lab.machine_annotations(&held).await;
    assert!(
        after.contains_key(POWERED_OFF_FOR_REMEDIATION_ANNOTATION)
            && after.contains_key(NODE_LABELS_BACKUP_ANNOTATION),
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_only_ignores_the_machine_annotation_and_a_generate_name_request_finds_its_node() {
    let lab = RemediationLab::start(
        &[worker("r-mark"), worker("r-nhc")],
        &["--remediation-triggers", "requests"],
    )
    .await;
    let mark_uid = lab.node("r-mark").await.uid().unwrap();
    let marked = lab
        .create_machine(
            MachineKind::OpenShift,
            NS,
            "r-mark",
            "r-mark",
            "r-mark",
            &[],
        )
        .await;
    lab.mark(&marked).await;

    // NodeHealthCheck, template with multiple-templates support: generateName, so the name
    // says nothing; the node-name annotation names the Node.
    template(&lab, "reboot-a", 0, 120).await;
    let name = nhc_request(&lab, "reboot-a", "r-nhc", true, json!([])).await;
    assert!(name.starts_with("r-nhc-") && name != "r-nhc-", "{name}");
    let done = lab
        .wait_request(NS, &name, "Succeeded", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Succeeded)
        })
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!(
        (status.node.as_deref(), status.host.as_deref()),
        (Some("r-nhc"), Some(format!("{NS}/r-nhc").as_str())),
        "the Node comes from remediation.medik8s.io/node-name, not the request's name"
    );
    assert_eq!(condition_status(&done, "Succeeded"), "True");

    // Meanwhile the marked Machine was never taken (the annotation trigger is off).
    assert_untouched(&lab, &marked, "r-mark", &mark_uid).await;
    assert!(
        lab.machine_annotations(&marked)
            .await
            .contains_key(hostcycle_api::remediation::EXTERNAL_REMEDIATION_ANNOTATION),
        "the trigger is left for whoever handles it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn giving_up_marks_the_host_for_capm3_and_leaves_escalation_to_node_health_check() {
    let lab = RemediationLab::start(
        &[worker("g-capi"), worker("g-nhc")],
        &["--max-concurrent-remediations", "2"],
    )
    .await;

    // A Cluster API Machine whose MachineHealthCheck set ExternallyRemediated when it created
    // the request.
    let capi = lab
        .create_machine(
            MachineKind::ClusterApi,
            NS,
            "g-capi",
            "g-capi",
            "g-capi",
            &[("cluster.x-k8s.io/cluster-name", "e2e")],
        )
        .await;
    lab.machines(MachineKind::ClusterApi, NS)
        .patch_status(
            "g-capi",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "v1beta2": { "conditions": [{
                "type": "ExternallyRemediated", "status": "False",
                "reason": "WaitingForRemediation", "lastTransitionTime": "2025-01-01T00:00:00Z",
            }] } } })),
        )
        .await
        .unwrap();

    // An OpenShift Machine OpenShift would reprovision (a controller owner, a worker, its host
    // provisioned by metal3): NodeHealthCheck names it as an owner of its request.
    let owner = Api::<ConfigMap>::namespaced(lab.client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "machineset-g" } })).unwrap(),
        )
        .await
        .unwrap();
    let mut m = hostcycle_testkit::machine(
        MachineKind::OpenShift,
        NS,
        "g-nhc",
        Some((NS, "g-nhc")),
        Some("g-nhc"),
        &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
    );
    m.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.name_any(),
            uid: owner.uid().unwrap(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    let openshift_machine = create_machine_object(&lab.client, MachineKind::OpenShift, &m)
        .await
        .unwrap();
    lab.lab
        .patch_spec(
            "g-nhc",
            json!({ "externallyProvisioned": false, "consumerRef": {
                "apiVersion": MachineKind::OpenShift.api_version(), "kind": "Machine",
                "name": "g-nhc", "namespace": NS } }),
        )
        .await;
    lab.lab
        .wait_host("g-nhc", "provisioned, on", CYCLE_TIMEOUT, |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.provisioning.state.as_ref())
                .map(|s| s.as_str())
                == Some("provisioned")
                && st.and_then(|s| s.powered_on) == Some(true)
        })
        .await;

    // One power cycle, 15 s for the Node: it never comes back (held off).
    template(&lab, "fail-fast", 0, 15).await;
    let holds = [
        lab.hold_at_request_power_off("g-capi").await,
        lab.hold_at_request_power_off("g-nhc").await,
    ];
    let capi_request = lab
        .create_mhc_request(NS, "fail-fast", &capi, "e2e")
        .await
        .name_any();
    let nhc_name = nhc_request(
        &lab,
        "fail-fast",
        "g-nhc",
        false,
        json!([{
            "apiVersion": MachineKind::OpenShift.api_version(), "kind": "Machine",
            "name": "g-nhc", "uid": openshift_machine.uid().unwrap(), "controller": false,
        }]),
    )
    .await;
    for hold in holds {
        tokio::time::timeout(CYCLE_TIMEOUT, hold)
            .await
            .expect("the request's power-off reaches the host")
            .unwrap();
    }

    // Cluster API: gave up → the host marked as CAPM3 does, the Machine's conditions updated.
    lab.wait_request(NS, &capi_request, "phase Failed", CYCLE_TIMEOUT, |r| {
        r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Failed)
    })
    .await;
    let host = lab
        .lab
        .wait_host("g-capi", "capm3.metal3.io/unhealthy", CYCLE_TIMEOUT, |h| {
            h.annotations().contains_key(CAPM3_UNHEALTHY_ANNOTATION)
        })
        .await;
    assert!(
        !host
            .annotations()
            .keys()
            .any(|k| is_remediation_power_off(k)),
        "the remediation's power-off is released: {:?}",
        host.annotations()
    );
    let machine = lab
        .wait_machine(
            &capi,
            "ExternallyRemediated=False RemediationFailed",
            CYCLE_TIMEOUT,
            |o| {
                o.data["status"]["v1beta2"]["conditions"]
                    .as_array()
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c["type"] == "ExternallyRemediated"
                                && c["reason"] == "RemediationFailed"
                        })
                    })
            },
        )
        .await;
    let find = find_condition;
    let status = &machine.data["status"];
    assert_eq!(
        find(&status["v1beta2"]["conditions"], "ExternallyRemediated")["status"],
        "False"
    );
    assert_eq!(
        find(&status["v1beta2"]["conditions"], "OwnerRemediated")["status"],
        "False"
    );
    assert_eq!(
        find(&status["conditions"], "OwnerRemediated")["severity"],
        "Warning"
    );
    // The host controller ignores the mark: released from the test's hold, the host powers on.
    lab.lab
        .hosts
        .patch(
            "g-capi",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { HOLD_ANNOTATION: null } } })),
        )
        .await
        .unwrap();
    let host = lab
        .lab
        .wait_host("g-capi", "powered on again, marked", CYCLE_TIMEOUT, |h| {
            powered_on(h) == Some(true)
        })
        .await;
    assert!(host.annotations().contains_key(CAPM3_UNHEALTHY_ANNOTATION));
    assert_eq!(
        host.status
            .as_ref()
            .map(|s| s.error_message.clone())
            .unwrap_or_default(),
        "",
        "no error from the host controller"
    );

    // NodeHealthCheck: gave up with the Node still gone → Succeeded=False (NodeHealthCheck
    // escalates), PermanentNodeDeletionExpected=True (not an orphan); the Machine is kept.
    let gave_up = lab
        .wait_request(NS, &nhc_name, "GaveUp", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().map(|s| s.step) == Some(RemediationStep::GaveUp)
        })
        .await;
    assert_eq!(
        condition(&gave_up, "Succeeded"),
        Some(("False".into(), "RemediationFailed".into()))
    );
    assert_eq!(
        condition_status(&gave_up, "PermanentNodeDeletionExpected"),
        "True"
    );
    assert_eq!(
        gave_up.status.as_ref().map(|s| s.phase()),
        Some(RemediationPhase::Failed)
    );
    let machines = lab.machines(MachineKind::OpenShift, NS);
    let machines = &machines;
    // Deletion would follow the give-up at once; a few seconds more show it does not.
    let deleted = wait_until(
        "the Machine deleted (it must not be)",
        Duration::from_secs(5),
        || async move {
            match machines.get_opt("g-nhc").await {
                Ok(Some(m)) if m.meta().deletion_timestamp.is_none() => None,
                _ => Some(()),
            }
        },
    )
    .await;
    assert!(
        deleted.is_err(),
        "the OpenShift Machine of a NodeHealthCheck request is kept"
    );
    let events = lab.events_for("HostRemediation", &nhc_name).await;
    assert!(
        !events.iter().any(|(_, r, _)| r == "RemediationEscalated"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(_, r, note)| r == "RemediationFailed" && note.contains("NodeHealthCheck")),
        "the Warning says NodeHealthCheck escalates: {events:?}"
    );
}
