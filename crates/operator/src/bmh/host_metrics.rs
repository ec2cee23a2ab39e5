//! Per-host series for alerts: the hosts whose BMC is unhealthy and the hosts with a pending
//! reboot, each valued with the instant its state began (Unix seconds; `time() - x` is its
//! age in PromQL). Read from the hosts' status, so a new leader exports the same values the
//! old one did, and a series exists only while its host is in that state.

use std::collections::HashMap;

use hostcycle_api::reasons::condition;
use hostcycle_api::{BareMetalHost, BareMetalHostStatus, is_detached, is_paused};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use crate::metrics::HostConditionLabels;

/// The series of every host in one of the two states.
#[derive(Debug, Default, PartialEq)]
pub struct HostSeries {
    /// `BMCHealthy` False: its `lastTransitionTime`, by reason.
    pub bmc_unhealthy_since: HashMap<HostConditionLabels, i64>,
    /// `RebootPending` True: `pendingRebootSince`, by reason.
    pub reboot_pending_since: HashMap<HostConditionLabels, i64>,
}

fn find<'a>(status: &'a BareMetalHostStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// The series of `hosts`. Paused and detached hosts are left out: the controller does not
/// look at their BMC, so their conditions are old news.
pub fn host_series<'a>(hosts: impl IntoIterator<Item = &'a BareMetalHost>) -> HostSeries {
    let mut series = HostSeries::default();
    for host in hosts {
        let annotations = host.annotations();
        if is_paused(annotations) || is_detached(annotations) {
            continue;
        }
        let Some(status) = &host.status else { continue };
        let labels = |reason: &str| HostConditionLabels {
            host_namespace: host.namespace().unwrap_or_default(),
            host: host.name_any(),
            reason: reason.to_string(),
        };
        if let Some(c) = find(status, condition::BMC_HEALTHY)
            && c.status == condition::FALSE
        {
            series
                .bmc_unhealthy_since
                .insert(labels(&c.reason), c.last_transition_time.0.as_second());
        }
        if let Some(c) = find(status, condition::REBOOT_PENDING)
            && c.status == condition::TRUE
            && let Some(since) = status.provisioning.pending_reboot_since
        {
            series
                .reboot_pending_since
                .insert(labels(&c.reason), since.as_second());
        }
    }
    series
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn host(
        name: &str,
        annotations: serde_json::Value,
        status: serde_json::Value,
    ) -> BareMetalHost {
        serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": { "name": name, "namespace": "racks", "annotations": annotations },
            "spec": { "online": true },
            "status": status,
        }))
        .unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str, at: &str) -> serde_json::Value {
        json!({ "type": type_, "status": status, "reason": reason, "message": "",
                "lastTransitionTime": at })
    }

    fn labels(host: &str, reason: &str) -> HostConditionLabels {
        HostConditionLabels {
            host_namespace: "racks".into(),
            host: host.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn only_hosts_in_trouble_or_waiting_have_series() {
        let t0 = "2026-01-02T03:04:05Z";
        let t0_secs: i64 = 1_767_323_045;
        let hosts = [
            host(
                "healthy",
                json!({}),
                json!({ "conditions": [
                    condition("BMCHealthy", "True", "BMCResponding", t0),
                    condition("RebootPending", "False", "NoRebootPending", t0),
                ]}),
            ),
            host(
                "unreachable",
                json!({}),
                json!({ "conditions": [condition("BMCHealthy", "False", "BMCUnreachable", t0)] }),
            ),
            host(
                "rebooting",
                json!({}),
                json!({
                    "provisioning": { "pendingRebootSince": "2026-01-02T03:04:15.5Z" },
                    "conditions": [condition("RebootPending", "True", "AwaitingPowerOn", t0)],
                }),
            ),
            // Paused: the controller reads nothing from its BMC; the condition is stale.
            host(
                "paused",
                json!({ "baremetalhost.metal3.io/paused": "" }),
                json!({ "conditions": [condition("BMCHealthy", "False", "BMCError", t0)] }),
            ),
            // Pending per the condition but no pendingRebootSince: nothing to date it by.
            host(
                "undated",
                json!({}),
                json!({ "conditions": [condition("RebootPending", "True", "AwaitingPowerOff", t0)] }),
            ),
            host("new", json!({}), json!(null)),
        ];
        let series = host_series(&hosts);
        assert_eq!(
            series.bmc_unhealthy_since,
            HashMap::from([(labels("unreachable", "BMCUnreachable"), t0_secs)])
        );
        assert_eq!(
            series.reboot_pending_since,
            HashMap::from([(labels("rebooting", "AwaitingPowerOn"), t0_secs + 10)])
        );
    }
}
