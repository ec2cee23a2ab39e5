//! One entry's next step, decided: the status change to record first (write-ahead), what to
//! do once it is recorded, and the Events that say so — the same shape as a remediation's
//! decision. The controller carries an [`EntryDecision`] out in that order and adds no rule
//! of its own:
//!
//! 1. stop the entry's worker when [`EntryDecision::stop_worker`];
//! 2. record [`EntryDecision::status`] with the entry's resourceVersion as a precondition —
//!    when that fails (the entry changed, e.g. it was cancelled) nothing else happens and the
//!    next round decides again;
//! 3. take the [`EntryDecision::actions`] in order;
//! 4. publish the [`EntryDecision::events`].

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::{
    EntryPhase, HostReference, RebootMethod, RebootProgress, RebootQueueEntry,
    RebootQueueEntryStatus,
};
use hostcycle_api::reasons::{EventType, queue_condition, queue_event_reason as reason};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::address::{ambiguous_address_refusal, unsafe_address_refusal};
use super::config::{BackoffConfig, QueueConfig};
use super::drain::next_backoff;
use super::plan::{DequeueReason, WaitReason, resolve_method};
use super::reboot::{AfterDrain, BmcRebootStep, after_drain, boot_canary, boot_overdue};
use super::snapshot::{EntryView, QueueNodeView, RebootTarget};
use crate::conditions::set_condition;
use crate::text::bounded;
use crate::time::{elapsed, wire_precision};

/// Status and condition messages stay short: they are shown in `kubectl get` columns.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// What one entry does next.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EntryDecision {
    /// Stop the entry's worker before anything is recorded: it must not report on a phase
    /// the entry is leaving.
    pub stop_worker: bool,
    /// The status change to record before any action; empty: nothing to record.
    pub status: Vec<StatusEdit>,
    pub actions: Vec<EntryAction>,
    pub events: Vec<EntryEvent>,
}

impl EntryDecision {
    /// Nothing to do.
    pub fn none() -> Self {
        EntryDecision::default()
    }

    /// True when the decision changes nothing and does nothing.
    pub fn is_empty(&self) -> bool {
        *self == EntryDecision::default()
    }
}

/// One change to an entry's status.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusEdit {
    /// A new phase, entered at `at`.
    Transition {
        phase: EntryPhase,
        at: Timestamp,
    },
    /// `Queued` since `at`, only when the status has no phase yet (never written).
    QueuedIfNew {
        at: Timestamp,
    },
    Message(String),
    /// The reboot record: written at `Rebooting`, cleared when the entry leaves it.
    Reboot(Option<RebootProgress>),
    /// A failed drain: the backoff count and expiry, and why.
    DrainBackoff {
        count: u32,
        expire: Timestamp,
        failure: String,
    },
    SetCondition(Condition),
    RemoveCondition(&'static str),
    ClearConditions,
    /// The reboot command's attempt about to run (write-ahead).
    CommandAttempt(u32),
    /// The reboot command gave up; boot checks go on.
    CommandFailure(String),
    /// When the BMC reboot was requested (write-ahead).
    RebootRequestedAt(Timestamp),
    /// When the host was first seen powered off after the request.
    HostPoweredOffAt(Timestamp),
}

