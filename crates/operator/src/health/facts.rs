//! The pure half of the health check's I/O: observed objects in, `hostcycle_core::health`
//! facts out, and the decision back into the check's status. No API call here.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use hostcycle_api::health::{
    HostHealthCheck, HostHealthCheckSpec, HostHealthCheckStatus, MAX_LISTED_UNHEALTHY,
    MAX_RECORDED_RECOVERIES, NodeRecovery, StormStatus,
};
use hostcycle_api::queue::selector_matches;
use hostcycle_api::reasons::health::{condition, condition_reason};
use hostcycle_api::remediation::{HostRemediation, NHC_NODE_NAME_ANNOTATION, RemediationStep};
use hostcycle_core::health::{
    Action, CheckFacts, Decision, HealthSettings, MaxUnhealthy, NodeFacts, NodeHealth, Ready,
    RequestFacts, Storm, Suspension,
};
use hostcycle_core::time::wire_precision;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

/// The check's settings, its defaults applied; `Err` says why the spec cannot be used.
pub fn settings(spec: &HostHealthCheckSpec) -> Result<HealthSettings, String> {
    let max_unhealthy = MaxUnhealthy::parse(&spec.max_unhealthy_text())?;
    // An unusable selector selects nothing rather than everything: no node is judged.
    selector_matches(&spec.selector, &Default::default())
        .map_err(|e| format!("the selector cannot be used: {e}"))?;
    Ok(HealthSettings {
        lease_stale_after: Duration::from_secs(spec.lease_stale_after_seconds()),
        ready_false_after: Duration::from_secs(spec.ready_false_after_seconds()),
        max_unhealthy,
        storm_percent: spec.storm_percent(),
        storm_cooldown: Duration::from_secs(spec.storm_cooldown_seconds()),
        warm_up: Duration::from_secs(spec.warm_up_seconds()),
        storm_window: hostcycle_core::health::STORM_WINDOW,
        repeat_failure_window: Duration::from_secs(spec.repeat_failure_window_seconds()),
    })
}

/// When hostcycle last saw each Lease change, on its own clock. A Lease's `renewTime` is
/// written on its kubelet's clock and is never compared with ours: only whether it (or the
/// resourceVersion) changed, and when we saw that.
#[derive(Debug, Default, Clone)]
pub struct LeaseClock {
    seen: HashMap<String, SeenLease>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenLease {
    version: String,
    renew_time: Option<String>,
    changed_at: Timestamp,
}

impl LeaseClock {
    /// Records `lease` as seen at `now`: a Lease not seen before, or whose resourceVersion or
    /// `renewTime` differs from the last one seen, changed at `now`.
    pub fn observe(&mut self, lease: &Lease, now: Timestamp) {
        let version = lease.resource_version().unwrap_or_default();
        let renew_time = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        let name = lease.name_any();
        match self.seen.get_mut(&name) {
            Some(seen) if seen.version == version && seen.renew_time == renew_time => {}
            Some(seen) => {
                *seen = SeenLease {
                    version,
                    renew_time,
                    changed_at: now,
                }
            }
            None => {
                self.seen.insert(
                    name,
                    SeenLease {
                        version,
                        renew_time,
                        changed_at: now,
                    },
                );
            }
        }
    }

    /// When the Lease named `name` was last seen to change.
    pub fn changed_at(&self, name: &str) -> Option<Timestamp> {
        self.seen.get(name).map(|s| s.changed_at)
    }

    /// Whether `live` (read from the API server) is the very Lease last seen: nothing renewed
    /// it since.
    pub fn unchanged(&self, live: &Lease) -> bool {
        let renew_time = live
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        self.seen.get(&live.name_any()).is_some_and(|s| {
            Some(s.version.as_str()) == live.resource_version().as_deref()
                && s.renew_time == renew_time
        })
    }

    /// Forgets every Lease not named in `present` (deleted ones).
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.seen.retain(|name, _| present.contains(name));
    }
}

