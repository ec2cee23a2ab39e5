//! Candidate selection: which entries start draining now, which leave the queue, and why
//! every other queued entry waits. The controller and `hostcycle rq plan` both call [`plan`].

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hostcycle_api::queue::{EntryPhase, RebootMethod};
use jiff::Timestamp;

use hostcycle_api::reasons::{queue_condition, queue_event_reason};

use super::address::{AddressOwners, check_command_address, shown_address};
use super::snapshot::{EntryRef, EntryView, QueueSnapshot, RebootTarget};

/// Why an entry leaves the queue without (further) processing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DequeueReason {
    /// `spec.cancel` is true.
    Cancelled,
    /// No Node of that name exists.
    NodeNotFound,
    /// An entry with a lower index exists for the same node; the first wins.
    Duplicate { first_index: u64 },
}

impl DequeueReason {
    /// Short machine-friendly form.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Cancelled => "Cancelled",
            Self::NodeNotFound => "NodeNotFound",
            Self::Duplicate { .. } => "Duplicate",
        }
    }
}

impl fmt::Display for DequeueReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::NodeNotFound => f.write_str("node not found in the cluster"),
            Self::Duplicate { first_index } => {
                write!(f, "duplicate: entry {first_index} already queues this node")
            }
        }
    }
}

/// Why a queued entry does not start draining now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    Disabled,
    BackedOff {
        until: Timestamp,
        failures: u32,
        /// Why the last drain failed, when recorded.
        last_failure: Option<String>,
    },
    /// Every slot is taken by entries in progress.
    NoFreeSlot {
        in_progress: Vec<String>,
        max: u32,
    },
    /// Slots are free but entries with lower indexes take them first.
    BehindEarlierEntries {
        free_slots: u32,
    },
    /// API servers go after every queued or in-progress worker.
    ApiServerAfterWorkers {
        workers: Vec<String>,
    },
    /// Another API-server node is draining or rebooting.
    ApiServerInProgress {
        node: String,
    },
    /// API servers go one at a time: this one is behind an earlier API-server entry.
    ApiServerOneAtATime {
        first: String,
    },
    /// Too many nodes that are not being processed are unreachable.
    TooManyUnreachable {
        nodes: Vec<String>,
        max: u32,
        /// Those of `nodes` that are away ([`QueueSnapshot::away`]), with why they count.
        away: Vec<AwayRef>,
    },
    /// An API-server node is away (absent, fenced or held off): it counts as an API server in
    /// progress, so no other API-server node starts, whatever `maxUnreachableNodes` says.
    ApiServerAway {
        away: AwayRef,
    },
    /// The node cannot be rebooted now; draining it would be pointless.
    CannotReboot {
        why: String,
    },
    /// The node is rebooted by command, and its address (from its Node status) is not one
    /// the commands may get ([`super::address::check_command_address`]).
    UnsafeNodeAddress {
        /// The address as shown in messages (quoted, clipped).
        address: String,
        why: String,
    },
    /// The node is rebooted by command, and another Node reports its address too: the
    /// commands could reach that node ([`super::address::node_sharing_address`]).
    AmbiguousNodeAddress {
        /// The address as shown in messages (quoted, clipped).
        address: String,
        /// The other node.
        other: String,
    },
    /// A remediation is working on the node (fencing or recovering it).
    BeingRemediated,
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("the reboot queue is disabled"),
            Self::BackedOff {
                until,
                failures,
                last_failure,
            } => {
                write!(
                    f,
                    "drain backed off after {failures} failed attempt{} until {until}",
                    if *failures == 1 { "" } else { "s" }
                )?;
                match last_failure {
                    Some(why) => write!(f, "; last failure: {why}"),
                    None => Ok(()),
                }
            }
            Self::NoFreeSlot { in_progress, max } => write!(
                f,
                "all {max} slot{} (maxConcurrentReboots) taken by {}",
                if *max == 1 { "" } else { "s" },
                list(in_progress)
            ),
            Self::BehindEarlierEntries { free_slots } => write!(
                f,
                "the {free_slots} free slot{} go{} to entries queued earlier",
                if *free_slots == 1 { "" } else { "s" },
                if *free_slots == 1 { "es" } else { "" }
            ),
            Self::ApiServerAfterWorkers { workers } => write!(
                f,
                "API-server node waits until no worker is queued or in progress ({})",
                list(workers)
            ),
            Self::ApiServerInProgress { node } => {
                write!(f, "API-server node {node} is being processed")
            }
            Self::ApiServerOneAtATime { first } => {
                write!(f, "API-server nodes go one at a time; {first} is first")
            }
            Self::TooManyUnreachable { nodes, max, away } => {
                write!(
                    f,
                    "{} unreachable node{} not being rebooted ({}) exceed{} \
                     maxUnreachableNodes={max}",
                    nodes.len(),
                    if nodes.len() == 1 { "" } else { "s" },
                    list(nodes),
                    if nodes.len() == 1 { "s" } else { "" }
                )?;
                let described: Vec<String> = away.iter().map(AwayRef::to_string).collect();
                match described.is_empty() {
                    true => Ok(()),
                    false => write!(f, "; {}", list_with(&described, "; ")),
                }
            }
            Self::ApiServerAway { away } => write!(
                f,
                "API-server {away}; API-server nodes go one at a time, so no other starts"
            ),
            Self::CannotReboot { why } => write!(f, "cannot be rebooted: {why}"),
            Self::UnsafeNodeAddress { address, why } => write!(
                f,
                "cannot be rebooted by command: its address {address} (from the Node's status) \
                 is not an IP address or a DNS name: {why}; the commands are not run with it"
            ),
            Self::AmbiguousNodeAddress { address, other } => write!(
                f,
                "cannot be rebooted by command: its address {address} (from the Node's status) \
                 is also an address of node {other}; the commands are not run with it"
            ),
            Self::BeingRemediated => f.write_str(
                "the node is being remediated; the queue drains and reboots it once the \
                 remediation is over",
            ),
        }
    }
}

