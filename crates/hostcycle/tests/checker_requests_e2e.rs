//! Templates and requests exactly as the health checkers' code makes them (issue 18, point 4),
//! on a real control plane with the operator and the node simulator:
//!
//! - Cluster API's MachineHealthCheck: `external.GenerateTemplate` copies the whole
//!   `spec.template` of the template (its `metadata` labels and annotations too), adds the
//!   `cloned-from` annotations and the cluster-name label, names the request after the
//!   Machine, in its namespace, owned by it (no controller flag) — for a `v1beta1` Machine
//!   (Cluster API up to v1.10) and a `v1beta2` one (v1.11 and later: `v1beta2` is the
//!   version discovery prefers, `infrastructureRef` has an `apiGroup` and no namespace,
//!   `nodeRef` only a name).
//! - medik8s NodeHealthCheck: `generateRemediationCR` copies `spec.template.spec` only, names
//!   the request after the Node, in the template's namespace, with the `node-name` and
//!   `template-name` annotations, NHC's `part-of` label and the NodeHealthCheck as owner
//!   (controller `false`).
//! - A template without `spec.template.spec`, or with a strategy hostcycle does not have, is
//!   refused when it is created.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::queue::{HostSpec, QueueLab, fast_queue, worker};
use common::remediation::*;
use common::{LabOptions, NS};
use hostcycle_api::remediation::{CAPM3_UNHEALTHY_ANNOTATION, RemediationPhase};
use hostcycle_testkit::machines::{capi_machine_crd_v1beta2, capi_machine_v1beta2_resource};
use hostcycle_testkit::{ClusterOptions, wait_until};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CLUSTER: &str = "edge";
const TEMPLATE: &str = "hostcycle-reboot";
const TEMPLATE_LABEL: (&str, &str) = ("example.com/team", "metal");
const TEMPLATE_ANNOTATION: (&str, &str) =
    ("example.com/runbook", "https://runbooks.example/reboot");

fn template_body(name: &str, ns: &str, template: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediationTemplate",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "template": template },
    }))
    .unwrap()
}

/// The template both checkers read: a Reboot with one retry, and metadata for the requests.
async fn create_template(lab: &RemediationLab, ns: &str) -> DynamicObject {
    let body = template_body(
        TEMPLATE,
        ns,
        json!({
            "metadata": {
                "labels": { TEMPLATE_LABEL.0: TEMPLATE_LABEL.1 },
                "annotations": { TEMPLATE_ANNOTATION.0: TEMPLATE_ANNOTATION.1 },
            },
            "spec": { "strategy": { "type": "Reboot", "retryLimit": 1, "timeoutSeconds": 120 } },
        }),
    );
    let created = lab
        .templates(ns)
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["template"]["metadata"]["labels"][TEMPLATE_LABEL.0], TEMPLATE_LABEL.1,
        "the template's metadata is kept (Cluster API copies it onto each request)"
    );
    created
}

/// Templates the API server refuses at creation, and why.
async fn bad_templates_are_refused(lab: &RemediationLab) {
    for (name, template, why) in [
        (
            "empty",
            json!({}),
            "`template: {}` has no spec: every request made from it would say nothing",
        ),
        (
            "metadata-only",
            json!({ "metadata": { "labels": { "a": "b" } } }),
            "labels alone are no request",
        ),
        (
            "other-strategy",
            json!({ "spec": { "strategy": { "type": "Reprovision" } } }),
            "a strategy hostcycle does not have must not become a power cycle",
        ),
    ] {
        let refused = lab
            .templates(NS)
            .create(&PostParams::default(), &template_body(name, NS, template))
            .await;
        match refused {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {why}: {status:?}")
            }
            other => panic!("{name} must be refused ({why}); got {other:?}"),
        }
    }
    // `spec: {}` is a valid template: a Reboot with the defaults.
    lab.templates(NS)
        .create(
            &PostParams::default(),
            &template_body("defaults", NS, json!({ "spec": {} })),
        )
        .await
        .expect("`spec: {}` is a Reboot with the defaults");
}

