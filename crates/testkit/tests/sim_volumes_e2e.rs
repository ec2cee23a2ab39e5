//! Simulated volumes against the real control plane: the simulated kubelets report CSI volumes
//! in use and wait for the real attach/detach controller, the simulated CSI driver provisions
//! and attaches through the storage simulator, and the storage ledger records who wrote when.
//! Also: kubelet faults (dead, partitioned) keep pods writing until the host loses power.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::volumes::csi_unique_name;
use hostcycle_sim::{
    CsiSimConfig, CsiSimHandle, Fault, NodeSimulator, SIM_CSI_DRIVER, SIM_STORAGE_CLASS, SimConfig,
    SimHandle, SimHost, StorageSim, node_ready, start_csi_sim,
};
use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::{ClusterOptions, LocalCluster, pause_statefulset_with_volume, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const USER: &str = "vol";
const PASSWORD: &str = "vol-secret";

struct Phases(Instant);

impl Phases {
    fn done(&mut self, phase: &str) {
        eprintln!("phase {phase:<60} {:>7.2?}", self.0.elapsed());
        self.0 = Instant::now();
    }
}

/// Control plane, Redfish emulator, storage simulator, simulated CSI driver and kubelets.
/// Fields drop in order: simulator and CSI tasks first, processes last.
struct Rig {
    sim: SimHandle,
    _csi: CsiSimHandle,
    storage: StorageSim,
    redfish: RedfishEmulator,
    cluster: LocalCluster,
}

impl Rig {
    async fn start(prefix: &str, hosts: usize) -> Rig {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info,kube_client=off")
            .with_test_writer()
            .try_init();
        let cluster = LocalCluster::start(ClusterOptions {
            node_monitor_grace_period: Duration::from_secs(6),
            ..ClusterOptions::default()
        })
        .await
        .unwrap();
        let systems: Vec<FakeSystem> = (0..hosts)
            .map(|i| FakeSystem::new(format!("{prefix}-{i}"), FakePower::On))
            .collect();
        let redfish = RedfishEmulator::start(RedfishEmulatorOptions {
            systems,
            basic_auth: Some((USER.into(), PASSWORD.into())),
            tls: false,
            ..RedfishEmulatorOptions::default()
        })
        .await
        .unwrap();
        let storage = StorageSim::new();
        let csi = start_csi_sim(cluster.client(), CsiSimConfig::default(), storage.clone())
            .await
            .unwrap();
        let connector = hostcycle_sim::bmc_connector();
        let credentials = BmcCredentials::new(USER, PASSWORD).unwrap();
        let sim_hosts = (0..hosts)
            .map(|i| SimHost {
                node_name: format!("{prefix}-{i}"),
                control_plane: false,
                internal_ip: format!("192.0.2.{}", 10 + i),
                bmc: connector
                    .connect_str(
                        &redfish.system_address(i).unwrap(),
                        credentials.clone(),
                        &HostConnectOptions::default(),
                    )
                    .unwrap(),
            })
            .collect();
        let config = SimConfig {
            boot_delay: Duration::from_secs(1),
            lease_renew_interval: Duration::from_secs(1),
            ..SimConfig::default()
        };
        let sim = NodeSimulator::new(cluster.client(), config, sim_hosts)
            .with_storage(storage.clone())
            .spawn();
        let rig = Rig {
            sim,
            _csi: csi,
            storage,
            redfish,
            cluster,
        };
        let nodes: Api<Node> = Api::all(rig.client());
        wait_until(
            &format!("{hosts} simulated nodes to be Ready"),
            Duration::from_secs(60),
            || {
                let nodes = nodes.clone();
                async move {
                    let list = nodes.list(&ListParams::default()).await.ok()?;
                    (list
                        .items
                        .iter()
                        .filter(|n| node_ready(n) == Some(true))
                        .count()
                        == hosts)
                        .then_some(())
                }
            },
        )
        .await
        .unwrap();
        rig
    }

    fn client(&self) -> Client {
        self.cluster.client()
    }
}

/// Waits until pod `name` in `default` is Running and Ready; returns its UID and node.
async fn wait_pod_running(client: &Client, name: &str, not_uid: Option<&str>) -> (String, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let what = format!(
        "pod {name} (a new one: {}) to be Running and Ready",
        not_uid.is_some()
    );
    wait_until(&what, Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            let uid = pod.metadata.uid.clone()?;
            if Some(uid.as_str()) == not_uid {
                return None;
            }
            let status = pod.status.as_ref()?;
            let ready = status
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (status.phase.as_deref() == Some("Running") && ready)
                .then_some((uid, pod.spec.as_ref()?.node_name.clone()?))
        }
    })
    .await
    .unwrap()
}

