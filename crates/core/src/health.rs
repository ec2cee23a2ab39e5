//! Node health detection for a `HostHealthCheck` (issue 26, part 1): which of the selected
//! nodes are unhealthy, and whether hostcycle may ask for their remediation now. Pure: the
//! controller observes (its Lease watch, Nodes, the check's own requests, the reboot queue),
//! calls [`decide`], and carries out the [`Action`]s.
//!
//! Rules, each with its reason:
//! - **Lease staleness is measured on hostcycle's clock.** A node is stale when hostcycle has
//!   not *seen* its Lease change for `lease_stale_after`; the Lease's `renewTime` is written on
//!   the kubelet's clock and is never compared with ours (as the node-lifecycle controller
//!   does it).
//! - **Warm-up.** Right after the operator starts or takes the Lease it has watched no Lease
//!   long enough to call it stale: no node is judged before `warm_up` has passed.
//! - **A cache never decides alone.** An unhealthy node first gets [`Action::ConfirmLive`]; a
//!   request is created only once a live read of its Lease and Node agreed (`confirmed_live`).
//! - **Storms suspend everything.** When more than `storm_percent` of the selected nodes'
//!   Leases are stale at once (and at least two), that is a control-plane or network failure,
//!   not hosts: no request is created until it has ended and `storm_cooldown` has passed.
//! - **`max_unhealthy`.** With more unhealthy nodes than it allows, no new request.
//! - **Not candidates:** excluded nodes, nodes in a reboot queue entry that is rebooting them
//!   (or inside its boot timeout), and every node while the check is paused.
//! - **Requests end only when done.** A request of the check is deleted once its node is
//!   healthy again *and* its flow has finished; a running flow is never cut short.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use jiff::Timestamp;

use crate::time::{add, elapsed};

/// The check's settings (its spec, defaults applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// A Lease not seen to change for this long is stale (default 20 s: two missed renewals).
    pub lease_stale_after: Duration,
    /// A Node whose `Ready` is `False` for this long is unhealthy (the slow path: a kubelet
    /// alive on a broken node).
    pub ready_false_after: Duration,
    /// How many selected nodes may be unhealthy for new requests to be made.
    pub max_unhealthy: MaxUnhealthy,
    /// More than this percentage of the selected Leases stale at once is a storm.
    pub storm_percent: u8,
    /// How long after a storm has ended the check stays suspended.
    pub storm_cooldown: Duration,
    /// How long the operator must have watched Leases before it judges any.
    pub warm_up: Duration,
    /// How long a stale node waits before its request, so that Leases stopped by the same
    /// outage — renewed up to one renewal interval apart, so stale up to that much later —
    /// are all stale by then and counted as the storm they are (default 10 s: a kubelet's
    /// renewal interval). Without it the first of them would be fenced before the storm
    /// shows.
    pub storm_window: Duration,
    /// A node that fails again within this long of recovering from its last remediation is
    /// fenced and released as always, then left off for a person (`afterRelease: LeaveOff`)
    /// instead of being cycled for ever (zero: never).
    pub repeat_failure_window: Duration,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            lease_stale_after: Duration::from_secs(20),
            ready_false_after: Duration::from_secs(120),
            max_unhealthy: MaxUnhealthy::Percent(40),
            storm_percent: 50,
            storm_cooldown: Duration::from_secs(300),
            warm_up: Duration::from_secs(30),
            storm_window: STORM_WINDOW,
            repeat_failure_window: Duration::from_secs(3600),
        }
    }
}

/// [`HealthSettings::storm_window`]'s default: a kubelet renews its Lease every 10 s.
pub const STORM_WINDOW: Duration = Duration::from_secs(10);

/// `maxUnhealthy`: a count, or a percentage of the selected nodes (rounded down, as Cluster
/// API's MachineHealthCheck does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnhealthy {
    Count(u32),
    Percent(u8),
}

impl MaxUnhealthy {
    /// How many unhealthy nodes of `selected` still allow new requests.
    pub fn limit(self, selected: usize) -> usize {
        match self {
            MaxUnhealthy::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            MaxUnhealthy::Percent(p) => selected.saturating_mul(usize::from(p.min(100))) / 100,
        }
    }

