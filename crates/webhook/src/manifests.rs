//! The webhook's optional install objects (`hostcycle webhook manifests`): a Service, a
//! Deployment running `hostcycle webhook` with its certificate Secret mounted, a
//! PodDisruptionBudget, a NetworkPolicy, the ValidatingWebhookConfiguration, and optionally
//! cert-manager's Issuer and Certificate — and [`register`], which applies a configuration
//! with the admissionregistration version the API server serves.
//!
//! These objects are not part of `deploy/` (the webhook is off by default); they sit next to
//! it in the operator's namespace and reuse its image and locked-down pod settings.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

use hostcycle_operator::deploy::tcp_port;

use crate::decide::{HOST_GROUP, HOST_RESOURCE};
use crate::policy::ServiceAccountName;
use crate::{VALIDATE_PATH, policy};

/// Name of the Deployment, Service, ValidatingWebhookConfiguration and cert-manager objects.
pub const WEBHOOK_NAME: &str = "hostcycle-webhook";
/// Name of the webhook inside the configuration (must be a qualified name).
pub const WEBHOOK_ENTRY_NAME: &str = "baremetalhosts.webhook.hostcycle.io";
/// The Secret holding `tls.crt` and `tls.key` (a `kubernetes.io/tls` Secret, as cert-manager
/// writes it).
pub const TLS_SECRET: &str = "hostcycle-webhook-tls";
/// Where the Secret is mounted.
pub const TLS_DIR: &str = "/etc/hostcycle/webhook-tls";
/// The container's port (`hostcycle webhook --listen`).
pub const PORT: i32 = 9443;
pub const PORT_NAME: &str = "webhook";
/// The container's probe port (`hostcycle webhook --probe-addr`), plain HTTP.
pub const PROBE_PORT: i32 = 9440;
pub const PROBE_PORT_NAME: &str = "probes";
/// How long the API server waits for an answer: a reboot annotation edit waits at most this
/// long when the webhook hangs.
pub const TIMEOUT_SECONDS: i32 = 5;
/// Replicas: with `failurePolicy: Fail` an outage of every replica blocks host edits.
pub const REPLICAS: i32 = 2;
const ADMISSIONREGISTRATION: &str = "admissionregistration.k8s.io";

/// What the API server does when it cannot get an answer (webhook down, timeout, bad TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Refuse the host's create or update: the checks cannot be bypassed, but while the
    /// webhook is down nobody can edit hosts — the operator's own annotation writes included.
    #[value(name = "Fail")]
    Fail,
    /// Let it through unchecked: host edits never depend on the webhook, but during an
    /// outage the checks can be bypassed.
    #[value(name = "Ignore")]
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }

    /// The default: `Fail` when an allow-list is enforced (a check that is bypassed during an
    /// outage is not a restriction), `Ignore` when only values are checked (the controller
    /// tolerates unusable values anyway, so an outage must not stop reboots).
    pub fn default_for(allow_list: bool) -> Self {
        if allow_list { Self::Fail } else { Self::Ignore }
    }
}

/// The PodDisruptionBudget's API version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PdbVersion {
    /// `policy/v1`, Kubernetes ≥ 1.21.
    #[value(name = "v1")]
    V1,
    /// `policy/v1beta1`, Kubernetes < 1.25.
    #[value(name = "v1beta1")]
    V1beta1,
}

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// In the cluster, through a Service (port 443 of the Service).
    Service { namespace: String, name: String },
    /// A URL, e.g. `https://127.0.0.1:PORT/validate-baremetalhost` for a webhook next to the
    /// API server (tests).
    Url(String),
}

/// A ValidatingWebhookConfiguration for BareMetalHosts.
#[derive(Debug, Clone)]
pub struct Registration {
    pub name: String,
    pub endpoint: Endpoint,
    /// PEM of the CA that signed the webhook's certificate; `None` leaves `caBundle` to be
    /// injected (cert-manager's cainjector).
    pub ca_bundle_pem: Option<String>,
    pub failure_policy: FailurePolicy,
    /// Annotations of the configuration (cert-manager's `inject-ca-from`).
    pub annotations: BTreeMap<String, String>,
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            WEBHOOK_NAME.to_string(),
        ),
        (
            "app.kubernetes.io/part-of".to_string(),
            "hostcycle".to_string(),
        ),
    ])
}