/// A Node's `Ready` condition, as the check judges it.
pub fn ready(node: &Node, now: Timestamp) -> Ready {
    match hostcycle_core::node::ready_condition(node) {
        Some(c) if c.status == "True" => Ready::True,
        // A False without a transition time counts from now: never long enough at once.
        Some(c) if c.status == "False" => Ready::False {
            since: c.last_transition_time.as_ref().map_or(now, |t| t.0),
        },
        _ => Ready::Unknown,
    }
}

/// Whether `node` is one of the check's: selected, by the check's selector.
pub fn selects(check: &HostHealthCheck, node: &Node) -> bool {
    // An unusable selector was refused by [`settings`]; here it selects nothing.
    selector_matches(&check.spec.selector, node.labels()).unwrap_or(false)
}

/// Whether `request` is `check`'s: the check is its controlling owner (by uid).
pub fn owned_by(request: &HostRemediation, check: &HostHealthCheck) -> bool {
    let Some(uid) = check.metadata.uid.as_deref() else {
        return false;
    };
    request
        .owner_references()
        .iter()
        .any(|o| o.uid == uid && o.kind == "HostHealthCheck" && o.controller == Some(true))
}

/// The node a request is about (NodeHealthCheck's annotation, which hostcycle's remediation
/// reads too).
pub fn request_node(request: &HostRemediation) -> Option<&str> {
    request
        .annotations()
        .get(NHC_NODE_NAME_ANNOTATION)
        .map(String::as_str)
}

/// The request `check` makes for `node`, in `namespace`: a deterministic name (a restart never
/// makes two), the node in NodeHealthCheck's annotation (how remediation finds the Node of a
/// request not named after it), the check in a label, the check as its controlling owner (its
/// deletion deletes them), and the check's strategy (`release` defaulting to `Auto`).
pub fn request_object(
    check: &HostHealthCheck,
    node: &str,
    namespace: &str,
    repeated_failure: bool,
) -> HostRemediation {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let check_name = check.name_any();
    let mut request = HostRemediation::new(
        &hostcycle_api::health::request_name(&check_name, node),
        hostcycle_api::remediation::HostRemediationSpec {
            strategy: Some(check.spec.request_strategy(repeated_failure)),
            extra: Default::default(),
        },
    );
    request.metadata.namespace = Some(namespace.to_string());
    request.metadata.labels = Some(
        [(
            hostcycle_api::health::HEALTH_CHECK_LABEL.to_string(),
            label_value(&check_name),
        )]
        .into(),
    );
    request.metadata.annotations =
        Some([(NHC_NODE_NAME_ANNOTATION.to_string(), node.to_string())].into());
    request.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "hostcycle.io/v1alpha1".into(),
        kind: "HostHealthCheck".into(),
        name: check_name,
        uid: check.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        // Setting it needs the right to add finalizers to the check; the request's own
        // finalizer already keeps a running flow from being cut short.
        block_owner_deletion: None,
    }]);
    request
}

/// A check's name as a label value (at most 63 characters): longer names are cut and end
/// with a hash of the whole name. Only a hint for people: ownership is the owner's uid.
pub fn label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let hash = hostcycle_api::health::short_hash(name);
    let mut keep = 63 - hash.len() - 1;
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}-{hash}", name[..keep].trim_end_matches(['-', '.']))
}

/// Whether a request's flow has finished: nothing of it runs any more.
pub fn finished(request: &HostRemediation) -> bool {
    matches!(
        request.status.as_ref().map(|s| s.step),
        Some(RemediationStep::Done | RemediationStep::GaveUp | RemediationStep::Cancelled)
    )
}

/// The facts of one selected node.
pub fn node_facts(
    check: &HostHealthCheck,
    node: &Node,
    leases: &LeaseClock,
    requests: &HashMap<String, &HostRemediation>,
    rebooting_until: &HashMap<String, Timestamp>,
    now: Timestamp,
) -> NodeFacts {
    let name = node.name_any();
    NodeFacts {
        excluded: node.labels().contains_key(check.spec.exclude_label()),
        lease_seen_changing: leases.changed_at(&name),
        ready: ready(node, now),
        rebooting: rebooting_until.get(&name).is_some_and(|until| *until > now),
        request: requests.get(&name).map(|r| RequestFacts {
            finished: finished(r),
        }),
        last_recovered: check
            .status
            .iter()
            .flat_map(|s| &s.recent_recoveries)
            .filter(|r| r.node == name)
            .map(|r| r.at)
            .max(),
        name,
    }
}

