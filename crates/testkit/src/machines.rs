//! Minimal `Machine` CustomResourceDefinitions, as found in the field, for the test rig and the
//! lab: OpenShift's `machines.machine.openshift.io` and Cluster API's
//! `machines.cluster.x-k8s.io`, both `v1beta1`, namespaced, with the status subresource.
//!
//! Their schemas keep every field (`x-kubernetes-preserve-unknown-fields` on the root, `spec`
//! and `status`), so a real Machine's manifest round-trips unchanged; the print columns are
//! upstream's. hostcycle itself never installs these: it finds whichever the server serves by
//! discovery. [`crate::ClusterOptions::default`] installs both; a test that needs a server
//! serving neither sets `crds: hostcycle_api::crds()`.
//!
//! Since `status` is a subresource, creating a Machine drops its status: [`create_machine`]
//! and [`create_machine_object`] write it afterwards through the subresource.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::TestkitError;

/// Annotation on a Machine naming its host: `<namespace>/<name>`.
pub const MACHINE_HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";
/// OpenShift's label for a Machine's role (`master`, `worker`).
pub const OPENSHIFT_MACHINE_ROLE_LABEL: &str = "machine.openshift.io/cluster-api-machine-role";

/// The two Machine kinds found in the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MachineKind {
    /// `machine.openshift.io/v1beta1` (OpenShift's Machine API).
    OpenShift,
    /// `cluster.x-k8s.io/v1beta1` (Cluster API).
    ClusterApi,
}

impl MachineKind {
    pub const ALL: [MachineKind; 2] = [MachineKind::OpenShift, MachineKind::ClusterApi];

    pub fn group(self) -> &'static str {
        match self {
            MachineKind::OpenShift => "machine.openshift.io",
            MachineKind::ClusterApi => "cluster.x-k8s.io",
        }
    }

    pub fn version(self) -> &'static str {
        "v1beta1"
    }

    /// `<group>/v1beta1`.
    pub fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.version())
    }

    /// `machines.<group>`: the CRD's name, and the fully qualified resource for kubectl.
    pub fn crd_name(self) -> String {
        format!("machines.{}", self.group())
    }

    /// The resource, for `Api::<DynamicObject>::namespaced_with`.
    pub fn api_resource(self) -> ApiResource {
        ApiResource {
            group: self.group().into(),
            version: self.version().into(),
            api_version: self.api_version(),
            kind: "Machine".into(),
            plural: "machines".into(),
        }
    }

    /// This kind's minimal CRD.
    pub fn crd(self) -> CustomResourceDefinition {
        match self {
            MachineKind::OpenShift => openshift_machine_crd(),
            MachineKind::ClusterApi => capi_machine_crd(),
        }
    }

    /// `status.nodeRef` naming `node`, as this kind's controllers write it.
    fn node_ref(self, node: &str) -> Value {
        match self {
            MachineKind::OpenShift => json!({ "kind": "Node", "name": node }),
            MachineKind::ClusterApi => json!({ "apiVersion": "v1", "kind": "Node", "name": node }),
        }
    }
}

impl std::fmt::Display for MachineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.crd_name())
    }
}

/// A schema that keeps every field of a Machine.
fn preserving_schema(description: &str) -> Value {
    let kept = |what: &str| {
        json!({
            "type": "object",
            "description": what,
            "x-kubernetes-preserve-unknown-fields": true,
        })
    };
    json!({ "openAPIV3Schema": {
        "type": "object",
        "description": description,
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": kept("Desired state; every field kept."),
            "status": kept("Observed state (status subresource); every field kept."),
        },
    }})
}

fn parse_crd(value: Value) -> CustomResourceDefinition {
    // A literal of this module: it either always parses or never does (unit-tested below).
    serde_json::from_value(value)
        .expect("the Machine CRD literal is a valid CustomResourceDefinition")
}

/// `machines.machine.openshift.io`: OpenShift's Machine (`v1beta1`), minimal, every field kept.
pub fn openshift_machine_crd() -> CustomResourceDefinition {
    let kind = MachineKind::OpenShift;
    let column = |name: &str, path: &str, type_: &str, priority: i32, description: &str| {
        json!({
            "name": name, "jsonPath": path, "type": type_, "priority": priority,
            "description": description,
        })
    };
    parse_crd(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": kind.crd_name() },
        "spec": {
            "group": kind.group(),
            "scope": "Namespaced",
            "names": {
                "kind": "Machine",
                "listKind": "MachineList",
                "plural": "machines",
                "singular": "machine",
            },
            "versions": [{
                "name": kind.version(),
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "additionalPrinterColumns": [
                    column("Phase", ".status.phase", "string", 0, "Phase of machine"),
                    column(
                        "Type",
                        ".metadata.labels['machine\\.openshift\\.io/instance-type']",
                        "string", 0, "Type of instance",
                    ),
                    column(
                        "Region",
                        ".metadata.labels['machine\\.openshift\\.io/region']",
                        "string", 0, "Region associated with machine",
                    ),
                    column(
                        "Zone",
                        ".metadata.labels['machine\\.openshift\\.io/zone']",
                        "string", 0, "Zone associated with machine",
                    ),
                    column("Age", ".metadata.creationTimestamp", "date", 0, "Machine age"),
                    column("Node", ".status.nodeRef.name", "string", 1, "Node associated with machine"),
                    column(
                        "ProviderID", ".spec.providerID", "string", 1,
                        "Provider ID of machine created in cloud provider",
                    ),
                    column(
                        "State",
                        ".metadata.annotations['machine\\.openshift\\.io/instance-state']",
                        "string", 1, "State of instance",
                    ),
                ],
                "schema": preserving_schema(
                    "OpenShift Machine (minimal stand-in from hostcycle-testkit; every field kept)",
                ),
            }],
        },
    }))
}

