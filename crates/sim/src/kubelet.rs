//! The I/O shell of the simulator: one task per host, doing what a kubelet does against the
//! API server while its host has power.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::SimConfig;
use crate::fault::{Fault, FaultSwitch, SimControl, UnknownHost};
use crate::lifecycle::{HostLifecycle, LifecycleAction, step};
use crate::power::read_power;
use crate::storage::StorageSim;
use crate::volumes::{CONTROLLER_MANAGED_ATTACH_DETACH, CsiVolume, PodVolumes, plan_volumes};
use hostcycle_bmc::PowerDriver;

const FIELD_MANAGER: &str = "hostcycle-sim";
/// Pod deletions or status updates one simulated kubelet sends at once.
const POD_CALLS_IN_FLIGHT: usize = 16;
/// Label marking Nodes that the simulator plays.
pub const SIMULATED_LABEL: &str = "hostcycle.io/simulated";

/// One simulated host: the Node it registers and the BMC it follows.
#[derive(Clone)]
pub struct SimHost {
    pub node_name: String,
    pub control_plane: bool,
    /// Address reported in the Node's status.
    pub internal_ip: String,
    /// The host's BMC: the power it reports is the power the host has.
    pub bmc: Arc<dyn PowerDriver>,
}

impl std::fmt::Debug for SimHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHost")
            .field("node_name", &self.node_name)
            .field("control_plane", &self.control_plane)
            .field("bmc", &self.bmc.description().to_string())
            .finish()
    }
}

/// Runs every simulated host until cancelled.
pub struct NodeSimulator {
    client: Client,
    config: SimConfig,
    hosts: Vec<SimHost>,
    storage: Option<StorageSim>,
}

/// A running simulator; dropping it stops every host task.
#[derive(Debug)]
pub struct SimHandle {
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    control: SimControl,
}

impl SimHandle {
    /// A cloneable handle switching kubelet faults of the running hosts.
    pub fn control(&self) -> SimControl {
        self.control.clone()
    }

    /// Gives `node_name`'s kubelet `fault`; see [`Fault`]. It ends when the host loses power.
    pub fn set_fault(&self, node_name: &str, fault: Fault) -> Result<(), UnknownHost> {
        self.control.set_fault(node_name, fault)
    }

    /// Stops all host tasks and waits for them.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl NodeSimulator {
    pub fn new(client: Client, config: SimConfig, hosts: Vec<SimHost>) -> Self {
        NodeSimulator {
            client,
            config,
            hosts,
            storage: None,
        }
    }

    /// Running pods with attached CSI volumes write to `storage` (without it they run but
    /// write nowhere).
    pub fn with_storage(mut self, storage: StorageSim) -> Self {
        self.storage = Some(storage);
        self
    }

    /// Starts one task per host on the current runtime.
    pub fn spawn(self) -> SimHandle {
        let cancel = CancellationToken::new();
        let mut faults = BTreeMap::new();
        let tasks = self
            .hosts
            .into_iter()
            .enumerate()
            .map(|(index, host)| {
                let fault = FaultSwitch::default();
                faults.insert(host.node_name.clone(), fault.clone());
                let mut kubelet =
                    SimKubelet::new(self.client.clone(), self.config.clone(), host, index);
                kubelet.fault = fault;
                kubelet.storage = self.storage.clone();
                tokio::spawn(kubelet.run(cancel.clone()))
            })
            .collect();
        SimHandle {
            cancel,
            tasks,
            control: SimControl::new(faults),
        }
    }

    /// Runs until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let handle = self.spawn();
        cancel.cancelled().await;
        handle.stop().await;
    }
}