/// What Cluster API's MachineHealthCheck creates for an unhealthy Machine
/// (`external.GenerateTemplate`, then the name set to the Machine's).
fn capi_request(
    template: &DynamicObject,
    machine: &DynamicObject,
    machine_api_version: &str,
) -> DynamicObject {
    let copied = template.data["spec"]["template"].clone();
    let template_meta = &copied["metadata"];
    let mut labels: BTreeMap<String, String> =
        serde_json::from_value(template_meta["labels"].clone()).unwrap_or_default();
    labels.insert("cluster.x-k8s.io/cluster-name".into(), CLUSTER.into());
    let mut annotations: BTreeMap<String, String> =
        serde_json::from_value(template_meta["annotations"].clone()).unwrap_or_default();
    annotations.insert(
        "cluster.x-k8s.io/cloned-from-name".into(),
        template.name_any(),
    );
    annotations.insert(
        "cluster.x-k8s.io/cloned-from-groupkind".into(),
        TEMPLATE_GROUP_KIND.into(),
    );
    serde_json::from_value(json!({
        // The template's apiVersion; its kind without the `Template` suffix.
        "apiVersion": template.types.as_ref().unwrap().api_version,
        "kind": "HostRemediation",
        "metadata": {
            "name": machine.name_any(),
            "namespace": machine.namespace().unwrap(),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": machine_api_version,
                "kind": "Machine",
                "name": machine.name_any(),
                "uid": machine.uid().unwrap(),
            }],
        },
        "spec": copied["spec"],
    }))
    .unwrap()
}

/// What medik8s NodeHealthCheck creates for an unhealthy Node (`generateRemediationCR`).
fn nhc_request(template: &DynamicObject, node: &str, nhc: &DynamicObject) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediation",
        "metadata": {
            "name": node,
            "namespace": template.namespace().unwrap(),
            "labels": { "app.kubernetes.io/part-of": "node-healthcheck-controller" },
            "annotations": {
                "remediation.medik8s.io/node-name": node,
                "remediation.medik8s.io/template-name": template.name_any(),
            },
            "ownerReferences": [{
                "apiVersion": "remediation.medik8s.io/v1alpha1",
                "kind": "NodeHealthCheck",
                "name": nhc.name_any(),
                "uid": nhc.uid().unwrap(),
                "controller": false,
            }],
        },
        "spec": template.data["spec"]["template"]["spec"],
    }))
    .unwrap()
}

async fn create_request(lab: &RemediationLab, body: &DynamicObject) -> DynamicObject {
    let ns = body.namespace().unwrap();
    Api::<DynamicObject>::namespaced_with(
        lab.client.clone(),
        &ns,
        &ApiResource::erase::<hostcycle_api::remediation::HostRemediation>(&()),
    )
    .create(&PostParams::default(), body)
    .await
    .unwrap()
}

