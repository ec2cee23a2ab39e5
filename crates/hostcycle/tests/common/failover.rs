//! Fast fenced failover, end to end: a [`QueueLab`] whose simulated kubelets do volumes, with
//! the simulated CSI driver and its storage ledger (the ground truth of who wrote which volume
//! when), a `HostHealthCheck` over the workers, a StatefulSet with a ReadWriteOnce volume, and
//! the timeline of one failover as the test (and the emulator) saw it.

use std::time::Duration;

use hostcycle_api::remediation::{FENCED_TAINT_KEY, HostRemediation};
use hostcycle_sim::{Fault, Ledger, SIM_STORAGE_CLASS};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

use super::LabOptions;
use super::queue::{HostSpec, QueueLab, fast_queue, pod_ready};
use super::remediation::Recorder;

/// Where the StatefulSet runs.
pub const APPS: &str = "apps";
/// The StatefulSet (one replica: `db-0`).
pub const DB: &str = "db";
pub const DB_POD: &str = "db-0";
/// The operator's namespace, where a HostHealthCheck's requests are created.
pub const CHECK: &str = "workers";

pub struct FailoverLab {
    pub q: QueueLab,
}

impl std::ops::Deref for FailoverLab {
    type Target = QueueLab;
    fn deref(&self) -> &QueueLab {
        &self.q
    }
}

/// What makes the node fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disruption {
    /// Its kubelet dies or is partitioned (the host stays on).
    Kubelet(Fault),
    /// Its host loses power at the emulator, without hostcycle.
    PowerLoss,
}

/// What one failover looked like (test clock; the emulator's power history is read on the
/// same machine).
#[derive(Debug, Clone)]
pub struct Failover {
    pub node: String,
    pub fault_at: Timestamp,
    /// The health check's request (its creation).
    pub requested_at: Timestamp,
    /// The first Off the emulator reported after the fault.
    pub off_at: Timestamp,
    /// The old pod's deletion, as watched.
    pub pod_deleted_at: Timestamp,
    /// The replacement Running and Ready on another node, as watched.
    pub running_at: Timestamp,
    pub new_node: String,
    /// The replacement pod, first seen by the test's watch.
    pub new_pod_created_at: Timestamp,
    /// The storage detached the volume from the failed node.
    pub old_detached_at: Option<Timestamp>,
    /// The storage attached it on the new node.
    pub new_attached_at: Option<Timestamp>,
}

impl Failover {
    pub fn total(&self) -> Duration {
        Duration::try_from(self.running_at.duration_since(self.fault_at)).unwrap_or_default()
    }
}

impl FailoverLab {
    /// Starts the lab with storage on `hosts`, a HostHealthCheck over every node (the Lease
    /// stale after 20 s, the product's default; a warm-up of 5 s) with `release: Auto`, and
    /// the StatefulSet `db` (1 replica, a ReadWriteOnce volume) Running with its volume
    /// attached.
    pub async fn start(hosts: &[HostSpec], operator_args: &[&str]) -> FailoverLab {
        Self::start_booting_in(hosts, operator_args, None).await
    }

    /// [`Self::start`] with hosts that take `boot_delay` from power-on to a Ready Node.
    pub async fn start_booting_in(
        hosts: &[HostSpec],
        operator_args: &[&str],
        boot_delay: Option<Duration>,
    ) -> FailoverLab {
        let options = LabOptions {
            storage: true,
            boot_delay,
            operator_args: operator_args.iter().map(|s| s.to_string()).collect(),
            ..LabOptions::default()
        };
        let q = QueueLab::start_with(hosts, fast_queue(), options).await;
        let lab = FailoverLab { q };
        lab.namespace(APPS, &[]).await;
        let sts = hostcycle_testkit::pause_statefulset_with_volume(DB, 1, SIM_STORAGE_CLASS, None);
        Api::<StatefulSet>::namespaced(lab.client.clone(), APPS)
            .create(&PostParams::default(), &sts)
            .await
            .unwrap();
        lab.wait_db_running(None, Duration::from_secs(90)).await;
        lab
    }

    pub fn storage(&self) -> &hostcycle_sim::StorageSim {
        self.q
            .storage
            .as_ref()
            .expect("the failover lab has storage")
    }

