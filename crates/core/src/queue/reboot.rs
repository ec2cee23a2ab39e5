//! Reboot and boot-check rules, for both methods.
//!
//! **BMC.** The queue asks the node's BareMetalHost for a power cycle with the suffixless
//! `reboot.metal3.io` annotation. In the same patch it sets [`REQUEST_MARKER_ANNOTATION`] to
//! the entry's UID: the BareMetalHost controller removes the reboot annotation once the host
//! is off, but the marker stays, so after a restart the queue can tell "requested" from
//! "never reached the host" and never asks twice. A boot counts once
//! - there is evidence of a power-on after the `Rebooting` transition `T`: the host's
//!   `lastPoweredOn` is later than `T` (hostcycle's host controller), or the queue itself saw
//!   the host off after `T` and sees it on again (metal3's baremetal-operator, which never
//!   writes `lastPoweredOn`), or the Node's `bootID` differs from the one recorded at `T`;
//! - and the Node is Ready with a heartbeat newer than that power-on.
//!
//! **Command.** `rebootCommand… <address>` runs once (with its retries); every attempt is
//! recorded before it starts, so a restart never runs it again. Then
//! `bootCheckCommand… <address> <unix-time-of-T>` runs every `bootCheckIntervalSeconds`;
//! booted when it exits 0 and prints `true`.

use std::time::Duration;

use hostcycle_api::queue::{HostReference, RebootProgress};
use jiff::Timestamp;

use super::drain::{add, elapsed};
use super::snapshot::NodeView;

/// On a BareMetalHost: the UID of the queue entry whose reboot request it carries.
pub const REQUEST_MARKER_ANNOTATION: &str = "hostcycle.io/reboot-queue-request";

/// A BareMetalHost as the queue's boot check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    pub reference: HostReference,
    /// The suffixless `reboot.metal3.io` annotation is present.
    pub reboot_annotation: bool,
    /// Value of [`REQUEST_MARKER_ANNOTATION`].
    pub request_marker: Option<String>,
    /// `status.poweredOn`.
    pub powered_on: Option<bool>,
    /// `status.provisioning.lastPoweredOn` (hostcycle's host controller only).
    pub last_powered_on: Option<Timestamp>,
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
    /// Nothing to do; the text says what the entry waits for.
    Wait(String),
}

/// Decides the next step of a BMC reboot that entered `Rebooting` at `rebooting_since`.
pub fn bmc_reboot_step(
    entry_uid: &str,
    rebooting_since: Timestamp,
    progress: &RebootProgress,
    host: Option<&HostView>,
    node: &NodeView,
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
    let Some(requested_at) = progress.requested_at else {
        return BmcRebootStep::Request { record: true };
    };
    if host.request_marker.as_deref() != Some(entry_uid) {
        // The write-ahead record exists but the patch never reached the host.
        return BmcRebootStep::Request { record: false };
    }

    let boot_started = match (
        host.last_powered_on.filter(|on| *on > rebooting_since),
        progress.host_powered_off_at,
    ) {
        (Some(on), _) => Some(on),
        (None, Some(off)) if host.powered_on == Some(true) => Some(off),
        _ => match (&progress.boot_id, &node.boot_id) {
            (Some(before), Some(now_id)) if before != now_id => Some(requested_at),
            _ => None,
        },
    };
    if let Some(started) = boot_started {
        return if node.ready && node.ready_heartbeat.is_some_and(|hb| hb > started) {
            BmcRebootStep::Booted {
                boot_started: started,
            }
        } else {
            BmcRebootStep::Wait(format!(
                "host {} powered on again; waiting for node {} to report Ready with a heartbeat after {started}",
                host.reference, node.name
            ))
        };
    }
    if host.powered_on == Some(false) {
        if progress.host_powered_off_at.is_none() {
            return BmcRebootStep::RecordPowerOff { at: now };
        }
        return BmcRebootStep::Wait(format!(
            "host {} is powered off; waiting for it to power on",
            host.reference
        ));
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
