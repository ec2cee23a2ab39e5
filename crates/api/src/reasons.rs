//! Condition types, condition reasons, Event types and Event reasons (CamelCase, as Kubernetes
//! expects).

/// Condition types set in `status.conditions`.
pub mod condition {
    /// True while a reboot is pending (`pendingRebootSince` later than `lastPoweredOn`).
    pub const REBOOT_PENDING: &str = "RebootPending";
    /// True while the BMC answers and power actions succeed.
    pub const BMC_HEALTHY: &str = "BMCHealthy";
    /// Written only for hosts with `spec.disablePowerOff: true` (and set False once the flag is
    /// cleared): True while something asks for the host to stay off (`online: false`, a keyed
    /// `reboot.metal3.io/{key}` hold) and is refused, because power is never cut.
    pub const POWER_OFF_REFUSED: &str = "PowerOffRefused";

    /// Condition status strings.
    pub const TRUE: &str = "True";
    pub const FALSE: &str = "False";
    pub const UNKNOWN: &str = "Unknown";
}

/// Reasons used in `status.conditions[].reason`.
pub mod condition_reason {
    // RebootPending
    /// The host is on and a power-off for the reboot has been (or is about to be) requested.
    pub const AWAITING_POWER_OFF: &str = "AwaitingPowerOff";
    /// The host is off and `reboot.metal3.io/{key}` annotations hold it there.
    pub const HELD_BY_ANNOTATIONS: &str = "HeldByAnnotations";
    /// The host is off, no annotation is left, and `spec.online` is false.
    pub const OFFLINE: &str = "Offline";
    /// The host is off, no annotation is left, and power-on has been requested.
    pub const AWAITING_POWER_ON: &str = "AwaitingPowerOn";
    /// No reboot pending.
    pub const NO_REBOOT_PENDING: &str = "NoRebootPending";
    /// `spec.disablePowerOff`: the host is on and a BMC restart for the reboot has been (or is
    /// about to be) requested.
    pub const AWAITING_RESTART: &str = "AwaitingRestart";

    // PowerOffRefused
    /// `spec.disablePowerOff` is true and `online: false` and/or keyed holds are present.
    pub const POWER_OFF_DISABLED: &str = "PowerOffDisabled";
    /// Nothing asks for the host to stay off (or power-off is allowed again).
    pub const NOTHING_REFUSED: &str = "NothingRefused";

    // BMCHealthy
    pub const BMC_RESPONDING: &str = "BMCResponding";
    pub const CREDENTIALS_REJECTED: &str = "CredentialsRejected";
    pub const BMC_UNREACHABLE: &str = "BMCUnreachable";
    pub const BMC_ERROR: &str = "BMCError";
    pub const POWER_ACTION_FAILED: &str = "PowerActionFailed";
    pub const POWER_ACTION_TIMED_OUT: &str = "PowerActionTimedOut";
    /// `spec.bmc` (or the BMC's identity) changed while reboot annotations were outstanding:
    /// no power action reaches the new BMC until they are withdrawn.
    pub const BMC_CHANGED_UNDER_REQUEST: &str = "BMCChangedUnderRequest";
}