/// The volume handle of claim `claim` once it is bound.
async fn bound_volume_handle(client: &Client, claim: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    wait_until(
        &format!("claim {claim} to be bound to a CSI volume"),
        Duration::from_secs(60),
        || {
            let (claims, volumes) = (claims.clone(), volumes.clone());
            async move {
                let pv_name = claims.get(claim).await.ok()?.spec?.volume_name?;
                let csi = volumes.get(&pv_name).await.ok()?.spec?.csi?;
                (csi.driver == SIM_CSI_DRIVER).then_some(csi.volume_handle)
            }
        },
    )
    .await
    .unwrap()
}

/// The Node's (volumesInUse, volumesAttached) names.
async fn node_volumes(client: &Client, node: &str) -> Option<(Vec<String>, Vec<String>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = nodes.get(node).await.ok()?.status?;
    let attached = status
        .volumes_attached
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    Some((status.volumes_in_use.unwrap_or_default(), attached))
}

async fn attachments_on(client: &Client, node: &str) -> Vec<VolumeAttachment> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|va| va.spec.node_name == node && va.spec.attacher == SIM_CSI_DRIVER)
        .collect()
}

/// Waits until `host` has written to `volume` at least `count` times in all.
async fn wait_writes(storage: &StorageSim, volume: &str, host: &str, count: u64) {
    wait_until(
        &format!("{count} writes to volume {volume} from host {host}"),
        Duration::from_secs(30),
        || async move { (storage.writes(volume, host) >= count).then_some(()) },
    )
    .await
    .unwrap();
}

