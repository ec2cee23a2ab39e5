//! The health check controller: hostcycle's own detector of failed nodes (`HostHealthCheck`),
//! an alternative to Cluster API's MachineHealthCheck and medik8s' NodeHealthCheck, which keep
//! working as they do.
//!
//! One loop (observe → `hostcycle_core::health::decide` → record status → act) over the shared
//! cluster view's caches of HostHealthChecks, Nodes, HostRemediations, the reboot queue and the
//! kubelets' Leases in `kube-node-lease`. A Lease is judged by when *this process* saw it
//! change ([`facts::LeaseClock`], fed by the Lease watch as it delivers), never by its
//! `renewTime`; an unhealthy node is confirmed by live reads of its Lease and Node before its
//! request (a HostRemediation in the operator's namespace, owned by the check) is created.

pub mod controller;
pub mod facts;

use std::time::Duration;

pub use controller::run;

/// Settings of the health check controller.
#[derive(Debug, Clone)]
pub struct HealthControllerConfig {
    /// Where requests are created: the operator's namespace, whose requests may fence hosts
    /// of any namespace by default (`--remediation-request-namespaces`).
    pub request_namespace: String,
    /// How often every check is judged (staleness is a matter of time: nothing wakes the loop
    /// when a Lease stops).
    pub tick: Duration,
}

impl Default for HealthControllerConfig {
    fn default() -> Self {
        HealthControllerConfig {
            request_namespace: "default".into(),
            tick: Duration::from_secs(2),
        }
    }
}
