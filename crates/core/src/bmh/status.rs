use crate::time::wire_precision;
use hostcycle_api::{BareMetalHostStatus, PowerActionState, PowerOffMode};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::decision::{ConditionUpdate, StatusUpdate};

/// A request (power or reboot) was recorded, or a read failed: readings made before it are
/// no evidence of what follows.
fn restart_observation(status: &mut BareMetalHostStatus) {
    if let Some(o) = status.power_observation.as_mut()
        && o.readings > 0
    {
        *o = super::observation::restarted(o);
    }
}

/// Applies a decision's status updates to `status` (pure; the caller persists the result).
///
/// `now` stamps condition transitions and `lastUpdated` (every non-empty set of updates is a
/// status write); `generation` becomes the conditions' `observedGeneration`.
pub fn apply_status_updates(
    status: &mut BareMetalHostStatus,
    updates: &[StatusUpdate],
    now: Timestamp,
    generation: Option<i64>,
) {
    if !updates.is_empty() {
        status.last_updated = Some(now);
    }
    for update in updates {
        match update {
            StatusUpdate::SetPoweredOn(on) => status.powered_on = Some(*on),
            StatusUpdate::SetPendingRebootSince(t) => {
                status.provisioning.pending_reboot_since = Some(*t);
                status.provisioning.pending_reboot_mode = None;
                restart_observation(status);
            }
            StatusUpdate::MarkPendingRebootHard => {
                status.provisioning.pending_reboot_mode = Some(PowerOffMode::Hard);
            }
            StatusUpdate::SetLastPoweredOn(t) => status.provisioning.last_powered_on = Some(*t),
            StatusUpdate::SetProvisioningState(s) => status.provisioning.state = Some(s.clone()),
            StatusUpdate::SetProvisionedImage(Some(image)) => {
                status
                    .provisioning
                    .extra
                    .insert("image".to_owned(), image.clone());
            }
            StatusUpdate::SetProvisionedImage(None) => {
                status.provisioning.extra.remove("image");
            }
            StatusUpdate::SetOperationalStatus(s) => status.operational_status = Some(*s),
            StatusUpdate::SetError {
                error_type,
                message,
                count,
            } => {
                status.error_type = Some(*error_type);
                status.error_message.clone_from(message);
                status.error_count = *count;
            }
            StatusUpdate::ClearError => {
                status.error_type = None;
                status.error_message.clear();
                status.error_count = 0;
            }
            StatusUpdate::SetGoodCredentials(c) => status.good_credentials = Some(c.clone()),
            StatusUpdate::RecordPowerRequest(action) => {
                status.last_power_action = Some(action.clone());
                restart_observation(status);
            }
            StatusUpdate::SetPowerObservation(o) => status.power_observation = Some(o.clone()),
            StatusUpdate::RestartPowerObservation => restart_observation(status),
            StatusUpdate::ClearPowerObservation => status.power_observation = None,
            StatusUpdate::CompletePowerAction { at } => {
                if let Some(action) = status.last_power_action.as_mut() {
                    action.state = PowerActionState::Completed;
                    action.completed_at = Some(*at);
                    action.failure = None;
                }
            }
            StatusUpdate::FailPowerAction { message } => {
                if let Some(action) = status.last_power_action.as_mut() {
                    action.state = PowerActionState::Failed;
                    action.failure = Some(message.clone());
                }
            }
            StatusUpdate::SetHardFallback(fallback) => {
                if let Some(action) = status.last_power_action.as_mut() {
                    action.hard_fallback = Some(fallback.clone());
                }
            }
            StatusUpdate::SetCondition(c) => {
                set_condition(&mut status.conditions, c, now, generation)
            }
        }
    }
}

fn set_condition(
    conditions: &mut Vec<Condition>,
    update: &ConditionUpdate,
    now: Timestamp,
    generation: Option<i64>,
) {
    let fresh = Condition {
        type_: update.type_.to_owned(),
        status: update.status.to_owned(),
        reason: update.reason.to_owned(),
        message: effective_message(update),
        observed_generation: generation,
        last_transition_time: Time(wire_precision(now)),
    };
    crate::conditions::set_condition(conditions, fresh);
}

/// The condition of this type differs from `update` in status, reason or message.
pub(crate) fn condition_differs(conditions: &[Condition], update: &ConditionUpdate) -> bool {
    conditions
        .iter()
        .find(|c| c.type_ == update.type_)
        .is_none_or(|c| {
            c.status != update.status
                || c.reason != update.reason
                || c.message != effective_message(update)
        })
}

/// The message written for a condition. Never empty: the Condition schema requires a string,
/// and Kubernetes 1.20 decodes "" inside custom resources as null.
fn effective_message(update: &ConditionUpdate) -> String {
    if update.message.is_empty() {
        update.reason.to_owned()
    } else {
        update.message.clone()
    }
}