impl WaitReason {
    /// The reason for an entry's `status.message`: like the `Display` text, but without the
    /// lists of nodes that change with every start and finish elsewhere in the queue, so a
    /// busy queue does not rewrite every waiting entry at every transition. `hostcycle rq
    /// plan` shows the full text.
    pub fn summary(&self) -> String {
        match self {
            Self::NoFreeSlot { max, .. } => format!(
                "all {max} slot{} (maxConcurrentReboots) are taken",
                if *max == 1 { "" } else { "s" }
            ),
            Self::ApiServerAfterWorkers { .. } => {
                "API-server node waits until no worker is queued or in progress".into()
            }
            other => other.to_string(),
        }
    }

    /// For a node that cannot be rebooted: the reason of its entry's `Blocked` condition and
    /// of the Warning Event saying so. `None` for every other wait.
    pub fn blocked(&self) -> Option<Blocked> {
        match self {
            Self::CannotReboot { .. } => Some(Blocked {
                condition_reason: queue_condition::CANNOT_REBOOT,
                event_reason: queue_event_reason::REBOOT_BLOCKED,
            }),
            Self::UnsafeNodeAddress { .. } => Some(Blocked {
                condition_reason: queue_condition::UNSAFE_NODE_ADDRESS,
                event_reason: queue_event_reason::UNSAFE_NODE_ADDRESS,
            }),
            Self::AmbiguousNodeAddress { .. } => Some(Blocked {
                condition_reason: queue_condition::AMBIGUOUS_NODE_ADDRESS,
                event_reason: queue_event_reason::AMBIGUOUS_NODE_ADDRESS,
            }),
            _ => None,
        }
    }
}

/// How an entry whose node cannot be rebooted says so (see [`WaitReason::blocked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub condition_reason: &'static str,
    pub event_reason: &'static str,
}

