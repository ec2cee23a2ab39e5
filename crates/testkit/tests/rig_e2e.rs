//! Proof that the rig is real: a real control plane, the sushy-tools Redfish emulator and the
//! node simulator. Nodes register and turn Ready; the real scheduler places a Deployment's pods
//! on them; powering a host off through Redfish makes the real node-lifecycle controller mark
//! its Node NotReady; powering it on brings it back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{NodeSimulator, SimConfig, SimHost, node_ready};
use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::{ClusterOptions, LocalCluster, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};

const USER: &str = "rig";
const PASSWORD: &str = "rig-secret";

struct Phases(Instant);

impl Phases {
    fn done(&mut self, phase: &str) {
        eprintln!("phase {phase:<55} {:>7.2?}", self.0.elapsed());
        self.0 = Instant::now();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_follow_redfish_power_through_the_real_node_lifecycle_controller() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube_client=off")
        .with_test_writer()
        .try_init();
    let mut phases = Phases(Instant::now());

    let cluster = LocalCluster::start(ClusterOptions {
        node_monitor_grace_period: Duration::from_secs(6),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    phases.done("control plane ready");

    let systems: Vec<FakeSystem> = (0..3)
        .map(|i| FakeSystem::new(format!("rig-{i}"), FakePower::On))
        .collect();
    let redfish = RedfishEmulator::start(RedfishEmulatorOptions {
        systems: systems.clone(),
        basic_auth: Some((USER.into(), PASSWORD.into())),
        tls: false,
        ..RedfishEmulatorOptions::default()
    })
    .await
    .unwrap();
    phases.done("Redfish emulator ready");

    let connector = hostcycle_sim::bmc_connector();
    let credentials = BmcCredentials::new(USER, PASSWORD).unwrap();
    let hosts = (0..3)
        .map(|i| SimHost {
            node_name: format!("rig-{i}"),
            control_plane: i == 0,
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
    let sim = NodeSimulator::new(cluster.client(), config, hosts).spawn();

    let nodes: Api<Node> = Api::all(cluster.client());
    wait_until(
        "3 simulated nodes to be Ready",
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
                    == 3)
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let cp = nodes.get("rig-0").await.unwrap();
    assert!(
        cp.metadata
            .labels
            .unwrap()
            .contains_key("node-role.kubernetes.io/control-plane")
    );
    phases.done("3 nodes Ready");

    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    let deployment = hostcycle_testkit::pause_deployment("web", 3);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let running = wait_until(
        "3 web pods scheduled onto simulated nodes and Running+Ready",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app=web"))
                    .await
                    .ok()?;
                let running: Vec<(String, String)> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .filter_map(|p| {
                        Some((
                            p.metadata.name.clone()?,
                            p.spec.as_ref()?.node_name.clone()?,
                        ))
                    })
                    .collect();
                (running.len() == 3).then_some(running)
            }
        },
    )
    .await
    .unwrap();
    for (_, node) in &running {
        assert!(
            node.starts_with("rig-"),
            "pod placed on unexpected node {node}"
        );
    }
    phases.done("Deployment scheduled by the real scheduler, pods Running");

    // Power rig-2 off through Redfish; the real node-lifecycle controller must notice.
    redfish.reset(2, "ForceOff").await.unwrap();
    wait_until("Node rig-2 to turn NotReady/Unknown after power off", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move { (node_ready(&nodes.get("rig-2").await.ok()?) == Some(false)).then_some(()) }
    })
    .await
    .unwrap();
    let reason = nodes
        .get("rig-2")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        reason.status, "Unknown",
        "node-lifecycle controller marks a silent node Unknown"
    );
    phases.done("power off via Redfish -> Node NotReady (node lifecycle)");

    redfish.reset(2, "On").await.unwrap();
    wait_until(
        "Node rig-2 to be Ready again after power on",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { (node_ready(&nodes.get("rig-2").await.ok()?) == Some(true)).then_some(()) }
        },
    )
    .await
    .unwrap();
    phases.done("power on via Redfish -> Node Ready");

    sim.stop().await;
}
