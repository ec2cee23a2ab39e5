//! One remediation per host: a trigger that arrives while another trigger's remediation is
//! running on the same host (a HostRemediation and a Machine's annotation, two checkers) joins
//! that flow instead of starting a second one, and ends with it. Run one after the other, the
//! second would fence the recovered node and delete its Node again.

use std::collections::BTreeMap;

use hostcycle_api::remediation::RemediationStep;
use jiff::Timestamp;

use super::decide::{Observation, start_blocker};

/// One remediation as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowOnHost<'a> {
    /// The remediation's key (`<kind> <namespace>/<name>`).
    pub key: &'a str,
    /// When its trigger appeared: the oldest of several waiting goes first.
    pub created: Timestamp,
    /// The uid of the host it is bound to (running) or would bind (not started).
    pub host_uid: Option<&'a str>,
    /// Between its power-off request and its Node back (`Record::in_flight`).
    pub running: bool,
    /// Not started yet: it may join.
    pub not_started: bool,
    /// Not started, and nothing stops it from starting (requested, not blocked).
    pub could_start: bool,
}

impl<'a> FlowOnHost<'a> {
    /// A remediation as the rule sees it, from what `decide` reads of it: the host its record
    /// bound while it runs, else the one the resolver finds.
    pub fn of(key: &'a str, created: Timestamp, obs: &'a Observation) -> Self {
        let record = &obs.record;
        let host_uid = match &record.host {
            Some(bound) if record.in_flight() => Some(bound.uid.as_str()),
            _ => obs.target.as_ref().ok().map(|h| h.uid.as_str()),
        };
        let not_started = record.step == RemediationStep::NotStarted;
        FlowOnHost {
            key,
            created,
            host_uid,
            running: record.in_flight(),
            not_started,
            could_start: not_started
                && obs.requested
                && obs.held_elsewhere.is_none()
                && record.joined.is_none()
                && start_blocker(obs).is_none(),
        }
    }
}

/// For each remediation that has not started, the remediation of another trigger on the same
/// host it joins, if any: the one running there, or else the oldest that could start now (two
/// triggers seen in one pass never both start). Two running on one host (written before this
/// rule) are left as they are.
pub fn joins<'a>(flows: &[FlowOnHost<'a>]) -> BTreeMap<&'a str, &'a str> {
    let mut leaders: BTreeMap<&str, &str> = flows
        .iter()
        .filter(|f| f.running)
        .filter_map(|f| Some((f.host_uid?, f.key)))
        .collect();
    let mut waiting: Vec<&FlowOnHost> = flows.iter().filter(|f| f.could_start).collect();
    waiting.sort_by_key(|f| (f.created, f.key));
    for f in waiting {
        if let Some(uid) = f.host_uid {
            leaders.entry(uid).or_insert(f.key);
        }
    }
    flows
        .iter()
        .filter(|f| f.not_started)
        .filter_map(|f| {
            let leader = leaders.get(f.host_uid?)?;
            (*leader != f.key).then_some((f.key, *leader))
        })
        .collect()
}
