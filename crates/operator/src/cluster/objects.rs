//! The objects every controller reads, and the reductions of them they share: the Machine
//! kinds this server serves (by discovery), a Machine with the resource it was read through,
//! and the facts the host binding ([`hostcycle_core::binding`]) reads. One place, so that no
//! controller module imports another's, and every controller binds hosts the same way.

use std::collections::HashSet;

use hostcycle_api::BareMetalHost;
use hostcycle_api::host::{MAX_NAME_LEN, MAX_NAMESPACE_LEN};
use hostcycle_api::queue::HostReference;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HostRemediation, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, NODE_SPEC_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, REMEDIATION_FAILED_ANNOTATION,
    REMEDIATION_HOST_ANNOTATION, REMEDIATION_HOST_BMC_ANNOTATION, REMEDIATION_JOINED_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION, REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION, RemediationStep,
};
use hostcycle_api::{is_detached, is_paused};
use hostcycle_core::binding::{
    BindingIndex, HostFacts, MACHINE_HOST_ANNOTATION, MachineFacts, NodeFacts, ObjectKey,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube::{Client, Resource, ResourceExt};

/// API groups whose `Machine` kind may point at BareMetalHosts.
pub const MACHINE_GROUPS: [&str; 2] = ["cluster.x-k8s.io", "machine.openshift.io"];

/// The `Machine` resources this server serves, found by discovery (none is required).
pub async fn machine_resources(client: &Client) -> Vec<ApiResource> {
    let mut found = Vec::new();
    for group in MACHINE_GROUPS {
        if let Ok(g) = kube::discovery::group(client, group).await
            && let Some((resource, _)) = g.recommended_kind("Machine")
        {
            found.push(resource);
        }
    }
    found
}

/// A host's namespace and name.
pub fn host_reference(host: &BareMetalHost) -> HostReference {
    HostReference {
        namespace: host.namespace().unwrap_or_default(),
        name: host.name_any(),
    }
}

/// Why hostcycle cannot power this host at all now: paused, detached, or no BMC address
/// (words that follow "it" or the host's name).
fn host_unmanaged(host: &BareMetalHost) -> Option<String> {
    let annotations = host.annotations_or_empty();
    if is_paused(annotations) {
        Some("is paused (baremetalhost.metal3.io/paused)".to_string())
    } else if is_detached(annotations) {
        Some("is detached (baremetalhost.metal3.io/detached)".to_string())
    } else if host
        .spec
        .bmc
        .as_ref()
        .is_none_or(|b| b.address.trim().is_empty())
    {
        Some("has no spec.bmc.address".to_string())
    } else {
        None
    }
}

/// Why the reboot queue cannot reboot through this host now (paused, detached, offline, no
/// BMC), if so.
pub fn host_unusable(host: &BareMetalHost) -> Option<String> {
    host_unmanaged(host).or_else(|| {
        (!host.spec.online)
            .then(|| "is offline (spec.online: false); it would not power back on".to_string())
    })
}

/// Why a remediation cannot power this host off now (`disablePowerOff`, paused, detached, no
/// BMC), if so. (`spec.online: false` is a blocker of its own.)
pub fn host_cannot_power_off(host: &BareMetalHost) -> Option<String> {
    if host.spec.disable_power_off {
        return Some("has spec.disablePowerOff set (power is never cut)".to_string());
    }
    host_unmanaged(host)
}

/// The host controller's error, when its status reports one (`operationalStatus: error`):
/// its power state may be old. Bounded for messages; never empty.
pub fn host_error(host: &BareMetalHost) -> Option<String> {
    host.status
        .as_ref()
        .filter(|s| s.operational_status == Some(hostcycle_api::OperationalStatus::Error))
        .map(|s| {
            let text = crate::text::bounded(&s.error_message, 300);
            if text.is_empty() {
                "operationalStatus: error".to_string()
            } else {
                text
            }
        })
}

/// What binds a host: its name, uid and consumer.
pub fn host_facts(host: &BareMetalHost) -> HostFacts {
    let namespace = host.namespace().unwrap_or_default();
    HostFacts {
        reference: host_reference(host),
        uid: host.uid().unwrap_or_default(),
        consumer: host.spec.consumer_ref.as_ref().map(|c| ObjectKey {
            kind: reference_field(c.kind.as_deref().unwrap_or_default(), MAX_NAME_LEN),
            namespace: reference_field(
                c.namespace.as_deref().unwrap_or(&namespace),
                MAX_NAMESPACE_LEN,
            ),
            name: reference_field(c.name.as_deref().unwrap_or_default(), MAX_NAME_LEN),
        }),
    }
}

/// A field of a host's `consumerRef`, clipped when it is longer than any Kubernetes object's
/// (a host written before the CRD's `maxLength`, or under metal3's CRD, which has none): the
/// clipped text (ending in `…`, which no object name holds) links no Machine yet still claims
/// its host, and messages that name the consumer stay short.
fn reference_field(value: &str, max: usize) -> String {
    if value.len() <= max {
        value.to_string()
    } else {
        hostcycle_core::text::bounded(value, 48)
    }
}

/// The key a Machine is known by in the binding (its kind, namespace and name).
pub fn machine_key(machine: &DynamicObject) -> ObjectKey {
    ObjectKey {
        kind: machine
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_else(|| "Machine".into()),
        namespace: machine.namespace().unwrap_or_default(),
        name: machine.name_any(),
    }
}

/// What binds a Machine (any of [`MACHINE_GROUPS`]): its node, host annotation and
/// infrastructure.
pub fn machine_facts(machine: &DynamicObject) -> MachineFacts {
    let namespace = machine.namespace().unwrap_or_default();
    let str_at = |v: &serde_json::Value, path: &[&str]| -> Option<String> {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    };
    MachineFacts {
        key: machine_key(machine),
        node_name: str_at(&machine.data, &["status", "nodeRef", "name"]),
        host_annotation: machine.annotations().get(MACHINE_HOST_ANNOTATION).cloned(),
        infrastructure: machine
            .data
            .get("spec")
            .and_then(|s| s.get("infrastructureRef"))
            .map(|r| ObjectKey {
                kind: str_at(r, &["kind"]).unwrap_or_default(),
                namespace: str_at(r, &["namespace"]).unwrap_or_else(|| namespace.clone()),
                name: str_at(r, &["name"]).unwrap_or_default(),
            }),
    }
}

/// What binds a Node: its name, provider ID and host annotation.
pub fn node_facts(node: &Node) -> NodeFacts {
    NodeFacts::new(
        &node.name_any(),
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        node.annotations(),
    )
}

/// The binding index of one moment: every host, Machine and Node.
pub fn binding_index<'a>(
    hosts: impl IntoIterator<Item = &'a BareMetalHost>,
    machines: impl IntoIterator<Item = &'a DynamicObject>,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> BindingIndex {
    BindingIndex::new(
        hosts.into_iter().map(host_facts),
        machines.into_iter().map(machine_facts),
        nodes.into_iter().map(node_facts),
    )
}

