//! The install under `deploy/`: the checked-in files are exactly what `hostcycle manifests
//! --deploy` generates, and the API server accepts every object in them as it is. A
//! namespaced install, applied with kubectl, gives the tenants of the watched namespace none
//! of the operator's power and leaves their namespace as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod install_tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hostcycle_api::queue::{RebootQueue, RebootQueueEntry};
use hostcycle_operator::deploy::{CRDS_FILE, DeployOptions, OPERATOR_FILE, render};
use hostcycle_testkit::{ClusterOptions, LocalCluster, wait_until};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
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

/// `object` as a server that does not serve `policy/v1` (Kubernetes 1.20, which the tests run)
/// takes it: a PodDisruptionBudget as `policy/v1beta1`, whose fields are the same for what the
/// install sets (`maxUnavailable`, `selector`). Everything else unchanged.
async fn for_this_server(client: &kube::Client, object: &Value) -> Value {
    let mut object = object.clone();
    if object["apiVersion"] == "policy/v1" && object["kind"] == "PodDisruptionBudget" {
        let served = kube::discovery::group(client, "policy").await.unwrap();
        if !served.versions().any(|v| v == "v1") {
            object["apiVersion"] = Value::String("policy/v1beta1".into());
        }
    }
    object
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
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Deployment",
        "Service",
    ] {
        assert!(kinds.contains(&kind), "deploy/operator.yaml has a {kind}");
    }
    for object in &objects {
        create_as_is(&client, &for_this_server(&client, object).await).await;
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

// ----- a namespaced install and the watched namespace's tenants ---------------------------

const TENANT: &str = "tenant-a";
const OPERATOR_NS: &str = "hostcycle-system";
/// A user bound to the built-in `edit` ClusterRole in [`TENANT`]: what a tenant usually has.
const EDITOR: &str = "tenant-editor";

/// Who asks: a user, or a ServiceAccount `namespace/name` (with the groups the API server
/// gives every ServiceAccount token).
#[derive(Clone, Debug)]
enum Who {
    User(&'static str),
    Account(String, String),
}

impl Who {
    fn name(&self) -> String {
        match self {
            Who::User(name) => name.to_string(),
            Who::Account(ns, name) => format!("system:serviceaccount:{ns}:{name}"),
        }
    }

    fn groups(&self) -> Vec<String> {
        match self {
            Who::User(_) => vec!["system:authenticated".into()],
            Who::Account(ns, _) => vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        }
    }
}

/// One thing to ask the authorizer: `verb` on `resource[/subresource]` (core group unless
/// `group`), in `namespace` (cluster-scoped when `None`), optionally one object by name.
#[derive(Clone, Debug)]
struct Action {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    namespace: Option<&'static str>,
    name: Option<String>,
}

fn action(verb: &'static str, resource: &'static str, namespace: Option<&'static str>) -> Action {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    Action {
        verb,
        group: "",
        resource,
        subresource,
        namespace,
        name: None,
    }
}

impl Action {
    fn named(mut self, name: &str) -> Action {
        self.name = Some(name.to_string());
        self
    }

    fn describe(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        let name = self
            .name
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let place = match self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide".into(),
        };
        format!("{} {}{sub}{name} {place}", self.verb, self.resource)
    }
}

/// Whether the API server's authorizer (RBAC) allows `who` to do `action`: a
/// SubjectAccessReview, what `kubectl auth can-i --as` asks.
async fn allowed(client: &kube::Client, who: &Who, action: &Action) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(who.name()),
            groups: Some(who.groups()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(action.verb.into()),
                group: Some(action.group.into()),
                resource: Some(action.resource.into()),
                subresource: Some(action.subresource.into()),
                namespace: action.namespace.map(String::from),
                name: action.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SubjectAccessReview {who:?} {action:?}: {e}"));
    answer.status.expect("a SubjectAccessReview status").allowed
}

