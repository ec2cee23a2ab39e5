//! The CRD and the standalone tools against a real API server: a metal3 manifest applies
//! unchanged and keeps every field we do not model; `kubectl get bmh` columns come from our
//! print columns; `hostcycle sim` discovers a Redfish service's systems and plays their nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, wait_until};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

const METAL3_FIXTURE: &str = include_str!("../../api/tests/fixtures/metal3-bmh.yaml");

fn bmh_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metal3.io", "v1alpha1", "BareMetalHost"),
        "baremetalhosts",
    )
}

#[tokio::test]
async fn a_metal3_manifest_applies_unchanged_and_keeps_unknown_fields() {
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let ns: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": "metal3" } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let manifest: Value = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "metal3", &bmh_resource());
    let mut object: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    object.data.as_object_mut().unwrap().remove("status");
    api.create(&PostParams::default(), &object)
        .await
        .expect("a metal3 manifest is accepted as it is");
    let stored = serde_json::to_value(api.get("worker-0").await.unwrap()).unwrap();
    assert_eq!(
        stored["spec"], manifest["spec"],
        "every spec field survives the API server, modelled or not"
    );

    // Status with metal3 fields we do not model survives the status subresource too.
    let mut with_status = api.get("worker-0").await.unwrap();
    let mut status = manifest["status"].clone();
    // Empty strings are fine on the fixed 1.20 build, but we never write them ourselves.
    status.as_object_mut().unwrap().remove("errorMessage");
    with_status.data["status"] = status.clone();
    api.replace_status("worker-0", &PostParams::default(), &with_status)
        .await
        .unwrap();
    let stored = serde_json::to_value(api.get("worker-0").await.unwrap()).unwrap();
    for key in [
        "hardware",
        "goodCredentials",
        "provisioning",
        "operationalStatus",
        "poweredOn",
    ] {
        assert_eq!(stored["status"][key], status[key], "status.{key} preserved");
    }

    // `kubectl get bmh` columns: the API server's Table view of our print columns.
    let request = http::Request::get("/apis/metal3.io/v1alpha1/namespaces/metal3/baremetalhosts")
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "State", "Online", "PoweredOn", "Status", "Age"]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "worker-0");
    assert_eq!(cells[2], true, "Online column shows spec.online");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "lab"),
    ignore = "runs `hostcycle sim`: build with `--features lab` (make test does)"
)]
async fn hostcycle_sim_discovers_redfish_systems_and_registers_their_nodes() {
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let redfish = RedfishEmulator::start(RedfishEmulatorOptions {
        systems: vec![
            FakeSystem::new("sim-cp", FakePower::On),
            FakeSystem::new("sim-worker", FakePower::On),
        ],
        basic_auth: Some(("admin".into(), "sim-password".into())),
        tls: false,
        ..RedfishEmulatorOptions::default()
    })
    .await
    .unwrap();
    let password_file = cluster.dir().join("redfish-password");
    std::fs::write(&password_file, "sim-password\n").unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
    cmd.arg("sim")
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args([
            "--redfish",
            &redfish.endpoint(),
            "--redfish-username",
            "admin",
            "--redfish-password-file",
        ])
        .arg(&password_file)
        .args(["--control-plane", "sim-cp", "--boot-delay", "1s"]);
    let _sim = ManagedProcess::spawn("hostcycle-sim", cmd, &cluster.log_dir()).unwrap();

    let nodes: Api<Node> = Api::all(cluster.client());
    let found = wait_until(
        "hostcycle sim to register both discovered nodes",
        Duration::from_secs(30),
        || async {
            let list = nodes.list(&Default::default()).await.ok()?;
            (list.items.len() == 2).then_some(list.items)
        },
    )
    .await
    .unwrap();
    let control_plane: Vec<String> = found
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(control_plane, ["sim-cp"]);
}