/// The label selecting the webhook's pods.
fn selector() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        WEBHOOK_NAME.to_string(),
    )])
}

fn strings(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

/// The configuration: CREATE and UPDATE of `baremetalhosts.metal3.io` (every version), no
/// side effects, [`TIMEOUT_SECONDS`], reviews in v1 or v1beta1.
pub fn configuration(registration: &Registration) -> ValidatingWebhookConfiguration {
    let client_config = match &registration.endpoint {
        Endpoint::Service { namespace, name } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(VALIDATE_PATH.to_string()),
                port: Some(443),
            }),
            ..Default::default()
        },
        Endpoint::Url(url) => WebhookClientConfig {
            url: Some(url.clone()),
            ..Default::default()
        },
    };
    let client_config = WebhookClientConfig {
        ca_bundle: registration
            .ca_bundle_pem
            .as_ref()
            .map(|pem| ByteString(pem.as_bytes().to_vec())),
        ..client_config
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(registration.name.clone()),
            labels: Some(labels()),
            annotations: (!registration.annotations.is_empty())
                .then(|| registration.annotations.clone()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: WEBHOOK_ENTRY_NAME.to_string(),
            admission_review_versions: vec!["v1".to_string(), "v1beta1".to_string()],
            client_config,
            failure_policy: Some(registration.failure_policy.as_str().to_string()),
            match_policy: Some("Equivalent".to_string()),
            rules: Some(vec![RuleWithOperations {
                api_groups: strings(&[HOST_GROUP]),
                api_versions: strings(&["*"]),
                operations: strings(&["CREATE", "UPDATE"]),
                resources: strings(&[HOST_RESOURCE]),
                scope: Some("Namespaced".to_string()),
            }]),
            side_effects: "None".to_string(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            ..Default::default()
        }]),
    }
}

/// Applies the configuration (server-side apply, field manager `hostcycle-webhook`) with
/// `admissionregistration.k8s.io/v1` where served, else `v1beta1` (Kubernetes < 1.16; the
/// object is written with every field set, so the two versions' different defaults do not
/// matter). Returns the apiVersion used.
pub async fn register(
    client: &kube::Client,
    registration: &Registration,
) -> anyhow::Result<String> {
    let group = kube::discovery::group(client, ADMISSIONREGISTRATION)
        .await
        .context("discovering admissionregistration.k8s.io")?;
    let version = ["v1", "v1beta1"]
        .into_iter()
        .find(|v| group.versions().any(|served| served == *v))
        .context("the API server serves neither admissionregistration.k8s.io/v1 nor v1beta1")?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            ADMISSIONREGISTRATION,
            version,
            "ValidatingWebhookConfiguration",
        ),
        "validatingwebhookconfigurations",
    );
    let mut object = serde_json::to_value(configuration(registration))
        .context("serializing the ValidatingWebhookConfiguration")?;
    object["apiVersion"] = json!(resource.api_version);
    object["kind"] = json!("ValidatingWebhookConfiguration");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    api.patch(
        &registration.name,
        &PatchParams::apply(WEBHOOK_NAME).force(),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| {
        format!(
            "applying ValidatingWebhookConfiguration {} ({})",
            registration.name, resource.api_version
        )
    })?;
    Ok(resource.api_version)
}

/// What `hostcycle webhook manifests` renders.
#[derive(Debug, Clone)]
pub struct WebhookInstall {
    /// Namespace of the Deployment, Service and Secret (the operator's).
    pub namespace: String,
    pub image: String,
    pub allow_users: Vec<String>,
    pub allow_groups: Vec<String>,
    pub allow_service_accounts: Vec<ServiceAccountName>,
    /// The operator's ServiceAccount, allowed by default with an allow-list.
    pub operator_service_account: ServiceAccountName,
    /// `None`: [`FailurePolicy::default_for`].
    pub failure_policy: Option<FailurePolicy>,
    /// PEM of the CA of the webhook's certificate (`caBundle`).
    pub ca_bundle_pem: Option<String>,
    /// Also a cert-manager Issuer and Certificate writing [`TLS_SECRET`], and the cainjector
    /// annotation on the configuration.
    pub cert_manager: bool,
    /// `--restrict-bmc-on-create` (with an allow-list; on unless turned off).
    pub restrict_bmc_on_create: bool,
    /// `--restrict-consumer-ref-on-create` (with an allow-list).
    pub restrict_consumer_ref_on_create: bool,
    pub pdb_version: PdbVersion,
}

