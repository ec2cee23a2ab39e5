//! The whole install as typed objects (`hostcycle manifests --deploy`): the CRDs, the
//! operator's Namespace, ServiceAccount and least-privilege RBAC ([`crate::rbac`]), a
//! NetworkPolicy that admits only namespaces an administrator labelled to the metrics port, a
//! PodDisruptionBudget, a Deployment of two replicas (only the Lease holder acts) and a
//! Service for its metrics.
//! The files under `deploy/` are this module's output, checked in; a test fails when they
//! are stale.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    Namespace, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodDNSConfig,
    PodDNSConfigOption, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec, WeightedPodAffinityTerm,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::ControllerName;
use crate::rbac::{self, OPERATOR_NAME, RbacOptions};

/// Registry and repository of the operator image. No image is built or pushed from this
/// repository: build one with `deploy/Dockerfile` and set `--image` (see `deploy/README.md`).
pub const IMAGE_REPOSITORY: &str = "ghcr.io/hostcycle/hostcycle";
/// Port of `/metrics` (`hostcycle operator --metrics-addr`).
pub const METRICS_PORT: i32 = 8080;
/// Name of the container port and of the Service port.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Port of the kubelet's probes, `/healthz` and `/readyz` (`hostcycle operator
/// --probe-addr`): no Service and no NetworkPolicy rule opens it to pods.
pub const PROBE_PORT: i32 = 8081;
/// Name of the probe container port.
pub const PROBE_PORT_NAME: &str = "probes";
/// User and group the container runs as: `nonroot` of `deploy/Dockerfile`'s runtime image.
pub const RUN_AS_USER: i64 = 65532;
/// Replicas of the Deployment: one leads, the other stands by with warm caches.
pub const REPLICAS: i32 = 2;
/// The label an administrator sets (to `true`) on the monitoring namespace so that its pods
/// may scrape `/metrics`; a namespace's *name* would not do — whoever may create a namespace
/// chooses it.
pub const METRICS_SCRAPER_LABEL: &str = "hostcycle.io/metrics-scraper";
/// Default of `hostcycle manifests --metrics-scraper-label` (`KEY=VALUE`):
/// [`METRICS_SCRAPER_LABEL`]`=true`.
pub const DEFAULT_METRICS_SCRAPERS: &str = "hostcycle.io/metrics-scraper=true";

/// The default image: [`IMAGE_REPOSITORY`] tagged with this crate's version. A placeholder:
/// nothing here builds or publishes it.
pub fn default_image() -> String {
    format!("{IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// What to render.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    /// Namespaces, controllers, Lease: the same options as `hostcycle manifests`.
    pub rbac: RbacOptions,
    /// Container image of the operator.
    pub image: String,
    /// The label (key, value) of the namespaces whose pods the NetworkPolicy admits to the
    /// metrics port.
    pub metrics_scraper_label: (String, String),
    /// Who may make the operator act, and where credentials go (docs/security.md).
    pub policy: OperatorPolicy,
}

/// The operator's security flags, rendered into the Deployment's arguments as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorPolicy {
    /// `--bmc-networks`; none: the operator sends credentials nowhere until set.
    pub bmc_networks: Vec<String>,
    /// `--allow-plain-http-bmc`.
    pub allow_plain_http_bmc: bool,
    /// `--refuse-unverified-bmc-tls`.
    pub refuse_unverified_bmc_tls: bool,
    /// `--bmc-credentials-label` (`KEY=VALUE`).
    pub bmc_credentials_label: Option<String>,
    /// `--remediation-request-namespaces`; `None`: the operator's default
    /// (`same-as-host,operator-namespace`).
    pub remediation_request_namespaces: Option<String>,
}

