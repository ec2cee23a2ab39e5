//! Issue 24, "trust only what hostcycle observed", end to end (real control plane, sushy-tools,
//! simulated kubelets, the real operator binary). Each test is a case that released a running
//! machine's Node, or powered off the wrong machine, before power evidence became the host
//! controller's recorded BMC readings (`status.powerObservation`):
//! - case 1: a host detached while its remediation waits for a confirmed power-off (its machine
//!   running behind a stale `poweredOn: false`): the detach writes a fresh status, which once
//!   counted as "off";
//! - case 2: the host's `spec.bmc.address` changed to another host's BMC during a remediation:
//!   that other machine was powered off, and the Node released while its own machine ran;
//! - case 3: a record forged in a Machine's annotations (a host, a start, Node backups) is never
//!   read: it once powered off the host it named and restored its labels onto the Node;
//! - case 5 (the host): leaving the provisioned states with its BMC unreadable, a host was
//!   reported `available` at once while its machine ran;
//! - case 5: not confirmed off by the deadline: the flow holds with `CannotFence` and escalates
//!   nothing (no Machine handed back, no host marked), until a person withdraws it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::NS;
use common::queue::*;
use common::remediation::*;
use hostcycle_api::reasons::remediation::event_reason as rev;
use hostcycle_api::remediation::{RemediationPhase, RemediationStep};
use hostcycle_testkit::MachineKind;
use hostcycle_testkit::bmc_emulators::FakePower;
use hostcycle_testkit::wait_until;
use kube::ResourceExt;
use serde_json::json;

const TEMPLATE: &str = "hostcycle-reboot";
/// The power-off deadline these tests give the operator.
const OFF_TIMEOUT: &str = "20s";
/// Past the deadline, with room for a poll.
const PAST_DEADLINE: Duration = Duration::from_secs(60);

async fn template(lab: &RemediationLab) {
    one_cycle_template(lab, NS, TEMPLATE).await;
}

/// The host is held off by the test, its BMC then rejects the operator's credentials, and its
/// machine is powered on behind its back: the status keeps a stale `poweredOn: false` while
/// the Node is Ready. Returns the Node's uid.
async fn stale_off_with_machine_running(lab: &RemediationLab, host: &str) -> String {
    lab.lab.annotate(host, HOLD_ANNOTATION, "").await;
    lab.lab
        .wait_host(host, "held off", CYCLE_TIMEOUT, |h| {
            powered_on(h) == Some(false)
        })
        .await;
    lab.block_bmc(host).await;
    let index = lab.lab.index(host);
    lab.lab.redfish.reset(index, "On").await.unwrap();
    lab.lab
        .redfish
        .wait_for_power(index, FakePower::On, CYCLE_TIMEOUT)
        .await
        .unwrap();
    lab.wait_node(host, "Ready again", CYCLE_TIMEOUT, |n| {
        hostcycle_sim::node_ready(n) == Some(true)
    })
    .await;
    assert_eq!(
        powered_on(&lab.lab.get(host).await),
        Some(false),
        "the status is stale"
    );
    lab.node(host).await.uid().unwrap()
}

/// Waits until the request holds with `CannotFence=True`, and checks that nothing was
/// released or escalated: the step is still PowerOffRequested, the Node is the same object.
async fn assert_held_cannot_fence(
    lab: &RemediationLab,
    request: &str,
    node: &str,
    node_uid: &str,
    nodes: &Recorder<k8s_openapi::api::core::v1::Node>,
    why: &str,
) {
    let held = lab
        .wait_request(NS, request, "held with CannotFence", PAST_DEADLINE, |r| {
            condition_status(r, "CannotFence") == "True"
        })
        .await;
    let status = held.status.as_ref().unwrap();
    assert_eq!(
        status.step,
        RemediationStep::PowerOffRequested,
        "{status:?}"
    );
    assert_eq!(status.phase(), RemediationPhase::Running);
    assert!(status.message.contains(why), "{}", status.message);
    assert_eq!(condition_status(&held, "Succeeded"), "Unknown");
    let node = lab.node(node).await;
    assert_eq!(node.uid().as_deref(), Some(node_uid));
    assert!(
        nodes.deletions().is_empty(),
        "the Node was deleted while its machine ran\noperator log: {}",
        lab.operator_log()
    );
    lab.wait_event_reasons("HostRemediation", request, &[rev::CANNOT_FENCE])
        .await;
}

