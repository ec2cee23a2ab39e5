//! The operator's permissions, generated from code so they stay next to what the code does,
//! and the install manifests built from them (`hostcycle manifests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef,
    Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::ControllerName;

/// Name of the ServiceAccount, (Cluster)Roles and bindings.
pub const OPERATOR_NAME: &str = "hostcycle-operator";
/// Default name of the leader Lease (`hostcycle operator --lease-name`).
pub const DEFAULT_LEASE_NAME: &str = "hostcycle-operator";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        OPERATOR_NAME.to_string(),
    )])
}

/// What to generate RBAC for.
#[derive(Debug, Clone)]
pub struct RbacOptions {
    /// The operator's own namespace: its ServiceAccount, Deployment and leader Lease. Nothing
    /// else runs there, so no tenant can run a pod as the operator's ServiceAccount.
    pub namespace: String,
    /// `hostcycle operator --namespace`: the one namespace whose hosts, Secrets and Events are
    /// granted, by a Role there bound to the ServiceAccount in [`RbacOptions::namespace`].
    /// `None`: every namespace, by the ClusterRole.
    pub watch_namespace: Option<String>,
    /// The controllers the operator runs (`--controllers`).
    pub controllers: Vec<ControllerName>,
    /// `--lease-name`.
    pub lease_name: String,
}

impl RbacOptions {
    /// Everything cluster-wide, the operator in `namespace`.
    pub fn cluster_wide(namespace: &str) -> Self {
        RbacOptions {
            namespace: namespace.to_string(),
            watch_namespace: None,
            controllers: ControllerName::ALL.to_vec(),
            lease_name: DEFAULT_LEASE_NAME.to_string(),
        }
    }

    /// The operator in `namespace`, managing the hosts of `watch_namespace` only.
    pub fn namespaced(namespace: &str, watch_namespace: &str) -> Self {
        RbacOptions {
            watch_namespace: Some(watch_namespace.to_string()),
            ..RbacOptions::cluster_wide(namespace)
        }
    }

    fn runs(&self, controller: ControllerName) -> bool {
        self.controllers.contains(&controller)
    }

    /// Refuses an install that would put the operator's ServiceAccount where the hosts live:
    /// whoever may create pods in the watched namespace could then run one as the operator
    /// and use its cluster-wide grants (delete Nodes, evict any Pod).
    pub fn check(&self) -> anyhow::Result<()> {
        for (what, name) in std::iter::once(("operator namespace", &self.namespace)).chain(
            self.watch_namespace
                .iter()
                .map(|ns| ("watched namespace", ns)),
        ) {
            if !is_dns_label(name) {
                anyhow::bail!(
                    "the {what} {name:?} is not a valid namespace name (lower-case letters, \
                     digits and '-', at most 63 characters, starting and ending with a letter \
                     or digit)"
                );
            }
        }
        if self.watch_namespace.as_deref() == Some(self.namespace.as_str()) {
            anyhow::bail!(
                "--namespace {0} is also the operator's namespace: anyone who may create pods \
                 in {0} could run one as the operator's ServiceAccount; give the operator a \
                 namespace of its own with --operator-namespace (default hostcycle-system)",
                self.namespace
            );
        }
        Ok(())
    }
}

/// A Kubernetes namespace name (RFC 1123 label).
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// Rules on the hosts' namespace(s): what every controller needs of BareMetalHosts, and the
/// host controller's Secrets and Events. Verbs are exactly the calls the code makes.
pub fn host_rules(controllers: &[ControllerName]) -> Vec<PolicyRule> {
    let mut rules = vec![
        // Watch hosts (all controllers); `get` re-reads a host after a conflicting status
        // write; `patch` removes the suffixless reboot annotation (host controller) and adds
        // or removes request annotations (reboot queue, remediation).
        rule(
            &["metal3.io"],
            &["baremetalhosts"],
            &["get", "list", "watch", "patch"],
        ),
    ];
    if controllers.contains(&ControllerName::BareMetalHost) {
        rules.extend([
            // Record power state, timestamps and errors (a PUT on /status).
            rule(&["metal3.io"], &["baremetalhosts/status"], &["update"]),
            // BMC credentials: the metadata of Secrets is listed and watched (so a fixed
            // Secret takes effect at once); a Secret's data is read (get) only when a host
            // names it and its resourceVersion changed.
            rule(&[""], &["secrets"], &["get", "list", "watch"]),
            // Events about hosts (events.k8s.io/v1): created, then patched into a series.
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        ]);
    }
    rules
}

