//! Prometheus metrics, all prefixed `hostcycle_`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PowerActionLabels {
    /// `on` or `off`.
    pub action: String,
    /// `soft`, `hard` or `none` (power on).
    pub mode: String,
    /// `ok` or `error`.
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BmcRequestLabels {
    /// Driver name, e.g. `redfish`, `ipmi`.
    pub driver: String,
    /// `read_power`, `power_on`, `power_off`.
    pub operation: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BmcErrorLabels {
    pub driver: String,
    pub operation: String,
    /// Error class: `transient`, `auth`, `not_found`, `unsupported`, `credentials`, …
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub operational_status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
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
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    pub leader: Gauge,
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
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
        };
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
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        Arc::new(m)
    }
}

/// A registry whose metric names all start with `hostcycle_`.
pub fn new_registry() -> Registry {
    Registry::with_prefix("hostcycle")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