impl WebhookInstall {
    /// Values checked only, in `namespace`, with the operator's ServiceAccount there.
    pub fn new(namespace: &str) -> Self {
        WebhookInstall {
            namespace: namespace.to_string(),
            image: hostcycle_operator::deploy::default_image(),
            allow_users: Vec::new(),
            allow_groups: Vec::new(),
            allow_service_accounts: Vec::new(),
            operator_service_account: ServiceAccountName {
                namespace: namespace.to_string(),
                ..policy::operator_service_account()
            },
            failure_policy: None,
            ca_bundle_pem: None,
            cert_manager: false,
            restrict_bmc_on_create: true,
            restrict_consumer_ref_on_create: false,
            pdb_version: PdbVersion::V1,
        }
    }

    pub fn has_allow_list(&self) -> bool {
        !(self.allow_users.is_empty()
            && self.allow_groups.is_empty()
            && self.allow_service_accounts.is_empty())
    }

    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
            .unwrap_or_else(|| FailurePolicy::default_for(self.has_allow_list()))
    }
}

/// The container's arguments: `hostcycle webhook` on [`PORT`] (probes on [`PROBE_PORT`])
/// with the mounted certificate and the allow-list.
pub fn webhook_args(install: &WebhookInstall) -> Vec<String> {
    let mut args = vec![
        "webhook".to_string(),
        format!("--listen=0.0.0.0:{PORT}"),
        format!("--probe-addr=0.0.0.0:{PROBE_PORT}"),
        format!("--tls-cert-file={TLS_DIR}/tls.crt"),
        format!("--tls-key-file={TLS_DIR}/tls.key"),
    ];
    args.extend(
        install
            .allow_users
            .iter()
            .map(|u| format!("--allow-user={u}")),
    );
    args.extend(
        install
            .allow_groups
            .iter()
            .map(|g| format!("--allow-group={g}")),
    );
    args.extend(
        install
            .allow_service_accounts
            .iter()
            .map(|sa| format!("--allow-service-account={sa}")),
    );
    if install.has_allow_list() {
        args.push(format!(
            "--operator-service-account={}",
            install.operator_service_account
        ));
        // Always written out, so the Deployment says which it is.
        args.push(format!(
            "--restrict-bmc-on-create={}",
            install.restrict_bmc_on_create
        ));
        if install.restrict_consumer_ref_on_create {
            args.push("--restrict-consumer-ref-on-create".to_string());
        }
    }
    args
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.to_string())),
        ("memory".to_string(), Quantity(memory.to_string())),
    ])
}

