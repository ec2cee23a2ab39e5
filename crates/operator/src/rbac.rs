//! The operator's permissions, generated from code so they stay next to what the code does,
//! and the install manifests built from them (`hostcycle manifests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
    /// The operator's namespace: its ServiceAccount and its leader Lease.
    pub namespace: String,
    /// The operator runs with `--namespace` set to `namespace`: hosts, their Secrets and
    /// their Events are granted by a Role there instead of cluster-wide.
    pub namespaced: bool,
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
            namespaced: false,
            controllers: ControllerName::ALL.to_vec(),
            lease_name: DEFAULT_LEASE_NAME.to_string(),
        }
    }

    /// Hosts only in `namespace`, where the operator runs too.
    pub fn namespaced(namespace: &str) -> Self {
        RbacOptions {
            namespaced: true,
            ..RbacOptions::cluster_wide(namespace)
        }
    }

    fn runs(&self, controller: ControllerName) -> bool {
        self.controllers.contains(&controller)
    }
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
    if !queue && !remediation {
        return Vec::new();
    }
    let mut rules = vec![
        // Events about Nodes (in kube-system), queue entries, Machines and remediations.
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        // Reboot queue: read the configuration; create `default` when it is missing.
        rule(
            &["hostcycle.io"],
            &["rebootqueues"],
            &["get", "list", "watch", "create"],
        ),
        // Reboot queue: entries are read and removed when done; `spec` is never written.
        rule(
            &["hostcycle.io"],
            &["rebootqueueentries"],
            &["get", "list", "watch", "delete"],
        ),
        // Reboot queue: the controller's record of each entry and of the queue.
        rule(
            &["hostcycle.io"],
            &["rebootqueueentries/status", "rebootqueues/status"],
            &["update", "patch"],
        ),
        // Reboot queue: readiness, cordon and uncordon. Remediation: release a fenced
        // node (delete, only once its host is off) and restore its labels when it is back.
        rule(
            &[""],
            &["nodes"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        // Reboot queue: drain (list and watch a node's pods, delete those whose eviction
        // a PodDisruptionBudget refuses in an unprotected namespace, or unprotected Job pods).
        rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
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
    ];
    // Remediation requests: read, finalizer, status (the queue watches them too).
    rules.push(rule(
        &["hostcycle.io"],
        &["hostremediations"],
        if remediation {
            &["get", "list", "watch", "patch"]
        } else {
            &["get", "list", "watch"]
        },
    ));
    if remediation {
        rules.push(rule(
            &["hostcycle.io"],
            &["hostremediations/status"],
            &["update", "patch"],
        ));
    }
    rules
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

/// The operator's Role in its own namespace: the Lease, and with `namespaced` the hosts,
/// their Secrets and Events.
pub fn role(options: &RbacOptions) -> Role {
    let mut rules = Vec::new();
    if options.namespaced {
        rules.extend(host_rules(&options.controllers));
    }
    rules.extend(lease_rules(&options.lease_name));
    Role {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            namespace: Some(options.namespace.clone()),
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

pub fn role_binding(namespace: &str) -> RoleBinding {
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
        subjects: Some(vec![subject(namespace)]),
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
    let mut labels = labels();
    labels.insert(label.to_string(), "true".to_string());
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        rules: Some(vec![
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
        ]),
        ..Default::default()
    }
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

/// The operator's ServiceAccount and RBAC as JSON values, ready to serialize: cluster-wide
/// rules only for what cannot be namespaced, the Lease in a Role of the operator's namespace,
/// and with `namespaced` the hosts' rules in that Role too.
pub fn rbac_objects(options: &RbacOptions) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
    let ns = options.namespace.as_str();
    let mut objects = vec![with_type_meta(
        &service_account(ns),
        "v1",
        "ServiceAccount",
    )?];
    let mut cluster = if options.namespaced {
        Vec::new()
    } else {
        host_rules(&options.controllers)
    };
    cluster.extend(cluster_rules(&options.controllers));
    objects.push(with_type_meta(&role(options), RBAC, "Role")?);
    objects.push(with_type_meta(&role_binding(ns), RBAC, "RoleBinding")?);
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
                "ClusterRole"
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

    #[test]
    #[allow(clippy::unwrap_used)]
    fn leases_are_granted_only_in_the_operator_namespace_and_by_name() {
        for options in [
            RbacOptions::cluster_wide("ops"),
            RbacOptions::namespaced("ops"),
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

    #[test]
    #[allow(clippy::unwrap_used)]
    fn namespaced_install_grants_hosts_and_secrets_by_a_role_only() {
        let mut options = RbacOptions::namespaced("metal");
        options.controllers = vec![ControllerName::BareMetalHost];
        let objs = rbac_objects(&options).unwrap();
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "Role", "RoleBinding"],
            "no cluster-wide rule"
        );
        let role = rules_of(&objs, "Role");
        assert_eq!(grants(&role, "secrets"), ["get", "list", "watch"]);
        assert_eq!(grants(&role, "baremetalhosts/status"), ["update"]);

        // With the queue and remediation, only what cannot be namespaced is cluster-wide.
        let objs = rbac_objects(&RbacOptions::namespaced("metal")).unwrap();
        let cluster = rules_of(&objs, "ClusterRole");
        assert!(grants(&cluster, "secrets").is_empty());
        assert!(grants(&cluster, "baremetalhosts").is_empty());
        assert!(!grants(&cluster, "nodes").is_empty());
        assert!(!grants(&rules_of(&objs, "Role"), "baremetalhosts").is_empty());
    }

    /// Only the verbs the code calls: hosts are patched (never updated), their status is
    /// replaced (never read or patched through /status), Events are created and patched.
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
    }
}
