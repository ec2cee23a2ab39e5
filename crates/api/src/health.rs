//! `HostHealthCheck` (`hostcycle.io/v1alpha1`, cluster-scoped): hostcycle's own detector of
//! failed nodes, for clusters without Cluster API's MachineHealthCheck or medik8s'
//! NodeHealthCheck. It watches the selected Nodes' Leases in `kube-node-lease` and asks for
//! the remediation of a node whose Lease stopped (a `HostRemediation` in the operator's
//! namespace), with storm protection. The rules are `hostcycle_core::health`.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::remediation::RemediationStrategy;

/// Default `leaseStaleAfterSeconds`: two missed renewals of the kubelet's 10 s Lease.
pub const DEFAULT_LEASE_STALE_AFTER_SECONDS: u64 = 20;
/// Default `readyFalseAfterSeconds`.
pub const DEFAULT_READY_FALSE_AFTER_SECONDS: u64 = 120;
/// Default `maxUnhealthy`.
pub const DEFAULT_MAX_UNHEALTHY: &str = "40%";
/// Default `stormPercent`.
pub const DEFAULT_STORM_PERCENT: u8 = 50;
/// Default `stormCooldownSeconds`.
pub const DEFAULT_STORM_COOLDOWN_SECONDS: u64 = 300;
/// Default `repeatFailureWindowSeconds`.
pub const DEFAULT_REPEAT_FAILURE_WINDOW_SECONDS: u64 = 3600;
/// Most recoveries `status.recentRecoveries` keeps (the newest).
pub const MAX_RECORDED_RECOVERIES: usize = 200;
/// Default `warmUpSeconds`.
pub const DEFAULT_WARM_UP_SECONDS: u64 = 30;
/// Default `excludeLabel`: a Node carrying this label (any value) is never a candidate.
pub const DEFAULT_EXCLUDE_LABEL: &str = "hostcycle.io/exclude-from-health-check";
/// On a HostRemediation a health check created: the check's name.
pub const HEALTH_CHECK_LABEL: &str = "hostcycle.io/health-check";
/// The namespace of the kubelets' Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Most node names `status.unhealthyNodes` lists.
pub const MAX_LISTED_UNHEALTHY: usize = 50;

/// Detects failed nodes from their Leases and asks hostcycle to remediate them.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "hostcycle.io",
    version = "v1alpha1",
    kind = "HostHealthCheck",
    plural = "hosthealthchecks",
    singular = "hosthealthcheck",
    shortname = "hhc",
    status = "HostHealthCheckStatus",
    derive = "PartialEq",
    doc = "HostHealthCheck watches the selected Nodes' Leases and requests the remediation (a HostRemediation) of a node whose Lease stopped, with storm protection.",
    printcolumn(
        name = "Observed",
        type_ = "integer",
        json_path = ".status.observedNodes"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.healthyNodes"
    ),
    printcolumn(
        name = "Unhealthy",
        type_ = "integer",
        json_path = ".status.unhealthyNodeCount"
    ),
    printcolumn(name = "Storm", type_ = "boolean", json_path = ".status.storm.active"),
    printcolumn(
        name = "Suspended",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Suspended\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct HostHealthCheckSpec {
    /// The Nodes checked (`{}` selects every Node).
    pub selector: LabelSelector,
    /// A Lease hostcycle has not seen change for this long is stale (default 20: two missed
    /// renewals). Measured on hostcycle's clock, never against the Lease's `renewTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 3600))]
    pub lease_stale_after_seconds: Option<u64>,
    /// A Node whose `Ready` condition is `False` for this long is unhealthy too (default 120):
    /// a kubelet that still renews its Lease on a broken node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub ready_false_after_seconds: Option<u64>,
    /// With more unhealthy nodes than this (a count, or a percentage of the selected nodes
    /// like `40%`, the default), no new request is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent")]
    pub max_unhealthy: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// More than this percentage of the selected Leases stale at once (and at least two) is
    /// a storm — a control-plane or network failure, not hosts: nothing is requested until it
    /// ended and `stormCooldownSeconds` passed (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub storm_percent: Option<u8>,
    /// How long after a storm nothing is requested (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86400))]
    pub storm_cooldown_seconds: Option<u64>,
    /// After the operator starts or takes the leader Lease, how long it watches Leases before
    /// it judges any (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 3600))]
    pub warm_up_seconds: Option<u64>,
    /// A Node carrying this label (any value) is never a candidate (default
    /// `hostcycle.io/exclude-from-health-check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub exclude_label: Option<String>,
    /// A node that fails again within this many seconds of recovering from its last
    /// remediation (its finished request deleted because it was healthy again) is fenced and
    /// its workloads released as always, then its host is left off for a person
    /// (`afterRelease: LeaveOff` on the request) instead of being power-cycled again
    /// (default 3600; 0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 604800))]
    pub repeat_failure_window_seconds: Option<u64>,
    /// Make no new request (the check still watches, reports and deletes finished requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_requests: Option<bool>,
    /// The strategy copied into each request's `spec.strategy` (`release` defaults to
    /// `Auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<RemediationStrategy>,
}

/// `maxUnhealthy`: an integer, or a string (`3`, `40%`). The controller parses it and says
/// so in the `Ready` condition when it cannot.
fn int_or_percent(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": "^[0-9]+%?$",
        "minimum": 0,
    })
}

