//! The admission webhook end to end: the real `hostcycle webhook` binary on loopback with a
//! certificate from a test CA, registered with the real API server through
//! `clientConfig.url` (admissionregistration version by discovery), and real identities:
//! impersonated users and groups, ServiceAccount tokens, the operator's own ServiceAccount
//! with its shipped RBAC — and, in the last test, the running operator rebooting a host
//! through an enforcing webhook.
//!
//! Each test starts its own control plane, so the cluster-wide webhook configuration touches
//! no other test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hostcycle_api::BareMetalHost;
use hostcycle_operator::rbac::{OPERATOR_NAME, RbacOptions};
use hostcycle_testkit::pki::TestCa;
use hostcycle_testkit::{
    ClusterOptions, LocalCluster, ManagedProcess, client_from_kubeconfig, free_port, wait_until,
};
use hostcycle_webhook::manifests::{
    Endpoint, FailurePolicy, PdbVersion, Registration, WEBHOOK_ENTRY_NAME, WebhookInstall,
    register, webhook_objects,
};
use hostcycle_webhook::{ACCEPTED_VALUES, VALIDATE_PATH};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

const NS: &str = "default";
const KEYED: &str = "reboot.metal3.io/maint";
const SUFFIXLESS: &str = "reboot.metal3.io";
const HARD: &str = r#"{"mode":"hard"}"#;
/// The group the impersonated test users are in: RBAC lets it edit hosts.
const EDITORS: &str = "hosts-editors";
/// Generous: the API server may take a while on a loaded machine to see a new configuration.
const PROPAGATION: Duration = Duration::from_secs(60);

/// A `hostcycle webhook` process with its own certificate.
struct Webhook {
    process: ManagedProcess,
    port: u16,
    ca_pem: String,
}

