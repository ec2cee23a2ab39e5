//! What happens when a remediation gives up: the Machine's owner replaces it.
//!
//! - OpenShift Machines are deleted when they can be reprovisioned (their MachineSet creates
//!   a new one): the host is not externally provisioned, the Machine has a controller owner,
//!   and it is not a control-plane (`master`) Machine — as OpenShift's own remediation does.
//! - Cluster API Machines get `OwnerRemediated=False`, which their MachineSet or
//!   KubeadmControlPlane acts on (with `HealthCheckSucceeded=False`, set by the
//!   MachineHealthCheck). Cluster API up to v1.10 reads `status.conditions` (v1beta1
//!   conditions, with a severity); v1.11 and later read `status.v1beta2.conditions`: both are
//!   written.

use crate::time::wire_precision;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::decide::Escalation;

/// The label OpenShift puts the Machine's role in.
pub const OPENSHIFT_MACHINE_ROLE_LABEL: &str = "machine.openshift.io/cluster-api-machine-role";
/// The condition type Cluster API's owners act on.
pub const OWNER_REMEDIATED: &str = "OwnerRemediated";
/// Its reason while the owner should remediate.
pub const WAITING_FOR_REMEDIATION: &str = "WaitingForRemediation";

/// Whether an OpenShift Machine may be deleted to be reprovisioned; `Err` says why not.
pub fn openshift_reprovisionable(
    host_externally_provisioned: bool,
    machine_has_controller_owner: bool,
    machine_role: Option<&str>,
) -> Result<(), String> {
    if host_externally_provisioned {
        return Err(
            "its host is externally provisioned: a new Machine would not get a new OS".into(),
        );
    }
    if !machine_has_controller_owner {
        return Err("the Machine has no controller owner (no MachineSet would replace it)".into());
    }
    if machine_role == Some("master") {
        return Err("it is a control-plane Machine: it is never deleted automatically".into());
    }
    Ok(())
}

/// `status` of a Cluster API Machine with `OwnerRemediated=False` in both condition formats;
/// every other condition is kept. The result is a JSON merge patch body for the status
/// subresource (`{"status": {...}}`).
pub fn owner_remediated_patch(status: &Value, now: Timestamp, message: &str) -> Value {
    // Conditions carry second precision on the wire.
    let at = wire_precision(now).to_string();
    let v1beta1 = json!({
        "type": OWNER_REMEDIATED,
        "status": "False",
        "severity": "Warning",
        "reason": WAITING_FOR_REMEDIATION,
        "message": message,
        "lastTransitionTime": at,
    });
    let v1beta2 = json!({
        "type": OWNER_REMEDIATED,
        "status": "False",
        "reason": WAITING_FOR_REMEDIATION,
        "message": message,
        "lastTransitionTime": at,
    });
    let replace = |list: Option<&Value>, new: Value| -> Value {
        let mut items: Vec<Value> = list
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|c| c.get("type").and_then(Value::as_str) != Some(OWNER_REMEDIATED))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        items.push(new);
        Value::Array(items)
    };
    json!({ "status": {
        "conditions": replace(status.get("conditions"), v1beta1),
        "v1beta2": {
            "conditions": replace(status.get("v1beta2").and_then(|v| v.get("conditions")), v1beta2),
        },
    }})
}

/// Which waiting remediations may start: the first ones, in the order given, up to the
/// free slots.
pub fn allocate_slots<T: Clone>(in_flight: usize, max: usize, waiting: &[T]) -> Vec<T> {
    waiting
        .iter()
        .take(max.saturating_sub(in_flight))
        .cloned()
        .collect()
}

/// Which Machine a remediation belongs to, for its escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineKind {
    /// `machine.openshift.io`.
    OpenShift,
    /// `cluster.x-k8s.io`.
    ClusterApi,
}

/// What the escalation rule reads.
#[derive(Debug, Clone, Copy)]
pub struct EscalationFacts<'a> {
    pub machine: Option<MachineKind>,
    /// The request comes from NodeHealthCheck ([`super::contracts::is_nhc_request`]).
    pub nhc_request: bool,
    pub host_externally_provisioned: bool,
    pub machine_has_controller_owner: bool,
    pub machine_role: Option<&'a str>,
}

/// How giving up escalates:
/// - a NodeHealthCheck request: NodeHealthCheck escalates (to its next remediator, on
///   `Succeeded=False`) — never a Machine deletion, even with the OpenShift Machine owner
///   NodeHealthCheck adds: that would be a second escalation, in parallel with its own;
/// - a Cluster API Machine: `OwnerRemediated=False`;
/// - an OpenShift Machine: deleted when it can be reprovisioned, as OpenShift does.
pub fn choose_escalation(f: &EscalationFacts<'_>) -> Escalation {
    if f.nhc_request {
        return Escalation::None(
            "NodeHealthCheck escalates to its next remediator on Succeeded=False; hostcycle \
             deletes no Machine for its requests"
                .into(),
        );
    }
    match f.machine {
        None => Escalation::None(
            "no Machine: NodeHealthCheck moves on to its next remediator when Succeeded=False"
                .into(),
        ),
        Some(MachineKind::ClusterApi) => Escalation::MarkOwnerRemediated,
        Some(MachineKind::OpenShift) => match openshift_reprovisionable(
            f.host_externally_provisioned,
            f.machine_has_controller_owner,
            f.machine_role,
        ) {
            Ok(()) => Escalation::DeleteMachine,
            Err(why) => Escalation::None(format!("the Machine is not deleted: {why}")),
        },
    }
}