impl OperatorPolicy {
    /// The flags, in a fixed order.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if !self.bmc_networks.is_empty() {
            args.push(format!("--bmc-networks={}", self.bmc_networks.join(",")));
        }
        if self.allow_plain_http_bmc {
            args.push("--allow-plain-http-bmc".to_string());
        }
        if self.refuse_unverified_bmc_tls {
            args.push("--refuse-unverified-bmc-tls".to_string());
        }
        if let Some(label) = &self.bmc_credentials_label {
            args.push(format!("--bmc-credentials-label={label}"));
        }
        if let Some(rule) = &self.remediation_request_namespaces {
            args.push(format!("--remediation-request-namespaces={rule}"));
        }
        args
    }
}

impl DeployOptions {
    /// The checked-in `deploy/`: every controller, cluster-wide, in `hostcycle-system`.
    pub fn standard() -> Self {
        DeployOptions {
            rbac: RbacOptions::cluster_wide("hostcycle-system"),
            image: default_image(),
            metrics_scraper_label: default_metrics_scraper_label(),
            policy: OperatorPolicy::default(),
        }
    }
}

/// [`DEFAULT_METRICS_SCRAPERS`] as (key, value).
pub fn default_metrics_scraper_label() -> (String, String) {
    (METRICS_SCRAPER_LABEL.to_string(), "true".to_string())
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        OPERATOR_NAME.to_string(),
    )])
}

fn labels_with_component() -> BTreeMap<String, String> {
    let mut labels = labels();
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        "operator".to_string(),
    );
    labels
}

/// The operator's namespace — the only Namespace the install creates (a watched namespace
/// must exist already and keeps its labels). It enforces the Pod Security Standard
/// `restricted` (clusters from 1.23 read the label; older ones ignore it), which the
/// Deployment's pods satisfy.
pub fn namespace(name: &str) -> Namespace {
    let mut labels = labels();
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            "restricted".to_string(),
        );
    }
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The arguments of the operator container: `hostcycle operator` with leader election, the
/// Lease in the pod's namespace (`POD_NAMESPACE`), the identity from `POD_NAME`.
pub fn operator_args(options: &RbacOptions) -> Vec<String> {
    let mut args = vec![
        "operator".to_string(),
        "--leader-elect=true".to_string(),
        format!("--lease-name={}", options.lease_name),
        format!("--metrics-addr=0.0.0.0:{METRICS_PORT}"),
        format!("--probe-addr=0.0.0.0:{PROBE_PORT}"),
    ];
    if let Some(watched) = &options.watch_namespace {
        args.push(format!("--namespace={watched}"));
    }
    if options.controllers != ControllerName::ALL {
        let names: Vec<String> = options.controllers.iter().map(|c| c.to_string()).collect();
        args.push(format!("--controllers={}", names.join(",")));
    }
    args
}

/// A named TCP port of a container (the operator's and the webhook's Deployments).
pub fn tcp_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: port,
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.to_string())),
        ("memory".to_string(), Quantity(memory.to_string())),
    ])
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String(PROBE_PORT_NAME.to_string()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The container hardening every hostcycle pod uses: non-root ([`RUN_AS_USER`]), read-only
/// root filesystem, no privilege escalation, no capabilities, the runtime's seccomp profile.
pub fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS_USER),
        run_as_group: Some(RUN_AS_USER),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// The container runtime's default seccomp profile.
pub fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        ..Default::default()
    }
}

