//! The remediation flow as one pure step function: [`decide`] takes what the controller
//! observed and returns the record to write (before anything is done) and the actions.
//!
//! The seed's flow, whatever the trigger:
//! 1. request the host's power-off (hard);
//! 2. once the host's `status.poweredOn` is false — never before — back up the Node's labels
//!    and annotations and delete the Node;
//! 3. once the Node is gone, mark the machine released;
//! 4. record when waiting gives up, and release the power-off so the host powers on;
//! 5. wait for the Node to register again;
//! 6. restore the labels and annotations (keys already on the new Node win), wait for it to be
//!    Ready, and clean up.
//!
//! A trigger that goes away before the Node was deleted cancels (the host is released); after,
//! the flow finishes the power-on and the cleanup. Not back by the timeout: another power cycle
//! while retries last (requests only), then give up and escalate.

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::remediation::{RemediationPhase, RemediationStep};
use jiff::Timestamp;

use super::record::Record;
use crate::queue::drain::add;

/// Which machinery asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// `host.metal3.io/external-remediation` on a Machine (OpenShift's flow).
    MachineAnnotation,
    /// A `HostRemediation` (Cluster API MachineHealthCheck, medik8s NodeHealthCheck).
    Request,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MachineAnnotation => "annotation",
            Self::Request => "request",
        }
    }
}

/// The host, as the flow reads it (only metal3's fields: it also works with metal3's own
/// host operator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// `<namespace>/<name>`.
    pub name: String,
    /// `status.poweredOn`.
    pub powered_on: Option<bool>,
    /// This remediation's power-off annotation is on the host.
    pub power_off_requested: bool,
    /// `spec.online`.
    pub online: bool,
    /// `spec.externallyProvisioned`.
    pub externally_provisioned: bool,
    /// The host controller's error, when it has one (a failing BMC).
    pub error: Option<String>,
}

/// The Node, as the flow reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub ready: bool,
}

/// Why a remediation cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocker {
    /// No host is named (`metal3.io/BareMetalHost`, or no mapping for the node).
    HostNotReferenced,
    /// A request without a Machine (NodeHealthCheck) whose Node maps to no host.
    NodeHostUnknown(String),
    HostNotFound(String),
    /// The Machine has no `status.nodeRef`.
    NodeRefUnset,
    /// `spec.online: false`: the host is meant to stay off, and would not power back on.
    HostOffline(String),
}

impl Blocker {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::HostNotReferenced | Self::NodeHostUnknown(_) => "HostNotReferenced",
            Self::HostNotFound(_) => "HostNotFound",
            Self::NodeRefUnset => "NodeRefUnset",
            Self::HostOffline(_) => "HostOffline",
        }
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::HostNotReferenced => f.write_str(
                "no BareMetalHost is named: set the metal3.io/BareMetalHost annotation \
                 (<namespace>/<name>) on the Machine",
            ),
            Self::NodeHostUnknown(node) => write!(
                f,
                "no BareMetalHost found for Node {node}: annotate the Node with \
                 hostcycle.io/baremetalhost=<namespace>/<name>, or give it the host's provider ID"
            ),
            Self::HostNotFound(h) => write!(f, "BareMetalHost {h} does not exist"),
            Self::NodeRefUnset => {
                f.write_str("the Machine has no status.nodeRef: which Node to release is unknown")
            }
            Self::HostOffline(h) => write!(
                f,
                "BareMetalHost {h} has spec.online: false; it would not power back on"
            ),
        }
    }
}

/// How to escalate when the remediation gives up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Escalation {
    /// Delete the (OpenShift) Machine: its MachineSet creates a new one.
    DeleteMachine,
    /// Set `OwnerRemediated=False` on the (Cluster API) Machine: its MachineSet or
    /// KubeadmControlPlane replaces it.
    MarkOwnerRemediated,
    /// Nothing more hostcycle can do; the reason says why.
    None(String),
}

/// What the flow needs to know, observed by the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub trigger: Trigger,
    /// The trigger still asks (annotation present; request not deleted and not given up on
    /// by its checker).
    pub requested: bool,
    /// The host, or why the remediation cannot start.
    pub target: Result<HostView, Blocker>,
    /// The Node's name (from `nodeRef`, the request, or the mapping).
    pub node_name: Option<String>,
    /// The Node, if it exists.
    pub node: Option<NodeView>,
    pub record: Record,
    /// Power cycles allowed after the first (0 for the annotation flow).
    pub retry_limit: u32,
    /// How long the Node may take to come back after the power-on.
    pub power_on_timeout: Duration,
    /// A slot under `maxConcurrentRemediations` is free for this one (ignored once started).
    pub slot_free: bool,
    /// The reboot queue is rebooting this node: wait until this time (its boot timeout).
    pub queue_reboot_until: Option<Timestamp>,
    /// What giving up does.
    pub escalation: Escalation,
}