/// Case 1: the administrator detaches the host (as one does with a broken BMC) while the
/// remediation waits for a confirmed power-off. The detach writes a fresh status carrying the
/// stale `poweredOn: false`; it is no reading, and a detached host is never confirmed off: the
/// Node is kept, and past the deadline the flow holds with `CannotFence`. Withdrawing the
/// request releases the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn detaching_a_host_during_a_fence_never_releases_its_node() {
    let lab = RemediationLab::start(
        &[worker("d-0")],
        &["--remediation-power-off-timeout", OFF_TIMEOUT],
    )
    .await;
    template(&lab).await;
    let node_uid = stale_off_with_machine_running(&lab, "d-0").await;
    let nodes = lab.watch_node("d-0").await;

    lab.create_nhc_request(NS, TEMPLATE, "d-0").await;
    lab.wait_request(
        NS,
        "d-0",
        "waiting for a confirmed power-off",
        CYCLE_TIMEOUT,
        |r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.message.contains("confirmed off"))
        },
    )
    .await;
    lab.lab
        .annotate("d-0", "baremetalhost.metal3.io/detached", "")
        .await;
    let detached = lab
        .lab
        .wait_host(
            "d-0",
            "detached, with a fresh status write",
            CYCLE_TIMEOUT,
            |h| operational_status(h) == Some("detached"),
        )
        .await;
    let status = detached.status.as_ref().unwrap();
    assert_eq!(status.powered_on, Some(false), "poweredOn carried over");
    assert_eq!(status.power_observation, None, "no reading evidence left");

    assert_held_cannot_fence(&lab, "d-0", "d-0", &node_uid, &nodes, "detached").await;

    // A person decides: the request is withdrawn, and the remediation's power-off goes.
    lab.delete_request(NS, "d-0").await;
    lab.wait_request_gone(NS, "d-0", CYCLE_TIMEOUT).await;
    lab.lab
        .wait_host(
            "d-0",
            "the remediation's power-off released",
            CYCLE_TIMEOUT,
            |h| !request_power_off_requested(h),
        )
        .await;
    assert!(nodes.deletions().is_empty());
}

/// Case 2: a Cluster API remediation of b-0 waits (b-0's BMC rejects the credentials); an
/// editor then points b-0's host at b-1's BMC with working credentials. The host controller
/// sends nothing to b-1's BMC (the request was made of b-0's machine) and the remediation
/// never takes b-1's readings for b-0's: b-1 is never powered off, Node b-0 is kept, and past
/// the deadline the flow holds with `CannotFence` — nothing escalated (case 5): the Machine
/// gets no `OwnerRemediated=False`, the host no unhealthy mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pointing_a_fenced_host_at_another_bmc_powers_nothing_and_releases_nothing() {
    let lab = RemediationLab::start(
        &[worker("b-0"), worker("b-1")],
        &["--remediation-power-off-timeout", OFF_TIMEOUT],
    )
    .await;
    template(&lab).await;
    let node_uid = lab.node("b-0").await.uid().unwrap();
    let other_address = lab.lab.get("b-1").await.spec.bmc.unwrap().address;
    let other_since = jiff::Timestamp::now();
    let nodes = lab.watch_node("b-0").await;
    let machine = lab
        .create_machine(
            MachineKind::ClusterApi,
            NS,
            "m-b-0",
            "b-0",
            "b-0",
            &[("cluster.x-k8s.io/cluster-name", "e2e")],
        )
        .await;

    lab.block_bmc("b-0").await;
    lab.create_mhc_request(NS, TEMPLATE, &machine, "e2e").await;
    lab.wait_request(
        NS,
        "m-b-0",
        "power-off requested and waiting",
        CYCLE_TIMEOUT,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.step == RemediationStep::PowerOffRequested && s.host_bmc.is_some()
            })
        },
    )
    .await;
    // The "fix": b-0's host now names b-1's BMC, with credentials that work there.
    lab.lab
        .patch_spec(
            "b-0",
            json!({ "bmc": { "address": other_address, "credentialsName": common::SECRET } }),
        )
        .await;
    lab.wait_event_reasons("BareMetalHost", "b-0", &["BMCChangedUnderRequest"])
        .await;
    lab.wait_event_reasons("HostRemediation", "m-b-0", &[rev::BMC_CHANGED])
        .await;

    assert_held_cannot_fence(&lab, "m-b-0", "b-0", &node_uid, &nodes, "spec.bmc").await;
    // b-1's machine was never powered off through b-0's host.
    let history = lab.lab.settled_history("b-1").await;
    assert_eq!(
        history.off_after(other_since),
        None,
        "b-1 was powered off: {history:?}\noperator log: {}",
        lab.operator_log()
    );
    // Nothing escalated.
    let m = lab.machine(&machine).await;
    let conditions = m.data["status"]["conditions"].clone();
    assert!(
        find_condition(&conditions, "OwnerRemediated").is_null(),
        "the Machine was handed back: {conditions}"
    );
    let host = lab.lab.get("b-0").await;
    assert!(
        !host.annotations().keys().any(|k| k.ends_with("/unhealthy")),
        "the host was marked: {:?}",
        host.annotations()
    );

    // Withdrawn: the power-off goes, and the host is managed through its new BMC as usual.
    lab.delete_request(NS, "m-b-0").await;
    lab.wait_request_gone(NS, "m-b-0", CYCLE_TIMEOUT).await;
    lab.lab
        .wait_host(
            "b-0",
            "managed again through its new BMC",
            CYCLE_TIMEOUT,
            |h| {
                !request_power_off_requested(h)
                    && h.status.as_ref().is_some_and(|s| {
                        s.power_observation
                            .as_ref()
                            .is_some_and(|o| o.bmc.address == other_address)
                    })
            },
        )
        .await;
}

