//! Observe: every remediation in the cluster (Machines carrying the trigger or a record, and
//! HostRemediations), each resolved to its Machine, host and Node, reduced to what
//! `hostcycle_core::remediation::decide` reads. The host comes from the one binding resolver
//! (`hostcycle_core::binding`); once a remediation started, `decide` acts on the host its
//! record bound, whatever the resolver says later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hostcycle_api::queue::HostReference;
use hostcycle_api::remediation::TaintBackup;
use hostcycle_api::remediation::{
    DEFAULT_RETRY_LIMIT, DEFAULT_TIMEOUT_SECONDS, HostRemediation, MACHINE_POWER_OFF_ANNOTATION,
    NHC_NODE_NAME_ANNOTATION, NHC_TIMED_OUT_ANNOTATION, request_power_off_annotation,
};
use hostcycle_api::{BareMetalHost, ObservedBmc, ObservedPowerState, PowerObservation};
use hostcycle_core::binding::{BindingIndex, Refusal, Resolution};
use hostcycle_core::remediation::contracts::{
    MachineClaim, MachineFacts, Triggers, is_capbm_provider, is_nhc_request, machine_claim,
};
use hostcycle_core::remediation::escalation::{
    EscalationFacts, MachineKind, OPENSHIFT_MACHINE_ROLE_LABEL, choose_escalation,
};
use hostcycle_core::remediation::{
    Blocker, Escalation, Record, RemediationHostView, RemediationNodeView, Trigger,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Resource, ResourceExt};

use super::records::StoredFlow;
use crate::cluster::objects::{MachineObject, host_cannot_power_off, machine_key};

/// The Machine groups hostcycle understands.
pub const OPENSHIFT_GROUP: &str = "machine.openshift.io";
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// Which remediation, and where its record lives.
#[derive(Clone)]
pub enum Subject {
    /// The annotation flow of a Machine, with its record when hostcycle holds one
    /// ([`super::records`]).
    Machine(MachineObject, Option<Arc<StoredFlow>>),
    Request(std::sync::Arc<HostRemediation>),
}

impl Subject {
    pub fn trigger(&self) -> Trigger {
        match self {
            Subject::Machine(..) => Trigger::MachineAnnotation,
            Subject::Request(_) => Trigger::Request,
        }
    }

    /// The namespace of the request or Machine: what `--remediation-request-namespaces`
    /// judges.
    pub fn namespace(&self) -> String {
        match self {
            Subject::Machine(m, _) => m.object.namespace().unwrap_or_default(),
            Subject::Request(r) => r.namespace().unwrap_or_default(),
        }
    }

    /// A stable key for logs, slots and metrics.
    pub fn key(&self) -> String {
        match self {
            Subject::Machine(m, _) => format!("machine/{}", m.key()),
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
            Subject::Machine(..) => MACHINE_POWER_OFF_ANNOTATION.to_string(),
            Subject::Request(r) => request_power_off_annotation(&r.uid().unwrap_or_default()),
        }
    }

