//! The reboot queue end to end through the BMC: real control plane, sushy-tools Redfish
//! emulator, simulated kubelets following it, the real operator binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::queue::*;
use hostcycle_api::queue::EntryPhase;
use jiff::Timestamp;

/// Two workers queued one after the other: each is cordoned, drained (its pods move, the
/// PodDisruptionBudget is respected), power-cycled exactly once through its BareMetalHost,
/// confirmed booted, uncordoned and dequeued — the second only after the first is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_node_rolling_reboot_through_the_bmc() {
    let mut spec = fast_queue();
    // The PDB lets one pod go at a time: refusals are retried while replacements start.
    spec.evict_retries = Some(30);
    spec.evict_interval_seconds = Some(1);
    let lab = QueueLab::start(&[worker("w-0"), worker("w-1"), worker("w-2")], spec).await;
    lab.namespace("apps", &[]).await;
    lab.deployment("apps", "web", 4, None).await;
    lab.pdb("apps", "web", 3).await;
    lab.wait_running("apps", "web", 4).await;

    let started = Timestamp::now();
    lab.queue("w-0").await;
    lab.queue("w-1").await;

    // w-0 goes first; w-1 waits for the single slot.
    let first = lab
        .wait_entry("w-0", "draining or rebooting", REBOOT_TIMEOUT, |e| {
            e.phase().in_progress()
        })
        .await;
    assert!(first.phase().in_progress());
    let second = lab
        .wait_entry("w-1", "says it waits for a slot", REBOOT_TIMEOUT, |e| {
            e.status
                .as_ref()
                .is_some_and(|s| s.message.contains("slot"))
        })
        .await;
    assert_eq!(second.phase(), EntryPhase::Queued, "one slot: w-1 waits");
    lab.wait_node("w-0", "cordoned by the queue", REBOOT_TIMEOUT, |n| {
        cordoned(n) && cordoned_by_queue(n)
    })
    .await;

    lab.wait_entry_gone("w-0", REBOOT_TIMEOUT).await;
    let w0_done = Timestamp::now();
    lab.wait_entry_gone("w-1", REBOOT_TIMEOUT).await;

    for node in ["w-0", "w-1"] {
        let n = lab.node(node).await;
        assert!(
            !cordoned(&n) && !cordoned_by_queue(&n),
            "{node} uncordoned after its reboot"
        );
        assert_eq!(lab.power_cycles(node).await, 1, "{node}: one power cycle");
        assert!(lab.off_after(node, started).is_some());
        let wanted = [
            "DrainStarted",
            "RebootStarted",
            "BootConfirmed",
            "Uncordoned",
        ];
        let reasons = lab.wait_event_reasons_about(node, &wanted).await;
        for r in wanted {
            assert!(
                reasons.iter().any(|x| x == r),
                "{node}: Event {r} in {reasons:?}"
            );
        }
    }
    assert_eq!(lab.power_cycles("w-2").await, 0, "w-2 was not queued");
    // w-1's host went off only after w-0's entry was done.
    let w1_off = lab.off_after("w-1", started).unwrap();
    assert!(
        w1_off > w0_done - jiff::SignedDuration::from_secs(2),
        "w-1 powered off at {w1_off}, w-0 done at {w0_done}"
    );
    let wanted = [
        "DrainStarted",
        "DrainCompleted",
        "RebootStarted",
        "BootConfirmed",
        "Completed",
    ];
    let entry_reasons = lab
        .wait_event_reasons_about("rqe-0000000001", &wanted)
        .await;
    for r in wanted {
        assert!(
            entry_reasons.iter().any(|x| x == r),
            "entry Event {r} in {entry_reasons:?}"
        );
    }
    // The workload kept its budget and is whole again.
    lab.wait_running("apps", "web", 4).await;
    let metrics = lab.lab.metrics().await;
    for m in [
        "hostcycle_reboot_queue_enabled 1",
        "hostcycle_reboot_queue_dequeued_total{reason=\"Completed\"} 2",
        "hostcycle_reboot_queue_drain_duration_seconds_count 2",
        "hostcycle_reboot_queue_reboot_duration_seconds_count 2",
        "hostcycle_reboot_queue_evictions_total{result=\"evicted\"}",
    ] {
        assert!(metrics.contains(m), "metric {m} in\n{metrics}");
    }
}