/// Reasons of the Kubernetes Events the controller emits.
pub mod event_reason {
    /// Normal: a power-off was requested (message says soft/hard and why).
    pub const POWER_OFF: &str = "PowerOff";
    /// Normal: a power-on was requested.
    pub const POWER_ON: &str = "PowerOn";
    /// Normal: `spec.disablePowerOff`: a BMC restart was requested for a reboot (soft:
    /// GracefulRestart, falling back to ForceRestart; hard: ForceRestart).
    pub const POWER_RESTART: &str = "PowerRestart";
    /// Warning: `spec.disablePowerOff`: `online: false` or a keyed hold cannot be honoured; the
    /// host stays on (see the `PowerOffRefused` condition).
    pub const POWER_OFF_REFUSED: &str = "PowerOffRefused";
    /// Normal: a hard reboot request arrived while a soft power-off was in flight.
    pub const POWER_OFF_ESCALATED: &str = "PowerOffEscalated";
    /// Warning: the BMC layer's soft power-off timed out and it powered off hard.
    pub const SOFT_POWER_OFF_FALLBACK: &str = "SoftPowerOffFallback";
    /// Normal: a reboot annotation was noticed; `pendingRebootSince` was set.
    pub const REBOOT_REQUESTED: &str = "RebootRequested";
    /// Normal: the host came back on after a reboot; `lastPoweredOn` passed `pendingRebootSince`.
    pub const REBOOT_COMPLETED: &str = "RebootCompleted";
    /// Warning: a reboot annotation's key or value is unusable; treated as soft.
    pub const INVALID_REBOOT_ANNOTATION: &str = "InvalidRebootAnnotation";
    /// Warning: the BMC could not be reached, rejected the credentials, or a power call failed.
    pub const BMC_ERROR: &str = "BMCError";
    /// Normal: the BMC works again after errors.
    pub const BMC_RECOVERED: &str = "BMCRecovered";
    /// Warning: `spec.bmc` (address or Secret) or the BMC's identity changed while reboot
    /// annotations were outstanding: the requests were made of another BMC's machine, so no
    /// power action reaches the new BMC until they are withdrawn.
    pub const BMC_CHANGED_UNDER_REQUEST: &str = "BMCChangedUnderRequest";
    /// Normal: the controller removed a reboot annotation (one event per annotation).
    pub const REBOOT_ANNOTATION_REMOVED: &str = "RebootAnnotationRemoved";
    /// Warning: the power state was changed behind the controller's back and is being corrected.
    pub const POWER_STATE_CORRECTED: &str = "PowerStateCorrected";
    /// Warning: a requested power change was not observed in time; it is requested again.
    pub const POWER_ACTION_TIMED_OUT: &str = "PowerActionTimedOut";
}

/// Condition types on a `RebootQueueEntry`.
pub mod queue_condition {
    /// True once `bootTimeoutSeconds` passed without a confirmed boot.
    pub const BOOT_TIMED_OUT: &str = "BootTimedOut";
    /// Reason of `BootTimedOut=True`.
    pub const BOOT_NOT_CONFIRMED: &str = "BootNotConfirmed";
    /// True while the entry waits because its node cannot be rebooted now (no way to reboot
    /// it, its host unusable, or its host binding in doubt: the message names both
    /// candidates). Removed once it can.
    pub const BLOCKED: &str = "Blocked";
    /// Reason of `Blocked=True`.
    pub const CANNOT_REBOOT: &str = "CannotReboot";
    /// Reason of `Blocked=True` when the node is rebooted by command and its address (from
    /// its Node status) is not an IP address or a DNS name: the commands are not run with it.
    pub const UNSAFE_NODE_ADDRESS: &str = "UnsafeNodeAddress";
    /// Reason of `Blocked=True` when the node is rebooted by command and another Node reports
    /// its address too: the commands could reach that node, so they are not run with it.
    pub const AMBIGUOUS_NODE_ADDRESS: &str = "AmbiguousNodeAddress";
}

