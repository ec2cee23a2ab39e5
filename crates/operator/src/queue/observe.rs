//! Observe: the objects the queue decides from, reduced for `hostcycle_core::queue`, and how
//! each node maps to its BareMetalHost. Shared by the controller and `hostcycle rq plan`.

use std::collections::BTreeMap;

use hostcycle_api::queue::{HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_api::{BareMetalHost, REBOOT_ANNOTATION, is_detached, is_paused};
use hostcycle_core::queue::host::{
    HostSummary, MACHINE_HOST_ANNOTATION, MachineSummary, NodeIdentity, ObjectKey, reboot_target,
};
use hostcycle_core::queue::reboot::{HostView, REQUEST_MARKER_ANNOTATION};
use hostcycle_core::queue::{QueueSnapshot, RebootTarget};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};

/// API groups whose `Machine` kind may point at BareMetalHosts.
pub const MACHINE_GROUPS: [&str; 2] = ["cluster.x-k8s.io", "machine.openshift.io"];

/// A host reduced for the node→host mapping.
pub fn host_summary(host: &BareMetalHost) -> HostSummary {
    let namespace = host.namespace().unwrap_or_default();
    let annotations = host.annotations_or_empty();
    let unusable = if is_paused(annotations) {
        Some("is paused (baremetalhost.metal3.io/paused)".to_string())
    } else if is_detached(annotations) {
        Some("is detached (baremetalhost.metal3.io/detached)".to_string())
    } else if !host.spec.online {
        Some("is offline (spec.online: false); it would not power back on".to_string())
    } else if host
        .spec
        .bmc
        .as_ref()
        .is_none_or(|b| b.address.trim().is_empty())
    {
        Some("has no spec.bmc.address".to_string())
    } else {
        None
    };
    HostSummary {
        reference: HostReference {
            namespace: namespace.clone(),
            name: host.name_any(),
        },
        uid: host.uid().unwrap_or_default(),
        consumer: host.spec.consumer_ref.as_ref().map(|c| ObjectKey {
            kind: c.kind.clone().unwrap_or_default(),
            namespace: c.namespace.clone().unwrap_or_else(|| namespace.clone()),
            name: c.name.clone().unwrap_or_default(),
        }),
        unusable,
    }
}

/// A host as the boot check reads it.
pub fn host_view(host: &BareMetalHost) -> HostView {
    let annotations = host.annotations_or_empty();
    let status = host.status.as_ref();
    HostView {
        reference: HostReference {
            namespace: host.namespace().unwrap_or_default(),
            name: host.name_any(),
        },
        reboot_annotation: annotations.contains_key(REBOOT_ANNOTATION),
        request_marker: annotations.get(REQUEST_MARKER_ANNOTATION).cloned(),
        powered_on: status.and_then(|s| s.observed_powered_on()),
        last_powered_on: status.and_then(|s| s.provisioning.last_powered_on),
    }
}

/// A Machine (any of [`MACHINE_GROUPS`]) reduced for the mapping.
pub fn machine_summary(machine: &DynamicObject) -> MachineSummary {
    let namespace = machine.namespace().unwrap_or_default();
    let str_at = |v: &serde_json::Value, path: &[&str]| -> Option<String> {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    };
    MachineSummary {
        key: ObjectKey {
            kind: machine
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_else(|| "Machine".into()),
            namespace: namespace.clone(),
            name: machine.name_any(),
        },
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

/// A Node reduced for the mapping.
pub fn node_identity(node: &Node) -> NodeIdentity {
    NodeIdentity {
        name: node.name_any(),
        provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()),
        annotations: node.metadata.annotations.clone().unwrap_or_default(),
    }
}

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

/// Every Machine of the given resources; a resource that cannot be listed is skipped with a
/// warning (the mapping then falls back to the other rules).
pub async fn list_machines(client: &Client, resources: &[ApiResource]) -> Vec<MachineSummary> {
    let mut out = Vec::new();
    for resource in resources {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => out.extend(list.items.iter().map(machine_summary)),
            Err(e) => tracing::warn!(
                group = %resource.group, error = %e,
                "cannot list Machines; nodes are mapped to hosts without them"
            ),
        }
    }
    out
}

/// Reboot targets for every node that has an entry.
pub fn reboot_targets(
    nodes: &[Node],
    entry_nodes: &[&str],
    hosts: &[HostSummary],
    machines: &[MachineSummary],
) -> BTreeMap<String, RebootTarget> {
    nodes
        .iter()
        .filter(|n| entry_nodes.contains(&n.name_any().as_str()))
        .map(|n| {
            (
                n.name_any(),
                reboot_target(&node_identity(n), hosts, machines),
            )
        })
        .collect()
}

/// Reads the queue's world straight from the API server (for `hostcycle rq plan`): the
/// `default` RebootQueue, every Node and entry, and the reboot target of each queued node.
pub async fn load_snapshot(client: &Client) -> Result<QueueSnapshot, kube::Error> {
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let queue = queues.get_opt(REBOOT_QUEUE_NAME).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let entries = Api::<RebootQueueEntry>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut snapshot = QueueSnapshot::from_objects(queue.as_ref(), &nodes, &entries);
    // Hosts are optional: a cluster without the BareMetalHost CRD reboots by command.
    let hosts: Vec<HostSummary> = match Api::<BareMetalHost>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items.iter().map(host_summary).collect(),
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    let resources = machine_resources(client).await;
    let mut machine_objects = Vec::new();
    for resource in &resources {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        if let Ok(list) = api.list(&ListParams::default()).await {
            machine_objects.extend(list.items.into_iter().map(|object| {
                crate::remediation::observe::MachineObject {
                    object: std::sync::Arc::new(object),
                    resource: resource.clone(),
                }
            }));
        }
    }
    let machines: Vec<MachineSummary> = machine_objects
        .iter()
        .map(|m| machine_summary(&m.object))
        .collect();
    let entry_nodes: Vec<&str> = entries.iter().map(|e| e.spec.node.as_str()).collect();
    snapshot.reboot_targets = reboot_targets(&nodes, &entry_nodes, &hosts, &machines);
    let requests = match Api::<hostcycle_api::remediation::HostRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    snapshot.being_remediated =
        crate::remediation::controller::nodes_being_remediated(&machine_objects, &requests)
            .into_iter()
            .collect();
    Ok(snapshot)
}
