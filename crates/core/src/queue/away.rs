//! Who is away: nodes known to exist — a Machine, a remediation or a BareMetalHost says so —
//! that are not there to count on: their Node object is gone, or they are fenced or held off.
//! The queue's gate ([`super::plan`], rules 4 and 5) counts them; the controller and
//! `hostcycle rq plan` reduce the objects to [`AwayFacts`] and call [`away_nodes`].
//!
//! A node is away when
//! 1. a remediation is working on it (a HostRemediation not `Done`, `GaveUp` or `Cancelled`;
//!    hostcycle's annotation flow on its Machine, not failed), Node object or not;
//! 2. its Machine carries remediation markers without hostcycle's record — the
//!    `host.metal3.io/external-remediation` trigger, metal3's markers, or its host's
//!    `reboot.metal3.io/capbm-requested-power-off` (another remediator, CAPBM, fences it);
//! 3. its BareMetalHost is held off: a keyed `reboot.metal3.io/<key>` annotation,
//!    `spec.online: false`, or an observed `status.poweredOn: false`;
//! 4. it has no Node object, and a remediation of any state names it (one that gave up left
//!    it deleted), or a Machine's `status.nodeRef` names it.
//!
//! Which away node is an API server: its Node's labels when the Node exists; otherwise what
//! is still known — a Machine's labels ([`machine_api_server`]), or a remediation's backup of
//! the deleted Node's labels ([`api_server_label`]).

use std::collections::BTreeMap;

use hostcycle_api::BareMetalHost;
use hostcycle_api::annotations::RebootRequests;
use hostcycle_api::queue::HostReference;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, MACHINE_POWER_OFF_ANNOTATION, NODE_LABELS_BACKUP_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION, RemediationStep,
};

use super::snapshot::{AwayNode, QueueNodeView, api_server_label, machine_api_server};
use crate::remediation::contracts::{METAL3_MACHINE_MARKERS, OWN_MARKER_PREFIX};
use crate::text::bounded;

/// The most bytes of a remediation's failure repeated in a reason.
const MAX_ECHOED_FAILURE: usize = 200;

/// A Machine (either kind) with a `status.nodeRef`, as the gate reads it.
#[derive(Debug, Clone)]
pub struct AwayMachine<'a> {
    /// How messages name it (`Machine <namespace>/<name>`).
    pub name: String,
    /// `status.nodeRef.name`.
    pub node: String,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// Its host carries `reboot.metal3.io/capbm-requested-power-off`.
    pub host_power_off: bool,
}

/// A HostRemediation, any state, with the node it names.
#[derive(Debug, Clone)]
pub struct AwayRequest<'a> {
    /// How messages name it (`HostRemediation <namespace>/<name>`).
    pub name: String,
    pub node: String,
    pub step: RemediationStep,
    /// `status.nodeLabelsBackup`: the deleted Node's labels.
    pub labels_backup: Option<&'a BTreeMap<String, String>>,
}

/// A BareMetalHost held off ([`held_off`]), with a node bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldHost {
    pub host: HostReference,
    pub node: String,
    /// Why it is off, in words that follow the host's name.
    pub why: String,
}

/// What [`away_nodes`] reads besides the Nodes.
#[derive(Debug, Clone, Default)]
pub struct AwayFacts<'a> {
    pub machines: Vec<AwayMachine<'a>>,
    pub requests: Vec<AwayRequest<'a>>,
    pub hosts: Vec<HeldHost>,
}

/// Why a host is held off, if it is: a keyed reboot annotation (metal3 keeps the host off
/// until it is removed), `spec.online: false`, or an observed `status.poweredOn: false`
/// (words that follow the host's name).
pub fn held_off(host: &BareMetalHost) -> Option<String> {
    let requests = RebootRequests::from_annotations(host.annotations_or_empty());
    if let Some(request) = requests.keyed.values().next() {
        return Some(format!("is held off ({})", request.annotation));
    }
    if !host.spec.online {
        return Some("is offline (spec.online: false)".into());
    }
    let off = host
        .status
        .as_ref()
        .and_then(|s| s.observed_powered_on())
        .is_some_and(|on| !on);
    off.then(|| "is powered off (status.poweredOn: false)".into())
}

