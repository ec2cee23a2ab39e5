//! The remediation flow as one pure step function: [`decide`] takes what the controller
//! observed and returns the record to write (before anything is done) and the actions.
//!
//! The seed's flow, whatever the trigger:
//! 1. bind the host (recorded: every later step acts on it alone), request its power-off
//!    (hard);
//! 2. once the host is off in a status written after that request, without error — never on
//!    an older status ([`crate::evidence`]) — back up the Node's labels, annotations, cordon
//!    and taints and delete the Node; not off by the power-off deadline: give up, escalate;
//! 3. once the Node is gone, mark the machine released;
//! 4. record when waiting gives up, and release the power-off so the host powers on;
//! 5. wait for the Node to register again;
//! 6. restore the labels and annotations (keys already on the new Node win), wait for it to be
//!    Ready, and clean up.
//!
//! Step 2 releases the workloads as `spec.strategy.release` asks: `DeleteNode` (above, the
//! seed's flow) or, keeping the Node, `ReleaseWorkloads` / `OutOfServiceTaint`
//! ([`super::release`]): tainted `hostcycle.io/fenced` from the power-off request, its pods
//! force-deleted and its `volumesInUse` cleared (or the out-of-service taint added) only on
//! fresh Off evidence, the power-on only once no pod and no VolumeAttachment of it is left,
//! and the flow done only when it is Ready with a new bootID (then hostcycle's taints go).
//!
//! A trigger that goes away before the Node was deleted cancels (the host is released); after,
//! the flow finishes the power-on and the cleanup. Not back by the timeout: another power cycle
//! while retries last (requests only), then give up and escalate.

use hostcycle_api::reasons::EventType;
use hostcycle_api::reasons::remediation::event_reason;
use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::ObservedBmc;
use hostcycle_api::remediation::{RemediationPhase, RemediationStep};
use jiff::Timestamp;

use super::record::Record;
use super::release::{Release, ReleaseAction, ReleaseFacts, ReleaseStrategy, ReleaseWait};
use crate::binding::BoundHost;
use crate::evidence::{PowerEvidence, PowerReport, power_since};
use crate::time::add;
use hostcycle_api::queue::CORDONED_BY_ANNOTATION;
use hostcycle_api::remediation::{
    FENCED_TAINT_KEY, NodeSpecBackup, OUT_OF_SERVICE_OURS_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY,
    TaintBackup,
};

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
pub struct RemediationHostView {
    /// `<namespace>/<name>`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The power state of the host's *confirmed* run of BMC readings (`status.powerObservation`:
    /// two agreeing readings at least a second apart, made by hostcycle's host controller);
    /// `None` without one. Never `status.poweredOn`, which any status write carries over.
    pub powered_on: Option<bool>,
    /// When that run's first reading was made (a run restarts when a request is noticed, so a
    /// run that began after the flow's request consists of readings made after it).
    pub last_updated: Option<Timestamp>,
    /// The BMC the readings came from (address and Secret read with, identity it reported).
    pub observed_bmc: Option<ObservedBmc>,
    /// `spec.bmc` now (address and Secret; no identity).
    pub spec_bmc: ObservedBmc,
    /// This remediation's power-off annotation is on the host.
    pub power_off_requested: bool,
    /// `spec.online`.
    pub online: bool,
    /// `spec.externallyProvisioned`.
    pub externally_provisioned: bool,
    /// The host controller's error, when it has one (a failing BMC).
    pub error: Option<String>,
    /// Why the host cannot be powered off now (`disablePowerOff`, paused, detached, no BMC
    /// address), if so.
    pub cannot_power_off: Option<String>,
    /// The unhealthy mark it carries (`capm3.metal3.io/unhealthy` or CAPM3's former
    /// `capi.metal3.io/unhealthy`): a remediation gave up on it.
    pub marked_unhealthy: Option<String>,
}

impl RemediationHostView {
    /// The power state as its status reports it.
    pub fn power_report(&self) -> PowerReport {
        PowerReport {
            powered_on: self.powered_on,
            last_updated: self.last_updated,
            error: self.error.clone(),
        }
    }
}

/// The Node, as the flow reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemediationNodeView {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub ready: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<TaintBackup>,
    /// `status.nodeInfo.bootID`: which run of the machine reports.
    pub boot_id: Option<String>,
    /// Entries of `status.volumesInUse` (what the kubelet last said it had mounted).
    pub volumes_in_use: usize,
}

/// Taints Kubernetes manages itself (not-ready, unreachable, unschedulable, …): never backed
/// up or restored.
pub fn system_taint(key: &str) -> bool {
    key.starts_with("node.kubernetes.io/")
        || key.starts_with("node.cloudprovider.kubernetes.io/")
        || key == FENCED_TAINT_KEY
}

impl RemediationNodeView {
    /// What an administrator set on the spec: the cordon unless the reboot queue's own, and
    /// the taints Kubernetes does not manage.
    pub fn spec_backup(&self) -> NodeSpecBackup {
        NodeSpecBackup {
            unschedulable: self.unschedulable
                && !self.annotations.contains_key(CORDONED_BY_ANNOTATION),
            taints: self
                .taints
                .iter()
                .filter(|t| !system_taint(&t.key))
                .cloned()
                .collect(),
        }
    }

    /// The annotations to back up: all but the reboot queue's cordon marker and the mark of
    /// hostcycle's out-of-service taint.
    pub fn annotations_backup(&self) -> BTreeMap<String, String> {
        let mut out = self.annotations.clone();
        out.remove(CORDONED_BY_ANNOTATION);
        out.remove(OUT_OF_SERVICE_OURS_ANNOTATION);
        out
    }

    /// `hostcycle.io/fenced` is on it.
    pub fn fenced_taint(&self) -> bool {
        self.taints.iter().any(|t| t.key == FENCED_TAINT_KEY)
    }

    /// The out-of-service taint is on it: `(ours, someone else's)`. Ours carries hostcycle's
    /// mark (an annotation only hostcycle sets with the taint).
    pub fn out_of_service(&self) -> (bool, bool) {
        let tainted = self
            .taints
            .iter()
            .any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY);
        let marked = self
            .annotations
            .contains_key(OUT_OF_SERVICE_OURS_ANNOTATION);
        (tainted && marked, tainted && !marked)
    }

    /// Ready with a boot other than `fenced` (any boot when none was recorded).
    pub fn back_with_new_boot(&self, fenced: Option<&str>) -> bool {
        self.ready
            && match fenced {
                Some(old) => self.boot_id.as_deref().is_some_and(|now| now != old),
                None => true,
            }
    }
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
    /// The host cannot be powered off now (`disablePowerOff`, paused, detached, no BMC).
    CannotPowerOff {
        host: String,
        why: String,
    },
    /// The binding is in doubt: sources disagree, another node claims the host, or it was
    /// replaced. `reason` is the condition's, `message` names both candidates.
    Binding {
        reason: &'static str,
        message: String,
    },
    /// A remediation gave up on the host before (`capm3.metal3.io/unhealthy`): it is not power
    /// cycled again until an administrator removes the mark.
    MarkedUnhealthy {
        host: String,
        key: String,
    },
    /// The request's namespace may not fence this host (`--remediation-request-namespaces`).
    RequestNamespace {
        request_namespace: String,
        host: String,
        rule: String,
    },
    /// `spec.strategy.release` cannot run here (why, in words).
    Strategy(String),
}

