//! End-to-end harness for the reboot queue: a [`Lab`] (real control plane, sushy-tools
//! emulator, BareMetalHosts, the real operator binary) plus simulated kubelets that follow
//! the emulator's power states, workloads on those nodes, and helpers to queue nodes and
//! watch entries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hostcycle_api::queue::{
    CORDONED_BY_ANNOTATION, EntryPhase, REBOOT_COMMANDS_CONFIG_MAP, REBOOT_QUEUE_NAME, RebootQueue,
    RebootQueueEntry, RebootQueueSpec,
};
use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{NodeSimulator, SimConfig, SimHandle, SimHost};
use hostcycle_testkit::{ClusterOptions, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{Lab, LabOptions};

/// The finalizer [`QueueLab::hold_pod`] puts on a pod.
const HOLD_FINALIZER: &str = "hostcycle.io/e2e-hold";

/// Long enough for a drain plus a power cycle through the fake driver (2 × 1–11 s) and a boot.
pub const REBOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// A lab whose hosts run simulated kubelets, for the reboot queue.
pub struct QueueLab {
    pub lab: Lab,
    pub sim: Option<SimHandle>,
    /// The simulated storage (with [`LabOptions::storage`]): the ground truth of who
    /// attached and wrote which volume when.
    pub storage: Option<hostcycle_sim::StorageSim>,
    /// The simulated CSI driver, stopped on drop.
    pub csi: Option<hostcycle_sim::attacher::CsiSimHandle>,
    pub client: Client,
    pub entries: Api<RebootQueueEntry>,
    pub nodes: Api<Node>,
    next_index: AtomicU64,
}

/// A host of the lab: its name (= Node name) and whether it is an API server.
#[derive(Clone, Copy)]
pub struct HostSpec {
    pub name: &'static str,
    pub control_plane: bool,
    /// The InternalIP its simulated kubelet writes; `None`: `192.0.2.<10 + index>`.
    pub internal_ip: Option<&'static str>,
}

pub const fn worker(name: &'static str) -> HostSpec {
    HostSpec {
        name,
        control_plane: false,
        internal_ip: None,
    }
}

/// A worker whose kubelet writes `internal_ip` as its InternalIP (any text).
pub const fn worker_at(name: &'static str, internal_ip: &'static str) -> HostSpec {
    HostSpec {
        name,
        control_plane: false,
        internal_ip: Some(internal_ip),
    }
}

pub const fn api_server(name: &'static str) -> HostSpec {
    HostSpec {
        name,
        control_plane: true,
        internal_ip: None,
    }
}

/// Test defaults for the queue: fast backoffs, short boot timeout.
pub fn fast_queue() -> RebootQueueSpec {
    serde_json::from_value(json!({
        "drainBackoff": { "baseSeconds": 2, "maxSeconds": 4, "jitterSeconds": 1 },
        "evictionTimeoutSeconds": 60,
        "reboot": { "bootTimeoutSeconds": 300 },
    }))
    .unwrap()
}

impl QueueLab {
    /// Starts the lab with `hosts`, their simulated nodes, and the queue configured as `queue`.
    pub async fn start(hosts: &[HostSpec], queue: RebootQueueSpec) -> QueueLab {
        Self::start_with(hosts, queue, LabOptions::default()).await
    }

    pub async fn start_with(
        hosts: &[HostSpec],
        queue: RebootQueueSpec,
        options: LabOptions,
    ) -> QueueLab {
        let names: Vec<&str> = hosts.iter().map(|h| h.name).collect();
        let with_storage = options.storage;
        let boot_delay = options.boot_delay.unwrap_or(Duration::from_secs(1));
        let options = LabOptions {
            cluster: ClusterOptions {
                // Nodes go NotReady 8 s after their host loses power (test default).
                ..options.cluster
            },
            ..options
        };
        let lab = Lab::start_with(&names, options).await;
        let client = lab.client.clone();
        set_queue_spec(&client, &queue).await;
        let connector = hostcycle_sim::bmc_connector();
        let sim_hosts = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                // Each simulated kubelet reads its host's BMC with the host's own account.
                let (user, password) = lab.credentials(h.name);
                SimHost {
                    node_name: h.name.to_string(),
                    control_plane: h.control_plane,
                    internal_ip: h
                        .internal_ip
                        .map_or_else(|| format!("192.0.2.{}", 10 + i), str::to_string),
                    bmc: connector
                        .connect_str(
                            &lab.redfish.system_address(i).unwrap(),
                            BmcCredentials::new(user, password).unwrap(),
                            &HostConnectOptions::default(),
                        )
                        .unwrap(),
                }
            })
            .collect();
        let (storage, csi) = if with_storage {
            let storage = hostcycle_sim::StorageSim::new();
            let csi = hostcycle_sim::start_csi_sim(
                client.clone(),
                hostcycle_sim::CsiSimConfig::default(),
                storage.clone(),
            )
            .await
            .expect("the simulated CSI driver starts");
            (Some(storage), Some(csi))
        } else {
            (None, None)
        };
        let mut simulator = NodeSimulator::new(
            client.clone(),
            SimConfig {
                boot_delay,
                pod_shutdown_delay: Duration::from_millis(500),
                ..SimConfig::default()
            },
            sim_hosts,
        );
        if let Some(storage) = &storage {
            simulator = simulator.with_storage(storage.clone());
        }
        let sim = simulator.spawn();
        let qlab = QueueLab {
            storage,
            csi,
            entries: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            client,
            lab,
            sim: Some(sim),
            next_index: AtomicU64::new(1),
        };
        for h in hosts {
            qlab.wait_node(h.name, "Ready", Duration::from_secs(60) + boot_delay, |n| {
                hostcycle_sim::node_ready(n) == Some(true)
            })
            .await;
        }
        qlab
    }

    /// Queues `node` with the next index; returns the entry's name.
    pub async fn queue(&self, node: &str) -> String {
        let index = self.next_index.fetch_add(1, Ordering::SeqCst);
        let entry = RebootQueueEntry::for_node(node, index);
        self.entries
            .create(&PostParams::default(), &entry)
            .await
            .unwrap()
            .name_any()
    }

    /// The entry for `node`, if any.
    pub async fn entry(&self, node: &str) -> Option<RebootQueueEntry> {
        self.entries
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.spec.node == node)
    }

    /// Waits until the entry for `node` satisfies `pred`.
    pub async fn wait_entry(
        &self,
        node: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&RebootQueueEntry) -> bool,
    ) -> RebootQueueEntry {
        let pred = &pred;
        let what = format!("reboot queue entry for {node}: {what}");
        match wait_until(&what, timeout, || async move {
            self.entry(node).await.filter(|e| pred(e))
        })
        .await
        {
            Ok(e) => e,
            Err(e) => panic!(
                "{e}\nentries now: {}\noperator log: {:?}",
                self.entries_summary().await,
                self.lab
                    .operator
                    .as_ref()
                    .map(|p| p.log_path().to_path_buf())
            ),
        }
    }

    pub async fn wait_phase(
        &self,
        node: &str,
        phase: EntryPhase,
        timeout: Duration,
    ) -> RebootQueueEntry {
        self.wait_entry(node, &format!("phase {phase}"), timeout, |e| {
            e.phase() == phase
        })
        .await
    }

    /// Waits until no entry for `node` is left (it completed, or was removed).
    pub async fn wait_entry_gone(&self, node: &str, timeout: Duration) {
        let what = format!("reboot queue entry for {node} to be removed");
        if let Err(e) = wait_until(&what, timeout, || async {
            self.entry(node).await.is_none().then_some(())
        })
        .await
        {
            panic!(
                "{e}\nentries now: {}\noperator log: {:?}",
                self.entries_summary().await,
                self.lab
                    .operator
                    .as_ref()
                    .map(|p| p.log_path().to_path_buf())
            );
        }
    }

    pub async fn entries_summary(&self) -> String {
        self.entries
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|e| {
                        format!(
                            "[{} {} {} cancel={} msg={:?}]",
                            e.spec.index,
                            e.spec.node,
                            e.phase(),
                            e.spec.cancel,
                            e.status.as_ref().map(|s| s.message.as_str()).unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|e| e.to_string())
    }

    pub async fn node(&self, name: &str) -> Node {
        self.nodes.get(name).await.unwrap()
    }

    pub async fn wait_node(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Node) -> bool,
    ) -> Node {
        let pred = &pred;
        let what = format!("Node {name}: {what}");
        wait_until(&what, timeout, || async move {
            self.nodes.get(name).await.ok().filter(|n| pred(n))
        })
        .await
        .unwrap()
    }

    /// Patches the queue's spec (merge patch).
    pub async fn patch_queue(&self, spec: serde_json::Value) {
        Api::<RebootQueue>::all(self.client.clone())
            .patch(
                REBOOT_QUEUE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
            .unwrap();
    }

    /// Configures the operator's command set `name` as an administrator does: a key of
    /// ConfigMap `hostcycle-reboot-commands` in the operator's namespace. The RebootQueue
    /// only selects a set (`spec.reboot.commands`, default `default`).
    pub async fn set_reboot_commands<R: serde::Serialize, B: serde::Serialize>(
        &self,
        name: &str,
        reboot: &[R],
        boot_check: &[B],
    ) {
        let value = json!({ "rebootCommand": reboot, "bootCheckCommand": boot_check }).to_string();
        let config_maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), super::NS);
        let patch = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": REBOOT_COMMANDS_CONFIG_MAP },
            "data": { name: value },
        });
        config_maps
            .patch(
                REBOOT_COMMANDS_CONFIG_MAP,
                &PatchParams::apply("e2e-administrator").force(),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
    }

    pub async fn cancel(&self, node: &str) {
        let entry = self.entry(node).await.expect("an entry to cancel");
        self.entries
            .patch(
                &entry.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "cancel": true } })),
            )
            .await
            .unwrap();
    }

    /// (reason, note) of every Event about `object` (any namespace), oldest first.
    pub async fn events_about(&self, object: &str) -> Vec<(String, String)> {
        let api: Api<Event> = Api::all(self.client.clone());
        let mut events: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
            .collect();
        events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
        events
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    pub async fn event_reasons_about(&self, object: &str) -> Vec<String> {
        self.events_about(object)
            .await
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// Waits until Events with every one of `reasons` about `object` exist — they are published
    /// in the background, after the change they report — and returns all reasons about it.
    pub async fn wait_event_reasons_about(&self, object: &str, reasons: &[&str]) -> Vec<String> {
        let what = format!("Events {reasons:?} about {object}");
        match wait_until(&what, Duration::from_secs(30), || async {
            let seen = self.event_reasons_about(object).await;
            reasons
                .iter()
                .all(|want| seen.iter().any(|r| r == want))
                .then_some(seen)
        })
        .await
        {
            Ok(seen) => seen,
            Err(e) => panic!(
                "{e}\nEvents about {object}: {:?}",
                self.events_about(object).await
            ),
        }
    }

    /// Holds the first pod labelled `app=<app>` in `ns` Terminating (a finalizer) until
    /// [`Self::release_pod`]: a drain waits on it.
    pub async fn hold_pod(&self, ns: &str, app: &str) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pods = api
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap();
        let pod = pods.items.into_iter().next().expect("a pod to hold");
        api.patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": [HOLD_FINALIZER] } })),
        )
        .await
        .unwrap()
    }

    /// Lets a pod held by [`Self::hold_pod`] go (it may be gone already).
    pub async fn release_pod(&self, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap());
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("releasing pod {}: {e}", pod.name_any()),
        }
    }

    /// Creates a namespace with labels.
    pub async fn namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let ns: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } }))
                .unwrap();
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        // Pods need the namespace's default ServiceAccount on 1.20.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), name);
        wait_until(
            &format!("the default ServiceAccount of namespace {name}"),
            Duration::from_secs(30),
            || async { sa.get_opt("default").await.ok().flatten() },
        )
        .await
        .unwrap();
    }

    /// A Deployment of `replicas` pause pods, all on `node` when given.
    pub async fn deployment(&self, ns: &str, name: &str, replicas: i32, node: Option<&str>) {
        let mut d = hostcycle_testkit::pause_deployment(name, replicas);
        if let Some(node) = node
            && let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut())
        {
            spec.node_selector = Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                node.to_string(),
            )]));
        }
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }

    /// A PodDisruptionBudget over `app=<app>` (API version by discovery).
    pub async fn pdb(&self, ns: &str, app: &str, min_available: i32) {
        let policy = kube::discovery::group(&self.client, "policy")
            .await
            .unwrap();
        let (resource, _) = policy.recommended_kind("PodDisruptionBudget").unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &resource);
        let pdb: DynamicObject = serde_json::from_value(json!({
            "apiVersion": resource.api_version,
            "kind": "PodDisruptionBudget",
            "metadata": { "name": app },
            "spec": { "minAvailable": min_available, "selector": { "matchLabels": { "app": app } } },
        }))
        .unwrap();
        api.create(&PostParams::default(), &pdb).await.unwrap();
    }

    /// A Job whose one pod runs (forever, on simulated nodes) on `node`.
    pub async fn job(&self, ns: &str, name: &str, node: &str, labels: &[(&str, &str)]) {
        let mut pod_labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pod_labels.insert("job".into(), name.into());
        let job: Job = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "template": {
                "metadata": { "labels": pod_labels },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": { "kubernetes.io/hostname": node },
                    "containers": [{ "name": "work", "image": "registry.k8s.io/pause:3.2" }],
                },
            }},
        }))
        .unwrap();
        Api::<Job>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &job)
            .await
            .unwrap();
    }

    /// Pods bound to `node` (any namespace), as `namespace/name`.
    pub async fn pods_on(&self, node: &str) -> Vec<Pod> {
        Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap()
            .items
    }

    /// Waits until `count` pods with `app=<app>` in `ns` run and are Ready.
    pub async fn wait_running(&self, ns: &str, app: &str, count: usize) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let what = format!("{count} Ready pods of {ns}/{app}");
        wait_until(&what, Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                let pods = api
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await
                    .ok()?;
                let ready = pods
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
                    .count();
                (ready >= count).then_some(())
            }
        })
        .await
        .unwrap();
    }

    /// Deletes a Deployment (its pods go with it).
    pub async fn delete_deployment(&self, ns: &str, name: &str) {
        let dp = DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
            ..DeleteParams::default()
        };
        let _ = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(self.client.clone(), ns)
            .delete(name, &dp)
            .await;
    }

    /// Power-offs of `node`'s host seen by the sampler.
    /// How many times the simulated kubelet of `node` has booted (its Node's bootID is
    /// `<node>-<boots>`): a reboot is one more. Unlike the power sampler it cannot miss a
    /// power cycle shorter than its period (a BMC restart may be off for a fraction of a
    /// second).
    pub async fn boots(&self, node: &str) -> u32 {
        let n = self.node(node).await;
        let id = n
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.boot_id)
            .unwrap_or_default();
        id.rsplit_once('-')
            .and_then(|(_, b)| b.parse().ok())
            .unwrap_or_else(|| panic!("Node {node} has no simulated boot ID: {id:?}"))
    }

    pub async fn power_cycles(&self, node: &str) -> usize {
        self.lab.settled_history(node).await.power_offs()
    }

    /// When the host of `node` was first seen Off after `t`.
    pub fn off_after(&self, node: &str, t: Timestamp) -> Option<Timestamp> {
        self.lab.history(node).off_after(t)
    }
}

impl Drop for QueueLab {
    fn drop(&mut self) {
        // The simulated CSI driver and kubelets stop before the control plane goes, or they
        // would retry against a stopped API server until dropped.
        drop(self.csi.take());
        if let Some(sim) = self.sim.take() {
            drop(sim);
        }
    }
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

pub fn cordoned_by_queue(node: &Node) -> bool {
    node.annotations().contains_key(CORDONED_BY_ANNOTATION)
}

/// Creates or replaces the `default` RebootQueue's spec.
pub async fn set_queue_spec(client: &Client, spec: &RebootQueueSpec) {
    let api: Api<RebootQueue> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "RebootQueue",
        "metadata": { "name": REBOOT_QUEUE_NAME },
        "spec": spec,
    });
    api.patch(
        REBOOT_QUEUE_NAME,
        &PatchParams::apply("hostcycle-e2e").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
}