    /// Parses `3` or `40%`.
    pub fn parse(text: &str) -> Result<MaxUnhealthy, String> {
        let text = text.trim();
        if let Some(percent) = text.strip_suffix('%') {
            return match percent.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(MaxUnhealthy::Percent(p)),
                _ => Err(format!(
                    "maxUnhealthy {text:?} is not a percentage from 0% to 100%"
                )),
            };
        }
        text.parse::<u32>()
            .map(MaxUnhealthy::Count)
            .map_err(|_| format!("maxUnhealthy {text:?} is neither a count nor a percentage"))
    }
}

/// A Node's `Ready` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    True,
    /// `False` since this time (its `lastTransitionTime`).
    False {
        since: Timestamp,
    },
    /// `Unknown` or absent: the node-lifecycle controller's verdict on a silent kubelet,
    /// which the Lease already tells.
    Unknown,
}

/// What the controller observed of one selected node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// Carries the check's exclude label.
    pub excluded: bool,
    /// When hostcycle last saw the node's Lease change (or first saw it), on its own clock.
    /// `None`: no Lease (the node is then judged by `Ready` alone).
    pub lease_seen_changing: Option<Timestamp>,
    pub ready: Ready,
    /// In a reboot queue entry that is rebooting it, or inside that entry's boot timeout.
    pub rebooting: bool,
    /// The check's request (HostRemediation) for this node, if it has one.
    pub request: Option<RequestFacts>,
    /// When the node last recovered from a remediation of this check (its finished request
    /// was deleted because the node was healthy again), as the check recorded it.
    pub last_recovered: Option<Timestamp>,
}

/// The check's own request for a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// Its flow has finished (succeeded, failed or given up): nothing of it runs any more.
    pub finished: bool,
}

/// The storm state the check recorded in its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Storm {
    #[default]
    Calm,
    /// A storm since this time.
    Active { since: Timestamp },
    /// The storm ended; suspended until this time.
    CoolingDown { until: Timestamp },
}

/// Everything [`decide`] looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckFacts {
    pub now: Timestamp,
    /// Since when this replica has watched Leases (start, or taking the operator's Lease).
    pub watching_since: Timestamp,
    /// `pauseRequests` is set: nothing new is requested.
    pub paused: bool,
    pub storm: Storm,
    pub nodes: Vec<NodeFacts>,
    /// Nodes whose unhealthiness a live read of their Lease and Node confirmed this pass.
    pub confirmed_live: BTreeSet<String>,
}

/// Why a node is unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unhealthy {
    /// Its Lease has not been seen to change for this long.
    LeaseStale { for_: Duration },
    /// `Ready` has been `False` for this long.
    ReadyFalse { for_: Duration },
}

impl Unhealthy {
    /// A sentence for people (Events, status).
    pub fn describe(self) -> String {
        match self {
            Unhealthy::LeaseStale { for_ } => format!(
                "its Lease in kube-node-lease has not been renewed for {}s",
                for_.as_secs()
            ),
            Unhealthy::ReadyFalse { for_ } => {
                format!("its Ready condition has been False for {}s", for_.as_secs())
            }
        }
    }
}

/// One node's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    Healthy,
    Unhealthy(Unhealthy),
    /// Carries the exclude label.
    Excluded,
    /// Being rebooted by the queue, or inside its boot timeout.
    Rebooting,
    /// The operator has not watched Leases long enough to judge.
    WarmingUp,
}

/// Why no new request may be made this pass (the check's `Suspended` condition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suspension {
    Paused,
    WarmingUp {
        until: Timestamp,
    },
    Storm {
        since: Timestamp,
    },
    StormCoolingDown {
        until: Timestamp,
    },
    /// More unhealthy nodes than `maxUnhealthy` allows.
    TooManyUnhealthy {
        unhealthy: usize,
        allowed: usize,
    },
}

impl Suspension {
    /// The condition's CamelCase reason.
    pub fn reason(self) -> &'static str {
        match self {
            Suspension::Paused => "Paused",
            Suspension::WarmingUp { .. } => "WarmingUp",
            Suspension::Storm { .. } => "StormActive",
            Suspension::StormCoolingDown { .. } => "StormCoolingDown",
            Suspension::TooManyUnhealthy { .. } => "TooManyUnhealthy",
        }
    }
}