async fn lease_renew_time(client: &Client, node: &str) -> Option<Timestamp> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    Some(leases.get(node).await.ok()?.spec?.renew_time?.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_volume_is_attached_written_detached_and_moved() {
    let mut phases = Phases(Instant::now());
    let rig = Rig::start("vol", 2).await;
    let client = rig.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..2 {
        let node = nodes.get(&format!("vol-{i}")).await.unwrap();
        let annotations = node.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("volumes.kubernetes.io/controller-managed-attach-detach")
                .map(String::as_str),
            Some("true"),
            "simulated nodes ask the attach/detach controller to attach for them"
        );
    }
    phases.done("rig ready: 2 nodes, CSI driver, storage");

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    sets.create(
        &PostParams::default(),
        &pause_statefulset_with_volume("db", 1, SIM_STORAGE_CLASS, None),
    )
    .await
    .unwrap();
    let handle = bound_volume_handle(&client, "data-db-0").await;
    let unique = csi_unique_name(SIM_CSI_DRIVER, &handle);
    let (first_uid, first_node) = wait_pod_running(&client, "db-0", None).await;
    phases.done("PVC provisioned and bound, pod Running");

    let attachments = attachments_on(&client, &first_node).await;
    assert!(
        attachments
            .iter()
            .any(|va| va.status.as_ref().is_some_and(|s| s.attached)),
        "an attached VolumeAttachment for {first_node}: {attachments:?}"
    );
    let (in_use, attached) = node_volumes(&client, &first_node).await.unwrap();
    assert!(
        in_use.contains(&unique),
        "volumesInUse {in_use:?} lists {unique}"
    );
    assert!(
        attached.contains(&unique),
        "volumesAttached {attached:?} lists {unique}"
    );
    wait_writes(&rig.storage, &handle, &first_node, 3).await;
    assert_eq!(
        rig.storage.attached_host(&handle).as_deref(),
        Some(first_node.as_str())
    );
    let ledger = rig.storage.snapshot();
    let writers: Vec<String> = ledger
        .history(&handle)
        .attachments
        .iter()
        .filter(|a| a.writes > 0)
        .map(|a| a.host.clone())
        .collect();
    assert_eq!(
        writers,
        vec![first_node.clone()],
        "only the pod's host writes"
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    phases.done("attached by ADC + attacher, volumesAttached, writes from one host");

    // Cordon the pod's node so that its replacement must move: the volume then has to be
    // detached from the first node before it can be attached to the second.
    nodes
        .patch(
            &first_node,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    wait_until(
        &format!("{first_node} to drop {unique} from volumesInUse"),
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let (node, unique) = (first_node.clone(), unique.clone());
            async move {
                let (in_use, _) = node_volumes(&client, &node).await?;
                (!in_use.contains(&unique)).then_some(())
            }
        },
    )
    .await
    .unwrap();
    wait_until(
        &format!("the VolumeAttachment of {first_node} to be deleted and released"),
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let node = first_node.clone();
            async move {
                attachments_on(&client, &node)
                    .await
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let detached = rig.storage.snapshot().attach_times(&handle, &first_node);
    assert!(
        detached.last().is_some_and(|(_, d)| d.is_some()),
        "storage detached {handle} from {first_node}: {detached:?}"
    );
    phases.done("clean delete: volumesInUse cleared, VA deleted, detached");

    let (_, second_node) = wait_pod_running(&client, "db-0", Some(&first_uid)).await;
    assert_ne!(
        second_node, first_node,
        "the replacement avoids the cordoned node"
    );
    wait_writes(&rig.storage, &handle, &second_node, 3).await;
    let ledger = rig.storage.snapshot();
    let first = ledger.attach_times(&handle, &first_node);
    let second = ledger.attach_times(&handle, &second_node);
    let first_detached = first.last().and_then(|(_, d)| *d).unwrap();
    assert!(
        second.first().is_some_and(|(a, _)| *a >= first_detached),
        "attached to {second_node} only after the detach from {first_node}: {first:?} {second:?}"
    );
    assert!(
        ledger
            .last_write(&handle, &first_node)
            .is_some_and(|w| w <= first_detached),
        "no write from {first_node} after its detach"
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    phases.done("replacement attached on the other node and writing");
    rig.sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_kubelets_keep_writing_until_their_hosts_lose_power() {
    let mut phases = Phases(Instant::now());
    let rig = Rig::start("flt", 2).await;
    let client = rig.client();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let cases = [
        ("dead", "flt-0", Fault::KubeletDead),
        ("part", "flt-1", Fault::Partitioned),
    ];
    for (set, node, _) in cases {
        sets.create(
            &PostParams::default(),
            &pause_statefulset_with_volume(set, 1, SIM_STORAGE_CLASS, Some(node)),
        )
        .await
        .unwrap();
    }
    let mut handles = Vec::new();
    for (set, node, _) in cases {
        let handle = bound_volume_handle(&client, &format!("data-{set}-0")).await;
        let (_, on) = wait_pod_running(&client, &format!("{set}-0"), None).await;
        assert_eq!(on, node);
        wait_writes(&rig.storage, &handle, node, 3).await;
        handles.push(handle);
    }
    phases.done("one writing pod per host");

    let control = rig.sim.control();
    for (_, node, fault) in cases {
        control.set_fault(node, fault).unwrap();
    }
    let faulted_at = Timestamp::now();
    // Give a renewal in flight time to land, then watch the Leases stand still.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut frozen = Vec::new();
    for (_, node, _) in cases {
        frozen.push(lease_renew_time(&client, node).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (((_, node, fault), handle), renewed) in cases.iter().zip(&handles).zip(&frozen) {
        assert_eq!(
            lease_renew_time(&client, node).await.as_ref(),
            Some(renewed),
            "{node} ({fault:?}) renews no Lease"
        );
        let last = rig.storage.last_write(handle, node).unwrap();
        assert!(
            last > faulted_at + jiff::SignedDuration::from_secs(4),
            "{node} ({fault:?}) still writes: last write {last}, fault set {faulted_at}"
        );
        assert_eq!(control.fault(node), Ok(*fault));
    }
    phases.done("faults: Leases stand still, pods keep writing");

    for i in 0..2 {
        rig.redfish
            .set_power(i, FakePower::Off, Duration::from_secs(30))
            .await
            .unwrap();
    }
    for ((_, node, _), handle) in cases.iter().zip(&handles) {
        wait_until(
            &format!("writes from {node} to stop after its power cut"),
            Duration::from_secs(15),
            || async {
                let last = rig.storage.last_write(handle, node)?;
                (Timestamp::now().duration_since(last) > jiff::SignedDuration::from_secs(2))
                    .then_some(())
            },
        )
        .await
        .unwrap();
        assert_eq!(
            control.fault(node),
            Ok(Fault::None),
            "power loss ends the fault"
        );
    }
    let writes_after_cut: Vec<u64> = cases
        .iter()
        .zip(&handles)
        .map(|((_, node, _), h)| rig.storage.writes(h, node))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (((_, node, _), h), before) in cases.iter().zip(&handles).zip(&writes_after_cut) {
        assert_eq!(
            rig.storage.writes(h, node),
            *before,
            "{node} writes nothing without power"
        );
    }
    phases.done("power cut at the emulator: writes stop, faults end");

    let powered_on_at = Timestamp::now();
    for i in 0..2 {
        rig.redfish
            .set_power(i, FakePower::On, Duration::from_secs(30))
            .await
            .unwrap();
    }
    for ((_, node, _), handle) in cases.iter().zip(&handles) {
        wait_until(
            &format!("{node}'s healthy kubelet to renew its Lease after power on"),
            Duration::from_secs(30),
            || async { (lease_renew_time(&client, node).await? > powered_on_at).then_some(()) },
        )
        .await
        .unwrap();
        let before = rig.storage.writes(handle, node);
        wait_writes(&rig.storage, handle, node, before + 3).await;
    }
    let violations = rig.storage.violations();
    assert!(violations.is_empty(), "{violations:?}");
    phases.done("power on: kubelets healthy, Leases renewed, pods write again");
    rig.sim.stop().await;
}