impl Blocker {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::HostNotReferenced | Self::NodeHostUnknown(_) => "HostNotReferenced",
            Self::HostNotFound(_) => "HostNotFound",
            Self::NodeRefUnset => "NodeRefUnset",
            Self::HostOffline(_) => "HostOffline",
            Self::CannotPowerOff { .. } => "HostCannotPowerOff",
            Self::MarkedUnhealthy { .. } => "HostMarkedUnhealthy",
            Self::Binding { reason, .. } => reason,
            Self::RequestNamespace { .. } => "RequestNamespaceNotAllowed",
            Self::Strategy(_) => event_reason::STRATEGY_UNAVAILABLE,
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
            Self::CannotPowerOff { host, why } => write!(
                f,
                "BareMetalHost {host} cannot be powered off now: it {why}; the remediation \
                 takes no slot until that changes"
            ),
            Self::MarkedUnhealthy { host, key } => write!(
                f,
                "BareMetalHost {host} carries {key}: a remediation gave up on it before; once the \
                 machine is repaired, remove the mark (kubectl annotate baremetalhost -n \
                 <namespace> <name> {key}-)"
            ),
            Self::Binding { message, .. } => f.write_str(message),
            Self::RequestNamespace {
                request_namespace,
                host,
                rule,
            } => write!(
                f,
                "a request in namespace {request_namespace} may not fence BareMetalHost {host} \
                 (the operator honours requests {rule}); create the request in the host's \
                 namespace, or widen `hostcycle operator --remediation-request-namespaces`"
            ),
            Self::Strategy(why) => f.write_str(why),
        }
    }
}

/// Which namespaces' requests (HostRemediations, annotated Machines) may fence which hosts:
/// `hostcycle operator --remediation-request-namespaces`. A request names a Node, and the
/// binding finds its host wherever it lives; this keeps a tenant who may create requests in
/// their own namespace from fencing other namespaces' hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestNamespaces {
    /// Requests are honoured for hosts of their own namespace (`same-as-host`).
    pub same_as_host: bool,
    /// Requests in any namespace are honoured (`*`).
    pub any: bool,
    /// Requests in these namespaces are honoured whatever the host's namespace.
    pub listed: std::collections::BTreeSet<String>,
    /// Requests in the operator's own namespace are honoured whatever the host's namespace
    /// (`operator-namespace`: where an administrator keeps NodeHealthCheck's templates);
    /// resolved into `listed` by [`RequestNamespaces::with_operator_namespace`].
    pub operator_namespace: bool,
}

impl Default for RequestNamespaces {
    /// `same-as-host,operator-namespace`: Cluster API puts Machines, Metal3Machines, hosts
    /// and its requests in one namespace, as OpenShift does (`openshift-machine-api`);
    /// NodeHealthCheck creates requests in its template's namespace, which an administrator
    /// may keep in the operator's namespace, where tenants create nothing.
    fn default() -> Self {
        RequestNamespaces {
            same_as_host: true,
            any: false,
            listed: Default::default(),
            operator_namespace: true,
        }
    }
}

impl std::str::FromStr for RequestNamespaces {
    type Err = String;

    /// A comma-separated list of `same-as-host`, `*` and namespace names.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut rule = RequestNamespaces {
            same_as_host: false,
            any: false,
            listed: Default::default(),
            operator_namespace: false,
        };
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "same-as-host" => rule.same_as_host = true,
                "operator-namespace" => rule.operator_namespace = true,
                "*" => rule.any = true,
                name if is_namespace_name(name) => {
                    rule.listed.insert(name.to_string());
                }
                other => {
                    return Err(format!(
                        "{:?} is not a namespace, `same-as-host`, `operator-namespace` or `*`",
                        other.chars().take(64).collect::<String>()
                    ));
                }
            }
        }
        if !rule.same_as_host && !rule.any && !rule.operator_namespace && rule.listed.is_empty() {
            return Err(
                "name at least one of `same-as-host`, `operator-namespace`, `*` or a namespace"
                    .into(),
            );
        }
        Ok(rule)
    }
}

impl std::fmt::Display for RequestNamespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<&str> = Vec::new();
        if self.any {
            parts.push("*");
        }
        if self.same_as_host {
            parts.push("same-as-host");
        }
        if self.operator_namespace {
            parts.push("operator-namespace");
        }
        parts.extend(self.listed.iter().map(String::as_str));
        f.write_str(&parts.join(","))
    }
}

/// A namespace name: a DNS-1123 label.
fn is_namespace_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl RequestNamespaces {
    /// The rule with `operator-namespace` resolved to `namespace` (the operator's own, where
    /// its Lease lives); without one, `operator-namespace` honours nothing more.
    pub fn with_operator_namespace(mut self, namespace: Option<&str>) -> Self {
        if self.operator_namespace
            && let Some(ns) = namespace
        {
            self.listed.insert(ns.to_string());
        }
        self
    }

    /// Whether a request in `request_namespace` may fence a host in `host_namespace`.
    pub fn allows(&self, request_namespace: &str, host_namespace: &str) -> bool {
        self.any
            || (self.same_as_host && request_namespace == host_namespace)
            || self.listed.contains(request_namespace)
    }

    /// `Err` with the blocker when a request in `request_namespace` may not fence `host`
    /// (`<namespace>/<name>`).
    pub fn check(&self, request_namespace: &str, host: &str) -> Result<(), Blocker> {
        let host_namespace = host.split_once('/').map_or("", |(ns, _)| ns);
        if self.allows(request_namespace, host_namespace) {
            return Ok(());
        }
        let rule = if self.same_as_host && self.listed.is_empty() {
            "only for hosts of their own namespace".to_string()
        } else if self.same_as_host {
            format!(
                "for hosts of their own namespace, and from {}",
                self.listed.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        } else {
            format!(
                "only from {}",
                self.listed.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        Err(Blocker::RequestNamespace {
            request_namespace: request_namespace.to_string(),
            host: host.to_string(),
            rule,
        })
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
    /// The host the binding resolver finds now, or why none. Used to start; once the record
    /// holds a binding, only [`Observation::bound`] is acted on.
    pub target: Result<RemediationHostView, Blocker>,
    /// The host under the record's binding (its namespace and name), if the record has one
    /// and such a host exists; its uid is checked against the record's.
    pub bound: Option<RemediationHostView>,
    /// The Node's name (from `nodeRef`, the request, or the mapping).
    pub node_name: Option<String>,
    /// The Node, if it exists.
    pub node: Option<RemediationNodeView>,
    pub record: Record,
    /// Power cycles allowed after the first (0 for the annotation flow).
    pub retry_limit: u32,
    /// How long the Node may take to come back after the power-on.
    pub power_on_timeout: Duration,
    /// How long the host may take to be confirmed off after the power-off request.
    pub power_off_timeout: Duration,
    /// A slot under `maxConcurrentRemediations` is free for this one (ignored once started).
    pub slot_free: bool,
    /// The reboot queue is rebooting this node: wait until this time (its boot timeout).
    pub queue_reboot_until: Option<Timestamp>,
    /// What giving up does.
    pub escalation: Escalation,
    /// Another remediator holds this Machine (or will: CAPBM's provider), in words: hostcycle
    /// does nothing ([`super::contracts::machine_claim`]).
    pub held_elsewhere: Option<String>,
    /// Another trigger's remediation is running on the same host
    /// ([`super::joins::joins`]): this one joins it instead of starting.
    pub joined_running: Option<String>,
    /// Why times written by different clocks cannot be compared now (the measured skew with
    /// the API server exceeds the bound), if so: no time-based evidence counts.
    pub clock_untrusted: Option<String>,
    /// `spec.strategy.release` (the annotation flow: `DeleteNode`), or why it is unreadable.
    pub release_strategy: Result<ReleaseStrategy, String>,
    /// The cluster honours the out-of-service taint (Kubernetes 1.28 and later, found by
    /// discovery).
    pub out_of_service_served: bool,
    /// The node's pods and VolumeAttachments, read from the API server when a release step
    /// needs them (`None`: not read this round).
    pub workloads: Option<Workloads>,
    /// `spec.strategy.afterRelease: LeaveOff`: once the workloads are released the host stays
    /// off for a person (a node that failed again soon after its last remediation), instead
    /// of being powered on.
    pub leave_off: bool,
}

/// What is left on a fenced node, read live (never from a cache) before releasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Workloads {
    /// Pods bound to the node.
    pub pods: usize,
    /// VolumeAttachments naming the node.
    pub attachments: usize,
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
    /// Add the backed-up labels, annotations and taints the new Node does not have, and its
    /// cordon when `cordon`.
    RestoreNode {
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        cordon: bool,
        taints: Vec<TaintBackup>,
    },
    /// The flow is over: remove the trigger and every marker (annotation flow).
    FinishAnnotationFlow,
    /// Mark the host as CAPM3 does when it gives up (`capm3.metal3.io/unhealthy`), so no new
    /// Machine lands on it and no remediation power-cycles it again.
    MarkHostUnhealthy,
    /// Remove the Cluster API Machine's `ExternallyRemediated` condition: the remediation
    /// succeeded.
    ClearExternallyRemediated,
    Escalate(Escalation),
    /// A step of releasing the workloads without deleting the Node (taints, force-deleting
    /// the pods, clearing `volumesInUse`); never `RecordReleasedAndPowerOn`, which is the
    /// record's step and [`Action::ReleasePowerOff`].
    Release(ReleaseAction),
}

/// An Event to publish (on the Machine or request; the controller copies the host and Node
/// ones where they concern them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub event_type: EventType,
    pub reason: &'static str,
    pub message: String,
}

impl Event {
    pub fn normal(reason: &'static str, message: String) -> Event {
        Event {
            event_type: EventType::Normal,
            reason,
            message,
        }
    }

    pub fn warning(reason: &'static str, message: String) -> Event {
        Event {
            event_type: EventType::Warning,
            reason,
            message,
        }
    }

    pub fn is_warning(&self) -> bool {
        self.event_type == EventType::Warning
    }
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
    /// The host could not be confirmed off by its deadline (or its BMC changed, or it is
    /// detached, paused or gone): the flow holds with nothing deleted, released or escalated
    /// (`CannotFence` condition, Warning, metric), and a person decides.
    pub cannot_fence: bool,
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
            cannot_fence: false,
        }
    }
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

/// The host a remediation acts on, as [`acting_host`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting<'a> {
    Host(&'a RemediationHostView),
    /// The bound host no longer exists (or, before a binding, none is found).
    Missing,
    /// A host of the bound name exists with another uid: not the bound host.
    Replaced(&'a RemediationHostView),
}

impl<'a> Acting<'a> {
    pub fn host(self) -> Option<&'a RemediationHostView> {
        match self {
            Acting::Host(h) => Some(h),
            _ => None,
        }
    }
}

/// The host every step after the start acts on: the one recorded at the start (same
/// namespace, name and uid) — never a new lookup, which a deleted Node or a forged hint could
/// change. A record without a binding (written before bindings were recorded) uses the
/// current lookup.
pub fn acting_host(obs: &Observation) -> Acting<'_> {
    match &obs.record.host {
        Some(bound) => match &obs.bound {
            Some(h) if h.uid == bound.uid => Acting::Host(h),
            Some(h) => Acting::Replaced(h),
            None => Acting::Missing,
        },
        None => match &obs.target {
            Ok(h) => Acting::Host(h),
            Err(_) => Acting::Missing,
        },
    }
}