/// What the controller does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read the node's Lease and Node from the API server (not the cache) and decide again:
    /// a Lease that changed meanwhile was only late in the cache.
    ConfirmLive { node: String, why: Unhealthy },
    /// Create the check's HostRemediation for the node. `repeat_of`: the node recovered from
    /// its last remediation at this time, within the repeat-failure window: the request
    /// leaves the host off after releasing its workloads (`afterRelease: LeaveOff`).
    CreateRequest {
        node: String,
        why: Unhealthy,
        repeat_of: Option<Timestamp>,
    },
    /// Delete the check's finished request: its node is healthy again.
    DeleteRequest { node: String },
    /// The node is unhealthy and no request is made: say why (an Event, once per change).
    Hold {
        node: String,
        why: Unhealthy,
        because: Suspension,
    },
    /// The node's request finished and the node is still unhealthy: reported, not retried
    /// (a node that fails again is left as it is for a person).
    ReportStillUnhealthy { node: String },
}

/// The decision: every node's verdict, the storm state to record, what holds requests back,
/// and the actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub nodes: Vec<(String, NodeHealth)>,
    pub storm: Storm,
    pub suspension: Option<Suspension>,
    pub actions: Vec<Action>,
    /// The recoveries to record (node → when): the recorded ones still inside the
    /// repeat-failure window, and now for each node whose finished request is deleted because
    /// it is healthy again.
    pub recoveries: BTreeMap<String, Timestamp>,
}

/// The nodes the reboot queue is rebooting, each with the end of its boot timeout (the latest,
/// for a node in several entries), from `(node, rebooting since)` of every entry in phase
/// `Rebooting` — cancelled or not: a cancel stops no power cycle under way. The same rule as
/// remediation's wait for a reboot in the queue.
pub fn rebooting_until<'a>(
    rebooting: impl IntoIterator<Item = (&'a str, Timestamp)>,
    boot_timeout: Duration,
) -> HashMap<String, Timestamp> {
    let mut until: HashMap<String, Timestamp> = HashMap::new();
    for (node, since) in rebooting {
        let end = add(since, boot_timeout);
        let slot = until.entry(node.to_string()).or_insert(end);
        *slot = (*slot).max(end);
    }
    until
}

/// Judges one node.
pub fn judge(settings: &HealthSettings, facts: &CheckFacts, node: &NodeFacts) -> NodeHealth {
    if node.excluded {
        return NodeHealth::Excluded;
    }
    if node.rebooting {
        return NodeHealth::Rebooting;
    }
    if elapsed(facts.watching_since, facts.now) < settings.warm_up {
        return NodeHealth::WarmingUp;
    }
    if let Some(seen) = node.lease_seen_changing {
        // Watched for less than a stale period since the operator began: the Lease may
        // simply not have been renewed in the window this replica saw.
        let since = seen.max(facts.watching_since);
        let silent = elapsed(since, facts.now);
        if silent > settings.lease_stale_after {
            return NodeHealth::Unhealthy(Unhealthy::LeaseStale { for_: silent });
        }
    }
    if let Ready::False { since } = node.ready {
        let for_ = elapsed(since, facts.now);
        if for_ > settings.ready_false_after {
            return NodeHealth::Unhealthy(Unhealthy::ReadyFalse { for_ });
        }
    }
    NodeHealth::Healthy
}

/// The storm state after this pass, from the recorded one and the Leases stale now.
fn next_storm(settings: &HealthSettings, recorded: Storm, now: Timestamp, storming: bool) -> Storm {
    match (recorded, storming) {
        (Storm::Active { since }, true) => Storm::Active { since },
        (_, true) => Storm::Active { since: now },
        (Storm::Active { .. }, false) => Storm::CoolingDown {
            until: add(now, settings.storm_cooldown),
        },
        (Storm::CoolingDown { until }, false) if now < until => Storm::CoolingDown { until },
        (_, false) => Storm::Calm,
    }
}