/// Reasons of the Events the reboot queue emits (on the entry and, where it concerns the
/// node, on the Node).
pub mod queue_event_reason {
    /// Normal: the node was cordoned and its drain started.
    pub const DRAIN_STARTED: &str = "DrainStarted";
    /// Normal: no counted pod is left and no volume is in use.
    pub const DRAIN_COMPLETED: &str = "DrainCompleted";
    /// Warning: the drain failed or timed out; it is tried again after a backoff.
    pub const DRAIN_BACKOFF: &str = "DrainBackoff";
    /// Normal: the queue was disabled while the node was draining; the drain stopped.
    pub const DRAIN_STOPPED: &str = "DrainStopped";
    /// Warning: a pod was deleted instead of evicted (its eviction was refused by a
    /// PodDisruptionBudget in an unprotected namespace, or it is an unprotected Job pod).
    pub const POD_DELETED: &str = "PodDeleted";
    /// Normal: the reboot was requested (BMC annotation added or reboot command started).
    pub const REBOOT_STARTED: &str = "RebootStarted";
    /// Warning: the reboot command failed on every try.
    pub const REBOOT_COMMAND_FAILED: &str = "RebootCommandFailed";
    /// Warning: the reboot cannot be requested (no BareMetalHost, no command, ...).
    pub const REBOOT_BLOCKED: &str = "RebootBlocked";
    /// Warning: the node is rebooted by command and its address (from its Node status) is
    /// neither an IP address nor a DNS name — one starting with `-` would be read as an
    /// option: the reboot and boot-check commands are not run with it.
    pub const UNSAFE_NODE_ADDRESS: &str = "UnsafeNodeAddress";
    /// Warning: the node is rebooted by command and another Node reports its address too (a
    /// kubelet writes its Node's addresses): the reboot and boot-check commands could reach
    /// that other node, so they are not run with it.
    pub const AMBIGUOUS_NODE_ADDRESS: &str = "AmbiguousNodeAddress";
    /// Normal: the node booted after the reboot.
    pub const BOOT_CONFIRMED: &str = "BootConfirmed";
    /// Warning: the host reported a power cycle (or the boot check passed) but the Node still
    /// reports the boot ID recorded when the reboot began: it never rebooted. The entry does
    /// not complete; the node stays cordoned.
    pub const NOT_POWER_CYCLED: &str = "RebootNotPowerCycled";
    /// Warning: no boot confirmed within `bootTimeoutSeconds`; the entry keeps waiting.
    pub const BOOT_TIMED_OUT: &str = "BootTimedOut";
    /// Normal: the node was cordoned by the queue and is uncordoned now.
    pub const UNCORDONED: &str = "Uncordoned";
    /// Normal: the entry was cancelled and is removed.
    pub const CANCELLED: &str = "Cancelled";
    /// Normal: a rebooting entry was cancelled before its power cycle began: the reboot
    /// request was withdrawn from the host.
    pub const REBOOT_WITHDRAWN: &str = "RebootWithdrawn";
    /// Normal: the node was rebooted and the entry is removed.
    pub const COMPLETED: &str = "Completed";
    /// Warning: the entry's Node does not exist; the entry is removed.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// Warning: another entry for the same node came first; this one is removed.
    pub const DUPLICATE_ENTRY: &str = "DuplicateEntry";
}

/// Reasons remediation writes.
pub mod remediation {
    /// Reasons of the Events remediation emits (on the Machine or request, and copied to the
    /// host and Node where they concern them).
    pub mod event_reason {
        pub const STARTED: &str = "RemediationStarted";
        /// Normal: another trigger's remediation is running on the same host; this one joins it
        /// and ends with it (one remediation per host).
        pub const JOINED: &str = "RemediationJoined";
        pub const BLOCKED: &str = "RemediationBlocked";
        pub const NODE_NOT_FOUND: &str = "NodeNotFound";
        /// Warning: the host bound at the start is gone or was replaced under the same name.
        pub const HOST_LOST: &str = "BoundHostLost";
        /// Warning: the Node's `hostcycle.io/baremetalhost` annotation or its provider ID
        /// without the host's uid names another host than its authoritative links; it was
        /// ignored.
        pub const HINT_IGNORED: &str = "NodeHostHintIgnored";
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
        /// Warning: another remediator (CAPBM) holds the Machine, or will; hostcycle does nothing.
        pub const HELD_ELSEWHERE: &str = "RemediationHeldElsewhere";
        /// Warning: the host was not confirmed off by fresh BMC readings from the bound BMC by
        /// the power-off deadline (or its BMC changed, it is detached, paused or gone): the
        /// flow holds, nothing is deleted, released or escalated until a person decides.
        pub const CANNOT_FENCE: &str = "CannotFence";
        /// Warning: the host's `spec.bmc` (address or Secret) or its BMC's identity changed
        /// since the flow bound it: its readings are not evidence for this flow.
        pub const BMC_CHANGED: &str = "BoundBMCChanged";
        /// Warning: the flow's record lacks a field it needs (the host it bound, when it
        /// began) or could not be read: the flow gave up cleanly, releasing its power-off,
        /// instead of waiting for ever.
        pub const RECORD_INCOMPLETE: &str = "RemediationRecordIncomplete";
        /// Normal: the host is off on fresh evidence; the node's workloads are being released
        /// without deleting the Node (pods force-deleted, `volumesInUse` cleared, or the
        /// out-of-service taint), as `spec.strategy.release` asks.
        pub const RELEASING_WORKLOADS: &str = "ReleasingWorkloads";
        /// Normal: the node's pods and volume attachments are gone; the host is powered on.
        pub const WORKLOADS_RELEASED: &str = "WorkloadsReleased";
        /// Warning: the workloads are released and the host is left off, as
        /// `spec.strategy.afterRelease: LeaveOff` asks (the health check sets it for a node
        /// that failed again soon after its last remediation): a person decides.
        pub const LEFT_OFF: &str = "HostLeftOff";
        /// Warning: the requested release strategy cannot run on this cluster (an explicit
        /// `OutOfServiceTaint` before Kubernetes 1.28, or a value this version does not know).
        pub const STRATEGY_UNAVAILABLE: &str = "ReleaseStrategyUnavailable";
    }
}