/// The name of the host the remediation is about, for messages.
fn acting_name(obs: &Observation) -> String {
    match (&obs.record.host, &obs.target) {
        (Some(b), _) => b.reference.to_string(),
        (None, Ok(h)) => h.name.clone(),
        (None, Err(_)) => "(missing)".into(),
    }
}

/// Why the remediation cannot start now, if it cannot: no usable binding, a host that is
/// offline or cannot be powered off. A blocked remediation takes no slot.
pub fn start_blocker(obs: &Observation) -> Option<Blocker> {
    if let Err(why) = resolve_release(obs) {
        return Some(Blocker::Strategy(why));
    }
    match &obs.target {
        Err(b) => Some(b.clone()),
        Ok(h) if !h.online => Some(Blocker::HostOffline(h.name.clone())),
        Ok(RemediationHostView {
            name,
            marked_unhealthy: Some(key),
            ..
        }) => Some(Blocker::MarkedUnhealthy {
            host: name.clone(),
            key: key.clone(),
        }),
        Ok(h) => h
            .cannot_power_off
            .as_ref()
            .map(|why| Blocker::CannotPowerOff {
                host: h.name.clone(),
                why: why.clone(),
            }),
    }
}

/// The release this remediation runs once started: `spec.strategy.release` resolved by what
/// the cluster serves.
pub fn resolve_release(obs: &Observation) -> Result<Release, String> {
    obs.release_strategy
        .clone()
        .and_then(|s| s.resolve(obs.out_of_service_served))
}

/// Whether this remediation would start now if it had a slot: requested, not started, not
/// blocked, not waiting for the reboot queue. Only these compete for
/// `maxConcurrentRemediations`.
pub fn wants_slot(obs: &Observation, now: Timestamp) -> bool {
    obs.requested
        && obs.held_elsewhere.is_none()
        && obs.joined_running.is_none()
        && obs.record.joined.is_none()
        && obs.record.step == RemediationStep::NotStarted
        && start_blocker(obs).is_none()
        && obs.queue_reboot_until.is_none_or(|t| t <= now)
}

/// Whether the host is confirmed off for this power cycle: off in a status written after its
/// power-off was recorded, without error. The controller asks again, on a fresh read of the
/// host, right before it deletes the Node.
pub fn off_confirmed(host: &RemediationHostView, record: &Record) -> bool {
    host.power_off_requested
        && host.cannot_power_off.is_none()
        && bmc_changed(record, host).is_none()
        && readings_from_bound_bmc(record, host)
        && record
            .cycle_started_at
            .is_some_and(|since| power_since(&host.power_report(), since) == PowerEvidence::Off)
}

/// Whether this round's decision needs the node's pods and VolumeAttachments (read live by
/// the controller into [`Observation::workloads`]): a flow that keeps the Node, before its
/// release is recorded, with its host confirmed off — the only time `decide` releases
/// anything, so the only time the reads are worth their cost.
pub fn needs_workloads(obs: &Observation) -> bool {
    let record = &obs.record;
    record.release().keeps_node()
        && record.step == RemediationStep::PowerOffRequested
        && acting_host(obs)
            .host()
            .is_some_and(|h| off_confirmed(h, record))
}

/// Whether the flow holds its host off after releasing the workloads
/// (`afterRelease: LeaveOff`): only while the trigger still asks — a withdrawn request powers
/// the host on, so no flow ends with its host left off.
pub fn left_off(obs: &Observation) -> bool {
    obs.leave_off && obs.requested && obs.record.step == RemediationStep::NodeReleased
}

/// Decides the next step of one remediation.
pub fn decide(obs: &Observation, now: Timestamp) -> Decision {
    let mut d = decide_step(obs, now);
    keep_fenced(obs, &mut d);
    d
}