impl HostHealthCheckSpec {
    pub fn lease_stale_after_seconds(&self) -> u64 {
        self.lease_stale_after_seconds
            .unwrap_or(DEFAULT_LEASE_STALE_AFTER_SECONDS)
            .max(10)
    }

    pub fn ready_false_after_seconds(&self) -> u64 {
        self.ready_false_after_seconds
            .unwrap_or(DEFAULT_READY_FALSE_AFTER_SECONDS)
            .max(10)
    }

    pub fn storm_percent(&self) -> u8 {
        self.storm_percent
            .unwrap_or(DEFAULT_STORM_PERCENT)
            .clamp(1, 100)
    }

    pub fn storm_cooldown_seconds(&self) -> u64 {
        self.storm_cooldown_seconds
            .unwrap_or(DEFAULT_STORM_COOLDOWN_SECONDS)
    }

    pub fn repeat_failure_window_seconds(&self) -> u64 {
        self.repeat_failure_window_seconds
            .unwrap_or(DEFAULT_REPEAT_FAILURE_WINDOW_SECONDS)
    }

    pub fn warm_up_seconds(&self) -> u64 {
        self.warm_up_seconds.unwrap_or(DEFAULT_WARM_UP_SECONDS)
    }

    pub fn exclude_label(&self) -> &str {
        self.exclude_label
            .as_deref()
            .filter(|l| !l.is_empty())
            .unwrap_or(DEFAULT_EXCLUDE_LABEL)
    }

    /// `maxUnhealthy` as text (`3`, `40%`), the default when unset.
    pub fn max_unhealthy_text(&self) -> String {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        match &self.max_unhealthy {
            Some(IntOrString::Int(n)) => n.to_string(),
            Some(IntOrString::String(s)) => s.clone(),
            None => DEFAULT_MAX_UNHEALTHY.to_string(),
        }
    }

    /// The strategy of each request: the check's, `release` defaulting to `Auto`; a repeated
    /// failure's request leaves its host off after the release.
    pub fn request_strategy(&self, repeated_failure: bool) -> RemediationStrategy {
        let mut strategy = self.remediation.clone().unwrap_or_default();
        if strategy.release.is_none() {
            strategy.release = Some(crate::remediation::release_strategy::AUTO.to_string());
        }
        if repeated_failure {
            strategy.after_release = Some(crate::remediation::after_release::LEAVE_OFF.into());
        }
        strategy
    }
}

/// The storm state, recorded so that a restart keeps the cooldown.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StormStatus {
    /// A storm is under way: nothing is requested.
    #[serde(default)]
    pub active: bool,
    /// When the storm began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// After a storm: nothing is requested before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_until: Option<Timestamp>,
    /// Selected Leases stale at the last pass.
    #[serde(default)]
    pub stale_count: u32,
}

/// A node's recovery from a remediation of the check.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecovery {
    pub node: String,
    /// When its finished request was deleted because it was healthy again.
    pub at: Timestamp,
}