/// Rules only cluster-wide grants can give: the reboot queue's and remediation's Nodes,
/// Pods in every namespace, cluster-scoped queue objects, Machines wherever they are.
/// Empty when only the host controller runs.
pub fn cluster_rules(controllers: &[ControllerName]) -> Vec<PolicyRule> {
    let queue = controllers.contains(&ControllerName::RebootQueue);
    let remediation = controllers.contains(&ControllerName::Remediation);
    let health = controllers.contains(&ControllerName::HealthCheck);
    let loops = queue || remediation;
    if !loops && !health {
        return Vec::new();
    }
    // Events about Nodes (in kube-system), queue entries, Machines, remediations and health
    // checks.
    let mut rules = vec![rule(&["events.k8s.io"], &["events"], &["create", "patch"])];
    if loops {
        rules.extend(loop_rules());
    } else {
        // The health check alone: which Nodes it selects (and a live read of a Node before
        // its request), and which the reboot queue is rebooting.
        rules.push(rule(&[""], &["nodes"], &["get", "list", "watch"]));
        rules.push(rule(
            &["hostcycle.io"],
            &["rebootqueues", "rebootqueueentries"],
            &["list", "watch"],
        ));
    }
    // Remediation requests: read (the queue watches them too); remediation adds its
    // finalizer; the health check creates its requests and deletes finished ones.
    let mut verbs = vec!["get", "list", "watch"];
    if remediation {
        verbs.push("patch");
    }
    if health {
        verbs.extend(["create", "delete"]);
    }
    rules.push(rule(&["hostcycle.io"], &["hostremediations"], &verbs));
    if remediation {
        // The request's record is replaced (PUT, with its resourceVersion).
        rules.push(rule(
            &["hostcycle.io"],
            &["hostremediations/status"],
            &["update"],
        ));
        // Releasing a fenced node's workloads without deleting it (only once its host is
        // off): clear the dead kubelet's `status.volumesInUse`, and see its
        // VolumeAttachments go (never deleted by hostcycle).
        rules.push(rule(&[""], &["nodes/status"], &["patch"]));
        rules.push(rule(&["storage.k8s.io"], &["volumeattachments"], &["list"]));
    }
    if health {
        // The checks are watched (never read one by one); their status is replaced (PUT,
        // with its resourceVersion).
        rules.push(rule(
            &["hostcycle.io"],
            &["hosthealthchecks"],
            &["list", "watch"],
        ));
        rules.push(rule(
            &["hostcycle.io"],
            &["hosthealthchecks/status"],
            &["update"],
        ));
    }
    rules
}

