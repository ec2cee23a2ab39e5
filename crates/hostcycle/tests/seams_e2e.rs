//! Safety at the seams between the controllers, end to end (real control plane, sushy-tools,
//! simulated kubelets, the real operator binary):
//! - a forged Node annotation never gets another node's host powered off;
//! - a remediation keeps the host it bound at the start after it deleted the Node (a host
//!   named unlike its node, found through the provider ID; a Cluster API Machine without the
//!   host annotation, found through its Metal3Machine's consumerRef — and the orphan sweep
//!   never touches that fence), and an administrator's cordon and taint survive it;
//! - a stale `poweredOn: false` with the BMC unreachable never releases the Node, and past
//!   the power-off deadline the flow holds (`CannotFence`) instead of escalating;
//! - the reboot queue drains nothing while a remediation holds a node fenced without its Node,
//!   and carries on after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::queue::*;
use common::remediation::*;
use common::{NS, SECRET};
use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{EntryPhase, NODE_HOST_ANNOTATION};
use hostcycle_api::remediation::{
    MACHINE_POWER_OFF_ANNOTATION, REQUEST_POWER_OFF_PREFIX, RemediationPhase, RemediationStep,
};
use hostcycle_testkit::MachineKind;
use hostcycle_testkit::bmc_emulators::FakePower;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The template every request of these tests is made from: one power cycle, 120 s for the
/// Node to come back.
const TEMPLATE: &str = "hostcycle-reboot";

async fn template(lab: &RemediationLab) {
    one_cycle_template(lab, NS, TEMPLATE).await;
}

/// Whether a version of a host carries any of remediation's power-off annotations.
fn fenced(h: &BareMetalHost) -> bool {
    h.annotations().keys().any(|k| {
        k.as_str() == MACHINE_POWER_OFF_ANNOTATION || k.starts_with(REQUEST_POWER_OFF_PREFIX)
    })
}

fn phase(r: &hostcycle_api::remediation::HostRemediation) -> RemediationPhase {
    r.status.as_ref().map(|s| s.phase()).unwrap_or_default()
}

/// The emulator never saw the host off, and no version of it carried a power-off request.
async fn assert_untouched(lab: &RemediationLab, host: &str, rec: &Recorder<BareMetalHost>) {
    let history = lab.lab.settled_history(host).await;
    assert_eq!(
        history.power_offs(),
        0,
        "{host} was powered off: {history:?}\noperator log: {}",
        lab.operator_log()
    );
    let seen: Vec<_> = rec
        .seen()
        .into_iter()
        .filter(|s| fenced(&s.object))
        .map(|s| s.object.annotations().clone())
        .collect();
    assert!(
        seen.is_empty(),
        "{host} got a power-off request: {seen:?}\noperator log: {}",
        lab.operator_log()
    );
}

