//! The remediation controller: fence a failed machine (hard power-off), release its Node only
//! once the host is off, power it on, wait for the Node to rejoin — for Machines carrying
//! `host.metal3.io/external-remediation` (OpenShift's flow) and for `HostRemediation`
//! requests (Cluster API's MachineHealthCheck, medik8s' NodeHealthCheck).
//!
//! One loop (observe → `hostcycle_core::remediation::decide` → record → act), reading the
//! caches of the shared cluster view ([`crate::cluster`]) and woken by the changes its own
//! filters want: the record is written before each step's action (the request's status, or,
//! for the annotation flow, a ConfigMap in the operator's namespace — [`records`] — never the
//! Machine's annotations, which any editor of the Machine may write), so a restart at any
//! point resumes without a second power cycle and with the Node's labels intact. The host's
//! power evidence is the host controller's recorded BMC readings (`status.powerObservation`).

mod actions;
mod apply;
pub mod controller;
pub mod observe;
mod orphans;
pub mod records;
mod release;
mod status;

use std::time::Duration;

pub use controller::run;

/// Settings of the remediation controller.
#[derive(Debug, Clone)]
pub struct RemediationControllerConfig {
    /// Remediations in flight at once (power-off requested until the Node is back).
    pub max_concurrent: usize,
    /// How long the annotation flow waits for the Node after the power-on.
    pub power_on_timeout: Duration,
    /// How long a power-off may take to be confirmed (fresh evidence) before the flow holds
    /// with `CannotFence`.
    pub power_off_timeout: Duration,
    /// Look at every remediation at least this often.
    pub resync: Duration,
    /// Which namespaces' requests may fence which hosts.
    pub request_namespaces: hostcycle_core::remediation::RequestNamespaces,
    /// Which triggers are taken (`--remediation-triggers`).
    pub triggers: hostcycle_core::remediation::contracts::Triggers,
    /// Beyond this skew between this replica's clock and the API server's, time-based power
    /// evidence is refused (`--max-clock-skew`).
    pub max_clock_skew: Duration,
    /// The operator's namespace, where the annotation flow's records live.
    pub record_namespace: String,
}

impl Default for RemediationControllerConfig {
    fn default() -> Self {
        RemediationControllerConfig {
            max_concurrent: 1,
            power_on_timeout: Duration::from_secs(20 * 60),
            power_off_timeout: Duration::from_secs(5 * 60),
            resync: Duration::from_secs(30),
            request_namespaces: Default::default(),
            triggers: Default::default(),
            max_clock_skew: Duration::from_secs(2),
            record_namespace: "default".into(),
        }
    }
}