/// A node that is away, as a wait reason names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwayRef {
    pub node: String,
    /// Why it counts ([`super::snapshot::AwayNode::why`]).
    pub why: String,
    /// Its Node object exists: it is fenced or held off rather than absent.
    pub has_node: bool,
}

impl fmt::Display for AwayRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.has_node { "away" } else { "absent" };
        write!(f, "node {} is {state} ({})", self.node, self.why)
    }
}

fn list(names: &[String]) -> String {
    list_with(names, ", ")
}

/// The first few of `items` joined with `separator`, and how many more there are.
fn list_with(items: &[String], separator: &str) -> String {
    const SHOWN: usize = 5;
    let mut text = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(separator);
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// An entry that leaves the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dequeue {
    pub entry: EntryRef,
    pub phase: EntryPhase,
    pub reason: DequeueReason,
}

/// An entry that waits, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub entry: EntryRef,
    pub reason: WaitReason,
}

/// What the queue does now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Queued entries that start draining now, in index order.
    pub start_draining: Vec<EntryRef>,
    /// Entries to remove (cancelled, node missing, duplicate), in index order.
    pub dequeue: Vec<Dequeue>,
    /// Queued entries that do not start now, with the reason, in index order.
    pub waiting: Vec<Waiting>,
    /// Entries draining or rebooting that carry on.
    pub in_progress: Vec<(EntryRef, EntryPhase)>,
    /// Rebooting entries cancelled meanwhile (also in `in_progress`): the controller
    /// withdraws the reboot request if the power cycle has not begun, else the node stays
    /// cordoned until the cycle is done ([`super::reboot::cancel_step`]).
    pub cancel_rebooting: Vec<EntryRef>,
    /// The queue is disabled: these draining entries stop and go back to `Queued`.
    pub stop_draining: Vec<EntryRef>,
    /// Nodes the queue cordoned that no entry is draining or rebooting (nor starting to):
    /// uncordon them.
    pub uncordon: Vec<String>,
}

/// Decides what the queue does now. Pure: the same snapshot and time give the same plan.
///
/// Rules (CKE's, made event-driven):
/// 1. Cancelled entries, entries whose Node does not exist and duplicates (a later entry
///    for a node already queued) leave the queue, whatever their phase — except a cancelled
///    entry that is rebooting: its power cycle may be under way, so it stays in progress
///    (and the first for its node) until the controller withdrew the request or the node
///    booted.
/// 2. Disabled: nothing starts; draining entries stop (back to `Queued`); rebooting entries
///    finish. A node being remediated is treated the same way, for its own entry.
/// 3. In progress = `Draining` + `Rebooting`, at most `maxConcurrentReboots`. A queued
///    entry still backed off neither counts nor blocks others.
/// 4. No drain starts while more than `maxUnreachableNodes` nodes that are not in progress
///    are unreachable: their Ready condition is not True, a remediation is working on them
///    (fenced or about to be, with or without a Node object), or they are away
///    ([`QueueSnapshot::away`]: known to exist but without a Node object, fenced by another
///    remediator, or held off). Each counts once.
/// 5. API-server nodes go one at a time, after every eligible worker, and never while a
///    worker is in progress. An API-server node that is away or being remediated (and not in
///    progress) counts as an API server in progress for the other API-server nodes: none of
///    them starts, whatever `maxUnreachableNodes` says.
/// 6. When slots are free every eligible entry up to the free slots starts at once.
pub fn plan(snapshot: &QueueSnapshot, now: Timestamp) -> Plan {
    let mut out = Plan::default();
    // 1. Removals.
    let live = remove_entries(snapshot, &mut out);
    // 2./3. What is in progress, and what is queued.
    let progress = sort_in_progress(snapshot, &live, &mut out);
    // Queued entries: disabled, backed off, cannot reboot, or eligible.
    let eligible = sort_queued(snapshot, &progress.queued, now, &mut out);
    // 4.–6. Which eligible entries start, and why the others wait.
    let admitted = admit(snapshot, &progress, &eligible);
    record_admission(&mut out, admitted);
    // Stray cordons: the queue's cordon on a node nobody is processing.
    out.uncordon = stray_cordons(snapshot, &progress.busy_nodes, &out.start_draining);
    out
}

