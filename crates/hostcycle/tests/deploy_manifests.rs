//! The install under `deploy/`: the checked-in files are exactly what `hostcycle manifests
//! --deploy` generates, and the API server accepts every object in them as it is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use hostcycle_operator::deploy::{CRDS_FILE, DeployOptions, OPERATOR_FILE, render};
use hostcycle_testkit::{ClusterOptions, LocalCluster, wait_until};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;

const REGENERATE: &str = "make deploy-manifests \
     (or: cargo run -p hostcycle -- manifests --deploy --output-dir deploy)";

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read_deploy_file(name: &str) -> String {
    let path = deploy_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e}; generate it with {REGENERATE}",
            path.display()
        )
    })
}

/// The first line that differs, for a readable failure.
fn first_difference(checked_in: &str, generated: &str) -> String {
    let line = checked_in
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
    format!(
        "line {}: checked in {:?}, generated {:?}",
        line + 1,
        checked_in.lines().nth(line).unwrap_or("<end of file>"),
        generated.lines().nth(line).unwrap_or("<end of file>"),
    )
}

#[test]
fn checked_in_deploy_files_are_what_the_generator_renders() {
    let files = render(&DeployOptions::standard()).unwrap();
    assert_eq!(
        files.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        [CRDS_FILE, OPERATOR_FILE]
    );
    for (name, generated) in files {
        let checked_in = read_deploy_file(name);
        assert!(
            checked_in == generated,
            "deploy/{name} is stale ({}); regenerate it with {REGENERATE}",
            first_difference(&checked_in, &generated)
        );
    }
}

/// The documented regeneration command writes the same files as the library.
#[test]
fn manifests_deploy_output_dir_writes_the_rendered_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deploy");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(["manifests", "--deploy", "--output-dir"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "hostcycle manifests --deploy: {status}");
    for (name, generated) in render(&DeployOptions::standard()).unwrap() {
        let written = std::fs::read_to_string(out.join(name)).unwrap();
        assert!(written == generated, "{name} differs from render()");
    }
    // Without --output-dir: one stream, the CRDs first.
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args([
            "manifests",
            "--deploy",
            "--image",
            "example.org/hostcycle:test",
        ])
        .output()
        .unwrap();
    assert!(printed.status.success());
    let stream = String::from_utf8(printed.stdout).unwrap();
    let kinds: Vec<String> = serde_saphyr::from_multiple::<Value>(&stream)
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("CustomResourceDefinition")
    );
    assert_eq!(kinds.last().map(String::as_str), Some("Service"));
    assert!(stream.contains("image: example.org/hostcycle:test"));
}

/// Every leaf of `sent` is in `stored` with the same value (the server may add defaults,
/// but must not drop or change anything we wrote: on 1.20 unknown fields vanish silently).
fn assert_kept(sent: &Value, stored: &Value, path: &str) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(stored)) => {
            for (key, value) in sent {
                let Some(kept) = stored.get(key) else {
                    panic!("{path}.{key} was dropped by the API server");
                };
                assert_kept(value, kept, &format!("{path}.{key}"));
            }
        }
        (Value::Array(sent), Value::Array(stored)) => {
            assert_eq!(sent.len(), stored.len(), "length of {path}");
            for (i, (a, b)) in sent.iter().zip(stored).enumerate() {
                assert_kept(a, b, &format!("{path}[{i}]"));
            }
        }
        // `minimum: 0.0` is read back as 0: the same number.
        (Value::Number(a), Value::Number(b)) => assert_eq!(a.as_f64(), b.as_f64(), "{path}"),
        _ => assert_eq!(sent, stored, "{path}"),
    }
}

fn gvk_of(object: &Value) -> GroupVersionKind {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// Creates `object` as it is and checks that the server kept every field of it.
async fn create_as_is(client: &kube::Client, object: &Value) {
    let gvk = gvk_of(object);
    let name = object["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let what = format!("{} {name}", gvk.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {what}: {e}"));
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_else(|| panic!("{what} is namespaced but names no namespace"));
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    api.create(&PostParams::default(), &dynamic)
        .await
        .unwrap_or_else(|e| panic!("the API server refused {what} from deploy/: {e}"));
    let stored = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    assert_kept(object, &stored, &what);
}

#[tokio::test]
async fn every_object_of_deploy_is_accepted_by_the_api_server_as_it_is() {
    // No CRDs beforehand: deploy/crds.yaml installs them.
    let cluster = LocalCluster::start(ClusterOptions {
        crds: Vec::new(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let client = cluster.client();

    let crds: Vec<Value> = serde_saphyr::from_multiple(&read_deploy_file(CRDS_FILE))
        .expect("deploy/crds.yaml parses as YAML");
    assert_eq!(crds.len(), hostcycle_api::crds().len());
    for crd in &crds {
        assert_eq!(crd["kind"], "CustomResourceDefinition");
        create_as_is(&client, crd).await;
    }
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        wait_until(
            &format!("CRD {name} to be Established"),
            Duration::from_secs(30),
            || {
                let crd_api = crd_api.clone();
                let name = name.clone();
                async move {
                    let conditions = crd_api.get(&name).await.ok()?.status?.conditions?;
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            },
        )
        .await
        .unwrap();
    }

    let objects: Vec<Value> = serde_saphyr::from_multiple(&read_deploy_file(OPERATOR_FILE))
        .expect("deploy/operator.yaml parses as YAML");
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    ] {
        assert!(kinds.contains(&kind), "deploy/operator.yaml has a {kind}");
    }
    for object in &objects {
        create_as_is(&client, object).await;
    }

    // The pod template passes admission too: the controller manager's ReplicaSet creates
    // both replicas' pods (they stay Pending: no node, and the image is not built here).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hostcycle-system");
    let created = wait_until(
        "the Deployment's two pods to be created",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(
                        &ListParams::default().labels("app.kubernetes.io/name=hostcycle-operator"),
                    )
                    .await
                    .ok()?;
                (list.items.len() == 2).then_some(list.items)
            }
        },
    )
    .await
    .unwrap();
    for pod in created {
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("hostcycle-operator")
        );
        let sc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
}