/// Seams scenario 1: the kubelet of f-1 annotates its own Node with f-0's host.
/// (a) A NodeHealthCheck request for f-1 (no Machine): the annotation and the same-name host
/// disagree, so nothing is powered — the request is Blocked (HostBindingConflict), with a
/// Warning naming both hosts. (b) With f-1's Machine naming its real host (a Cluster API
/// MachineHealthCheck request), f-1 is fenced and recovered; the forged hint is reported.
/// f-0 is never powered off and never carries a power-off request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_node_annotation_never_powers_the_other_host() {
    let lab = RemediationLab::start(&[worker("f-0"), worker("f-1")], &[]).await;
    template(&lab).await;
    let victim = lab.watch_host("f-0").await;
    lab.label_node("f-1", &[], &[(NODE_HOST_ANNOTATION, "default/f-0")])
        .await;

    // (a) No authoritative link: refused.
    lab.create_nhc_request(NS, TEMPLATE, "f-1").await;
    let blocked = lab
        .wait_request(
            NS,
            "f-1",
            "Blocked=True, HostBindingConflict",
            CYCLE_TIMEOUT,
            |r| condition(r, "Blocked") == Some(("True".into(), "HostBindingConflict".into())),
        )
        .await;
    let message = blocked.status.as_ref().unwrap().message.clone();
    assert!(
        message.contains("default/f-0") && message.contains("default/f-1"),
        "the refusal names both candidates: {message}"
    );
    let events = lab
        .wait_event_reasons("HostRemediation", "f-1", &["RemediationBlocked"])
        .await;
    assert!(
        events.iter().any(|(t, r, note)| t == "Warning"
            && r == "RemediationBlocked"
            && note.contains("default/f-0")),
        "{events:?}"
    );
    // Long enough for several passes of the loop (woken by every change, 30 s resync).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let still = lab.requests(NS).get("f-1").await.unwrap();
    assert_eq!(
        still.status.as_ref().unwrap().step,
        RemediationStep::NotStarted,
        "blocked: nothing done"
    );
    assert!(!fenced(&lab.lab.get("f-1").await), "f-1 not fenced either");
    lab.delete_request(NS, "f-1").await;
    lab.wait_request_gone(NS, "f-1", Duration::from_secs(30))
        .await;

    // The reboot queue binds the same way: f-1's entry waits, Blocked, naming both hosts; its
    // node is not drained and no host is asked to reboot.
    let entry = lab.queue("f-1").await;
    let waiting = lab
        .wait_entry("f-1", "Blocked=True", REBOOT_TIMEOUT, |e| {
            e.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Blocked" && c.status == "True")
            })
        })
        .await;
    let blocked = waiting
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .unwrap()
        .clone();
    assert!(
        blocked.message.contains("default/f-0") && blocked.message.contains("default/f-1"),
        "the condition names both candidates: {blocked:?}"
    );
    assert_eq!(waiting.phase(), EntryPhase::Queued);
    lab.wait_event_reasons_about(&entry, &["RebootBlocked"])
        .await;
    assert!(!cordoned(&lab.node("f-1").await), "f-1 not drained");
    lab.cancel("f-1").await;
    lab.wait_entry_gone("f-1", REBOOT_TIMEOUT).await;

    // (b) f-1's Machine names its real host: that one is fenced, the hint is ignored.
    let old_uid = lab.node("f-1").await.uid().unwrap();
    let machine = lab
        .create_machine(
            MachineKind::ClusterApi,
            NS,
            "machine-f-1",
            "f-1",
            "f-1",
            &[],
        )
        .await;
    lab.create_mhc_request(NS, TEMPLATE, &machine, "e2e").await;
    let done = lab
        .wait_request(
            NS,
            "machine-f-1",
            "phase Succeeded",
            CYCLE_TIMEOUT * 2,
            |r| phase(r) == RemediationPhase::Succeeded,
        )
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.host.as_deref(), Some("default/f-1"));
    assert_eq!(
        status.host_uid,
        lab.lab.get("f-1").await.uid(),
        "the host's uid bound at the start"
    );
    lab.wait_node_back("f-1", &old_uid, CYCLE_TIMEOUT).await;
    let events = lab
        .wait_event_reasons("HostRemediation", "machine-f-1", &["NodeHostHintIgnored"])
        .await;
    assert!(
        events.iter().any(|(t, r, note)| t == "Warning"
            && r == "NodeHostHintIgnored"
            && note.contains("default/f-0")),
        "{events:?}"
    );
    let f1 = lab.lab.settled_history("f-1").await;
    assert_eq!((f1.power_offs(), f1.power_ons()), (1, 1), "f-1: {f1:?}");
    assert_untouched(&lab, "f-0", &victim).await;
}