/// Rule 1: moves cancelled entries, entries of missing Nodes and duplicates to
/// `out.dequeue`; returns the others in index order.
fn remove_entries<'a>(snapshot: &'a QueueSnapshot, out: &mut Plan) -> Vec<&'a EntryView> {
    let mut entries: Vec<&EntryView> = snapshot.entries.iter().collect();
    entries.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.name.cmp(&b.name)));
    let mut first_for_node: BTreeMap<&str, u64> = BTreeMap::new();
    let mut live: Vec<&EntryView> = Vec::new();
    for entry in entries {
        let cancelled_mid_reboot = entry.cancel && entry.phase == EntryPhase::Rebooting;
        let reason = if entry.cancel && !cancelled_mid_reboot {
            Some(DequeueReason::Cancelled)
        } else if !snapshot.nodes.contains_key(&entry.node)
            // A remediation deletes the Node for a while and brings it back: the entry waits.
            && !snapshot.being_remediated.contains(&entry.node)
        {
            Some(DequeueReason::NodeNotFound)
        } else if let Some(first) = first_for_node.get(entry.node.as_str()) {
            Some(DequeueReason::Duplicate {
                first_index: *first,
            })
        } else {
            first_for_node.insert(&entry.node, entry.index);
            None
        };
        match reason {
            Some(reason) => out.dequeue.push(Dequeue {
                entry: entry.reference(),
                phase: entry.phase,
                reason,
            }),
            None => live.push(entry),
        }
    }
    live
}

/// The entries that stay, sorted by what they do now.
struct Progress<'a> {
    /// Nodes whose entry is draining or rebooting.
    busy_nodes: BTreeSet<&'a str>,
    /// The first API-server node in progress.
    api_in_progress: Option<&'a str>,
    workers_in_progress: Vec<String>,
    /// Queued entries, and draining ones that stop.
    queued: Vec<&'a EntryView>,
}

/// Rules 2 and 3: entries in progress carry on (recorded in `out`), except draining ones that
/// stop because the queue is disabled or their node is being remediated.
fn sort_in_progress<'a>(
    snapshot: &QueueSnapshot,
    live: &[&'a EntryView],
    out: &mut Plan,
) -> Progress<'a> {
    let mut progress = Progress {
        busy_nodes: BTreeSet::new(),
        api_in_progress: None,
        workers_in_progress: Vec::new(),
        queued: Vec::new(),
    };
    for &entry in live {
        match entry.phase {
            // A remediation takes precedence over a drain: the drain stops (the node may be
            // fenced any moment) and the entry waits for the remediation to end.
            EntryPhase::Draining
                if !snapshot.config.enabled || snapshot.being_remediated.contains(&entry.node) =>
            {
                out.stop_draining.push(entry.reference());
                progress.queued.push(entry);
            }
            phase if phase.in_progress() => {
                progress.busy_nodes.insert(&entry.node);
                out.in_progress.push((entry.reference(), phase));
                if entry.cancel {
                    out.cancel_rebooting.push(entry.reference());
                }
                if snapshot.is_api_server(&entry.node) {
                    progress.api_in_progress.get_or_insert(&entry.node);
                } else {
                    progress.workers_in_progress.push(entry.node.clone());
                }
            }
            _ => progress.queued.push(entry),
        }
    }
    progress
}

/// Queued entries that may start as far as they themselves are concerned.
struct Eligible<'a> {
    workers: Vec<&'a EntryView>,
    api: Vec<&'a EntryView>,
}

