//! The operator's permissions, generated from code so they stay next to what the code does,
//! and the install manifests built from them (`hostcycle manifests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Name of the ServiceAccount, ClusterRole and ClusterRoleBinding.
pub const OPERATOR_NAME: &str = "hostcycle-operator";

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

/// What the operator may do, and why each rule exists.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(OPERATOR_NAME.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(vec![
            // Watch hosts; remove the suffixless reboot annotation (patch).
            rule(
                &["metal3.io"],
                &["baremetalhosts"],
                &["get", "list", "watch", "patch", "update"],
            ),
            // Record power state, timestamps and errors.
            rule(
                &["metal3.io"],
                &["baremetalhosts/status"],
                &["get", "update", "patch"],
            ),
            // BMC credentials; watched so a fixed Secret takes effect at once.
            rule(&[""], &["secrets"], &["get", "list", "watch"]),
            // Events about hosts (events.k8s.io/v1).
            rule(
                &["events.k8s.io"],
                &["events"],
                &["create", "patch", "update"],
            ),
            // Leader election.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "list", "watch", "create", "update", "patch"],
            ),
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
            // Remediation requests: read, finalizer, status.
            rule(
                &["hostcycle.io"],
                &["hostremediations"],
                &["get", "list", "watch", "patch"],
            ),
            rule(
                &["hostcycle.io"],
                &["hostremediations/status"],
                &["update", "patch"],
            ),
        ]),
        ..Default::default()
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
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: OPERATOR_NAME.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
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

/// The ServiceAccount, ClusterRole and ClusterRoleBinding as JSON values, ready to serialize.
pub fn rbac_objects(namespace: &str) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    Ok(vec![
        with_type_meta(&service_account(namespace), "v1", "ServiceAccount")?,
        with_type_meta(
            &cluster_role(),
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
        )?,
        with_type_meta(
            &cluster_role_binding(namespace),
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
        )?,
        with_type_meta(
            &checker_role("hostcycle-nodehealthcheck", NHC_AGGREGATION_LABEL),
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
        )?,
        with_type_meta(
            &checker_role("hostcycle-cluster-api", CAPI_AGGREGATION_LABEL),
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
        )?,
    ])
}

#[cfg(test)]
mod tests {
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
        let objs = rbac_objects("hostcycle-system").unwrap();
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "ClusterRole",
                "ClusterRole"
            ]
        );
        assert_eq!(
            objs[3]["metadata"]["labels"][NHC_AGGREGATION_LABEL], "true",
            "NodeHealthCheck aggregates the role that lets it create HostRemediations"
        );
        assert_eq!(
            objs[4]["metadata"]["labels"][CAPI_AGGREGATION_LABEL],
            "true"
        );
        assert_eq!(objs[2]["subjects"][0]["namespace"], "hostcycle-system");
    }
}
