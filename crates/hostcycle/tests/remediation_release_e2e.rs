//! `spec.strategy.release: ReleaseWorkloads` end to end, against the real control plane, the
//! Redfish emulator, simulated kubelets and the real `hostcycle operator` binary: the Node is
//! never deleted; it is tainted `hostcycle.io/fenced` from the power-off request; its pods
//! are force-deleted only after the emulator has the host off; the host is powered on only
//! once no pod of the node is left; the flow is done only when the Node is Ready with a new
//! bootID, and then the taint is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::queue::worker;
use common::remediation::*;
use hostcycle_api::reasons::remediation::event_reason as reason;
use hostcycle_api::remediation::{
    FENCED_TAINT_KEY, HostRemediation, NHC_NODE_NAME_ANNOTATION, RemediationPhase,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

const CYCLE_TIMEOUT: Duration = Duration::from_secs(120);

fn boot_id(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

fn fenced(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == FENCED_TAINT_KEY))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_workloads_keeps_the_node_and_releases_its_pods_only_after_the_host_is_off() {
    let lab = RemediationLab::start(&[worker("rw-0"), worker("rw-1")], &[]).await;
    let node_name = "rw-0";
    lab.namespace("apps", &[]).await;
    lab.deployment("apps", "web", 2, Some(node_name)).await;
    lab.wait_running("apps", "web", 2).await;
    let before = lab.node(node_name).await;
    let old_boot = boot_id(&before);
    assert!(
        !old_boot.is_empty(),
        "the simulated kubelet reports a bootID"
    );
    let pods: Vec<Pod> = lab.pods_on(node_name).await;
    assert_eq!(pods.len(), 2, "both pods run on {node_name}");
    let pod_api: Api<Pod> = Api::namespaced(lab.client.clone(), "apps");
    let mut pod_recs = Vec::new();
    for p in &pods {
        pod_recs.push(Recorder::start(pod_api.clone(), &p.name_any()).await);
    }
    let node_rec = lab.watch_node(node_name).await;

    // A request as a health checker creates it, asking to keep the Node.
    let started = Timestamp::now();
    let request: HostRemediation = serde_json::from_value(serde_json::json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediation",
        "metadata": {
            "name": "release-rw-0",
            "namespace": common::NS,
            "annotations": { NHC_NODE_NAME_ANNOTATION: node_name },
        },
        "spec": { "strategy": { "release": "ReleaseWorkloads", "timeoutSeconds": 120 } },
    }))
    .unwrap();
    lab.requests(common::NS)
        .create(&PostParams::default(), &request)
        .await
        .unwrap();

    // Fenced from the power-off request: the taint comes before the host is off.
    node_rec
        .wait("the fenced taint", CYCLE_TIMEOUT, |s| fenced(&s.object))
        .await;
    let done = lab
        .wait_request(
            common::NS,
            "release-rw-0",
            "phase Succeeded",
            CYCLE_TIMEOUT * 2,
            |r| r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Succeeded),
        )
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.release.as_deref(), Some("ReleaseWorkloads"));
    assert_eq!(status.fenced_boot_id.as_deref(), Some(old_boot.as_str()));

    // The emulator's truth: when the host was first off after the request.
    let off_at = lab
        .off_after(node_name, started)
        .expect("the emulator saw the host off");
    for (pod, rec) in pods.iter().zip(&pod_recs) {
        let name = pod.name_any();
        let gone = rec.deletions();
        let deleted = gone
            .first()
            .unwrap_or_else(|| panic!("pod {name} was force-deleted"));
        assert!(
            deleted.at >= off_at,
            "pod {name} deleted at {} before the emulator had the host off at {off_at}",
            deleted.at
        );
    }
    // The Node was never deleted, is Ready with a new boot, and lost the taint.
    assert!(node_rec.deletions().is_empty(), "the Node is kept");
    let after = lab.node(node_name).await;
    assert_eq!(before.uid(), after.uid(), "the same Node object");
    assert_ne!(boot_id(&after), old_boot, "a new boot");
    assert!(!fenced(&after), "hostcycle's taint is removed at the end");
    // The taint was on the Node before the host was off, and until the new boot.
    let tainted_at = node_rec
        .seen()
        .into_iter()
        .find(|s| fenced(&s.object))
        .map(|s| s.at)
        .unwrap();
    assert!(
        tainted_at <= off_at + jiff::SignedDuration::from_secs(2),
        "tainted from the request"
    );
    let history = lab.lab.settled_history(node_name).await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "exactly one power cycle: {history:?}"
    );
    lab.wait_event_reasons(
        "HostRemediation",
        "release-rw-0",
        &[
            reason::STARTED,
            reason::POWERED_OFF,
            reason::RELEASING_WORKLOADS,
            reason::WORKLOADS_RELEASED,
            reason::POWER_ON_REQUESTED,
            reason::SUCCEEDED,
        ],
    )
    .await;
    // The released pods' replacements run again on the node once it is back.
    lab.wait_running("apps", "web", 2).await;
}