/// Annotations the annotation flow keeps on a Machine; any of them means a flow to follow.
pub const MACHINE_RECORD_ANNOTATIONS: [&str; 13] = [
    EXTERNAL_REMEDIATION_ANNOTATION,
    REMEDIATION_HOST_ANNOTATION,
    REMEDIATION_HOST_BMC_ANNOTATION,
    REMEDIATION_JOINED_ANNOTATION,
    NODE_SPEC_BACKUP_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION,
    REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    POWER_ON_TIMEOUT_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION,
    NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION,
];

/// A Machine with the API resource it was read through. Shared with the watch cache: the
/// loops look at every Machine on every pass and copy none.
#[derive(Clone)]
pub struct MachineObject {
    pub object: std::sync::Arc<DynamicObject>,
    pub resource: ApiResource,
}

impl MachineObject {
    pub fn group(&self) -> &str {
        &self.resource.group
    }

    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.resource.group,
            self.object.namespace().unwrap_or_default(),
            self.object.name_any()
        )
    }

    /// `status.nodeRef.name`.
    pub fn node_ref(&self) -> Option<String> {
        self.object
            .data
            .get("status")
            .and_then(|s| s.get("nodeRef"))
            .and_then(|r| r.get("name"))
            .and_then(|n| n.as_str())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    }

    /// Carries the trigger or any of the flow's records.
    pub fn has_flow(&self) -> bool {
        let a = self.object.annotations();
        MACHINE_RECORD_ANNOTATIONS
            .iter()
            .any(|k| a.contains_key(*k))
    }

    pub fn triggered(&self) -> bool {
        self.object.meta().deletion_timestamp.is_none()
            && self
                .object
                .annotations()
                .contains_key(EXTERNAL_REMEDIATION_ANNOTATION)
    }

    /// Has an owner reference with `controller: true`.
    pub fn has_controller_owner(&self) -> bool {
        self.object
            .meta()
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true))
    }
}