/// One thing to do, in order, after the record is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Add this remediation's power-off annotation (`{"mode":"hard"}`) to the host.
    RequestPowerOff,
    /// Remove it: the host powers on (or, when cancelled, stays on).
    ReleasePowerOff,
    /// Delete the Node (its labels and annotations are in the record already).
    DeleteNode,
    /// Add the backed-up labels and annotations the new Node does not have.
    RestoreNode {
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    },
    /// The flow is over: remove the trigger and every marker (annotation flow).
    FinishAnnotationFlow,
    Escalate(Escalation),
}

/// An Event to publish (on the Machine or request; the controller copies the host and Node
/// ones where they concern them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The record to write before `actions` (write-ahead); `None`: unchanged.
    pub record: Option<Record>,
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
    pub phase: RemediationPhase,
    /// In words: what the remediation does or waits for.
    pub message: String,
    /// Set when the remediation cannot start; the reason is the condition's.
    pub blocked: Option<&'static str>,
    /// Look again after this long at the latest (deadlines; events wake the controller
    /// sooner).
    pub requeue: Option<Duration>,
}

impl Decision {
    fn wait(phase: RemediationPhase, message: String) -> Decision {
        Decision {
            record: None,
            actions: Vec::new(),
            events: Vec::new(),
            phase,
            message,
            blocked: None,
            requeue: None,
        }
    }
}

/// Reasons of the Events the flow emits.
pub mod event_reason {
    pub const STARTED: &str = "RemediationStarted";
    pub const BLOCKED: &str = "RemediationBlocked";
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    pub const POWERED_OFF: &str = "PoweredOff";
    pub const NODE_DELETED: &str = "NodeDeleted";
    pub const NODE_RELEASED: &str = "NodeReleased";
    pub const POWER_ON_REQUESTED: &str = "PowerOnRequested";
    pub const NODE_RESTORED: &str = "NodeRestored";
    pub const SUCCEEDED: &str = "RemediationSucceeded";
    pub const RETRYING: &str = "RemediationRetry";
    pub const FAILED: &str = "RemediationFailed";
    pub const ESCALATED: &str = "RemediationEscalated";
    pub const CANCELLED: &str = "RemediationCancelled";
    /// Warning: a power-off annotation whose remediation is gone was removed from its host.
    pub const ORPHAN_RELEASED: &str = "RemediationOrphanReleased";
}

/// Looks again this soon while a step waits on the host or the Node (events usually come
/// first; this covers a missed one).
const POLL: Duration = Duration::from_secs(10);

fn phase_of(step: RemediationStep, escalation: &Escalation) -> RemediationPhase {
    match step {
        RemediationStep::NotStarted | RemediationStep::Cancelled => RemediationPhase::Pending,
        RemediationStep::PowerOffRequested | RemediationStep::NodeReleased => {
            RemediationPhase::Running
        }
        RemediationStep::PowerOnRequested => RemediationPhase::Waiting,
        RemediationStep::Done => RemediationPhase::Succeeded,
        RemediationStep::GaveUp => match escalation {
            Escalation::DeleteMachine => RemediationPhase::DeletingMachine,
            _ => RemediationPhase::Failed,
        },
    }
}

fn event(warning: bool, reason: &'static str, message: String) -> Event {
    Event {
        warning,
        reason,
        message,
    }
}