/// Every node that is away, and why (the first reason found, in the order of the module's
/// rules), whether it is an API server and whether its Node exists.
pub fn away_nodes(
    nodes: &BTreeMap<String, QueueNodeView>,
    facts: &AwayFacts<'_>,
) -> BTreeMap<String, AwayNode> {
    let mut away = Away {
        nodes,
        found: BTreeMap::new(),
    };
    // 1. Remediations at work.
    for r in facts.requests.iter().filter(|r| request_active(r.step)) {
        away.note(
            &r.node,
            || format!("{} is remediating it (step {:?})", r.name, r.step),
            || request_api_server(r),
            false,
        );
    }
    // 1./2. Remediation flows and markers on Machines.
    let flows: Vec<(&AwayMachine<'_>, MachineFlow)> = facts
        .machines
        .iter()
        .map(|m| (m, machine_flow(m)))
        .collect();
    for (m, flow) in &flows {
        if let MachineFlow::Active(why) | MachineFlow::Foreign(why) = flow {
            away.note(&m.node, || why.clone(), || machine_is_api_server(m), false);
        }
    }
    // 3. Held-off hosts.
    for h in &facts.hosts {
        let why = || format!("its BareMetalHost {} {}", h.host, h.why);
        away.note(&h.node, why, || false, false);
    }
    // 4. No Node object.
    for r in facts.requests.iter().filter(|r| !request_active(r.step)) {
        away.note(
            &r.node,
            || {
                format!(
                    "{} ended ({:?}) and no Node {} exists",
                    r.name, r.step, r.node
                )
            },
            || request_api_server(r),
            true,
        );
    }
    for (m, flow) in &flows {
        if let MachineFlow::Failed(why) = flow {
            away.note(&m.node, || why.clone(), || machine_is_api_server(m), true);
        }
    }
    for m in &facts.machines {
        away.note(
            &m.node,
            || format!("{} has nodeRef {} but no Node exists", m.name, m.node),
            || machine_is_api_server(m),
            true,
        );
    }
    away.found
}

/// The nodes found so far.
struct Away<'n> {
    nodes: &'n BTreeMap<String, QueueNodeView>,
    found: BTreeMap<String, AwayNode>,
}

impl Away<'_> {
    /// Notes `node` as away for `why` (the first reason stays), unless `only_without_node`
    /// and its Node exists. An existing Node says whether it is an API server; otherwise any
    /// source that says so does. `why` and `api_server` are worked out only when needed (most
    /// Machines name a Node that exists).
    fn note(
        &mut self,
        node: &str,
        why: impl FnOnce() -> String,
        api_server: impl FnOnce() -> bool,
        only_without_node: bool,
    ) {
        if node.is_empty() {
            return;
        }
        let existing = self.nodes.get(node);
        if only_without_node && existing.is_some() {
            return;
        }
        let entry = self
            .found
            .entry(node.to_string())
            .or_insert_with(|| AwayNode {
                why: why(),
                api_server: false,
                has_node: existing.is_some(),
            });
        entry.api_server = match existing {
            Some(n) => n.api_server,
            None => entry.api_server || api_server(),
        };
    }
}

/// `text` on one line, control characters as spaces (an annotation's value is anyone's).
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A HostRemediation still working (not `Done`, `GaveUp` or `Cancelled`).
fn request_active(step: RemediationStep) -> bool {
    !matches!(
        step,
        RemediationStep::Done | RemediationStep::GaveUp | RemediationStep::Cancelled
    )
}

fn request_api_server(r: &AwayRequest<'_>) -> bool {
    r.labels_backup
        .is_some_and(|labels| labels.keys().any(|k| api_server_label(k)))
}

/// The Machine's labels, or the backup of its deleted Node's labels (annotation flow), mark
/// an API server.
fn machine_is_api_server(m: &AwayMachine<'_>) -> bool {
    let backup = m
        .annotations
        .get(NODE_LABELS_BACKUP_ANNOTATION)
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .is_some_and(|v| {
            v.as_object()
                .is_some_and(|o| o.keys().any(|k| api_server_label(k)))
        });
    backup || machine_api_server(m.labels)
}

/// What the remediation markers on a Machine say, with the reason in words.
enum MachineFlow {
    None,
    /// hostcycle's annotation flow is under way.
    Active(String),
    /// hostcycle's annotation flow gave up.
    Failed(String),
    /// Markers without hostcycle's record: another remediator's, or a trigger not taken yet.
    Foreign(String),
}

fn machine_flow(m: &AwayMachine<'_>) -> MachineFlow {
    let a = m.annotations;
    let own = a.keys().any(|k| k.starts_with(OWN_MARKER_PREFIX));
    let trigger = a.contains_key(EXTERNAL_REMEDIATION_ANNOTATION);
    if own {
        return match a.get(REMEDIATION_FAILED_ANNOTATION) {
            Some(failure) if !trigger => MachineFlow::Failed(format!(
                "hostcycle's remediation of {} gave up ({}) and no Node {} exists",
                m.name,
                bounded(&one_line(failure), MAX_ECHOED_FAILURE),
                m.node
            )),
            _ => MachineFlow::Active(format!(
                "hostcycle's remediation of {} is under way",
                m.name
            )),
        };
    }
    let mut markers: Vec<String> = Vec::new();
    if trigger {
        markers.push(EXTERNAL_REMEDIATION_ANNOTATION.into());
    }
    markers.extend(
        METAL3_MACHINE_MARKERS
            .iter()
            .filter(|k| a.contains_key(**k))
            .map(|k| k.to_string()),
    );
    if m.host_power_off {
        markers.push(format!("its host's {MACHINE_POWER_OFF_ANNOTATION}"));
    }
    if markers.is_empty() {
        return MachineFlow::None;
    }
    MachineFlow::Foreign(format!(
        "{} carries remediation markers without hostcycle's record (another remediator's, or \
         a remediation not started yet): {}",
        m.name,
        markers.join(", ")
    ))
}
