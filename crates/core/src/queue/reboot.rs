//! Reboot and boot-check rules, for both methods.
//!
//! **BMC.** The queue asks the node's BareMetalHost for a power cycle with the suffixless
//! `reboot.metal3.io` annotation. In the same patch it sets [`REQUEST_MARKER_ANNOTATION`] to
//! the entry's UID: the BareMetalHost controller removes the reboot annotation once the host
//! is off, but the marker stays, so after a restart the queue can tell "requested" from
//! "never reached the host" and never asks twice. A boot counts once
//! - there is evidence of a power-on after the `Rebooting` transition `T`: the host's
//!   `lastPoweredOn` is later than `T` (hostcycle's host controller), or the queue itself saw
//!   the host off — in a status written after the request, without error — and sees it on
//!   again (metal3's baremetal-operator, which never writes `lastPoweredOn`), or the Node's
//!   `bootID` differs from the one recorded at `T` once the reboot annotation is gone or the
//!   power-off was seen (a new boot ID while the request still waits on the host is some
//!   other reboot: counting it would leave the requested one to come after the uncordon);
//! - and the Node is Ready with a heartbeat newer than that power-on.
//!
//! The host is the one bound when the entry entered `Rebooting` (namespace, name and uid):
//! a host re-created under that name is not it.
//!
//! **Cancel.** A cancelled `Rebooting` entry withdraws the request while the power cycle has
//! not begun ([`cancel_step`]); once it has (or may have), the node stays cordoned until it
//! has booted.
//!
//! **Command.** `rebootCommand… <address>` runs once (with its retries); every attempt is
//! recorded before it starts, so a restart never runs it again. Then
//! `bootCheckCommand… <address> <unix-time-of-T>` runs every `bootCheckIntervalSeconds`;
//! booted when it exits 0 and prints `true`.

use std::time::Duration;

use hostcycle_api::queue::{HostReference, RebootMethod, RebootProgress};
use jiff::Timestamp;

use super::snapshot::QueueNodeView;
use crate::evidence::{PowerEvidence, PowerReport, power_since};
use crate::time::{add, elapsed};

pub use hostcycle_api::queue::{COMMAND_MARKER_ANNOTATION, REQUEST_MARKER_ANNOTATION};

/// A BareMetalHost as the queue's boot check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHostView {
    pub reference: HostReference,
    /// `metadata.uid`.
    pub uid: String,
    /// The suffixless `reboot.metal3.io` annotation is present.
    pub reboot_annotation: bool,
    /// Value of [`REQUEST_MARKER_ANNOTATION`].
    pub request_marker: Option<String>,
    /// `status.poweredOn`.
    pub powered_on: Option<bool>,
    /// `status.provisioning.lastPoweredOn` (hostcycle's host controller only).
    pub last_powered_on: Option<Timestamp>,
    /// `status.lastUpdated`.
    pub last_updated: Option<Timestamp>,
    /// The host controller's error, if it reports one.
    pub error: Option<String>,
    /// When hostcycle's host controller took a reboot request on: it recorded a pending
    /// reboot (`status.provisioning.pendingRebootSince`) or a power-off
    /// (`status.lastPowerAction`), both written before it calls the BMC. From then on it
    /// completes the power cycle even if the annotation is withdrawn.
    pub request_taken_at: Option<Timestamp>,
}

impl QueueHostView {
    fn power_report(&self) -> PowerReport {
        PowerReport {
            powered_on: self.powered_on,
            last_updated: self.last_updated,
            error: self.error.clone(),
        }
    }

    /// Not the host bound at the start: `Some(why)` when the recorded uid differs.
    fn replaced(&self, progress: &RebootProgress) -> Option<String> {
        let bound = progress.host_uid.as_deref()?;
        (bound != self.uid).then(|| {
            format!(
                "BareMetalHost {} was replaced (uid {} instead of {bound}); the reboot is never \
                 requested from the new host: cancel the entry",
                self.reference, self.uid
            )
        })
    }
}