/// Applies `edits` to `status` in order; messages are bounded.
pub fn apply_edits(status: &mut RebootQueueEntryStatus, edits: &[StatusEdit]) {
    for edit in edits {
        match edit {
            StatusEdit::Transition { phase, at } => {
                status.phase = Some(*phase);
                status.last_transition_time = Some(*at);
            }
            StatusEdit::QueuedIfNew { at } => {
                if status.phase.is_none() {
                    status.phase = Some(EntryPhase::Queued);
                    status.last_transition_time = Some(*at);
                }
            }
            StatusEdit::Message(text) => status.message = bounded(text, MAX_MESSAGE_BYTES),
            StatusEdit::Reboot(progress) => status.reboot = progress.clone(),
            StatusEdit::DrainBackoff {
                count,
                expire,
                failure,
            } => {
                status.drain_backoff_count = *count;
                status.drain_backoff_expire = Some(*expire);
                status.last_drain_failure = Some(bounded(failure, MAX_MESSAGE_BYTES));
            }
            StatusEdit::SetCondition(condition) => {
                set_condition(&mut status.conditions, condition.clone())
            }
            StatusEdit::RemoveCondition(type_) => status.conditions.retain(|c| c.type_ != *type_),
            StatusEdit::ClearConditions => status.conditions.clear(),
            StatusEdit::CommandAttempt(attempt) => {
                if let Some(r) = status.reboot.as_mut() {
                    r.command_attempts = *attempt;
                }
            }
            StatusEdit::CommandFailure(failure) => {
                if let Some(r) = status.reboot.as_mut() {
                    r.command_failure = Some(failure.clone());
                }
            }
            StatusEdit::RebootRequestedAt(at) => {
                if let Some(r) = status.reboot.as_mut() {
                    r.requested_at = Some(*at);
                }
            }
            StatusEdit::HostPoweredOffAt(at) => {
                if let Some(r) = status.reboot.as_mut() {
                    r.host_powered_off_at = Some(*at);
                }
            }
        }
    }
}

/// What the controller does once the status change is recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum EntryAction {
    /// Start the drain worker (no-op while one runs).
    SpawnDrain,
    /// Ask the bound host for a power cycle: the reboot annotation and the request marker,
    /// in one patch with the host's uid as a precondition. A host not at hand: look again
    /// soon.
    RequestHostReboot,
    /// Mark the bound host as rebooted by this entry's command, so its controller leaves
    /// the power alone mid-cycle (when the host is at hand).
    MarkCommandReboot,
    /// Start the command worker: run attempt `run` of the reboot command first, or only
    /// boot checks when `None` (no-op while one runs).
    SpawnCommand { run: Option<u32> },
    /// The node booted: uncordon it (if the queue cordoned it) and remove the entry; the
    /// text says what proved the boot.
    Complete { detail: String },
    /// The drain reported completion: start the reboot, deciding on a fresh snapshot.
    StartReboot,
    /// Count it in the queue's metrics.
    Count(QueueCount),
    /// Look again soon (the next plan finishes the step, e.g. uncordons the node).
    LookAgainSoon,
}

/// A queue metric a decision feeds.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueCount {
    /// `hostcycle_queue_drain_backoffs_total{reason}`.
    DrainBackoff { kind: &'static str },
    /// `hostcycle_queue_boot_timeouts_total`.
    BootTimedOut,
    /// `hostcycle_queue_drain_duration_seconds`.
    DrainDuration(Duration),
}

/// Which object an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSubject {
    Entry,
    Node,
}

/// An Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryEvent {
    pub on: EventSubject,
    pub event_type: EventType,
    pub reason: &'static str,
    pub message: String,
}

fn event(
    on: EventSubject,
    event_type: EventType,
    reason: &'static str,
    message: &str,
) -> EntryEvent {
    EntryEvent {
        on,
        event_type,
        reason,
        message: message.to_string(),
    }
}

/// Both the entry and its node hear of it.
fn on_both(event_type: EventType, reason: &'static str, message: &str) -> [EntryEvent; 2] {
    [
        event(EventSubject::Entry, event_type, reason, message),
        event(EventSubject::Node, event_type, reason, message),
    ]
}

fn status_of(entry: &RebootQueueEntry) -> RebootQueueEntryStatus {
    entry.status.clone().unwrap_or_default()
}

/// Sets the message alone; nothing when it is already the entry's message (a write per
/// round would wake every watcher for nothing).
pub fn message_only(entry: &RebootQueueEntry, text: &str) -> EntryDecision {
    if entry.status.as_ref().map(|s| s.message.as_str()) == Some(text) {
        return EntryDecision::none();
    }
    EntryDecision {
        status: vec![StatusEdit::Message(text.to_string())],
        ..EntryDecision::default()
    }
}

// ----- draining ----------------------------------------------------------------------------

