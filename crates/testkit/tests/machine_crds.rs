//! The minimal Machine CRDs (`hostcycle_testkit::machines`) on a real API server: installed by
//! default and Established, every field of a real Machine kept, status written only through
//! the status subresource, both kinds found by discovery, and a cluster started without them
//! serving neither.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hostcycle_testkit::machines::{MACHINE_HOST_ANNOTATION, OPENSHIFT_MACHINE_ROLE_LABEL};
use hostcycle_testkit::{
    ClusterOptions, LocalCluster, MachineKind, create_machine, create_machine_object,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);

async fn create_namespace(cluster: &LocalCluster, name: &str) {
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// An OpenShift Machine as the machine-api's baremetal provider writes it.
fn openshift_machine_manifest() -> Value {
    json!({
        "apiVersion": "machine.openshift.io/v1beta1",
        "kind": "Machine",
        "metadata": {
            "name": "ocp-worker-0",
            "namespace": "openshift-machine-api",
            "labels": {
                "machine.openshift.io/cluster-api-cluster": "ocp",
                OPENSHIFT_MACHINE_ROLE_LABEL: "worker",
                "machine.openshift.io/cluster-api-machine-type": "worker",
                "machine.openshift.io/cluster-api-machineset": "ocp-worker",
            },
            "annotations": {
                MACHINE_HOST_ANNOTATION: "openshift-machine-api/worker-0",
                "machine.openshift.io/instance-state": "externally provisioned",
            },
        },
        "spec": {
            "lifecycleHooks": { "preDrain": [{ "name": "EtcdQuorum", "owner": "clusteroperator/etcd" }] },
            "metadata": {},
            "providerID": "baremetalhost:///openshift-machine-api/worker-0/6a5e1d3f-0b9e-4f2e-8c1a-1d2e3f4a5b6c",
            "providerSpec": { "value": {
                "apiVersion": "baremetal.cluster.k8s.io/v1alpha1",
                "kind": "BareMetalMachineProviderSpec",
                "customDeploy": { "method": "install_coreos" },
                "hostSelector": {},
                "image": { "checksum": "", "url": "" },
                "userData": { "name": "worker-user-data-managed" },
            }},
        },
        "status": {
            "addresses": [
                { "address": "192.0.2.20", "type": "InternalIP" },
                { "address": "worker-0", "type": "Hostname" },
            ],
            "conditions": [{
                "lastTransitionTime": "2024-05-01T10:00:00Z",
                "status": "True",
                "type": "InstanceExists",
            }],
            "errorMessage": "",
            "lastUpdated": "2024-05-01T10:00:00Z",
            "nodeRef": { "kind": "Node", "name": "worker-0", "uid": "1b2c3d4e-0000-4000-8000-000000000001" },
            "phase": "Running",
            "providerStatus": { "conditions": [], "extraField": { "deep": [1, 2.5, true, null] } },
        },
    })
}

/// A Cluster API Machine (v1beta1, with the v1beta2 conditions of CAPI 1.9+) as CAPM3 leaves it.
fn capi_machine_manifest() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {
            "name": "capi-md-0-abcde",
            "namespace": "capi",
            "labels": {
                "cluster.x-k8s.io/cluster-name": "capi",
                "cluster.x-k8s.io/deployment-name": "capi-md-0",
            },
        },
        "spec": {
            "bootstrap": { "dataSecretName": "capi-md-0-abcde-bootstrap" },
            "clusterName": "capi",
            "infrastructureRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "Metal3Machine",
                "name": "capi-md-0-xyz12",
                "namespace": "capi",
            },
            "nodeDeletionTimeout": "10s",
            "providerID": "metal3://capi/host-7/capi-md-0-xyz12",
            "version": "v1.30.2",
        },
        "status": {
            "bootstrapReady": true,
            "conditions": [
                { "lastTransitionTime": "2024-05-01T10:00:00Z", "status": "True", "type": "Ready" },
                {
                    "lastTransitionTime": "2024-05-01T10:00:00Z",
                    "message": "",
                    "reason": "NodeConditionsFailed",
                    "severity": "Warning",
                    "status": "False",
                    "type": "HealthCheckSucceeded",
                },
            ],
            "infrastructureReady": true,
            "nodeInfo": { "kubeletVersion": "v1.30.2", "osImage": "Ubuntu 22.04.4 LTS" },
            "nodeRef": { "apiVersion": "v1", "kind": "Node", "name": "host-7", "uid": "1b2c3d4e-0000-4000-8000-000000000007" },
            "observedGeneration": 2,
            "phase": "Running",
            "v1beta2": { "conditions": [{
                "lastTransitionTime": "2024-05-01T10:00:00Z",
                "message": "",
                "observedGeneration": 2,
                "reason": "Ready",
                "status": "True",
                "type": "Ready",
            }]},
        },
    })
}

fn assert_same(kind: MachineKind, what: &str, sent: &Value, got: &Value) {
    assert_eq!(
        got, sent,
        "{kind}: {what} must round-trip unchanged\nsent: {sent:#}\ngot:  {got:#}"
    );
}

