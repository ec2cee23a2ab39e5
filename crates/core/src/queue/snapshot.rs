//! What the queue's decisions look at: Nodes and entries reduced to the facts the rules use.
//! Built by the controller from its caches, and by `hostcycle rq plan --from FILE` from a
//! `kubectl get nodes,rebootqueueentries,rebootqueues -o yaml` List.

use std::collections::BTreeMap;

use hostcycle_api::queue::{
    CORDONED_BY_ANNOTATION, EntryPhase, HostReference, RebootProgress, RebootQueue,
    RebootQueueEntry,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::config::QueueConfig;

/// The `status.addresses` types the queue reads: its commands' address is the first of them
/// (in this order), and another Node's address of any of them makes that address ambiguous
/// (`InternalDNS` and `ExternalDNS` are names a DNS server may hand to several machines).
pub const NODE_ADDRESS_TYPES: [&str; 3] = ["InternalIP", "ExternalIP", "Hostname"];

/// Label marking an API-server (control-plane) node.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// The older name of the same label.
pub const MASTER_LABEL: &str = "node-role.kubernetes.io/master";
/// Label Cluster API puts on the Machines of a control plane (KubeadmControlPlane and others).
pub const CAPI_CONTROL_PLANE_MACHINE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Whether a label key marks an API-server node: [`CONTROL_PLANE_LABEL`] or [`MASTER_LABEL`]
/// (any value). The one definition, for a Node's labels and for the backup of a deleted
/// Node's labels alike.
pub fn api_server_label(key: &str) -> bool {
    key == CONTROL_PLANE_LABEL || key == MASTER_LABEL
}

/// Whether a Node's labels (or their backup) mark an API server ([`api_server_label`]).
pub fn api_server_labels(labels: &BTreeMap<String, String>) -> bool {
    labels.keys().any(|k| api_server_label(k))
}

/// Whether a Machine's labels mark the Machine of an API-server node: a Node role label copied
/// onto it ([`api_server_labels`]), Cluster API's [`CAPI_CONTROL_PLANE_MACHINE_LABEL`], or
/// OpenShift's `machine.openshift.io/cluster-api-machine-role: master`.
pub fn machine_api_server(labels: &BTreeMap<String, String>) -> bool {
    api_server_labels(labels)
        || labels.contains_key(CAPI_CONTROL_PLANE_MACHINE_LABEL)
        || labels
            .get(crate::remediation::escalation::OPENSHIFT_MACHINE_ROLE_LABEL)
            .is_some_and(|role| role == "master")
}

/// A Node as the queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueNodeView {
    pub name: String,
    /// Labelled `node-role.kubernetes.io/control-plane` or `…/master`.
    pub api_server: bool,
    /// The Ready condition is True. Anything else (False, Unknown, absent) is unreachable.
    pub ready: bool,
    /// `lastHeartbeatTime` of the Ready condition.
    pub ready_heartbeat: Option<Timestamp>,
    /// `status.nodeInfo.bootID` (empty strings read as `None`).
    pub boot_id: Option<String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Carries [`CORDONED_BY_ANNOTATION`]: the queue cordoned it.
    pub cordoned_by_queue: bool,
    /// `status.volumesInUse` is not empty.
    pub volumes_in_use: usize,
    /// First address to run commands against: InternalIP, else ExternalIP, else Hostname,
    /// else the name.
    pub address: String,
    /// Every address of [`NODE_ADDRESS_TYPES`] the Node reports (trimmed, none empty): no
    /// other node's commands may be run with one of them.
    pub reported_addresses: Vec<String>,
}

impl QueueNodeView {
    pub fn from_node(node: &Node) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let status = node.status.clone().unwrap_or_default();
        let ready = crate::node::ready_condition(node);
        // In the order of NODE_ADDRESS_TYPES, each type's in the Node's order.
        let reported_addresses: Vec<String> = NODE_ADDRESS_TYPES
            .iter()
            .flat_map(|kind| {
                status
                    .addresses
                    .iter()
                    .flatten()
                    .filter(|a| a.type_ == *kind && !a.address.trim().is_empty())
                    .map(|a| a.address.trim().to_string())
            })
            .collect();
        let address = reported_addresses
            .first()
            .cloned()
            .unwrap_or_else(|| name.clone());
        QueueNodeView {
            api_server: api_server_labels(&labels),
            ready: ready.is_some_and(|c| c.status == "True"),
            ready_heartbeat: ready.and_then(|c| c.last_heartbeat_time.as_ref().map(|t| t.0)),
            boot_id: status
                .node_info
                .as_ref()
                .map(|i| i.boot_id.trim().to_string())
                .filter(|b| !b.is_empty()),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            cordoned_by_queue: annotations.contains_key(CORDONED_BY_ANNOTATION),
            volumes_in_use: status.volumes_in_use.map(|v| v.len()).unwrap_or(0),
            address,
            reported_addresses,
            name,
        }
    }
}