/// Everything `decide` looks at for `check`, from the caches (and the Lease clock).
#[allow(clippy::too_many_arguments)]
pub fn check_facts<'a>(
    check: &HostHealthCheck,
    nodes: impl IntoIterator<Item = &'a Node>,
    leases: &LeaseClock,
    requests: impl IntoIterator<Item = &'a HostRemediation>,
    rebooting_until: &HashMap<String, Timestamp>,
    watching_since: Timestamp,
    now: Timestamp,
) -> CheckFacts {
    let requests: HashMap<String, &HostRemediation> = requests
        .into_iter()
        .filter(|r| owned_by(r, check))
        .filter_map(|r| request_node(r).map(|n| (n.to_string(), r)))
        .collect();
    let mut nodes: Vec<NodeFacts> = nodes
        .into_iter()
        .filter(|n| selects(check, n))
        .map(|n| node_facts(check, n, leases, &requests, rebooting_until, now))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    CheckFacts {
        now,
        watching_since,
        paused: check.spec.pause_requests.unwrap_or(false),
        storm: recorded_storm(check.status.as_ref()),
        nodes,
        confirmed_live: BTreeSet::new(),
    }
}

/// The storm state the check recorded (a restart keeps a storm and its cooldown).
pub fn recorded_storm(status: Option<&HostHealthCheckStatus>) -> Storm {
    let Some(storm) = status.and_then(|s| s.storm.as_ref()) else {
        return Storm::Calm;
    };
    match (storm.active, storm.since, storm.cooldown_until) {
        (true, Some(since), _) => Storm::Active { since },
        (false, _, Some(until)) => Storm::CoolingDown { until },
        _ => Storm::Calm,
    }
}

/// How many verdicts are `LeaseStale`.
pub fn stale_count(decision: &Decision) -> usize {
    decision
        .nodes
        .iter()
        .filter(|(_, h)| {
            matches!(
                h,
                NodeHealth::Unhealthy(hostcycle_core::health::Unhealthy::LeaseStale { .. })
            )
        })
        .count()
}