/// Records why queued entries wait on their own account (disabled, remediated, backed off,
/// cannot reboot); returns the rest.
fn sort_queued<'a>(
    snapshot: &QueueSnapshot,
    queued: &[&'a EntryView],
    now: Timestamp,
    out: &mut Plan,
) -> Eligible<'a> {
    let mut eligible = Eligible {
        workers: Vec::new(),
        api: Vec::new(),
    };
    // Built once, and only when a node is rebooted by command.
    let owners = OnceCell::new();
    for &entry in queued {
        let wait = if !snapshot.config.enabled {
            Some(WaitReason::Disabled)
        } else if snapshot.being_remediated.contains(&entry.node) {
            Some(WaitReason::BeingRemediated)
        } else if entry.backed_off(now) {
            Some(WaitReason::BackedOff {
                until: entry.backoff_expire.unwrap_or(now),
                failures: entry.backoff_count,
                last_failure: entry.last_drain_failure.clone(),
            })
        } else {
            cannot_reboot(snapshot, &entry.node, &owners)
        };
        match wait {
            Some(reason) => out.waiting.push(Waiting {
                entry: entry.reference(),
                reason,
            }),
            None if snapshot.is_api_server(&entry.node) => eligible.api.push(entry),
            None => eligible.workers.push(entry),
        }
    }
    eligible
}

/// The eligible entries that start, and those that wait with the reason.
#[derive(Default)]
struct Admission<'a> {
    starts: Vec<&'a EntryView>,
    waits: Vec<(&'a EntryView, WaitReason)>,
}

impl<'a> Admission<'a> {
    fn all_wait(entries: impl Iterator<Item = &'a EntryView>, reason: &WaitReason) -> Self {
        Admission {
            starts: Vec::new(),
            waits: entries.map(|e| (e, reason.clone())).collect(),
        }
    }
}

/// Rules 4–6: the unreachable gate, API servers alone and after the workers, workers up to
/// the free slots.
fn admit<'a>(
    snapshot: &QueueSnapshot,
    progress: &Progress,
    eligible: &Eligible<'a>,
) -> Admission<'a> {
    let config = &snapshot.config;
    let all = || eligible.workers.iter().chain(eligible.api.iter()).copied();
    // 4. The unreachable gate.
    let unreachable = unreachable_nodes(snapshot, &progress.busy_nodes);
    if unreachable.len() > config.max_unreachable_nodes as usize {
        let reason = WaitReason::TooManyUnreachable {
            away: unreachable
                .iter()
                .filter_map(|n| away_ref(snapshot, n))
                .collect(),
            nodes: unreachable,
            max: config.max_unreachable_nodes,
        };
        return Admission::all_wait(all(), &reason);
    }
    if let Some(node) = progress.api_in_progress {
        // 5. Nothing runs next to an API server.
        let reason = WaitReason::ApiServerInProgress {
            node: node.to_string(),
        };
        return Admission::all_wait(all(), &reason);
    }
    // 5. An API server away holds back every other API server.
    let (api, held) = hold_api_servers_for_away(snapshot, &progress.busy_nodes, &eligible.api);
    let eligible = Eligible {
        workers: eligible.workers.clone(),
        api,
    };
    let mut admission = admit_eligible(snapshot, progress, &eligible);
    admission.waits.extend(held);
    admission
}

/// Rule 5's hold for away API servers: splits the eligible API-server entries into those that
/// may go on and those that wait because another API-server node is away or being remediated
/// (not in progress).
fn hold_api_servers_for_away<'a>(
    snapshot: &QueueSnapshot,
    busy_nodes: &BTreeSet<&str>,
    api: &[&'a EntryView],
) -> (Vec<&'a EntryView>, Vec<(&'a EntryView, WaitReason)>) {
    let away_api: BTreeSet<&str> = snapshot
        .away
        .keys()
        .chain(snapshot.being_remediated.iter())
        .map(String::as_str)
        .filter(|n| !busy_nodes.contains(n) && snapshot.is_api_server(n))
        .collect();
    let mut go = Vec::new();
    let mut held = Vec::new();
    for &entry in api {
        let other = away_api
            .iter()
            .find(|n| **n != entry.node)
            .map(|n| remediated_or_away(snapshot, n));
        match other {
            Some(away) => held.push((entry, WaitReason::ApiServerAway { away })),
            None => go.push(entry),
        }
    }
    (go, held)
}