/// The Debian kubectl 1.20 (the server's version) with the admin kubeconfig.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let [_, (_, kubectl)] = install_tools::kubectls();
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let mut all = vec![kubeconfig.as_str()];
    all.extend(args);
    install_tools::run_raw(&kubectl, &all)
}

fn labels_of(namespace: &Namespace) -> BTreeMap<String, String> {
    namespace.metadata.labels.clone().unwrap_or_default()
}

/// `hostcycle manifests --deploy --namespace tenant-a` applied as documented (kubectl apply)
/// to a cluster where the tenant's namespace exists, with labels of its own, and a tenant user
/// holds `edit` there. Nothing of the operator lands in the tenant's namespace but the Role
/// that grants the hosts and its binding to the ServiceAccount in hostcycle-system; the
/// tenant's labels are unchanged. Neither the tenant's ServiceAccounts (what its pods can run
/// as) nor the `edit` user can delete Nodes, patch them, evict or delete Pods elsewhere, read
/// the operator's token, impersonate it or run a pod as it — while the operator's own
/// ServiceAccount can do what the queue and remediation need.
#[tokio::test]
async fn a_namespaced_install_gives_the_watched_namespace_none_of_the_operators_power() {
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();

    // The tenant's namespace, as its owner labelled it, and an editor there.
    let tenant_labels = BTreeMap::from([
        ("team".to_string(), "a".to_string()),
        (
            "pod-security.kubernetes.io/enforce".to_string(),
            "baseline".to_string(),
        ),
    ]);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let tenant: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": TENANT, "labels": tenant_labels },
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "tenant-editors", "namespace": TENANT },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": EDITOR }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), TENANT)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let editor = Who::User(EDITOR);
    // `edit` is aggregated by kube-controller-manager; its default ServiceAccount and token
    // come from it too (pods need both on 1.20).
    wait_until(
        "the aggregated `edit` role to let the editor create pods",
        Duration::from_secs(60),
        || {
            let (client, editor) = (client.clone(), editor.clone());
            async move {
                allowed(&client, &editor, &action("create", "pods", Some(TENANT)))
                    .await
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), TENANT);
    wait_until(
        "the tenant's default ServiceAccount and its token",
        Duration::from_secs(60),
        || {
            let accounts = accounts.clone();
            async move {
                let account = accounts.get_opt("default").await.ok()??;
                account.secrets.filter(|s| !s.is_empty()).map(|_| ())
            }
        },
    )
    .await
    .unwrap();

    // The install, rendered by the binary and applied with kubectl.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args([
            "manifests",
            "--deploy",
            "--namespace",
            TENANT,
            "--output-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hostcycle manifests --deploy --namespace {TENANT}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects: Vec<Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(dir.path().join(OPERATOR_FILE)).unwrap(),
    )
    .unwrap();
    let mut items = Vec::new();
    for object in &objects {
        items.push(for_this_server(&client, object).await);
    }
    let in_tenant: Vec<String> = items
        .iter()
        .filter(|o| {
            o["metadata"]["namespace"] == TENANT
                || (o["kind"] == "Namespace" && o["metadata"]["name"] == TENANT)
        })
        .map(|o| format!("{} {}", o["kind"].as_str().unwrap(), o["metadata"]["name"]))
        .collect();
    assert_eq!(
        in_tenant,
        [
            "Role \"hostcycle-operator\"",
            "RoleBinding \"hostcycle-operator\""
        ],
        "only the hosts' Role and its binding go into the watched namespace"
    );
    let list = dir.path().join("install.json");
    std::fs::write(
        &list,
        serde_json::to_vec(
            &serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": items }),
        )
        .unwrap(),
    )
    .unwrap();
    let applied = kubectl(&kubeconfig, &["apply", "-f", list.to_str().unwrap()]);
    assert!(
        applied.status.success(),
        "kubectl apply: {}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );

    // The tenant's namespace is as its owner left it; the operator's has its own labels.
    assert_eq!(
        labels_of(&namespaces.get(TENANT).await.unwrap()),
        tenant_labels,
        "the install changed the labels of the watched namespace"
    );
    let own = labels_of(&namespaces.get(OPERATOR_NS).await.unwrap());
    assert_eq!(
        own.get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );

    // The operator's ServiceAccount and its token are in its own namespace only.
    assert!(
        accounts
            .get_opt("hostcycle-operator")
            .await
            .unwrap()
            .is_none(),
        "a ServiceAccount hostcycle-operator in {TENANT}"
    );
    let operator_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NS);
    let token = wait_until(
        "the operator's ServiceAccount token",
        Duration::from_secs(60),
        || {
            let operator_accounts = operator_accounts.clone();
            async move {
                let account = operator_accounts
                    .get_opt("hostcycle-operator")
                    .await
                    .ok()??;
                account.secrets?.first()?.name.clone()
            }
        },
    )
    .await
    .unwrap();

    let cluster_power = |token: &str| {
        vec![
            action("delete", "nodes", None),
            action("patch", "nodes", None),
            action("create", "pods/eviction", Some("kube-system")),
            action("delete", "pods", Some("kube-system")),
            action("get", "secrets", Some(OPERATOR_NS)).named(token),
            action("list", "secrets", Some(OPERATOR_NS)),
            action("create", "serviceaccounts/token", Some(OPERATOR_NS))
                .named("hostcycle-operator"),
            action("impersonate", "serviceaccounts", Some(OPERATOR_NS)).named("hostcycle-operator"),
            action("create", "pods", Some(OPERATOR_NS)),
            action("get", "secrets", Some("default")),
        ]
    };
    // Every identity a tenant with `edit` has or can run a pod as.
    let mut tenants = vec![editor.clone()];
    for account in accounts.list(&ListParams::default()).await.unwrap() {
        tenants.push(Who::Account(TENANT.into(), account.metadata.name.unwrap()));
    }
    let mut granted = Vec::new();
    for who in &tenants {
        for action in cluster_power(&token) {
            if allowed(&client, who, &action).await {
                granted.push(format!("{} may {}", who.name(), action.describe()));
            }
        }
    }
    assert!(
        granted.is_empty(),
        "tenants of {TENANT} hold the operator's power:\n  {}",
        granted.join("\n  ")
    );
    // Not vacuous: the editor does hold `edit` in its namespace …
    for action in [
        action("create", "pods", Some(TENANT)),
        action("impersonate", "serviceaccounts", Some(TENANT)),
        action("get", "secrets", Some(TENANT)),
    ] {
        assert!(
            allowed(&client, &editor, &action).await,
            "the editor may {}",
            action.describe()
        );
    }
    // … and the operator's ServiceAccount holds what its controllers need: Nodes and
    // evictions cluster-wide (queue, remediation), Secrets of the watched namespace only.
    let operator = Who::Account(OPERATOR_NS.into(), "hostcycle-operator".into());
    for (action, expected) in [
        (action("delete", "nodes", None), true),
        (action("create", "pods/eviction", Some("kube-system")), true),
        (action("get", "secrets", Some(TENANT)), true),
        (action("get", "secrets", Some("default")), false),
    ] {
        assert_eq!(
            allowed(&client, &operator, &action).await,
            expected,
            "the operator may {}",
            action.describe()
        );
    }

    // A pod in the tenant's namespace naming the operator's ServiceAccount is refused: there
    // is no such account there. The same pod with the default account is created.
    let pod = |account: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": format!("probe-{account}"), "namespace": TENANT },
            "spec": {
                "serviceAccountName": account,
                "containers": [{ "name": "c", "image": "example.invalid/probe" }],
            },
        })
    };
    for (account, created) in [("hostcycle-operator", false), ("default", true)] {
        let file = dir.path().join(format!("pod-{account}.json"));
        std::fs::write(&file, serde_json::to_vec(&pod(account)).unwrap()).unwrap();
        let run = kubectl(
            &kubeconfig,
            &["--as", EDITOR, "create", "-f", file.to_str().unwrap()],
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            run.status.success(),
            created,
            "the editor creating a pod as ServiceAccount {account}: {stderr}"
        );
        if !created {
            assert!(
                stderr.contains("not found") && stderr.contains("hostcycle-operator"),
                "{stderr}"
            );
        }
    }
}