/// The next step of a reboot through the BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcRebootStep {
    /// Record `reboot.requestedAt` first when `record` (write-ahead), then add the reboot
    /// annotation and the request marker to the host in one patch.
    Request { record: bool },
    /// Record that the host was seen powered off now.
    RecordPowerOff { at: Timestamp },
    /// The node booted after the reboot.
    Booted { boot_started: Timestamp },
    /// The host says it was power-cycled and the Node is Ready, but the Node's boot ID is the
    /// one recorded when the reboot began ([`boot_canary`]): it never rebooted. A Warning, and
    /// the entry does not complete.
    NotPowerCycled(String),
    /// Nothing to do; the text says what the entry waits for.
    Wait(String),
}

/// Decides the next step of a BMC reboot that entered `Rebooting` at `rebooting_since`.
pub fn bmc_reboot_step(
    entry_uid: &str,
    rebooting_since: Timestamp,
    progress: &RebootProgress,
    host: Option<&QueueHostView>,
    node: &QueueNodeView,
    now: Timestamp,
) -> BmcRebootStep {
    let host_name = progress
        .host
        .as_ref()
        .map(|h| h.to_string())
        .unwrap_or_else(|| "(none recorded)".into());
    let Some(host) = host else {
        return BmcRebootStep::Wait(format!(
            "BareMetalHost {host_name} not found; waiting for it to reappear"
        ));
    };
    if let Some(why) = host.replaced(progress) {
        return BmcRebootStep::Wait(why);
    }
    let Some(requested_at) = progress.requested_at else {
        return BmcRebootStep::Request { record: true };
    };
    if host.request_marker.as_deref() != Some(entry_uid) {
        // The write-ahead record exists but the patch never reached the host (the
        // controller reads the host fresh before it asks again).
        return BmcRebootStep::Request { record: false };
    }

    let cycle_seen = progress.host_powered_off_at.is_some();
    let boot_started = match (
        host.last_powered_on.filter(|on| *on > rebooting_since),
        progress.host_powered_off_at,
    ) {
        (Some(on), _) => Some(on),
        (None, Some(off)) if host.powered_on == Some(true) => Some(off),
        _ => match (&progress.boot_id, &node.boot_id) {
            (Some(before), Some(now_id))
                if before != now_id && (!host.reboot_annotation || cycle_seen) =>
            {
                Some(requested_at)
            }
            _ => None,
        },
    };
    if let Some(started) = boot_started {
        return if node.ready && node.ready_heartbeat.is_some_and(|hb| hb > started) {
            match boot_canary(
                &node.name,
                progress.boot_id.as_deref(),
                node.boot_id.as_deref(),
            ) {
                Ok(()) => BmcRebootStep::Booted {
                    boot_started: started,
                },
                Err(why) => BmcRebootStep::NotPowerCycled(format!(
                    "host {} reported a power cycle, but {why}",
                    host.reference
                )),
            }
        } else {
            BmcRebootStep::Wait(format!(
                "host {} powered on again; waiting for node {} to report Ready with a heartbeat after {started}",
                host.reference, node.name
            ))
        };
    }
    match power_since(&host.power_report(), requested_at) {
        PowerEvidence::Off if progress.host_powered_off_at.is_none() => {
            return BmcRebootStep::RecordPowerOff { at: now };
        }
        PowerEvidence::Off => {
            return BmcRebootStep::Wait(format!(
                "host {} is powered off; waiting for it to power on",
                host.reference
            ));
        }
        PowerEvidence::InError(e) => {
            return BmcRebootStep::Wait(format!(
                "reboot requested at {requested_at}; host {}'s controller reports: {e}",
                host.reference
            ));
        }
        _ => {}
    }
    if host.reboot_annotation {
        BmcRebootStep::Wait(format!(
            "reboot requested at {requested_at}; waiting for the BareMetalHost controller to power host {} off",
            host.reference
        ))
    } else {
        BmcRebootStep::Wait(format!(
            "reboot requested at {requested_at}; waiting for host {} to power off and on",
            host.reference
        ))
    }
}

