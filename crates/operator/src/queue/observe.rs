//! Observe: the objects the queue decides from, reduced for `hostcycle_core::queue`, and how
//! each node maps to its BareMetalHost. Shared by the controller and `hostcycle rq plan`.

use std::collections::BTreeMap;

use hostcycle_api::queue::{HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_api::{BareMetalHost, REBOOT_ANNOTATION};
use hostcycle_core::queue::host::{HostSummary, MachineSummary, reboot_target};
use hostcycle_core::queue::reboot::{HostView, REQUEST_MARKER_ANNOTATION};
use hostcycle_core::queue::{QueueSnapshot, RebootTarget};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};

use crate::cluster::objects::{
    MachineObject, host_summary, machine_resources, machine_summary, node_identity,
    nodes_being_remediated,
};

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
            machine_objects.extend(list.items.into_iter().map(|object| MachineObject {
                object: std::sync::Arc::new(object),
                resource: resource.clone(),
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
    snapshot.being_remediated = nodes_being_remediated(&machine_objects, &requests)
        .into_iter()
        .collect();
    Ok(snapshot)
}