impl Action {
    fn in_group(mut self, group: &'static str) -> Action {
        self.group = group;
        self
    }
}

/// The reboot queue's roles, as the install ships them: a queue user (bound to
/// `hostcycle-queue-user`) queues, lists and cancels reboots with the CLI — and can change
/// nothing about *how* nodes reboot: not the RebootQueue, not the operator's command sets
/// (ConfigMap `hostcycle-reboot-commands` in the operator's namespace), not entries' status.
/// A viewer reads and writes nothing. `add` no longer writes the RebootQueue (older versions
/// patched its `next-index` annotation, which needed a patch of its whole spec), and still
/// hands out indices past the annotation an older version left.
#[tokio::test]
async fn a_queue_user_queues_reboots_but_cannot_change_what_runs() {
    const USERS_NS: &str = "default";
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();

    // The queue's roles from the shipped install.
    let objects: Vec<Value> = serde_saphyr::from_multiple(&read_deploy_file(OPERATOR_FILE))
        .expect("deploy/operator.yaml parses as YAML");
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "ClusterRole"
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("hostcycle-queue-"))
        })
        .collect();
    let names: Vec<&str> = roles
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "hostcycle-queue-viewer",
        "hostcycle-queue-user",
        "hostcycle-queue-admin",
    ] {
        assert!(names.contains(&wanted), "{wanted} shipped: {names:?}");
    }
    for role in roles {
        create_as_is(&client, role).await;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), USERS_NS);
    for (account, role) in [
        ("queue-user", "hostcycle-queue-user"),
        ("queue-viewer", "hostcycle-queue-viewer"),
        ("queue-admin", "hostcycle-queue-admin"),
    ] {
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": account } })).unwrap();
        accounts.create(&PostParams::default(), &sa).await.unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": { "name": account },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": USERS_NS }],
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    let user = Who::Account(USERS_NS.into(), "queue-user".into());
    let viewer = Who::Account(USERS_NS.into(), "queue-viewer".into());
    let admin = Who::Account(USERS_NS.into(), "queue-admin".into());
    let hc = |verb, resource| action(verb, resource, None).in_group("hostcycle.io");
    // The user and admin roles are aggregated by kube-controller-manager.
    for (who, what) in [(&user, "create"), (&admin, "update")] {
        wait_until(
            &format!("the aggregated role of {who:?} to allow {what} on rebootqueueentries"),
            Duration::from_secs(60),
            || {
                let (client, who) = (client.clone(), who.clone());
                let act = hc(what, "rebootqueueentries");
                async move { allowed(&client, &who, &act).await.then_some(()) }
            },
        )
        .await
        .unwrap();
    }

    let commands_config_map =
        action("update", "configmaps", Some(OPERATOR_NS)).named("hostcycle-reboot-commands");
    #[rustfmt::skip]
    let cases: Vec<(&Who, Action, bool)> = vec![
        (&user, hc("create", "rebootqueueentries"), true),
        (&user, hc("patch", "rebootqueueentries"), true),
        (&user, hc("list", "rebootqueueentries"), true),
        (&user, hc("watch", "rebootqueueentries"), true),
        (&user, hc("get", "rebootqueues"), true),
        (&user, action("list", "nodes", None), true),
        // What runs, and how: never a queue user's to choose.
        (&user, hc("patch", "rebootqueues"), false),
        (&user, hc("update", "rebootqueues"), false),
        (&user, hc("create", "rebootqueues"), false),
        (&user, hc("delete", "rebootqueues"), false),
        (&user, hc("patch", "rebootqueueentries/status"), false),
        (&user, hc("delete", "rebootqueueentries"), false),
        (&user, commands_config_map.clone(), false),
        (&user, action("patch", "configmaps", Some(OPERATOR_NS)), false),
        (&user, action("create", "configmaps", Some(OPERATOR_NS)), false),
        (&user, action("get", "secrets", Some(OPERATOR_NS)), false),
        (&user, action("create", "pods", Some(OPERATOR_NS)), false),
        (&user, action("patch", "nodes", None), false),
        (&viewer, hc("list", "rebootqueueentries"), true),
        (&viewer, hc("create", "rebootqueueentries"), false),
        (&viewer, hc("patch", "rebootqueueentries"), false),
        (&admin, hc("patch", "rebootqueues"), true),
        (&admin, hc("patch", "rebootqueueentries/status"), true),
        // Not even the queue's administrator writes the operator's command sets: they are
        // the operator's namespace's administrators' (the command runs as the operator).
        (&admin, commands_config_map, false),
    ];
    let mut wrong = Vec::new();
    for (who, act, want) in &cases {
        if allowed(&client, who, act).await != *want {
            wrong.push(format!(
                "{who:?} {} {}",
                if *want { "cannot" } else { "can" },
                act.describe()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // The CLI, as the queue user: add, list, cancel. The RebootQueue an older version left
    // (with its `next-index` annotation) is read, never written.
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["worker-1", "worker-2"] {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "status": { "addresses": [{ "type": "InternalIP", "address": "192.0.2.1" }] },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let old: RebootQueue = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "default", "annotations": { "hostcycle.io/next-index": "41" } },
        "spec": {},
    }))
    .unwrap();
    let old = queues.create(&PostParams::default(), &old).await.unwrap();
    let as_user = cluster
        .service_account_kubeconfig(USERS_NS, "queue-user")
        .await
        .unwrap();
    let as_viewer = cluster
        .service_account_kubeconfig(USERS_NS, "queue-viewer")
        .await
        .unwrap();
    let rq = |kubeconfig: &Path, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
            .args(["reboot-queue", "--kubeconfig"])
            .arg(kubeconfig)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, said) = rq(&as_user, &["add", "worker-1"]);
    assert!(ok, "rq add as the queue user: {said}");
    let (ok, said) = rq(&as_user, &["add", "worker-2"]);
    assert!(ok, "rq add as the queue user: {said}");
    let entries: Api<RebootQueueEntry> = Api::all(client.clone());
    let mut indices: Vec<(String, u64)> = entries
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.spec.node.clone(), e.spec.index))
        .collect();
    indices.sort();
    assert_eq!(
        indices,
        [("worker-1".to_string(), 41), ("worker-2".to_string(), 42)],
        "indices continue past the annotation an older version left"
    );
    let (ok, said) = rq(&as_user, &["list"]);
    assert!(ok && said.contains("worker-1"), "rq list: {said}");
    let (ok, said) = rq(&as_user, &["cancel", "worker-1"]);
    assert!(ok, "rq cancel as the queue user: {said}");
    let now = queues.get("default").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, old.metadata.resource_version,
        "the queue user's add and cancel wrote nothing on the RebootQueue"
    );
    // Entries leave; new ones still get higher indices, from what the controller records.
    let status = serde_json::json!({ "status": { "highestIndex": 42 } });
    queues
        .patch_status(
            "default",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    for (node, _) in &indices {
        let name = RebootQueueEntry::name_for_index(if node == "worker-1" { 41 } else { 42 });
        entries.delete(&name, &Default::default()).await.unwrap();
    }
    wait_until(
        "the queue's entries to be deleted",
        Duration::from_secs(20),
        || {
            let entries = entries.clone();
            async move {
                entries
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let (ok, said) = rq(&as_user, &["add", "worker-2"]);
    assert!(ok, "rq add after the queue emptied: {said}");
    let again = entries.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        again.iter().map(|e| e.spec.index).collect::<Vec<_>>(),
        [43],
        "an index is never handed out twice"
    );

    // A viewer cannot queue.
    let (ok, said) = rq(&as_viewer, &["add", "worker-1"]);
    assert!(!ok, "rq add as a viewer must fail: {said}");
    assert!(
        said.contains("forbidden") || said.contains("Forbidden"),
        "{said}"
    );
}