/// The boot canary: a reboot is complete only when the Node booted anew — its boot ID
/// (`status.nodeInfo.bootID`, which the kubelet reports per boot) differs from the one
/// recorded when the reboot began. Whatever else says "rebooted" (the host's `lastPoweredOn`,
/// a boot check printing `true`) may come from another machine (a BareMetalHost pointed at
/// another BMC, a command run against another node's address). `Err` says why not. An entry
/// that recorded no boot ID (its Node reported none) cannot be checked and passes.
pub fn boot_canary(node: &str, recorded: Option<&str>, now: Option<&str>) -> Result<(), String> {
    match (recorded, now) {
        (None, _) => Ok(()),
        (Some(before), Some(after)) if before != after => Ok(()),
        (Some(before), Some(_)) => Err(format!(
            "node {node} still reports boot ID {before}, recorded when the reboot began: it \
             never rebooted"
        )),
        (Some(_), None) => Err(format!(
            "node {node} reports no boot ID, so a new boot cannot be told from the old one"
        )),
    }
}

/// What the Command method does next with the reboot command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootCommandStep {
    /// Record attempt `attempt` (write-ahead), then run the command.
    Run { attempt: u32 },
    /// The command ran (or may have run) already: only boot checks from now on.
    AlreadyRequested,
}

/// Whether to run the reboot command: only when no attempt was ever recorded. After a
/// restart mid-command the queue cannot know whether the node got the reboot, so it does not
/// risk a second one; the boot check (and its timeout) tells.
pub fn reboot_command_step(progress: &RebootProgress) -> RebootCommandStep {
    if progress.command_attempts == 0 {
        RebootCommandStep::Run { attempt: 1 }
    } else {
        RebootCommandStep::AlreadyRequested
    }
}

/// After a failed run of the reboot command: the next attempt, or `None` when
/// `commandRetries` are used up (or the count would overflow).
pub fn next_command_attempt(attempt: u32, retries: u32) -> Option<u32> {
    (attempt <= retries)
        .then(|| attempt.checked_add(1))
        .flatten()
}

/// The boot check's verdict: booted when it exits 0 and prints `true` (whitespace around it
/// allowed).
pub fn boot_check_passed(exit_success: bool, stdout: &str) -> bool {
    exit_success && stdout.trim() == "true"
}

/// Whether `bootTimeoutSeconds` has passed since the `Rebooting` transition.
pub fn boot_overdue(rebooting_since: Timestamp, now: Timestamp, timeout: Duration) -> bool {
    elapsed(rebooting_since, now) >= timeout
}

/// When a reboot that began at `rebooting_since` becomes overdue.
pub fn boot_deadline(rebooting_since: Timestamp, timeout: Duration) -> Timestamp {
    add(rebooting_since, timeout)
}

/// What a cancel does to an entry that is `Rebooting`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelStep {
    /// The power cycle has not begun: withdraw the request (the reboot annotation and the
    /// marker, with the host's resourceVersion as a precondition, so a power-off the host
    /// controller records meanwhile makes it fail), then uncordon and remove the entry.
    Withdraw,
    /// Nothing reached a host (no request on it, no command run): uncordon and remove.
    Remove,
    /// The power cycle has begun, or may have: the node stays cordoned until it has booted;
    /// the text says why.
    WaitForCycle(String),
}

/// Decides what cancelling a `Rebooting` entry does. Once `bootTimeoutSeconds` has passed
/// (`boot_timed_out`) the cycle is overdue and a cancel is the administrator's way out: the
/// entry is removed, as the BootTimedOut Warning says.
pub fn cancel_step(
    entry_uid: &str,
    progress: &RebootProgress,
    host: Option<&QueueHostView>,
    boot_timed_out: bool,
) -> CancelStep {
    const KEEP: &str = "the node stays cordoned until it has booted or bootTimeoutSeconds has \
                        passed (delete the entry to give up sooner)";
    if boot_timed_out {
        return CancelStep::Remove;
    }
    match progress.method {
        RebootMethod::Command if progress.command_attempts == 0 => CancelStep::Remove,
        RebootMethod::Command => CancelStep::WaitForCycle(format!(
            "cancel requested, but the reboot command has run and may have rebooted the node: \
             {KEEP}"
        )),
        RebootMethod::Bmc => {
            let Some(requested_at) = progress.requested_at else {
                return CancelStep::Remove;
            };
            let Some(host) = host.filter(|h| h.replaced(progress).is_none()) else {
                return CancelStep::Remove;
            };
            if host.request_marker.as_deref() != Some(entry_uid) {
                return CancelStep::Remove;
            }
            let begun = progress.host_powered_off_at.is_some()
                || host.powered_on == Some(false)
                || !host.reboot_annotation
                || host.request_taken_at.is_some_and(|at| at >= requested_at);
            if begun {
                CancelStep::WaitForCycle(format!(
                    "cancel requested, but host {} has begun its power cycle: {KEEP}",
                    host.reference
                ))
            } else {
                CancelStep::Withdraw
            }
        }
    }
}