/// How a wait names an away node: why it is away, if [`QueueSnapshot::away`] says so.
fn away_ref(snapshot: &QueueSnapshot, node: &str) -> Option<AwayRef> {
    snapshot.away.get(node).map(|a| AwayRef {
        node: node.to_string(),
        why: a.why.clone(),
        has_node: a.has_node,
    })
}

/// How a wait names a node that is away or being remediated.
fn remediated_or_away(snapshot: &QueueSnapshot, node: &str) -> AwayRef {
    away_ref(snapshot, node).unwrap_or_else(|| AwayRef {
        node: node.to_string(),
        why: "a remediation is working on it".into(),
        has_node: snapshot.nodes.contains_key(node),
    })
}

/// Rules 3, 5 and 6 once the gate is passed and no API server is in progress: workers first,
/// then one API server alone.
fn admit_eligible<'a>(
    snapshot: &QueueSnapshot,
    progress: &Progress,
    eligible: &Eligible<'a>,
) -> Admission<'a> {
    if !eligible.workers.is_empty() || !progress.workers_in_progress.is_empty() {
        // 3./6. Workers first, as many as there are free slots.
        return admit_workers(snapshot, &progress.workers_in_progress, eligible);
    }
    let mut admission = Admission::default();
    if let Some((first, rest)) = eligible.api.split_first() {
        // 5. One API server, alone.
        admission.starts.push(first);
        let reason = WaitReason::ApiServerOneAtATime {
            first: first.node.clone(),
        };
        admission
            .waits
            .extend(rest.iter().map(|&e| (e, reason.clone())));
    }
    admission
}

/// Rule 4's count: nodes not in progress whose Ready condition is not True, that a
/// remediation is working on (with or without a Node object), or that are away; each once.
fn unreachable_nodes(snapshot: &QueueSnapshot, busy_nodes: &BTreeSet<&str>) -> Vec<String> {
    snapshot
        .nodes
        .values()
        .filter(|n| !n.ready)
        .map(|n| n.name.as_str())
        .chain(snapshot.being_remediated.iter().map(String::as_str))
        .chain(snapshot.away.keys().map(String::as_str))
        .filter(|n| !busy_nodes.contains(n))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Rules 3 and 6: eligible workers start up to the free slots; the rest, and every API server,
/// wait.
fn admit_workers<'a>(
    snapshot: &QueueSnapshot,
    workers_in_progress: &[String],
    eligible: &Eligible<'a>,
) -> Admission<'a> {
    let max = snapshot.config.max_concurrent_reboots;
    let free = (max as usize).saturating_sub(workers_in_progress.len());
    let mut admission = Admission::default();
    for (i, &entry) in eligible.workers.iter().enumerate() {
        if i < free {
            admission.starts.push(entry);
        } else if free == 0 {
            admission.waits.push((
                entry,
                WaitReason::NoFreeSlot {
                    in_progress: workers_in_progress.to_vec(),
                    max,
                },
            ));
        } else {
            admission.waits.push((
                entry,
                WaitReason::BehindEarlierEntries {
                    free_slots: free as u32,
                },
            ));
        }
    }
    let workers: Vec<String> = workers_in_progress
        .iter()
        .cloned()
        .chain(eligible.workers.iter().map(|e| e.node.clone()))
        .collect();
    let reason = WaitReason::ApiServerAfterWorkers { workers };
    admission
        .waits
        .extend(eligible.api.iter().map(|&e| (e, reason.clone())));
    admission
}