/// A queued entry the plan admits: record `Draining` (a fresh start: no reboot record, no
/// conditions), then start the drain worker.
pub fn start_drain(entry: &RebootQueueEntry, now: Timestamp) -> EntryDecision {
    let attempt = status_of(entry).drain_backoff_count.saturating_add(1);
    let text = format!(
        "cordoning and draining node {} (entry {}, attempt {attempt})",
        entry.spec.node, entry.spec.index
    );
    EntryDecision {
        stop_worker: false,
        status: vec![
            StatusEdit::Transition {
                phase: EntryPhase::Draining,
                at: now,
            },
            StatusEdit::Message("draining: cordoning the node".into()),
            StatusEdit::Reboot(None),
            StatusEdit::ClearConditions,
        ],
        actions: vec![EntryAction::SpawnDrain],
        events: on_both(EventType::Normal, reason::DRAIN_STARTED, &text).into(),
    }
}

/// A drain in progress: backs off once `evictionTimeoutSeconds` has passed since
/// `Draining`, else keeps its worker running. `jitter` in `[0, 1)` spreads the backoffs.
pub fn follow_drain(
    entry: &RebootQueueEntry,
    config: &QueueConfig,
    now: Timestamp,
    jitter: f64,
) -> EntryDecision {
    let view = EntryView::from_entry(entry);
    let timeout = config.eviction_timeout;
    let since = view.last_transition.unwrap_or(now);
    if elapsed(since, now) < timeout {
        return EntryDecision {
            actions: vec![EntryAction::SpawnDrain],
            ..EntryDecision::default()
        };
    }
    let last = view.message.trim_start_matches("draining: ");
    let why = format!(
        "drain timed out after {}s (evictionTimeoutSeconds): {last}",
        timeout.as_secs()
    );
    back_off(entry, &config.backoff, now, &why, "timeout", jitter)
}

/// The drain was stopped by the plan: the queue was disabled, or a remediation started on
/// the node. Back to `Queued`; the next plan uncordons the node.
pub fn stop_drain(node_being_remediated: bool, now: Timestamp) -> EntryDecision {
    let text = if node_being_remediated {
        "drain stopped: the node is being remediated; it is drained again from the start once \
         the remediation is over"
    } else {
        "drain stopped: the reboot queue was disabled; this node is drained again from the \
         start when the queue is enabled"
    };
    drain_stopped(text, now, Vec::new())
}

/// The drain failed (`why`; `kind` labels the metric): back to `Queued` with the next
/// backoff, the reboot record cleared; the next plan uncordons the node.
pub fn back_off(
    entry: &RebootQueueEntry,
    backoff: &BackoffConfig,
    now: Timestamp,
    why: &str,
    kind: &'static str,
    jitter: f64,
) -> EntryDecision {
    let previous = status_of(entry).drain_backoff_count;
    let (count, expire) = next_backoff(previous, backoff, now, jitter);
    let text = format!("drain failed ({why}); trying again after {expire} (failure {count})");
    EntryDecision {
        stop_worker: true,
        status: vec![
            back_to_queued(now),
            StatusEdit::DrainBackoff {
                count,
                expire,
                failure: why.to_string(),
            },
            StatusEdit::Message(text.clone()),
            StatusEdit::Reboot(None),
        ],
        actions: vec![
            EntryAction::Count(QueueCount::DrainBackoff { kind }),
            EntryAction::LookAgainSoon,
        ],
        events: on_both(EventType::Warning, reason::DRAIN_BACKOFF, &text).into(),
    }
}

/// The metric label of a drain worker's failure.
pub fn drain_failure_kind(failure: &str) -> &'static str {
    if failure.contains("Job pod") {
        "job_pods"
    } else if failure.contains("eviction") || failure.contains("PodDisruptionBudget") {
        "eviction"
    } else {
        "error"
    }
}

/// A back-off that a Warning of its own explains first (the reboot cannot start).
fn blocked_back_off(
    entry: &RebootQueueEntry,
    config: &QueueConfig,
    now: Timestamp,
    jitter: f64,
    (event_reason, kind): (&'static str, &'static str),
    text: &str,
) -> EntryDecision {
    let mut decision = back_off(entry, &config.backoff, now, text, kind, jitter);
    decision.events.insert(
        0,
        event(EventSubject::Entry, EventType::Warning, event_reason, text),
    );
    decision
}

// ----- rebooting ---------------------------------------------------------------------------