/// What follows a completed drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterDrain {
    /// Record `Rebooting` and request the reboot with this method.
    Reboot(RebootMethod),
    /// Do not reboot now: back to `Queued` (the node is uncordoned by the next plan); the
    /// text says why.
    Stop(String),
    /// The node cannot be rebooted: back off, saying why.
    Blocked(String),
}

/// Decides, when a drain reports completion, whether the reboot starts: the queue must still
/// be enabled and no remediation may have started on the node meanwhile — the same checks
/// the plan makes, made again at the moment of the irreversible step.
pub fn after_drain(
    enabled: bool,
    being_remediated: bool,
    method: Result<RebootMethod, String>,
) -> AfterDrain {
    if !enabled {
        return AfterDrain::Stop(
            "drain finished after the reboot queue was disabled; the node is drained again \
             when it is enabled"
                .into(),
        );
    }
    if being_remediated {
        return AfterDrain::Stop(
            "drain finished while a remediation started on the node; it is drained again once \
             the remediation is over"
                .into(),
        );
    }
    match method {
        Ok(m) => AfterDrain::Reboot(m),
        Err(why) => AfterDrain::Blocked(why),
    }
}

/// What to do after a run of the reboot command failed (or timed out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailedCommand {
    /// The boot check says the node has not booted since `Rebooting`: run attempt `attempt`.
    Retry { attempt: u32 },
    /// The boot check says it booted: the failed run rebooted it after all; no retry.
    Booted,
    /// No retry: the text says why (retries used up, or the boot check could not tell, and
    /// a second reboot is worse than a boot timeout).
    GiveUp(String),
}

/// How a run of the reboot command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedRun {
    /// Killed at `commandTimeoutSeconds`: it may have reached the node, and a reboot may be
    /// pending (a slow shutdown, `shutdown -r +1`) — "not booted yet" cannot tell that from
    /// "not rebooted".
    TimedOut,
    /// It exited (non-zero) within its timeout.
    Exited,
}

/// The least time between a failed run and the boot check that may let it run again: a reboot
/// the run did start has taken the node down by then (the check cannot reach it: no retry) or
/// brought it back (booted: no retry).
pub const COMMAND_RETRY_SETTLE: Duration = Duration::from_secs(15);

/// Decides whether a failed reboot command is run again: only after a run that exited (never
/// one that timed out, whose reboot may be pending), and only once the boot check, made at
/// least [`COMMAND_RETRY_SETTLE`] later, reached the node and says it has not booted since the
/// reboot began — running it again otherwise could reboot the node twice.
pub fn after_failed_command(
    attempt: u32,
    retries: u32,
    run: FailedRun,
    boot_check: Result<bool, String>,
) -> AfterFailedCommand {
    match boot_check {
        Ok(true) => AfterFailedCommand::Booted,
        Ok(false) if run == FailedRun::TimedOut => AfterFailedCommand::GiveUp(
            "not run again: it timed out, so it may have reached the node and a reboot may be \
             pending, which the boot check cannot tell from no reboot; the boot check and \
             bootTimeoutSeconds decide"
                .into(),
        ),
        Ok(false) => match next_command_attempt(attempt, retries) {
            Some(attempt) => AfterFailedCommand::Retry { attempt },
            None => AfterFailedCommand::GiveUp(format!(
                "commandRetries used up after {attempt} attempt{}",
                if attempt == 1 { "" } else { "s" }
            )),
        },
        Err(why) => AfterFailedCommand::GiveUp(format!(
            "not run again: the boot check could not tell whether the node rebooted ({why})"
        )),
    }
}