/// Seams scenario 2 and the administrator's intent, two remediations at once:
/// - r-0's host is `rack-7-r-0`, found only through the Node's provider ID (a
///   NodeHealthCheck request, no Machine). The Node carries an administrator's cordon and
///   taint. The flow deletes the Node, keeps its host through the recorded binding, powers it
///   on, and the Node comes back cordoned and tainted.
/// - r-1 belongs to a Cluster API Machine without the `metal3.io/BareMetalHost` annotation:
///   its host is the one whose consumerRef is the Machine's Metal3Machine. The annotation flow
///   completes; the host's power-off is added once and removed once — the orphan sweep never
///   strips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remediations_keep_their_host_after_the_node_is_deleted() {
    let lab = RemediationLab::start(
        &[worker("r-0"), worker("r-1")],
        &["--max-concurrent-remediations", "2"],
    )
    .await;
    template(&lab).await;

    // r-0: the host re-created under another name, named by the Node's provider ID.
    let address = lab
        .lab
        .redfish
        .system_address(lab.lab.index("r-0"))
        .unwrap();
    lab.lab
        .hosts
        .delete("r-0", &DeleteParams::default())
        .await
        .unwrap();
    let renamed = BareMetalHost::externally_provisioned("rack-7-r-0", &address, SECRET);
    lab.lab
        .hosts
        .create(&PostParams::default(), &renamed)
        .await
        .unwrap();
    lab.lab
        .wait_host("rack-7-r-0", "on and OK", CYCLE_TIMEOUT, |h| {
            powered_on(h) == Some(true)
                && h.status
                    .as_ref()
                    .and_then(|s| s.operational_status)
                    .map(|s| s.as_str())
                    == Some("OK")
        })
        .await;
    let host_uid = lab.lab.get("rack-7-r-0").await.uid().unwrap();
    lab.nodes
        .patch(
            "r-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({
                "spec": {
                    "providerID": "metal3://default/rack-7-r-0/m3m-r-0",
                    "unschedulable": true,
                    "taints": [{ "key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule" }],
                },
            })),
        )
        .await
        .unwrap();
    let r0_uid = lab.node("r-0").await.uid().unwrap();

    // r-1: a Cluster API Machine → Metal3Machine m3m-r-1 ← the host's consumerRef.
    let mut m = hostcycle_testkit::machine(
        MachineKind::ClusterApi,
        NS,
        "machine-r-1",
        None,
        Some("r-1"),
        &[],
    );
    m.data["status"]["phase"] = json!("Running");
    m.data["spec"] = json!({
        "clusterName": "e2e",
        "bootstrap": {},
        "infrastructureRef": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "Metal3Machine",
            "name": "m3m-r-1",
            "namespace": NS,
        },
    });
    hostcycle_testkit::create_machine_object(&lab.client, MachineKind::ClusterApi, &m)
        .await
        .unwrap();
    lab.lab
        .patch_spec(
            "r-1",
            json!({ "consumerRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "Metal3Machine",
                "name": "m3m-r-1",
                "namespace": NS,
            }}),
        )
        .await;
    let r1_uid = lab.node("r-1").await.uid().unwrap();
    let r1_host = lab.watch_host("r-1").await;
    let machine = MachineRef {
        kind: MachineKind::ClusterApi,
        namespace: NS.into(),
        name: "machine-r-1".into(),
    };
    let r0_node = lab.watch_node("r-0").await;

    lab.create_nhc_request(NS, TEMPLATE, "r-0").await;
    lab.mark(&machine).await;

    let done = lab
        .wait_request(NS, "r-0", "phase Succeeded", CYCLE_TIMEOUT * 2, |r| {
            phase(r) == RemediationPhase::Succeeded
        })
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.host.as_deref(), Some("default/rack-7-r-0"));
    assert_eq!(status.host_uid.as_deref(), Some(host_uid.as_str()));
    assert_eq!(r0_node.deletions().len(), 1, "the Node was released once");
    let back = lab.wait_node_back("r-0", &r0_uid, CYCLE_TIMEOUT).await;
    // Read after Succeeded: the restore happens before it.
    let back = lab.node(&back.name_any()).await;
    let spec = back.spec.clone().unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true), "the admin's cordon is back");
    assert!(
        spec.taints
            .iter()
            .flatten()
            .any(|t| t.key == "example.com/dedicated"
                && t.value.as_deref() == Some("storage")
                && t.effect == "NoSchedule"),
        "the admin's taint is back: {:?}",
        spec.taints
    );
    let r0 = lab.lab.settled_history("r-0").await;
    assert_eq!((r0.power_offs(), r0.power_ons()), (1, 1), "r-0: {r0:?}");

    lab.wait_machine_clean(&machine, CYCLE_TIMEOUT * 2).await;
    lab.wait_node_back("r-1", &r1_uid, CYCLE_TIMEOUT).await;
    let r1 = lab.lab.settled_history("r-1").await;
    assert_eq!((r1.power_offs(), r1.power_ons()), (1, 1), "r-1: {r1:?}");
    // The fence went on once and off once: the orphan sweep never took it away mid-flow.
    let fences: Vec<bool> = r1_host
        .seen()
        .iter()
        .filter(|s| !s.deleted)
        .map(|s| {
            s.object
                .annotations()
                .contains_key(MACHINE_POWER_OFF_ANNOTATION)
        })
        .collect();
    let mut flips = fences.clone();
    flips.dedup();
    assert_eq!(
        flips,
        vec![false, true, false],
        "capbm-requested-power-off added once and removed once: {fences:?}"
    );
    let host_events = lab.events_for("BareMetalHost", "r-1").await;
    assert!(
        !host_events
            .iter()
            .any(|(_, r, _)| r == "RemediationOrphanReleased"),
        "{host_events:?}"
    );
}