/// What [`start_reboot`] decides on, read when the drain reported completion.
#[derive(Debug, Clone)]
pub struct RebootStart<'a> {
    pub config: &'a QueueConfig,
    /// A remediation started on the node meanwhile.
    pub being_remediated: bool,
    pub target: &'a RebootTarget,
    pub node: Option<&'a QueueNodeView>,
    /// Every Node: by command, no other may report the node's address.
    pub nodes: &'a BTreeMap<String, QueueNodeView>,
    /// The target host and its uid, when the target is a host that is at hand: bound now,
    /// recorded with the transition, so every later step acts on this host.
    pub bound_host: Option<(HostReference, String)>,
    pub now: Timestamp,
    /// In `[0, 1)`: spreads a back-off.
    pub jitter: f64,
}

/// Why the commands must not get the node's address — unsafe, or another Node's too: the
/// Warning's reason and the back-off's metric label, and the text.
fn command_address_refusal(
    node: &str,
    input: &RebootStart,
) -> Option<((&'static str, &'static str), String)> {
    let address = &input.node?.address;
    if let Some(text) = unsafe_address_refusal(node, address) {
        return Some(((reason::UNSAFE_NODE_ADDRESS, "unsafe_node_address"), text));
    }
    let text = ambiguous_address_refusal(node, address, input.nodes.values())?;
    Some((
        (reason::AMBIGUOUS_NODE_ADDRESS, "ambiguous_node_address"),
        text,
    ))
}

/// The drain is complete: the same checks the plan made, made again at the irreversible
/// step (queue enabled, no remediation, a method, a safe address), then `Rebooting` is
/// recorded with everything a restart needs (write-ahead) and the reboot requested.
pub fn start_reboot(entry: &RebootQueueEntry, input: &RebootStart) -> EntryDecision {
    let node = entry.spec.node.as_str();
    let now = input.now;
    // 1. May the reboot start, and how?
    let method = match after_drain(
        input.config.enabled,
        input.being_remediated,
        resolve_method(&input.config.reboot, input.target),
    ) {
        AfterDrain::Reboot(method) => method,
        AfterDrain::Stop(why) => {
            return drain_stopped(&why, now, vec![EntryAction::LookAgainSoon]);
        }
        AfterDrain::Blocked(why) => {
            let text = format!("node {node} cannot be rebooted: {why}");
            let labels = (reason::REBOOT_BLOCKED, "reboot_blocked");
            return blocked_back_off(entry, input.config, now, input.jitter, labels, &text);
        }
    };
    // 2. The kubelets may have rewritten the addresses since the plan checked them.
    if method == RebootMethod::Command
        && let Some((labels, text)) = command_address_refusal(node, input)
    {
        return blocked_back_off(entry, input.config, now, input.jitter, labels, &text);
    }
    // 3. The record, then the request.
    let (progress, message) = reboot_record(input, method);
    let mut actions = match method {
        RebootMethod::Bmc => vec![EntryAction::RequestHostReboot],
        RebootMethod::Command => vec![
            EntryAction::MarkCommandReboot,
            EntryAction::SpawnCommand { run: Some(1) },
        ],
    };
    if let Some(since) = entry.status.as_ref().and_then(|s| s.last_transition_time) {
        actions.push(EntryAction::Count(QueueCount::DrainDuration(elapsed(
            since, now,
        ))));
    }
    let mut events = vec![
        event(
            EventSubject::Entry,
            EventType::Normal,
            reason::DRAIN_COMPLETED,
            &format!("node {node} drained"),
        ),
        event(
            EventSubject::Entry,
            EventType::Normal,
            reason::REBOOT_STARTED,
            &message,
        ),
    ];
    events.push(event(
        EventSubject::Node,
        EventType::Normal,
        reason::REBOOT_STARTED,
        &message,
    ));
    EntryDecision {
        stop_worker: false,
        status: vec![
            StatusEdit::Transition {
                phase: EntryPhase::Rebooting,
                at: now,
            },
            StatusEdit::Message(message),
            StatusEdit::Reboot(Some(progress)),
        ],
        actions,
        events,
    }
}

