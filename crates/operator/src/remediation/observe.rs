//! Observe: every remediation in the cluster (Machines carrying the trigger or a record, and
//! HostRemediations), each resolved to its Machine, host and Node, reduced to what
//! `hostcycle_core::remediation::decide` reads.

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::remediation::{
    DEFAULT_RETRY_LIMIT, DEFAULT_TIMEOUT_SECONDS, HostRemediation, MACHINE_POWER_OFF_ANNOTATION,
    NHC_NODE_NAME_ANNOTATION, NHC_TIMED_OUT_ANNOTATION, request_power_off_annotation,
};
use hostcycle_api::{BareMetalHost, OperationalStatus};
use hostcycle_core::queue::host::{HostSummary, MachineSummary, find_host};
use hostcycle_core::remediation::escalation::{
    OPENSHIFT_MACHINE_ROLE_LABEL, openshift_reprovisionable,
};
use hostcycle_core::remediation::{Blocker, Escalation, HostView, NodeView, Record, Trigger};
use k8s_openapi::api::core::v1::Node;
use kube::{Resource, ResourceExt};

use crate::cluster::objects::{MachineObject, node_identity};

/// The Machine groups hostcycle understands.
pub const OPENSHIFT_GROUP: &str = "machine.openshift.io";
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// Which remediation, and where its record lives.
#[derive(Clone)]
pub enum Subject {
    Machine(MachineObject),
    Request(std::sync::Arc<HostRemediation>),
}

impl Subject {
    pub fn trigger(&self) -> Trigger {
        match self {
            Subject::Machine(_) => Trigger::MachineAnnotation,
            Subject::Request(_) => Trigger::Request,
        }
    }

    /// A stable key for logs, slots and metrics.
    pub fn key(&self) -> String {
        match self {
            Subject::Machine(m) => format!("machine/{}", m.key()),
            Subject::Request(r) => format!(
                "hostremediation/{}/{}",
                r.namespace().unwrap_or_default(),
                r.name_any()
            ),
        }
    }

    /// The host annotation this remediation powers off with.
    pub fn power_off_annotation(&self) -> String {
        match self {
            Subject::Machine(_) => MACHINE_POWER_OFF_ANNOTATION.to_string(),
            Subject::Request(r) => request_power_off_annotation(&r.uid().unwrap_or_default()),
        }
    }