/// A flow that keeps the Node (`ReleaseWorkloads`, `OutOfServiceTaint`) keeps it tainted
/// `hostcycle.io/fenced:NoSchedule` from its power-off request until the Node is Ready with a
/// new boot, so nothing new is scheduled onto the machine being fenced: a taint lost (a
/// restart after the record, someone removing it) is put back.
fn keep_fenced(obs: &Observation, d: &mut Decision) {
    let record = d.record.as_ref().unwrap_or(&obs.record);
    let Some(node) = &obs.node else { return };
    if !record.release().keeps_node() || node.fenced_taint() {
        return;
    }
    let fencing = match record.step {
        RemediationStep::PowerOffRequested | RemediationStep::NodeReleased => true,
        RemediationStep::PowerOnRequested => {
            !node.back_with_new_boot(record.fenced_boot_id.as_deref())
        }
        _ => false,
    };
    let touched = d.actions.iter().any(|a| {
        matches!(
            a,
            Action::Release(ReleaseAction::AddFencedTaint | ReleaseAction::RemoveFencedTaint)
        )
    });
    if fencing && !touched {
        d.actions
            .push(Action::Release(ReleaseAction::AddFencedTaint));
    }
}

fn decide_step(obs: &Observation, now: Timestamp) -> Decision {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    if let Some(why) = &obs.held_elsewhere {
        // One remediator per trigger: two on one Machine race, and each would read the
        // other's markers as its own flow.
        let mut d = Decision::wait(RemediationPhase::Pending, format!("not acting: {why}"));
        d.blocked = Some(event_reason::HELD_ELSEWHERE);
        d.events
            .push(Event::warning(event_reason::HELD_ELSEWHERE, why.clone()));
        return d;
    }
    if let Some(missing) = record.missing_field() {
        return give_up_incomplete(obs, missing);
    }
    match record.step {
        RemediationStep::NotStarted => start(obs, now),
        RemediationStep::PowerOffRequested => power_off(obs, now),
        RemediationStep::NodeReleased if left_off(obs) => {
            let host = acting_name(obs);
            let mut d = Decision::wait(
                RemediationPhase::Running,
                format!(
                    "left off: host {host} is off and node {node_name}'s workloads are released; \
                     it stays off as spec.strategy.afterRelease asks (LeaveOff) until a person \
                     sets afterRelease to PowerOn or deletes this request"
                ),
            );
            d.events.push(Event::warning(
                event_reason::LEFT_OFF,
                format!(
                    "host {host} is left off after its workloads were released (afterRelease: \
                     LeaveOff): node {node_name} stays down until a person sets afterRelease to \
                     PowerOn or deletes the request"
                ),
            ));
            d
        }
        RemediationStep::NodeReleased => {
            // Power on: record when waiting gives up, then release the power-off.
            let mut next = record.clone();
            next.step = RemediationStep::PowerOnRequested;
            next.power_on_timeout_at = Some(add(now, obs.power_on_timeout));
            Decision {
                record: Some(next),
                actions: vec![Action::ReleasePowerOff],
                events: vec![Event::normal(
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
                cannot_fence: false,
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
                // A kept Node that came back with a new boot after all loses hostcycle's
                // taints; one that did not keeps them (nothing is scheduled onto it).
                if record.release().keeps_node()
                    && node.back_with_new_boot(record.fenced_boot_id.as_deref())
                {
                    if node.out_of_service().0 {
                        d.actions
                            .push(Action::Release(ReleaseAction::RemoveOutOfServiceTaint));
                    }
                    if node.fenced_taint() {
                        d.actions
                            .push(Action::Release(ReleaseAction::RemoveFencedTaint));
                    }
                }
                match restore_node(record, node) {
                    Some(restore) => d.actions.push(restore),
                    None if record.holds_backup() => {
                        d.record = Some(Record {
                            labels_backup: None,
                            annotations_backup: None,
                            node_spec_backup: None,
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
            // The annotation flow's record of an end is there only while its finish (trigger,
            // markers and record removed) has not gone through: finish it.
            if obs.trigger == Trigger::MachineAnnotation {
                d.actions.push(Action::FinishAnnotationFlow);
            }
            d
        }
    }
}

/// A record under way that lacks what it needs to go on (which host it bound, when it began)
/// gives up cleanly: its power-off is released (the host is never left off), nothing is
/// deleted or escalated, and a person is told why.
fn give_up_incomplete(obs: &Observation, missing: &str) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let failure = format!(
        "the remediation's record lacks {missing}: it cannot be followed safely; its \
         power-off is released and nothing else is done (trigger the remediation again to \
         start afresh)"
    );
    let mut d = Decision::wait(RemediationPhase::Failed, format!("gave up: {failure}"));
    d.record = Some(Record {
        step: RemediationStep::GaveUp,
        failure: Some(failure.clone()),
        ..obs.record.clone()
    });
    d.events.push(Event::warning(
        event_reason::RECORD_INCOMPLETE,
        format!("node {node_name}: {failure}"),
    ));
    release_left_off(obs, &mut d);
    d
}

/// A finished remediation whose power-off is still on the host (its release was lost, e.g. a
/// restart right after the record was written) releases it: the host is never left off.
fn release_left_off(obs: &Observation, d: &mut Decision) {
    if acting_host(obs)
        .host()
        .is_some_and(|h| h.power_off_requested)
    {
        d.actions.insert(0, Action::ReleasePowerOff);
    }
}

/// The backed-up labels, annotations and taints the Node lacks (keys already on it win), and
/// its cordon, as the action that adds them; `None` when it has them all, or nothing was
/// backed up.
fn restore_node(record: &Record, node: &RemediationNodeView) -> Option<Action> {
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
    let spec = record.node_spec_backup.clone().unwrap_or_default();
    let cordon = spec.unschedulable && !node.unschedulable;
    let taints: Vec<TaintBackup> = spec
        .taints
        .into_iter()
        .filter(|t| {
            !node
                .taints
                .iter()
                .any(|have| have.key == t.key && have.effect == t.effect)
        })
        .collect();
    (!labels.is_empty() || !annotations.is_empty() || cordon || !taints.is_empty()).then_some(
        Action::RestoreNode {
            labels,
            annotations,
            cordon,
            taints,
        },
    )
}

fn finished_message(step: RemediationStep) -> String {
    match step {
        RemediationStep::Done => "done: the node is back and Ready".into(),
        _ => "cancelled: the trigger went away before the node was released; the host was released"
            .into(),
    }
}

fn start(obs: &Observation, now: Timestamp) -> Decision {
    if let Some(d) = joined(obs) {
        return d;
    }
    if !obs.requested {
        return Decision::wait(RemediationPhase::Pending, "not requested".into());
    }
    if let Some(blocker) = start_blocker(obs) {
        let mut d = Decision::wait(
            RemediationPhase::Pending,
            format!("cannot start: {blocker}"),
        );
        d.blocked = Some(blocker.reason());
        d.events.push(Event::warning(
            event_reason::BLOCKED,
            format!("cannot remediate: {blocker}"),
        ));
        return d;
    }
    let Ok(host) = &obs.target else {
        // start_blocker covers every Err.
        return Decision::wait(RemediationPhase::Pending, "no host".into());
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
        d.requeue = Some(crate::time::elapsed(now, until) + Duration::from_millis(5));
        return d;
    }
    if !obs.slot_free {
        return Decision::wait(
            RemediationPhase::Pending,
            "waiting for a slot: maxConcurrentRemediations remediations are in flight".into(),
        );
    }
    // start_blocker refused an unresolvable strategy.
    let release = resolve_release(obs).unwrap_or(Release::DeleteNode);
    let next = Record {
        step: RemediationStep::PowerOffRequested,
        host: bind(host),
        bmc: Some(bind_bmc(host)),
        started_at: obs.record.started_at.or(Some(now)),
        cycle_started_at: Some(now),
        release: Some(release),
        fenced_boot_id: obs.node.as_ref().and_then(|n| n.boot_id.clone()),
        ..obs.record.clone()
    };
    let mut events = vec![Event::normal(
        event_reason::STARTED,
        format!(
            "remediating node {node_name}: powering host {} off (hard)",
            host.name
        ),
    )];
    if obs.node.is_none() {
        events.push(Event::warning(
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
        cannot_fence: false,
    }
}

/// One remediation per host: while another trigger's remediation runs on this host, this one
/// joins it (recorded, no action, no slot); once that one is over, this one ends with it —
/// succeeded when the Node is back and Ready, failed otherwise (without an escalation of its
/// own: the flow it joined had its own). `None` when it joined nothing.
fn joined(obs: &Observation) -> Option<Decision> {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let host = acting_name(obs);
    if let Some(other) = &obs.joined_running {
        let message = format!(
            "joined {other}, the remediation running on host {host}: one remediation per host; \
             this one ends with it"
        );
        let mut d = Decision::wait(RemediationPhase::Running, message.clone());
        if record.joined.as_ref() != Some(other) {
            d.record = Some(Record {
                joined: Some(other.clone()),
                ..record.clone()
            });
            d.events.push(Event::normal(event_reason::JOINED, message));
        }
        d.requeue = Some(POLL);
        return Some(d);
    }
    let other = record.joined.as_ref()?;
    let back = obs.node.as_ref().is_some_and(|n| n.ready);
    let mut actions = Vec::new();
    let (step, event, failure) = if !obs.requested {
        let event = Event::normal(
            event_reason::CANCELLED,
            format!("withdrawn while it joined {other}"),
        );
        (RemediationStep::Cancelled, event, None)
    } else if back {
        if obs.trigger == Trigger::Request && obs.escalation == Escalation::MarkOwnerRemediated {
            actions.push(Action::ClearExternallyRemediated);
        }
        let event = Event::normal(
            event_reason::SUCCEEDED,
            format!(
                "node {node_name} is back and Ready: {other}, which this one joined, recovered it"
            ),
        );
        (RemediationStep::Done, event, None)
    } else {
        let failure = format!(
            "{other}, which this one joined, ended without node {node_name} back and Ready"
        );
        let event = Event::warning(event_reason::FAILED, failure.clone());
        (RemediationStep::GaveUp, event, Some(failure))
    };
    // Done and Cancelled remove the annotation flow's trigger and markers; GaveUp keeps its
    // failure marker, as any annotation flow that gave up.
    if obs.trigger == Trigger::MachineAnnotation && step != RemediationStep::GaveUp {
        actions.push(Action::FinishAnnotationFlow);
    }
    let message = match &failure {
        Some(f) => format!("gave up: {f}"),
        None => finished_message(step),
    };
    Some(Decision {
        record: Some(Record {
            step,
            failure,
            ..record.clone()
        }),
        actions,
        events: vec![event],
        phase: phase_of(step, &Escalation::None(String::new())),
        message,
        blocked: None,
        requeue: None,
        cannot_fence: false,
    })
}

/// The binding recorded at the start.
fn bind(host: &RemediationHostView) -> Option<BoundHost> {
    crate::binding::parse_host_ref(&host.name, None).map(|reference| BoundHost {
        reference,
        uid: host.uid.clone(),
    })
}

/// The BMC bound with the host: `spec.bmc` now, and the identity the BMC at that address
/// reported (whatever Secret it was read with: the identity is the machine's).
fn bind_bmc(host: &RemediationHostView) -> ObservedBmc {
    let identity = host
        .observed_bmc
        .as_ref()
        .filter(|o| o.address == host.spec_bmc.address)
        .and_then(|o| o.identity.clone());
    ObservedBmc {
        identity,
        ..host.spec_bmc.clone()
    }
}

/// The BMC a flow compares readings with: the one it bound, or (a record written before
/// BMCs were bound) `spec.bmc` as it is now.
fn bound_bmc<'a>(record: &'a Record, host: &'a RemediationHostView) -> &'a ObservedBmc {
    record.bmc.as_ref().unwrap_or(&host.spec_bmc)
}

/// Why the host's BMC is no longer the one the flow bound, if it is not (a person decides):
/// - `spec.bmc.address` changed;
/// - the BMC at the address reports another identity than the bound one;
/// - `spec.bmc.credentialsName` changed and the flow bound no identity (a BMC that
///   reports none) that could show it is still the same machine. With an identity, a new
///   Secret (fixing a broken BMC's credentials) is fine once the BMC answers with that
///   identity.
pub fn bmc_changed(record: &Record, host: &RemediationHostView) -> Option<String> {
    let bound = bound_bmc(record, host);
    if host.spec_bmc.address != bound.address {
        return Some(format!(
            "its spec.bmc.address changed since the remediation bound it (bound {:?}, now {:?})",
            crate::text::bounded(&bound.address, 128),
            crate::text::bounded(&host.spec_bmc.address, 128)
        ));
    }
    if host.spec_bmc.credentials_name != bound.credentials_name && bound.identity.is_none() {
        return Some(format!(
            "its spec.bmc.credentialsName changed since the remediation bound it (bound {:?}, \
             now {:?})",
            crate::text::bounded(&bound.credentials_name, 253),
            crate::text::bounded(&host.spec_bmc.credentials_name, 253)
        ));
    }
    let observed = host
        .observed_bmc
        .as_ref()
        .filter(|o| o.address == bound.address)?;
    match (&bound.identity, &observed.identity) {
        (Some(was), Some(now)) if was != now => Some(format!(
            "the BMC at its address reports another identity ({now}) than when the remediation \
             bound it ({was})"
        )),
        _ => None,
    }
}

/// Whether the host's readings come from the BMC the flow bound: its address, `spec.bmc` as it
/// is now, and the bound identity (or, bound without one, the bound Secret).
fn readings_from_bound_bmc(record: &Record, host: &RemediationHostView) -> bool {
    let bound = bound_bmc(record, host);
    let Some(observed) = host.observed_bmc.as_ref() else {
        return false;
    };
    let read_with_spec = observed.address == host.spec_bmc.address
        && observed.credentials_name == host.spec_bmc.credentials_name;
    // Bound with an identity, a reading must report it (one without proves nothing).
    let identity_shown = bound.identity.is_none() || observed.identity.is_some();
    read_with_spec && bound.same_machine(observed) && identity_shown
}

/// The power-off step as a ladder: each rung either decides (and the step ends there) or
/// hands the next rung what it established.
fn power_off(obs: &Observation, now: Timestamp) -> Decision {
    // 1. Withdrawn before the Node was released: release the host, nothing else was done.
    if let Some(d) = cancel_before_release(obs) {
        return d;
    }
    // 2. Without the time of the request nothing can be fresher than it: the wait starts now.
    let Some(requested_at) = obs.record.cycle_started_at else {
        return start_power_off_wait(obs, now);
    };
    let deadline = add(requested_at, obs.power_off_timeout);
    // 3. The bound host, or why it is not there.
    let host = match acting_host(obs) {
        Acting::Host(h) => h,
        lost => return host_lost(obs, lost, now, deadline),
    };
    // 4. A host whose BMC changed, or that is detached, paused or has no BMC address, is
    //    never confirmed off: hold, and say why.
    if let Some(d) = unfenceable(obs, host, now, deadline) {
        return d;
    }
    // 5. Requested on the host and confirmed off by readings made after the request.
    if let Some(d) = await_confirmed_off(obs, host, requested_at, deadline, now) {
        return d;
    }
    // 6. Only now is the Node released: deleted, or its workloads released without it.
    match obs.record.release() {
        Release::DeleteNode => release_node(obs, host, now),
        release => release_workloads(obs, host, release, now),
    }
}

/// The host is off on fresh evidence: release the node's workloads without deleting the Node
/// ([`super::release::next_steps`]: the out-of-service taint, force-deleting the pods,
/// clearing `volumesInUse`), and power on once no pod and no VolumeAttachment of it is left.
fn release_workloads(
    obs: &Observation,
    host: &RemediationHostView,
    release: Release,
    now: Timestamp,
) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let mut next = obs.record.clone();
    let mut events = Vec::new();
    if next.powered_off_at.is_none() {
        next.powered_off_at = Some(now);
        events.push(Event::normal(
            event_reason::POWERED_OFF,
            format!(
                "host {} is off (two BMC readings from its bound BMC after the power-off)",
                host.name
            ),
        ));
    }
    let Some(workloads) = obs.workloads else {
        // The controller reads them from the API server for this step; not read this round.
        let mut d = Decision::wait(
            RemediationPhase::Running,
            format!(
                "host {} is off; reading node {node_name}'s pods and volume attachments",
                host.name
            ),
        );
        d.events = events;
        d.requeue = Some(RELEASE_POLL);
        d.record = (next != obs.record).then_some(next);
        return d;
    };
    let node = obs.node.as_ref();
    let (out_of_service_ours, out_of_service_foreign) = node
        .map(RemediationNodeView::out_of_service)
        .unwrap_or_default();
    let facts = ReleaseFacts {
        power_off_requested: host.power_off_requested,
        off_confirmed: true,
        node_exists: node.is_some(),
        fenced_taint: node.is_some_and(RemediationNodeView::fenced_taint),
        out_of_service_ours,
        out_of_service_foreign,
        pods_left: workloads.pods,
        volumes_in_use: node.map_or(0, |n| n.volumes_in_use),
        attachments_left: workloads.attachments,
        released: false,
        back_with_new_boot: false,
    };
    let (steps, wait) = super::release::next_steps(release, &facts);
    let released = steps.contains(&ReleaseAction::RecordReleasedAndPowerOn);
    let actions: Vec<Action> = steps
        .into_iter()
        .filter(|s| *s != ReleaseAction::RecordReleasedAndPowerOn)
        .map(Action::Release)
        .collect();
    if next.release_started_at.is_none() && (released || !actions.is_empty()) {
        next.release_started_at = Some(now);
        events.push(Event::normal(
            event_reason::RELEASING_WORKLOADS,
            format!(
                "host {} is off (two BMC readings from its bound BMC after the power-off): \
                 releasing node {node_name}'s workloads ({}) without deleting the node",
                host.name,
                match release {
                    Release::OutOfServiceTaint => "out-of-service taint, pods force-deleted",
                    _ => "pods force-deleted, volumesInUse cleared",
                }
            ),
        ));
    }
    if released {
        next.step = RemediationStep::NodeReleased;
        next.node_released_at = Some(now);
        events.push(Event::normal(
            event_reason::WORKLOADS_RELEASED,
            format!(
                "node {node_name} has no pod and no volume attachment left; host {} may power \
                 on",
                host.name
            ),
        ));
        return Decision {
            record: Some(next),
            actions,
            events,
            phase: RemediationPhase::Running,
            message: format!("host off, node {node_name}'s workloads released"),
            blocked: None,
            requeue: Some(Duration::ZERO),
            cannot_fence: false,
        };
    }
    let message = match wait {
        ReleaseWait::AwaitingPodsGone => format!(
            "host {} is off; force-deleting node {node_name}'s pods ({} left)",
            host.name, workloads.pods
        ),
        _ => format!(
            "host {} is off; waiting for the attach/detach controller to detach node \
             {node_name}'s volumes ({} attachment{} left)",
            host.name,
            workloads.attachments,
            if workloads.attachments == 1 { "" } else { "s" }
        ),
    };
    Decision {
        record: (next != obs.record).then_some(next),
        actions,
        events,
        phase: RemediationPhase::Running,
        message,
        blocked: None,
        requeue: Some(RELEASE_POLL),
        cannot_fence: false,
    }
}

/// How often a release in progress looks again: pods and VolumeAttachments wake no watch of
/// the flow, and every second here is a second of the failover.
const RELEASE_POLL: Duration = Duration::from_millis(500);

/// Withdrawn before the Node was released: the host is released and the flow cancelled. Once
/// the Node's backup is recorded its deletion is decided (and may have happened unseen by the
/// cache), so the flow finishes instead (`None`).
fn cancel_before_release(obs: &Observation) -> Option<Decision> {
    let record = &obs.record;
    if obs.requested || record.labels_backup.is_some() || record.release_started_at.is_some() {
        return None;
    }
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let host_name = acting_name(obs);
    // The fenced taint comes off first, while the step still says so (a cancelled record
    // never removes a taint: another flow may have put it there by then).
    if record.release().keeps_node() && obs.node.as_ref().is_some_and(|n| n.fenced_taint()) {
        let mut d = Decision::wait(
            RemediationPhase::Running,
            format!(
                "withdrawn: removing hostcycle.io/fenced from node {node_name}, then releasing \
                 host {host_name}"
            ),
        );
        d.actions
            .push(Action::Release(ReleaseAction::RemoveFencedTaint));
        d.requeue = Some(Duration::ZERO);
        return Some(d);
    }
    let next = Record {
        step: RemediationStep::Cancelled,
        ..record.clone()
    };
    let mut actions = vec![Action::ReleasePowerOff];
    if obs.trigger == Trigger::MachineAnnotation {
        actions.push(Action::FinishAnnotationFlow);
    }
    Some(Decision {
        record: Some(next),
        actions,
        events: vec![Event::normal(
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
        cannot_fence: false,
    })
}

/// Records `now` as the power-off request's time and waits.
fn start_power_off_wait(obs: &Observation, now: Timestamp) -> Decision {
    let mut d = Decision::wait(
        RemediationPhase::Running,
        format!("waiting for host {} to power off", acting_name(obs)),
    );
    d.record = Some(Record {
        cycle_started_at: Some(now),
        ..obs.record.clone()
    });
    d.requeue = Some(POLL);
    d
}

/// The bound host is missing or replaced: wait for it until the power-off deadline, then
/// give up (nothing to release on a host that is not the bound one).
fn host_lost(obs: &Observation, acting: Acting, now: Timestamp, deadline: Timestamp) -> Decision {
    let record = &obs.record;
    let host_name = acting_name(obs);
    let why = match acting {
        Acting::Replaced(h) => format!(
            "BareMetalHost {host_name} was replaced (uid {} instead of the bound {}); \
             the remediation never acts on the new host",
            h.uid,
            record.host.as_ref().map(|b| b.uid.as_str()).unwrap_or("?")
        ),
        _ => match (&record.host, &obs.target) {
            (Some(_), _) => format!(
                "BareMetalHost {host_name}, bound when the remediation started, no longer \
                 exists"
            ),
            (None, Err(blocker)) => blocker.to_string(),
            (None, Ok(_)) => format!("BareMetalHost {host_name} is missing"),
        },
    };
    let mut d = hold_unfenced(obs, &host_name, &why, now, deadline);
    d.events.push(Event::warning(event_reason::HOST_LOST, why));
    d
}

/// The host cannot be confirmed off now (its BMC changed, it is detached, paused or has no BMC
/// address): `None` when nothing stands in the way.
fn unfenceable(
    obs: &Observation,
    host: &RemediationHostView,
    now: Timestamp,
    deadline: Timestamp,
) -> Option<Decision> {
    if let Some(why) = bmc_changed(&obs.record, host) {
        let mut d = hold_unfenced(obs, &host.name, &why, now, deadline);
        d.events.push(Event::warning(
            event_reason::BMC_CHANGED,
            format!(
                "host {}: {why}; its readings are no evidence for this remediation",
                host.name
            ),
        ));
        return Some(d);
    }
    let why = host.cannot_power_off.as_ref()?;
    Some(hold_unfenced(
        obs,
        &host.name,
        &format!("it {why}"),
        now,
        deadline,
    ))
}

/// Waits for the host to be confirmed off; past the deadline, holds with `CannotFence`:
/// nothing is deleted, released, replaced or marked on a timeout, and the power-off stays
/// requested (a BMC that answers again still completes the fence). A person decides: repair
/// the BMC or its binding, or withdraw the remediation (which releases the host).
fn hold_unfenced(
    obs: &Observation,
    host_name: &str,
    why: &str,
    now: Timestamp,
    deadline: Timestamp,
) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    if now < deadline {
        let mut d = Decision::wait(
            RemediationPhase::Running,
            format!(
                "waiting for host {host_name} to be confirmed off ({why}); node {node_name} is \
                 kept until then"
            ),
        );
        d.requeue = Some(until_or_poll(now, deadline));
        return d;
    }
    if !obs.requested {
        // Withdrawn after the Node's deletion was decided (else it was cancelled): a person
        // decided; the host is released and nothing is escalated.
        return give_up(
            obs,
            obs.record.clone(),
            format!(
                "host {host_name} was not confirmed off ({why}); the remediation was withdrawn"
            ),
            true,
        );
    }
    let message = format!(
        "cannot fence host {host_name}: not confirmed off by two BMC readings from the bound BMC \
         within {}s of the power-off request ({why}); node {node_name} is kept and nothing is \
         escalated: repair the BMC or withdraw the remediation",
        obs.power_off_timeout.as_secs()
    );
    let mut d = Decision::wait(RemediationPhase::Running, message.clone());
    d.cannot_fence = true;
    d.events
        .push(Event::warning(event_reason::CANNOT_FENCE, message));
    d.requeue = Some(POLL);
    d
}

/// Until the host is confirmed off: request the power-off where it is not on the host yet,
/// wait, or give up at the deadline (releasing the power-off). `None` once it is off.
fn await_confirmed_off(
    obs: &Observation,
    host: &RemediationHostView,
    requested_at: Timestamp,
    deadline: Timestamp,
    now: Timestamp,
) -> Option<Decision> {
    let evidence = power_since(&host.power_report(), requested_at);
    let from_bound = readings_from_bound_bmc(&obs.record, host);
    let clock_ok = obs.clock_untrusted.is_none();
    if host.power_off_requested && evidence == PowerEvidence::Off && from_bound && clock_ok {
        return None;
    }
    if let Some(why) = &obs.clock_untrusted
        && host.power_off_requested
    {
        return Some(hold_unfenced(obs, &host.name, why, now, deadline));
    }
    if now >= deadline {
        let why = if !host.power_off_requested {
            "the power-off request never reached the host".into()
        } else if !from_bound {
            "no readings from the bound BMC".into()
        } else {
            evidence.describe(requested_at)
        };
        return Some(hold_unfenced(obs, &host.name, &why, now, deadline));
    }
    if !host.power_off_requested {
        // Recorded, not (yet) on the host: request it (idempotent).
        return Some(Decision {
            record: None,
            actions: vec![Action::RequestPowerOff],
            events: Vec::new(),
            phase: RemediationPhase::Running,
            message: format!("powering host {} off", host.name),
            blocked: None,
            requeue: Some(POLL),
            cannot_fence: false,
        });
    }
    let message = match &evidence {
        PowerEvidence::On => format!("waiting for host {} to power off", host.name),
        other => format!(
            "waiting for host {} to be confirmed off ({}); the node is kept until then",
            host.name,
            other.describe(requested_at)
        ),
    };
    let mut d = Decision::wait(RemediationPhase::Running, message);
    d.requeue = Some(until_or_poll(now, deadline));
    Some(d)
}

/// The host is off: back the Node up and delete it, or, once it is gone, record the Node
/// released.
fn release_node(obs: &Observation, host: &RemediationHostView, now: Timestamp) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let mut next = obs.record.clone();
    let mut events = Vec::new();
    if next.powered_off_at.is_none() {
        next.powered_off_at = Some(now);
        events.push(Event::normal(
            event_reason::POWERED_OFF,
            format!("host {} is off", host.name),
        ));
    }
    let Some(node) = &obs.node else {
        next.step = RemediationStep::NodeReleased;
        next.node_released_at = Some(now);
        events.push(Event::normal(
            event_reason::NODE_RELEASED,
            format!("host {} is off and node {node_name} is gone", host.name),
        ));
        return Decision {
            record: Some(next),
            actions: Vec::new(),
            events,
            phase: RemediationPhase::Running,
            message: format!("host off, node {node_name} released"),
            blocked: None,
            requeue: Some(Duration::ZERO),
            cannot_fence: false,
        };
    };
    if next.labels_backup.is_none() {
        next.labels_backup = Some(node.labels.clone());
    }
    if next.annotations_backup.is_none() {
        next.annotations_backup = Some(node.annotations_backup());
    }
    if next.node_spec_backup.is_none() {
        next.node_spec_backup = Some(node.spec_backup()).filter(|b| !b.is_empty());
    }
    events.push(Event::normal(
        event_reason::NODE_DELETED,
        format!(
            "host {} is off: deleting node {node_name} so its workloads can start elsewhere \
             (labels, annotations, cordon and taints backed up)",
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
        cannot_fence: false,
    }
}

/// Until `deadline` (a little after), at most [`POLL`].
fn until_or_poll(now: Timestamp, deadline: Timestamp) -> Duration {
    crate::time::elapsed(now, deadline).min(POLL) + Duration::from_millis(5)
}

/// The power-on step as a ladder: each rung either decides (and the step ends there) or
/// hands the next rung what it established.
fn power_on(obs: &Observation, now: Timestamp) -> Decision {
    // 1. The power-off is recorded released but still on the host: release it (idempotent).
    if acting_host(obs)
        .host()
        .is_some_and(|h| h.power_off_requested)
    {
        return release_power_off_again(obs);
    }
    // 2. The Node is back: restore it, then forget its backup; Ready ends the flow.
    let mut next = obs.record.clone();
    if let Some(node) = &obs.node
        && let Some(d) = node_back(obs, node, &mut next)
    {
        return d;
    }
    // 3. The host is held off by a person (`online: false`, paused, detached): it will not
    //    power on, so the wait for the Node is no failure — hold, escalate nothing, and start
    //    the wait afresh once the host is released.
    if let Some(d) = power_on_held(obs, &next) {
        return d;
    }
    // 4. Wait for the Node until the power-on deadline.
    let Some(deadline) = obs.record.power_on_timeout_at else {
        return start_power_on_wait(obs, now, next);
    };
    if now < deadline {
        return await_node(obs, now, deadline, next);
    }
    // 5. Not back in time: another power cycle, or give up.
    retry_or_give_up(obs, now, deadline, next)
}

/// The bound host cannot power on now because a person holds it (`spec.online: false`,
/// paused, detached): the flow waits without a deadline (it drops the recorded one, so the
/// wait for the Node starts afresh once the host is released) and escalates nothing.
fn power_on_held(obs: &Observation, next: &Record) -> Option<Decision> {
    let host = acting_host(obs).host()?;
    let why = if !host.online {
        "has spec.online: false".to_string()
    } else {
        host.cannot_power_off.clone()?
    };
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let mut d = Decision::wait(
        RemediationPhase::Waiting,
        format!(
            "waiting: host {} {why}, so it does not power on; node {node_name} is awaited once \
             it is released (nothing is escalated meanwhile)",
            host.name
        ),
    );
    if next.power_on_timeout_at.is_some() {
        d.record = Some(Record {
            power_on_timeout_at: None,
            ..next.clone()
        });
    }
    d.requeue = Some(POLL);
    Some(d)
}

/// Recorded, not yet done: release the power-off (idempotent).
fn release_power_off_again(obs: &Observation) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    Decision {
        record: None,
        actions: vec![Action::ReleasePowerOff],
        events: Vec::new(),
        phase: RemediationPhase::Waiting,
        message: format!("powering on; waiting for node {node_name} to register"),
        blocked: None,
        requeue: Some(POLL),
        cannot_fence: false,
    }
}

/// The Node registered again: restore its backup (forgotten in `next` only once the Node has
/// it, a later round: a restore lost after a write-ahead record must not lose the labels with
/// it); a Ready Node ends the flow. `None` while it is not Ready.
fn node_back(obs: &Observation, node: &RemediationNodeView, next: &mut Record) -> Option<Decision> {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    if obs.record.release().keeps_node() {
        // The Node was never deleted: it is back only when Ready with a new boot; then
        // hostcycle's taints come off (before the record ends, so none is left behind).
        if !node.back_with_new_boot(obs.record.fenced_boot_id.as_deref()) {
            return None;
        }
        let mut removals = Vec::new();
        if node.out_of_service().0 {
            removals.push(Action::Release(ReleaseAction::RemoveOutOfServiceTaint));
        }
        if node.fenced_taint() {
            removals.push(Action::Release(ReleaseAction::RemoveFencedTaint));
        }
        if !removals.is_empty() {
            let mut d = Decision::wait(
                RemediationPhase::Waiting,
                format!("node {node_name} is back with a new boot; removing hostcycle's taints"),
            );
            d.actions = removals;
            d.requeue = Some(Duration::ZERO);
            return Some(d);
        }
    }
    if let Some(restore) = restore_node(&obs.record, node) {
        return Some(Decision {
            record: None,
            actions: vec![restore],
            events: vec![Event::normal(
                event_reason::NODE_RESTORED,
                format!(
                    "node {node_name} registered again; its labels, annotations, cordon and \
                     taints are restored (keys on the new node win)"
                ),
            )],
            phase: RemediationPhase::Waiting,
            message: format!("node {node_name} registered; restoring its labels"),
            blocked: None,
            requeue: Some(Duration::ZERO),
            cannot_fence: false,
        });
    }
    next.labels_backup = None;
    next.annotations_backup = None;
    next.node_spec_backup = None;
    if !node.ready {
        return None;
    }
    let mut actions = Vec::new();
    if obs.trigger == Trigger::MachineAnnotation {
        actions.push(Action::FinishAnnotationFlow);
    }
    if obs.trigger == Trigger::Request && obs.escalation == Escalation::MarkOwnerRemediated {
        actions.push(Action::ClearExternallyRemediated);
    }
    Some(Decision {
        record: Some(Record {
            step: RemediationStep::Done,
            ..next.clone()
        }),
        actions,
        events: vec![Event::normal(
            event_reason::SUCCEEDED,
            format!("node {node_name} is back and Ready"),
        )],
        phase: RemediationPhase::Succeeded,
        message: finished_message(RemediationStep::Done),
        blocked: None,
        requeue: None,
        cannot_fence: false,
    })
}

/// No deadline (lost, or an unreadable annotation): the wait starts now. Read as passed, it
/// would give up (and escalate) at once.
fn start_power_on_wait(obs: &Observation, now: Timestamp, mut next: Record) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let deadline = add(now, obs.power_on_timeout);
    next.power_on_timeout_at = Some(deadline);
    let mut d = Decision::wait(
        RemediationPhase::Waiting,
        format!("waiting for node {node_name} to register (until {deadline})"),
    );
    d.record = Some(next);
    d.requeue = Some(POLL);
    d
}

/// Waits for the Node to register and be Ready; `next` is written only if this round changed
/// it.
fn await_node(obs: &Observation, now: Timestamp, deadline: Timestamp, next: Record) -> Decision {
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    let mut d = Decision::wait(
        RemediationPhase::Waiting,
        match &obs.node {
            Some(_) if obs.record.release().keeps_node() => format!(
                "waiting for node {node_name} to be Ready with a new boot (until {deadline})"
            ),
            Some(_) => format!("waiting for node {node_name} to be Ready (until {deadline})"),
            None => format!("waiting for node {node_name} to register (until {deadline})"),
        },
    );
    d.requeue = Some(until_or_poll(now, deadline));
    d.record = (next != obs.record).then_some(next);
    d
}

/// The Node did not come back in time: power-cycle again while retries are left and the
/// remediation is still requested, else give up.
fn retry_or_give_up(
    obs: &Observation,
    now: Timestamp,
    deadline: Timestamp,
    next: Record,
) -> Decision {
    let record = &obs.record;
    let node_name = obs.node_name.as_deref().unwrap_or("(unknown)");
    if !obs.requested || record.retry_count >= obs.retry_limit {
        let failure = format!(
            "node {node_name} did not come back by {deadline} after {} power cycle{}",
            record.retry_count + 1,
            if record.retry_count == 0 { "" } else { "s" }
        );
        return give_up(obs, next, failure, false);
    }
    let next = Record {
        step: RemediationStep::PowerOffRequested,
        retry_count: record.retry_count + 1,
        cycle_started_at: Some(now),
        powered_off_at: None,
        node_released_at: None,
        power_on_timeout_at: None,
        ..next
    };
    Decision {
        record: Some(next),
        actions: vec![Action::RequestPowerOff],
        events: vec![Event::warning(
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
        cannot_fence: false,
    }
}

/// The escalation as things are now. CAPBM's rule: a Machine is deleted on the power-on
/// timeout only while its Node is absent; one whose Node registered (not Ready) is kept.
fn escalation_now(obs: &Observation, record: &Record) -> Escalation {
    // Waiting for the Node after the power-on timed out (a power-on deadline is recorded).
    let power_on_timed_out = record.power_on_timeout_at.is_some();
    match (&obs.escalation, &obs.node) {
        (Escalation::DeleteMachine, Some(_)) if power_on_timed_out => Escalation::None(format!(
            "node {} is registered (not Ready): the Machine is kept, as OpenShift deletes a \
             Machine on timeout only while its Node is absent",
            obs.node_name.as_deref().unwrap_or("(unknown)")
        )),
        (other, _) => other.clone(),
    }
}

/// Gives up: records why, releases the power-off when `release` (so the host is not left
/// held off), and escalates to the Machine's owner when still requested.
fn give_up(obs: &Observation, record: Record, failure: String, release: bool) -> Decision {
    let next = Record {
        step: RemediationStep::GaveUp,
        failure: Some(failure.clone()),
        ..record
    };
    let mut events = vec![Event::warning(event_reason::FAILED, failure.clone())];
    let mut actions = Vec::new();
    if release {
        actions.push(Action::ReleasePowerOff);
    }
    let escalation = if obs.requested {
        escalation_now(obs, &next)
    } else {
        Escalation::None("the remediation was withdrawn meanwhile".into())
    };
    if escalation == Escalation::MarkOwnerRemediated && acting_host(obs).host().is_some() {
        actions.push(Action::MarkHostUnhealthy);
    }
    match &escalation {
        Escalation::None(why) => events.push(Event::warning(
            event_reason::FAILED,
            format!("no escalation: {why}"),
        )),
        other => {
            actions.push(Action::Escalate(other.clone()));
            events.push(Event::warning(
                event_reason::ESCALATED,
                match other {
                    Escalation::DeleteMachine => {
                        "deleting the Machine so its owner provisions a new one".to_string()
                    }
                    _ => "set OwnerRemediated=False on the Machine so its owner replaces it, \
                          and marked the host capm3.metal3.io/unhealthy so the new Machine \
                          does not land on it"
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
        cannot_fence: false,
    }
}