/// The host is used by the Machine's infrastructure object, as CAPM3 sets it.
async fn consume_host(lab: &RemediationLab, host: &str, metal3_machine: &str) {
    let patch = json!({ "spec": { "consumerRef": {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "Metal3Machine",
        "name": metal3_machine,
        "namespace": NS,
    } } });
    Api::<hostcycle_api::BareMetalHost>::namespaced(lab.client.clone(), NS)
        .patch(host, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A Cluster API Machine for `node`, whose infrastructure is Metal3Machine `<node>-m3m`, in the
/// shape of `version` (`v1beta1` or `v1beta2`), created through that version.
async fn create_capi_machine(lab: &RemediationLab, version: &str, node: &str) -> DynamicObject {
    let name = format!("{CLUSTER}-md-0-{node}");
    let m3m = format!("{node}-m3m");
    let (resource, spec, node_ref) = if version == "v1beta2" {
        (
            capi_machine_v1beta2_resource(),
            json!({
                "clusterName": CLUSTER,
                "bootstrap": { "dataSecretName": format!("{node}-bootstrap") },
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "Metal3Machine",
                    "name": m3m,
                },
            }),
            json!({ "name": node }),
        )
    } else {
        (
            hostcycle_testkit::MachineKind::ClusterApi.api_resource(),
            json!({
                "clusterName": CLUSTER,
                "bootstrap": { "dataSecretName": format!("{node}-bootstrap") },
                "infrastructureRef": {
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                    "kind": "Metal3Machine",
                    "name": m3m,
                    "namespace": NS,
                },
            }),
            json!({ "apiVersion": "v1", "kind": "Node", "name": node }),
        )
    };
    let machines: Api<DynamicObject> = Api::namespaced_with(lab.client.clone(), NS, &resource);
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version,
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": { "cluster.x-k8s.io/cluster-name": CLUSTER },
        },
        "spec": spec,
    }))
    .unwrap();
    let mut created = machines
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
    created.data["status"] = json!({ "phase": "Running", "nodeRef": node_ref });
    machines
        .replace_status(&name, &PostParams::default(), &created)
        .await
        .unwrap();
    consume_host(lab, node, &m3m).await;
    machines.get(&name).await.unwrap()
}

/// The request made as the checker makes it is accepted as it is, runs the whole flow (the
/// Node comes back), and is let go when the checker deletes it.
/// `old_uid`: the Node's uid before the request was created.
async fn remediated(lab: &RemediationLab, request: &DynamicObject, node: &str, old_uid: &str) {
    let ns = request.namespace().unwrap();
    let name = request.name_any();
    lab.wait_node_back(node, old_uid, CYCLE_TIMEOUT).await;
    let done = lab
        .wait_request(&ns, &name, "phase Succeeded", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Succeeded)
        })
        .await;
    assert_eq!(
        done.status.as_ref().and_then(|s| s.node.as_deref()),
        Some(node),
        "{ns}/{name}: the request found its Node"
    );
    assert_eq!(
        condition_status(&done, "Succeeded"),
        "True",
        "{ns}/{name}: what the checkers read"
    );
    // Healthy again: the checker deletes the request; hostcycle's finalizer lets it go.
    lab.delete_request(&ns, &name).await;
    lab.wait_request_gone(&ns, &name, Duration::from_secs(30))
        .await;
}

fn assert_capi_metadata(stored: &DynamicObject, machine: &DynamicObject) {
    let labels = stored.labels();
    let annotations = stored.annotations();
    assert_eq!(
        labels.get(TEMPLATE_LABEL.0).map(String::as_str),
        Some(TEMPLATE_LABEL.1),
        "the template's label, copied by Cluster API, is kept: {labels:?}"
    );
    assert_eq!(
        labels
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some(CLUSTER)
    );
    assert_eq!(
        annotations.get(TEMPLATE_ANNOTATION.0).map(String::as_str),
        Some(TEMPLATE_ANNOTATION.1),
        "the template's annotation, copied by Cluster API, is kept: {annotations:?}"
    );
    assert_eq!(
        annotations
            .get("cluster.x-k8s.io/cloned-from-name")
            .map(String::as_str),
        Some(TEMPLATE)
    );
    let owners = stored.owner_references();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, machine.uid().unwrap());
    assert_eq!(owners[0].controller, None, "as Cluster API sets it");
    assert_eq!(
        stored.data["spec"]["strategy"],
        json!({ "type": "Reboot", "retryLimit": 1, "timeoutSeconds": 120 })
    );
}

fn nhc_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "nodehealthchecks.remediation.medik8s.io" },
        "spec": {
            "group": "remediation.medik8s.io",
            "scope": "Cluster",
            "names": {
                "kind": "NodeHealthCheck",
                "listKind": "NodeHealthCheckList",
                "plural": "nodehealthchecks",
                "singular": "nodehealthcheck",
                "shortNames": ["nhc"],
            },
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                } },
            }],
        },
    }))
    .unwrap()
}