    /// When it was triggered: the request's creation, or the annotation flow's start.
    pub fn created(&self) -> Option<jiff::Timestamp> {
        match self {
            Subject::Machine(_) => None,
            Subject::Request(r) => r.meta().creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// The Machine a request belongs to: its owner reference of kind Machine in a known group.
pub fn owner_machine<'a>(
    request: &HostRemediation,
    machines: &'a [MachineObject],
) -> Option<&'a MachineObject> {
    let owner = request.meta().owner_references.iter().flatten().find(|o| {
        o.kind == "Machine"
            && (o.api_version.starts_with(&format!("{OPENSHIFT_GROUP}/"))
                || o.api_version.starts_with(&format!("{CAPI_GROUP}/")))
    })?;
    let ns = request.namespace().unwrap_or_default();
    machines.iter().find(|m| {
        m.object.uid().as_deref() == Some(owner.uid.as_str())
            || (m.object.name_any() == owner.name
                && m.object.namespace().as_deref() == Some(ns.as_str())
                && owner.api_version.starts_with(&format!("{}/", m.group())))
    })
}

/// A remediation resolved to its targets.
pub struct Resolved {
    pub machine: Option<MachineObject>,
    pub node_name: Option<String>,
    pub host: Result<BareMetalHost, Blocker>,
}

/// Finds the Machine, Node and host of a remediation.
pub fn resolve(
    subject: &Subject,
    machines: &[MachineObject],
    machine_summaries: &[MachineSummary],
    hosts: &[std::sync::Arc<BareMetalHost>],
    host_summaries: &[HostSummary],
    nodes: &BTreeMap<String, Node>,
) -> Resolved {
    let find = |ns: &str, name: &str| {
        hosts
            .iter()
            .find(|h| {
                h.metadata.namespace.as_deref() == Some(ns)
                    && h.metadata.name.as_deref() == Some(name)
            })
            .map(|h| (**h).clone())
            .ok_or_else(|| Blocker::HostNotFound(format!("{ns}/{name}")))
    };
    let machine = match subject {
        Subject::Machine(m) => Some(m.clone()),
        Subject::Request(r) => owner_machine(r, machines).cloned(),
    };
    if let Some(m) = &machine {
        let node_name = m.node_ref();
        let host = match m.host_ref() {
            Some((ns, name)) => find(&ns, &name),
            None => {
                // A Cluster API Machine's host is named on its Metal3Machine: map through the
                // Node (consumerRef, provider ID).
                match node_name.as_ref().and_then(|n| nodes.get(n)) {
                    Some(node) => {
                        find_host(&node_identity(node), host_summaries, machine_summaries)
                            .map(|(r, _)| find(&r.namespace, &r.name))
                            .unwrap_or(Err(Blocker::HostNotReferenced))
                    }
                    None => Err(Blocker::HostNotReferenced),
                }
            }
        };
        let host = match (host, &node_name) {
            (Ok(_), None) => Err(Blocker::NodeRefUnset),
            (h, _) => h,
        };
        return Resolved {
            machine,
            node_name,
            host,
        };
    }
    // A request without a Machine (NodeHealthCheck): the Node by annotation or name.
    let Subject::Request(r) = subject else {
        // A Machine subject returned above.
        return Resolved {
            machine: None,
            node_name: None,
            host: Err(Blocker::HostNotReferenced),
        };
    };
    let node_name = r
        .annotations()
        .get(NHC_NODE_NAME_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| r.name_any());
    let identity = nodes.get(&node_name).map(node_identity).unwrap_or_else(|| {
        hostcycle_core::queue::host::NodeIdentity {
            name: node_name.clone(),
            ..Default::default()
        }
    });
    let host = find_host(&identity, host_summaries, machine_summaries)
        .map(|(r, _)| find(&r.namespace, &r.name))
        .unwrap_or_else(|| Err(Blocker::NodeHostUnknown(node_name.clone())));
    Resolved {
        machine: None,
        node_name: Some(node_name),
        host,
    }
}

/// The host as the flow reads it.
pub fn host_view(host: &BareMetalHost, power_off_annotation: &str) -> HostView {
    let status = host.status.as_ref();
    HostView {
        name: format!(
            "{}/{}",
            host.namespace().unwrap_or_default(),
            host.name_any()
        ),
        powered_on: status.and_then(|s| s.observed_powered_on()),
        power_off_requested: host.annotations().contains_key(power_off_annotation),
        online: host.spec.online,
        externally_provisioned: host.spec.externally_provisioned,
        error: status
            .filter(|s| s.operational_status == Some(OperationalStatus::Error))
            .map(|s| crate::text::bounded(&s.error_message, 300))
            .filter(|m| !m.is_empty()),
    }
}

/// The Node as the flow reads it.
pub fn node_view(node: &Node) -> NodeView {
    NodeView {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        annotations: node.metadata.annotations.clone().unwrap_or_default(),
        ready: hostcycle_core::queue::NodeView::from_node(node).ready,
    }
}

/// The record and its settings for a subject.
pub fn record(subject: &Subject, host: Option<&BareMetalHost>) -> Record {
    match subject {
        Subject::Machine(m) => {
            let on_host =
                host.is_some_and(|h| h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION));
            Record::from_machine_annotations(m.object.annotations(), on_host)
        }
        Subject::Request(r) => {
            let mut record = Record::from_status(&r.status.clone().unwrap_or_default());
            record.started_at = subject.created();
            record
        }
    }
}

/// Whether the trigger still asks.
pub fn requested(subject: &Subject) -> bool {
    match subject {
        Subject::Machine(m) => m.triggered(),
        Subject::Request(r) => {
            r.meta().deletion_timestamp.is_none()
                && !r.annotations().contains_key(NHC_TIMED_OUT_ANNOTATION)
        }
    }
}

/// `retryLimit` and the power-on timeout of a subject.
pub fn limits(subject: &Subject, annotation_timeout: Duration) -> (u32, Duration) {
    match subject {
        Subject::Machine(_) => (0, annotation_timeout),
        Subject::Request(r) => {
            let strategy = r.spec.strategy.clone().unwrap_or_default();
            (
                strategy.retry_limit.unwrap_or(DEFAULT_RETRY_LIMIT),
                Duration::from_secs(
                    strategy
                        .timeout_seconds
                        .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
                        .clamp(1, 7 * 24 * 3600),
                ),
            )
        }
    }
}

/// How giving up escalates for this Machine (if any).
pub fn escalation(machine: Option<&MachineObject>, host: Option<&BareMetalHost>) -> Escalation {
    match machine {
        None => Escalation::None(
            "no Machine: NodeHealthCheck moves on to its next remediator when Succeeded=False"
                .into(),
        ),
        Some(m) if m.group() == CAPI_GROUP => Escalation::MarkOwnerRemediated,
        Some(m) => {
            let role = m
                .object
                .labels()
                .get(OPENSHIFT_MACHINE_ROLE_LABEL)
                .map(String::as_str);
            match openshift_reprovisionable(
                host.is_some_and(|h| h.spec.externally_provisioned),
                m.has_controller_owner(),
                role,
            ) {
                Ok(()) => Escalation::DeleteMachine,
                Err(why) => Escalation::None(format!("the Machine is not deleted: {why}")),
            }
        }
    }
}