/// Seams scenario 4: s-0 is held off (its status says `poweredOn: false`), then its host
/// controller can no longer reach the BMC, then the machine is powered on at the BMC and its
/// Node is Ready again. A remediation of s-0 must not take the stale "off" for proof: the
/// Node is never deleted; the power-off is not confirmed by its deadline (20 s here), so the
/// remediation holds with `CannotFence` and escalates nothing (issue 24, case 5: never on a
/// timeout); withdrawing the request releases its power-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_powered_off_status_never_releases_the_node() {
    let lab = RemediationLab::start(
        &[worker("s-0")],
        &["--remediation-power-off-timeout", "20s"],
    )
    .await;
    template(&lab).await;
    lab.lab.annotate("s-0", HOLD_ANNOTATION, "").await;
    lab.lab
        .wait_host("s-0", "held off", CYCLE_TIMEOUT, |h| {
            powered_on(h) == Some(false)
        })
        .await;
    lab.block_bmc("s-0").await;
    let index = lab.lab.index("s-0");
    lab.lab.redfish.reset(index, "On").await.unwrap();
    lab.lab
        .redfish
        .wait_for_power(index, FakePower::On, CYCLE_TIMEOUT)
        .await
        .unwrap();
    lab.wait_node("s-0", "Ready again", CYCLE_TIMEOUT, |n| {
        hostcycle_sim::node_ready(n) == Some(true)
    })
    .await;
    let stale = lab.lab.get("s-0").await;
    assert_eq!(powered_on(&stale), Some(false), "the status is stale");
    let node_uid = lab.node("s-0").await.uid().unwrap();
    let node_rec = lab.watch_node("s-0").await;

    lab.create_nhc_request(NS, TEMPLATE, "s-0").await;
    let waiting = lab
        .wait_request(
            NS,
            "s-0",
            "waiting for a confirmed power-off",
            CYCLE_TIMEOUT,
            |r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("confirmed off"))
            },
        )
        .await;
    assert_eq!(
        waiting.status.as_ref().unwrap().step,
        RemediationStep::PowerOffRequested
    );
    let held = lab
        .wait_request(
            NS,
            "s-0",
            "held: cannot fence",
            Duration::from_secs(90),
            |r| condition_status(r, "CannotFence") == "True",
        )
        .await;
    assert_eq!(
        held.status.as_ref().unwrap().step,
        RemediationStep::PowerOffRequested,
        "nothing is given up or escalated on a timeout"
    );
    assert_eq!(condition_status(&held, "Succeeded"), "Unknown");
    let message = &held.status.as_ref().unwrap().message;
    assert!(message.contains("not confirmed off"), "{message}");
    assert!(
        request_power_off_requested(&lab.lab.get("s-0").await),
        "the power-off stays requested while the flow holds"
    );
    // A person decides: the request is withdrawn.
    lab.delete_request(NS, "s-0").await;
    let node = lab.node("s-0").await;
    assert_eq!(node.uid().as_deref(), Some(node_uid.as_str()));
    assert!(
        node_rec.deletions().is_empty(),
        "the Node was deleted while its machine ran\noperator log: {}",
        lab.operator_log()
    );
    // Nothing of the remediation is left on the host (the test's own hold stays).
    lab.lab
        .wait_host(
            "s-0",
            "the remediation's power-off released",
            CYCLE_TIMEOUT,
            |h| {
                !h.annotations()
                    .keys()
                    .any(|k| k.starts_with(REQUEST_POWER_OFF_PREFIX))
            },
        )
        .await;
}