struct SimKubelet {
    nodes: Api<Node>,
    pods: Api<Pod>,
    leases: Api<Lease>,
    config: SimConfig,
    host: SimHost,
    index: usize,
    state: HostLifecycle,
    boots: u32,
    node_uid: Option<String>,
    booted_at: Timestamp,
    last_lease: Option<Instant>,
    last_status: Option<Instant>,
    last_pod_sync: Option<Instant>,
    /// Pods (by UID) whose containers run in the current boot.
    started_pods: HashSet<String>,
    next_ip: u32,
    last_power_error: Option<String>,
    /// Set by the pod watch: a pod bound to this node changed (a real kubelet watches its
    /// pods, so it starts and stops them at once, not at the next periodic sync).
    pods_changed: Arc<tokio::sync::Notify>,
    pods_dirty: bool,
    /// When each terminating pod was first seen terminating.
    terminating_since: std::collections::HashMap<String, Timestamp>,
    /// The node's pods as the watch last saw them (filled once the watch has listed them).
    pod_store: kube::runtime::reflector::Store<Pod>,
    pod_store_writer: Option<kube::runtime::reflector::store::Writer<Pod>>,
    pod_store_ready: Arc<std::sync::atomic::AtomicBool>,
    /// When the next terminating pod's containers exit.
    next_pod_exit: Option<Timestamp>,
    last_power_read: Option<Instant>,
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
    fault: FaultSwitch,
    /// The fault the kubelet last acted under, to log changes once.
    acting_fault: Fault,
    storage: Option<StorageSim>,
    /// Each started pod's CSI volumes, resolved once its claims were bound (by pod UID).
    pod_csi_volumes: HashMap<String, Vec<CsiVolume>>,
    /// The writing containers of running pods (by pod UID); they write while the host has
    /// power, whatever the kubelet's fault.
    writers: HashMap<String, CancellationToken>,
    /// Parent of every writer: cancelled with the simulator.
    writers_parent: CancellationToken,
    /// `status.volumesInUse` as last posted in this boot.
    reported_in_use: Option<BTreeSet<String>>,
    /// The last volumesInUse logged, so that only changes are logged.
    logged_in_use: BTreeSet<String>,
}

impl SimKubelet {
    fn new(client: Client, config: SimConfig, host: SimHost, index: usize) -> Self {
        let pod_store_writer = kube::runtime::reflector::store::Writer::<Pod>::default();
        let pod_store = pod_store_writer.as_reader();
        SimKubelet {
            nodes: Api::all(client.clone()),
            pods: Api::all(client.clone()),
            claims: Api::all(client.clone()),
            volumes: Api::all(client.clone()),
            leases: Api::namespaced(client, "kube-node-lease"),
            config,
            host,
            index,
            state: HostLifecycle::Off,
            boots: 0,
            node_uid: None,
            booted_at: Timestamp::now(),
            last_lease: None,
            last_status: None,
            last_pod_sync: None,
            started_pods: HashSet::new(),
            next_ip: 2,
            last_power_error: None,
            pods_changed: Arc::new(tokio::sync::Notify::new()),
            pods_dirty: false,
            terminating_since: std::collections::HashMap::new(),
            pod_store,
            pod_store_writer: Some(pod_store_writer),
            pod_store_ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            next_pod_exit: None,
            last_power_read: None,
            fault: FaultSwitch::default(),
            acting_fault: Fault::None,
            storage: None,
            pod_csi_volumes: HashMap::new(),
            writers: HashMap::new(),
            writers_parent: CancellationToken::new(),
            reported_in_use: None,
            logged_in_use: BTreeSet::new(),
        }
    }