/// `machines.cluster.x-k8s.io`: Cluster API's Machine (`v1beta1`), minimal, every field kept.
pub fn capi_machine_crd() -> CustomResourceDefinition {
    let kind = MachineKind::ClusterApi;
    let column = |name: &str, path: &str, type_: &str, description: &str| json!({ "name": name, "jsonPath": path, "type": type_, "description": description });
    parse_crd(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": kind.crd_name() },
        "spec": {
            "group": kind.group(),
            "scope": "Namespaced",
            "names": {
                "kind": "Machine",
                "listKind": "MachineList",
                "plural": "machines",
                "singular": "machine",
                "shortNames": ["ma"],
                "categories": ["cluster-api"],
            },
            "versions": [{
                "name": kind.version(),
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "additionalPrinterColumns": [
                    column("Cluster", ".spec.clusterName", "string", "Cluster"),
                    column(
                        "NodeName", ".status.nodeRef.name", "string",
                        "Node name associated with this machine",
                    ),
                    column("ProviderID", ".spec.providerID", "string", "Provider ID"),
                    column(
                        "Phase", ".status.phase", "string",
                        "Machine status such as Terminating/Pending/Running/Failed etc",
                    ),
                    column(
                        "Age", ".metadata.creationTimestamp", "date",
                        "Time duration since creation of Machine",
                    ),
                    column(
                        "Version", ".spec.version", "string",
                        "Kubernetes version associated with this Machine",
                    ),
                ],
                "schema": preserving_schema(
                    "Cluster API Machine (minimal stand-in from hostcycle-testkit; every field kept)",
                ),
            }],
        },
    }))
}

/// `machines.cluster.x-k8s.io` as Cluster API v1.11 and later install it: `v1beta2` served
/// and stored (the version discovery prefers), `v1beta1` still served. Without Cluster API's
/// conversion webhook both versions show the same fields (conversion `None`): a test writes
/// a Machine in the `v1beta2` shape.
pub fn capi_machine_crd_v1beta2() -> CustomResourceDefinition {
    let mut crd = capi_machine_crd();
    if let Some(v1beta1) = crd.spec.versions.first().cloned() {
        let mut v1beta2 = v1beta1.clone();
        v1beta2.name = "v1beta2".into();
        let mut v1beta1 = v1beta1;
        v1beta1.storage = false;
        crd.spec.versions = vec![v1beta1, v1beta2];
    }
    crd
}

/// The `v1beta2` resource of Cluster API's Machine (see [`capi_machine_crd_v1beta2`]).
pub fn capi_machine_v1beta2_resource() -> ApiResource {
    ApiResource {
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        ..MachineKind::ClusterApi.api_resource()
    }
}

/// `machinehealthchecks.machine.openshift.io` (`v1beta1`), minimal, every field kept: where
/// the annotation flow reads `spec.nodeStartupTimeout`.
pub fn openshift_machine_health_check_crd() -> CustomResourceDefinition {
    parse_crd(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "machinehealthchecks.machine.openshift.io" },
        "spec": {
            "group": "machine.openshift.io",
            "scope": "Namespaced",
            "names": {
                "kind": "MachineHealthCheck",
                "listKind": "MachineHealthCheckList",
                "plural": "machinehealthchecks",
                "singular": "machinehealthcheck",
                "shortNames": ["mhc", "mhcs"],
            },
            "versions": [{
                "name": "v1beta1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": preserving_schema(
                    "OpenShift MachineHealthCheck (minimal stand-in from hostcycle-testkit; every \
                     field kept)",
                ),
            }],
        },
    }))
}

/// Both Machine CRDs.
pub fn machine_crds() -> Vec<CustomResourceDefinition> {
    MachineKind::ALL.iter().map(|k| k.crd()).collect()
}