/// What a pass decided, in words that do not change while nothing does (no durations), so an
/// unchanged pass writes nothing.
pub fn summary(decision: &Decision) -> String {
    let selected = decision.nodes.len();
    let unhealthy: Vec<&str> = decision
        .nodes
        .iter()
        .filter(|(_, h)| matches!(h, NodeHealth::Unhealthy(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    let mut parts = vec![if unhealthy.is_empty() {
        format!("{selected} selected nodes, none unhealthy")
    } else {
        format!(
            "{} of {selected} selected nodes unhealthy ({})",
            unhealthy.len(),
            list(&unhealthy)
        )
    }];
    let names = |pick: fn(&Action) -> Option<&str>| -> Vec<&str> {
        decision.actions.iter().filter_map(pick).collect()
    };
    let requested = names(|a| match a {
        Action::CreateRequest { node, .. } => Some(node),
        _ => None,
    });
    if !requested.is_empty() {
        parts.push(format!("remediation requested for {}", list(&requested)));
    }
    let deleted = names(|a| match a {
        Action::DeleteRequest { node } => Some(node),
        _ => None,
    });
    if !deleted.is_empty() {
        parts.push(format!(
            "finished requests deleted for {} (healthy again)",
            list(&deleted)
        ));
    }
    let still = names(|a| match a {
        Action::ReportStillUnhealthy { node } => Some(node),
        _ => None,
    });
    if !still.is_empty() {
        parts.push(format!(
            "still unhealthy after their remediation finished: {} (left for a person)",
            list(&still)
        ));
    }
    if let Some(suspension) = decision.suspension {
        parts.push(format!("no new request: {}", suspension_text(suspension)));
    }
    crate::text::bounded(&parts.join("; "), 1024)
}

/// Why no new request may be made, in words.
pub fn suspension_text(suspension: Suspension) -> String {
    match suspension {
        Suspension::Paused => "pauseRequests is set".into(),
        Suspension::WarmingUp { until } => format!(
            "warming up: the operator judges no node before {until} (warmUpSeconds of watching the Leases)"
        ),
        Suspension::Storm { since } => format!(
            "a storm since {since}: more than stormPercent of the selected Leases are stale at \
             once, a control-plane or network failure rather than hosts"
        ),
        Suspension::StormCoolingDown { until } => {
            format!("the storm ended; requests resume at {until} (stormCooldownSeconds)")
        }
        Suspension::TooManyUnhealthy { unhealthy, allowed } => {
            format!("{unhealthy} nodes unhealthy, maxUnhealthy allows {allowed}")
        }
    }
}

fn list(names: &[&str]) -> String {
    const SHOWN: usize = 10;
    let mut text = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// The check's status after a pass: counts, the unhealthy nodes, the storm, the conditions
/// and the decision in words (its time changes only with its words).
pub fn status(
    check: &HostHealthCheck,
    decision: Result<&Decision, &str>,
    now: Timestamp,
) -> HostHealthCheckStatus {
    let before = check.status.clone().unwrap_or_default();
    let mut status = before.clone();
    status.observed_generation = check.metadata.generation;
    let generation = check.metadata.generation;
    let cond = |type_: &str, ok: bool, reason: &str, message: &str| Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: crate::text::bounded(message, 1024),
        last_transition_time: Time(wire_precision(now)),
        observed_generation: generation,
    };
    let words = match decision {
        Err(why) => {
            set(
                &mut status,
                cond(condition::READY, false, condition_reason::INVALID_SPEC, why),
            );
            format!("nothing judged: {why}")
        }
        Ok(decision) => {
            let count = |pick: fn(&NodeHealth) -> bool| {
                u32::try_from(decision.nodes.iter().filter(|(_, h)| pick(h)).count())
                    .unwrap_or(u32::MAX)
            };
            status.observed_nodes = u32::try_from(decision.nodes.len()).unwrap_or(u32::MAX);
            status.healthy_nodes = count(|h| matches!(h, NodeHealth::Healthy));
            status.unhealthy_node_count = count(|h| matches!(h, NodeHealth::Unhealthy(_)));
            status.unhealthy_nodes = decision
                .nodes
                .iter()
                .filter(|(_, h)| matches!(h, NodeHealth::Unhealthy(_)))
                .map(|(n, _)| crate::text::bounded(n, 253))
                .take(MAX_LISTED_UNHEALTHY)
                .collect();
            let stale = u32::try_from(stale_count(decision)).unwrap_or(u32::MAX);
            status.storm = Some(match decision.storm {
                Storm::Calm => StormStatus {
                    stale_count: stale,
                    ..StormStatus::default()
                },
                Storm::Active { since } => StormStatus {
                    active: true,
                    since: Some(since),
                    cooldown_until: None,
                    stale_count: stale,
                },
                Storm::CoolingDown { until } => StormStatus {
                    active: false,
                    since: None,
                    cooldown_until: Some(until),
                    stale_count: stale,
                },
            });
            let ready = match decision.suspension {
                Some(Suspension::WarmingUp { until }) => cond(
                    condition::READY,
                    false,
                    condition_reason::WARMING_UP,
                    &format!("no node is judged before {until}"),
                ),
                _ => cond(
                    condition::READY,
                    true,
                    condition_reason::WATCHING,
                    "the selected nodes' Leases are watched and judged",
                ),
            };
            set(&mut status, ready);
            let suspended = match decision.suspension {
                Some(s) => cond(condition::SUSPENDED, true, s.reason(), &suspension_text(s)),
                None => cond(
                    condition::SUSPENDED,
                    false,
                    condition_reason::NOT_SUSPENDED,
                    "requests are made for unhealthy nodes",
                ),
            };
            set(&mut status, suspended);
            let mut recoveries: Vec<NodeRecovery> = decision
                .recoveries
                .iter()
                .map(|(node, at)| NodeRecovery {
                    node: crate::text::bounded(node, 253),
                    at: wire_precision(*at),
                })
                .collect();
            recoveries.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.node.cmp(&b.node)));
            recoveries.truncate(MAX_RECORDED_RECOVERIES);
            recoveries.sort_by(|a, b| a.node.cmp(&b.node));
            status.recent_recoveries = recoveries;
            summary(decision)
        }
    };
    if status.last_decision != words {
        status.last_decision = words;
        status.last_decision_time = Some(wire_precision(now));
    }
    status
}

fn set(status: &mut HostHealthCheckStatus, condition: Condition) {
    hostcycle_core::conditions::set_condition(&mut status.conditions, condition);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn check(spec: serde_json::Value) -> HostHealthCheck {
        serde_json::from_value(json!({
            "apiVersion": "hostcycle.io/v1alpha1", "kind": "HostHealthCheck",
            "metadata": { "name": "workers", "uid": "check-uid", "generation": 3 },
            "spec": spec,
        }))
        .unwrap()
    }

    fn node(name: &str, labels: serde_json::Value, ready: Option<(&str, i64)>) -> Node {
        let conditions = match ready {
            Some((status, since)) => json!([{ "type": "Ready", "status": status,
                "lastTransitionTime": t(since).to_string() }]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    fn lease(name: &str, version: &str, renew: Option<i64>) -> Lease {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "kube-node-lease", "resourceVersion": version },
            "spec": { "renewTime": renew.map(|s| format!("{}", t(s))) },
        }))
        .unwrap()
    }

    fn request(name: &str, node: &str, owner_uid: &str, step: Option<&str>) -> HostRemediation {
        let mut v = json!({
            "apiVersion": "hostcycle.io/v1alpha1", "kind": "HostRemediation",
            "metadata": { "name": name, "namespace": "ops",
                "annotations": { NHC_NODE_NAME_ANNOTATION: node },
                "ownerReferences": [{ "apiVersion": "hostcycle.io/v1alpha1",
                    "kind": "HostHealthCheck", "name": "workers", "uid": owner_uid,
                    "controller": true }] },
            "spec": {},
        });
        if let Some(step) = step {
            v["status"] = json!({ "step": step });
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_lease_clock_counts_changes_on_our_clock() {
        let mut clock = LeaseClock::default();
        clock.observe(&lease("a", "1", Some(-500)), t(0));
        assert_eq!(clock.changed_at("a"), Some(t(0)), "first seen: now");
        // The same Lease again (a re-list): no change.
        clock.observe(&lease("a", "1", Some(-500)), t(5));
        assert_eq!(clock.changed_at("a"), Some(t(0)));
        // Renewed: changed now, whatever renewTime says (a kubelet's clock far behind).
        clock.observe(&lease("a", "2", Some(-9000)), t(10));
        assert_eq!(clock.changed_at("a"), Some(t(10)));
        // A change of resourceVersion alone is a change too.
        clock.observe(&lease("a", "3", Some(-9000)), t(12));
        assert_eq!(clock.changed_at("a"), Some(t(12)));
        assert!(clock.unchanged(&lease("a", "3", Some(-9000))));
        assert!(!clock.unchanged(&lease("a", "4", Some(-9000))));
        assert!(!clock.unchanged(&lease("a", "3", Some(-8990))));
        assert!(!clock.unchanged(&lease("b", "3", None)), "never seen");
        clock.retain(&BTreeSet::from(["b".to_string()]));
        assert_eq!(clock.changed_at("a"), None);
    }

    #[test]
    fn settings_apply_defaults_and_refuse_unusable_specs() {
        let s = settings(&check(json!({ "selector": {} })).spec).unwrap();
        assert_eq!(s, HealthSettings::default());
        #[rustfmt::skip]
        let cases = [
            (json!({ "selector": {}, "maxUnhealthy": 2 }), Ok(MaxUnhealthy::Count(2))),
            (json!({ "selector": {}, "maxUnhealthy": "25%" }), Ok(MaxUnhealthy::Percent(25))),
            (json!({ "selector": {}, "maxUnhealthy": "250%" }), Err("maxUnhealthy")),
            (json!({ "selector": { "matchExpressions": [{ "key": "a", "operator": "In" }] } }),
             Err("selector")),
            (json!({ "selector": { "matchExpressions": [{ "key": "a", "operator": "Near", "values": ["b"] }] } }),
             Err("selector")),
        ];
        for (spec, want) in cases {
            let got = settings(&check(spec.clone()).spec);
            match (got, want) {
                (Ok(s), Ok(m)) => assert_eq!(s.max_unhealthy, m, "{spec}"),
                (Err(e), Err(word)) => assert!(e.contains(word), "{spec}: {e}"),
                (got, want) => panic!("{spec}: {got:?}, want {want:?}"),
            }
        }
        let s = settings(
            &check(
                json!({ "selector": {}, "leaseStaleAfterSeconds": 10, "warmUpSeconds": 5,
                           "stormPercent": 60, "stormCooldownSeconds": 0 }),
            )
            .spec,
        )
        .unwrap();
        assert_eq!(s.lease_stale_after, Duration::from_secs(10));
        assert_eq!(s.warm_up, Duration::from_secs(5));
        assert_eq!(s.storm_percent, 60);
        assert_eq!(s.storm_cooldown, Duration::ZERO);
    }

    /// A node's name, then what its facts say: excluded, Lease seen changing, Ready,
    /// rebooting, request.
    type Expected = (
        &'static str,
        bool,
        Option<Timestamp>,
        Ready,
        bool,
        Option<RequestFacts>,
    );

    /// Which nodes a check sees and what it knows of each.
    #[test]
    fn observed_objects_become_facts() {
        let c = check(json!({
            "selector": { "matchLabels": { "role": "worker" } },
            "excludeLabel": "skip-me", "pauseRequests": true,
        }));
        let mut clock = LeaseClock::default();
        clock.observe(&lease("w-lease", "7", Some(0)), t(40));
        let nodes = [
            node("w-lease", json!({ "role": "worker" }), Some(("True", 0))),
            node(
                "w-no-lease",
                json!({ "role": "worker" }),
                Some(("False", 10)),
            ),
            node(
                "w-excluded",
                json!({ "role": "worker", "skip-me": "" }),
                None,
            ),
            node(
                "w-rebooting",
                json!({ "role": "worker" }),
                Some(("Unknown", 0)),
            ),
            node("w-rebooted", json!({ "role": "worker" }), Some(("True", 0))),
            node(
                "w-requested",
                json!({ "role": "worker" }),
                Some(("True", 0)),
            ),
            node("w-done", json!({ "role": "worker" }), Some(("True", 0))),
            node("control-plane", json!({ "role": "cp" }), Some(("True", 0))),
        ];
        let requests = [
            request(
                "workers-w-requested",
                "w-requested",
                "check-uid",
                Some("PowerOffRequested"),
            ),
            request("workers-w-done", "w-done", "check-uid", Some("Done")),
            // Another owner's request for a node of ours is not ours.
            request("other-w-lease", "w-lease", "other-uid", Some("Done")),
        ];
        let rebooting = HashMap::from([
            ("w-rebooting".to_string(), t(101)),
            ("w-rebooted".to_string(), t(100)),
        ]);
        let f = check_facts(&c, &nodes, &clock, &requests, &rebooting, t(30), t(100));
        assert!(f.paused);
        assert_eq!(
            (f.now, f.watching_since, f.storm),
            (t(100), t(30), Storm::Calm)
        );
        let by_name: HashMap<&str, &NodeFacts> =
            f.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        assert_eq!(
            f.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            [
                "w-done",
                "w-excluded",
                "w-lease",
                "w-no-lease",
                "w-rebooted",
                "w-rebooting",
                "w-requested"
            ],
            "sorted; the control plane is not selected"
        );
        #[rustfmt::skip]
        let cases: [Expected; 7] = [
            ("w-lease",     false, Some(t(40)), Ready::True, false, None),
            ("w-no-lease",  false, None, Ready::False { since: t(10) }, false, None),
            ("w-excluded",  true,  None, Ready::Unknown, false, None),
            ("w-rebooting", false, None, Ready::Unknown, true, None),
            ("w-rebooted",  false, None, Ready::True, false, None),
            ("w-requested", false, None, Ready::True, false, Some(RequestFacts { finished: false })),
            ("w-done",      false, None, Ready::True, false, Some(RequestFacts { finished: true })),
        ];
        for (name, excluded, seen, ready, rebooting, request) in cases {
            let n = by_name[name];
            assert_eq!(
                (
                    n.excluded,
                    n.lease_seen_changing,
                    n.ready,
                    n.rebooting,
                    n.request
                ),
                (excluded, seen, ready, rebooting, request),
                "{name}"
            );
        }
    }

    #[test]
    fn a_request_names_its_node_owner_and_strategy() {
        let c = check(json!({ "selector": {}, "remediation": { "retryLimit": 2 } }));
        let r = request_object(&c, "node-1", "ops", false);
        assert_eq!(r.metadata.name.as_deref(), Some("workers-node-1"));
        assert_eq!(r.metadata.namespace.as_deref(), Some("ops"));
        assert_eq!(request_node(&r), Some("node-1"));
        assert_eq!(r.labels()["hostcycle.io/health-check"], "workers");
        assert!(owned_by(&r, &c));
        let strategy = r.spec.strategy.clone().unwrap();
        assert_eq!(
            (strategy.release.as_deref(), strategy.retry_limit),
            (Some("Auto"), Some(2))
        );
        assert_eq!(strategy.after_release, None);
        // A repeated failure's request leaves its host off after the release.
        let repeat = request_object(&c, "node-1", "ops", true);
        let strategy = repeat.spec.strategy.unwrap();
        assert_eq!(
            (strategy.after_release.as_deref(), strategy.retry_limit),
            (Some("LeaveOff"), Some(2))
        );
        // Another check's (same name, another uid) is not this one's.
        let mut other = c.clone();
        other.metadata.uid = Some("other".into());
        assert!(!owned_by(&r, &other));
        // Long names stay valid.
        let long = "c".repeat(200);
        let value = label_value(&long);
        assert_eq!(value.len(), 63);
        assert_eq!(value, label_value(&long));
        assert_ne!(value, label_value(&"c".repeat(199)));
        assert_eq!(label_value("short"), "short");
    }

    /// A finished request deleted because its node is healthy again is a recovery, kept in
    /// the status (hostcycle's to write) while inside the repeat-failure window and read back
    /// as the node's fact.
    #[test]
    fn recoveries_are_recorded_in_the_status_and_read_back() {
        use hostcycle_core::health::decide;
        let mut c = check(json!({ "selector": {}, "repeatFailureWindowSeconds": 600 }));
        let s = settings(&c.spec).unwrap();
        assert_eq!(s.repeat_failure_window, Duration::from_secs(600));
        let mut clock = LeaseClock::default();
        clock.observe(&lease("a", "1", None), t(95));
        let nodes = vec![node("a", json!({}), Some(("True", 0)))];
        let done = request("workers-a", "a", "check-uid", Some("Done"));
        let f = check_facts(&c, &nodes, &clock, [&done], &HashMap::new(), t(0), t(100));
        let d = decide(&s, &f);
        assert_eq!(d.actions, [Action::DeleteRequest { node: "a".into() }]);
        let st = status(&c, Ok(&d), t(100));
        assert_eq!(
            st.recent_recoveries,
            [NodeRecovery {
                node: "a".into(),
                at: t(100)
            }]
        );
        c.status = Some(st);
        let f = check_facts(&c, &nodes, &clock, [], &HashMap::new(), t(0), t(200));
        assert_eq!(f.nodes[0].last_recovered, Some(t(100)));
        // Past the window it is forgotten.
        let f = check_facts(&c, &nodes, &clock, [], &HashMap::new(), t(0), t(800));
        assert!(
            status(&c, Ok(&decide(&s, &f)), t(800))
                .recent_recoveries
                .is_empty()
        );
    }

    #[test]
    fn the_recorded_storm_is_read_back() {
        let with = |storm: StormStatus| HostHealthCheckStatus {
            storm: Some(storm),
            ..Default::default()
        };
        #[rustfmt::skip]
        let cases = [
            (None, Storm::Calm),
            (Some(with(StormStatus::default())), Storm::Calm),
            (Some(with(StormStatus { active: true, since: Some(t(5)), ..Default::default() })),
             Storm::Active { since: t(5) }),
            (Some(with(StormStatus { active: false, cooldown_until: Some(t(9)), ..Default::default() })),
             Storm::CoolingDown { until: t(9) }),
            // Active without a start cannot be trusted to end: it starts again when stale.
            (Some(with(StormStatus { active: true, ..Default::default() })), Storm::Calm),
        ];
        for (status, want) in cases {
            assert_eq!(recorded_storm(status.as_ref()), want, "{status:?}");
        }
    }

    /// A status written from a decision, read back: counts, names, storm and conditions; an
    /// unchanged decision changes nothing (no write).
    #[test]
    fn the_status_says_what_was_decided_and_stays_put_while_nothing_changes() {
        use hostcycle_core::health::{Unhealthy, decide};
        let mut c = check(json!({ "selector": {}, "maxUnhealthy": 5 }));
        let s = settings(&c.spec).unwrap();
        let mut clock = LeaseClock::default();
        for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            clock.observe(&lease(name, "1", None), t(if i < 3 { 0 } else { 100 }));
        }
        let nodes: Vec<Node> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| node(n, json!({}), Some(("True", 0))))
            .collect();
        let f = check_facts(&c, &nodes, &clock, [], &HashMap::new(), t(0), t(100));
        let d = decide(&s, &f);
        assert_eq!(d.storm, Storm::Active { since: t(100) });
        assert!(d.actions.iter().all(|a| matches!(a, Action::Hold { .. })));
        let st = status(&c, Ok(&d), t(100));
        assert_eq!(
            (st.observed_nodes, st.healthy_nodes, st.unhealthy_node_count),
            (5, 2, 3)
        );
        assert_eq!(st.unhealthy_nodes, ["a", "b", "c"]);
        assert_eq!(st.observed_generation, Some(3));
        let storm = st.storm.clone().unwrap();
        assert_eq!(
            (storm.active, storm.since, storm.stale_count),
            (true, Some(t(100)), 3)
        );
        let suspended = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Suspended")
            .unwrap();
        assert_eq!(
            (suspended.status.as_str(), suspended.reason.as_str()),
            ("True", "StormActive")
        );
        assert!(
            st.last_decision
                .contains("3 of 5 selected nodes unhealthy (a, b, c)"),
            "{}",
            st.last_decision
        );
        assert_eq!(st.last_decision_time, Some(t(100)));
        // The next pass, 10 s later, decides the same: the same status, times included.
        c.status = Some(st.clone());
        let f = check_facts(&c, &nodes, &clock, [], &HashMap::new(), t(0), t(110));
        assert_eq!(f.storm, Storm::Active { since: t(100) });
        let d = decide(&s, &f);
        assert_eq!(status(&c, Ok(&d), t(110)), st);
        // An unusable spec: Ready False, nothing judged.
        let bad = status(
            &c,
            Err("maxUnhealthy \"x\" is neither a count nor a percentage"),
            t(120),
        );
        let ready = bad.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(bad.last_decision.starts_with("nothing judged"));
        let _ = Unhealthy::LeaseStale {
            for_: Duration::ZERO,
        };
    }
}