/// What the check saw and decided last.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostHealthCheckStatus {
    /// The `metadata.generation` the status was decided from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the selector selects.
    #[serde(default)]
    pub observed_nodes: u32,
    /// Selected nodes judged healthy.
    #[serde(default)]
    pub healthy_nodes: u32,
    /// Selected nodes judged unhealthy.
    #[serde(default)]
    pub unhealthy_node_count: u32,
    /// The unhealthy nodes' names (at most 50, sorted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm: Option<StormStatus>,
    /// Nodes that recovered from a remediation within `repeatFailureWindowSeconds` (at most
    /// 200, the newest): one of them failing again is left off after its release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_recoveries: Vec<NodeRecovery>,
    /// In words: what the last pass decided (requests made, held or deleted, and why).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_decision: String,
    /// When `lastDecision` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision_time: Option<Timestamp>,
    /// `Ready` (the spec is usable and the check judges nodes) and `Suspended` (no new
    /// request may be made: paused, warming up, a storm or its cooldown, or too many
    /// unhealthy nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The name of the request `check` makes for `node`: `<check>-<node>`, deterministic so a
/// restart never makes a second one; a name too long for an object (253) is cut and ends
/// with a hash of both names.
pub fn request_name(check: &str, node: &str) -> String {
    const MAX: usize = 253;
    let name = format!("{check}-{node}");
    if name.len() <= MAX {
        return name;
    }
    let hash = short_hash(&format!("{check}\0{node}"));
    let mut keep = MAX - hash.len() - 1;
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    let prefix = name[..keep].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

/// 16 hex digits of a stable hash of `text`, to keep cut names unique.
pub fn short_hash(text: &str) -> String {
    format!("{:016x}", fnv1a(text))
}

/// FNV-1a, 64 bits: stable across builds and releases (unlike `DefaultHasher`).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_names_are_deterministic_and_bounded() {
        assert_eq!(request_name("workers", "node-1"), "workers-node-1");
        let long_node = "n".repeat(253);
        let a = request_name("workers", &long_node);
        assert_eq!(a.len(), 253);
        assert_eq!(a, request_name("workers", &long_node));
        assert_ne!(a, request_name("workers", &"n".repeat(252)));
        assert_ne!(a, request_name("others", &long_node));
        assert!(a.starts_with("workers-nnn"));
        // Dots and dashes never end the cut prefix.
        let dotted = format!("{}.x", "a".repeat(230));
        let b = request_name("c", &format!("{dotted}{}", "-".repeat(40)));
        assert!(!b.contains(".-") && !b.contains("--"), "{b}");
    }

    #[test]
    fn defaults_apply_to_absent_fields() {
        let spec: HostHealthCheckSpec =
            serde_json::from_value(serde_json::json!({ "selector": {} })).unwrap();
        assert_eq!(spec.lease_stale_after_seconds(), 20);
        assert_eq!(spec.ready_false_after_seconds(), 120);
        assert_eq!(spec.max_unhealthy_text(), "40%");
        assert_eq!(spec.storm_percent(), 50);
        assert_eq!(spec.storm_cooldown_seconds(), 300);
        assert_eq!(spec.warm_up_seconds(), 30);
        assert_eq!(spec.exclude_label(), DEFAULT_EXCLUDE_LABEL);
        assert_eq!(
            spec.request_strategy(false).release.as_deref(),
            Some("Auto")
        );
        assert_eq!(spec.request_strategy(false).after_release, None);
        assert_eq!(
            spec.request_strategy(true).after_release.as_deref(),
            Some("LeaveOff")
        );
        assert_eq!(spec.repeat_failure_window_seconds(), 3600);
        let spec: HostHealthCheckSpec = serde_json::from_value(serde_json::json!({
            "selector": {}, "maxUnhealthy": 2,
            "remediation": { "release": "DeleteNode", "retryLimit": 3 },
        }))
        .unwrap();
        assert_eq!(spec.max_unhealthy_text(), "2");
        let strategy = spec.request_strategy(false);
        assert_eq!(strategy.release.as_deref(), Some("DeleteNode"));
        assert_eq!(strategy.retry_limit, Some(3));
    }
}