/// Back to `Queued` without a failure (the next plan uncordons the node); the text says why.
fn drain_stopped(text: &str, now: Timestamp, actions: Vec<EntryAction>) -> EntryDecision {
    EntryDecision {
        stop_worker: true,
        status: vec![back_to_queued(now), StatusEdit::Message(text.into())],
        actions,
        events: vec![event(
            EventSubject::Entry,
            EventType::Normal,
            reason::DRAIN_STOPPED,
            text,
        )],
    }
}

fn back_to_queued(now: Timestamp) -> StatusEdit {
    StatusEdit::Transition {
        phase: EntryPhase::Queued,
        at: now,
    }
}

/// The reboot record written at `Rebooting` and the message that goes with it.
fn reboot_record(input: &RebootStart, method: RebootMethod) -> (RebootProgress, String) {
    let mut progress = RebootProgress::new(method);
    progress.boot_id = input.node.and_then(|n| n.boot_id.clone());
    progress.requested_at = Some(input.now);
    if let Some((host, uid)) = &input.bound_host {
        progress.host = Some(host.clone());
        progress.host_uid = Some(uid.clone());
    }
    let message = match (&input.bound_host, method) {
        (Some((host, _)), RebootMethod::Bmc) => format!("rebooting through BareMetalHost {host}"),
        _ => {
            progress.command_attempts = 1;
            format!(
                "rebooting with the reboot command (attempt 1 of {})",
                input.config.reboot.command_retries.saturating_add(1)
            )
        }
    };
    (progress, message)
}

/// A `Rebooting` entry without a reboot record (written by an older version, or by hand):
/// the safest reading is that the reboot may have been requested; wait for a boot.
pub fn rebooting_without_record(entry: &RebootQueueEntry) -> EntryDecision {
    message_only(
        entry,
        "rebooting: no reboot record; cancel the entry to give up",
    )
}

/// `bootTimeoutSeconds` passed since `Rebooting` without a confirmed boot: the
/// `BootTimedOut` condition and a Warning, once. The entry keeps waiting.
pub fn boot_timeout(
    entry: &RebootQueueEntry,
    boot_timeout: Duration,
    now: Timestamp,
) -> Option<EntryDecision> {
    let view = EntryView::from_entry(entry);
    let since = view.last_transition.unwrap_or(now);
    if view.boot_timed_out || !boot_overdue(since, now, boot_timeout) {
        return None;
    }
    let text = format!(
        "node {} has not confirmed a boot {}s (bootTimeoutSeconds) after the reboot began at \
         {since}; the entry keeps waiting and the node stays cordoned; check the host, or \
         cancel the entry",
        entry.spec.node,
        boot_timeout.as_secs()
    );
    let condition = Condition {
        type_: queue_condition::BOOT_TIMED_OUT.into(),
        status: "True".into(),
        reason: queue_condition::BOOT_NOT_CONFIRMED.into(),
        message: text.clone(),
        last_transition_time: Time(wire_precision(now)),
        observed_generation: entry.metadata.generation,
    };
    Some(EntryDecision {
        stop_worker: false,
        status: vec![StatusEdit::SetCondition(condition)],
        actions: vec![EntryAction::Count(QueueCount::BootTimedOut)],
        events: on_both(EventType::Warning, reason::BOOT_TIMED_OUT, &text).into(),
    })
}

/// Carries a BMC reboot's step ([`super::reboot::bmc_reboot_step`]) into the entry.
/// `cancel_note`: the entry was cancelled after its cycle began; it is followed until the
/// node booted, asks nothing more of the host, and its messages say so.
pub fn follow_bmc_reboot(
    entry: &RebootQueueEntry,
    step: &BmcRebootStep,
    cancel_note: Option<&str>,
    now: Timestamp,
) -> EntryDecision {
    match step {
        BmcRebootStep::Request { .. } if cancel_note.is_some() => EntryDecision::none(),
        BmcRebootStep::Request { record } => EntryDecision {
            status: if *record {
                vec![StatusEdit::RebootRequestedAt(now)]
            } else {
                Vec::new()
            },
            actions: vec![EntryAction::RequestHostReboot],
            ..EntryDecision::default()
        },
        BmcRebootStep::RecordPowerOff { at } => {
            let text = cancel_note
                .unwrap_or("rebooting: the host is powered off; waiting for it to power on");
            EntryDecision {
                status: vec![
                    StatusEdit::HostPoweredOffAt(*at),
                    StatusEdit::Message(text.to_string()),
                ],
                ..EntryDecision::default()
            }
        }
        BmcRebootStep::Booted { boot_started } => complete(format!(
            "node {} is Ready after a boot that started at {boot_started}",
            entry.spec.node
        )),
        BmcRebootStep::NotPowerCycled(why) => not_power_cycled(entry, why),
        BmcRebootStep::Wait(text) => {
            let text = match cancel_note {
                Some(note) => format!("{note}; {text}"),
                None => format!("rebooting: {text}"),
            };
            message_only(entry, &text)
        }
    }
}

