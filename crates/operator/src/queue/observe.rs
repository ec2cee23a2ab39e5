//! Observe: the objects the queue decides from, reduced for `hostcycle_core::queue`, and the
//! host each queued node is bound to (`hostcycle_core::binding`). Shared by the controller and
//! `hostcycle rq plan`.

use crate::cluster::errors::is_not_found;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use hostcycle_api::queue::{HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_api::remediation::{HostRemediation, MACHINE_POWER_OFF_ANNOTATION};
use hostcycle_api::{BareMetalHost, PowerTarget, REBOOT_ANNOTATION};
use hostcycle_core::binding::BindingIndex;
use hostcycle_core::queue::away::{AwayFacts, AwayMachine, AwayRequest, HeldHost, held_off};
use hostcycle_core::queue::host::reboot_target;
use hostcycle_core::queue::reboot::{QueueHostView, REQUEST_MARKER_ANNOTATION};
use hostcycle_core::queue::{QueueSnapshot, RebootTarget};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::cluster::objects::{
    MachineObject, binding_index, host_reference, host_unusable, machine_key, machine_resources,
    nodes_being_remediated, request_node,
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

/// Fills in what the gate reads of remediations, Machines and hosts: the nodes being
/// remediated (`snapshot.being_remediated`: never drained or rebooted meanwhile) and every
/// node away (`snapshot.away`, [`hostcycle_core::queue::away::away_nodes`]). The one function
/// for the controller and `hostcycle rq plan`. Returns the held-off hosts a node is bound to
/// (their changes matter to the queue).
pub fn fill_gate_view(
    snapshot: &mut QueueSnapshot,
    index: &BindingIndex,
    machines: &[MachineObject],
    requests: &[HostRemediation],
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> BTreeSet<HostReference> {
    snapshot.being_remediated = nodes_being_remediated(machines, requests)
        .into_iter()
        .collect();
    let facts = AwayFacts {
        machines: away_machines(index, machines, hosts),
        requests: requests
            .iter()
            .filter_map(|r| {
                Some(AwayRequest {
                    name: format!(
                        "HostRemediation {}/{}",
                        r.namespace().unwrap_or_default(),
                        r.name_any()
                    ),
                    node: request_node(r, machines)?,
                    step: r.status.as_ref().map(|s| s.step).unwrap_or_default(),
                    labels_backup: r
                        .status
                        .as_ref()
                        .and_then(|s| s.node_labels_backup.as_ref()),
                })
            })
            .collect(),
        hosts: held_hosts(index, hosts),
    };
    snapshot.away = hostcycle_core::queue::away::away_nodes(&snapshot.nodes, &facts);
    facts.hosts.into_iter().map(|h| h.host).collect()
}

/// Every Machine with a `status.nodeRef`, for the gate.
fn away_machines<'a>(
    index: &BindingIndex,
    machines: &'a [MachineObject],
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> Vec<AwayMachine<'a>> {
    // Only a few hosts, if any, carry the annotation flow's power-off: look up the Machines'
    // hosts only then.
    let powered_off: BTreeSet<&HostReference> = hosts
        .iter()
        .filter(|(_, h)| h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION))
        .map(|(r, _)| r)
        .collect();
    machines
        .iter()
        .filter_map(|m| {
            let node = m.node_ref()?;
            let key = machine_key(&m.object);
            let host_power_off = !powered_off.is_empty()
                && index
                    .machine(&key)
                    .is_ok_and(|b| powered_off.contains(&b.host));
            Some(AwayMachine {
                name: key.to_string(),
                node,
                labels: m.object.labels(),
                annotations: m.object.annotations(),
                host_power_off,
            })
        })
        .collect()
}

/// Every held-off host ([`held_off`]) with the nodes bound to it.
fn held_hosts(
    index: &BindingIndex,
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> Vec<HeldHost> {
    let mut out = Vec::new();
    for (reference, host) in hosts {
        let Some(why) = held_off(host) else { continue };
        for node in index.nodes_of_host(reference) {
            out.push(HeldHost {
                host: reference.clone(),
                node,
                why: why.clone(),
            });
        }
    }
    // Hosts come from a map: the same order every time.
    out.sort_by(|a, b| (&a.host, &a.node).cmp(&(&b.host, &b.node)));
    out
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
    let requests = match Api::<HostRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) if is_not_found(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    fill_gate_view(&mut snapshot, &index, &machine_objects, &requests, &by_ref);
    Ok(snapshot)
}