/// A probe of the probe port: plain HTTP, never queued behind reviews.
fn probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String(PROBE_PORT_NAME.to_string()),
            scheme: Some("HTTP".to_string()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The webhook's Deployment: [`REPLICAS`] replicas on different nodes where possible, no
/// Kubernetes API access (no ServiceAccount token), non-root, read-only root filesystem, no
/// privilege escalation or capabilities, the runtime's seccomp profile; the TLS Secret
/// mounted read-only (kubelet refreshes it; the process reloads changed files).
pub fn deployment(install: &WebhookInstall) -> Deployment {
    let run_as = hostcycle_operator::deploy::RUN_AS_USER;
    let container = Container {
        name: "webhook".to_string(),
        image: Some(install.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        args: Some(webhook_args(install)),
        ports: Some(vec![
            tcp_port(PORT_NAME, PORT),
            tcp_port(PROBE_PORT_NAME, PROBE_PORT),
        ]),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(5),
            ..probe("/healthz", 10, 3)
        }),
        readiness_probe: Some(probe("/readyz", 5, 2)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("10m", "32Mi")),
            limits: Some(quantities("500m", "128Mi")),
            ..Default::default()
        }),
        security_context: Some(hostcycle_operator::deploy::restricted_container()),
        volume_mounts: Some(vec![VolumeMount {
            name: "tls".to_string(),
            mount_path: TLS_DIR.to_string(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let selector = selector();
    let pod = PodSpec {
        // The webhook decides from the review alone: it never calls the API server.
        automount_service_account_token: Some(false),
        containers: vec![container],
        volumes: Some(vec![Volume {
            name: "tls".to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(TLS_SECRET.to_string()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(run_as),
            run_as_group: Some(run_as),
            fs_group: Some(run_as),
            seccomp_profile: Some(hostcycle_operator::deploy::runtime_default_seccomp()),
            ..Default::default()
        }),
        affinity: Some(hostcycle_operator::deploy::spread_over_nodes(&selector)),
        dns_config: Some(hostcycle_operator::deploy::pod_dns_config()),
        termination_grace_period_seconds: Some(15),
        ..Default::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_NAME.to_string()),
            namespace: Some(install.namespace.clone()),
            labels: Some(labels()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(REPLICAS),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service the API server calls: port 443 to the pods' [`PORT`].
pub fn service(namespace: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_string()),
                port: 443,
                target_port: Some(IntOrString::String(PORT_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Keeps one replica up through voluntary disruptions (node drains): one pod may be evicted
/// at a time. A pod that is not Ready may always be evicted (`v1`), so a broken replica never
/// blocks a drain.
pub fn pod_disruption_budget(namespace: &str, version: PdbVersion) -> serde_json::Value {
    let mut spec = json!({
        "maxUnavailable": 1,
        "selector": { "matchLabels": selector() },
    });
    if version == PdbVersion::V1 {
        // Kubernetes ≥ 1.26 reads it (older ones drop it): unhealthy pods never block.
        spec["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
    }
    json!({
        "apiVersion": match version {
            PdbVersion::V1 => "policy/v1",
            PdbVersion::V1beta1 => "policy/v1beta1",
        },
        "kind": "PodDisruptionBudget",
        "metadata": { "name": WEBHOOK_NAME, "namespace": namespace, "labels": labels() },
        "spec": spec,
    })
}

/// Lets into the webhook's pods only the review port, from anywhere (the API server is not
/// a pod: no selector can name it, so the port must stay open to the control plane's
/// addresses), and lets nothing out (the webhook calls nobody). The probe port is left out:
/// other pods cannot reach it, and the kubelet's probes come from the node, which most
/// network plugins let through regardless of NetworkPolicy.
pub fn network_policy(namespace: &str) -> serde_json::Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": { "name": WEBHOOK_NAME, "namespace": namespace, "labels": labels() },
        "spec": {
            "podSelector": { "matchLabels": selector() },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{ "ports": [{ "protocol": "TCP", "port": PORT }] }],
            "egress": [],
        },
    })
}

/// cert-manager objects: a self-signed CA (its own Issuer and Certificate, ten years) and a CA
/// Issuer signing the serving Certificate for the Service's DNS names into [`TLS_SECRET`].
/// cert-manager renews the serving certificate (the webhook reloads it); `caBundle`, injected
/// from the Secret's `ca.crt`, stays the same CA across renewals, so the API server never
/// sees a certificate its bundle does not trust yet.
pub fn cert_manager_objects(namespace: &str) -> Vec<serde_json::Value> {
    let ca = format!("{WEBHOOK_NAME}-ca");
    let self_signed = format!("{WEBHOOK_NAME}-selfsigned");
    let meta = |name: &str| json!({ "name": name, "namespace": namespace, "labels": labels() });
    vec![
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": meta(&self_signed),
            "spec": { "selfSigned": {} },
        }),
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": meta(&ca),
            "spec": {
                "isCA": true,
                "commonName": ca,
                "secretName": ca,
                "duration": "87600h",
                "issuerRef": { "kind": "Issuer", "name": self_signed },
                "privateKey": { "algorithm": "ECDSA", "size": 256 },
            },
        }),
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": meta(WEBHOOK_NAME),
            "spec": { "ca": { "secretName": ca } },
        }),
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": meta(WEBHOOK_NAME),
            "spec": {
                "secretName": TLS_SECRET,
                "dnsNames": [
                    format!("{WEBHOOK_NAME}.{namespace}.svc"),
                    format!("{WEBHOOK_NAME}.{namespace}.svc.cluster.local"),
                ],
                "issuerRef": { "kind": "Issuer", "name": WEBHOOK_NAME },
                "privateKey": { "algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always" },
            },
        }),
    ]
}