/// Decides a pass of the check.
pub fn decide(settings: &HealthSettings, facts: &CheckFacts) -> Decision {
    let nodes: Vec<(String, NodeHealth)> = facts
        .nodes
        .iter()
        .map(|n| (n.name.clone(), judge(settings, facts, n)))
        .collect();

    // Storms are counted over every selected node that is not excluded.
    let considered = facts.nodes.iter().filter(|n| !n.excluded).count();
    let stale = nodes
        .iter()
        .filter(|(_, h)| matches!(h, NodeHealth::Unhealthy(Unhealthy::LeaseStale { .. })))
        .count();
    let storming = stale >= 2
        && stale.saturating_mul(100)
            > considered.saturating_mul(usize::from(settings.storm_percent));
    let storm = next_storm(settings, facts.storm, facts.now, storming);

    let unhealthy = nodes
        .iter()
        .filter(|(_, h)| matches!(h, NodeHealth::Unhealthy(_)))
        .count();
    let allowed = settings.max_unhealthy.limit(considered);
    let warming_until = add(facts.watching_since, settings.warm_up);
    let suspension = if facts.paused {
        Some(Suspension::Paused)
    } else if facts.now < warming_until {
        Some(Suspension::WarmingUp {
            until: warming_until,
        })
    } else {
        match storm {
            Storm::Active { since } => Some(Suspension::Storm { since }),
            Storm::CoolingDown { until } => Some(Suspension::StormCoolingDown { until }),
            Storm::Calm if unhealthy > allowed => {
                Some(Suspension::TooManyUnhealthy { unhealthy, allowed })
            }
            Storm::Calm => None,
        }
    };

    let mut actions = Vec::new();
    for (node, (name, health)) in facts.nodes.iter().zip(&nodes) {
        match (health, node.request) {
            (NodeHealth::Unhealthy(_), Some(RequestFacts { finished: true })) => {
                actions.push(Action::ReportStillUnhealthy { node: name.clone() });
            }
            (NodeHealth::Unhealthy(why), None) => match suspension {
                Some(because) => actions.push(Action::Hold {
                    node: name.clone(),
                    why: *why,
                    because,
                }),
                // Stale, but not for the storm window yet: Leases stopped by the same outage
                // may still be turning stale.
                None if matches!(why, Unhealthy::LeaseStale { for_ }
                    if *for_ < settings.lease_stale_after + settings.storm_window) => {}
                None if facts.confirmed_live.contains(name) => {
                    actions.push(Action::CreateRequest {
                        node: name.clone(),
                        why: *why,
                        repeat_of: node
                            .last_recovered
                            .filter(|at| within_window(settings, *at, facts.now)),
                    });
                }
                None => actions.push(Action::ConfirmLive {
                    node: name.clone(),
                    why: *why,
                }),
            },
            (NodeHealth::Healthy, Some(RequestFacts { finished: true })) => {
                actions.push(Action::DeleteRequest { node: name.clone() });
            }
            // A running flow finishes on its own; excluded, rebooting and unjudged nodes
            // keep whatever request they have.
            _ => {}
        }
    }
    let mut recoveries: BTreeMap<String, Timestamp> = facts
        .nodes
        .iter()
        .filter_map(|n| Some((n.name.clone(), n.last_recovered?)))
        .filter(|(_, at)| within_window(settings, *at, facts.now))
        .collect();
    for action in &actions {
        if let Action::DeleteRequest { node } = action {
            recoveries.insert(node.clone(), facts.now);
        }
    }
    Decision {
        nodes,
        storm,
        suspension,
        actions,
        recoveries,
    }
}

