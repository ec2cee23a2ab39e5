//! Prometheus metrics, all prefixed `hostcycle_`.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PowerActionLabels {
    /// `on` or `off`.
    pub action: String,
    /// `soft`, `hard` or `none` (power on).
    pub mode: String,
    /// `ok` or `error`.
    pub result: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BmcRequestLabels {
    /// Driver name, e.g. `redfish`, `ipmi`.
    pub driver: String,
    /// `read_power`, `power_on`, `power_off`, `reboot` (a BMC restart, `spec.disablePowerOff`).
    pub operation: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BmcErrorLabels {
    pub driver: String,
    pub operation: String,
    /// `BmcError::reason()`: `AuthenticationFailed`, `ConnectionFailed`, `Timeout`,
    /// `CertificateError`, `HttpError`, … (docs/metrics.md lists them).
    pub kind: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub operational_status: String,
}

/// One BareMetalHost in a state alerts care about. Not `namespace`: Prometheus' Kubernetes
/// discovery sets that target label to the operator's namespace.
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostConditionLabels {
    pub host_namespace: String,
    pub host: String,
    /// The condition's reason, e.g. `BMCUnreachable`, `AwaitingPowerOff`.
    pub reason: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// `fencing`, `action` or `steady` (the host controller's lanes).
    pub lane: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `Queued`, `Draining`, `Rebooting`, `Cancelled`.
    pub phase: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodePhaseLabels {
    pub node: String,
    pub phase: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// `evicted`, `not_found`, `refused` (429), `error`, `deleted` (deleted instead).
    pub result: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// The reboot queue's metrics (`hostcycle_reboot_queue_*`).
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    /// 1 while the queue is enabled.
    pub enabled: Gauge,
    /// 1 while this replica's controller processes the queue (enabled, leader).
    pub running: Gauge,
    /// Entries by phase.
    pub entries: Family<PhaseLabels, Gauge>,
    /// 1 for each queued node's current phase.
    pub node_phase: Family<NodePhaseLabels, Gauge>,
    /// Seconds from the `Draining` transition to drain complete.
    pub drain_duration: Histogram,
    /// Seconds from the `Rebooting` transition to the boot confirmed.
    pub reboot_duration: Histogram,
    /// Failed drains by reason (`timeout`, `eviction`, `job_pods`, `error`, `reboot_blocked`,
    /// `unsafe_node_address`, `ambiguous_node_address`).
    pub drain_backoffs: Family<ReasonLabels, Counter>,
    /// Evictions by result.
    pub evictions: Family<EvictionLabels, Counter>,
    /// Reboots not confirmed within `bootTimeoutSeconds`.
    pub boot_timeouts: Counter,
    /// Entries currently past `bootTimeoutSeconds`.
    pub boot_overdue: Gauge,
    /// Queued entries waiting out a drain backoff.
    pub backed_off: Gauge,
    /// Entries removed, by reason (`Completed`, `Cancelled`, `NodeNotFound`, `Duplicate`).
    pub dequeued: Family<ReasonLabels, Counter>,
}

impl QueueMetrics {
    fn new() -> Self {
        QueueMetrics {
            enabled: Gauge::default(),
            running: Gauge::default(),
            entries: Family::default(),
            node_phase: Family::default(),
            drain_duration: Histogram::new(exponential_buckets(0.5, 2.0, 14)),
            reboot_duration: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            drain_backoffs: Family::default(),
            evictions: Family::default(),
            boot_timeouts: Counter::default(),
            boot_overdue: Gauge::default(),
            backed_off: Gauge::default(),
            dequeued: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("reboot_queue");
        r.register(
            "enabled",
            "1 while the reboot queue is enabled",
            self.enabled.clone(),
        );
        r.register(
            "running",
            "1 while this replica processes the reboot queue",
            self.running.clone(),
        );
        r.register(
            "entries",
            "Reboot queue entries by phase",
            self.entries.clone(),
        );
        r.register(
            "node_phase",
            "1 for the current phase of each queued node",
            self.node_phase.clone(),
        );
        r.register(
            "drain_duration_seconds",
            "Time from the start of a drain to its completion",
            self.drain_duration.clone(),
        );
        r.register(
            "reboot_duration_seconds",
            "Time from the reboot request to the confirmed boot",
            self.reboot_duration.clone(),
        );
        r.register(
            "drain_backoffs",
            "Failed drains that backed off, by reason",
            self.drain_backoffs.clone(),
        );
        r.register(
            "evictions",
            "Pod evictions by result",
            self.evictions.clone(),
        );
        r.register(
            "boot_timeouts",
            "Reboots not confirmed within bootTimeoutSeconds",
            self.boot_timeouts.clone(),
        );
        r.register(
            "boot_overdue_entries",
            "Entries currently past bootTimeoutSeconds",
            self.boot_overdue.clone(),
        );
        r.register(
            "backed_off_entries",
            "Queued entries waiting out a drain backoff",
            self.backed_off.clone(),
        );
        r.register(
            "dequeued",
            "Entries removed from the queue, by reason",
            self.dequeued.clone(),
        );
    }
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemediationLabels {
    /// `annotation` (a Machine's `host.metal3.io/external-remediation`) or `request` (a
    /// HostRemediation).
    pub trigger: String,
    /// `succeeded`, `failed`, `cancelled`.
    pub result: String,
}

/// Remediation metrics (`hostcycle_remediation*`).
#[derive(Debug, Clone)]
pub struct RemediationMetrics {
    /// Remediations finished, by trigger and result.
    pub remediations: Family<RemediationLabels, Counter>,
    /// Remediations between power-off requested and the Node back.
    pub in_flight: Gauge,
    /// Remediations held because their host could not be confirmed off (`CannotFence`).
    pub cannot_fence: Gauge,
    /// Remediations holding their host off after the release (`afterRelease: LeaveOff`).
    pub left_off: Gauge,
    /// Trigger → power-off confirmed (the host's `poweredOn` false).
    pub time_to_fence: Histogram,
    /// Power-off confirmed → Node released (deleted and gone).
    pub time_to_release: Histogram,
    /// Trigger → Node back and Ready.
    pub time_to_recover: Histogram,
}

/// The `result` values of [`RemediationMetrics::remediations`].
pub const REMEDIATION_RESULTS: [&str; 3] = ["succeeded", "failed", "cancelled"];

impl RemediationMetrics {
    fn new() -> Self {
        // Every (trigger, result) starts at 0: an alert on `increase(…{result="failed"})`
        // sees the first failure only if the series existed before it.
        let remediations: Family<RemediationLabels, Counter> = Family::default();
        for trigger in [
            hostcycle_core::remediation::Trigger::MachineAnnotation,
            hostcycle_core::remediation::Trigger::Request,
        ] {
            for result in REMEDIATION_RESULTS {
                // The guard is dropped at once: creating the series is the point.
                drop(remediations.get_or_create(&RemediationLabels {
                    trigger: trigger.as_str().to_string(),
                    result: result.to_string(),
                }));
            }
        }
        RemediationMetrics {
            remediations,
            in_flight: Gauge::default(),
            cannot_fence: Gauge::default(),
            left_off: Gauge::default(),
            time_to_fence: Histogram::new(exponential_buckets(0.25, 2.0, 14)),
            time_to_release: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            time_to_recover: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "remediations",
            "Remediations finished, by trigger and result",
            self.remediations.clone(),
        );
        registry.register(
            "remediations_in_flight",
            "Remediations between power-off and the node back",
            self.in_flight.clone(),
        );
        registry.register(
            "remediations_cannot_fence",
            "Remediations held because their host was not confirmed off by its deadline",
            self.cannot_fence.clone(),
        );
        registry.register(
            "remediations_left_off",
            "Remediations holding their host off after releasing its workloads (afterRelease LeaveOff)",
            self.left_off.clone(),
        );
        registry.register(
            "remediation_time_to_fence_seconds",
            "Time from the trigger to the power-off confirmed",
            self.time_to_fence.clone(),
        );
        registry.register(
            "remediation_time_to_release_seconds",
            "Time from the power-off confirmed to the node released",
            self.time_to_release.clone(),
        );
        registry.register(
            "remediation_time_to_recover_seconds",
            "Time from the trigger to the node back and Ready",
            self.time_to_recover.clone(),
        );
    }
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    /// The HostHealthCheck's name.
    pub check: String,
}

#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckNodeStateLabels {
    pub check: String,
    /// `healthy`, `unhealthy`, `excluded`, `rebooting`, `warming_up`.
    pub state: String,
}

/// The `state` values of [`HealthMetrics::nodes`].
pub const HEALTH_NODE_STATES: [&str; 5] = [
    "healthy",
    "unhealthy",
    "excluded",
    "rebooting",
    "warming_up",
];

/// The health check's metrics (`hostcycle_health_check_*`).
#[derive(Debug, Clone, Default)]
pub struct HealthMetrics {
    /// Selected nodes by verdict.
    pub nodes: Family<CheckNodeStateLabels, Gauge>,
    /// 1 while a storm suspends the check.
    pub storm_active: Family<CheckLabels, Gauge>,
    /// 1 while no new request may be made (paused, warming up, storm, cooldown, too many
    /// unhealthy nodes).
    pub suspended: Family<CheckLabels, Gauge>,
    /// HostRemediations created.
    pub requests_created: Family<CheckLabels, Counter>,
    /// Finished HostRemediations deleted (their node healthy again).
    pub requests_deleted: Family<CheckLabels, Counter>,
}

impl HealthMetrics {
    fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("health_check");
        r.register(
            "nodes",
            "Nodes a HostHealthCheck selects, by verdict (healthy, unhealthy, excluded, rebooting, warming_up)",
            self.nodes.clone(),
        );
        r.register(
            "storm_active",
            "1 while a storm (too many stale Leases at once) suspends a HostHealthCheck",
            self.storm_active.clone(),
        );
        r.register(
            "suspended",
            "1 while a HostHealthCheck makes no new request (paused, warming up, storm, cooldown, maxUnhealthy)",
            self.suspended.clone(),
        );
        r.register(
            "requests_created",
            "HostRemediations a HostHealthCheck created",
            self.requests_created.clone(),
        );
        r.register(
            "requests_deleted",
            "Finished HostRemediations a HostHealthCheck deleted once their node was healthy again",
            self.requests_deleted.clone(),
        );
    }
}

/// Every metric the operator exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub power_actions: Family<PowerActionLabels, Counter>,
    /// Seconds from a reboot request (pendingRebootSince) until power is restored.
    pub reboot_duration: Histogram,
    pub bmc_request_duration: Family<BmcRequestLabels, Histogram>,
    pub bmc_errors: Family<BmcErrorLabels, Counter>,
    pub hosts: Family<StatusLabels, Gauge>,
    /// Hosts whose `BMCHealthy` condition is False: when it became False (Unix seconds).
    pub bmc_unhealthy_since: Family<HostConditionLabels, Gauge>,
    /// Hosts with a pending reboot (`RebootPending` True): `pendingRebootSince` (Unix
    /// seconds), by the condition's reason.
    pub reboot_pending_since: Family<HostConditionLabels, Gauge>,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Host reconciles waiting for a slot, by the lane they claim.
    pub lane_waiting: Family<LaneLabels, Gauge>,
    /// Slots of each lane held by running reconciles.
    pub lane_slots_in_use: Family<LaneLabels, Gauge>,
    pub leader: Gauge,
    /// The API server's clock minus this replica's, as last measured (seconds).
    pub clock_skew: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub queue: QueueMetrics,
    pub remediation: RemediationMetrics,
    pub health: HealthMetrics,
}

impl Metrics {
    /// Creates the metrics and registers them (the registry adds the `hostcycle_` prefix).
    pub fn register(registry: &mut Registry) -> Arc<Metrics> {
        let m = Metrics {
            power_actions: Family::default(),
            reboot_duration: Histogram::new(exponential_buckets(0.5, 2.0, 12)),
            bmc_request_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            bmc_errors: Family::default(),
            hosts: Family::default(),
            bmc_unhealthy_since: Family::default(),
            reboot_pending_since: Family::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            lane_waiting: Family::default(),
            lane_slots_in_use: Family::default(),
            leader: Gauge::default(),
            clock_skew: Gauge::default(),
            queue: QueueMetrics::new(),
            remediation: RemediationMetrics::new(),
            health: HealthMetrics::default(),
        };
        m.queue.register(registry);
        m.remediation.register(registry);
        m.health.register(registry);
        registry.register(
            "power_actions",
            "Power actions sent to BMCs, by action, mode and result",
            m.power_actions.clone(),
        );
        registry.register(
            "reboot_duration_seconds",
            "Time from a reboot request to power restored",
            m.reboot_duration.clone(),
        );
        registry.register(
            "bmc_request_duration_seconds",
            "Latency of BMC requests",
            m.bmc_request_duration.clone(),
        );
        registry.register(
            "bmc_errors",
            "BMC request errors by kind",
            m.bmc_errors.clone(),
        );
        registry.register(
            "hosts",
            "BareMetalHosts by operational status",
            m.hosts.clone(),
        );
        registry.register(
            "host_bmc_unhealthy_since_timestamp_seconds",
            "When the BMCHealthy condition of a host became False, by reason (hosts with a healthy BMC have no series)",
            m.bmc_unhealthy_since.clone(),
        );
        registry.register(
            "host_reboot_pending_since_timestamp_seconds",
            "pendingRebootSince of each host with a pending reboot, by the RebootPending reason",
            m.reboot_pending_since.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciliations by controller",
            m.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by controller",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "lane_waiting",
            "BareMetalHost reconciles waiting for a slot, by the lane they claim (fencing, action, steady)",
            m.lane_waiting.clone(),
        );
        registry.register(
            "lane_slots_in_use",
            "Slots of each BareMetalHost controller lane held by running reconciles",
            m.lane_slots_in_use.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "clock_skew_seconds",
            "The API server's clock minus this replica's, as last measured from its Date header",
            m.clock_skew.clone(),
        );
        Arc::new(m)
    }
}

/// A registry whose metric names all start with `hostcycle_`.
pub fn new_registry() -> Registry {
    Registry::with_prefix("hostcycle")
}

/// Makes `family` hold exactly `series`: labels set before (`previous`) and absent now are
/// removed, so a host that recovered has no series left.
pub fn set_series<L>(family: &Family<L, Gauge>, previous: &mut HashSet<L>, series: HashMap<L, i64>)
where
    L: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug,
{
    for gone in previous.iter().filter(|l| !series.contains_key(*l)) {
        family.remove(gone);
    }
    previous.clear();
    for (labels, value) in series {
        family.get_or_create(&labels).set(value);
        previous.insert(labels);
    }
}

/// The sample names the operator's `/metrics` can carry ([`exported_metrics`]): a counter
/// `x` is sampled as `x_total`, a histogram as `x_bucket`, `x_sum` and `x_count`. Alert
/// rules and dashboards are checked against this list.
pub fn exported_sample_names() -> Result<Vec<String>, std::fmt::Error> {
    let mut names = Vec::new();
    for metric in exported_metrics()? {
        match metric.kind.as_str() {
            "histogram" => names.extend(
                ["_bucket", "_sum", "_count"].map(|suffix| format!("{}{suffix}", metric.name)),
            ),
            "info" => names.push(format!("{}_info", metric.name)),
            _ => names.push(metric.name),
        }
    }
    names.sort();
    Ok(names)
}

/// The operator's registry with every metric registered, as `/metrics` serves it.
pub fn operator_registry() -> (Registry, Arc<Metrics>) {
    let mut registry = new_registry();
    let metrics = Metrics::register(&mut registry);
    (registry, metrics)
}

/// One metric as `/metrics` exports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedMetric {
    /// The name samples carry: `hostcycle_…`, counters with their `_total` suffix.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    pub help: String,
}