    async fn run(mut self, cancel: CancellationToken) {
        let node = self.host.node_name.clone();
        tracing::info!(node = %node, bmc = %self.host.bmc.description(), "simulated host started");
        self.writers_parent = cancel.child_token();
        let watch = match self.pod_store_writer.take() {
            Some(writer) => tokio::spawn(watch_pods(
                self.pods.clone(),
                node.clone(),
                writer,
                self.pods_changed.clone(),
                self.pod_store_ready.clone(),
            )),
            None => tokio::spawn(async {}),
        };
        loop {
            let wait = self.next_wait();
            let changed = self.pods_changed.clone();
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                _ = changed.notified() => self.pods_dirty = true,
            }
            self.tick().await;
        }
        watch.abort();
        self.stop_all_writers();
        tracing::info!(node = %node, "simulated host stopped");
    }

    /// Until the next power read or the next pod exit, whichever comes first.
    fn next_wait(&self) -> Duration {
        let power = self
            .last_power_read
            .map(|t| self.config.power_poll_interval.saturating_sub(t.elapsed()))
            .unwrap_or_default();
        let exit = self
            .next_pod_exit
            .map(|at| Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default());
        exit.map_or(power, |e| e.min(power))
    }

    async fn tick(&mut self) {
        if !due(
            self.last_power_read,
            self.config.power_poll_interval,
            Instant::now(),
        ) {
            if let HostLifecycle::Running { .. } = self.state
                && self.kubelet_healthy()
            {
                self.kubelet_work().await;
            }
            return;
        }
        self.last_power_read = Some(Instant::now());
        let observed = match read_power(self.host.bmc.as_ref()).await {
            Ok(p) => {
                self.last_power_error = None;
                p
            }
            Err(e) => {
                if self.last_power_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(node = %self.host.node_name, error = %e, "cannot read power state; keeping current state");
                    self.last_power_error = Some(e);
                }
                None
            }
        };
        let (next, action) = step(
            self.state,
            self.boots,
            observed,
            Instant::now(),
            self.config.boot_delay,
        );
        self.state = next;
        match action {
            Some(LifecycleAction::Boot { boot }) => {
                self.boots = boot;
                self.booted_at = Timestamp::now();
                self.started_pods.clear();
                self.terminating_since.clear();
                self.node_uid = None;
                self.last_lease = None;
                self.last_status = None;
                self.last_pod_sync = None;
                self.reported_in_use = None;
                tracing::info!(node = %self.host.node_name, boot, "host booted; kubelet starting");
            }
            Some(LifecycleAction::Halt) => {
                self.stop_all_writers();
                tracing::info!(node = %self.host.node_name, "host lost power; kubelet silent, writes stopped");
            }
            None => {}
        }
        if self.state == HostLifecycle::Off && self.fault.get() != Fault::None {
            // No kubelet fault survives a power loss: the next boot starts a healthy one.
            self.fault.set(Fault::None);
            tracing::info!(node = %self.host.node_name, "kubelet fault ends with the power loss");
        }
        if let HostLifecycle::Running { .. } = self.state
            && self.kubelet_healthy()
        {
            self.kubelet_work().await;
        }
    }

    /// Whether the kubelet may talk to the API server now; logs fault changes once.
    fn kubelet_healthy(&mut self) -> bool {
        let fault = self.fault.get();
        if fault != self.acting_fault {
            // Whatever happened to the Node while the kubelet was away, post volumes again.
            self.reported_in_use = None;
            match fault {
                Fault::None => {
                    tracing::info!(node = %self.host.node_name, was = ?self.acting_fault, "kubelet healthy again")
                }
                Fault::KubeletDead => {
                    tracing::info!(node = %self.host.node_name, "kubelet dead: no API calls; containers keep running")
                }
                Fault::Partitioned => {
                    tracing::info!(node = %self.host.node_name, "kubelet partitioned from the API server; containers keep running")
                }
            }
            self.acting_fault = fault;
        }
        fault == Fault::None
    }

    fn stop_all_writers(&mut self) {
        for (_, writer) in self.writers.drain() {
            writer.cancel();
        }
    }

    fn stop_writer(&mut self, pod_uid: &str) {
        if let Some(writer) = self.writers.remove(pod_uid) {
            writer.cancel();
        }
    }

    /// Starts the writing container of a running pod with volumes, once.
    fn ensure_writer(&mut self, pod_uid: &str) {
        let Some(storage) = self.storage.clone() else {
            return;
        };
        let Some(volumes) = self.pod_csi_volumes.get(pod_uid) else {
            return;
        };
        if volumes.is_empty() || self.writers.contains_key(pod_uid) {
            return;
        }
        let token = self.writers_parent.child_token();
        let handles: Vec<String> = volumes.iter().map(|v| v.volume_handle.clone()).collect();
        let host = self.host.node_name.clone();
        let every = self.config.volume_write_interval;
        let stop = token.clone();
        tokio::spawn(async move {
            loop {
                for handle in &handles {
                    storage.write(handle, &host);
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        });
        self.writers.insert(pod_uid.to_string(), token);
    }

    /// The pod's CSI volumes: `Some(empty)` without claims, `None` while a claim is unbound or
    /// cannot be read (the pod waits, as a kubelet's volume manager does).
    async fn resolve_csi_volumes(&mut self, pod: &Pod) -> Option<Vec<CsiVolume>> {
        let uid = pod.metadata.uid.clone()?;
        if let Some(known) = self.pod_csi_volumes.get(&uid) {
            return Some(known.clone());
        }
        let namespace = pod.metadata.namespace.clone()?;
        let claims: Vec<String> = pod
            .spec
            .as_ref()?
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect();
        let mut resolved = Vec::new();
        for claim_name in claims {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.claims.clone().into_client(), &namespace);
            let claim = match claims.get(&claim_name).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(node = %self.host.node_name, claim = %claim_name, error = %e, "claim not readable yet");
                    return None;
                }
            };
            let pv_name = claim
                .spec
                .and_then(|s| s.volume_name)
                .filter(|v| !v.is_empty())?;
            let pv = match self.volumes.get(&pv_name).await {
                Ok(pv) => pv,
                Err(e) => {
                    tracing::debug!(node = %self.host.node_name, pv = %pv_name, error = %e, "volume not readable yet");
                    return None;
                }
            };
            if let Some(csi) = pv.spec.and_then(|s| s.csi) {
                resolved.push(CsiVolume {
                    driver: csi.driver,
                    volume_handle: csi.volume_handle,
                });
            }
        }
        self.pod_csi_volumes.insert(uid, resolved.clone());
        Some(resolved)
    }

    /// The Node's `status.volumesAttached` names, as the attach/detach controller posted them.
    async fn volumes_attached(&self) -> Result<BTreeSet<String>, kube::Error> {
        let node = match self.nodes.get_status(&self.host.node_name).await {
            Ok(node) => node,
            // Deleted under a running host: nothing is attached to a Node that is gone.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(BTreeSet::new()),
            Err(e) => return Err(e),
        };
        Ok(node
            .status
            .and_then(|s| s.volumes_attached)
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect())
    }

    /// Posts `status.volumesInUse` when it changed in this boot.
    async fn report_volumes_in_use(&mut self, in_use: BTreeSet<String>) -> Result<(), kube::Error> {
        if self.reported_in_use.as_ref() == Some(&in_use) {
            return Ok(());
        }
        let list: Vec<&String> = in_use.iter().collect();
        let patch = json!({ "status": { "volumesInUse": if list.is_empty() { serde_json::Value::Null } else { json!(list) } } });
        match self
            .nodes
            .patch_status(
                &self.host.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) if self.logged_in_use != in_use => {
                tracing::info!(node = %self.host.node_name, volumes_in_use = ?in_use, "volumesInUse posted");
                self.logged_in_use = in_use.clone();
            }
            Ok(_) => {}
            // The Node was deleted while the host runs; it comes back at the next boot, and
            // pods must still be stopped and started meanwhile.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.reported_in_use = Some(in_use);
        Ok(())
    }

    async fn kubelet_work(&mut self) {
        let now = Instant::now();
        if self.node_uid.is_none() {
            match self.register().await {
                Ok(uid) => {
                    tracing::info!(node = %self.host.node_name, "node registered and Ready");
                    self.node_uid = Some(uid);
                    self.last_status = Some(now);
                }
                Err(e) => {
                    tracing::warn!(node = %self.host.node_name, error = %e, "node registration failed; retrying");
                    return;
                }
            }
        }
        if due(self.last_lease, self.config.lease_renew_interval, now) {
            match self.renew_lease().await {
                Ok(()) => self.last_lease = Some(now),
                Err(e) => {
                    tracing::warn!(node = %self.host.node_name, error = %e, "lease renewal failed")
                }
            }
        }
        if due(self.last_status, self.config.status_interval, now) {
            match self.post_status().await {
                Ok(()) => {
                    self.last_status = Some(now);
                    // A kubelet's periodic status carries volumesInUse too: post it again at
                    // the next pod sync, in case someone else changed it meanwhile.
                    self.reported_in_use = None;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // A real kubelet does not re-register a Node deleted under it; it does
                    // after its next boot. Do the same.
                    tracing::warn!(node = %self.host.node_name, "Node was deleted while the host runs; it re-registers after the next boot");
                    self.last_status = Some(now);
                }
                Err(e) => {
                    tracing::warn!(node = %self.host.node_name, error = %e, "node status update failed")
                }
            }
        }
        let exit_due = self.next_pod_exit.is_some_and(|at| Timestamp::now() >= at);
        if self.pods_dirty
            || exit_due
            || due(self.last_pod_sync, self.config.pod_sync_interval, now)
        {
            self.pods_dirty = false;
            if let Err(e) = self.sync_pods().await {
                tracing::warn!(node = %self.host.node_name, error = %e, "pod sync failed");
            }
            self.last_pod_sync = Some(now);
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (
                "kubernetes.io/hostname".to_string(),
                self.host.node_name.clone(),
            ),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            (SIMULATED_LABEL.to_string(), "true".to_string()),
        ]);
        if self.host.control_plane {
            labels.insert(
                "node-role.kubernetes.io/control-plane".into(),
                String::new(),
            );
        }
        labels
    }

    /// Creates the Node (or adopts an existing one) and posts its status. Returns its UID.
    async fn register(&mut self) -> Result<String, kube::Error> {
        let name = self.host.node_name.clone();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(self.labels()),
                annotations: Some(BTreeMap::from([(
                    CONTROLLER_MANAGED_ATTACH_DETACH.to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = match self.nodes.create(&PostParams::default(), &node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = json!({ "metadata": {
                    "labels": self.labels(),
                    "annotations": { CONTROLLER_MANAGED_ATTACH_DETACH: "true" },
                } });
                self.nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?
            }
            Err(e) => return Err(e),
        };
        self.post_status().await?;
        created.metadata.uid.ok_or_else(|| {
            kube::Error::Api(
                kube::core::Status::failure("created Node has no uid", "Invalid").boxed(),
            )
        })
    }

    async fn post_status(&self) -> Result<(), kube::Error> {
        let now = Timestamp::now().to_string();
        let booted = self.booted_at.to_string();
        let resources = json!({
            "cpu": self.config.capacity_cpu,
            "memory": self.config.capacity_memory,
            "pods": self.config.capacity_pods,
            "ephemeral-storage": "100Gi",
        });
        let condition = |type_: &str, status: &str, reason: &str, message: &str| {
            json!({ "type": type_, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": booted })
        };
        let status = json!({ "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "hostcycle simulated kubelet is posting ready status"),
            ],
            "addresses": [
                { "type": "InternalIP", "address": self.host.internal_ip },
                { "type": "Hostname", "address": self.host.node_name },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": format!("sim-{}", self.host.node_name), "systemUUID": format!("sim-{}", self.host.node_name),
                "bootID": format!("{}-{}", self.host.node_name, self.boots),
                "kernelVersion": "6.1.0-hostcycle-sim", "osImage": "hostcycle simulated host",
                "containerRuntimeVersion": "sim://1.0", "kubeletVersion": "v1.20.2-hostcycle-sim",
                "kubeProxyVersion": "v1.20.2-hostcycle-sim", "operatingSystem": "linux", "architecture": "amd64",
            },
        }});
        self.nodes
            .patch_status(
                &self.host.node_name,
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await?;
        Ok(())
    }

    async fn renew_lease(&self) -> Result<(), kube::Error> {
        let name = &self.host.node_name;
        let owner = self.node_uid.as_ref().map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.clone(),
                uid: uid.clone(),
                ..Default::default()
            }]
        });
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                owner_references: owner,
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.clone()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).map_err(kube::Error::SerdeError)?;
        body["apiVersion"] = json!("coordination.k8s.io/v1");
        body["kind"] = json!("Lease");
        self.leases
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        Ok(())
    }

    async fn sync_pods(&mut self) -> Result<(), kube::Error> {
        // The watch's cache once it has listed the node's pods; a LIST before that.
        let pods: Vec<Pod> = if self
            .pod_store_ready
            .load(std::sync::atomic::Ordering::Acquire)
        {
            self.pod_store
                .state()
                .iter()
                .map(|p| (**p).clone())
                .collect()
        } else {
            let selector = format!("spec.nodeName={}", self.host.node_name);
            self.pods
                .list(&ListParams::default().fields(&selector))
                .await?
                .items
        };
        let now = Timestamp::now();
        self.next_pod_exit = None;
        let mut deletes = Vec::new();
        let mut starts = Vec::new();
        // Pods whose containers have not exited: their volumes are mounted or wanted.
        let mut live: Vec<Pod> = Vec::new();
        for pod in pods {
            let (Some(ns), Some(name), Some(uid)) = (
                pod.metadata.namespace.clone(),
                pod.metadata.name.clone(),
                pod.metadata.uid.clone(),
            ) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), &ns);
            if pod.metadata.deletion_timestamp.is_some() {
                // Containers exit min(grace period, shutdown delay) after the kubelet learns
                // of the deletion (deletionTimestamp has only second precision), then the
                // kubelet removes the pod for good.
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(0)
                    .max(0) as u64;
                let requested = *self.terminating_since.entry(uid.clone()).or_insert(now);
                let exit_after = Duration::from_secs(grace).min(self.config.pod_shutdown_delay);
                let exits_at =
                    requested + jiff::SignedDuration::try_from(exit_after).unwrap_or_default();
                if now < exits_at {
                    self.next_pod_exit =
                        Some(self.next_pod_exit.map_or(exits_at, |t| t.min(exits_at)));
                }
                if now >= exits_at {
                    deletes.push((api, name, uid));
                } else {
                    live.push(pod);
                }
                continue;
            }
            if self.started_pods.contains(&uid) {
                if pod_ready(&pod) {
                    live.push(pod);
                    continue;
                }
                // Running here but not Ready in the API: the node-lifecycle controller marked
                // it so while the node looked NotReady (a race with the boot). A kubelet's
                // status manager posts its own status again; so does this one.
                starts.push((api, name, uid, ready_again(now)));
                live.push(pod);
                continue;
            }
            let patch = self.running_status(&pod, now);
            starts.push((api, name, uid, patch));
            live.push(pod);
        }
        // Containers of finalized pods have exited: their writes stop before the volumes are
        // reported unused.
        for (_, _, uid) in &deletes {
            self.stop_writer(uid);
        }
        let mut views = Vec::with_capacity(live.len());
        for pod in &live {
            let csi_volumes = self.resolve_csi_volumes(pod).await;
            views.push(PodVolumes {
                pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                csi_volumes,
                stopped: false,
            });
        }
        let wants_volumes = views
            .iter()
            .any(|v| v.csi_volumes.as_ref().is_some_and(|c| !c.is_empty()));
        let attached = if wants_volumes {
            self.volumes_attached().await?
        } else {
            BTreeSet::new()
        };
        let plan = plan_volumes(&views, &attached);
        self.report_volumes_in_use(plan.volumes_in_use.clone())
            .await?;
        // Pods already running keep running; new ones start once their volumes are attached.
        starts.retain(|(_, _, uid, _)| {
            self.started_pods.contains(uid) || plan.may_start.contains(uid)
        });
        if !plan.waiting.is_empty() {
            tracing::debug!(node = %self.host.node_name, waiting = ?plan.waiting, "pods waiting for volumes");
        }
        // Containers stop and start in parallel, as on a real node.
        let node = self.host.node_name.clone();
        let deleted: Vec<Result<String, kube::Error>> =
            futures::stream::iter(deletes.into_iter().map(|(api, name, uid)| {
                let node = node.clone();
                async move {
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&name, &dp).await {
                        Ok(_) => {
                            tracing::debug!(node = %node, pod = %name, "pod terminated");
                            Ok(uid)
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(uid),
                        Err(e) => Err(e),
                    }
                }
            }))
            .buffer_unordered(POD_CALLS_IN_FLIGHT)
            .collect()
            .await;
        for result in deleted {
            let uid = result?;
            self.started_pods.remove(&uid);
            self.terminating_since.remove(&uid);
            self.pod_csi_volumes.remove(&uid);
        }
        let started: Vec<Result<String, kube::Error>> =
            futures::stream::iter(starts.into_iter().map(|(api, name, uid, patch)| {
                let node = node.clone();
                async move {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    tracing::debug!(node = %node, pod = %name, "pod running");
                    Ok(uid)
                }
            }))
            .buffer_unordered(POD_CALLS_IN_FLIGHT)
            .collect()
            .await;
        for result in started {
            self.started_pods.insert(result?);
        }
        let running: Vec<String> = self.started_pods.iter().cloned().collect();
        for uid in running {
            self.ensure_writer(&uid);
        }
        Ok(())
    }

    /// A Running/Ready status for a pod; containers that ran before count as restarted.
    fn running_status(&mut self, pod: &Pod, now: Timestamp) -> serde_json::Value {
        let spec = pod.spec.clone().unwrap_or_default();
        let previous = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let pod_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_else(|| {
                self.next_ip = if self.next_ip >= 250 {
                    2
                } else {
                    self.next_ip + 1
                };
                format!("10.244.{}.{}", self.index % 250, self.next_ip)
            });
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let containers: Vec<serde_json::Value> = spec
            .containers
            .iter()
            .map(|c| {
                let restarts = previous
                    .iter()
                    .find(|p| p.name == c.name)
                    .map(|p| p.restart_count + 1)
                    .unwrap_or(0);
                let image = c.image.clone().unwrap_or_default();
                json!({
                    "name": c.name, "image": image, "imageID": format!("sim://{image}"),
                    "containerID": format!("sim://{uid}-{}-{}", c.name, self.boots),
                    "ready": true, "started": true, "restartCount": restarts,
                    "state": { "running": { "startedAt": now.to_string() } },
                })
            })
            .collect();
        let init: Vec<serde_json::Value> = spec
            .init_containers
            .unwrap_or_default()
            .iter()
            .map(|c| {
                json!({
                    "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "", "ready": true,
                    "restartCount": 0,
                    "state": { "terminated": { "exitCode": 0, "reason": "Completed", "startedAt": now.to_string(), "finishedAt": now.to_string() } },
                })
            })
            .collect();
        let cond =
            |t: &str| json!({ "type": t, "status": "True", "lastTransitionTime": now.to_string() });
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .map(|t| t.0)
            .unwrap_or(now);
        json!({ "status": {
            "phase": "Running",
            "hostIP": self.host.internal_ip,
            "podIP": pod_ip,
            "podIPs": [{ "ip": pod_ip }],
            "startTime": start_time.to_string(),
            "conditions": [cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
            "containerStatuses": containers,
            "initContainerStatuses": init,
        }})
    }
}

/// The pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The conditions of a running pod, posted again over ones another component changed.
fn ready_again(now: Timestamp) -> serde_json::Value {
    let cond =
        |t: &str| json!({ "type": t, "status": "True", "lastTransitionTime": now.to_string() });
    json!({ "status": {
        "conditions": [cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
    }})
}

fn due(last: Option<Instant>, every: Duration, now: Instant) -> bool {
    last.is_none_or(|t| now.duration_since(t) >= every)
}

/// Keeps the node's pods in a cache and wakes its kubelet whenever one of them changes.
async fn watch_pods(
    pods: Api<Pod>,
    node: String,
    writer: kube::runtime::reflector::store::Writer<Pod>,
    changed: Arc<tokio::sync::Notify>,
    ready: Arc<std::sync::atomic::AtomicBool>,
) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::watcher::Event;
    let config = kube::runtime::watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream =
        kube::runtime::reflector(writer, kube::runtime::watcher(pods, config)).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::InitDone) => {
                ready.store(true, std::sync::atomic::Ordering::Release);
                changed.notify_one();
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => changed.notify_one(),
            _ => {}
        }
    }
}