/// Whether a recovery at `at` is inside the repeat-failure window at `now` (a recovery
/// recorded in the future — another replica's clock ahead — counts as just now).
fn within_window(settings: &HealthSettings, at: Timestamp, now: Timestamp) -> bool {
    !settings.repeat_failure_window.is_zero() && elapsed(at, now) <= settings.repeat_failure_window
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// A healthy node whose Lease changed at `seen`.
    fn node(name: &str, seen: i64) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            excluded: false,
            lease_seen_changing: Some(t(seen)),
            ready: Ready::True,
            rebooting: false,
            request: None,
            last_recovered: None,
        }
    }

    fn facts(now: i64, nodes: Vec<NodeFacts>) -> CheckFacts {
        CheckFacts {
            now: t(now),
            watching_since: t(0),
            paused: false,
            storm: Storm::Calm,
            nodes,
            confirmed_live: BTreeSet::new(),
        }
    }

    fn confirmed(mut f: CheckFacts, names: &[&str]) -> CheckFacts {
        f.confirmed_live = names.iter().map(|n| n.to_string()).collect();
        f
    }

    fn stale(for_: u64) -> NodeHealth {
        NodeHealth::Unhealthy(Unhealthy::LeaseStale {
            for_: Duration::from_secs(for_),
        })
    }

    #[test]
    fn judging_nodes() {
        let s = HealthSettings::default();
        let mut excluded = node("n", 0);
        excluded.excluded = true;
        let mut rebooting = node("n", 0);
        rebooting.rebooting = true;
        let mut ready_false = node("n", 299);
        ready_false.ready = Ready::False { since: t(100) };
        let mut ready_false_young = node("n", 299);
        ready_false_young.ready = Ready::False { since: t(250) };
        let mut no_lease = node("n", 0);
        no_lease.lease_seen_changing = None;
        let mut unknown = node("n", 299);
        unknown.ready = Ready::Unknown;
        #[rustfmt::skip]
        let cases: Vec<(&str, i64, i64, NodeFacts, NodeHealth)> = vec![
            ("renewed recently",                   300, 0, node("n", 290), NodeHealth::Healthy),
            ("exactly at the limit is not stale",  300, 0, node("n", 280), NodeHealth::Healthy),
            ("stale past the limit",               300, 0, node("n", 279), stale(21)),
            ("excluded wins over stale",           300, 0, excluded, NodeHealth::Excluded),
            ("rebooting is not judged",            300, 0, rebooting, NodeHealth::Rebooting),
            ("warming up: nothing is judged",       29, 0, node("n", -100), NodeHealth::WarmingUp),
            // Watched since 100: silent for 35 s of our watch, not 435.
            ("staleness counts from the watch",    135, 100, node("n", -300), stale(35)),
            ("Ready False past its limit",         300, 0, ready_false,
             NodeHealth::Unhealthy(Unhealthy::ReadyFalse { for_: Duration::from_secs(200) })),
            ("Ready False, not long enough",       300, 0, ready_false_young, NodeHealth::Healthy),
            ("no Lease: judged by Ready alone",    300, 0, no_lease, NodeHealth::Healthy),
            ("Unknown alone is the Lease's call",  300, 0, unknown, NodeHealth::Healthy),
        ];
        for (name, now, watching, n, want) in cases {
            let mut f = facts(now, vec![]);
            f.watching_since = t(watching);
            assert_eq!(judge(&s, &f, &n), want, "{name}");
        }
    }

    #[test]
    fn max_unhealthy_limits_and_parses() {
        #[rustfmt::skip]
        let cases = [
            ("2", 10, Some(2)), ("40%", 5, Some(2)), ("40%", 1, Some(0)), ("100%", 3, Some(3)),
            ("0", 3, Some(0)), (" 50 % ", 4, Some(2)), ("101%", 3, None), ("-1", 3, None),
            ("x", 3, None), ("", 3, None),
        ];
        for (text, selected, want) in cases {
            let got = MaxUnhealthy::parse(text).ok().map(|m| m.limit(selected));
            assert_eq!(got, want, "{text:?} of {selected}");
        }
    }

    /// Three of five Leases stopped by one outage, renewed 2 s apart: the first is stale
    /// 2 s before the others. It waits the storm window, so by its request the storm counts
    /// all three and nothing is requested (e2e scenario F, seen failing without the window).
    #[test]
    fn a_stale_node_waits_the_storm_window_so_a_storm_shows_before_any_request() {
        let s = HealthSettings::default();
        // Seen changing at 100, 102, 102; two healthy.
        let nodes = || {
            vec![
                node("n0", 100),
                node("n1", 102),
                node("n2", 102),
                node("n3", 400),
                node("n4", 400),
            ]
        };
        let all = ["n0", "n1", "n2"];
        // 121: n0 stale 21 s, the others not yet: no action at all (not even a live read).
        let d = decide(&s, &confirmed(facts(121, nodes()), &all));
        assert_eq!(d.suspension, None);
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        // 123: all three stale: a storm; nothing requested.
        let d = decide(&s, &confirmed(facts(123, nodes()), &all));
        assert!(
            matches!(d.suspension, Some(Suspension::Storm { .. })),
            "{d:?}"
        );
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::CreateRequest { .. } | Action::ConfirmLive { .. })),
            "{:?}",
            d.actions
        );
        // One node alone: its request comes once the window has passed (stale 30 s + ε).
        let lone = || vec![node("n0", 100), node("n3", 400), node("n4", 400)];
        let d = decide(&s, &confirmed(facts(129, lone()), &["n0"]));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        let d = decide(&s, &confirmed(facts(131, lone()), &["n0"]));
        assert!(
            matches!(&d.actions[..], [Action::CreateRequest { node, .. }] if node == "n0"),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn an_unhealthy_node_is_confirmed_live_before_its_request() {
        let s = HealthSettings::default();
        let why = Unhealthy::LeaseStale {
            for_: Duration::from_secs(40),
        };
        let nodes = vec![node("a", 300), node("b", 260), node("c", 300)];
        let d = decide(&s, &facts(300, nodes.clone()));
        assert_eq!(d.suspension, None);
        assert_eq!(
            d.actions,
            [Action::ConfirmLive {
                node: "b".into(),
                why
            }]
        );
        let d = decide(&s, &confirmed(facts(300, nodes), &["b"]));
        assert_eq!(
            d.actions,
            [Action::CreateRequest {
                node: "b".into(),
                why,
                repeat_of: None,
            }]
        );
    }

    /// A node that fails again soon after recovering from its last remediation is fenced and
    /// released, then left off (the request's `afterRelease: LeaveOff`), not cycled for ever;
    /// the recoveries are recorded when a finished request is deleted and forgotten once
    /// outside the window.
    #[test]
    fn a_node_failing_again_within_the_window_is_left_off() {
        let s = HealthSettings {
            repeat_failure_window: Duration::from_secs(600),
            ..HealthSettings::default()
        };
        let failing = |recovered: Option<i64>| NodeFacts {
            last_recovered: recovered.map(t),
            ..node("b", 1000)
        };
        let now = 1040; // stale 40 s: past lease_stale_after + the storm window
        let why = Unhealthy::LeaseStale {
            for_: Duration::from_secs(40),
        };
        #[rustfmt::skip]
        let rows: [(&str, &HealthSettings, Option<i64>, Option<i64>); 5] = [
            ("never remediated: powered on as always", &s, None, None),
            ("recovered 5 min ago: left off", &s, Some(740), Some(740)),
            ("recovered exactly the window ago: left off", &s, Some(440), Some(440)),
            ("recovered 11 min ago: powered on", &s, Some(380), None),
            ("a recovery recorded ahead of our clock counts as now", &s, Some(1100), Some(1100)),
        ];
        for (name, settings, recovered, repeat_of) in rows {
            let nodes = vec![node("a", now), failing(recovered), node("c", now)];
            let d = decide(settings, &confirmed(facts(now, nodes), &["b"]));
            assert_eq!(
                d.actions,
                [Action::CreateRequest {
                    node: "b".into(),
                    why,
                    repeat_of: repeat_of.map(t),
                }],
                "{name}"
            );
        }
        let off = HealthSettings {
            repeat_failure_window: Duration::ZERO,
            ..s.clone()
        };
        let nodes = vec![node("a", now), failing(Some(1030)), node("c", now)];
        let d = decide(&off, &confirmed(facts(now, nodes), &["b"]));
        assert!(
            matches!(
                &d.actions[..],
                [Action::CreateRequest {
                    repeat_of: None,
                    ..
                }]
            ),
            "a zero window never leaves a host off: {:?}",
            d.actions
        );
        assert!(d.recoveries.is_empty());

        // Recording: a deleted finished request records now; old recoveries are forgotten.
        let recovered = NodeFacts {
            request: Some(RequestFacts { finished: true }),
            ..node("a", now)
        };
        let nodes = vec![
            recovered,
            NodeFacts {
                last_recovered: Some(t(900)),
                ..node("b", now)
            },
            NodeFacts {
                last_recovered: Some(t(100)),
                ..node("c", now)
            },
        ];
        let d = decide(&s, &facts(now, nodes));
        assert_eq!(d.actions, [Action::DeleteRequest { node: "a".into() }]);
        assert_eq!(
            d.recoveries,
            BTreeMap::from([("a".to_string(), t(now)), ("b".to_string(), t(900))])
        );
    }

    #[test]
    fn requests_are_deleted_only_when_finished_and_the_node_is_healthy() {
        let s = HealthSettings::default();
        let with = |mut n: NodeFacts, finished| {
            n.request = Some(RequestFacts { finished });
            n
        };
        let nodes = vec![
            with(node("healthy-running", 300), false),
            with(node("healthy-done", 300), true),
            with(node("stale-running", 200), false),
            with(node("stale-done", 200), true),
            node("d", 300),
            node("e", 300),
        ];
        let d = decide(&s, &facts(300, nodes));
        assert_eq!(
            d.actions,
            [
                Action::DeleteRequest {
                    node: "healthy-done".into()
                },
                Action::ReportStillUnhealthy {
                    node: "stale-done".into()
                },
            ]
        );
    }

    #[test]
    fn nothing_is_requested_while_paused_warming_up_or_over_max_unhealthy() {
        let s = HealthSettings {
            max_unhealthy: MaxUnhealthy::Count(1),
            ..HealthSettings::default()
        };
        let five = |stale_ones: usize| -> Vec<NodeFacts> {
            (0..5)
                .map(|i| node(&format!("n{i}"), if i < stale_ones { 200 } else { 300 }))
                .collect()
        };
        let mut paused = confirmed(facts(300, five(1)), &["n0"]);
        paused.paused = true;
        let d = decide(&s, &paused);
        assert_eq!(d.suspension, Some(Suspension::Paused));
        assert!(matches!(d.actions[..], [Action::Hold { .. }]), "{d:?}");

        let mut warming = confirmed(facts(300, five(1)), &["n0"]);
        warming.watching_since = t(290);
        let d = decide(&s, &warming);
        assert_eq!(d.suspension, Some(Suspension::WarmingUp { until: t(320) }));
        assert!(d.actions.is_empty(), "no node is judged: {d:?}");

        // Two of five stale: not a storm (40 %), but over maxUnhealthy 1.
        let d = decide(&s, &confirmed(facts(300, five(2)), &["n0", "n1"]));
        assert_eq!(d.storm, Storm::Calm);
        assert_eq!(
            d.suspension,
            Some(Suspension::TooManyUnhealthy {
                unhealthy: 2,
                allowed: 1
            })
        );
        assert_eq!(d.actions.len(), 2);
        assert!(d.actions.iter().all(|a| matches!(
            a,
            Action::Hold {
                because: Suspension::TooManyUnhealthy { .. },
                ..
            }
        )));
        // Excluded and rebooting nodes are no candidates.
        let mut nodes = five(2);
        nodes[0].excluded = true;
        nodes[1].rebooting = true;
        let d = decide(&s, &confirmed(facts(300, nodes), &["n0", "n1"]));
        assert!(d.actions.is_empty(), "{d:?}");
        assert_eq!(d.suspension, None);
    }

    /// Scenario F of issue 26: three of five Leases stale at once is a storm; nothing is
    /// requested during it or its cooldown, and the check resumes after.
    #[test]
    fn a_storm_suspends_the_check_until_its_cooldown_has_passed() {
        let s = HealthSettings {
            max_unhealthy: MaxUnhealthy::Count(5),
            ..HealthSettings::default()
        };
        let nodes = |stale_ones: usize, now: i64| -> Vec<NodeFacts> {
            (0..5)
                .map(|i| {
                    node(
                        &format!("n{i}"),
                        if i < stale_ones { now - 60 } else { now },
                    )
                })
                .collect()
        };
        let all = ["n0", "n1", "n2", "n3", "n4"];
        // 3 of 5 stale: a storm starts.
        let d = decide(&s, &confirmed(facts(300, nodes(3, 300)), &all));
        assert_eq!(d.storm, Storm::Active { since: t(300) });
        assert_eq!(d.suspension, Some(Suspension::Storm { since: t(300) }));
        assert!(
            d.actions.iter().all(|a| matches!(a, Action::Hold { .. })),
            "{d:?}"
        );
        // Still 3: it keeps its start.
        let mut f = confirmed(facts(320, nodes(3, 320)), &all);
        f.storm = d.storm;
        let d = decide(&s, &f);
        assert_eq!(d.storm, Storm::Active { since: t(300) });
        // One left stale: the storm ends, cooldown 300 s.
        let mut f = confirmed(facts(400, nodes(1, 400)), &all);
        f.storm = d.storm;
        let d = decide(&s, &f);
        assert_eq!(d.storm, Storm::CoolingDown { until: t(700) });
        assert!(matches!(d.actions[..], [Action::Hold { .. }]), "{d:?}");
        // Inside the cooldown: held.
        let mut f = confirmed(facts(699, nodes(1, 699)), &all);
        f.storm = d.storm;
        let d = decide(&s, &f);
        assert_eq!(
            d.suspension,
            Some(Suspension::StormCoolingDown { until: t(700) })
        );
        // A storm again during the cooldown starts over.
        let mut f2 = confirmed(facts(650, nodes(4, 650)), &all);
        f2.storm = d.storm;
        assert_eq!(decide(&s, &f2).storm, Storm::Active { since: t(650) });
        // After the cooldown: calm, the remaining node is requested.
        let mut f = confirmed(facts(700, nodes(1, 700)), &all);
        f.storm = d.storm;
        let d = decide(&s, &f);
        assert_eq!(d.storm, Storm::Calm);
        assert_eq!(d.suspension, None);
        assert!(
            matches!(&d.actions[..], [Action::CreateRequest { node, .. }] if node == "n0"),
            "{d:?}"
        );
    }

    #[test]
    fn a_node_is_rebooting_until_the_latest_boot_timeout_of_its_entries() {
        let until = rebooting_until(
            [("a", t(0)), ("b", t(100)), ("a", t(50))],
            Duration::from_secs(1800),
        );
        assert_eq!(until.len(), 2);
        assert_eq!(until["a"], t(1850));
        assert_eq!(until["b"], t(1900));
        assert!(rebooting_until([], Duration::from_secs(1)).is_empty());
    }

    /// A storm's cooldown read back from the status after a restart still holds requests,
    /// even when the storm's Leases are all fresh again.
    #[test]
    fn a_cooldown_recorded_before_a_restart_still_holds() {
        let s = HealthSettings::default();
        let mut f = confirmed(facts(400, vec![node("a", 300), node("b", 400)]), &["a"]);
        f.watching_since = t(0);
        f.storm = Storm::CoolingDown { until: t(500) };
        let d = decide(&s, &f);
        assert_eq!(d.storm, Storm::CoolingDown { until: t(500) });
        assert_eq!(
            d.suspension,
            Some(Suspension::StormCoolingDown { until: t(500) })
        );
        assert!(matches!(d.actions[..], [Action::Hold { .. }]), "{d:?}");
    }

    #[test]
    fn one_stale_node_is_never_a_storm() {
        let s = HealthSettings::default();
        // One of one, one of two: a host failure, not a storm.
        for count in [1, 2] {
            let nodes: Vec<NodeFacts> = (0..count)
                .map(|i| node(&format!("n{i}"), if i == 0 { 200 } else { 300 }))
                .collect();
            let d = decide(&s, &confirmed(facts(300, nodes), &["n0"]));
            assert_eq!(d.storm, Storm::Calm, "{count}");
        }
        // Excluded nodes are not counted: they do not dilute the fraction.
        let mut nodes: Vec<NodeFacts> = (0..4)
            .map(|i| node(&format!("n{i}"), if i < 2 { 200 } else { 300 }))
            .collect();
        nodes[3].excluded = true;
        // 2 stale of 3 considered (67 %): a storm.
        let d = decide(&s, &facts(300, nodes));
        assert_eq!(d.storm, Storm::Active { since: t(300) });
    }
}