/// The boot canary failed: a Warning on the entry and the Node, the message says so, and the
/// entry does not complete (the node stays cordoned; the boot timeout follows).
fn not_power_cycled(entry: &RebootQueueEntry, why: &str) -> EntryDecision {
    let text = format!(
        "rebooting: {why}; the entry does not complete and the node stays cordoned: check \
         which machine was power-cycled (the host's spec.bmc, the node's address), then cancel \
         the entry"
    );
    let mut d = message_only(entry, &text);
    d.events = on_both(EventType::Warning, reason::NOT_POWER_CYCLED, &text).into();
    d
}

fn complete(detail: String) -> EntryDecision {
    EntryDecision {
        actions: vec![EntryAction::Complete { detail }],
        ..EntryDecision::default()
    }
}

// ----- workers ---------------------------------------------------------------------------

/// The worker an entry runs: its drain, or its reboot command and boot checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerKind {
    Drain,
    Command,
}

/// The worker `entry` should have running, if any: a drain while `Draining`, the command
/// worker while `Rebooting` by command. A cancelled entry keeps only the boot checks of a
/// command that ran (its node stays cordoned until it booted).
pub fn wanted_worker(entry: &RebootQueueEntry) -> Option<WorkerKind> {
    let status = entry.status.as_ref();
    match entry.phase() {
        EntryPhase::Draining if !entry.spec.cancel => Some(WorkerKind::Drain),
        EntryPhase::Rebooting
            if status
                .and_then(|s| s.reboot.as_ref())
                .is_some_and(|r| r.method == RebootMethod::Command) =>
        {
            Some(WorkerKind::Command)
        }
        _ => None,
    }
}

/// What starting a worker of kind `wanted` finds, with `running` the entry's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerRoom {
    /// None runs: start it.
    Free,
    /// One of the same kind runs: leave it (a second would repeat its work).
    Busy,
    /// One of the other kind is still there: its step is over — a drain whose completion
    /// was reported while its task was still ending — so stop it and start the new one.
    /// Skipping the start instead would lose the reboot command's first run, which is never
    /// repeated once its write-ahead record exists.
    ReplaceFinished,
}

/// Whether a worker of kind `wanted` may start next to `running`.
pub fn worker_room(running: Option<WorkerKind>, wanted: WorkerKind) -> WorkerRoom {
    match running {
        None => WorkerRoom::Free,
        Some(kind) if kind == wanted => WorkerRoom::Busy,
        Some(_) => WorkerRoom::ReplaceFinished,
    }
}

// ----- worker reports ----------------------------------------------------------------------

/// What a drain or command worker reported about its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerNews {
    /// The drain is under way; the text says what it waits for.
    DrainProgress(String),
    DrainCompleted,
    DrainFailed(String),
    /// Attempt `attempt` of the reboot command is about to run (to be recorded first).
    CommandAttempt {
        attempt: u32,
        previous_error: String,
    },
    CommandSucceeded,
    CommandGaveUp(String),
    BootCheck {
        booted: bool,
        detail: String,
    },
}