/// A NodeHealthCheck to own the requests (the garbage collector sees a real owner).
async fn create_nhc(lab: &RemediationLab, template_ns: &str) -> DynamicObject {
    let resource = ApiResource {
        group: "remediation.medik8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "remediation.medik8s.io/v1alpha1".into(),
        kind: "NodeHealthCheck".into(),
        plural: "nodehealthchecks".into(),
    };
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1",
        "kind": "NodeHealthCheck",
        "metadata": { "name": "workers" },
        "spec": {
            "selector": { "matchExpressions": [
                { "key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist" },
            ] },
            "remediationTemplate": {
                "apiVersion": "hostcycle.io/v1alpha1",
                "kind": "HostRemediationTemplate",
                "name": TEMPLATE,
                "namespace": template_ns,
            },
            "unhealthyConditions": [
                { "type": "Ready", "status": "False", "duration": "300s" },
                { "type": "Ready", "status": "Unknown", "duration": "300s" },
            ],
        },
    }))
    .unwrap();
    Api::<DynamicObject>::all_with(lab.client.clone(), &resource)
        .create(&PostParams::default(), &body)
        .await
        .unwrap()
}

fn lab_options(crds: Vec<CustomResourceDefinition>) -> LabOptions {
    LabOptions {
        cluster: ClusterOptions {
            crds,
            ..ClusterOptions::default()
        },
        operator_args: ["--max-concurrent-remediations", "2"]
            .map(String::from)
            .to_vec(),
        ..LabOptions::default()
    }
}

async fn start(hosts: &[HostSpec], crds: Vec<CustomResourceDefinition>) -> RemediationLab {
    RemediationLab {
        q: QueueLab::start_with(hosts, fast_queue(), lab_options(crds)).await,
    }
}

/// Cluster API up to v1.10 (`v1beta1` Machines) and NodeHealthCheck, at once; the templates
/// the API server refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_as_machine_health_check_v1beta1_and_node_health_check_create_them() {
    let mut crds = hostcycle_api::crds();
    crds.extend(hostcycle_testkit::machine_crds());
    crds.push(nhc_crd());
    let lab = start(&[worker("c-0"), worker("c-1")], crds).await;
    bad_templates_are_refused(&lab).await;
    let template = create_template(&lab, NS).await;

    let machine = create_capi_machine(&lab, "v1beta1", "c-0").await;
    let uids = [
        lab.node("c-0").await.uid().unwrap(),
        lab.node("c-1").await.uid().unwrap(),
    ];
    let capi = create_request(
        &lab,
        &capi_request(&template, &machine, "cluster.x-k8s.io/v1beta1"),
    )
    .await;
    assert_capi_metadata(&capi, &machine);

    let nhc = create_nhc(&lab, NS).await;
    let from_nhc = create_request(&lab, &nhc_request(&template, "c-1", &nhc)).await;
    assert_eq!(
        from_nhc.data["spec"], template.data["spec"]["template"]["spec"],
        "NodeHealthCheck copies the spec only"
    );
    assert!(
        !from_nhc.labels().contains_key(TEMPLATE_LABEL.0),
        "NodeHealthCheck does not copy the template's metadata"
    );

    tokio::join!(
        remediated(&lab, &capi, "c-0", &uids[0]),
        remediated(&lab, &from_nhc, "c-1", &uids[1])
    );
}

