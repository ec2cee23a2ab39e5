//! Observe: the objects the queue decides from, reduced for `hostcycle_core::queue`, and the
//! host each queued node is bound to (`hostcycle_core::binding`). Shared by the controller and
//! `hostcycle rq plan`.

use crate::cluster::errors::is_not_found;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hostcycle_api::queue::{HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_api::{BareMetalHost, PowerTarget, REBOOT_ANNOTATION};
use hostcycle_core::binding::BindingIndex;
use hostcycle_core::queue::host::reboot_target;
use hostcycle_core::queue::reboot::{QueueHostView, REQUEST_MARKER_ANNOTATION};
use hostcycle_core::queue::{QueueSnapshot, RebootTarget};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::cluster::objects::{
    MachineObject, binding_index, host_reference, host_unusable, machine_resources,
    nodes_being_remediated,
};

/// A host as the boot check and a cancel read it.
pub fn host_view(host: &BareMetalHost) -> QueueHostView {
    let annotations = host.annotations_or_empty();
    let status = host.status.as_ref();
    let power_off_requested_at = status
        .and_then(|s| s.last_power_action.as_ref())
        .filter(|a| a.action == PowerTarget::Off)
        .map(|a| a.requested_at);
    let pending_since = status.and_then(|s| s.provisioning.pending_reboot_since);
    QueueHostView {
        reference: host_reference(host),
        uid: host.uid().unwrap_or_default(),
        reboot_annotation: annotations.contains_key(REBOOT_ANNOTATION),
        request_marker: annotations.get(REQUEST_MARKER_ANNOTATION).cloned(),
        powered_on: status.and_then(|s| s.observed_powered_on()),
        last_powered_on: status.and_then(|s| s.provisioning.last_powered_on),
        last_updated: status.and_then(|s| s.last_updated),
        error: crate::cluster::objects::host_error(host),
        request_taken_at: power_off_requested_at.max(pending_since),
    }
}

/// Reboot targets for every node that has an entry and a Node: the host the binding gives
/// it, if it can be used now.
pub fn reboot_targets<'a>(
    index: &BindingIndex,
    entry_nodes: impl IntoIterator<Item = &'a str>,
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> BTreeMap<String, RebootTarget> {
    let nodes = index.node_names();
    entry_nodes
        .into_iter()
        .filter(|n| nodes.contains(n))
        .map(|n| {
            let target = reboot_target(index, n, |r| {
                hosts
                    .get(r)
                    .and_then(|h| host_unusable(h))
                    .or_else(|| (!hosts.contains_key(r)).then(|| "does not exist".to_string()))
            });
            (n.to_string(), target)
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
    let hosts: Vec<BareMetalHost> = match Api::<BareMetalHost>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) if is_not_found(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    let resources = machine_resources(client).await;
    let mut machine_objects = Vec::new();
    for resource in &resources {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                machine_objects.extend(list.items.into_iter().map(|object| MachineObject {
                    object: Arc::new(object),
                    resource: resource.clone(),
                }))
            }
            Err(e) => tracing::warn!(
                group = %resource.group, error = %e,
                "cannot list Machines; nodes are bound to hosts without them"
            ),
        }
    }
    let index = binding_index(
        hosts.iter(),
        machine_objects.iter().map(|m| &*m.object),
        nodes.iter(),
    );
    let by_ref: HashMap<HostReference, Arc<BareMetalHost>> = hosts
        .into_iter()
        .map(|h| (host_reference(&h), Arc::new(h)))
        .collect();
    snapshot.reboot_targets = reboot_targets(
        &index,
        entries.iter().map(|e| e.spec.node.as_str()),
        &by_ref,
    );
    let requests = match Api::<hostcycle_api::remediation::HostRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) if is_not_found(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    snapshot.being_remediated = nodes_being_remediated(&machine_objects, &requests)
        .into_iter()
        .collect();
    Ok(snapshot)
}