/// Replicas of the pods `selector` matches on different nodes when there are any: a node
/// lost takes one only.
pub fn spread_over_nodes(selector: &BTreeMap<String, String>) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector.clone()),
                            ..Default::default()
                        }),
                        topology_key: "kubernetes.io/hostname".to_string(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pods' DNS options: `ndots:1` instead of Kubernetes' `ndots:5`, so that a name with a
/// dot (`r12.oob`) is tried as written first and not as `r12.oob.svc.cluster.local` — a
/// Service `r12` in a namespace `oob`, which whoever may create that namespace controls. The
/// operator also resolves BMC names itself as absolute names (hostcycle_bmc::resolve); this
/// covers every other lookup of the pods (reboot commands' ssh, for instance).
pub fn pod_dns_config() -> PodDNSConfig {
    PodDNSConfig {
        options: Some(vec![PodDNSConfigOption {
            name: Some("ndots".to_string()),
            value: Some("1".to_string()),
        }]),
        ..Default::default()
    }
}

/// The operator's Deployment: [`REPLICAS`] replicas spread over nodes where possible,
/// non-root with a read-only root filesystem, no privilege escalation, no capabilities and
/// the runtime's default seccomp profile; liveness on `/healthz`, readiness on `/readyz`, both
/// on the probe port.
pub fn deployment(options: &DeployOptions) -> Deployment {
    let namespace = options.rbac.namespace.clone();
    let selector = labels();
    let container = Container {
        name: "operator".to_string(),
        image: Some(options.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        args: Some({
            let mut args = operator_args(&options.rbac);
            args.extend(options.policy.args());
            args
        }),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            tcp_port(METRICS_PORT_NAME, METRICS_PORT),
            tcp_port(PROBE_PORT_NAME, PROBE_PORT),
        ]),
        // On the probe port: /healthz answers as soon as the HTTP server is up; a process
        // that stops answering for 30 s is restarted. /readyz waits for the API server and
        // synced caches.
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(5),
            ..http_probe("/healthz", 10, 3)
        }),
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("100m", "128Mi")),
            limits: Some(quantities("1", "512Mi")),
            ..Default::default()
        }),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    let pod = PodSpec {
        service_account_name: Some(OPERATOR_NAME.to_string()),
        containers: vec![container],
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..Default::default()
        }),
        affinity: Some(spread_over_nodes(&selector)),
        dns_config: Some(pod_dns_config()),
        termination_grace_period_seconds: Some(30),
        ..Default::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.to_string()),
            namespace: Some(namespace),
            labels: Some(labels_with_component()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(REPLICAS),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            // Never both replicas down during a rollout: a new pod first, then an old one.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels_with_component()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Ingress to the operator's pods: only pods of namespaces labelled `scraper_label` (a label
/// an administrator sets, not the namespace's name, which whoever creates it chooses), only
/// to the metrics port; everything else is denied — the probe port included. `/metrics` has
/// no authentication of its own, so this is what keeps other tenants out. Probes still work:
/// NetworkPolicy implementations admit the kubelet on the pod's own node. Egress is left
/// alone (the API server and the BMCs are wherever they are).
pub fn metrics_network_policy(namespace: &str, scraper_label: &(String, String)) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("{OPERATOR_NAME}-metrics")),
            namespace: Some(namespace.to_string()),
            labels: Some(labels_with_component()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels()),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([scraper_label.clone()])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::String(METRICS_PORT_NAME.to_string())),
                    protocol: Some("TCP".to_string()),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        }),
    }
}