/// Cluster API v1.11 and later: the Machine CRD serves `v1beta2` (preferred, stored) besides
/// `v1beta1`; the Machine has the `v1beta2` shape and the request's owner reference says
/// `cluster.x-k8s.io/v1beta2`. One request succeeds; another gives up (its host held off) and
/// writes the conditions where `v1beta2` keeps them: `status.conditions` (Kubernetes
/// conditions, read by Cluster API v1.11+) and `status.deprecated.v1beta1.conditions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_as_machine_health_check_v1beta2_creates_them() {
    let mut crds = hostcycle_api::crds();
    crds.push(hostcycle_testkit::machines::openshift_machine_crd());
    crds.push(capi_machine_crd_v1beta2());
    let lab = start(&[worker("d-0"), worker("d-1")], crds).await;
    let template = create_template(&lab, NS).await;
    let machine = create_capi_machine(&lab, "v1beta2", "d-0").await;
    let old_uid = lab.node("d-0").await.uid().unwrap();
    assert_eq!(
        machine.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta2"
    );
    let request = create_request(
        &lab,
        &capi_request(&template, &machine, "cluster.x-k8s.io/v1beta2"),
    )
    .await;
    assert_capi_metadata(&request, &machine);
    tokio::join!(
        remediated(&lab, &request, "d-0", &old_uid),
        gives_up_on_a_v1beta2_machine(&lab, "d-1")
    );
}

async fn gives_up_on_a_v1beta2_machine(lab: &RemediationLab, node: &str) {
    let machines: Api<DynamicObject> =
        Api::namespaced_with(lab.client.clone(), NS, &capi_machine_v1beta2_resource());
    let machine = create_capi_machine(lab, "v1beta2", node).await;
    // What the MachineHealthCheck (v1.11+) writes when it creates the request.
    machines
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": [{
                "type": "ExternallyRemediated", "status": "False",
                "reason": "WaitingForRemediation", "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }] } })),
        )
        .await
        .unwrap();
    let body = template_body(
        "fail-fast",
        NS,
        json!({ "spec": { "strategy": { "type": "Reboot", "retryLimit": 0, "timeoutSeconds": 15 } } }),
    );
    let fail_fast = lab
        .templates(NS)
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
    // The host is held off once the request's power-off reaches it: its Node never returns.
    let hold = lab.hold_at_request_power_off(node).await;
    let request = create_request(
        lab,
        &capi_request(&fail_fast, &machine, "cluster.x-k8s.io/v1beta2"),
    )
    .await;
    tokio::time::timeout(CYCLE_TIMEOUT, hold)
        .await
        .expect("the request's power-off reaches the host")
        .unwrap();
    lab.wait_request(
        NS,
        &request.name_any(),
        "phase Failed",
        CYCLE_TIMEOUT,
        |r| r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Failed),
    )
    .await;
    lab.lab
        .wait_host(node, "capm3.metal3.io/unhealthy", CYCLE_TIMEOUT, |h| {
            h.annotations().contains_key(CAPM3_UNHEALTHY_ANNOTATION)
        })
        .await;
    let find = find_condition;
    let what = "OwnerRemediated=False and ExternallyRemediated=False in status.conditions";
    let status = wait_until(what, CYCLE_TIMEOUT, || {
        let machines = machines.clone();
        let name = machine.name_any();
        async move {
            let m = machines.get(&name).await.ok()?;
            let status = m.data["status"].clone();
            (find(&status["conditions"], "OwnerRemediated")["status"] == "False"
                && find(&status["conditions"], "ExternallyRemediated")["reason"]
                    == "RemediationFailed")
                .then_some(status)
        }
    })
    .await
    .unwrap();
    let owner = find(&status["conditions"], "OwnerRemediated");
    assert_eq!(owner["reason"], "WaitingForRemediation", "{status}");
    assert!(
        owner.get("severity").is_none(),
        "v1beta2 conditions are Kubernetes conditions: {status}"
    );
    assert_eq!(
        find(&status["conditions"], "ExternallyRemediated")["status"],
        "False"
    );
    assert_eq!(
        find(
            &status["deprecated"]["v1beta1"]["conditions"],
            "OwnerRemediated"
        )["severity"],
        "Warning",
        "the v1beta1 condition where v1beta2 keeps it: {status}"
    );
    assert!(
        status.get("v1beta2").is_none(),
        "no v1beta1-layout field on a v1beta2 Machine: {status}"
    );
    // Let the host go: it powers on again (the mark stays for the administrator).
    lab.lab
        .hosts
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { HOLD_ANNOTATION: null } } })),
        )
        .await
        .unwrap();
}