/// What the reboot queue and remediation need cluster-wide (besides Events and requests).
fn loop_rules() -> Vec<PolicyRule> {
    vec![
        // Reboot queue: read the configuration (from the watch, never by `get`); create
        // `default` when it is missing.
        rule(
            &["hostcycle.io"],
            &["rebootqueues"],
            &["list", "watch", "create"],
        ),
        // Reboot queue: entries are watched and removed when done; `spec` is never written.
        rule(
            &["hostcycle.io"],
            &["rebootqueueentries"],
            &["list", "watch", "delete"],
        ),
        // Reboot queue: each entry's record is replaced (PUT, with its resourceVersion), the
        // queue's summary merge-patched.
        rule(
            &["hostcycle.io"],
            &["rebootqueueentries/status"],
            &["update"],
        ),
        rule(&["hostcycle.io"], &["rebootqueues/status"], &["patch"]),
        // Reboot queue: readiness, cordon and uncordon. Remediation: release a fenced
        // node (delete, only once its host is off) and restore its labels when it is back.
        rule(
            &[""],
            &["nodes"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        // Reboot queue: drain (list and watch a node's pods, delete those whose eviction
        // a PodDisruptionBudget refuses in an unprotected namespace, or unprotected Job pods).
        rule(&[""], &["pods"], &["list", "watch", "delete"]),
        rule(&[""], &["pods/eviction"], &["create"]),
        // Reboot queue: namespace labels for protectedNamespaces.
        rule(&[""], &["namespaces"], &["list"]),
        // Which Machine a Node belongs to (node → BareMetalHost); remediation keeps its
        // record in a Machine's annotations and, on giving up, deletes an OpenShift
        // Machine or marks a Cluster API one `OwnerRemediated=False`.
        rule(
            &["cluster.x-k8s.io", "machine.openshift.io"],
            &["machines"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        rule(&["cluster.x-k8s.io"], &["machines/status"], &["patch"]),
        // The annotation flow's power-on timeout: the nodeStartupTimeout of the OpenShift
        // MachineHealthCheck that selects the Machine, as OpenShift's own controller reads it.
        rule(
            &["machine.openshift.io"],
            &["machinehealthchecks"],
            &["list"],
        ),
    ]
}

/// The health check's Role in `kube-node-lease`: the kubelets' Leases, watched, and read
/// live before a request (never written).
pub fn node_lease_role() -> Role {
    named_role(
        hostcycle_api::health::NODE_LEASE_NAMESPACE,
        vec![rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch"],
        )],
    )
}

/// Leader election, in the operator's namespace only: the Lease is created once, then read
/// and renewed by name.
pub fn lease_rules(lease_name: &str) -> Vec<PolicyRule> {
    vec![
        // `create` cannot be limited by name (the name is not known when it is authorized).
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        PolicyRule {
            resource_names: Some(vec![lease_name.to_string()]),
            ..rule(&["coordination.k8s.io"], &["leases"], &["get", "patch"])
        },
    ]
}

/// The operator's cluster-wide permissions (everything but the Lease) when it watches every
/// namespace.
pub fn cluster_role() -> ClusterRole {
    let controllers = ControllerName::ALL;
    let mut rules = host_rules(&controllers);
    rules.extend(cluster_rules(&controllers));
    named_cluster_role(rules)
}

fn named_cluster_role(rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    }
}

/// The operator's Role in its own namespace: the leader Lease, and the ConfigMaps holding the
/// annotation flow's records (only the operator and the administrators of its namespace write
/// them; a Machine's annotations are never read back as a record).
pub fn role(options: &RbacOptions) -> Role {
    let mut rules = lease_rules(&options.lease_name);
    rules.push(flow_record_rule());
    named_role(&options.namespace, rules)
}

/// The annotation flow's records: ConfigMaps in the operator's namespace (watched by label;
/// `create` and `list` cannot be limited by name).
pub fn flow_record_rule() -> PolicyRule {
    rule(
        &[""],
        &["configmaps"],
        &["get", "list", "watch", "create", "update", "delete"],
    )
}

/// The Role in the watched namespace of a namespaced install: the hosts, their Secrets and
/// Events there. `None` for a cluster-wide install.
pub fn host_role(options: &RbacOptions) -> Option<Role> {
    let namespace = options.watch_namespace.as_deref()?;
    Some(named_role(namespace, host_rules(&options.controllers)))
}

fn named_role(namespace: &str, rules: Vec<PolicyRule>) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(rules),
    }
}

fn subject(namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: OPERATOR_NAME.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// Binds the Role `hostcycle-operator` of `namespace` to the ServiceAccount of the operator's
/// namespace `operator_namespace` (the same namespace but for a namespaced install's hosts).
pub fn role_binding(namespace: &str, operator_namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: OPERATOR_NAME.into(),
        },
        subjects: Some(vec![subject(operator_namespace)]),
    }
}

/// Label that aggregates a ClusterRole into medik8s NodeHealthCheck's (and OpenShift's
/// machine-api) external-remediation role.
pub const NHC_AGGREGATION_LABEL: &str = "rbac.ext-remediation/aggregate-to-ext-remediation";
/// Label that aggregates a ClusterRole into the Cluster API manager's role.
pub const CAPI_AGGREGATION_LABEL: &str = "cluster.x-k8s.io/aggregate-to-manager";