    /// When it was triggered: the request's creation, or the annotation flow's start.
    pub fn created(&self) -> Option<jiff::Timestamp> {
        match self {
            Subject::Machine(..) => None,
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
    /// What the binding resolver finds now, or why no host.
    pub host: Result<Arc<BareMetalHost>, Blocker>,
    /// A Node annotation naming another host than the one bound, ignored: said in a Warning.
    pub ignored_hint: Option<String>,
}

/// Finds the Machine, Node and host of a remediation: a Machine's host through the
/// Machine's links (its annotation, the consumerRef of it or its infrastructure, its Node's
/// provider ID), a request without a Machine through its Node.
pub fn resolve(
    subject: &Subject,
    machines: &[MachineObject],
    index: &BindingIndex,
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> Resolved {
    let machine = match subject {
        Subject::Machine(m, _) => Some(m.clone()),
        Subject::Request(r) => owner_machine(r, machines).cloned(),
    };
    let (node_name, resolution) = match (&machine, subject) {
        (Some(m), _) => (m.node_ref(), index.machine(&machine_key(&m.object))),
        (None, Subject::Request(r)) => {
            let node = r
                .annotations()
                .get(NHC_NODE_NAME_ANNOTATION)
                .cloned()
                .unwrap_or_else(|| r.name_any());
            let resolution = index.node(&node);
            (Some(node), resolution)
        }
        // A Machine subject has its Machine.
        (None, Subject::Machine(..)) => (
            None,
            Err(Box::new(Refusal::NoHost {
                subject: subject.key(),
            })),
        ),
    };
    let ignored_hint = resolution.as_ref().ok().and_then(|b| {
        b.ignored_hint.as_ref().map(|(host, link)| {
            format!(
                "{link} names BareMetalHost {host}; ignored: {} binds BareMetalHost {} ({})",
                node_name
                    .as_deref()
                    .map(|n| format!("node {n}"))
                    .unwrap_or_default(),
                b.host,
                b.link
            )
        })
    });
    let host = blocker_or_host(resolution, machine.is_some(), node_name.as_deref(), hosts)
        .and_then(|h| match (&machine, &node_name) {
            // The host is known but not which Node to release.
            (Some(_), None) => Err(Blocker::NodeRefUnset),
            _ => Ok(h),
        });
    Resolved {
        machine,
        node_name,
        host,
        ignored_hint,
    }
}

/// The resolver's answer as the flow reads it: the host, or the blocker that says why not.
fn blocker_or_host(
    resolution: Resolution,
    has_machine: bool,
    node: Option<&str>,
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> Result<Arc<BareMetalHost>, Blocker> {
    let refusal = match resolution {
        Ok(binding) => {
            return hosts
                .get(&binding.host)
                .cloned()
                .ok_or_else(|| Blocker::HostNotFound(binding.host.to_string()));
        }
        Err(refusal) => *refusal,
    };
    match refusal {
        Refusal::NoHost { .. } if has_machine => Err(Blocker::HostNotReferenced),
        Refusal::NoHost { .. } => Err(Blocker::NodeHostUnknown(
            node.unwrap_or_default().to_string(),
        )),
        Refusal::Missing { host, .. } => Err(Blocker::HostNotFound(host.to_string())),
        refusal => Err(Blocker::Binding {
            reason: refusal.reason(),
            message: refusal.to_string(),
        }),
    }
}

/// The host as the flow reads it.
pub fn host_view(host: &BareMetalHost, power_off_annotation: &str) -> RemediationHostView {
    let status = host.status.as_ref();
    RemediationHostView {
        name: format!(
            "{}/{}",
            host.namespace().unwrap_or_default(),
            host.name_any()
        ),
        uid: host.uid().unwrap_or_default(),
        // Evidence is the host controller's confirmed run of BMC readings, never
        // `status.poweredOn` (which every status write carries over, e.g. a detach).
        powered_on: confirmed_run(host).and_then(|o| match o.state {
            ObservedPowerState::On => Some(true),
            ObservedPowerState::Off => Some(false),
            _ => None,
        }),
        last_updated: confirmed_run(host).and_then(|o| o.since),
        observed_bmc: status
            .and_then(|s| s.power_observation.as_ref())
            .map(|o| o.bmc.clone()),
        spec_bmc: ObservedBmc::of_spec(&host.spec),
        power_off_requested: host.annotations().contains_key(power_off_annotation),
        online: host.spec.online,
        externally_provisioned: host.spec.externally_provisioned,
        error: crate::cluster::objects::host_error(host),
        cannot_power_off: host_cannot_power_off(host),
        marked_unhealthy: hostcycle_api::remediation::unhealthy_mark(host.annotations())
            .map(str::to_string),
    }
}

/// The host's run of BMC readings, when two readings a second apart confirmed it.
fn confirmed_run(host: &BareMetalHost) -> Option<&PowerObservation> {
    host.status
        .as_ref()
        .and_then(|s| s.power_observation.as_ref())
        .filter(|o| o.confirmed())
}

/// The Node as the flow reads it.
pub fn node_view(node: &Node) -> RemediationNodeView {
    let spec = node.spec.as_ref();
    RemediationNodeView {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        annotations: node.metadata.annotations.clone().unwrap_or_default(),
        ready: hostcycle_core::node::is_ready(node),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .map(|t| TaintBackup {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
            .collect(),
        boot_id: node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .filter(|b| !b.is_empty()),
        volumes_in_use: node
            .status
            .as_ref()
            .and_then(|s| s.volumes_in_use.as_ref())
            .map_or(0, Vec::len),
    }
}

/// The record of a subject: a request's status, or the annotation flow's stored record —
/// never the Machine's annotations. No record: not started.
pub fn record(subject: &Subject) -> Record {
    match subject {
        Subject::Machine(_, stored) => stored
            .as_ref()
            .map(|s| s.record.clone())
            .unwrap_or_default(),
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
        Subject::Machine(m, _) => m.triggered(),
        Subject::Request(r) => {
            r.meta().deletion_timestamp.is_none()
                && !r.annotations().contains_key(NHC_TIMED_OUT_ANNOTATION)
        }
    }
}

/// `retryLimit` and the power-on timeout of a subject.
pub fn limits(subject: &Subject, annotation_timeout: Duration) -> (u32, Duration) {
    match subject {
        Subject::Machine(..) => (0, annotation_timeout),
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

/// Whether the subject is a request from medik8s' NodeHealthCheck.
pub fn nhc_request(subject: &Subject) -> bool {
    match subject {
        Subject::Machine(..) => false,
        Subject::Request(r) => is_nhc_request(
            r.annotations(),
            r.meta()
                .owner_references
                .iter()
                .flatten()
                .map(|o| (o.api_version.as_str(), o.kind.as_str())),
        ),
    }
}

/// How giving up escalates for this remediation (if at all).
pub fn escalation(
    subject: &Subject,
    machine: Option<&MachineObject>,
    host: Option<&BareMetalHost>,
) -> Escalation {
    choose_escalation(&EscalationFacts {
        machine: machine.map(|m| {
            if m.group() == CAPI_GROUP {
                MachineKind::ClusterApi
            } else {
                MachineKind::OpenShift
            }
        }),
        nhc_request: nhc_request(subject),
        host_externally_provisioned: host.is_some_and(|h| h.spec.externally_provisioned),
        machine_has_controller_owner: machine.is_some_and(|m| m.has_controller_owner()),
        machine_role: machine.and_then(|m| {
            m.object
                .labels()
                .get(OPENSHIFT_MACHINE_ROLE_LABEL)
                .map(String::as_str)
        }),
    })
}

/// Whose the annotation trigger on this Machine is (`--remediation-triggers`, another
/// remediator's markers, CAPBM's provider).
pub fn claim(
    m: &MachineObject,
    own_record: bool,
    host: Option<&BareMetalHost>,
    triggers: &Triggers,
) -> MachineClaim {
    machine_claim(
        triggers,
        &MachineFacts {
            annotations: m.object.annotations(),
            own_record,
            host_power_off: host
                .is_some_and(|h| h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)),
            capbm_provider: is_capbm_provider(&m.object.data["spec"]),
        },
    )
}