/// Decides the next step of one remediation.
pub fn decide(obs: &Observation, now: Timestamp) -> Decision {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    match record.step {
        RemediationStep::NotStarted => start(obs, now),
        RemediationStep::PowerOffRequested => power_off(obs, now),
        RemediationStep::NodeReleased => {
            // Power on: record when waiting gives up, then release the power-off.
            let mut next = record.clone();
            next.step = RemediationStep::PowerOnRequested;
            next.power_on_timeout_at = Some(add(now, obs.power_on_timeout));
            Decision {
                record: Some(next),
                actions: vec![Action::ReleasePowerOff],
                events: vec![event(
                    false,
                    event_reason::POWER_ON_REQUESTED,
                    format!(
                        "powering the host on; waiting up to {}s for node {node_name} to register",
                        obs.power_on_timeout.as_secs()
                    ),
                )],
                phase: RemediationPhase::Waiting,
                message: format!("powering on; waiting for node {node_name} to register"),
                blocked: None,
                requeue: Some(POLL),
            }
        }
        RemediationStep::PowerOnRequested => power_on(obs, now),
        RemediationStep::GaveUp => {
            // Nothing left half-done: a Node that turns up after all gets its labels back.
            let mut d = Decision::wait(
                phase_of(record.step, &obs.escalation),
                format!(
                    "gave up: {}",
                    record
                        .failure
                        .as_deref()
                        .unwrap_or("the node did not come back")
                ),
            );
            if let Some(node) = &obs.node {
                match restore_node(record, node) {
                    Some(restore) => d.actions.push(restore),
                    None if record.labels_backup.is_some()
                        || record.annotations_backup.is_some() =>
                    {
                        d.record = Some(Record {
                            labels_backup: None,
                            annotations_backup: None,
                            ..record.clone()
                        });
                    }
                    None => {}
                }
            }
            release_left_off(obs, &mut d);
            d
        }
        RemediationStep::Done | RemediationStep::Cancelled => {
            let mut d = Decision::wait(
                phase_of(record.step, &obs.escalation),
                finished_message(record.step),
            );
            release_left_off(obs, &mut d);
            d
        }
    }
}

/// A finished remediation whose power-off is still on the host (its release was lost, e.g. a
/// restart right after the record was written) releases it: the host is never left off.
fn release_left_off(obs: &Observation, d: &mut Decision) {
    if obs.target.as_ref().is_ok_and(|h| h.power_off_requested) {
        d.actions.insert(0, Action::ReleasePowerOff);
    }
}