/// Case 7: two triggers for one host — an OpenShift Machine's annotation and a NodeHealthCheck
/// request for its Node — make one remediation, not two in a row: the request joins the
/// running flow (`RemediationJoined`) and ends with it. The host is powered off once, the Node
/// deleted once, and both end succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_triggers_for_one_host_fence_it_once() {
    let lab = RemediationLab::start(&[worker("j-0")], &[]).await;
    template(&lab).await;
    let nodes = lab.watch_node("j-0").await;
    let old_uid = lab.node("j-0").await.uid().unwrap();
    let machine = lab
        .create_machine(MachineKind::OpenShift, NS, "m-j-0", "j-0", "j-0", &[])
        .await;
    lab.mark(&machine).await;
    lab.lab
        .wait_host(
            "j-0",
            "the Machine flow's power-off",
            CYCLE_TIMEOUT,
            machine_power_off_requested,
        )
        .await;
    lab.create_nhc_request(NS, TEMPLATE, "j-0").await;
    let joined = lab
        .wait_request(NS, "j-0", "joined the running flow", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().is_some_and(|s| s.joined.is_some())
        })
        .await;
    assert_eq!(
        joined.status.as_ref().unwrap().step,
        RemediationStep::NotStarted
    );
    lab.wait_event_reasons("HostRemediation", "j-0", &[rev::JOINED])
        .await;

    lab.wait_node_back("j-0", &old_uid, Duration::from_secs(300))
        .await;
    lab.wait_machine_clean(&machine, CYCLE_TIMEOUT).await;
    let done = lab
        .wait_request(
            NS,
            "j-0",
            "succeeded with the flow it joined",
            CYCLE_TIMEOUT,
            |r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.phase() == RemediationPhase::Succeeded)
            },
        )
        .await;
    assert_eq!(done.status.as_ref().unwrap().step, RemediationStep::Done);
    // One power cycle, one Node deletion, and the request never put a power-off of its own.
    let history = lab.lab.settled_history("j-0").await;
    assert_eq!(
        history.power_offs(),
        1,
        "one power-off: {history:?}\noperator log: {}",
        lab.operator_log()
    );
    assert_eq!(
        nodes.deletions().len(),
        1,
        "the Node was deleted once\noperator log: {}",
        lab.operator_log()
    );
    let host = lab.lab.get("j-0").await;
    assert!(
        !request_power_off_requested(&host),
        "{:?}",
        host.annotations()
    );
}

/// The flow records of the Machine with `uid`, wherever they are (ConfigMaps labelled with it).
async fn flow_records(lab: &RemediationLab, uid: &str) -> Vec<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(lab.client.clone());
    api.list(&kube::api::ListParams::default().labels(&format!(
        "{}={uid}",
        hostcycle_api::remediation::MACHINE_FLOW_RECORD_LABEL
    )))
    .await
    .unwrap()
    .items
    .iter()
    .map(|cm| cm.name_any())
    .collect()
}