/// The condition Cluster API's MachineHealthCheck sets on a Machine it made an external
/// remediation request for (v1beta2 conditions only); the external remediator updates or
/// removes it.
pub const EXTERNALLY_REMEDIATED: &str = "ExternallyRemediated";
/// Its reason once hostcycle gave up.
pub const REMEDIATION_FAILED_REASON: &str = "RemediationFailed";

/// Where a Cluster API Machine keeps its two condition formats, by the version it was read
/// in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionsLayout {
    /// `cluster.x-k8s.io/v1beta1`: v1beta1 conditions in `status.conditions`, v1beta2 ones in
    /// `status.v1beta2.conditions`.
    V1Beta1,
    /// `cluster.x-k8s.io/v1beta2`: v1beta2 conditions in `status.conditions`, v1beta1 ones in
    /// `status.deprecated.v1beta1.conditions`.
    V1Beta2,
}

impl ConditionsLayout {
    pub fn of(api_version: &str) -> ConditionsLayout {
        if api_version.ends_with("/v1beta2") {
            ConditionsLayout::V1Beta2
        } else {
            ConditionsLayout::V1Beta1
        }
    }
}

fn wire_time(now: Timestamp) -> String {
    wire_precision(now).to_string()
}

/// `list` without conditions of type `type_`, plus `new` if given.
fn with_condition(list: Option<&Value>, type_: &str, new: Option<Value>) -> Value {
    let mut items: Vec<Value> = list
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|c| c.get("type").and_then(Value::as_str) != Some(type_))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    items.extend(new);
    Value::Array(items)
}

/// The status merge patch (`{"status": …}`) with which hostcycle gives up on a Cluster API
/// Machine: `OwnerRemediated=False` (reason `WaitingForRemediation`) in both formats, so its
/// MachineSet or KubeadmControlPlane replaces it; with `externally`, also
/// `ExternallyRemediated=False` (reason `RemediationFailed`), updating what the
/// MachineHealthCheck set when it created the request. Other conditions are kept.
pub fn capi_gave_up_patch(
    status: &Value,
    layout: ConditionsLayout,
    now: Timestamp,
    message: &str,
    externally: bool,
) -> Value {
    let at = wire_time(now);
    let v1beta1 = json!({
        "type": OWNER_REMEDIATED, "status": "False", "severity": "Warning",
        "reason": WAITING_FOR_REMEDIATION, "message": message, "lastTransitionTime": at,
    });
    let owner = json!({
        "type": OWNER_REMEDIATED, "status": "False",
        "reason": WAITING_FOR_REMEDIATION, "message": message, "lastTransitionTime": at,
    });
    let external = json!({
        "type": EXTERNALLY_REMEDIATED, "status": "False",
        "reason": REMEDIATION_FAILED_REASON, "message": message, "lastTransitionTime": at,
    });
    let (v1beta2_path, v1beta1_list) = match layout {
        ConditionsLayout::V1Beta1 => (
            status.get("v1beta2").and_then(|v| v.get("conditions")),
            status.get("conditions"),
        ),
        ConditionsLayout::V1Beta2 => (
            status.get("conditions"),
            status
                .get("deprecated")
                .and_then(|d| d.get("v1beta1"))
                .and_then(|v| v.get("conditions")),
        ),
    };
    let mut v1beta2_list = with_condition(v1beta2_path, OWNER_REMEDIATED, Some(owner));
    if externally {
        v1beta2_list = with_condition(Some(&v1beta2_list), EXTERNALLY_REMEDIATED, Some(external));
    }
    let v1beta1_list = with_condition(v1beta1_list, OWNER_REMEDIATED, Some(v1beta1));
    match layout {
        ConditionsLayout::V1Beta1 => json!({ "status": {
            "conditions": v1beta1_list,
            "v1beta2": { "conditions": v1beta2_list },
        }}),
        ConditionsLayout::V1Beta2 => json!({ "status": {
            "conditions": v1beta2_list,
            "deprecated": { "v1beta1": { "conditions": v1beta1_list } },
        }}),
    }
}

/// The status merge patch that removes `ExternallyRemediated` once hostcycle remediated the
/// Machine (Cluster API leaves that to the external remediator); `None` when it has none.
pub fn capi_remediated_patch(status: &Value, layout: ConditionsLayout) -> Option<Value> {
    let list = match layout {
        ConditionsLayout::V1Beta1 => status.get("v1beta2").and_then(|v| v.get("conditions")),
        ConditionsLayout::V1Beta2 => status.get("conditions"),
    };
    let present = list.and_then(Value::as_array).is_some_and(|a| {
        a.iter()
            .any(|c| c.get("type").and_then(Value::as_str) == Some(EXTERNALLY_REMEDIATED))
    });
    if !present {
        return None;
    }
    let kept = with_condition(list, EXTERNALLY_REMEDIATED, None);
    Some(match layout {
        ConditionsLayout::V1Beta1 => json!({ "status": { "v1beta2": { "conditions": kept } } }),
        ConditionsLayout::V1Beta2 => json!({ "status": { "conditions": kept } }),
    })
}