/// Seams scenario 3: while a remediation holds q-1 fenced with its Node deleted, `rq add q-0`
/// (maxUnreachableNodes 0) starts no drain — q-1 counts as unreachable although it has no
/// Node. Once the remediation is over, q-0 is drained and rebooted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_queue_drains_nothing_while_a_remediation_holds_a_node_fenced() {
    let lab = RemediationLab::start(&[worker("q-0"), worker("q-1"), worker("q-2")], &[]).await;
    template(&lab).await;
    let q1_uid = lab.node("q-1").await.uid().unwrap();
    let q1_node = lab.watch_node("q-1").await;
    let hold = lab.hold_when("q-1", fenced).await;
    lab.create_nhc_request(NS, TEMPLATE, "q-1").await;
    tokio::time::timeout(CYCLE_TIMEOUT, hold)
        .await
        .expect("the power-off reaches q-1")
        .unwrap();
    q1_node
        .wait("the Node deleted", CYCLE_TIMEOUT, |s| s.deleted)
        .await;
    lab.wait_request(NS, "q-1", "waiting for the Node", CYCLE_TIMEOUT, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.step == RemediationStep::PowerOnRequested)
    })
    .await;
    assert!(lab.nodes.get_opt("q-1").await.unwrap().is_none());

    let q0_node = lab.watch_node("q-0").await;
    lab.queue("q-0").await;
    let waiting = lab
        .wait_entry(
            "q-0",
            "waiting on the unreachable gate",
            REBOOT_TIMEOUT,
            |e| {
                e.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("unreachable") && s.message.contains("q-1"))
            },
        )
        .await;
    assert_eq!(waiting.phase(), EntryPhase::Queued);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        lab.entry("q-0").await.unwrap().phase(),
        EntryPhase::Queued,
        "no drain while q-1 is fenced"
    );
    let cordoned_versions: Vec<Node> = q0_node
        .seen()
        .into_iter()
        .filter(|s| cordoned(&s.object))
        .map(|s| s.object)
        .collect();
    assert!(
        cordoned_versions.is_empty(),
        "q-0 was cordoned while q-1 was fenced: {cordoned_versions:?}"
    );
    assert_eq!(lab.lab.settled_history("q-0").await.power_offs(), 0);

    // The remediation ends: the queue carries on.
    lab.lab.unannotate("q-1", HOLD_ANNOTATION).await;
    lab.wait_node_back("q-1", &q1_uid, CYCLE_TIMEOUT).await;
    lab.wait_request(NS, "q-1", "phase Succeeded", CYCLE_TIMEOUT, |r| {
        phase(r) == RemediationPhase::Succeeded
    })
    .await;
    lab.wait_entry_gone("q-0", REBOOT_TIMEOUT * 2).await;
    assert_eq!(lab.power_cycles("q-0").await, 1, "q-0 rebooted once");
    assert!(!cordoned(&lab.node("q-0").await), "q-0 uncordoned");
}

/// `--remediation-request-namespaces` (default `same-as-host`): a NodeHealthCheck request
/// created in a tenant's namespace names node r-0, whose host lives in `default`: Blocked
/// (RequestNamespaceNotAllowed) with a Warning saying which flag to widen, and the host is
/// never fenced. The same request in the host's namespace fences and recovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_from_another_namespace_cannot_fence_a_host() {
    // The operator's default rule (its Lease, in `default`, is the hosts' namespace here).
    let lab = RemediationLab::start(
        &[worker("r-0")],
        &[
            "--remediation-request-namespaces",
            "same-as-host,operator-namespace",
        ],
    )
    .await;
    let tenant = "tenant-a";
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(lab.lab.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": tenant } })).unwrap(),
        )
        .await
        .unwrap();
    template(&lab).await;
    lab.create_template(
        tenant,
        TEMPLATE,
        json!({ "strategy": { "type": "Reboot", "retryLimit": 0, "timeoutSeconds": 120 } }),
    )
    .await;
    let host = lab.watch_host("r-0").await;

    lab.create_nhc_request(tenant, TEMPLATE, "r-0").await;
    let blocked = lab
        .wait_request(
            tenant,
            "r-0",
            "Blocked=True, RequestNamespaceNotAllowed",
            CYCLE_TIMEOUT,
            |r| {
                condition(r, "Blocked")
                    == Some(("True".into(), "RequestNamespaceNotAllowed".into()))
            },
        )
        .await;
    let message = blocked.status.as_ref().unwrap().message.clone();
    assert!(
        message.contains(tenant)
            && message.contains("default/r-0")
            && message.contains("--remediation-request-namespaces"),
        "the refusal names the request's namespace, the host and the flag: {message}"
    );
    let events = lab
        .wait_event_reasons("HostRemediation", "r-0", &["RemediationBlocked"])
        .await;
    assert!(
        events.iter().any(|(t, r, note)| t == "Warning"
            && r == "RemediationBlocked"
            && note.contains(tenant)),
        "{events:?}"
    );
    // Several passes of the loop: still nothing done.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let still = lab.requests(tenant).get("r-0").await.unwrap();
    assert_eq!(
        still.status.as_ref().unwrap().step,
        RemediationStep::NotStarted
    );
    assert_untouched(&lab, "r-0", &host).await;
    lab.delete_request(tenant, "r-0").await;
    lab.wait_request_gone(tenant, "r-0", Duration::from_secs(30))
        .await;

    // From the host's own namespace, the same request goes ahead.
    lab.create_nhc_request(NS, TEMPLATE, "r-0").await;
    lab.wait_request(NS, "r-0", "the host fenced", CYCLE_TIMEOUT, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.step != RemediationStep::NotStarted)
    })
    .await;
    lab.lab
        .wait_host(
            "r-0",
            "the host fenced by the request",
            CYCLE_TIMEOUT,
            fenced,
        )
        .await;
}