/// Case 3: a record written onto a Machine by anyone who may edit it — hostcycle's own markers
/// naming another machine's host, a start time, and a Node backup carrying the control-plane
/// label — is never read as a record. The trigger beside it is held (`RemediationHeldElsewhere`)
/// and nothing is powered off; once the forged markers are removed, the flow starts on the
/// Machine's own host, keeps its record where only hostcycle writes (a ConfigMap in the
/// operator's namespace, gone when the flow ends), and restores none of the forged labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_forged_on_a_machine_powers_nothing_and_restores_nothing() {
    let lab = RemediationLab::start(&[worker("f-0"), worker("f-1")], &[]).await;
    let victim_uid = lab.lab.get("f-1").await.uid().unwrap();
    let victim_node_uid = lab.node("f-1").await.uid().unwrap();
    let old_uid = lab.node("f-0").await.uid().unwrap();
    let machine = lab
        .create_machine(MachineKind::OpenShift, NS, "m-f-0", "f-0", "f-0", &[])
        .await;
    let machine_uid = lab.machine(&machine).await.uid().unwrap();
    let forged = json!({
        hostcycle_api::remediation::EXTERNAL_REMEDIATION_ANNOTATION: "",
        hostcycle_api::remediation::REMEDIATION_HOST_ANNOTATION: format!("{NS}/f-1/{victim_uid}"),
        hostcycle_api::remediation::REMEDIATION_STARTED_ANNOTATION: jiff::Timestamp::now().to_string(),
        hostcycle_api::remediation::NODE_LABELS_BACKUP_ANNOTATION:
            r#"{"node-role.kubernetes.io/control-plane":""}"#,
    });
    lab.patch_machine_annotations(&machine, forged).await;

    let events = lab
        .wait_event_reasons("Machine", "m-f-0", &[rev::HELD_ELSEWHERE])
        .await;
    assert!(
        events
            .iter()
            .any(|(_, reason, note)| reason == rev::HELD_ELSEWHERE
                && note.contains("no record of a flow")),
        "{events:#?}"
    );
    // A few passes later still: nothing powered off, no record taken from the markers.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for host in ["f-0", "f-1"] {
        let h = lab.lab.get(host).await;
        assert!(
            !machine_power_off_requested(&h),
            "{host}: {:?}\noperator log: {}",
            h.annotations(),
            lab.operator_log()
        );
    }
    assert!(flow_records(&lab, &machine_uid).await.is_empty());

    // The forged markers removed, the trigger is hostcycle's: the flow runs on f-0's host.
    lab.patch_machine_annotations(
        &machine,
        json!({
            hostcycle_api::remediation::REMEDIATION_HOST_ANNOTATION: null,
            hostcycle_api::remediation::REMEDIATION_STARTED_ANNOTATION: null,
            hostcycle_api::remediation::NODE_LABELS_BACKUP_ANNOTATION: null,
        }),
    )
    .await;
    lab.lab
        .wait_host(
            "f-0",
            "the Machine flow's power-off",
            CYCLE_TIMEOUT,
            machine_power_off_requested,
        )
        .await;
    assert_eq!(
        flow_records(&lab, &machine_uid).await,
        [format!("hostcycle-machine-flow-{machine_uid}")],
        "the record lives where only hostcycle writes"
    );
    let back = lab
        .wait_node_back("f-0", &old_uid, Duration::from_secs(300))
        .await;
    lab.wait_machine_clean(&machine, CYCLE_TIMEOUT).await;
    assert!(
        !back
            .labels()
            .contains_key("node-role.kubernetes.io/control-plane"),
        "{:?}",
        back.labels()
    );
    let records = &machine_uid;
    let lab_ref = &lab;
    wait_until("the flow record removed", CYCLE_TIMEOUT, || async move {
        flow_records(lab_ref, records)
            .await
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap();
    // The other machine was never touched.
    assert_eq!(lab.lab.settled_history("f-1").await.power_offs(), 0);
    assert_eq!(
        lab.node("f-1").await.uid().as_deref(),
        Some(victim_node_uid.as_str())
    );
}

/// Case 3, the Node's backup: while a flow runs (its Node deleted), someone rewrites the
/// Machine's backup markers with the control-plane label and an annotation of their own. The
/// Node comes back with the labels it had, restored from hostcycle's own record, and nothing
/// of the forgery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_gets_back_only_the_keys_it_had() {
    let lab = RemediationLab::start(&[worker("b-0")], &[]).await;
    lab.label_node(
        "b-0",
        &[("example.com/team", "storage")],
        &[("example.com/owner", "ops")],
    )
    .await;
    let old_uid = lab.node("b-0").await.uid().unwrap();
    let machine = lab
        .create_machine(MachineKind::OpenShift, NS, "m-b-0", "b-0", "b-0", &[])
        .await;
    lab.mark(&machine).await;
    lab.wait_machine(&machine, "the Node released", CYCLE_TIMEOUT, |m| {
        m.annotations()
            .contains_key(hostcycle_api::remediation::POWERED_OFF_FOR_REMEDIATION_ANNOTATION)
    })
    .await;
    lab.patch_machine_annotations(
        &machine,
        json!({
            hostcycle_api::remediation::NODE_LABELS_BACKUP_ANNOTATION:
                r#"{"example.com/team":"storage","node-role.kubernetes.io/control-plane":""}"#,
            hostcycle_api::remediation::NODE_ANNOTATIONS_BACKUP_ANNOTATION:
                r#"{"example.com/owner":"ops","example.com/forged":"yes"}"#,
        }),
    )
    .await;
    lab.wait_node_back("b-0", &old_uid, Duration::from_secs(300))
        .await;
    lab.wait_machine_clean(&machine, CYCLE_TIMEOUT).await;
    let node = lab.node("b-0").await;
    assert_eq!(
        node.labels().get("example.com/team").map(String::as_str),
        Some("storage"),
        "the Node's own label is restored: {:?}",
        node.labels()
    );
    assert_eq!(
        node.annotations()
            .get("example.com/owner")
            .map(String::as_str),
        Some("ops")
    );
    assert!(
        !node
            .labels()
            .contains_key("node-role.kubernetes.io/control-plane"),
        "a forged label was restored: {:?}\noperator log: {}",
        node.labels(),
        lab.operator_log()
    );
    assert!(
        !node.annotations().contains_key("example.com/forged"),
        "{:?}",
        node.annotations()
    );
}