/// Records the starts, and every wait in index order (object names need not follow the
/// index).
fn record_admission(out: &mut Plan, admission: Admission) {
    out.start_draining = admission.starts.iter().map(|e| e.reference()).collect();
    for (entry, reason) in admission.waits {
        out.waiting.push(Waiting {
            entry: entry.reference(),
            reason,
        });
    }
    out.waiting
        .sort_by(|a, b| (a.entry.index, &a.entry.name).cmp(&(b.entry.index, &b.entry.name)));
}

/// Nodes the queue cordoned that no entry is processing or starting to.
fn stray_cordons(
    snapshot: &QueueSnapshot,
    busy_nodes: &BTreeSet<&str>,
    start_draining: &[EntryRef],
) -> Vec<String> {
    let starting: BTreeSet<&str> = start_draining.iter().map(|e| e.node.as_str()).collect();
    snapshot
        .nodes
        .values()
        .filter(|n| {
            n.cordoned_by_queue
                && !busy_nodes.contains(n.name.as_str())
                && !starting.contains(n.name.as_str())
        })
        .map(|n| n.name.clone())
        .collect()
}

/// Why the node cannot be rebooted with the configured method, if the controller knows: no
/// way to reboot it, or (by command) an address the commands must not get — unsafe, or
/// reported by another Node too.
fn cannot_reboot<'a>(
    snapshot: &'a QueueSnapshot,
    node: &str,
    owners: &OnceCell<AddressOwners<'a>>,
) -> Option<WaitReason> {
    let method = match snapshot.reboot_targets.get(node) {
        Some(target) => match resolve_method(&snapshot.config.reboot, target) {
            Ok(method) => Some(method),
            Err(why) => return Some(WaitReason::CannotReboot { why }),
        },
        // Without the hosts (an offline plan) only a configured method is known.
        None => snapshot.config.reboot.method,
    };
    if method != Some(RebootMethod::Command) {
        return None;
    }
    let address = &snapshot.nodes.get(node)?.address;
    if let Err(why) = check_command_address(address) {
        return Some(WaitReason::UnsafeNodeAddress {
            address: shown_address(address),
            why: why.to_string(),
        });
    }
    let owners = owners.get_or_init(|| AddressOwners::new(snapshot.nodes.values()));
    let other = owners.other_than(node, address)?;
    Some(WaitReason::AmbiguousNodeAddress {
        address: shown_address(address),
        other: other.to_string(),
    })
}

/// The reboot method for a node: the configured one, else BMC when it has a usable host,
/// else Command when the selected command set is configured. `Err` says why the node cannot be rebooted.
pub fn resolve_method(
    reboot: &super::config::RebootConfig,
    target: &RebootTarget,
) -> Result<RebootMethod, String> {
    match (reboot.method, target, &reboot.commands) {
        (Some(RebootMethod::Command), _, Ok(_)) | (None, RebootTarget::NoHost, Ok(_)) => {
            Ok(RebootMethod::Command)
        }
        (Some(RebootMethod::Command), _, Err(why)) => Err(format!(
            "spec.reboot.method is Command but the command set cannot run: {why}"
        )),
        (_, RebootTarget::Host(_), _) => Ok(RebootMethod::Bmc),
        (_, RebootTarget::UnusableHost { host, why }, _) => {
            Err(format!("its BareMetalHost {host} {why}"))
        }
        (_, RebootTarget::Refused { why }, _) => Err(why.clone()),
        (Some(RebootMethod::Bmc), RebootTarget::NoHost, _) => Err(
            "no BareMetalHost found for the node (see docs/reboot-queue.md: provider ID, \
             Machine, the hostcycle.io/baremetalhost annotation, or a host of the same name)"
                .into(),
        ),
        (None, RebootTarget::NoHost, Err(why)) => Err(format!(
            "no BareMetalHost found for the node, and no reboot command: {why}"
        )),
    }
}