/// A `RebootQueueEntry` as the queue sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryView {
    /// Object name.
    pub name: String,
    pub uid: Option<String>,
    pub node: String,
    pub index: u64,
    pub cancel: bool,
    pub phase: EntryPhase,
    pub last_transition: Option<Timestamp>,
    pub backoff_count: u32,
    pub backoff_expire: Option<Timestamp>,
    /// Why the last drain failed.
    pub last_drain_failure: Option<String>,
    pub reboot: Option<RebootProgress>,
    /// The `BootTimedOut` condition is already True.
    pub boot_timed_out: bool,
    pub message: String,
}

impl EntryView {
    pub fn from_entry(entry: &RebootQueueEntry) -> Self {
        let status = entry.status.clone().unwrap_or_default();
        EntryView {
            name: entry.metadata.name.clone().unwrap_or_default(),
            uid: entry.metadata.uid.clone(),
            node: entry.spec.node.clone(),
            index: entry.spec.index,
            cancel: entry.spec.cancel,
            phase: status.phase(),
            last_transition: status.last_transition_time,
            backoff_count: status.drain_backoff_count,
            backoff_expire: status.drain_backoff_expire,
            last_drain_failure: status.last_drain_failure.clone(),
            boot_timed_out: status.conditions.iter().any(|c| {
                c.type_ == hostcycle_api::reasons::queue_condition::BOOT_TIMED_OUT
                    && c.status == "True"
            }),
            reboot: status.reboot,
            message: status.message,
        }
    }

    /// Whether the drain backoff still holds at `now`.
    pub fn backed_off(&self, now: Timestamp) -> bool {
        self.backoff_expire.is_some_and(|t| t > now)
    }

    /// `{index, node}`, how the entry is named to people.
    pub fn reference(&self) -> EntryRef {
        EntryRef {
            name: self.name.clone(),
            index: self.index,
            node: self.node.clone(),
        }
    }
}

/// An entry named for output: object name, index and node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryRef {
    pub name: String,
    pub index: u64,
    pub node: String,
}

/// Everything [`super::plan`] decides from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueSnapshot {
    pub config: QueueConfig,
    /// Every Node, by name.
    pub nodes: BTreeMap<String, QueueNodeView>,
    pub entries: Vec<EntryView>,
    /// How each node would be rebooted, when the controller knows (absent in offline
    /// snapshots: then the plan does not wait for it).
    pub reboot_targets: BTreeMap<String, RebootTarget>,
    /// Nodes a remediation is working on: the queue neither drains nor reboots them.
    pub being_remediated: std::collections::BTreeSet<String>,
    /// Nodes known to exist but away — no Node object, or fenced or held off — by name
    /// ([`super::away::away_nodes`]; absent in offline snapshots). The gate counts them as
    /// unreachable, and an API-server one as an API server in progress for other API servers.
    pub away: BTreeMap<String, AwayNode>,
}

/// A node that is away, and why it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwayNode {
    /// Why, in words that follow "node X is absent (" (e.g. "Machine ns/m has nodeRef X but
    /// no Node exists").
    pub why: String,
    /// It is an API server: its Node's labels when the Node exists, else what is still known
    /// of it (its Machine's labels, a remediation's backup of its Node's labels).
    pub api_server: bool,
    /// Its Node object exists (the node is fenced or held off rather than absent).
    pub has_node: bool,
}

/// What the controller found to reboot a node with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebootTarget {
    /// A usable BareMetalHost.
    Host(HostReference),
    /// The node has a BareMetalHost that cannot be used now (paused, detached, ...).
    UnusableHost { host: HostReference, why: String },
    /// No BareMetalHost was found for the node.
    NoHost,
    /// Links name a host, but the binding is in doubt (sources disagree, another node claims
    /// the host, it was replaced): nothing is powered until it is resolved.
    Refused { why: String },
}

impl QueueSnapshot {
    /// Builds a snapshot from API objects. The queue's spec is the one named `default`
    /// (absent: defaults); `reboot_targets` stays empty.
    pub fn from_objects(
        queue: Option<&RebootQueue>,
        nodes: &[Node],
        entries: &[RebootQueueEntry],
    ) -> Self {
        QueueSnapshot {
            config: queue
                .map(|q| QueueConfig::from_spec(&q.spec))
                .unwrap_or_default(),
            nodes: nodes
                .iter()
                .map(QueueNodeView::from_node)
                .map(|n| (n.name.clone(), n))
                .collect(),
            entries: entries.iter().map(EntryView::from_entry).collect(),
            reboot_targets: BTreeMap::new(),
            being_remediated: Default::default(),
            away: BTreeMap::new(),
        }
    }

    /// Whether `node` is an API server: its Node's labels when the Node exists, else what
    /// [`Self::away`] still knows of it. The one definition the plan uses.
    pub fn is_api_server(&self, node: &str) -> bool {
        match self.nodes.get(node) {
            Some(n) => n.api_server,
            None => self.away.get(node).is_some_and(|a| a.api_server),
        }
    }
}