/// A Machine of `kind`: `metal3.io/BareMetalHost: <host namespace>/<host name>` when `host` is
/// given, `status.nodeRef` naming `node` when given, `labels`, and an empty `spec`. The status
/// is only written by [`create_machine_object`] (creating drops it).
pub fn machine(
    kind: MachineKind,
    namespace: &str,
    name: &str,
    host: Option<(&str, &str)>,
    node: Option<&str>,
    labels: &[(&str, &str)],
) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &kind.api_resource())
        .within(namespace)
        .data(json!({ "spec": {} }));
    if let Some((host_ns, host_name)) = host {
        obj.metadata.annotations = Some(
            [(
                MACHINE_HOST_ANNOTATION.to_string(),
                format!("{host_ns}/{host_name}"),
            )]
            .into(),
        );
    }
    if !labels.is_empty() {
        obj.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        );
    }
    if let Some(node) = node {
        obj.data["status"] = json!({ "nodeRef": kind.node_ref(node) });
    }
    obj
}

fn api_err(what: String) -> impl FnOnce(kube::Error) -> TestkitError {
    move |e| TestkitError::Other {
        what,
        message: e.to_string(),
    }
}

/// Creates `obj` (a Machine of `kind`, e.g. from [`machine`]) in its namespace, then writes its
/// `status`, if it has one, through the status subresource, exactly as given (a replace with
/// the new object's resourceVersion; a merge patch would drop nulls, even inside lists).
/// Returns the object as the server has it afterwards.
pub async fn create_machine_object(
    client: &Client,
    kind: MachineKind,
    obj: &DynamicObject,
) -> Result<DynamicObject, TestkitError> {
    let namespace = obj.metadata.namespace.as_deref().unwrap_or("default");
    let name = obj.metadata.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &kind.api_resource());
    let mut created = api
        .create(&PostParams::default(), obj)
        .await
        .map_err(api_err(format!("creating {kind} {namespace}/{name}")))?;
    match obj.data.get("status") {
        Some(status) if !status.is_null() => {
            created.data["status"] = status.clone();
            api.replace_status(&name, &PostParams::default(), &created)
                .await
                .map_err(api_err(format!(
                    "writing the status of {kind} {namespace}/{name}"
                )))
        }
        _ => Ok(created),
    }
}

/// Creates a Machine of `kind` (see [`machine`]) and writes `status.nodeRef` through the status
/// subresource.
pub async fn create_machine(
    client: &Client,
    kind: MachineKind,
    namespace: &str,
    name: &str,
    host: Option<(&str, &str)>,
    node: Option<&str>,
    labels: &[(&str, &str)],
) -> Result<DynamicObject, TestkitError> {
    let obj = machine(kind, namespace, name, host, node, labels);
    create_machine_object(client, kind, &obj).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn crds_are_minimal_namespaced_v1beta1_with_status_and_keep_every_field() {
        for kind in MachineKind::ALL {
            let crd = kind.crd();
            assert_eq!(crd.metadata.name.as_deref(), Some(&*kind.crd_name()));
            assert_eq!(crd.spec.group, kind.group());
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(crd.spec.names.kind, "Machine");
            assert_eq!(crd.spec.names.plural, "machines");
            let [version] = &crd.spec.versions[..] else {
                panic!("{kind}: one version expected");
            };
            assert_eq!(version.name, "v1beta1");
            assert!(version.served && version.storage);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{kind}: status subresource"
            );
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap();
            assert_eq!(schema.x_kubernetes_preserve_unknown_fields, Some(true));
            let props = schema.properties.as_ref().unwrap();
            for field in ["spec", "status"] {
                assert_eq!(
                    props[field].x_kubernetes_preserve_unknown_fields,
                    Some(true),
                    "{kind}: {field} keeps unknown fields"
                );
            }
            let columns = version.additional_printer_columns.as_ref().unwrap();
            for path in [
                ".status.phase",
                ".status.nodeRef.name",
                ".metadata.creationTimestamp",
            ] {
                assert!(
                    columns.iter().any(|c| c.json_path == path),
                    "{kind}: print column {path}"
                );
            }
        }
        assert_eq!(machine_crds().len(), 2);
        assert_eq!(
            capi_machine_crd().spec.names.short_names,
            Some(vec!["ma".into()])
        );
    }

    #[test]
    fn machine_objects_name_their_host_and_node() {
        let m = machine(
            MachineKind::OpenShift,
            "ns",
            "m1",
            Some(("metal", "host-1")),
            Some("node-1"),
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
        );
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["apiVersion"], "machine.openshift.io/v1beta1");
        assert_eq!(v["kind"], "Machine");
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(
            v["metadata"]["annotations"][MACHINE_HOST_ANNOTATION],
            "metal/host-1"
        );
        assert_eq!(
            v["metadata"]["labels"][OPENSHIFT_MACHINE_ROLE_LABEL],
            "worker"
        );
        assert_eq!(
            v["status"]["nodeRef"],
            json!({ "kind": "Node", "name": "node-1" })
        );

        let bare = machine(MachineKind::ClusterApi, "capi", "m2", None, None, &[]);
        let v = serde_json::to_value(&bare).unwrap();
        assert_eq!(v["apiVersion"], "cluster.x-k8s.io/v1beta1");
        assert!(v["metadata"].get("annotations").is_none());
        assert!(v.get("status").is_none());
    }
}