/// What a worker's news does to its entry. News that no longer fits the entry's phase (or
/// a cancelled entry's) changes nothing.
/// `node_boot_id` is the entry's Node's boot ID now (the boot canary).
pub fn after_worker_news(
    entry: &RebootQueueEntry,
    news: &WorkerNews,
    node_boot_id: Option<&str>,
    config: &QueueConfig,
    now: Timestamp,
    jitter: f64,
) -> EntryDecision {
    let status = status_of(entry);
    let phase = status.phase();
    let draining = phase == EntryPhase::Draining;
    let rebooting = phase == EntryPhase::Rebooting;
    let cancel = entry.spec.cancel;
    match news {
        WorkerNews::DrainProgress(text) if draining && !cancel => {
            message_only(entry, &format!("draining: {text}"))
        }
        WorkerNews::DrainFailed(why) if draining => {
            let kind = drain_failure_kind(why);
            back_off(entry, &config.backoff, now, why, kind, jitter)
        }
        WorkerNews::DrainCompleted if draining && !cancel => EntryDecision {
            actions: vec![EntryAction::StartReboot],
            ..EntryDecision::default()
        },
        WorkerNews::CommandAttempt {
            attempt,
            previous_error,
        } if rebooting && !cancel => EntryDecision {
            status: vec![
                StatusEdit::CommandAttempt(*attempt),
                StatusEdit::Message(format!(
                    "reboot command failed ({previous_error}); running attempt {attempt}"
                )),
            ],
            ..EntryDecision::default()
        },
        WorkerNews::CommandSucceeded if rebooting => message_only(
            entry,
            "reboot command succeeded; waiting for the boot check to print true",
        ),
        WorkerNews::CommandGaveUp(failure) if rebooting => {
            let text = format!(
                "the reboot command failed ({failure}); boot checks go on; after \
                 bootTimeoutSeconds cancel the entry to give up (delete it to give up at once)"
            );
            EntryDecision {
                status: vec![
                    StatusEdit::CommandFailure(failure.clone()),
                    StatusEdit::Message(text.clone()),
                ],
                events: vec![event(
                    EventSubject::Entry,
                    EventType::Warning,
                    reason::REBOOT_COMMAND_FAILED,
                    &text,
                )],
                ..EntryDecision::default()
            }
        }
        // Also a cancelled entry waiting for its cycle: done, now it may go — once the Node
        // booted anew (the command may have reached another machine).
        WorkerNews::BootCheck {
            booted: true,
            detail,
        } if rebooting => {
            let recorded = status.reboot.as_ref().and_then(|r| r.boot_id.as_deref());
            match boot_canary(&entry.spec.node, recorded, node_boot_id) {
                Ok(()) => complete(detail.clone()),
                Err(why) => not_power_cycled(entry, &format!("the boot check passed, but {why}")),
            }
        }
        WorkerNews::BootCheck {
            booted: false,
            detail,
        } if rebooting && !cancel => message_only(entry, &format!("rebooting: {detail}")),
        _ => EntryDecision::none(),
    }
}

// ----- waiting and leaving -----------------------------------------------------------------

/// A queued entry the plan keeps waiting: its message says why, and an entry whose node
/// cannot be rebooted also carries the `Blocked` condition and a Warning. Nothing when the
/// entry already says all of it (`None`).
pub fn waiting(
    entry: &RebootQueueEntry,
    why: &WaitReason,
    now: Timestamp,
) -> Option<EntryDecision> {
    let text = format!("waiting: {}", why.summary());
    let status = status_of(entry);
    let blocking = why.blocked();
    let was_blocked = status
        .conditions
        .iter()
        .any(|c| c.type_ == queue_condition::BLOCKED && c.status == "True");
    if status.message == text && status.phase.is_some() && blocking.is_some() == was_blocked {
        return None;
    }
    let created = entry.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let mut edits = vec![
        StatusEdit::QueuedIfNew {
            at: created.unwrap_or(now),
        },
        StatusEdit::Message(text),
    ];
    let mut events = Vec::new();
    match blocking {
        Some(blocking) => {
            edits.push(StatusEdit::SetCondition(Condition {
                type_: queue_condition::BLOCKED.into(),
                status: "True".into(),
                reason: blocking.condition_reason.into(),
                message: bounded(&why.to_string(), MAX_MESSAGE_BYTES),
                last_transition_time: Time(wire_precision(now)),
                observed_generation: entry.metadata.generation,
            }));
            events.push(event(
                EventSubject::Entry,
                EventType::Warning,
                blocking.event_reason,
                &format!("node {} cannot be rebooted now: {why}", entry.spec.node),
            ));
        }
        None => edits.push(StatusEdit::RemoveCondition(queue_condition::BLOCKED)),
    }
    Some(EntryDecision {
        stop_worker: false,
        status: edits,
        actions: Vec::new(),
        events,
    })
}