/// Every metric the operator exports, read back from the encoding of
/// [`operator_registry`] (no cluster needed): the list docs/metrics.md must cover.
pub fn exported_metrics() -> Result<Vec<ExportedMetric>, std::fmt::Error> {
    let (registry, metrics) = operator_registry();
    // The encoder skips families without samples: give each one a sample.
    touch_every_family(&metrics);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    let mut help = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = rest.split_once(' ') {
                help.insert(name.to_string(), text.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((family, kind)) = rest.split_once(' ')
        {
            let name = if kind == "counter" {
                format!("{family}_total")
            } else {
                family.to_string()
            };
            out.push(ExportedMetric {
                name,
                kind: kind.to_string(),
                help: help.get(family).cloned().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// One sample in every labelled family, so that encoding shows them all. A family added to
/// [`Metrics`] must be added here too; `exported_metrics_covers_every_registered_metric`
/// fails until it is.
fn touch_every_family(m: &Metrics) {
    let text = String::new;
    // `get_or_create` creates the sample; the guard it returns is dropped at once.
    let _ = m.power_actions.get_or_create(&PowerActionLabels {
        action: text(),
        mode: text(),
        result: text(),
    });
    let _ = m.bmc_request_duration.get_or_create(&BmcRequestLabels {
        driver: text(),
        operation: text(),
    });
    let _ = m.bmc_errors.get_or_create(&BmcErrorLabels {
        driver: text(),
        operation: text(),
        kind: text(),
    });
    let _ = m.hosts.get_or_create(&StatusLabels {
        operational_status: text(),
    });
    let _ = m.lane_waiting.get_or_create(&LaneLabels::default());
    let _ = m.lane_slots_in_use.get_or_create(&LaneLabels::default());
    let _ = m
        .bmc_unhealthy_since
        .get_or_create(&HostConditionLabels::default());
    let _ = m
        .reboot_pending_since
        .get_or_create(&HostConditionLabels::default());
    let controller = ControllerLabels { controller: text() };
    let _ = m.reconciles.get_or_create(&controller);
    let _ = m.reconcile_errors.get_or_create(&controller);
    let _ = m
        .queue
        .entries
        .get_or_create(&PhaseLabels { phase: text() });
    let _ = m.queue.node_phase.get_or_create(&NodePhaseLabels {
        node: text(),
        phase: text(),
    });
    let reason = ReasonLabels { reason: text() };
    let _ = m.queue.drain_backoffs.get_or_create(&reason);
    let _ = m.queue.dequeued.get_or_create(&reason);
    let _ = m
        .queue
        .evictions
        .get_or_create(&EvictionLabels { result: text() });
    let _ = m
        .remediation
        .remediations
        .get_or_create(&RemediationLabels {
            trigger: text(),
            result: text(),
        });
    let _ = m
        .health
        .nodes
        .get_or_create(&CheckNodeStateLabels::default());
    let check = CheckLabels::default();
    let _ = m.health.storm_active.get_or_create(&check);
    let _ = m.health.suspended.get_or_create(&check);
    let _ = m.health.requests_created.get_or_create(&check);
    let _ = m.health.requests_deleted.get_or_create(&check);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn exported_metrics_lists_every_family_with_its_sample_name() {
        let metrics = exported_metrics().unwrap();
        let find = |name: &str| metrics.iter().find(|m| m.name == name);
        let power = find("hostcycle_power_actions_total").unwrap();
        assert_eq!(power.kind, "counter");
        assert!(
            power.help.starts_with("Power actions sent to BMCs"),
            "{power:?}"
        );
        assert_eq!(find("hostcycle_leader").unwrap().kind, "gauge");
        assert_eq!(
            find("hostcycle_reboot_queue_drain_duration_seconds")
                .unwrap()
                .kind,
            "histogram"
        );
        assert!(find("hostcycle_remediations_total").is_some());
        assert!(metrics.iter().all(|m| m.name.starts_with("hostcycle_")));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn exported_metrics_covers_every_registered_metric() {
        // The registry's Debug output shows one Descriptor per registered metric, sampled
        // or not: the list must hold as many.
        let (registry, _metrics) = operator_registry();
        let registered = format!("{registry:?}").matches("Descriptor {").count();
        let exported = exported_metrics().unwrap();
        assert_eq!(
            exported.len(),
            registered,
            "a labelled family is missing from touch_every_family: {exported:#?}"
        );
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn every_metric_is_prefixed() {
        let mut registry = new_registry();
        let m = Metrics::register(&mut registry);
        m.power_actions
            .get_or_create(&PowerActionLabels {
                action: "off".into(),
                mode: "soft".into(),
                result: "ok".into(),
            })
            .inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(
                line.starts_with("hostcycle_"),
                "unprefixed metric line: {line}"
            );
        }
        assert!(text.contains(
            "hostcycle_power_actions_total{action=\"off\",mode=\"soft\",result=\"ok\"} 1"
        ));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn sample_names_cover_every_kind_of_metric() {
        let names = exported_sample_names().unwrap();
        for name in [
            "hostcycle_leader",
            "hostcycle_power_actions_total",
            "hostcycle_reboot_duration_seconds_bucket",
            "hostcycle_reboot_duration_seconds_sum",
            "hostcycle_reboot_duration_seconds_count",
            "hostcycle_reboot_queue_backed_off_entries",
            "hostcycle_reboot_queue_drain_backoffs_total",
            "hostcycle_remediations_total",
            "hostcycle_host_bmc_unhealthy_since_timestamp_seconds",
            "hostcycle_host_reboot_pending_since_timestamp_seconds",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{name} missing from {names:?}"
            );
        }
        // Counters are only ever sampled with `_total`.
        assert!(!names.iter().any(|n| n == "hostcycle_power_actions"));
        assert!(names.iter().all(|n| n.starts_with("hostcycle_")));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn set_series_removes_what_is_gone() {
        let family: Family<HostConditionLabels, Gauge> = Family::default();
        let labels = |host: &str, reason: &str| HostConditionLabels {
            host_namespace: "ns".into(),
            host: host.into(),
            reason: reason.into(),
        };
        let mut previous = HashSet::new();
        set_series(
            &family,
            &mut previous,
            HashMap::from([
                (labels("a", "BMCUnreachable"), 10),
                (labels("b", "BMCError"), 20),
            ]),
        );
        // a's reason changed, b recovered.
        set_series(
            &family,
            &mut previous,
            HashMap::from([(labels("a", "BMCError"), 10)]),
        );
        let mut registry = new_registry();
        registry.register("x", "x", family.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            ["hostcycle_x{host_namespace=\"ns\",host=\"a\",reason=\"BMCError\"} 10"]
        );
        assert_eq!(previous, HashSet::from([labels("a", "BMCError")]));
    }
}
