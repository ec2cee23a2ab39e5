//! A request's status: the record, the phase, the message, and the conditions health
//! checkers read.

use hostcycle_api::remediation::{
    HostRemediation, HostRemediationStatus, RemediationPhase, RemediationStep,
};
use hostcycle_core::conditions::set_condition as set_status_condition;
use hostcycle_core::remediation::contracts::permanent_node_deletion_expected;
use hostcycle_core::remediation::{Decision, Record};
use hostcycle_core::time::wire_precision;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::controller::{Controller, Item, log_write_error};

const FIELD_MANAGER: &str = "hostcycle-remediation";

impl Controller {
    /// Writes a request's status: the record, the phase, the message and the conditions
    /// health checkers read. Skipped when nothing changed.
    pub(super) async fn write_request_status(
        &mut self,
        r: &HostRemediation,
        record: &Record,
        decision: &Decision,
        item: &Item,
        now: Timestamp,
    ) -> Option<HostRemediation> {
        let before = r.status.clone().unwrap_or_default();
        // 1. The record, the phase, the message, the Node and the host.
        let mut status = before.clone();
        fill_status(&mut status, record, decision, item);
        // 2. The conditions, in this order.
        let left_off = hostcycle_core::remediation::left_off(&item.observation);
        for condition in conditions(record, decision, item.node.is_some(), left_off) {
            set_condition(&mut status, condition, now, r.metadata.generation);
        }
        // 3. Nothing changed: nothing is written.
        if status == before {
            return Some(r.clone());
        }
        // 4. The status written.
        self.replace_request_status(r, status).await
    }

    async fn replace_request_status(
        &mut self,
        r: &HostRemediation,
        status: HostRemediationStatus,
    ) -> Option<HostRemediation> {
        let mut next = r.clone();
        next.status = Some(status);
        let api: Api<HostRemediation> =
            Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match api.replace_status(&r.name_any(), &params, &next).await {
            Ok(updated) => Some(updated),
            Err(e) => {
                log_write_error(&format!("HostRemediation {}", r.name_any()), &e);
                self.retry_soon = true;
                None
            }
        }
    }
}

/// Copies the record, the decision's phase and message, the Node and the host into `status`.
fn fill_status(
    status: &mut HostRemediationStatus,
    record: &Record,
    decision: &Decision,
    item: &Item,
) {
    record.apply_to_status(status);
    status.phase = Some(decision.phase);
    status.message = crate::text::bounded(&decision.message, 1024);
    status.node = item.observation.node_name.clone();
    // The bound host once there is one (the record wrote it), else the one found now.
    status.host = record
        .host
        .as_ref()
        .map(|b| b.reference.to_string())
        .or_else(|| {
            item.observation
                .target
                .as_ref()
                .ok()
                .map(|h| h.name.clone())
        });
}

/// A condition as decided; its time and generation are the write's.
struct ConditionValue<'a> {
    type_: &'static str,
    status: &'static str,
    reason: &'a str,
    message: &'a str,
}

/// The request's conditions, in the order they are set.
fn conditions<'a>(
    record: &Record,
    decision: &'a Decision,
    node_present: bool,
    left_off: bool,
) -> [ConditionValue<'a>; 6] {
    [
        processing(decision),
        succeeded(record, decision),
        node_deletion(record, node_present),
        blocked(decision),
        cannot_fence(decision),
        left_off_condition(decision, left_off),
    ]
}

/// `LeftOff`: the workloads are released and the host is held off (`afterRelease:
/// LeaveOff`) until a person sets `PowerOn` or deletes the request.
fn left_off_condition(decision: &Decision, left_off: bool) -> ConditionValue<'_> {
    if left_off {
        ConditionValue {
            type_: "LeftOff",
            status: "True",
            reason: "AfterReleaseLeaveOff",
            message: &decision.message,
        }
    } else {
        ConditionValue {
            type_: "LeftOff",
            status: "False",
            reason: "NotLeftOff",
            message: "",
        }
    }
}

/// `CannotFence`: the host was not confirmed off by its deadline (or its BMC changed, or it
/// is detached, paused or gone); the flow holds and a person decides.
fn cannot_fence(decision: &Decision) -> ConditionValue<'_> {
    if decision.cannot_fence {
        ConditionValue {
            type_: "CannotFence",
            status: "True",
            reason: "PowerOffNotConfirmed",
            message: &decision.message,
        }
    } else {
        ConditionValue {
            type_: "CannotFence",
            status: "False",
            reason: "NotHeld",
            message: "",
        }
    }
}

fn processing(decision: &Decision) -> ConditionValue<'_> {
    let processing = matches!(
        decision.phase,
        RemediationPhase::Running | RemediationPhase::Waiting
    );
    ConditionValue {
        type_: "Processing",
        status: if processing { "True" } else { "False" },
        reason: if processing {
            "RemediationInProgress"
        } else {
            "NotProcessing"
        },
        message: &decision.message,
    }
}

fn succeeded<'a>(record: &Record, decision: &'a Decision) -> ConditionValue<'a> {
    let (status, reason) = match record.step {
        RemediationStep::Done => ("True", "RemediationSucceeded"),
        RemediationStep::GaveUp => ("False", "RemediationFailed"),
        RemediationStep::Cancelled => ("False", "RemediationCancelled"),
        _ => ("Unknown", "RemediationInProgress"),
    };
    ConditionValue {
        type_: "Succeeded",
        status,
        reason,
        message: &decision.message,
    }
}

/// `PermanentNodeDeletionExpected`: True from the write that decides the Node's deletion
/// (before it is deleted, so a NodeHealthCheck reacting to the deletion never takes the
/// request for an orphan) until the Node is back, also after giving up.
fn node_deletion(record: &Record, node_present: bool) -> ConditionValue<'static> {
    if permanent_node_deletion_expected(record, node_present) {
        ConditionValue {
            type_: "PermanentNodeDeletionExpected",
            status: "True",
            reason: "NodeDeletedUntilPowerOn",
            message: "the Node was deleted to release its workloads; it registers again after the power-on",
        }
    } else {
        ConditionValue {
            type_: "PermanentNodeDeletionExpected",
            status: "False",
            reason: "NodeKept",
            message: "the Node is not deleted for good",
        }
    }
}

fn blocked(decision: &Decision) -> ConditionValue<'_> {
    match decision.blocked {
        Some(reason) => ConditionValue {
            type_: "Blocked",
            status: "True",
            reason,
            message: &decision.message,
        },
        None => ConditionValue {
            type_: "Blocked",
            status: "False",
            reason: "NotBlocked",
            message: "",
        },
    }
}

/// Sets a condition; `lastTransitionTime` changes only with `status`.
fn set_condition(
    status: &mut HostRemediationStatus,
    condition: ConditionValue<'_>,
    now: Timestamp,
    generation: Option<i64>,
) {
    let fresh = Condition {
        type_: condition.type_.to_string(),
        status: condition.status.to_string(),
        reason: condition.reason.to_string(),
        message: crate::text::bounded(condition.message, 1024),
        last_transition_time: Time(wire_precision(now)),
        observed_generation: generation,
    };
    set_status_condition(&mut status.conditions, fresh);
}