    /// Creates the HostHealthCheck `workers` over every node with `spec` merged in.
    pub async fn health_check(&self, spec: serde_json::Value) {
        let mut body = json!({
            "apiVersion": "hostcycle.io/v1alpha1",
            "kind": "HostHealthCheck",
            "metadata": { "name": CHECK },
            "spec": {
                "selector": {},
                "warmUpSeconds": 5,
                "remediation": { "release": "Auto", "timeoutSeconds": 300 },
            },
        });
        if let (Some(base), Some(extra)) = (body["spec"].as_object_mut(), spec.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let obj: DynamicObject = serde_json::from_value(body).unwrap();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &health_check_resource());
        api.create(&PostParams::default(), &obj).await.unwrap();
    }

    /// Waits until the check has watched its `nodes` for its warm-up (`Ready=True`).
    pub async fn wait_check_watching(&self, nodes: u64) {
        wait_for(
            &format!("HostHealthCheck {CHECK} Ready=True over {nodes} nodes"),
            Duration::from_secs(90),
            || async {
                let status = self.health_check_status().await;
                let ready = status["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                (ready && status["observedNodes"].as_u64() == Some(nodes)).then_some(())
            },
        )
        .await;
    }

    /// Points `node`'s host at a closed port on loopback: its BMC no longer answers (the
    /// simulated kubelet still follows the emulator's power).
    pub async fn make_bmc_unreachable(&self, node: &str) {
        let closed = hostcycle_testkit::free_port().unwrap();
        let address = self.lab.get(node).await.spec.bmc.unwrap().address;
        let path = address
            .split_once("/redfish/")
            .map(|(_, p)| p.to_string())
            .unwrap();
        self.lab
            .patch_spec(
                node,
                json!({ "bmc": { "address": format!("redfish+http://127.0.0.1:{closed}/redfish/{path}") } }),
            )
            .await;
    }

    pub async fn health_check_status(&self) -> serde_json::Value {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &health_check_resource());
        api.get(CHECK).await.unwrap().data["status"].clone()
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), APPS)
    }

    /// Waits for `db-0` Running and Ready with its volume attached (another pod than
    /// `replacing`, when given); returns the pod.
    pub async fn wait_db_running(&self, replacing: Option<&str>, timeout: Duration) -> Pod {
        let what = match replacing {
            Some(uid) => format!("a new {APPS}/{DB_POD} (not uid {uid}) Running and Ready"),
            None => format!("{APPS}/{DB_POD} Running and Ready"),
        };
        let pods = self.pods();
        wait_for(&what, timeout, || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt(DB_POD).await.ok().flatten()?;
                pod.spec.as_ref()?.node_name.as_ref()?;
                let running = pod.metadata.deletion_timestamp.is_none()
                    && pod_ready(&pod)
                    && replacing.is_none_or(|uid| pod.uid().as_deref() != Some(uid));
                running.then_some(pod)
            }
        })
        .await
    }

    pub fn node_of(pod: &Pod) -> String {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    }

    /// Injects `fault` on `node`'s kubelet.
    pub fn fault(&self, node: &str, fault: Fault) {
        self.q.sim.as_ref().unwrap().set_fault(node, fault).unwrap();
    }

    /// Kills (or partitions) the kubelet under `db-0` and follows the failover until the
    /// replacement runs elsewhere; returns its timeline.
    pub async fn fail_db_node(&self, disruption: Disruption, timeout: Duration) -> Failover {
        let pod = self.pods().get(DB_POD).await.unwrap();
        let node = Self::node_of(&pod);
        let pod_rec = Recorder::start(self.pods(), DB_POD).await;
        // Watched, not read afterwards: with DeleteNode the node can be back and the request
        // deleted by the check before the replacement runs.
        let request_rec = Recorder::start(
            Api::<HostRemediation>::all(self.client.clone()),
            &hostcycle_api::health::request_name(CHECK, &node),
        )
        .await;
        let fault_at = Timestamp::now();
        match disruption {
            Disruption::Kubelet(fault) => self.fault(&node, fault),
            Disruption::PowerLoss => self
                .lab
                .redfish
                .set_power(
                    self.lab.index(&node),
                    hostcycle_testkit::bmc_emulators::FakePower::Off,
                    Duration::from_secs(30),
                )
                .await
                .unwrap(),
        }
        let old_uid = pod.uid();
        let new = self
            .wait_db_running(Some(old_uid.as_deref().unwrap_or_default()), timeout)
            .await;
        let running_at = Timestamp::now();
        let pod_deleted_at = pod_rec
            .seen()
            .into_iter()
            .find(|s| s.deleted && s.object.uid() == old_uid)
            .map(|s| s.at)
            .expect("the old pod's deletion was watched");
        // A request of an earlier failover of this node (whole-second creation times) is not
        // this one's.
        let fault_second = Timestamp::from_second(fault_at.as_second()).unwrap_or(fault_at);
        let requested_at = request_rec
            .seen()
            .into_iter()
            .filter(|s| !s.deleted)
            .filter_map(|s| s.object.metadata.creation_timestamp.map(|t| t.0))
            .find(|created| *created >= fault_second)
            .expect("the health check's request for this failure was watched");
        let off_at = self
            .off_after(&node, fault_at)
            .expect("the emulator saw the host off");
        let new_node = Self::node_of(&new);
        let attachments = self.attachments();
        let old_detached_at = attachments
            .iter()
            .filter(|a| a.host == node)
            .filter_map(|a| a.detached_at)
            .filter(|t| *t >= fault_at)
            .min();
        let new_attached_at = attachments
            .iter()
            .filter(|a| a.host == new_node && a.attached_at >= fault_at)
            .map(|a| a.attached_at)
            .min();
        // When the test first saw the replacement (its creationTimestamp has whole seconds).
        let new_uid = new.uid();
        let new_pod_created_at = pod_rec
            .seen()
            .into_iter()
            .find(|s| !s.deleted && s.object.uid() == new_uid)
            .map_or(running_at, |s| s.at);
        Failover {
            new_pod_created_at,
            old_detached_at,
            new_attached_at,
            new_node,
            node,
            fault_at,
            requested_at,
            off_at,
            pod_deleted_at,
            running_at,
        }
    }

    /// The HostRemediation a health check created for `node`, if any.
    pub async fn request_for(&self, node: &str) -> Option<HostRemediation> {
        let api: Api<HostRemediation> = Api::all(self.client.clone());
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|r| {
                r.annotations()
                    .get(hostcycle_api::remediation::NHC_NODE_NAME_ANNOTATION)
                    .is_some_and(|n| n == node)
            })
    }

    pub async fn requests(&self) -> Vec<HostRemediation> {
        let api: Api<HostRemediation> = Api::all(self.client.clone());
        api.list(&ListParams::default()).await.unwrap().items
    }

    /// The storage ledger now.
    pub fn ledger(&self) -> Ledger {
        self.storage().snapshot()
    }

    /// The one volume's (host, attached, detached) intervals.
    pub fn attachments(&self) -> Vec<hostcycle_sim::storage::Attachment> {
        let ledger = self.ledger();
        let volumes: Vec<String> = ledger.volumes().map(str::to_string).collect();
        assert_eq!(volumes.len(), 1, "one volume: {volumes:?}");
        ledger.history(&volumes[0]).attachments
    }

    /// Asserts the storage never saw two writers or a write while not attached.
    pub fn assert_no_violation(&self) {
        let violations = self.storage().violations();
        assert!(violations.is_empty(), "storage violations: {violations:#?}");
    }

    /// Waits until `node` is Ready with a bootID other than `old_boot`, without hostcycle's
    /// fenced taint.
    pub async fn wait_back(&self, node: &str, old_boot: &str, timeout: Duration) -> Node {
        let nodes = self.nodes.clone();
        let what = format!("node {node} Ready with a new boot and without {FENCED_TAINT_KEY}");
        wait_for(&what, timeout, || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get_opt(node).await.ok().flatten()?;
                let back = hostcycle_sim::node_ready(&n) == Some(true)
                    && boot_id(&n) != old_boot
                    && !fenced(&n);
                back.then_some(n)
            }
        })
        .await
    }
}

/// Polls until `poll` gives a value; fails the test with `what` at the deadline.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, poll: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    hostcycle_testkit::wait_until(what, timeout, poll)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn boot_id(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

pub fn fenced(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == FENCED_TAINT_KEY))
}

fn health_check_resource() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource {
        group: "hostcycle.io".into(),
        version: "v1alpha1".into(),
        api_version: "hostcycle.io/v1alpha1".into(),
        kind: "HostHealthCheck".into(),
        plural: "hosthealthchecks".into(),
    }
}