/// What a health checker needs to drive hostcycle's remediation: read the templates,
/// create and delete the requests. Aggregated into the checker's own role by `label`.
pub fn checker_role(name: &str, label: &str) -> ClusterRole {
    labelled_cluster_role(
        name,
        &[label],
        vec![
            rule(
                &["hostcycle.io"],
                &["hostremediationtemplates"],
                &["get", "list", "watch"],
            ),
            rule(
                &["hostcycle.io"],
                &["hostremediations"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
        ],
    )
}

/// A ClusterRole with hostcycle's labels plus `extra_labels` set to `"true"` (the labels
/// that aggregate it into other roles).
fn labelled_cluster_role(name: &str, extra_labels: &[&str], rules: Vec<PolicyRule>) -> ClusterRole {
    let mut labels = labels();
    for label in extra_labels {
        labels.insert(label.to_string(), "true".to_string());
    }
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    }
}

/// Label on the reboot queue's role pieces that `hostcycle-queue-user` aggregates.
pub const QUEUE_USER_AGGREGATION_LABEL: &str = "hostcycle.io/aggregate-to-queue-user";
/// Label on the reboot queue's role pieces that `hostcycle-queue-admin` aggregates.
pub const QUEUE_ADMIN_AGGREGATION_LABEL: &str = "hostcycle.io/aggregate-to-queue-admin";
/// Kubernetes' label that aggregates a ClusterRole into the built-in `view` role.
pub const VIEW_AGGREGATION_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The reboot queue's roles for people and tools, to bind with ClusterRoleBindings:
///
/// - `hostcycle-queue-viewer`: read the queue and its entries (`list`, `wait`); also
///   aggregated into Kubernetes' `view`.
/// - `hostcycle-queue-user`: the viewer's rules plus what `add` and `cancel` write:
///   entries' spec (create, patch) and the Nodes `add` resolves. Nothing on the
///   RebootQueue: its spec selects how nodes reboot, and the commands themselves are in the
///   operator's namespace, where this role grants nothing.
/// - `hostcycle-queue-admin`: the user's rules plus the RebootQueue itself (`enable`,
///   `disable`, its settings) and entries' status (`reset-backoff`) and deletion.
///
/// The user and admin roles are aggregated (`aggregationRule`) from labelled pieces, so a
/// cluster can add rules to them. Neither is aggregated into `edit` or `admin`: those are
/// bound per namespace, and rebooting Nodes is a cluster-wide power.
pub fn queue_roles() -> Vec<ClusterRole> {
    let piece = labelled_cluster_role;
    let aggregated = |name: &str, label: &str| ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([(label.to_string(), "true".to_string())])),
                ..Default::default()
            }]),
        }),
        // Filled in by the API server's aggregation controller.
        rules: None,
    };
    let read = ["get", "list", "watch"];
    vec![
        piece(
            "hostcycle-queue-viewer",
            &[
                QUEUE_USER_AGGREGATION_LABEL,
                QUEUE_ADMIN_AGGREGATION_LABEL,
                VIEW_AGGREGATION_LABEL,
            ],
            vec![rule(
                &["hostcycle.io"],
                &["rebootqueues", "rebootqueueentries"],
                &read,
            )],
        ),
        piece(
            "hostcycle-queue-user-entries",
            &[QUEUE_USER_AGGREGATION_LABEL, QUEUE_ADMIN_AGGREGATION_LABEL],
            vec![
                rule(
                    &["hostcycle.io"],
                    &["rebootqueueentries"],
                    &["create", "patch"],
                ),
                // `add` accepts Node names and addresses.
                rule(&[""], &["nodes"], &["get", "list"]),
            ],
        ),
        aggregated("hostcycle-queue-user", QUEUE_USER_AGGREGATION_LABEL),
        piece(
            "hostcycle-queue-admin-settings",
            &[QUEUE_ADMIN_AGGREGATION_LABEL],
            vec![
                rule(
                    &["hostcycle.io"],
                    &["rebootqueues"],
                    &["create", "update", "patch", "delete"],
                ),
                rule(
                    &["hostcycle.io"],
                    &["rebootqueueentries"],
                    &["update", "delete"],
                ),
                rule(
                    &["hostcycle.io"],
                    &["rebootqueueentries/status"],
                    &["patch", "update"],
                ),
            ],
        ),
        aggregated("hostcycle-queue-admin", QUEUE_ADMIN_AGGREGATION_LABEL),
    ]
}

pub fn service_account(namespace: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn cluster_role_binding(namespace: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: OPERATOR_NAME.into(),
        },
        subjects: Some(vec![subject(namespace)]),
    }
}

/// A serializable object with its apiVersion and kind filled in.
fn with_type_meta<T: serde::Serialize>(
    obj: &T,
    api_version: &str,
    kind: &str,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(obj)?;
    v["apiVersion"] = serde_json::Value::String(api_version.into());
    v["kind"] = serde_json::Value::String(kind.into());
    Ok(v)
}