/// Nodes some remediation is working on (the trigger is set, or the flow is under way), for
/// the reboot queue: it never drains or reboots them meanwhile.
pub fn nodes_being_remediated(
    machines: &[MachineObject],
    requests: &[HostRemediation],
) -> HashSet<String> {
    let mut out = HashSet::new();
    for m in machines {
        let annotations = m.object.annotations();
        let active = m.has_flow()
            && (annotations.contains_key(EXTERNAL_REMEDIATION_ANNOTATION)
                || !annotations
                    .contains_key(hostcycle_api::remediation::REMEDIATION_FAILED_ANNOTATION));
        if active && let Some(n) = m.node_ref() {
            out.insert(n);
        }
    }
    for r in requests {
        let step = r.status.as_ref().map(|s| s.step).unwrap_or_default();
        let active = !matches!(
            step,
            RemediationStep::Done | RemediationStep::GaveUp | RemediationStep::Cancelled
        );
        if active {
            out.extend(request_node(r, machines));
        }
    }
    out
}

/// The node a remediation request is about: its status, NodeHealthCheck's annotation, its
/// owner Machine's `status.nodeRef`, or (no Machine owner) its name.
pub fn request_node(r: &HostRemediation, machines: &[MachineObject]) -> Option<String> {
    // A request named after its Machine says its Node only once it wrote its status.
    let owner = r
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Machine");
    r.status
        .as_ref()
        .and_then(|s| s.node.clone())
        .or_else(|| {
            r.annotations()
                .get(hostcycle_api::remediation::NHC_NODE_NAME_ANNOTATION)
                .cloned()
        })
        .or_else(|| match owner {
            // Not started yet: its Machine says which Node.
            Some(o) => machines
                .iter()
                .find(|m| m.object.uid().as_deref() == Some(o.uid.as_str()))
                .and_then(MachineObject::node_ref),
            None => Some(r.name_any()),
        })
}

#[cfg(test)]
mod bounds_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A consumerRef beyond any object name's length (a host from before the CRD's limits)
    /// still claims its host, is short wherever it is named, and links no Machine.
    #[test]
    fn an_over_long_consumer_ref_is_clipped_and_links_nothing() {
        let host: BareMetalHost = serde_json::from_value(serde_json::json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": { "name": "h", "namespace": "hosts", "uid": "u" },
            "spec": { "online": true, "consumerRef": {
                "kind": "Machine", "name": "m".repeat(100_000), "namespace": "hosts",
            } },
        }))
        .unwrap();
        let consumer = host_facts(&host).consumer.unwrap();
        assert_eq!(consumer.kind, "Machine");
        assert_eq!(consumer.namespace, "hosts");
        assert!(
            consumer.name.len() <= 48 && consumer.name.ends_with('…'),
            "{}",
            consumer.name
        );
        let at_limit: BareMetalHost = serde_json::from_value(serde_json::json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": { "name": "h", "namespace": "hosts", "uid": "u" },
            "spec": { "online": true, "consumerRef": {
                "kind": "Machine", "name": "m".repeat(MAX_NAME_LEN),
            } },
        }))
        .unwrap();
        assert_eq!(
            host_facts(&at_limit).consumer.unwrap().name.len(),
            MAX_NAME_LEN
        );
    }
}