/// Everything about one kind, on one cluster.
async fn check_kind(cluster: &LocalCluster, kind: MachineKind, manifest: Value) {
    let client = cluster.client();
    let ar = kind.api_resource();

    // Discovery finds kind Machine in the group: namespaced, with the status subresource.
    let group = kube::discovery::group(&client, kind.group())
        .await
        .unwrap_or_else(|e| panic!("{kind}: discovering group {}: {e}", kind.group()));
    let (found, caps) = group
        .recommended_kind("Machine")
        .unwrap_or_else(|| panic!("{kind}: discovery lists no kind Machine"));
    assert_eq!(found, ar, "{kind}: discovered resource");
    assert_eq!(caps.scope, Scope::Namespaced, "{kind}: scope");
    assert!(
        caps.subresources
            .iter()
            .any(|(sub, _)| sub.plural == "status"),
        "{kind}: discovery lists the status subresource"
    );

    // A real Machine round-trips: spec on create, status through the subresource.
    let obj: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    let ns = obj.metadata.namespace.clone().unwrap();
    let name = obj.metadata.name.clone().unwrap();
    let written = create_machine_object(&client, kind, &obj).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let back = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    assert_eq!(
        serde_json::to_value(&written).unwrap(),
        back,
        "{kind}: create_machine_object returns the object as stored"
    );
    for field in ["spec", "status"] {
        assert_same(kind, field, &manifest[field], &back[field]);
    }
    for field in ["labels", "annotations"] {
        assert_same(
            kind,
            &format!("metadata.{field}"),
            &manifest["metadata"][field],
            &back["metadata"][field],
        );
    }

    // Status is a subresource: a write of the main resource leaves it alone...
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "phase": "Failed" } })),
    )
    .await
    .unwrap();
    let after = api.get(&name).await.unwrap();
    assert_eq!(
        after.data["status"]["phase"], "Running",
        "{kind}: status must only change through the status subresource"
    );
    // ...and the subresource changes it (as remediation will, for conditions).
    let conditions = json!([{
        "lastTransitionTime": "2024-05-02T10:00:00Z",
        "message": "remediating",
        "reason": "ExternalRemediationRequestCreated",
        "status": "False",
        "type": "OwnerRemediated",
    }]);
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "v1beta2": { "conditions": conditions } } })),
    )
    .await
    .unwrap();
    let after = api.get(&name).await.unwrap();
    assert_eq!(after.data["status"]["v1beta2"]["conditions"], conditions);
    assert_eq!(
        after.data["status"]["nodeRef"], manifest["status"]["nodeRef"],
        "{kind}: a status merge patch keeps the other status fields"
    );

    // create_machine: host annotation, labels, and status.nodeRef written through the
    // subresource.
    let created = create_machine(
        &client,
        kind,
        &ns,
        "made-by-helper",
        Some(("metal", "host-9")),
        Some("node-9"),
        &[("role", "worker")],
    )
    .await
    .unwrap();
    let stored = api.get("made-by-helper").await.unwrap();
    assert_eq!(
        stored.data["status"]["nodeRef"]["name"], "node-9",
        "{kind}: create_machine sets status.nodeRef.name"
    );
    assert_eq!(stored.data["status"]["nodeRef"]["kind"], "Node");
    assert_eq!(
        stored.metadata.annotations.as_ref().unwrap()[MACHINE_HOST_ANNOTATION],
        "metal/host-9"
    );
    assert_eq!(stored.metadata.labels.as_ref().unwrap()["role"], "worker");
    assert_eq!(
        created.metadata.resource_version, stored.metadata.resource_version,
        "{kind}: create_machine returns the object after its status write"
    );
    // A Machine without a node has no status.
    create_machine(&client, kind, &ns, "no-node", None, None, &[])
        .await
        .unwrap();
    let bare = api.get("no-node").await.unwrap();
    assert!(bare.data.get("status").is_none(), "{kind}: {:#}", bare.data);

    // The server prints upstream's columns, the node's name among them.
    let request = http::Request::get(format!(
        "/apis/{}/namespaces/{ns}/machines/made-by-helper",
        kind.api_version()
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let node_column = match kind {
        MachineKind::OpenShift => "Node",
        MachineKind::ClusterApi => "NodeName",
    };
    for want in ["Name", "Phase", "Age", node_column] {
        assert!(
            columns.contains(&want),
            "{kind}: column {want} in {columns:?}"
        );
    }
    let at = columns.iter().position(|c| *c == node_column).unwrap();
    assert_eq!(table["rows"][0]["cells"][at], "node-9", "{kind}: {table:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_crds_keep_every_field_and_serve_status_and_discovery() {
    tokio::time::timeout(TIMEOUT, async {
        let cluster = LocalCluster::start(ClusterOptions::default())
            .await
            .unwrap();

        // Both installed by default, Established.
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
        for kind in MachineKind::ALL {
            let crd = crds.get(&kind.crd_name()).await.unwrap();
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            assert!(established, "{kind}: CRD Established");
        }

        create_namespace(&cluster, "openshift-machine-api").await;
        create_namespace(&cluster, "capi").await;
        check_kind(
            &cluster,
            MachineKind::OpenShift,
            openshift_machine_manifest(),
        )
        .await;
        check_kind(&cluster, MachineKind::ClusterApi, capi_machine_manifest()).await;

        // Applying them again (e.g. a second install) changes nothing.
        cluster
            .install_crds(&hostcycle_testkit::machine_crds())
            .await
            .unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_started_with_only_hostcycles_crds_serves_no_machine_kind() {
    tokio::time::timeout(TIMEOUT, async {
        let cluster = LocalCluster::start(ClusterOptions {
            crds: hostcycle_api::crds(),
            ..ClusterOptions::default()
        })
        .await
        .unwrap();
        let client = cluster.client();
        for kind in MachineKind::ALL {
            assert!(
                kube::discovery::group(&client, kind.group()).await.is_err(),
                "{kind}: group {} must not be served",
                kind.group()
            );
        }
        let discovery = kube::Discovery::new(client).run().await.unwrap();
        let machines: Vec<_> = discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .filter(|(r, _)| r.kind == "Machine")
            .map(|(r, _)| r.api_version)
            .collect();
        assert!(
            machines.is_empty(),
            "no Machine kind expected: {machines:?}"
        );
    })
    .await
    .expect("test timed out");
}
