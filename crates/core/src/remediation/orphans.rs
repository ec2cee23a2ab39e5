//! Which of remediation's power-off annotations on a host no remediation owns any more. A
//! remediation deleted mid-flow (or a Machine that left the flow) would otherwise hold its
//! host off for good; the controller removes these after confirming with the API server.

use hostcycle_api::remediation::{
    MACHINE_POWER_OFF_ANNOTATION, REQUEST_POWER_OFF_PREFIX, is_remediation_power_off,
};

/// The keys among a host's annotation `keys` that are orphaned: a HostRemediation's
/// power-off annotation whose request (by UID) is not `live_request`, or the annotation
/// flow's when no Machine in the flow points at the host (`claimed_by_machine`, asked only
/// when that annotation is present).
pub fn orphaned_power_off_keys<'a>(
    keys: impl IntoIterator<Item = &'a String>,
    live_request: impl Fn(&str) -> bool,
    claimed_by_machine: impl Fn() -> bool,
) -> Vec<String> {
    keys.into_iter()
        .filter(|key| is_remediation_power_off(key))
        .filter(|key| match key.strip_prefix(REQUEST_POWER_OFF_PREFIX) {
            Some(uid) => !live_request(uid),
            None => key.as_str() == MACHINE_POWER_OFF_ANNOTATION && !claimed_by_machine(),
        })
        .cloned()
        .collect()
}