/// The configuration for an in-cluster install of `install`.
pub fn install_registration(install: &WebhookInstall) -> Registration {
    let mut annotations = BTreeMap::new();
    if install.cert_manager && install.ca_bundle_pem.is_none() {
        annotations.insert(
            "cert-manager.io/inject-ca-from".to_string(),
            format!("{}/{WEBHOOK_NAME}", install.namespace),
        );
    }
    Registration {
        name: WEBHOOK_NAME.to_string(),
        endpoint: Endpoint::Service {
            namespace: install.namespace.clone(),
            name: WEBHOOK_NAME.to_string(),
        },
        ca_bundle_pem: install.ca_bundle_pem.clone(),
        failure_policy: install.failure_policy(),
        annotations,
    }
}

/// Every object, in the order they are applied: cert-manager's (when asked for), the
/// Service, the Deployment, its PodDisruptionBudget and NetworkPolicy, then the configuration
/// (last: the API server calls the webhook as soon as it exists).
pub fn webhook_objects(install: &WebhookInstall) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut objects = Vec::new();
    if install.cert_manager {
        objects.extend(cert_manager_objects(&install.namespace));
    }
    objects.push(
        serde_json::to_value(service(&install.namespace)).context("serializing the Service")?,
    );
    objects.push(serde_json::to_value(deployment(install)).context("serializing the Deployment")?);
    objects.push(pod_disruption_budget(
        &install.namespace,
        install.pdb_version,
    ));
    objects.push(network_policy(&install.namespace));
    objects.push(
        serde_json::to_value(configuration(&install_registration(install)))
            .context("serializing the ValidatingWebhookConfiguration")?,
    );
    Ok(objects)
}

