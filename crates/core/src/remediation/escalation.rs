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

use jiff::Timestamp;
use serde_json::{Value, json};

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
    let at = Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string();
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
