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
            // Reboot queue: readiness, cordon and uncordon.
            rule(&[""], &["nodes"], &["get", "list", "watch", "patch"]),
            // Reboot queue: drain (list and watch a node's pods, delete those whose eviction
            // a PodDisruptionBudget refuses in an unprotected namespace, or unprotected Job pods).
            rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
            rule(&[""], &["pods/eviction"], &["create"]),
            // Reboot queue: namespace labels for protectedNamespaces.
            rule(&[""], &["namespaces"], &["list"]),
            // Reboot queue: which Machine a Node belongs to (node → BareMetalHost).
            rule(
                &["cluster.x-k8s.io", "machine.openshift.io"],
                &["machines"],
                &["get", "list", "watch"],
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
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
        );
        assert_eq!(objs[2]["subjects"][0]["namespace"], "hostcycle-system");
    }
}