impl Webhook {
    /// Starts the binary on a free loopback port and waits for `/healthz` over TLS.
    async fn start(dir: &Path, log_dir: &Path, name: &str, extra: &[&str]) -> Webhook {
        let ca = TestCa::new("webhook-e2e-ca").unwrap();
        let files = ca.write_server_cert(dir, name, &["127.0.0.1"]).unwrap();
        let port = free_port().unwrap();
        // Not the default 0.0.0.0:9440: tests run side by side.
        let probe_port = free_port().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
        cmd.args(["webhook", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--probe-addr", &format!("127.0.0.1:{probe_port}")])
            .arg("--tls-cert-file")
            .arg(&files.cert)
            .arg("--tls-key-file")
            .arg(&files.key)
            .args(extra)
            .env("RUST_LOG", "info");
        let mut process = ManagedProcess::spawn(name, cmd, log_dir).unwrap();
        let http = hostcycle_testkit::http::client(Some(&ca.cert_pem())).unwrap();
        let url = format!("https://127.0.0.1:{port}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            process.ensure_running().unwrap();
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: /healthz on port {port} did not answer within 30 s; log {}",
                process.log_path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Webhook {
            process,
            port,
            ca_pem: ca.cert_pem(),
        }
    }

    fn registration(&self, failure_policy: FailurePolicy) -> Registration {
        Registration {
            // Not the install's name: the test also dry-runs the install's configuration.
            name: "hostcycle-webhook-e2e".to_string(),
            endpoint: Endpoint::Url(format!("https://127.0.0.1:{}{VALIDATE_PATH}", self.port)),
            ca_bundle_pem: Some(self.ca_pem.clone()),
            failure_policy,
            annotations: Default::default(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }
}

fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube_client=off")
        .with_test_writer()
        .try_init();
}

fn host(name: &str, annotations: &[(&str, &str)], online: bool) -> BareMetalHost {
    let mut bmh = BareMetalHost::externally_provisioned(
        name,
        "redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
        "bmc-credentials",
    );
    bmh.spec.online = online;
    if !annotations.is_empty() {
        bmh.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    bmh
}

async fn create(client: &Client, bmh: &BareMetalHost) -> Result<BareMetalHost, kube::Error> {
    Api::<BareMetalHost>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), bmh)
        .await
}

async fn merge(
    client: &Client,
    name: &str,
    patch: serde_json::Value,
) -> Result<BareMetalHost, kube::Error> {
    Api::<BareMetalHost>::namespaced(client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

async fn annotate(
    client: &Client,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<BareMetalHost, kube::Error> {
    merge(
        client,
        name,
        json!({"metadata": {"annotations": {key: value}}}),
    )
    .await
}

/// The API server's refusal: (HTTP code, message).
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// Asserts the webhook denied `result` with `code`, and returns its message (without the
/// API server's prefix).
fn denied<T: std::fmt::Debug>(result: Result<T, kube::Error>, code: u16) -> String {
    let (got, message) = refusal(result);
    let prefix = format!("admission webhook \"{WEBHOOK_ENTRY_NAME}\" denied the request: ");
    assert!(
        message.starts_with(&prefix),
        "not the webhook's denial: {message}"
    );
    assert_eq!(got, code, "{message}");
    message[prefix.len()..].to_string()
}

/// A client acting as `user` in `groups` (impersonated by the admin).
async fn impersonating(cluster: &LocalCluster, user: &str, groups: &[&str]) -> Client {
    let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig_path()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(config).unwrap()
}

/// Lets `EDITORS` and the given ServiceAccounts edit hosts (no more: the webhook decides who
/// may request power changes).
async fn grant_host_editing(client: &Client, service_accounts: &[(&str, &str)]) {
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "bmh-editor"},
        "rules": [{
            "apiGroups": ["metal3.io"],
            "resources": ["baremetalhosts"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }],
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let mut subjects =
        vec![json!({"kind": "Group", "name": EDITORS, "apiGroup": "rbac.authorization.k8s.io"})];
    subjects.extend(
        service_accounts
            .iter()
            .map(|(ns, name)| json!({"kind": "ServiceAccount", "name": name, "namespace": ns})),
    );
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bmh-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bmh-editor"},
        "subjects": subjects,
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Creates `object` with `dryRun: All`: the API server validates and admits it, stores nothing.
async fn dry_run_create(client: &Client, object: serde_json::Value) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let api_version = object["apiVersion"].as_str().unwrap().to_string();
    let kind = object["kind"].as_str().unwrap().to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let api: Api<DynamicObject> = match &object.metadata.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry_run, &object)
        .await
        .unwrap_or_else(|e| panic!("{kind} {:?} is refused: {e}", object.metadata.name));
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn create_service_account(client: &Client, namespace: &str, name: &str) {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

async fn service_account_client(cluster: &LocalCluster, namespace: &str, name: &str) -> Client {
    let path: PathBuf = cluster
        .service_account_kubeconfig(namespace, name)
        .await
        .unwrap();
    client_from_kubeconfig(&path).await.unwrap()
}

/// Registers the webhook and waits until the API server calls it: a dry-run create by
/// `probe` of a host `probe_host` makes is refused by the webhook. Returns how long that took.
async fn register_and_wait(
    admin: &Client,
    webhook: &Webhook,
    failure_policy: FailurePolicy,
    probe: &Client,
    probe_host: BareMetalHost,
) -> Duration {
    let started = Instant::now();
    let version = register(admin, &webhook.registration(failure_policy))
        .await
        .unwrap();
    assert_eq!(
        version, "admissionregistration.k8s.io/v1",
        "Kubernetes 1.20 serves v1"
    );
    let hosts = Api::<BareMetalHost>::namespaced(probe.clone(), NS);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let result = wait_until(
        "the API server to call the webhook (a dry-run create it refuses)",
        PROPAGATION,
        || {
            let (hosts, dry_run, probe_host) = (hosts.clone(), dry_run.clone(), probe_host.clone());
            async move {
                match hosts.create(&dry_run, &probe_host).await {
                    Err(kube::Error::Api(s)) if s.message.contains(WEBHOOK_ENTRY_NAME) => Some(()),
                    _ => None,
                }
            }
        },
    )
    .await;
    if let Err(e) = result {
        panic!("{e}; webhook log:\n{}", webhook.log());
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_refuses_unusable_reboot_values_and_fails_as_configured() {
    init_logging();
    let started = Instant::now();
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let admin = cluster.client();
    // Set before the webhook exists: an unusable value the controller tolerates.
    create(&admin, &host("legacy", &[(KEYED, "garbage")], true))
        .await
        .unwrap();

    let mut webhook =
        Webhook::start(cluster.dir(), &cluster.log_dir(), "hostcycle-webhook", &[]).await;
    // Fail, so a webhook that is never called could not pass for one that accepts.
    let propagation = register_and_wait(
        &admin,
        &webhook,
        FailurePolicy::Fail,
        &admin,
        host("probe", &[(KEYED, "probe")], true),
    )
    .await;
    let registered = started.elapsed();
    println!(
        "webhook e2e (values): the API server called the webhook {propagation:?} after registration"
    );

    // Accepted: what metal3 and the controller both read as a request.
    for (i, value) in [
        "",
        "null",
        "{}",
        HARD,
        r#"{"mode":"soft"}"#,
        r#"{"mode":""}"#,
        r#"{"Mode":"hard","force":true}"#,
    ]
    .into_iter()
    .enumerate()
    {
        create(
            &admin,
            &host(
                &format!("ok-{i}"),
                &[(SUFFIXLESS, value), (KEYED, value)],
                true,
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{value:?} should be accepted on create: {e}"));
        annotate(
            &admin,
            "legacy",
            &format!("reboot.metal3.io/k{i}"),
            Some(value),
        )
        .await
        .unwrap_or_else(|e| panic!("{value:?} should be accepted on update: {e}"));
    }

    // Refused, on create and on update, saying why and what is accepted.
    for (i, (value, why)) in [
        ("hard", "value is not JSON"),
        (r#""hard""#, "value is not a JSON object"),
        (
            r#"{"mode":"HARD"}"#,
            r#"unknown mode "HARD" (expected "soft" or "hard")"#,
        ),
        (r#"{"mode":5}"#, "mode is not a string"),
        (r#"{"force":"yes"}"#, r#""force" is not true or false"#),
        (" ", "value is only whitespace"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad-{i}");
        let message = denied(
            create(&admin, &host(&name, &[(KEYED, value)], true)).await,
            400,
        );
        assert_eq!(
            message,
            format!(
                "invalid reboot annotation value on BareMetalHost {NS}/{name}: {KEYED}: {why} ({ACCEPTED_VALUES})"
            ),
            "{value:?}"
        );
        let message = denied(annotate(&admin, "ok-0", SUFFIXLESS, Some(value)).await, 400);
        assert!(
            message.starts_with(&format!(
                "invalid reboot annotation value on BareMetalHost {NS}/ok-0: {SUFFIXLESS}: {why}"
            )),
            "{message}"
        );
    }
    assert!(
        Api::<BareMetalHost>::namespaced(admin.clone(), NS)
            .get_opt("bad-0")
            .await
            .unwrap()
            .is_none()
    );

    // An unusable value from before the webhook does not block other edits (the operator's
    // annotation removals included); changing it to another unusable one is refused.
    merge(
        &admin,
        "legacy",
        json!({"metadata": {"labels": {"rack": "r1"}}}),
    )
    .await
    .expect("an edit leaving the old value alone is allowed");
    denied(annotate(&admin, "legacy", KEYED, Some("worse")).await, 400);
    annotate(&admin, "legacy", KEYED, None)
        .await
        .expect("removing an unusable value is allowed");

    // failurePolicy Fail: with the webhook down, every host edit is refused — an annotation
    // the operator would write included.
    webhook.process.stop();
    let (code, message) = refusal(annotate(&admin, "ok-1", SUFFIXLESS, Some(HARD)).await);
    assert_eq!(code, 500, "{message}");
    assert!(
        message.contains(&format!("failed calling webhook \"{WEBHOOK_ENTRY_NAME}\"")),
        "{message}"
    );

    // failurePolicy Ignore: edits go through unchecked while the webhook is down — an
    // unusable value included.
    register(&admin, &webhook.registration(FailurePolicy::Ignore))
        .await
        .unwrap();
    wait_until(
        "the API server to apply failurePolicy Ignore with the webhook down",
        PROPAGATION,
        || async {
            annotate(&admin, "ok-1", SUFFIXLESS, Some("unchecked"))
                .await
                .ok()
        },
    )
    .await
    .unwrap();
    println!(
        "webhook e2e (values): registered and called after {registered:?}, done after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_limits_power_requests_to_listed_identities() {
    init_logging();
    let started = Instant::now();
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let admin = cluster.client();
    create_namespace(&admin, "tenant").await;
    create_service_account(&admin, "tenant", "rebooter").await;
    create_service_account(&admin, "tenant", "other").await;
    grant_host_editing(&admin, &[("tenant", "rebooter"), ("tenant", "other")]).await;
    // The operator's ServiceAccount with exactly the RBAC it ships, where `deploy/` puts it.
    create_namespace(&admin, "hostcycle-system").await;
    common::install_rbac(&admin, &RbacOptions::cluster_wide("hostcycle-system")).await;

    let webhook = Webhook::start(
        cluster.dir(),
        &cluster.log_dir(),
        "hostcycle-webhook",
        &[
            "--allow-user=alice",
            "--allow-group=power-admins",
            "--allow-service-account=tenant:rebooter",
        ],
    )
    .await;
    let mallory = impersonating(&cluster, "mallory", &[EDITORS]).await;
    let propagation = register_and_wait(
        &admin,
        &webhook,
        FailurePolicy::Fail,
        &mallory,
        host("probe", &[(KEYED, "")], true),
    )
    .await;
    let registered = started.elapsed();
    println!(
        "webhook e2e (identities): the API server called the webhook {propagation:?} after registration"
    );
    let alice = impersonating(&cluster, "alice", &[EDITORS]).await;
    let bob = impersonating(&cluster, "bob", &[EDITORS, "power-admins"]).await;
    let rebooter = service_account_client(&cluster, "tenant", "rebooter").await;
    let other = service_account_client(&cluster, "tenant", "other").await;
    let operator = service_account_client(&cluster, "hostcycle-system", OPERATOR_NAME).await;

    // Who may is named by its flags, never by the identities (the webhook's log has them).
    let allowed_to = format!(
        "adding, removing or changing reboot.metal3.io annotations and setting spec.online to \
         false are allowed only to {}",
        hostcycle_webhook::decide::ALLOWED_BY_FLAGS
    );
    let refused = |user: &str, what: &str, name: &str| {
        format!("user \"{user}\" may not {what} on BareMetalHost {NS}/{name}: {allowed_to}")
    };

    // With an allow-list, setting spec.bmc on a create is restricted by default (issue 25
    // point 5): otherwise deleting and re-creating a host would change its BMC, which an
    // update may not. An unlisted user may still create a host without a BMC.
    let message = denied(create(&mallory, &host("h1", &[], true)).await, 403);
    assert!(
        message.starts_with("user \"mallory\" may not set spec.bmc.address"),
        "{message}"
    );
    assert!(
        message.contains(&format!("BareMetalHost {NS}/h1: ")),
        "{message}"
    );
    assert!(
        message.contains("setting or changing spec.bmc"),
        "{message}"
    );
    let mut no_bmc = host("enrolling", &[], true);
    no_bmc.spec.bmc = None;
    create(&mallory, &no_bmc)
        .await
        .expect("a host without a BMC may be created by anyone RBAC lets");

    // An unlisted user may edit hosts, but not request power changes.
    create(&alice, &host("h1", &[], true))
        .await
        .expect("a listed user may create a host with a BMC");
    merge(
        &mallory,
        "h1",
        json!({"metadata": {"labels": {"rack": "r1"}}}),
    )
    .await
    .unwrap();
    let message = denied(annotate(&mallory, "h1", KEYED, Some("")).await, 403);
    assert_eq!(message, refused("mallory", &format!("add {KEYED}"), "h1"));
    let message = denied(
        merge(&mallory, "h1", json!({"spec": {"online": false}})).await,
        403,
    );
    assert_eq!(
        message,
        refused("mallory", "set spec.online to false", "h1")
    );
    let mut offline = host("h2", &[], false);
    offline.spec.bmc = None;
    let message = denied(create(&mallory, &offline).await, 403);
    assert_eq!(
        message,
        refused("mallory", "set spec.online to false", "h2")
    );

    // A listed user may; an unlisted one may neither remove nor change the request.
    annotate(&alice, "h1", KEYED, Some(""))
        .await
        .expect("alice is listed");
    let message = denied(annotate(&mallory, "h1", KEYED, None).await, 403);
    assert_eq!(
        message,
        refused("mallory", &format!("remove {KEYED}"), "h1")
    );
    let message = denied(annotate(&mallory, "h1", KEYED, Some(HARD)).await, 403);
    assert_eq!(
        message,
        refused("mallory", &format!("change {KEYED}"), "h1")
    );
    merge(
        &mallory,
        "h1",
        json!({"metadata": {"labels": {"rack": "r2"}}}),
    )
    .await
    .expect("other edits of a host with a request in place are allowed");
    annotate(&alice, "h1", KEYED, None).await.unwrap();

    // A listed group's member and a listed ServiceAccount may; another ServiceAccount may not.
    annotate(&bob, "h1", SUFFIXLESS, Some(HARD))
        .await
        .expect("bob is in power-admins");
    annotate(&rebooter, "h1", SUFFIXLESS, None)
        .await
        .expect("tenant:rebooter is listed");
    annotate(&rebooter, "h1", "reboot.metal3.io/tenant", Some(""))
        .await
        .unwrap();
    let message = denied(
        annotate(&other, "h1", "reboot.metal3.io/tenant", None).await,
        403,
    );
    assert_eq!(
        message,
        refused(
            "system:serviceaccount:tenant:other",
            "remove reboot.metal3.io/tenant",
            "h1"
        )
    );

    // The operator's own ServiceAccount is allowed by default: the reboot queue's request
    // (annotation plus its marker) and the host controller's removal.
    merge(
        &operator,
        "h1",
        json!({"metadata": {"annotations": {
            SUFFIXLESS: "",
            "hostcycle.io/reboot-queue-request": "e2e"
        }}}),
    )
    .await
    .expect("the operator's ServiceAccount is allowed without being listed");
    merge(
        &operator,
        "h1",
        json!({"metadata": {"annotations": {
            SUFFIXLESS: null,
            "reboot.metal3.io/tenant": null
        }}}),
    )
    .await
    .unwrap();

    // Values are checked for listed identities too; a listed user may power a host off.
    let message = denied(annotate(&alice, "h1", KEYED, Some("hard")).await, 400);
    assert!(message.contains("value is not JSON"), "{message}");
    merge(&alice, "h1", json!({"spec": {"online": false}}))
        .await
        .unwrap();
    create(&alice, &host("h3", &[(KEYED, HARD)], false))
        .await
        .unwrap();

    // The host's BMC and metal3's paused / detached annotations are guarded too: an
    // unlisted user may neither point the host at another BMC nor pause it; a listed one may.
    // "setting or changing": with an allow-list, setting spec.bmc on a create is restricted
    // too (by default).
    let control = format!(
        "setting or changing spec.bmc and adding, removing or changing the \
         baremetalhost.metal3.io/paused and baremetalhost.metal3.io/detached annotations are \
         allowed only to {}",
        hostcycle_webhook::decide::ALLOWED_BY_FLAGS
    );
    let message = denied(
        merge(
            &mallory,
            "h1",
            json!({"spec": {"bmc": {"address": "redfish+http://127.0.0.1:2/redfish/v1/Systems/1"}}}),
        )
        .await,
        403,
    );
    assert_eq!(
        message,
        format!(
            "user \"mallory\" may not change spec.bmc.address on BareMetalHost {NS}/h1: {control}"
        )
    );
    let message = denied(
        merge(
            &mallory,
            "h1",
            json!({"spec": {"bmc": {"credentialsName": "other-credentials"}}}),
        )
        .await,
        403,
    );
    assert!(
        message.starts_with("user \"mallory\" may not change spec.bmc.credentialsName on"),
        "{message}"
    );
    let message = denied(
        annotate(&mallory, "h1", "baremetalhost.metal3.io/paused", Some("")).await,
        403,
    );
    assert_eq!(
        message,
        format!(
            "user \"mallory\" may not add baremetalhost.metal3.io/paused on BareMetalHost \
             {NS}/h1: {control}"
        )
    );
    annotate(&alice, "h1", "baremetalhost.metal3.io/detached", Some(""))
        .await
        .expect("alice may detach a host");
    let message = denied(
        annotate(&mallory, "h1", "baremetalhost.metal3.io/detached", None).await,
        403,
    );
    assert!(
        message.contains("may not remove baremetalhost.metal3.io/detached"),
        "{message}"
    );
    annotate(&bob, "h1", "baremetalhost.metal3.io/detached", None)
        .await
        .expect("power-admins may reattach it");
    merge(
        &rebooter,
        "h1",
        json!({"spec": {"bmc": {"disableCertificateVerification": true}}}),
    )
    .await
    .expect("a listed ServiceAccount may change the BMC");

    // So is the host's consumerRef (which Machine, so which node's remediation, the host
    // belongs to): an unlisted user may neither give the host a consumer nor change or remove
    // it; a listed one may.
    let consumer = format!(
        "adding, changing or removing spec.consumerRef are allowed only to {}",
        hostcycle_webhook::decide::ALLOWED_BY_FLAGS
    );
    let metal3_machine = |name: &str| {
        json!({"spec": {"consumerRef": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "Metal3Machine", "name": name, "namespace": NS,
        }}})
    };
    let message = denied(merge(&mallory, "h1", metal3_machine("m3m-h1")).await, 403);
    assert_eq!(
        message,
        format!(
            "user \"mallory\" may not add spec.consumerRef on BareMetalHost {NS}/h1: {consumer}"
        )
    );
    merge(&alice, "h1", metal3_machine("m3m-h1"))
        .await
        .expect("alice may give the host its consumer");
    let message = denied(
        merge(&mallory, "h1", metal3_machine("m3m-other")).await,
        403,
    );
    assert_eq!(
        message,
        format!(
            "user \"mallory\" may not change spec.consumerRef.name on BareMetalHost {NS}/h1: \
             {consumer}"
        )
    );
    let message = denied(
        merge(&mallory, "h1", json!({"spec": {"consumerRef": null}})).await,
        403,
    );
    assert!(
        message.starts_with("user \"mallory\" may not remove spec.consumerRef on"),
        "{message}"
    );
    merge(
        &mallory,
        "h1",
        json!({"metadata": {"labels": {"rack": "r1"}}}),
    )
    .await
    .expect("other edits of a consumed host stay RBAC's business");
    merge(&bob, "h1", json!({"spec": {"consumerRef": null}}))
        .await
        .expect("power-admins may release the host");

    // The install objects `hostcycle webhook manifests` prints are accepted as they are
    // (the PodDisruptionBudget as policy/v1beta1: this control plane is Kubernetes 1.20).
    let mut install = WebhookInstall::new("hostcycle-system");
    install.allow_users = vec!["alice".to_string()];
    install.ca_bundle_pem = Some(webhook.ca_pem.clone());
    install.pdb_version = PdbVersion::V1beta1;
    let objects = webhook_objects(&install).unwrap();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ValidatingWebhookConfiguration"
        ]
    );
    for object in objects {
        dry_run_create(&admin, object).await;
    }

    let log = webhook.log();
    assert!(
        log.contains("power request allowed") && log.contains("alice"),
        "allowed power requests are logged with the user:\n{log}"
    );
    println!(
        "webhook e2e (identities): registered and called after {registered:?}, done after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_reboots_a_host_through_an_enforcing_webhook() {
    let started = Instant::now();
    let lab = common::Lab::start(&["wh-0"]).await;
    let admin = lab.client.clone();
    grant_host_editing(&admin, &[]).await;
    // The lab's operator runs as default:hostcycle-operator.
    let webhook = Webhook::start(
        lab.cluster.dir(),
        &lab.cluster.log_dir(),
        "hostcycle-webhook",
        &[
            "--allow-user=alice",
            &format!("--operator-service-account={NS}:{OPERATOR_NAME}"),
        ],
    )
    .await;
    let mallory = impersonating(&lab.cluster, "mallory", &[EDITORS]).await;
    register_and_wait(
        &admin,
        &webhook,
        FailurePolicy::Fail,
        &mallory,
        host("probe", &[(KEYED, "")], true),
    )
    .await;
    denied(
        annotate(&mallory, "wh-0", SUFFIXLESS, Some(HARD)).await,
        403,
    );

    let alice = impersonating(&lab.cluster, "alice", &[EDITORS]).await;
    annotate(&alice, "wh-0", SUFFIXLESS, Some(HARD))
        .await
        .unwrap();
    // The host controller removes the annotation once the host is off: through the webhook,
    // as the operator's ServiceAccount.
    lab.wait_reboot_done("wh-0").await;
    let history = lab.settled_history("wh-0").await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "{history:?}"
    );
    let log = webhook.log();
    assert!(
        log.lines().any(|l| l.contains("power request allowed")
            && l.contains(&format!("system:serviceaccount:{NS}:{OPERATOR_NAME}"))
            && l.contains("remove reboot.metal3.io")),
        "the operator's removal went through the webhook:\n{log}"
    );
    println!("webhook e2e (operator reboot): {:?}", started.elapsed());
}
