//! Candidate selection: which entries start draining now, which leave the queue, and why
//! every other queued entry waits. The controller and `hostcycle rq plan` both call [`plan`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hostcycle_api::queue::{EntryPhase, RebootMethod};
use jiff::Timestamp;

use hostcycle_api::reasons::{queue_condition, queue_event_reason};

use super::address::{check_command_address, shown_address};
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
            Self::TooManyUnreachable { nodes, max } => write!(
                f,
                "{} unreachable node{} not being rebooted ({}) exceed{} maxUnreachableNodes={max}",
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                list(nodes),
                if nodes.len() == 1 { "s" } else { "" }
            ),
            Self::CannotReboot { why } => write!(f, "cannot be rebooted: {why}"),
            Self::UnsafeNodeAddress { address, why } => write!(
                f,
                "cannot be rebooted by command: its address {address} (from the Node's status) \
                 is not an IP address or a DNS name: {why}; the commands are not run with it"
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

fn list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
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
///    are unreachable: their Ready condition is not True, or a remediation is working on
///    them (fenced or about to be, with or without a Node object).
/// 5. API-server nodes go one at a time, after every eligible worker, and never while a
///    worker is in progress.
/// 6. When slots are free every eligible entry up to the free slots starts at once.
pub fn plan(snapshot: &QueueSnapshot, now: Timestamp) -> Plan {
    let config = &snapshot.config;
    let mut out = Plan::default();

    let mut entries: Vec<&EntryView> = snapshot.entries.iter().collect();
    entries.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.name.cmp(&b.name)));

    // 1. Removals.
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

    // 2./3. What is in progress.
    let mut busy_nodes: BTreeSet<&str> = BTreeSet::new();
    let mut api_in_progress: Option<&str> = None;
    let mut workers_in_progress: Vec<String> = Vec::new();
    let mut queued: Vec<&EntryView> = Vec::new();
    for entry in &live {
        let api_server = is_api_server(snapshot, &entry.node);
        match entry.phase {
            // A remediation takes precedence over a drain: the drain stops (the node may be
            // fenced any moment) and the entry waits for the remediation to end.
            EntryPhase::Draining
                if !config.enabled || snapshot.being_remediated.contains(&entry.node) =>
            {
                out.stop_draining.push(entry.reference());
                queued.push(entry);
            }
            phase if phase.in_progress() => {
                busy_nodes.insert(&entry.node);
                out.in_progress.push((entry.reference(), phase));
                if entry.cancel {
                    out.cancel_rebooting.push(entry.reference());
                }
                if api_server {
                    api_in_progress.get_or_insert(&entry.node);
                } else {
                    workers_in_progress.push(entry.node.clone());
                }
            }
            _ => queued.push(entry),
        }
    }

    // Queued entries: disabled, backed off, cannot reboot, or eligible.
    let mut eligible_workers: Vec<&EntryView> = Vec::new();
    let mut eligible_api: Vec<&EntryView> = Vec::new();
    for entry in queued {
        let wait = if !config.enabled {
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
            cannot_reboot(snapshot, &entry.node)
        };
        match wait {
            Some(reason) => out.waiting.push(Waiting {
                entry: entry.reference(),
                reason,
            }),
            None if is_api_server(snapshot, &entry.node) => eligible_api.push(entry),
            None => eligible_workers.push(entry),
        }
    }

    // 4. The unreachable gate.
    let unreachable: Vec<String> = snapshot
        .nodes
        .values()
        .filter(|n| !n.ready)
        .map(|n| n.name.as_str())
        .chain(snapshot.being_remediated.iter().map(String::as_str))
        .filter(|n| !busy_nodes.contains(n))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .map(str::to_string)
        .collect();
    let too_many_unreachable = unreachable.len() > config.max_unreachable_nodes as usize;

    let mut starts: Vec<&EntryView> = Vec::new();
    let mut waits: Vec<(&EntryView, WaitReason)> = Vec::new();
    if too_many_unreachable {
        let reason = WaitReason::TooManyUnreachable {
            nodes: unreachable,
            max: config.max_unreachable_nodes,
        };
        for entry in eligible_workers.iter().chain(eligible_api.iter()) {
            waits.push((entry, reason.clone()));
        }
    } else if let Some(node) = api_in_progress {
        // 5. Nothing runs next to an API server.
        let reason = WaitReason::ApiServerInProgress {
            node: node.to_string(),
        };
        for entry in eligible_workers.iter().chain(eligible_api.iter()) {
            waits.push((entry, reason.clone()));
        }
    } else if !eligible_workers.is_empty() || !workers_in_progress.is_empty() {
        // 3./6. Workers first, as many as there are free slots.
        let free =
            (config.max_concurrent_reboots as usize).saturating_sub(workers_in_progress.len());
        for (i, entry) in eligible_workers.iter().enumerate() {
            if i < free {
                starts.push(entry);
            } else if free == 0 {
                waits.push((
                    entry,
                    WaitReason::NoFreeSlot {
                        in_progress: workers_in_progress.clone(),
                        max: config.max_concurrent_reboots,
                    },
                ));
            } else {
                waits.push((
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
            .chain(eligible_workers.iter().map(|e| e.node.clone()))
            .collect();
        for entry in &eligible_api {
            waits.push((
                entry,
                WaitReason::ApiServerAfterWorkers {
                    workers: workers.clone(),
                },
            ));
        }
    } else if let Some((first, rest)) = eligible_api.split_first() {
        // 5. One API server, alone.
        starts.push(first);
        for entry in rest {
            waits.push((
                entry,
                WaitReason::ApiServerOneAtATime {
                    first: first.node.clone(),
                },
            ));
        }
    }

    out.start_draining = starts.iter().map(|e| e.reference()).collect();
    for (entry, reason) in waits {
        out.waiting.push(Waiting {
            entry: entry.reference(),
            reason,
        });
    }
    // Index order (object names need not follow the index).
    out.waiting
        .sort_by(|a, b| (a.entry.index, &a.entry.name).cmp(&(b.entry.index, &b.entry.name)));

    // Stray cordons: the queue's cordon on a node nobody is processing.
    let starting: BTreeSet<&str> = out.start_draining.iter().map(|e| e.node.as_str()).collect();
    out.uncordon = snapshot
        .nodes
        .values()
        .filter(|n| {
            n.cordoned_by_queue
                && !busy_nodes.contains(n.name.as_str())
                && !starting.contains(n.name.as_str())
        })
        .map(|n| n.name.clone())
        .collect();
    out
}

fn is_api_server(snapshot: &QueueSnapshot, node: &str) -> bool {
    snapshot.nodes.get(node).is_some_and(|n| n.api_server)
}

/// Why the node cannot be rebooted with the configured method, if the controller knows: no
/// way to reboot it, or (by command) an address the commands must not get.
fn cannot_reboot(snapshot: &QueueSnapshot, node: &str) -> Option<WaitReason> {
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
    let why = check_command_address(address).err()?;
    Some(WaitReason::UnsafeNodeAddress {
        address: shown_address(address),
        why: why.to_string(),
    })
}

/// The reboot method for a node: the configured one, else BMC when it has a usable host,
/// else Command when a reboot command is set. `Err` says why the node cannot be rebooted.
pub fn resolve_method(
    reboot: &super::config::RebootConfig,
    target: &RebootTarget,
) -> Result<RebootMethod, String> {
    let has_commands = !reboot.reboot_command.is_empty() && !reboot.boot_check_command.is_empty();
    match (reboot.method, target) {
        (Some(RebootMethod::Command), _) | (None, RebootTarget::NoHost) if has_commands => {
            Ok(RebootMethod::Command)
        }
        (Some(RebootMethod::Command), _) => Err(
            "spec.reboot.method is Command but rebootCommand or bootCheckCommand is empty".into(),
        ),
        (_, RebootTarget::Host(_)) => Ok(RebootMethod::Bmc),
        (_, RebootTarget::UnusableHost { host, why }) => {
            Err(format!("its BareMetalHost {host} {why}"))
        }
        (_, RebootTarget::Refused { why }) => Err(why.clone()),
        (Some(RebootMethod::Bmc), RebootTarget::NoHost) => Err(
            "no BareMetalHost found for the node (see docs/reboot-queue.md: provider ID, \
             Machine, the hostcycle.io/baremetalhost annotation, or a host of the same name)"
                .into(),
        ),
        (None, RebootTarget::NoHost) => Err(
            "no BareMetalHost found for the node and spec.reboot.rebootCommand / \
             bootCheckCommand are not set"
                .into(),
        ),
    }
}
