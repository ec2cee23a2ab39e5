//! The node simulator: plays the kubelet for simulated bare-metal hosts.
//!
//! Each host follows its BMC's power state, read through hostcycle's BMC layer
//! ([`hostcycle_bmc::PowerDriver`]), as the operator reads it:
//! - powered **on** → after a boot delay, registers (or re-registers) its Node, posts Ready,
//!   renews its node Lease, runs the pods bound to it (Running/Ready) and finalizes pods being
//!   deleted after their grace period;
//! - powered **off** → stops every heartbeat and pod update, so the real node-lifecycle
//!   controller marks the Node NotReady/Unknown.
//!
//! The per-host lifecycle is a pure state machine ([`lifecycle`]); [`kubelet`] does the I/O.
//!
//! Volumes: the kubelet reports its pods' CSI volumes in `status.volumesInUse` and starts a pod
//! only once kube-controller-manager's attach/detach controller lists them in
//! `status.volumesAttached` ([`volumes`]); running pods write to the [`storage`] simulator,
//! which the simulated CSI driver ([`attacher`]) attaches and detaches. Kubelet faults
//! ([`fault`]) are switched at run time through [`SimControl`].

pub mod attacher;
pub mod cli;
pub mod fault;
pub mod kubelet;
pub mod lifecycle;
pub mod power;
pub mod storage;
pub mod volumes;

use std::time::Duration;

pub use attacher::{
    CsiSimConfig, CsiSimHandle, SIM_ATTACHER_FINALIZER, SIM_CSI_DRIVER, SIM_STORAGE_CLASS,
    install_csi_driver, start_csi_sim,
};
pub use fault::{Fault, SimControl, UnknownHost};
pub use kubelet::{NodeSimulator, SimHandle, SimHost};
pub use lifecycle::{HostLifecycle, LifecycleAction};
pub use power::{HostPower, bmc_connector, host_power};
pub use storage::{Ledger, StorageSim, Violation};

/// Timing and shape of the simulated kubelets.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Time from power-on until the kubelet registers and reports Ready.
    pub boot_delay: Duration,
    /// How often the power state is read.
    pub power_poll_interval: Duration,
    /// How often the node Lease is renewed (the node-lifecycle controller's heartbeat).
    pub lease_renew_interval: Duration,
    /// How often the Node's Ready condition is re-posted when nothing changed.
    pub status_interval: Duration,
    /// How often pods bound to the node are reconciled.
    pub pod_sync_interval: Duration,
    /// How long containers take to exit after a pod is deleted (capped by its grace period).
    pub pod_shutdown_delay: Duration,
    /// How often a running pod with an attached volume writes to the storage simulator.
    pub volume_write_interval: Duration,
    pub capacity_cpu: String,
    pub capacity_memory: String,
    pub capacity_pods: String,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            boot_delay: Duration::from_secs(2),
            power_poll_interval: Duration::from_millis(500),
            lease_renew_interval: Duration::from_secs(2),
            status_interval: Duration::from_secs(10),
            pod_sync_interval: Duration::from_secs(1),
            pod_shutdown_delay: Duration::from_secs(1),
            volume_write_interval: Duration::from_millis(250),
            capacity_cpu: "8".into(),
            capacity_memory: "32Gi".into(),
            capacity_pods: "110".into(),
        }
    }
}

/// A Node's Ready condition: `Some(true)` when Ready, `Some(false)` when NotReady or Unknown
/// (the node-lifecycle controller's verdict on a silent kubelet), `None` before any report.
pub fn node_ready(node: &k8s_openapi::api::core::v1::Node) -> Option<bool> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some(ready.status == "True")
}