/// Reasons the health check (`HostHealthCheck`) writes.
pub mod health {
    /// Condition types on a `HostHealthCheck`.
    pub mod condition {
        /// True while the spec is usable and the check judges nodes.
        pub const READY: &str = "Ready";
        /// True while no new request may be made (its reason says why: `Paused`,
        /// `WarmingUp`, `StormActive`, `StormCoolingDown`, `TooManyUnhealthy`).
        pub const SUSPENDED: &str = "Suspended";
    }

    /// Condition reasons on a `HostHealthCheck`.
    pub mod condition_reason {
        /// `Ready=True`: the check watches and judges the selected nodes.
        pub const WATCHING: &str = "Watching";
        /// `Ready=False`: the operator has not watched the Leases for `warmUpSeconds` yet.
        pub const WARMING_UP: &str = "WarmingUp";
        /// `Ready=False`: the selector or `maxUnhealthy` cannot be used; nothing is judged.
        pub const INVALID_SPEC: &str = "InvalidSpec";
        /// `Suspended=False`.
        pub const NOT_SUSPENDED: &str = "NotSuspended";
    }

    /// Reasons of the Events the health check emits (on the check; about one node, on its
    /// Node too).
    pub mod event_reason {
        /// Warning: a selected node is unhealthy (its Lease stopped, or `Ready` is False for
        /// too long), confirmed by a live read of its Lease and Node.
        pub const NODE_UNHEALTHY: &str = "NodeUnhealthy";
        /// Normal: the cache said a Lease was stale, the API server said it was renewed:
        /// nothing is requested.
        pub const UNHEALTHY_NOT_CONFIRMED: &str = "UnhealthyNotConfirmed";
        /// Normal: a HostRemediation was created for an unhealthy node.
        pub const REMEDIATION_REQUESTED: &str = "RemediationRequested";
        /// Normal: the node is healthy again and its request finished: the request was
        /// deleted.
        pub const REMEDIATION_REQUEST_DELETED: &str = "RemediationRequestDeleted";
        /// Warning: a node is unhealthy but no request is made (paused, warming up, storm,
        /// cooldown, or more unhealthy nodes than `maxUnhealthy`).
        pub const REQUESTS_HELD: &str = "RequestsHeld";
        /// Warning: more unhealthy nodes than `maxUnhealthy` allows: no new request.
        pub const MAX_UNHEALTHY_EXCEEDED: &str = "MaxUnhealthyExceeded";
        /// Warning: more than `stormPercent` of the selected Leases are stale at once: the
        /// check is suspended.
        pub const STORM_DETECTED: &str = "StormDetected";
        /// Normal: the storm ended; requests resume after `stormCooldownSeconds`.
        pub const STORM_ENDED: &str = "StormEnded";
        /// Warning: the node's request finished and the node is still unhealthy; nothing
        /// more is requested for it until its request is deleted.
        pub const NODE_STILL_UNHEALTHY: &str = "NodeStillUnhealthy";
        /// Warning: a node failed again within `repeatFailureWindowSeconds` of recovering from
        /// its last remediation: its request leaves the host off after the release
        /// (`afterRelease: LeaveOff`), for a person.
        pub const REPEATED_FAILURE: &str = "RepeatedFailure";
        /// Warning: the spec cannot be used (an invalid selector or `maxUnhealthy`).
        pub const INVALID_SPEC: &str = "InvalidHealthCheck";
        /// Warning: creating or deleting a request failed; retried.
        pub const REQUEST_FAILED: &str = "RemediationRequestFailed";
    }
}

/// The type of a Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The Event's `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}
