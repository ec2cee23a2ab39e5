//! The queue's gate sees nodes known to exist but absent (issue 24, case 6), end to end on
//! the real control plane, simulated kubelets, the sushy-tools emulator and the real
//! operator binary.
//!
//! cp-0's Node is deleted (as a remediation that gave up, another remediator or a person
//! leaves it) while its Machine, labelled control plane, keeps `status.nodeRef: cp-0`. With
//! `maxUnreachableNodes: 3`, a queued cp-1 must not start: an absent API-server node counts
//! as an API server in progress. Its message names cp-0 and why it counts; `rq plan` shows
//! cp-0 as away. Once cp-0's Node is back and Ready, cp-1 is drained and rebooted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::NS;
use common::queue::*;
use common::remediation::RemediationLab;
use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use hostcycle_testkit::{MachineKind, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

/// How long the entry must keep waiting while cp-0 is absent, with the queue otherwise idle:
/// every change of the entry, the Node or the Machine wakes the loop, so a wrong start would
/// come within a second or two.
const HOLD: Duration = Duration::from_secs(15);
/// Enough for the loop's first pass over a new entry, on a loaded machine.
const FIRST_PASS: Duration = Duration::from_secs(60);
/// The simulated kubelet posts its status every 10 s.
const NODE_READY: Duration = Duration::from_secs(60);

fn message(e: &RebootQueueEntry) -> String {
    e.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

/// The entry for `node` waits (Queued, never in progress) with a message naming `absent`;
/// fails at once if it starts.
fn waits_for_absent(e: &RebootQueueEntry, absent: &str) -> Result<bool, String> {
    if e.phase().in_progress() {
        return Err(format!(
            "{} started ({}) while {absent} is absent: {:?}",
            e.spec.node,
            e.phase(),
            message(e)
        ));
    }
    let text = message(e);
    Ok(e.phase() == EntryPhase::Queued && text.contains(absent) && text.contains("absent"))
}

/// The whole table `hostcycle rq plan` prints.
fn rq_plan(lab: &QueueLab) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(["rq", "plan", "--kubeconfig"])
        .arg(lab.lab.cluster.kubeconfig_path())
        .output()
        .unwrap();
    assert!(out.status.success(), "rq plan: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_absent_api_server_node_holds_back_a_second_api_server() {
    let lab = RemediationLab::start(&[api_server("cp-0"), api_server("cp-1")], &[]).await;
    // One absent node alone would pass the unreachable gate: the API-server rule must hold.
    lab.patch_queue(json!({ "maxUnreachableNodes": 3 })).await;
    lab.create_machine(
        MachineKind::ClusterApi,
        NS,
        "m-cp-0",
        "cp-0",
        "cp-0",
        &[("cluster.x-k8s.io/control-plane", "")],
    )
    .await;

    // cp-0's Node is deleted; its kubelet does not register again until its next boot.
    lab.nodes
        .delete("cp-0", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("Node cp-0 deleted", Duration::from_secs(30), || async {
        lab.nodes
            .get_opt("cp-0")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    let queued_at = Timestamp::now();
    lab.queue("cp-1").await;

    // cp-1 waits, naming cp-0 and why it counts.
    let waiting =
        wait_until_fallible_entry(&lab, "cp-1", FIRST_PASS, |e| waits_for_absent(e, "cp-0")).await;
    let text = message(&waiting);
    assert!(
        text.contains("API-server node cp-0 is absent")
            && text.contains("Machine default/m-cp-0 has nodeRef cp-0 but no Node exists"),
        "cp-1's message names the absent API-server node and why: {text:?}"
    );
    // … and keeps waiting while cp-0 stays absent.
    let deadline = tokio::time::Instant::now() + HOLD;
    while tokio::time::Instant::now() < deadline {
        let entry = lab.entry("cp-1").await.expect("cp-1's entry stays");
        match waits_for_absent(&entry, "cp-0") {
            Ok(true) => {}
            Ok(false) => panic!(
                "cp-1 must keep waiting for cp-0 for {HOLD:?}; now: {}",
                lab.entries_summary().await
            ),
            Err(e) => panic!("{e}; entries: {}", lab.entries_summary().await),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!cordoned(&lab.node("cp-1").await), "cp-1 was not cordoned");
    assert_eq!(
        lab.lab.settled_history("cp-1").await.off_after(queued_at),
        None,
        "cp-1's host was not powered off"
    );
    let plan = rq_plan(&lab);
    assert!(
        plan.contains("away: node cp-0 is absent (Machine default/m-cp-0 has nodeRef cp-0")
            && plan.contains("an API server"),
        "rq plan shows cp-0 away:\n{plan}"
    );

    // cp-0's Node is back (registered again, its kubelet reports Ready): cp-1 goes.
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": "cp-0", "labels": {
            "kubernetes.io/hostname": "cp-0",
            "node-role.kubernetes.io/control-plane": "",
        }},
    }))
    .unwrap();
    lab.nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    lab.wait_node("cp-0", "Ready again", NODE_READY, |n| {
        hostcycle_sim::node_ready(n) == Some(true)
    })
    .await;
    lab.wait_entry(
        "cp-1",
        "in progress once cp-0 is back",
        REBOOT_TIMEOUT,
        |e| e.phase().in_progress(),
    )
    .await;
    lab.wait_entry_gone("cp-1", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("cp-1").await, 1, "cp-1 rebooted once");
    let after = lab.node("cp-1").await;
    assert!(!cordoned(&after), "cp-1 uncordoned");
}

/// Waits until the entry for `node` passes `check` (`Ok(true)`); an `Err` fails at once.
async fn wait_until_fallible_entry(
    lab: &QueueLab,
    node: &str,
    timeout: Duration,
    check: impl Fn(&RebootQueueEntry) -> Result<bool, String>,
) -> RebootQueueEntry {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let entry = lab.entry(node).await;
        if let Some(e) = &entry {
            match check(e) {
                Ok(true) => return e.clone(),
                Ok(false) => {}
                Err(why) => panic!("{why}; entries: {}", lab.entries_summary().await),
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the entry for {node} did not wait naming the absent node within {timeout:?}; \
             entries now: {}",
            lab.entries_summary().await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