/// The backed-up labels and annotations the Node lacks (keys already on it win), as the
/// action that adds them; `None` when it has them all, or nothing was backed up.
fn restore_node(record: &Record, node: &NodeView) -> Option<Action> {
    let missing = |backup: &Option<BTreeMap<String, String>>, have: &BTreeMap<String, String>| {
        backup
            .iter()
            .flatten()
            .filter(|(k, _)| !have.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let labels = missing(&record.labels_backup, &node.labels);
    let annotations = missing(&record.annotations_backup, &node.annotations);
    (!labels.is_empty() || !annotations.is_empty()).then_some(Action::RestoreNode {
        labels,
        annotations,
    })
}

fn finished_message(step: RemediationStep) -> String {
    match step {
        RemediationStep::Done => "done: the node is back and Ready".into(),
        _ => "cancelled: the trigger went away before the node was released; the host was released"
            .into(),
    }
}

fn start(obs: &Observation, now: Timestamp) -> Decision {
    if !obs.requested {
        return Decision::wait(RemediationPhase::Pending, "not requested".into());
    }
    let host = match &obs.target {
        Ok(h) if !h.online => Err(Blocker::HostOffline(h.name.clone())),
        Ok(h) => Ok(h),
        Err(b) => Err(b.clone()),
    };
    let host = match host {
        Ok(h) => h,
        Err(blocker) => {
            let mut d = Decision::wait(
                RemediationPhase::Pending,
                format!("cannot start: {blocker}"),
            );
            d.blocked = Some(blocker.reason());
            d.events.push(event(
                true,
                event_reason::BLOCKED,
                format!("cannot remediate: {blocker}"),
            ));
            return d;
        }
    };
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    if let Some(until) = obs.queue_reboot_until.filter(|t| *t > now) {
        let mut d = Decision::wait(
            RemediationPhase::Pending,
            format!(
                "waiting: the reboot queue is rebooting node {node_name}; remediation starts if \
                 it has not booted by {until} (its bootTimeoutSeconds)"
            ),
        );
        d.requeue = Some(crate::queue::drain::elapsed(now, until) + Duration::from_millis(5));
        return d;
    }
    if !obs.slot_free {
        return Decision::wait(
            RemediationPhase::Pending,
            "waiting for a slot: maxConcurrentRemediations remediations are in flight".into(),
        );
    }
    let next = Record {
        step: RemediationStep::PowerOffRequested,
        started_at: obs.record.started_at.or(Some(now)),
        cycle_started_at: Some(now),
        ..obs.record.clone()
    };
    let mut events = vec![event(
        false,
        event_reason::STARTED,
        format!(
            "remediating node {node_name}: powering host {} off (hard)",
            host.name
        ),
    )];
    if obs.node.is_none() {
        events.push(event(
            true,
            event_reason::NODE_NOT_FOUND,
            format!(
                "node {node_name} does not exist: nothing to back up or delete; the host is \
                 fenced anyway and the node is awaited after the power-on"
            ),
        ));
    }
    Decision {
        record: Some(next),
        actions: vec![Action::RequestPowerOff],
        events,
        phase: RemediationPhase::Running,
        message: format!("powering host {} off", host.name),
        blocked: None,
        requeue: Some(POLL),
    }
}

fn power_off(obs: &Observation, now: Timestamp) -> Decision {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let host = obs.target.as_ref().ok();
    let host_name = host.map(|h| h.name.as_str()).unwrap_or("(missing)");
    let off = host.and_then(|h| h.powered_on) == Some(false);

    if !obs.requested {
        // Withdrawn before the Node was released: release the host; nothing else was done.
        // Once the Node's backup is recorded its deletion is decided (and may have happened
        // unseen by the cache), so the flow finishes instead.
        if record.labels_backup.is_none() {
            let next = Record {
                step: RemediationStep::Cancelled,
                ..record.clone()
            };
            let mut actions = vec![Action::ReleasePowerOff];
            if obs.trigger == Trigger::MachineAnnotation {
                actions.push(Action::FinishAnnotationFlow);
            }
            return Decision {
                record: Some(next),
                actions,
                events: vec![event(
                    false,
                    event_reason::CANCELLED,
                    format!(
                        "the remediation of node {node_name} was withdrawn before the node was \
                         released; host {host_name} released (it stays on or powers back on)"
                    ),
                )],
                phase: RemediationPhase::Pending,
                message: finished_message(RemediationStep::Cancelled),
                blocked: None,
                requeue: None,
            };
        }
    }

    let Some(host) = host else {
        let mut d = Decision::wait(
            RemediationPhase::Running,
            format!("waiting: BareMetalHost {host_name} is missing"),
        );
        d.requeue = Some(POLL);
        return d;
    };
    if !host.power_off_requested {
        // Recorded, not (yet) on the host: request it (idempotent).
        return Decision {
            record: None,
            actions: vec![Action::RequestPowerOff],
            events: Vec::new(),
            phase: RemediationPhase::Running,
            message: format!("powering host {} off", host.name),
            blocked: None,
            requeue: Some(POLL),
        };
    }
    if !off {
        let mut message = format!("waiting for host {} to power off", host.name);
        if let Some(error) = &host.error {
            message.push_str(&format!(" (the host controller reports: {error})"));
        }
        let mut d = Decision::wait(RemediationPhase::Running, message);
        d.requeue = Some(POLL);
        return d;
    }
    // Off, confirmed by the host's status: only now is the Node released.
    let mut next = record.clone();
    let mut events = Vec::new();
    if next.powered_off_at.is_none() {
        next.powered_off_at = Some(now);
        events.push(event(
            false,
            event_reason::POWERED_OFF,
            format!("host {} is off", host.name),
        ));
    }
    match &obs.node {
        Some(node) => {
            if next.labels_backup.is_none() {
                next.labels_backup = Some(node.labels.clone());
            }
            if next.annotations_backup.is_none() {
                next.annotations_backup = Some(node.annotations.clone());
            }
            events.push(event(
                false,
                event_reason::NODE_DELETED,
                format!(
                    "host {} is off: deleting node {node_name} so its workloads can start elsewhere \
                     (labels and annotations backed up)",
                    host.name
                ),
            ));
            Decision {
                record: Some(next),
                actions: vec![Action::DeleteNode],
                events,
                phase: RemediationPhase::Running,
                message: format!("host off; deleting node {node_name}"),
                blocked: None,
                requeue: Some(POLL),
            }
        }
        None => {
            next.step = RemediationStep::NodeReleased;
            next.node_released_at = Some(now);
            events.push(event(
                false,
                event_reason::NODE_RELEASED,
                format!("host {} is off and node {node_name} is gone", host.name),
            ));
            Decision {
                record: Some(next),
                actions: Vec::new(),
                events,
                phase: RemediationPhase::Running,
                message: format!("host off, node {node_name} released"),
                blocked: None,
                requeue: Some(Duration::ZERO),
            }
        }
    }
}

fn power_on(obs: &Observation, now: Timestamp) -> Decision {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let host = obs.target.as_ref().ok();
    if host.is_some_and(|h| h.power_off_requested) {
        // Recorded, not yet done: release the power-off (idempotent).
        return Decision {
            record: None,
            actions: vec![Action::ReleasePowerOff],
            events: Vec::new(),
            phase: RemediationPhase::Waiting,
            message: format!("powering on; waiting for node {node_name} to register"),
            blocked: None,
            requeue: Some(POLL),
        };
    }
    // The record with what this round learnt (a restored Node's backup forgotten).
    let mut next = record.clone();
    if let Some(node) = &obs.node {
        if let Some(restore) = restore_node(record, node) {
            // The backup is forgotten only once the Node has it (a later round): a restore
            // lost after a write-ahead record must not lose the labels with it.
            return Decision {
                record: None,
                actions: vec![restore],
                events: vec![event(
                    false,
                    event_reason::NODE_RESTORED,
                    format!(
                        "node {node_name} registered again; its labels and annotations are \
                         restored (keys on the new node win)"
                    ),
                )],
                phase: RemediationPhase::Waiting,
                message: format!("node {node_name} registered; restoring its labels"),
                blocked: None,
                requeue: Some(Duration::ZERO),
            };
        }
        next.labels_backup = None;
        next.annotations_backup = None;
        if node.ready {
            let next = Record {
                step: RemediationStep::Done,
                ..next
            };
            let mut actions = Vec::new();
            if obs.trigger == Trigger::MachineAnnotation {
                actions.push(Action::FinishAnnotationFlow);
            }
            return Decision {
                record: Some(next),
                actions,
                events: vec![event(
                    false,
                    event_reason::SUCCEEDED,
                    format!("node {node_name} is back and Ready"),
                )],
                phase: RemediationPhase::Succeeded,
                message: finished_message(RemediationStep::Done),
                blocked: None,
                requeue: None,
            };
        }
    }
    let Some(deadline) = record.power_on_timeout_at else {
        // No deadline (lost, or an unreadable annotation): the wait starts now. Read as
        // passed, it would give up (and escalate) at once.
        let deadline = add(now, obs.power_on_timeout);
        next.power_on_timeout_at = Some(deadline);
        let mut d = Decision::wait(
            RemediationPhase::Waiting,
            format!("waiting for node {node_name} to register (until {deadline})"),
        );
        d.record = Some(next);
        d.requeue = Some(POLL);
        return d;
    };
    if now < deadline {
        let mut d = Decision::wait(
            RemediationPhase::Waiting,
            match &obs.node {
                Some(_) => format!("waiting for node {node_name} to be Ready (until {deadline})"),
                None => format!("waiting for node {node_name} to register (until {deadline})"),
            },
        );
        d.requeue =
            Some(crate::queue::drain::elapsed(now, deadline).min(POLL) + Duration::from_millis(5));
        d.record = (next != *record).then_some(next);
        return d;
    }
    // Not back in time.
    if obs.requested && record.retry_count < obs.retry_limit {
        let next = Record {
            step: RemediationStep::PowerOffRequested,
            retry_count: record.retry_count + 1,
            cycle_started_at: Some(now),
            powered_off_at: None,
            node_released_at: None,
            power_on_timeout_at: None,
            ..next.clone()
        };
        return Decision {
            record: Some(next),
            actions: vec![Action::RequestPowerOff],
            events: vec![event(
                true,
                event_reason::RETRYING,
                format!(
                    "node {node_name} did not come back by {deadline}; power cycle {} of {}",
                    record.retry_count + 2,
                    obs.retry_limit + 1
                ),
            )],
            phase: RemediationPhase::Running,
            message: format!("retrying: node {node_name} did not come back"),
            blocked: None,
            requeue: Some(POLL),
        };
    }
    let failure = format!(
        "node {node_name} did not come back by {deadline} after {} power cycle{}",
        record.retry_count + 1,
        if record.retry_count == 0 { "" } else { "s" }
    );
    let next = Record {
        step: RemediationStep::GaveUp,
        failure: Some(failure.clone()),
        ..next
    };
    let mut events = vec![event(true, event_reason::FAILED, failure.clone())];
    let mut actions = Vec::new();
    let escalation = if obs.requested {
        obs.escalation.clone()
    } else {
        Escalation::None("the remediation was withdrawn meanwhile".into())
    };
    match &escalation {
        Escalation::None(why) => events.push(event(
            true,
            event_reason::FAILED,
            format!("no escalation: {why}"),
        )),
        other => {
            actions.push(Action::Escalate(other.clone()));
            events.push(event(
                true,
                event_reason::ESCALATED,
                match other {
                    Escalation::DeleteMachine => {
                        "deleting the Machine so its owner provisions a new one".to_string()
                    }
                    _ => "set OwnerRemediated=False on the Machine so its owner replaces it"
                        .to_string(),
                },
            ));
        }
    }
    Decision {
        record: Some(next.clone()),
        actions,
        events,
        phase: phase_of(next.step, &escalation),
        message: format!("gave up: {failure}"),
        blocked: None,
        requeue: None,
    }
}