/// How an entry that leaves the queue says so: its Event and the `dequeued` metric's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaving {
    pub event: EntryEvent,
    pub metric_reason: &'static str,
}

/// A cancelled entry is recorded `Cancelled` before it is removed.
pub fn record_cancelled(entry: &RebootQueueEntry, now: Timestamp) -> Vec<StatusEdit> {
    if status_of(entry).phase() == EntryPhase::Cancelled {
        return Vec::new();
    }
    vec![
        StatusEdit::Transition {
            phase: EntryPhase::Cancelled,
            at: now,
        },
        StatusEdit::Message("cancelled; removing the entry".into()),
    ]
}

/// The Event and metric of an entry the plan removes; `phase` is the one it left.
pub fn dequeued(entry: &RebootQueueEntry, why: &DequeueReason, phase: EntryPhase) -> Leaving {
    let (index, node) = (entry.spec.index, &entry.spec.node);
    let (event_type, event_reason, metric_reason) = match why {
        DequeueReason::Cancelled => (EventType::Normal, reason::CANCELLED, "Cancelled"),
        DequeueReason::NodeNotFound => (EventType::Warning, reason::NODE_NOT_FOUND, "NodeNotFound"),
        DequeueReason::Duplicate { .. } => {
            (EventType::Warning, reason::DUPLICATE_ENTRY, "Duplicate")
        }
    };
    let note = match (why, phase) {
        (DequeueReason::Cancelled, EntryPhase::Rebooting) => format!(
            "entry {index} for node {node} cancelled while rebooting, before any power cycle \
             began or after bootTimeoutSeconds; the node is uncordoned"
        ),
        (DequeueReason::Cancelled, EntryPhase::Draining) => format!(
            "entry {index} for node {node} cancelled while draining; the node is uncordoned and \
             not rebooted"
        ),
        _ => format!("entry {index} for node {node} removed: {why}"),
    };
    Leaving {
        event: event(EventSubject::Entry, event_type, event_reason, &note),
        metric_reason,
    }
}

/// The Events of a completed reboot (the entry removed, the node uncordoned when
/// `uncordoned`), in order, and the `dequeued` metric's reason. A cancelled entry kept for
/// its power cycle ends here too, as cancelled.
pub fn completed(
    entry: &RebootQueueEntry,
    detail: &str,
    uncordoned: bool,
) -> (Vec<EntryEvent>, &'static str) {
    let (index, node) = (entry.spec.index, &entry.spec.node);
    let text = format!("node {node} rebooted: {detail}");
    let mut events: Vec<EntryEvent> =
        on_both(EventType::Normal, reason::BOOT_CONFIRMED, &text).into();
    if uncordoned {
        events.push(event(
            EventSubject::Node,
            EventType::Normal,
            reason::UNCORDONED,
            &format!("uncordoned node {node} after its reboot (the reboot queue had cordoned it)"),
        ));
    }
    let (event_reason, note, metric_reason) = if entry.spec.cancel {
        (
            reason::CANCELLED,
            format!(
                "entry {index} for node {node} cancelled while rebooting; its power cycle had \
                 begun and is over: the node is uncordoned and the entry removed"
            ),
            "Cancelled",
        )
    } else {
        (
            reason::COMPLETED,
            format!("entry {index} for node {node} done; the entry is removed"),
            "Completed",
        )
    };
    events.push(event(
        EventSubject::Entry,
        EventType::Normal,
        event_reason,
        &note,
    ));
    (events, metric_reason)
}

/// The Event of a cancel that withdrew the reboot request before the power cycle began.
pub fn withdrawn(entry: &RebootQueueEntry, host: &HostReference) -> EntryEvent {
    event(
        EventSubject::Entry,
        EventType::Normal,
        reason::REBOOT_WITHDRAWN,
        &format!(
            "entry {} for node {} cancelled before the power cycle began: the reboot request \
             was withdrawn from BareMetalHost {host}; the node is uncordoned and not rebooted",
            entry.spec.index, entry.spec.node
        ),
    )
}