/// The objects as one YAML stream.
pub fn webhook_yaml(install: &WebhookInstall) -> anyhow::Result<String> {
    let mut out = String::from(
        "# Generated by `hostcycle webhook manifests` (the optional admission webhook, \
         docs/webhook.md).\n",
    );
    for (i, object) in webhook_objects(install)?.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(object).context("serializing to YAML")?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Command {
        Webhook(crate::cli::WebhookArgs),
    }

    fn parse(args: &[String]) -> crate::cli::ServeArgs {
        let cli =
            Cli::try_parse_from(std::iter::once("hostcycle".to_string()).chain(args.to_vec()))
                .unwrap_or_else(|e| panic!("the Deployment's args {args:?} do not parse: {e}"));
        let Command::Webhook(args) = cli.command;
        assert!(args.command.is_none());
        args.serve
    }

    fn with_allow_list() -> WebhookInstall {
        let mut install = WebhookInstall::new("ops");
        install.allow_users = vec!["alice".into()];
        install.allow_groups = vec!["power-admins".into()];
        install.allow_service_accounts = vec!["tenant:rebooter".parse().unwrap()];
        install
    }

    #[test]
    fn deployment_args_are_flags_the_webhook_accepts() {
        let args = parse(&webhook_args(&WebhookInstall::new("ops")));
        assert_eq!(args.listen.port(), PORT as u16);
        assert_eq!(
            args.tls_cert_file.unwrap(),
            std::path::Path::new(TLS_DIR).join("tls.crt")
        );
        assert_eq!(args.allow.policy(), Policy::validate_only());

        let args = parse(&webhook_args(&with_allow_list()));
        let list = args.allow.policy().allow.unwrap();
        assert!(list.users.contains("alice"));
        assert!(list.groups.contains("power-admins"));
        let accounts: Vec<String> = list
            .service_accounts
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(accounts, ["ops:hostcycle-operator", "tenant:rebooter"]);
    }

    use crate::policy::Policy;

    #[test]
    fn the_configuration_covers_host_creates_and_updates() {
        let config = configuration(&install_registration(&WebhookInstall::new("ops")));
        let [webhook] = config.webhooks.as_deref().unwrap() else {
            panic!("one webhook");
        };
        assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(webhook.side_effects, "None");
        assert_eq!(webhook.timeout_seconds, Some(TIMEOUT_SECONDS));
        assert_eq!(webhook.admission_review_versions, ["v1", "v1beta1"]);
        let service = webhook.client_config.service.clone().unwrap();
        assert_eq!(
            (
                service.namespace.as_str(),
                service.name.as_str(),
                service.port
            ),
            ("ops", WEBHOOK_NAME, Some(443))
        );
        assert_eq!(service.path.as_deref(), Some(VALIDATE_PATH));
        let [rule] = webhook.rules.as_deref().unwrap() else {
            panic!("one rule");
        };
        assert_eq!(rule.api_groups.as_deref().unwrap(), ["metal3.io"]);
        assert_eq!(rule.resources.as_deref().unwrap(), ["baremetalhosts"]);
        assert_eq!(rule.operations.as_deref().unwrap(), ["CREATE", "UPDATE"]);

        let config = configuration(&install_registration(&with_allow_list()));
        assert_eq!(
            config.webhooks.unwrap()[0].failure_policy.as_deref(),
            Some("Fail"),
            "an allow-list is enforced during outages by default"
        );
        let mut ignore = with_allow_list();
        ignore.failure_policy = Some(FailurePolicy::Ignore);
        assert_eq!(ignore.failure_policy(), FailurePolicy::Ignore);
    }

    #[test]
    fn ca_bundle_or_cert_manager() {
        let mut install = WebhookInstall::new("ops");
        install.ca_bundle_pem = Some("-----BEGIN CERTIFICATE-----\nx\n".into());
        let value = serde_json::to_value(configuration(&install_registration(&install))).unwrap();
        assert!(value["webhooks"][0]["clientConfig"]["caBundle"].is_string());
        assert!(value["metadata"]["annotations"].is_null());

        let mut install = WebhookInstall::new("ops");
        install.cert_manager = true;
        let objects = webhook_objects(&install).unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "Issuer",
                "Certificate",
                "Issuer",
                "Certificate",
                "Service",
                "Deployment",
                "PodDisruptionBudget",
                "NetworkPolicy",
                "ValidatingWebhookConfiguration"
            ]
        );
        let webhook_config = &objects[8];
        assert_eq!(
            webhook_config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "ops/hostcycle-webhook",
            "the serving Certificate, whose Secret's ca.crt is the CA"
        );
        let serving = &objects[3];
        assert_eq!(serving["metadata"]["name"], WEBHOOK_NAME);
        assert_eq!(serving["spec"]["secretName"], TLS_SECRET);
        assert_eq!(serving["spec"]["dnsNames"][0], "hostcycle-webhook.ops.svc");
        assert_eq!(serving["spec"]["issuerRef"]["name"], WEBHOOK_NAME);
        assert_eq!(
            objects[2]["spec"]["ca"]["secretName"],
            "hostcycle-webhook-ca"
        );
        assert_eq!(objects[1]["spec"]["isCA"], true);
    }

    #[test]
    fn pods_are_locked_down_and_never_call_the_api() {
        let deployment = deployment(&WebhookInstall::new("ops"));
        let spec = deployment.spec.unwrap();
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let ndots: Vec<(Option<&str>, Option<&str>)> = pod
            .dns_config
            .as_ref()
            .and_then(|d| d.options.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|o| (o.name.as_deref(), o.value.as_deref()))
            .collect();
        assert_eq!(ndots, [(Some("ndots"), Some("1"))], "no search-list first");
        let [container] = pod.containers.as_slice() else {
            panic!("one container");
        };
        let sc = container.security_context.clone().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        // Probes go to the probe port (plain HTTP), never queued behind reviews.
        let readiness = container.readiness_probe.clone().unwrap().http_get.unwrap();
        assert_eq!(readiness.scheme.as_deref(), Some("HTTP"));
        assert_eq!(readiness.path.as_deref(), Some("/readyz"));
        assert_eq!(
            readiness.port,
            IntOrString::String(PROBE_PORT_NAME.to_string())
        );
        let liveness = container.liveness_probe.clone().unwrap().http_get.unwrap();
        assert_eq!(liveness.scheme.as_deref(), Some("HTTP"));
        assert_eq!(liveness.path.as_deref(), Some("/healthz"));
        assert_eq!(
            liveness.port,
            IntOrString::String(PROBE_PORT_NAME.to_string())
        );
        let ports: Vec<(Option<&str>, i32)> = container
            .ports
            .as_deref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            [(Some(PORT_NAME), PORT), (Some(PROBE_PORT_NAME), PROBE_PORT)]
        );
        let volume = &pod.volumes.unwrap()[0];
        assert_eq!(
            volume.secret.clone().unwrap().secret_name.as_deref(),
            Some(TLS_SECRET)
        );
        let yaml = webhook_yaml(&WebhookInstall::new("ops")).unwrap();
        assert!(
            yaml.contains("kind: ValidatingWebhookConfiguration"),
            "{yaml}"
        );
    }

    #[test]
    fn the_probe_port_and_restrict_flag_reach_the_deployment_args() {
        let args = parse(&webhook_args(&WebhookInstall::new("ops")));
        assert_eq!(args.probe_addr.port(), PROBE_PORT as u16);
        assert_eq!(args.allow.restrict_bmc_on_create, None);

        let install = with_allow_list();
        assert!(
            install.restrict_bmc_on_create,
            "the default with an allow-list"
        );
        let args = parse(&webhook_args(&install));
        assert_eq!(args.allow.restrict_bmc_on_create, Some(true));
        assert!(args.allow.policy().restrict_bmc_on_create);
        assert!(!args.allow.restrict_consumer_ref_on_create);

        let mut install = with_allow_list();
        install.restrict_bmc_on_create = false;
        install.restrict_consumer_ref_on_create = true;
        let args = parse(&webhook_args(&install));
        assert!(args.allow.policy().restrict_consumer_ref_on_create);
        assert!(!args.allow.policy().restrict_bmc_on_create);
        // Without an allow-list neither flag is passed (the server would refuse it).
        let mut install = WebhookInstall::new("ops");
        install.restrict_consumer_ref_on_create = true;
        assert!(
            !webhook_args(&install)
                .iter()
                .any(|a| a.starts_with("--restrict"))
        );
    }

    #[test]
    fn a_network_policy_lets_in_the_review_port_only_and_nothing_out() {
        let objects = webhook_objects(&WebhookInstall::new("ops")).unwrap();
        let policy = objects
            .iter()
            .find(|o| o["kind"] == "NetworkPolicy")
            .expect("a NetworkPolicy");
        assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(policy["metadata"]["namespace"], "ops");
        assert_eq!(
            policy["spec"]["podSelector"]["matchLabels"],
            json!({"app.kubernetes.io/name": WEBHOOK_NAME}),
            "the Deployment's pods"
        );
        let deployment = deployment(&WebhookInstall::new("ops"));
        let pod_labels = deployment
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert_eq!(pod_labels["app.kubernetes.io/name"], WEBHOOK_NAME);
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        // From anywhere (no `from`: the API server is not a pod), to the review port only.
        assert_eq!(
            policy["spec"]["ingress"],
            json!([{"ports": [{"protocol": "TCP", "port": PORT}]}])
        );
        assert!(
            !policy.to_string().contains(&PROBE_PORT.to_string()),
            "the probe port is not opened to other pods: {policy}"
        );
        assert_eq!(
            policy["spec"]["egress"],
            json!([]),
            "the webhook calls nobody"
        );
    }

    #[test]
    fn a_pod_disruption_budget_keeps_one_replica_through_drains() {
        let objects = webhook_objects(&WebhookInstall::new("ops")).unwrap();
        let pdb = objects
            .iter()
            .find(|o| o["kind"] == "PodDisruptionBudget")
            .expect("a PodDisruptionBudget");
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["metadata"]["namespace"], "ops");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            json!({"app.kubernetes.io/name": WEBHOOK_NAME})
        );
        // One of the two replicas may go at a time: drains proceed, one always answers.
        const { assert!(REPLICAS >= 2) };
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        assert!(pdb["spec"].get("minAvailable").is_none());
        assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");

        let mut old = WebhookInstall::new("ops");
        old.pdb_version = PdbVersion::V1beta1;
        let pdb = pod_disruption_budget(&old.namespace, old.pdb_version);
        assert_eq!(pdb["apiVersion"], "policy/v1beta1");
        assert!(pdb["spec"].get("unhealthyPodEvictionPolicy").is_none());
        let yaml = webhook_yaml(&old).unwrap();
        assert!(yaml.contains("apiVersion: policy/v1beta1"), "{yaml}");
    }
}
