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
    // The status exactly as metal3 writes it (`errorMessage: ""` included).
    let status = manifest["status"].clone();
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
        "errorMessage",
        "operationHistory",
        "triedCredentials",
    ] {
        assert_eq!(stored["status"][key], status[key], "status.{key} preserved");
    }
    metal3_status_values_are_accepted(&api, &object).await;

    // `kubectl get bmhost`: metal3's second short name is served.
    let request = http::Request::get("/apis/metal3.io/v1alpha1")
        .body(Vec::new())
        .unwrap();
    let resources: Value =
        serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let bmh = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "baremetalhosts")
        .unwrap();
    assert_eq!(bmh["shortNames"], json!(["bmh", "bmhost"]));

    // `kubectl get bmh` columns: the API server's Table view of our print columns.
    let request = http::Request::get("/apis/metal3.io/v1alpha1/namespaces/metal3/baremetalhosts")
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let columns: Vec<(&str, i64)> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    // metal3's columns (`kubectl get bmh` shows those of priority 0; `-o wide` all).
    assert_eq!(
        columns,
        [
            ("Name", 0),
            ("Status", 1),
            ("State", 0),
            ("Consumer", 0),
            ("BMC", 1),
            ("Online", 0),
            ("Error", 0),
            ("PoweredOn", 1),
            ("Age", 0)
        ]
    );
    let row = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == "worker-0")
        .unwrap();
    let cells = &row["cells"];
    assert_eq!(cells[1], "OK", "Status shows status.operationalStatus");
    assert_eq!(
        cells[2], "provisioned",
        "State shows the provisioning state"
    );
    assert_eq!(
        cells[3], "edge-workers-7d9f8",
        "Consumer shows spec.consumerRef.name"
    );
    assert_eq!(
        cells[4], "redfish-virtualmedia://192.168.111.1:8000/redfish/v1/Systems/1",
        "BMC shows spec.bmc.address"
    );
    assert_eq!(
        cells[5], "true",
        "Online shows spec.online, as a string like metal3's"
    );
    assert_eq!(cells[7], true, "PoweredOn shows status.poweredOn");
}

/// Every status value metal3's baremetal-operator writes is accepted by the status
/// subresource and read by hostcycle's type: a host it has just seen (`operationalStatus: ""`,
/// empty provisioning state and ID, zero counters, empty credentials) and a failed one.
async fn metal3_status_values_are_accepted(api: &Api<DynamicObject>, template: &DynamicObject) {
    let registering = json!({
        "operationalStatus": "",
        "errorMessage": "",
        "errorCount": 0,
        "provisioningFailCount": 0,
        "poweredOn": false,
        "provisioning": { "state": "", "ID": "", "image": { "url": "" } },
        "goodCredentials": {},
        "triedCredentials": {},
        "operationHistory": {
            "register": { "start": null, "end": null },
            "inspect": { "start": null, "end": null },
            "provision": { "start": null, "end": null },
            "deprovision": { "start": null, "end": null },
        },
    });
    let failed = json!({
        "operationalStatus": "error",
        "errorType": "provisioning error",
        "errorMessage": "Image provisioning failed: Deploy step deploy.deploy failed",
        "errorCount": 3,
        "provisioningFailCount": 1,
        "poweredOn": true,
        "lastUpdated": "2025-03-04T10:11:12Z",
        "provisioning": { "state": "provisioning", "ID": "0b6f2e4a-4a8c-4d3f-9a55-2d1c7c1e9f01" },
    });
    let servicing = json!({
        "operationalStatus": "servicing",
        "errorType": "servicing error",
        "errorMessage": "",
        "errorCount": 0,
        "poweredOn": true,
        "provisioning": { "state": "provisioned", "ID": "x" },
    });
    for (name, status) in [
        ("metal3-registering", registering),
        ("metal3-failed", failed),
        ("metal3-servicing", servicing),
    ] {
        let mut object = template.clone();
        object.metadata = kube::core::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("metal3".into()),
            ..Default::default()
        };
        let mut created = api.create(&PostParams::default(), &object).await.unwrap();
        created.data["status"] = status.clone();
        api.replace_status(name, &PostParams::default(), &created)
            .await
            .unwrap_or_else(|e| panic!("{name}: a status metal3 writes is accepted: {e}"));
        let stored = api.get(name).await.unwrap();
        assert_eq!(stored.data["status"], status, "{name}: stored as written");
        let typed: hostcycle_api::BareMetalHost =
            serde_json::from_value(serde_json::to_value(&stored).unwrap())
                .unwrap_or_else(|e| panic!("{name}: hostcycle reads it: {e}"));
        let status = typed.status.unwrap();
        match name {
            "metal3-registering" => {
                assert_eq!(status.operational_status, None, "\"\" is not known yet");
                assert_eq!(status.error_type, None);
                assert_eq!(status.observed_powered_on(), None, "never observed");
            }
            "metal3-failed" => {
                assert_eq!(
                    status.operational_status,
                    Some(hostcycle_api::host::OperationalStatus::Error)
                );
                assert_eq!(
                    status.error_type,
                    Some(hostcycle_api::host::ErrorType::ProvisioningError)
                );
                assert_eq!(status.error_count, 3);
            }
            _ => assert_eq!(
                status.operational_status,
                Some(hostcycle_api::host::OperationalStatus::Servicing)
            ),
        }
    }
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