/// At most one replica evicted at a time: a node drain never takes both down, and with one
/// replica (or both on one node) a drain still goes through — `minAvailable: 1` would block it.
pub fn disruption_budget(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels_with_component()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(labels()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service in front of every replica's `/metrics` (each replica exports its own
/// `hostcycle_leader`).
pub fn metrics_service(namespace: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(format!("{OPERATOR_NAME}-metrics")),
            namespace: Some(namespace.to_string()),
            labels: Some(labels_with_component()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(labels()),
            ports: Some(vec![ServicePort {
                name: Some(METRICS_PORT_NAME.to_string()),
                port: METRICS_PORT,
                target_port: Some(IntOrString::String(METRICS_PORT_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every object but the CRDs, in the order they are applied: the operator's Namespace, the
/// ServiceAccount and RBAC, the NetworkPolicy and PodDisruptionBudget (in place before the
/// pods), the Deployment, the Service.
pub fn operator_objects(options: &DeployOptions) -> anyhow::Result<Vec<serde_json::Value>> {
    let ns = options.rbac.namespace.as_str();
    let (key, value) = &options.metrics_scraper_label;
    crate::cli::label_requirement(&format!("{key}={value}"))
        .map_err(|why| anyhow::anyhow!("--metrics-scraper-label {key}={value}: {why}"))?;
    let mut objects =
        vec![serde_json::to_value(namespace(ns)).context("serializing the Namespace")?];
    objects.extend(rbac::rbac_objects(&options.rbac)?);
    objects.push(
        serde_json::to_value(metrics_network_policy(ns, &options.metrics_scraper_label))
            .context("serializing the NetworkPolicy")?,
    );
    objects.push(
        serde_json::to_value(disruption_budget(ns))
            .context("serializing the PodDisruptionBudget")?,
    );
    objects.push(serde_json::to_value(deployment(options)).context("serializing the Deployment")?);
    objects.push(serde_json::to_value(metrics_service(ns)).context("serializing the Service")?);
    Ok(objects)
}

/// First line of every generated file.
pub const GENERATED_HEADER: &str = "# Generated by `hostcycle manifests --deploy` \
     (regenerate: make deploy-manifests). Do not edit.\n";

/// File of the CRDs under `deploy/`.
pub const CRDS_FILE: &str = "crds.yaml";
/// File of everything else under `deploy/`.
pub const OPERATOR_FILE: &str = "operator.yaml";

fn yaml_stream<'a>(
    objects: impl IntoIterator<Item = &'a serde_json::Value>,
) -> anyhow::Result<String> {
    let mut out = String::from(GENERATED_HEADER);
    for (i, object) in objects.into_iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let kind = object["kind"].as_str().unwrap_or("object");
        let name = object["metadata"]["name"].as_str().unwrap_or("");
        out.push_str(
            &serde_saphyr::to_string(object)
                .with_context(|| format!("serializing {kind} {name} to YAML"))?,
        );
    }
    Ok(out)
}

/// The install as files: `(file name, YAML)` in the order they are applied —
/// [`CRDS_FILE`] first (wait for the CRDs to be Established), then [`OPERATOR_FILE`].
pub fn render(options: &DeployOptions) -> anyhow::Result<Vec<(&'static str, String)>> {
    let crds = hostcycle_api::crds()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).context("serializing a CRD"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(vec![
        (CRDS_FILE, yaml_stream(&crds)?),
        (OPERATOR_FILE, yaml_stream(&operator_objects(options)?)?),
    ])
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
        Operator(crate::OperatorArgs),
    }

    fn parse(args: &[String]) -> crate::OperatorArgs {
        let cli =
            Cli::try_parse_from(std::iter::once("hostcycle".to_string()).chain(args.to_vec()))
                .unwrap_or_else(|e| panic!("the Deployment's args {args:?} do not parse: {e}"));
        let Command::Operator(args) = cli.command;
        args
    }

    #[test]
    fn deployment_args_are_flags_the_operator_accepts() {
        let args = parse(&operator_args(&RbacOptions::cluster_wide(
            "hostcycle-system",
        )));
        assert!(args.leader_elect);
        assert_eq!(args.lease_name, rbac::DEFAULT_LEASE_NAME);
        assert_eq!(args.metrics_addr.port(), METRICS_PORT as u16);
        assert_eq!(args.probe_addr.port(), PROBE_PORT as u16);
        assert_eq!(args.namespace, None);
        assert_eq!(args.controllers, ControllerName::ALL);
        assert_eq!(
            args.lease_namespace, None,
            "the Lease namespace is POD_NAMESPACE"
        );

        let mut options = RbacOptions::namespaced("hostcycle-system", "tenant-a");
        options.controllers = vec![ControllerName::BareMetalHost];
        options.lease_name = "other-lease".into();
        let args = parse(&operator_args(&options));
        assert_eq!(args.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(args.controllers, [ControllerName::BareMetalHost]);
        assert_eq!(args.lease_name, "other-lease");
    }

    #[test]
    fn pods_are_locked_down() {
        let deployment = deployment(&DeployOptions::standard());
        let spec = deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some(OPERATOR_NAME));
        let [container] = pod.containers.as_slice() else {
            panic!("one container");
        };
        let sc = container.security_context.clone().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(65532));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let resources = container.resources.clone().unwrap();
        assert!(resources.requests.unwrap().contains_key("memory"));
        assert!(resources.limits.unwrap().contains_key("memory"));
        let probe_path = |p: &Option<Probe>| p.clone().unwrap().http_get.unwrap().path.unwrap();
        assert_eq!(probe_path(&container.liveness_probe), "/healthz");
        assert_eq!(probe_path(&container.readiness_probe), "/readyz");
        let env: Vec<&str> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["POD_NAME", "POD_NAMESPACE"]);
        let dns_options = pod.dns_config.clone().unwrap().options.unwrap();
        assert_eq!(
            dns_options,
            [PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some("1".into()),
            }],
            "short names are not completed with the cluster's search list first"
        );
        assert_eq!(
            container.image.as_deref(),
            Some(format!("ghcr.io/hostcycle/hostcycle:{}", env!("CARGO_PKG_VERSION")).as_str())
        );
    }

    #[test]
    fn objects_are_ordered_for_apply_and_typed() {
        let objects = operator_objects(&DeployOptions::standard()).unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"Namespace"));
        assert_eq!(&kinds[kinds.len() - 2..], ["Deployment", "Service"]);
        for object in &objects {
            assert!(object["apiVersion"].is_string(), "{object}");
            assert!(object["metadata"]["name"].is_string(), "{object}");
        }
        let files = render(&DeployOptions::standard()).unwrap();
        assert_eq!(files[0].0, CRDS_FILE);
        assert!(
            files
                .iter()
                .all(|(_, text)| text.starts_with(GENERATED_HEADER))
        );
    }

    /// `/metrics` is unauthenticated: only the monitoring namespace's pods may reach it, and
    /// only that port; the policy isolates the operator's pods (Ingress) and nothing else.
    /// The monitoring namespace is the one an administrator labelled (issue 25 changed the
    /// rule from the namespace's name, which whoever creates it chooses, to that label).
    #[test]
    fn metrics_are_admitted_only_from_the_monitoring_namespace() {
        let mut options = DeployOptions::standard();
        options.metrics_scraper_label = ("example.com/scrapes".into(), "hostcycle".into());
        let objects = operator_objects(&options).unwrap();
        let policy = objects
            .iter()
            .find(|o| o["kind"] == "NetworkPolicy")
            .expect("a NetworkPolicy");
        assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(policy["metadata"]["namespace"], "hostcycle-system");
        let spec = &policy["spec"];
        let pods = &deployment(&options)
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap();
        for (key, value) in spec["podSelector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                pods.labels.as_ref().unwrap().get(key).map(String::as_str),
                value.as_str(),
                "the policy selects the operator's pods by {key}"
            );
        }
        assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
        assert_eq!(
            spec["ingress"],
            serde_json::json!([{
                "from": [{ "namespaceSelector": { "matchLabels": {
                    "example.com/scrapes": "hostcycle"
                } } }],
                "ports": [{ "port": "metrics", "protocol": "TCP" }],
            }]),
            "one rule: the monitoring namespace, the metrics port; nothing else"
        );
        options.metrics_scraper_label = ("Not A Label".into(), "true".into());
        let error = operator_objects(&options).unwrap_err().to_string();
        assert!(error.contains("--metrics-scraper-label"), "{error}");
    }

    /// Drains evict one replica at a time and are never blocked, whatever the replicas.
    #[test]
    fn a_disruption_budget_lets_drains_take_one_replica_at_a_time() {
        let objects = operator_objects(&DeployOptions::standard()).unwrap();
        let budget = objects
            .iter()
            .find(|o| o["kind"] == "PodDisruptionBudget")
            .expect("a PodDisruptionBudget");
        assert_eq!(budget["apiVersion"], "policy/v1");
        assert_eq!(budget["metadata"]["namespace"], "hostcycle-system");
        assert_eq!(budget["spec"]["maxUnavailable"], 1);
        assert!(budget["spec"].get("minAvailable").is_none());
        assert_eq!(
            budget["spec"]["selector"]["matchLabels"],
            serde_json::to_value(
                deployment(&DeployOptions::standard())
                    .spec
                    .unwrap()
                    .selector
            )
            .unwrap()["matchLabels"]
        );
    }

    /// A namespaced install: the only Namespace object is the operator's own; the watched
    /// namespace gets the hosts' Role and its binding, nothing else.
    #[test]
    fn a_namespaced_install_puts_nothing_of_the_operators_in_the_watched_namespace() {
        let options = DeployOptions {
            rbac: RbacOptions::namespaced("hostcycle-system", "tenant-a"),
            ..DeployOptions::standard()
        };
        let objects = operator_objects(&options).unwrap();
        let namespaces: Vec<&serde_json::Value> = objects
            .iter()
            .filter(|o| o["kind"] == "Namespace")
            .map(|o| &o["metadata"]["name"])
            .collect();
        assert_eq!(namespaces, ["hostcycle-system"]);
        let in_tenant: Vec<&str> = objects
            .iter()
            .filter(|o| o["metadata"]["namespace"] == "tenant-a")
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(in_tenant, ["Role", "RoleBinding"]);
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(deployment["metadata"]["namespace"], "hostcycle-system");
        let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(
            args.as_array()
                .unwrap()
                .iter()
                .any(|a| a == "--namespace=tenant-a"),
            "{args}"
        );
    }

    /// Issue 25, point 6: a namespace's name is chosen by whoever creates it, so the metrics
    /// port must be admitted by a label an administrator sets — never by
    /// `kubernetes.io/metadata.name` — and the kubelet's probes get a port of their own, which
    /// no NetworkPolicy rule opens to pods.
    #[test]
    fn metrics_scrapers_are_chosen_by_an_administrators_label_and_probes_have_their_own_port() {
        assert_eq!(
            crate::cli::label_requirement(DEFAULT_METRICS_SCRAPERS),
            Ok(default_metrics_scraper_label()),
            "the flag's default is the label the install selects by"
        );
        let objects = operator_objects(&DeployOptions::standard()).unwrap();
        let policy = objects
            .iter()
            .find(|o| o["kind"] == "NetworkPolicy")
            .expect("a NetworkPolicy");
        let text = policy.to_string();
        assert!(
            !text.contains("kubernetes.io/metadata.name"),
            "the policy selects a namespace by its name: {text}"
        );
        assert_eq!(
            policy["spec"]["ingress"][0]["from"],
            serde_json::json!([{ "namespaceSelector": { "matchLabels": {
                "hostcycle.io/metrics-scraper": "true"
            } } }]),
        );
        assert_eq!(
            policy["spec"]["ingress"][0]["ports"],
            serde_json::json!([{ "port": "metrics", "protocol": "TCP" }]),
            "only the metrics port is opened, not the probe port"
        );

        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let ports = container["ports"].as_array().unwrap();
        let port_of = |name: &str| {
            ports
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("no container port {name}: {ports:?}"))["containerPort"]
                .as_i64()
                .unwrap()
        };
        assert_ne!(port_of("probes"), port_of("metrics"));
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(
                container[probe]["httpGet"]["port"], "probes",
                "{probe} uses the probe port: {container}"
            );
        }
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.contains(&format!("--probe-addr=0.0.0.0:{}", port_of("probes")).as_str()),
            "{args:?}"
        );
        let service = objects.iter().find(|o| o["kind"] == "Service").unwrap();
        assert!(
            !service.to_string().contains("probes"),
            "the Service exposes metrics only: {service}"
        );
    }
}