fn provisioning_state(h: &hostcycle_api::BareMetalHost) -> Option<String> {
    h.status
        .as_ref()
        .and_then(|s| s.provisioning.state.as_ref())
        .map(|s| s.as_str().to_owned())
}

/// Case 5, the host's side: a host that leaves the provisioned states while its BMC cannot be
/// read (its machine still running) stays `deprovisioning` — it was once reported `available` at once,
/// without any power action, and could have been handed to a new consumer with the old OS
/// running. With its BMC back, the host controller powers it off, and only two `Off` readings
/// make it `available`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_is_available_after_deprovisioning_only_once_confirmed_off() {
    let lab = RemediationLab::start(&[worker("d-0")], &[]).await;
    // The lab's hosts run their nodes as externally provisioned hosts.
    assert_eq!(
        provisioning_state(&lab.lab.get("d-0").await).as_deref(),
        Some("externally provisioned")
    );
    lab.block_bmc("d-0").await;
    lab.lab
        .patch_spec("d-0", json!({ "externallyProvisioned": false }))
        .await;
    lab.lab
        .wait_host("d-0", "deprovisioning", CYCLE_TIMEOUT, |h| {
            provisioning_state(h).as_deref() == Some("deprovisioning")
        })
        .await;
    // The machine runs, its BMC unreadable: never available, however long.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = lab.lab.get("d-0").await;
        assert_eq!(
            provisioning_state(&h).as_deref(),
            Some("deprovisioning"),
            "available while its machine runs\noperator log: {}",
            lab.operator_log()
        );
    }
    let index = lab.lab.index("d-0");
    assert_eq!(
        lab.lab.redfish.power_state(index).await.unwrap(),
        "On",
        "the machine is still running"
    );
    // The BMC back: powered off, then available on two Off readings.
    let versions = lab.watch_host("d-0").await;
    lab.unblock_bmc("d-0").await;
    lab.lab
        .wait_host("d-0", "available", CYCLE_TIMEOUT, |h| {
            provisioning_state(h).as_deref() == Some("available")
        })
        .await;
    // The version the host controller decided "available" on carries the readings that
    // confirmed it off (the same write records the power-on `spec.online` asks for next,
    // which starts a new run).
    let seen = versions.seen();
    let first = seen
        .iter()
        .position(|v| provisioning_state(&v.object).as_deref() == Some("available"))
        .expect("the recorder saw it available");
    let before = &seen[first.checked_sub(1).expect("a version before")].object;
    assert_eq!(
        provisioning_state(before).as_deref(),
        Some("deprovisioning")
    );
    let observation = before
        .status
        .as_ref()
        .and_then(|s| s.power_observation.clone())
        .expect("the readings that confirmed it off");
    assert!(
        observation.confirmed() && observation.state == hostcycle_api::ObservedPowerState::Off,
        "{observation:?}"
    );
}
