//! `status.powerObservation`: the run of agreeing BMC readings the host controller made, the
//! only power evidence fencing trusts ([`crate::evidence::fenced_off`]).
//!
//! Every successful read extends or restarts the run; a power request, a newly noticed reboot
//! request and a failed read restart it (`readings: 0`), so the two readings of a confirmed
//! run are consecutive and made after the request that caused them. Once a run is confirmed,
//! identical readings write nothing: a steady host costs no status write.

use hostcycle_api::{ObservedBmc, ObservedPowerState, PowerObservation};
use jiff::Timestamp;

use super::snapshot::ObservedPower;

/// The state as the status records it.
pub fn recorded_state(power: ObservedPower) -> ObservedPowerState {
    match power {
        ObservedPower::On => ObservedPowerState::On,
        ObservedPower::Off => ObservedPowerState::Off,
        ObservedPower::Transitioning => ObservedPowerState::Transitioning,
        ObservedPower::Unknown => ObservedPowerState::Unknown,
    }
}

/// The run after a reading of `state` from `bmc` at `now`; `None` when it is unchanged (no
/// write needed).
pub fn after_reading(
    previous: Option<&PowerObservation>,
    state: ObservedPowerState,
    bmc: &ObservedBmc,
    now: Timestamp,
) -> Option<PowerObservation> {
    let fresh = PowerObservation {
        state,
        bmc: bmc.clone(),
        readings: 1,
        since: Some(now),
        confirmed_at: None,
    };
    let Some(prev) = previous else {
        return Some(fresh);
    };
    if prev.state != state || prev.bmc != *bmc || prev.readings == 0 {
        return Some(fresh);
    }
    match prev.since {
        Some(since) if prev.readings == 1 => {
            let gap = now.duration_since(since);
            (gap.is_positive() && gap.unsigned_abs() >= PowerObservation::CONFIRM_GAP).then(|| {
                PowerObservation {
                    readings: 2,
                    confirmed_at: Some(now),
                    ..prev.clone()
                }
            })
        }
        // A run without its first reading's time is not one: start again.
        None => Some(fresh),
        // Confirmed already: nothing to write.
        Some(_) => None,
    }
}

/// The run restarted: no reading counts from before this point.
pub fn restarted(previous: &PowerObservation) -> PowerObservation {
    PowerObservation {
        readings: 0,
        since: None,
        confirmed_at: None,
        ..previous.clone()
    }
}

/// Whether the run still needs a reading to be confirmed (the controller then reads again
/// within a second instead of at its steady interval).
/// Only On and Off runs: an unknown state keeps its own, slower re-check.
pub fn unconfirmed(observation: Option<&PowerObservation>) -> bool {
    observation.is_some_and(|o| {
        o.readings < 2 && matches!(o.state, ObservedPowerState::On | ObservedPowerState::Off)
    })
}