/// The operator's ServiceAccount and RBAC as JSON values, ready to serialize: the
/// ServiceAccount and the Lease's Role in the operator's namespace; with a watched namespace,
/// the hosts' Role there (bound to that ServiceAccount); cluster-wide rules only for what
/// cannot be namespaced, and only for the controllers that need them. Refuses what
/// [`RbacOptions::check`] refuses.
pub fn rbac_objects(options: &RbacOptions) -> anyhow::Result<Vec<serde_json::Value>> {
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
    options.check()?;
    let ns = options.namespace.as_str();
    let mut objects = vec![with_type_meta(
        &service_account(ns),
        "v1",
        "ServiceAccount",
    )?];
    objects.push(with_type_meta(&role(options), RBAC, "Role")?);
    objects.push(with_type_meta(&role_binding(ns, ns), RBAC, "RoleBinding")?);
    let mut cluster = match host_role(options) {
        Some(hosts) => {
            let watched = hosts.metadata.namespace.clone().unwrap_or_default();
            objects.push(with_type_meta(&hosts, RBAC, "Role")?);
            objects.push(with_type_meta(
                &role_binding(&watched, ns),
                RBAC,
                "RoleBinding",
            )?);
            Vec::new()
        }
        None => host_rules(&options.controllers),
    };
    cluster.extend(cluster_rules(&options.controllers));
    if !cluster.is_empty() {
        objects.push(with_type_meta(
            &named_cluster_role(cluster),
            RBAC,
            "ClusterRole",
        )?);
        objects.push(with_type_meta(
            &cluster_role_binding(ns),
            RBAC,
            "ClusterRoleBinding",
        )?);
    }
    if options.runs(ControllerName::Remediation) {
        objects.push(with_type_meta(
            &checker_role("hostcycle-nodehealthcheck", NHC_AGGREGATION_LABEL),
            RBAC,
            "ClusterRole",
        )?);
        objects.push(with_type_meta(
            &checker_role("hostcycle-cluster-api", CAPI_AGGREGATION_LABEL),
            RBAC,
            "ClusterRole",
        )?);
    }
    if options.runs(ControllerName::RebootQueue) {
        for role in queue_roles() {
            objects.push(with_type_meta(&role, RBAC, "ClusterRole")?);
        }
    }
    if options.runs(ControllerName::HealthCheck) {
        let lease_namespace = hostcycle_api::health::NODE_LEASE_NAMESPACE;
        objects.push(with_type_meta(&node_lease_role(), RBAC, "Role")?);
        objects.push(with_type_meta(
            &role_binding(lease_namespace, ns),
            RBAC,
            "RoleBinding",
        )?);
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn role_never_grants_wildcards_or_secret_writes() {
        let role = cluster_role();
        for rule in role.rules.unwrap() {
            assert!(!rule.verbs.iter().any(|v| v == "*"), "{rule:?}");
            let resources = rule.resources.unwrap_or_default();
            assert!(!resources.iter().any(|r| r == "*"), "{resources:?}");
            if resources.iter().any(|r| r == "secrets") {
                assert!(
                    rule.verbs
                        .iter()
                        .all(|v| ["get", "list", "watch"].contains(&v.as_str()))
                );
            }
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn objects_carry_type_meta() {
        let objs = rbac_objects(&RbacOptions::cluster_wide("hostcycle-system")).unwrap();
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
                "ClusterRole",
                "ClusterRole",
                // The reboot queue's roles for people (viewer, user, admin and their pieces).
                "ClusterRole",
                "ClusterRole",
                "ClusterRole",
                "ClusterRole",
                "ClusterRole",
                // The health check's Leases in kube-node-lease.
                "Role",
                "RoleBinding"
            ]
        );
        assert_eq!(
            objs[5]["metadata"]["labels"][NHC_AGGREGATION_LABEL], "true",
            "NodeHealthCheck aggregates the role that lets it create HostRemediations"
        );
        assert_eq!(
            objs[6]["metadata"]["labels"][CAPI_AGGREGATION_LABEL],
            "true"
        );
        assert_eq!(objs[4]["subjects"][0]["namespace"], "hostcycle-system");
        assert_eq!(objs[2]["subjects"][0]["namespace"], "hostcycle-system");
    }

    fn grants(rules: &[serde_json::Value], resource: &str) -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| r["verbs"].as_array().unwrap().clone())
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    fn rules_of(objs: &[serde_json::Value], kind: &str) -> Vec<serde_json::Value> {
        objs.iter()
            .filter(|o| o["kind"] == kind && o["metadata"]["name"] == OPERATOR_NAME)
            .flat_map(|o| o["rules"].as_array().unwrap().clone())
            .collect()
    }

    /// The health check reads the kubelets' Leases in kube-node-lease only, by a Role there;
    /// alone, it needs no Pod, Machine or host.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_health_check_reads_node_leases_by_a_role_in_kube_node_lease() {
        let objs = rbac_objects(&RbacOptions::cluster_wide("ops")).unwrap();
        let lease_role = objs
            .iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == "kube-node-lease")
            .unwrap();
        assert_eq!(
            grants(lease_role["rules"].as_array().unwrap(), "leases"),
            ["get", "list", "watch"]
        );
        let binding = objs
            .iter()
            .find(|o| o["kind"] == "RoleBinding" && o["metadata"]["namespace"] == "kube-node-lease")
            .unwrap();
        assert_eq!(binding["subjects"][0]["namespace"], "ops");
        let mut alone = RbacOptions::cluster_wide("ops");
        alone.controllers = vec![ControllerName::HealthCheck];
        let rules = cluster_rules(&alone.controllers);
        let json: Vec<serde_json::Value> = rules
            .iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect();
        assert_eq!(grants(&json, "nodes"), ["get", "list", "watch"]);
        assert_eq!(
            grants(&json, "hostremediations"),
            ["get", "list", "watch", "create", "delete"]
        );
        assert!(grants(&json, "pods").is_empty());
        assert!(grants(&json, "machines").is_empty());
        assert!(grants(&json, "leases").is_empty());
        let mut without = RbacOptions::cluster_wide("ops");
        without.controllers = vec![ControllerName::Remediation];
        let objs = rbac_objects(&without).unwrap();
        assert!(
            !objs
                .iter()
                .any(|o| o["metadata"]["namespace"] == "kube-node-lease")
        );
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn leases_are_granted_only_in_the_operator_namespace_and_by_name() {
        for options in [
            RbacOptions::cluster_wide("ops"),
            RbacOptions::namespaced("ops", "metal"),
        ] {
            let objs = rbac_objects(&options).unwrap();
            assert!(grants(&rules_of(&objs, "ClusterRole"), "leases").is_empty());
            let role = objs.iter().find(|o| o["kind"] == "Role").unwrap();
            assert_eq!(role["metadata"]["namespace"], "ops");
            for rule in role["rules"].as_array().unwrap() {
                if rule["resources"][0] != "leases" {
                    continue;
                }
                let verbs: Vec<&str> = rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                if verbs == ["create"] {
                    continue;
                }
                assert_eq!(verbs, ["get", "patch"]);
                assert_eq!(
                    rule["resourceNames"],
                    serde_json::json!([DEFAULT_LEASE_NAME])
                );
            }
        }
    }

    /// The annotation flow's records are writable by the operator in its own namespace only:
    /// no cluster-wide ConfigMap access (it would let the operator's account, and so anyone
    /// who steals it, rewrite every namespace's configuration).
    #[test]
    #[allow(clippy::unwrap_used)]
    fn flow_records_are_granted_only_in_the_operator_namespace() {
        for options in [
            RbacOptions::cluster_wide("ops"),
            RbacOptions::namespaced("ops", "metal"),
        ] {
            let objs = rbac_objects(&options).unwrap();
            assert!(grants(&rules_of(&objs, "ClusterRole"), "configmaps").is_empty());
            let roles: Vec<&serde_json::Value> =
                objs.iter().filter(|o| o["kind"] == "Role").collect();
            for role in &roles {
                let ns = role["metadata"]["namespace"].as_str().unwrap();
                let verbs = grants(role["rules"].as_array().unwrap(), "configmaps");
                if ns == "ops" {
                    assert_eq!(
                        verbs,
                        ["get", "list", "watch", "create", "update", "delete"],
                        "{options:?}"
                    );
                } else {
                    assert!(verbs.is_empty(), "{ns}: {verbs:?}");
                }
            }
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn namespaced_install_grants_hosts_and_secrets_by_a_role_only() {
        let mut options = RbacOptions::namespaced("ops", "metal");
        options.controllers = vec![ControllerName::BareMetalHost];
        let objs = rbac_objects(&options).unwrap();
        let placed: Vec<(&str, &str)> = objs
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            placed,
            [
                ("ServiceAccount", "ops"),
                ("Role", "ops"),
                ("RoleBinding", "ops"),
                ("Role", "metal"),
                ("RoleBinding", "metal"),
            ],
            "no cluster-wide rule; nothing of the operator's own in the watched namespace"
        );
        let in_ns = |ns: &str| -> Vec<serde_json::Value> {
            objs.iter()
                .filter(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == ns)
                .flat_map(|o| o["rules"].as_array().unwrap().clone())
                .collect()
        };
        let hosts = in_ns("metal");
        assert_eq!(grants(&hosts, "secrets"), ["get", "list", "watch"]);
        assert_eq!(grants(&hosts, "baremetalhosts/status"), ["update"]);
        assert!(grants(&hosts, "leases").is_empty());
        let own = in_ns("ops");
        assert!(grants(&own, "secrets").is_empty());
        assert!(grants(&own, "baremetalhosts").is_empty());
        // The watched namespace's binding names the ServiceAccount of the operator's.
        assert_eq!(objs[4]["subjects"][0]["namespace"], "ops");
        assert_eq!(objs[4]["roleRef"]["kind"], "Role");

        // With the queue and remediation, only what cannot be namespaced is cluster-wide,
        // bound to the ServiceAccount in the operator's namespace.
        let objs = rbac_objects(&RbacOptions::namespaced("ops", "metal")).unwrap();
        let cluster = rules_of(&objs, "ClusterRole");
        assert!(grants(&cluster, "secrets").is_empty());
        assert!(grants(&cluster, "baremetalhosts").is_empty());
        assert!(!grants(&cluster, "nodes").is_empty());
        assert!(!grants(&rules_of(&objs, "Role"), "baremetalhosts").is_empty());
        let binding = objs
            .iter()
            .find(|o| o["kind"] == "ClusterRoleBinding")
            .unwrap();
        assert_eq!(binding["subjects"][0]["namespace"], "ops");
    }

    /// The operator's ServiceAccount never lives where the hosts are, and names are checked.
    #[test]
    fn the_watched_namespace_is_never_the_operators() {
        let error = rbac_objects(&RbacOptions::namespaced("metal", "metal"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--operator-namespace"), "{error}");
        let error = rbac_objects(&RbacOptions::namespaced("ops", "Metal_1"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("\"Metal_1\" is not a valid namespace"),
            "{error}"
        );
        for good in ["a", "metal-1", &"x".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    /// Only the verbs the code calls: hosts are patched (never updated), their status is
    /// replaced (never read or patched through /status), Events are created and patched;
    /// Pods, queues and entries are never read one by one (watches serve them); the queue's
    /// status is patched, entries' and remediations' statuses replaced.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn unused_verbs_are_not_granted() {
        let objs = rbac_objects(&RbacOptions::cluster_wide("ops")).unwrap();
        let rules = rules_of(&objs, "ClusterRole");
        assert_eq!(
            grants(&rules, "baremetalhosts"),
            ["get", "list", "watch", "patch"]
        );
        assert_eq!(grants(&rules, "baremetalhosts/status"), ["update"]);
        let events = grants(&rules, "events");
        assert!(
            events.iter().all(|v| v == "create" || v == "patch"),
            "{events:?}"
        );
        for (resource, verbs) in [
            ("pods", &["list", "watch", "delete"][..]),
            ("pods/eviction", &["create"]),
            ("nodes", &["get", "list", "watch", "patch", "delete"]),
            ("namespaces", &["list"]),
            ("rebootqueues", &["list", "watch", "create"]),
            ("rebootqueues/status", &["patch"]),
            ("rebootqueueentries", &["list", "watch", "delete"]),
            ("rebootqueueentries/status", &["update"]),
            (
                "hostremediations",
                &["get", "list", "watch", "patch", "create", "delete"],
            ),
            ("hostremediations/status", &["update"]),
            ("hosthealthchecks", &["list", "watch"]),
            ("hosthealthchecks/status", &["update"]),
            ("machines/status", &["patch"]),
            ("nodes/status", &["patch"]),
            ("volumeattachments", &["list"]),
        ] {
            assert_eq!(grants(&rules, resource), verbs, "{resource}");
        }
    }
}
