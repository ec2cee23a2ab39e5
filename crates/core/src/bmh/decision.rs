pub use hostcycle_api::reasons::EventType;
use std::time::Duration;

use hostcycle_api::{
    CredentialsStatus, ErrorType, HardFallback, LastPowerAction, OperationalStatus,
    PowerObservation, PowerOffMode, PowerTarget, ProvisioningState,
};
use jiff::Timestamp;

/// A change to `status`, applied with [`crate::bmh::apply_status_updates`].
#[derive(Debug, Clone, PartialEq)]
pub enum StatusUpdate {
    SetPoweredOn(bool),
    /// Records a new pending reboot; also resets `pendingRebootMode` (soft until marked hard).
    SetPendingRebootSince(Timestamp),
    /// A request of the pending reboot is hard: `pendingRebootMode: hard` (write-ahead of the
    /// hard power-off, which must stay hard even if the annotation goes).
    MarkPendingRebootHard,
    SetLastPoweredOn(Timestamp),
    SetProvisioningState(ProvisioningState),
    /// `status.provisioning.image`: the image a provisioned host runs (`spec.image` as it was),
    /// or `None` to remove it once the host has no consumer any more.
    SetProvisionedImage(Option<serde_json::Value>),
    SetOperationalStatus(OperationalStatus),
    /// Sets `errorType`, `errorMessage` and `errorCount` (already incremented).
    SetError {
        error_type: ErrorType,
        message: String,
        count: u32,
    },
    /// Clears `errorType` and `errorMessage`, resets `errorCount` to 0.
    ClearError,
    SetGoodCredentials(CredentialsStatus),
    /// Write-ahead record of a power request; persist it before sending the request.
    RecordPowerRequest(LastPowerAction),
    /// The last power action's target state was observed at `at`.
    CompletePowerAction {
        at: Timestamp,
    },
    /// The BMC call for the last power action failed.
    FailPowerAction {
        message: String,
    },
    /// The BMC layer turned the last (soft) power-off into a hard one.
    SetHardFallback(HardFallback),
    SetCondition(ConditionUpdate),
    /// `status.powerObservation` after a BMC reading ([`crate::bmh::observation`]).
    SetPowerObservation(PowerObservation),
    /// The run of readings starts again: none made before counts (a failed read).
    /// `RecordPowerRequest` and `SetPendingRebootSince` restart it too.
    RestartPowerObservation,
    /// No BMC is read (detached, no address): no reading evidence is left standing.
    ClearPowerObservation,
}

/// A condition to set; `lastTransitionTime` changes only when `status` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// Why the controller removes reboot annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnnotationRemovalReason {
    /// The suffixless `reboot.metal3.io`: the host is off, so the power cycle's "off" is done.
    RebootPoweredOff,
    /// `spec.disablePowerOff`: the suffixless `reboot.metal3.io` is served by a BMC restart.
    RebootRestarted,
    /// The host left the provisioned state: every reboot annotation goes.
    HostDeprovisioned,
}

/// A Kubernetes Event to emit on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// One of [`hostcycle_api::reasons::event_reason`].
    pub reason: &'static str,
    pub message: String,
}

/// Something to do, in order, after the status updates are persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Remove these annotations (full keys). Use a patch that fails if the object changed, or
    /// tolerate keys that are already gone.
    RemoveAnnotations {
        keys: Vec<String>,
        reason: AnnotationRemovalReason,
    },
    /// Power off: soft uses the BMC layer's soft→hard fallback, hard goes straight to hard.
    PowerOff {
        mode: PowerOffMode,
    },
    PowerOn,
    /// `spec.disablePowerOff`: restart through the BMC instead of a power cycle (hard:
    /// ForceRestart; soft: GracefulRestart, falling back to ForceRestart when the BMC does not
    /// offer or rejects it).
    Restart {
        mode: PowerOffMode,
    },
    /// Best effort; a failure to emit must not fail the reconcile.
    EmitEvent(Event),
}

/// The outcome of [`crate::bmh::decide`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Status changes; persist them (with a `resourceVersion` precondition) before `actions`.
    pub status: Vec<StatusUpdate>,
    /// Side effects, in order.
    pub actions: Vec<Action>,
    /// Reconcile again after this long. `None` only for a paused host: wait for a change.
    pub requeue_after: Option<Duration>,
}

impl Decision {
    /// The power call of this decision, if any (there is at most one).
    pub fn power_action(&self) -> Option<PowerTarget> {
        self.actions.iter().find_map(|a| match a {
            Action::PowerOff { .. } => Some(PowerTarget::Off),
            Action::PowerOn | Action::Restart { .. } => Some(PowerTarget::On),
            _ => None,
        })
    }

    /// Events of this decision.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.actions.iter().filter_map(|a| match a {
            Action::EmitEvent(e) => Some(e),
            _ => None,
        })
    }

    /// Reasons of the events of this decision, in order.
    pub fn event_reasons(&self) -> Vec<&'static str> {
        self.events().map(|e| e.reason).collect()
    }

    /// Annotation keys this decision removes.
    pub fn removed_annotations(&self) -> Vec<&str> {
        self.actions
            .iter()
            .flat_map(|a| match a {
                Action::RemoveAnnotations { keys, .. } => keys.as_slice(),
                _ => &[],
            })
            .map(String::as_str)
            .collect()
    }

    /// Nothing to record and nothing to do.
    pub fn is_noop(&self) -> bool {
        self.status.is_empty() && self.actions.is_empty()
    }
}
