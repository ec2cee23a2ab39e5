//! The reboot queue's scheduling rules end to end: `maxConcurrentReboots`, API servers last
//! and one at a time, the unreachable gate, cancel mid-drain and mid-reboot, and
//! disable/enable — against the real control plane, simulated kubelets following the
//! sushy-tools Redfish emulator, and the real operator binary.
//!
//! A drain is held open on purpose by a pod carrying a test finalizer: the drain evicts it,
//! it stays Terminating, and the drain waits until the test removes the finalizer. A sampler
//! lists the entries every ~200 ms for a whole scenario; each list is one consistent read, so
//! the rules are checked on every state the API server held while it was sampled.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::queue::*;
use hostcycle_api::PAUSED_ANNOTATION;
use hostcycle_api::queue::{
    EntryPhase, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry, RebootQueueStatus,
};
use hostcycle_testkit::bmc_emulators::FakePower;
use hostcycle_testkit::wait_until;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Namespace of the pods that hold drains open.
const HOLD_NS: &str = "hold";
/// The finalizer that keeps an evicted pod Terminating until the test removes it.
const HOLD_FINALIZER: &str = "e2e.hostcycle.io/hold";
/// Enough for a power change through the fake driver (1–11 s) and the node-lifecycle
/// controller's verdict (8 s grace) on a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_secs(90);

// ----- the entry sampler ---------------------------------------------------------------

/// One entry as seen in one sample.
#[derive(Debug, Clone)]
struct Seen {
    node: String,
    phase: EntryPhase,
    message: String,
    backed_off: bool,
}

/// One list of the entries.
#[derive(Debug, Clone)]
struct Sample {
    at: Timestamp,
    entries: Vec<Seen>,
}

impl Sample {
    fn entry(&self, node: &str) -> Option<&Seen> {
        self.entries.iter().find(|e| e.node == node)
    }

    fn in_progress(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| e.phase.in_progress())
            .map(|e| e.node.as_str())
            .collect()
    }

    fn is_in_progress(&self, node: &str) -> bool {
        self.entry(node).is_some_and(|e| e.phase.in_progress())
    }

    fn describe(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{} {} {:?}", e.node, e.phase, e.message))
            .collect();
        format!("at {}: [{}]", self.at, entries.join("; "))
    }
}

/// Lists the entries every ~200 ms until finished.
struct EntrySampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl EntrySampler {
    fn start(lab: &QueueLab) -> EntrySampler {
        let api = lab.entries.clone();
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let samples = samples.clone();
            let stop = stop.clone();
            async move {
                loop {
                    if let Ok(list) = api.list(&ListParams::default()).await {
                        let at = Timestamp::now();
                        let entries = list.items.iter().map(|e| seen(e, at)).collect();
                        samples.lock().unwrap().push(Sample { at, entries });
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        });
        EntrySampler {
            samples,
            stop,
            task,
        }
    }

    /// Stops sampling and returns every sample, oldest first.
    async fn finish(self) -> Vec<Sample> {
        self.stop.cancel();
        let _ = self.task.await;
        let samples = self.samples.lock().unwrap().clone();
        assert!(
            samples.len() >= 10,
            "the sampler took only {} samples",
            samples.len()
        );
        samples
    }
}

fn seen(e: &RebootQueueEntry, at: Timestamp) -> Seen {
    let status = e.status.clone().unwrap_or_default();
    Seen {
        node: e.spec.node.clone(),
        phase: e.phase(),
        backed_off: status.drain_backoff_expire.is_some_and(|t| t > at),
        message: status.message,
    }
}

// ----- helpers -------------------------------------------------------------------------

fn message(e: &RebootQueueEntry) -> String {
    e.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

fn phase_in(entries: &[RebootQueueEntry], node: &str) -> Option<EntryPhase> {
    entries
        .iter()
        .find(|e| e.spec.node == node)
        .map(|e| e.phase())
}

/// Waits until one list of the entries satisfies `pred`.
async fn wait_entries(
    lab: &QueueLab,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&[RebootQueueEntry]) -> bool,
) {
    let pred = &pred;
    let result = wait_until(
        &format!("reboot queue entries: {what}"),
        timeout,
        || async {
            let list = lab.entries.list(&ListParams::default()).await.ok()?;
            pred(&list.items).then_some(())
        },
    )
    .await;
    if let Err(e) = result {
        panic!(
            "{e}\nentries now: {}\noperator log: {:?}",
            lab.entries_summary().await,
            operator_log(lab)
        );
    }
}

fn operator_log(lab: &QueueLab) -> Option<std::path::PathBuf> {
    lab.lab
        .operator
        .as_ref()
        .map(|p| p.log_path().to_path_buf())
}

/// Checks `pred` on the entry for `node` every 300 ms for `how_long`.
async fn entry_stays(
    lab: &QueueLab,
    node: &str,
    what: &str,
    how_long: Duration,
    pred: impl Fn(&RebootQueueEntry) -> bool,
) {
    let deadline = tokio::time::Instant::now() + how_long;
    while tokio::time::Instant::now() < deadline {
        let entry = lab.entry(node).await;
        assert!(
            entry.as_ref().is_some_and(&pred),
            "the entry for {node} must stay {what} for {how_long:?}; now: {}",
            lab.entries_summary().await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A bare pod on `node` that, once evicted, stays Terminating until [`release`].
async fn hold_pod(lab: &QueueLab, node: &str) {
    let name = format!("hold-{node}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": "hold" }, "finalizers": [HOLD_FINALIZER] },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "pause", "image": "registry.k8s.io/pause:3.2" }],
        },
    }))
    .unwrap();
    let api: Api<Pod> = Api::namespaced(lab.client.clone(), HOLD_NS);
    api.create(&PostParams::default(), &pod).await.unwrap();
    wait_until(
        &format!("pod {HOLD_NS}/{name} Running on {node}"),
        Duration::from_secs(60),
        || async {
            let p = api.get(&name).await.ok()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Removes the hold finalizer: the evicted pod goes, and the drain can complete.
async fn release(lab: &QueueLab, node: &str) {
    let name = format!("hold-{node}");
    let api: Api<Pod> = Api::namespaced(lab.client.clone(), HOLD_NS);
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
}

/// Waits until the held pod on `node` was evicted (Terminating): its drain is under way.
async fn wait_hold_terminating(lab: &QueueLab, node: &str) {
    let name = format!("hold-{node}");
    let api: Api<Pod> = Api::namespaced(lab.client.clone(), HOLD_NS);
    wait_until(
        &format!("pod {HOLD_NS}/{name} evicted (Terminating)"),
        REBOOT_TIMEOUT,
        || async {
            let p = api.get(&name).await.ok()?;
            p.metadata.deletion_timestamp.is_some().then_some(())
        },
    )
    .await
    .unwrap();
}

/// On→Off transitions of `node`'s host whose Off was seen after `t`.
async fn offs_since(lab: &QueueLab, node: &str, t: Timestamp) -> usize {
    let history = lab.lab.settled_history(node).await;
    history
        .0
        .windows(2)
        .filter(|w| w[0].1 == "On" && w[1].1 == "Off" && w[1].0 > t)
        .count()
}

async fn queue_status(lab: &QueueLab) -> RebootQueueStatus {
    Api::<RebootQueue>::all(lab.client.clone())
        .get(REBOOT_QUEUE_NAME)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn wait_queue_status(
    lab: &QueueLab,
    what: &str,
    pred: impl Fn(&RebootQueueStatus) -> bool,
) -> RebootQueueStatus {
    let pred = &pred;
    let result = wait_until(
        &format!("RebootQueue status: {what}"),
        Duration::from_secs(30),
        || async {
            let s = queue_status(lab).await;
            pred(&s).then_some(s)
        },
    )
    .await;
    match result {
        Ok(s) => s,
        Err(e) => panic!("{e}\nstatus now: {:?}", queue_status(lab).await),
    }
}

fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    hostcycle_sim::node_ready(n) == Some(true)
}

async fn wait_uncordoned(lab: &QueueLab, node: &str, timeout: Duration) {
    lab.wait_node(node, "uncordoned", timeout, |n| {
        !cordoned(n) && !cordoned_by_queue(n)
    })
    .await;
}

/// Takes `node`'s host down behind the operator's back: its BareMetalHost is paused (so the
/// host controller does not power it on again), then the BMC cuts power. Returns once the
/// Node is NotReady.
async fn power_off_behind_the_back(lab: &QueueLab, node: &str) {
    lab.lab.annotate(node, PAUSED_ANNOTATION, "").await;
    lab.lab
        .redfish
        .reset(lab.lab.index(node), "ForceOff")
        .await
        .unwrap();
    lab.lab.wait_emulator_power(node, FakePower::Off).await;
    lab.wait_node(
        node,
        "NotReady after its host lost power",
        NODE_TIMEOUT,
        |n| hostcycle_sim::node_ready(n) == Some(false),
    )
    .await;
}

/// Powers `node`'s host on again through the BMC, waits for the Node to be Ready, and hands
/// the BareMetalHost back to the operator.
async fn power_on_again(lab: &QueueLab, node: &str) {
    lab.lab
        .redfish
        .reset(lab.lab.index(node), "On")
        .await
        .unwrap();
    lab.lab.wait_emulator_power(node, FakePower::On).await;
    lab.wait_node(
        node,
        "Ready after its host powered on",
        NODE_TIMEOUT,
        node_ready,
    )
    .await;
    lab.lab.unannotate(node, PAUSED_ANNOTATION).await;
}

// ----- the tests -----------------------------------------------------------------------

/// `maxConcurrentReboots: 2`: two drains run at the same time, a third entry waits (its
/// message names the slots) until one of the two is removed, and no sampled moment ever has
/// more than two entries draining or rebooting. Each host is power-cycled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_slots_run_two_drains_at_once_and_the_third_waits() {
    let mut spec = fast_queue();
    spec.max_concurrent_reboots = Some(2);
    let lab = QueueLab::start(&[worker("w-0"), worker("w-1"), worker("w-2")], spec).await;
    lab.namespace(HOLD_NS, &[]).await;
    hold_pod(&lab, "w-0").await;
    hold_pod(&lab, "w-1").await;

    let started = Timestamp::now();
    let sampler = EntrySampler::start(&lab);
    lab.queue("w-0").await;
    lab.queue("w-1").await;
    lab.queue("w-2").await;

    // Both drains are in flight at the same moment (one consistent list shows it).
    wait_entries(
        &lab,
        "w-0 and w-1 Draining at the same time",
        REBOOT_TIMEOUT,
        |es| {
            phase_in(es, "w-0") == Some(EntryPhase::Draining)
                && phase_in(es, "w-1") == Some(EntryPhase::Draining)
        },
    )
    .await;
    for node in ["w-0", "w-1"] {
        lab.wait_node(node, "cordoned by the queue", REBOOT_TIMEOUT, |n| {
            cordoned(n) && cordoned_by_queue(n)
        })
        .await;
        wait_hold_terminating(&lab, node).await;
    }
    // The third waits for a slot, and says so.
    let third = lab
        .wait_entry(
            "w-2",
            "waits for a slot (maxConcurrentReboots)",
            REBOOT_TIMEOUT,
            |e| message(e).contains("maxConcurrentReboots"),
        )
        .await;
    let text = message(&third);
    assert_eq!(third.phase(), EntryPhase::Queued, "w-2 waits: {text}");
    assert!(
        text.contains("slot") && text.contains("maxConcurrentReboots"),
        "w-2's message says it waits for a slot: {text:?}"
    );
    // Who holds the slots: `hostcycle rq plan` names them (the status message does not, so a
    // busy queue does not rewrite every waiting entry at every transition).
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(["rq", "plan", "-o", "json", "--kubeconfig"])
        .arg(lab.lab.cluster.kubeconfig_path())
        .output()
        .unwrap();
    assert!(plan.status.success(), "rq plan: {plan:?}");
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let w2 = plan["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["node"] == "w-2")
        .unwrap_or_else(|| panic!("w-2 waits in the plan: {plan}"));
    let reason = w2["reason"].as_str().unwrap();
    assert!(
        reason.contains("w-0") && reason.contains("w-1"),
        "the plan names who holds the slots: {reason:?}"
    );
    entry_stays(
        &lab,
        "w-2",
        "Queued while both slots are held",
        Duration::from_secs(5),
        |e| e.phase() == EntryPhase::Queued,
    )
    .await;
    assert!(!cordoned(&lab.node("w-2").await), "w-2 is not touched yet");

    // w-0's drain completes: it reboots; w-2 still waits (a rebooting entry holds its slot).
    release(&lab, "w-0").await;
    lab.wait_phase("w-0", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await;
    lab.wait_entry_gone("w-0", REBOOT_TIMEOUT).await;
    // The freed slot goes to w-2 while w-1 still drains.
    wait_entries(
        &lab,
        "w-2 in progress while w-1 is still Draining",
        REBOOT_TIMEOUT,
        |es| {
            phase_in(es, "w-1") == Some(EntryPhase::Draining)
                && phase_in(es, "w-2").is_some_and(|p| p.in_progress())
        },
    )
    .await;
    release(&lab, "w-1").await;
    lab.wait_entry_gone("w-1", REBOOT_TIMEOUT).await;
    lab.wait_entry_gone("w-2", REBOOT_TIMEOUT).await;

    let samples = sampler.finish().await;
    let max = samples.iter().map(|s| s.in_progress().len()).max().unwrap();
    if let Some(bad) = samples.iter().find(|s| s.in_progress().len() > 2) {
        panic!("more than 2 entries in progress: {}", bad.describe());
    }
    assert_eq!(max, 2, "both slots were used at once");
    // w-2 started only once w-0's entry was removed.
    if let Some(bad) = samples
        .iter()
        .find(|s| s.is_in_progress("w-2") && s.entry("w-0").is_some())
    {
        panic!(
            "w-2 in progress while w-0 still held a slot: {}",
            bad.describe()
        );
    }
    assert!(
        samples.iter().any(|s| s
            .entry("w-2")
            .is_some_and(|e| e.phase == EntryPhase::Queued && s.in_progress().len() == 2)),
        "a sample shows w-2 queued behind two entries in progress"
    );

    for node in ["w-0", "w-1", "w-2"] {
        assert_eq!(
            offs_since(&lab, node, started).await,
            1,
            "{node}: exactly one power cycle; history {:?}",
            lab.lab.history(node)
        );
        wait_uncordoned(&lab, node, Duration::from_secs(30)).await;
    }
    let metrics = lab.lab.metrics().await;
    assert!(
        metrics.contains("hostcycle_reboot_queue_dequeued_total{reason=\"Completed\"} 3"),
        "three entries completed:\n{metrics}"
    );
}

/// API servers go strictly last and one at a time: with cp-0, cp-1 (API servers) and w-0, w-1
/// (workers) queued cp-0, w-0, cp-1, w-1 and two slots, the workers go first (together), then
/// cp-0 alone, then cp-1 alone. Checked on every sample; each host is power-cycled exactly
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_servers_go_last_and_one_at_a_time() {
    let mut spec = fast_queue();
    spec.max_concurrent_reboots = Some(2);
    // Queue all four before the controller may start any: the order of creation must not
    // decide the test.
    spec.enabled = Some(false);
    let lab = QueueLab::start(
        &[
            api_server("cp-0"),
            api_server("cp-1"),
            worker("w-0"),
            worker("w-1"),
        ],
        spec,
    )
    .await;
    let api_servers = ["cp-0", "cp-1"];
    let all = ["cp-0", "w-0", "cp-1", "w-1"];

    let started = Timestamp::now();
    let sampler = EntrySampler::start(&lab);
    for node in all {
        lab.queue(node).await;
    }
    for node in all {
        lab.wait_entry(node, "waits: the queue is disabled", REBOOT_TIMEOUT, |e| {
            e.phase() == EntryPhase::Queued && message(e).contains("disabled")
        })
        .await;
    }
    lab.patch_queue(json!({ "enabled": true })).await;

    // The workers take both slots at once; the API servers wait for them.
    wait_entries(
        &lab,
        "w-0 and w-1 in progress at the same time",
        REBOOT_TIMEOUT,
        |es| {
            phase_in(es, "w-0").is_some_and(|p| p.in_progress())
                && phase_in(es, "w-1").is_some_and(|p| p.in_progress())
        },
    )
    .await;
    for node in all {
        lab.wait_entry_gone(node, REBOOT_TIMEOUT).await;
    }

    let samples = sampler.finish().await;
    let is_api = |node: &str| api_servers.contains(&node);
    for s in &samples {
        let in_progress = s.in_progress();
        let api: Vec<&str> = in_progress.iter().copied().filter(|n| is_api(n)).collect();
        assert!(api.len() <= 1, "two API servers at once: {}", s.describe());
        assert!(in_progress.len() <= 2, "over 2 slots: {}", s.describe());
        if api.is_empty() {
            continue;
        }
        // A worker in progress, or queued and not backed off (eligible), keeps them waiting.
        let workers_busy = s.entries.iter().any(|e| {
            !is_api(&e.node)
                && (e.phase.in_progress() || (e.phase == EntryPhase::Queued && !e.backed_off))
        });
        assert!(
            !workers_busy,
            "API server {} in progress while a worker is in progress or eligible: {}",
            api[0],
            s.describe()
        );
    }
    assert!(
        samples.iter().any(|s| s.is_in_progress("w-0")
            && api_servers
                .iter()
                .all(|n| s.entry(n).is_some_and(|e| e.phase == EntryPhase::Queued
                    && e.message.contains("API-server node waits until no worker")))),
        "while the workers run, both API servers wait for them and say so"
    );
    let first_in_progress = |node: &str| {
        samples
            .iter()
            .position(|s| s.is_in_progress(node))
            .unwrap_or_else(|| panic!("{node} was never seen in progress"))
    };
    assert!(
        first_in_progress("cp-0") < first_in_progress("cp-1"),
        "cp-0 (queued first) goes before cp-1"
    );
    assert!(
        samples.iter().any(|s| s.is_in_progress("cp-0")
            && s.entry("cp-1")
                .is_some_and(|e| e.phase == EntryPhase::Queued
                    && e.message
                        .contains("API-server node cp-0 is being processed"))),
        "cp-1's message says it waits for cp-0"
    );
    if let Some(bad) = samples
        .iter()
        .find(|s| s.is_in_progress("cp-1") && s.entry("cp-0").is_some())
    {
        panic!("cp-1 in progress before cp-0 was done: {}", bad.describe());
    }

    for node in all {
        assert_eq!(
            offs_since(&lab, node, started).await,
            1,
            "{node}: exactly one power cycle; history {:?}",
            lab.lab.history(node)
        );
        wait_uncordoned(&lab, node, Duration::from_secs(30)).await;
    }
}

/// `maxUnreachableNodes: 0` (the default): while a node that is not queued is powered off and
/// NotReady, a queued node does not start draining, and both its message and the RebootQueue
/// status say which node is unreachable. Once that node is back, the queued node drains and
/// reboots. With `maxUnreachableNodes: 1`, a drain starts while one node is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_node_holds_new_drains_back() {
    let lab = QueueLab::start(&[worker("w-0"), worker("w-1"), worker("w-2")], fast_queue()).await;

    let started = Timestamp::now();
    power_off_behind_the_back(&lab, "w-0").await;
    let queued_at = Timestamp::now();
    lab.queue("w-1").await;
    let e = lab
        .wait_entry(
            "w-1",
            "waits for the unreachable node w-0",
            REBOOT_TIMEOUT,
            |e| message(e).contains("unreachable"),
        )
        .await;
    let text = message(&e);
    assert_eq!(e.phase(), EntryPhase::Queued, "{text}");
    assert!(
        text.contains("w-0") && text.contains("maxUnreachableNodes"),
        "the message names the unreachable node and the setting: {text:?}"
    );
    let status = wait_queue_status(&lab, "one queued entry waiting on w-0", |s| {
        s.queued == 1 && s.message.contains("unreachable")
    })
    .await;
    assert_eq!(
        (status.draining, status.rebooting, status.queued),
        (0, 0, 1),
        "{status:?}"
    );
    assert!(
        status.message.contains("w-0") && status.message.contains("maxUnreachableNodes"),
        "queue message names the unreachable node: {:?}",
        status.message
    );
    entry_stays(
        &lab,
        "w-1",
        "Queued while w-0 is down",
        Duration::from_secs(10),
        |e| e.phase() == EntryPhase::Queued && message(e).contains("unreachable"),
    )
    .await;
    assert!(!cordoned(&lab.node("w-1").await), "w-1 was not cordoned");
    assert_eq!(
        offs_since(&lab, "w-1", queued_at).await,
        0,
        "w-1 not rebooted"
    );

    // w-0 comes back: the gate opens.
    power_on_again(&lab, "w-0").await;
    // When w-0's host was seen On again: it can be Ready only after that.
    let back = lab
        .lab
        .history("w-0")
        .0
        .iter()
        .rev()
        .find(|(_, s)| s == "On")
        .map(|(t, _)| *t)
        .unwrap();
    lab.wait_entry("w-1", "in progress once w-0 is back", REBOOT_TIMEOUT, |e| {
        e.phase().in_progress()
    })
    .await;
    lab.wait_entry_gone("w-1", REBOOT_TIMEOUT).await;
    assert_eq!(
        offs_since(&lab, "w-1", queued_at).await,
        1,
        "w-1 rebooted once; history {:?}",
        lab.lab.history("w-1")
    );
    let w1_off = lab.off_after("w-1", queued_at).unwrap();
    assert!(
        w1_off > back,
        "w-1 powered off at {w1_off}, only after w-0 was on again at {back}"
    );
    wait_uncordoned(&lab, "w-1", Duration::from_secs(30)).await;

    // maxUnreachableNodes: 1 tolerates one node down.
    lab.patch_queue(json!({ "maxUnreachableNodes": 1 })).await;
    power_off_behind_the_back(&lab, "w-0").await;
    let second = Timestamp::now();
    lab.queue("w-2").await;
    lab.wait_entry("w-2", "in progress with w-0 down", REBOOT_TIMEOUT, |e| {
        e.phase().in_progress()
    })
    .await;
    assert_eq!(
        hostcycle_sim::node_ready(&lab.node("w-0").await),
        Some(false),
        "w-0 is still down while w-2 drains"
    );
    lab.wait_entry_gone("w-2", REBOOT_TIMEOUT).await;
    assert_eq!(
        offs_since(&lab, "w-2", second).await,
        1,
        "w-2 rebooted once; history {:?}",
        lab.lab.history("w-2")
    );
    wait_uncordoned(&lab, "w-2", Duration::from_secs(30)).await;
    power_on_again(&lab, "w-0").await;
    assert_eq!(
        offs_since(&lab, "w-0", started).await,
        2,
        "w-0 went down twice, by the test's hand only"
    );
}

/// Cancel and disable.
///
/// Cancel mid-drain: the entry is removed, the node uncordoned, its host never power-cycled,
/// a Cancelled Event recorded. Cancel mid-reboot: if the power cycle has not begun the
/// request is withdrawn; once it has, the node stays cordoned until it has booted — never
/// uncordoned before — then it is uncordoned and the entry removed; either way the host power-cycles at most once and is never left off.
///
/// Disable mid-drain (`maxConcurrentReboots: 1`): the draining entry goes back to Queued
/// (DrainStopped), its node is uncordoned, the next entry does not start and nothing is
/// rebooted while disabled; re-enabled, both drain and reboot in order. An entry already
/// Rebooting when the queue is disabled completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_and_disable() {
    let mut spec = fast_queue();
    spec.max_concurrent_reboots = Some(2);
    let lab = QueueLab::start(
        &[worker("w-0"), worker("w-1"), worker("w-2"), worker("w-3")],
        spec,
    )
    .await;
    lab.namespace(HOLD_NS, &[]).await;
    hold_pod(&lab, "w-0").await;
    hold_pod(&lab, "w-2").await;

    // ----- cancel mid-reboot (w-1) and mid-drain (w-0), side by side -----
    let started = Timestamp::now();
    let drain_entry = lab.queue("w-0").await;
    let reboot_entry = lab.queue("w-1").await;

    let rebooting = lab
        .wait_entry("w-1", "Rebooting", REBOOT_TIMEOUT, |e| {
            e.phase() == EntryPhase::Rebooting && message(e).contains("rebooting")
        })
        .await;
    lab.cancel("w-1").await;
    let cancelled_rebooting = Timestamp::now();
    assert!(
        rebooting
            .status
            .as_ref()
            .and_then(|s| s.reboot.as_ref())
            .is_some_and(|r| r.requested_at.is_some()),
        "the reboot was recorded before it was requested"
    );

    lab.wait_phase("w-0", EntryPhase::Draining, REBOOT_TIMEOUT)
        .await;
    lab.wait_node("w-0", "cordoned by the queue", REBOOT_TIMEOUT, |n| {
        cordoned(n) && cordoned_by_queue(n)
    })
    .await;
    wait_hold_terminating(&lab, "w-0").await;
    lab.cancel("w-0").await;

    lab.wait_entry_gone("w-0", Duration::from_secs(30)).await;
    wait_uncordoned(&lab, "w-0", Duration::from_secs(30)).await;
    // w-1: cordoned for as long as its cancelled entry waits for the cycle to end.
    hostcycle_testkit::wait_until(
        "w-1's cancelled entry to be removed (never uncordoned before)",
        REBOOT_TIMEOUT,
        || async {
            // The Node first, then the entry (an entry never comes back). Completion uncordons
            // first and then removes the entry (so a crash between them repeats both, and
            // nothing is left cordoned): an uncordoned Node with its entry still there is
            // fine only once the node has booted.
            let node = lab.node("w-1").await;
            let present = lab.entry("w-1").await.is_some();
            if present && !cordoned(&node) {
                assert!(
                    lab.boots("w-1").await >= 2,
                    "w-1 uncordoned before it booted, while its cancelled entry waits: {:?}",
                    lab.entry("w-1").await.map(|e| e.status)
                );
            }
            (!present).then_some(())
        },
    )
    .await
    .unwrap();
    wait_uncordoned(&lab, "w-1", Duration::from_secs(30)).await;
    for (entry, node) in [(&drain_entry, "w-0"), (&reboot_entry, "w-1")] {
        wait_until(
            &format!("a Cancelled Event about entry {entry} ({node})"),
            Duration::from_secs(30),
            || async {
                lab.event_reasons_about(entry)
                    .await
                    .iter()
                    .any(|r| r == "Cancelled")
                    .then_some(())
            },
        )
        .await
        .unwrap();
    }
    let cancelled_note = lab
        .events_about(&drain_entry)
        .await
        .into_iter()
        .find(|(r, _)| r == "Cancelled")
        .unwrap()
        .1;
    assert!(
        cancelled_note.contains("while draining"),
        "the Event says the drain was cancelled: {cancelled_note:?}"
    );

    // w-1: either the request was withdrawn before its cycle began (RebootWithdrawn), or the
    // reboot ran to its end; the host is not left off.
    let withdrawn = lab
        .event_reasons_about(&reboot_entry)
        .await
        .iter()
        .any(|r| r == "RebootWithdrawn");
    let host = if withdrawn {
        lab.lab.get("w-1").await
    } else {
        lab.lab.wait_reboot_done("w-1").await
    };
    lab.lab.wait_emulator_power("w-1", FakePower::On).await;
    lab.wait_node("w-1", "Ready again", REBOOT_TIMEOUT, node_ready)
        .await;
    lab.lab
        .assert_power_stays("w-1", "On", Duration::from_secs(3))
        .await;
    let cycles = offs_since(&lab, "w-1", started).await;
    if withdrawn {
        assert_eq!(cycles, 0, "a withdrawn request never power-cycles w-1");
    }
    assert!(
        cycles <= 1,
        "w-1 power-cycled at most once after the cancel at {cancelled_rebooting}: history {:?}, host {:?}",
        lab.lab.history("w-1"),
        host.status
    );
    assert!(
        !cordoned(&lab.node("w-1").await),
        "w-1 stays uncordoned after its reboot"
    );

    // w-0 (cancelled mid-drain) is never power-cycled, also a while later.
    lab.lab
        .assert_power_stays("w-0", "On", Duration::from_secs(5))
        .await;
    assert_eq!(
        offs_since(&lab, "w-0", started).await,
        0,
        "w-0 (cancelled while draining) is not rebooted"
    );
    assert!(!cordoned(&lab.node("w-0").await), "w-0 stays uncordoned");
    release(&lab, "w-0").await;

    // ----- disable mid-drain (X = w-2, held; Y = w-3) -----
    lab.patch_queue(json!({ "maxConcurrentReboots": 1 })).await;
    let sampler = EntrySampler::start(&lab);
    let x_entry = lab.queue("w-2").await;
    lab.queue("w-3").await;
    lab.wait_phase("w-2", EntryPhase::Draining, REBOOT_TIMEOUT)
        .await;
    lab.wait_node("w-2", "cordoned by the queue", REBOOT_TIMEOUT, |n| {
        cordoned(n) && cordoned_by_queue(n)
    })
    .await;
    wait_hold_terminating(&lab, "w-2").await;
    lab.wait_entry("w-3", "waits for the slot", REBOOT_TIMEOUT, |e| {
        message(e).contains("maxConcurrentReboots")
    })
    .await;

    lab.patch_queue(json!({ "enabled": false })).await;
    let disabled_at = Timestamp::now();
    let x = lab
        .wait_entry(
            "w-2",
            "back to Queued (drain stopped)",
            REBOOT_TIMEOUT,
            |e| e.phase() == EntryPhase::Queued,
        )
        .await;
    assert!(
        message(&x).contains("drain stopped") || message(&x).contains("disabled"),
        "X says why it stopped: {:?}",
        message(&x)
    );
    let x_stopped = x
        .status
        .as_ref()
        .and_then(|s| s.last_transition_time)
        .unwrap();
    assert!(x_stopped >= disabled_at - jiff::SignedDuration::from_secs(1));
    wait_uncordoned(&lab, "w-2", Duration::from_secs(30)).await;
    wait_until(
        &format!("a DrainStopped Event about entry {x_entry}"),
        Duration::from_secs(30),
        || async {
            lab.event_reasons_about(&x_entry)
                .await
                .iter()
                .any(|r| r == "DrainStopped")
                .then_some(())
        },
    )
    .await
    .unwrap();
    let status = wait_queue_status(&lab, "disabled", |s| !s.enabled).await;
    assert!(
        status.message.contains("disabled") && status.queued == 2,
        "{status:?}"
    );
    // Nothing moves while disabled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let entries = lab
            .entries
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        for node in ["w-2", "w-3"] {
            assert_eq!(
                phase_in(&entries, node),
                Some(EntryPhase::Queued),
                "{node} stays Queued while disabled: {}",
                lab.entries_summary().await
            );
            assert!(
                !cordoned(&lab.node(node).await),
                "{node} is not cordoned while disabled"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        message(&lab.entry("w-3").await.unwrap()).contains("disabled"),
        "Y says the queue is disabled"
    );
    for node in ["w-0", "w-1", "w-2", "w-3"] {
        assert_eq!(
            offs_since(&lab, node, disabled_at).await,
            0,
            "{node}: no reboot while the queue is disabled"
        );
    }

    // Re-enabled: X drains again from the start, then reboots; then Y.
    // Taken before the patch: the operator may see the change and drain before the API
    // server's answer reaches the test (a loaded machine), and that is no drain while
    // disabled.
    let enabled_at = Timestamp::now();
    lab.patch_queue(json!({ "enabled": true })).await;
    lab.wait_phase("w-2", EntryPhase::Draining, REBOOT_TIMEOUT)
        .await;
    lab.wait_node("w-2", "cordoned again", REBOOT_TIMEOUT, |n| {
        cordoned(n) && cordoned_by_queue(n)
    })
    .await;
    release(&lab, "w-2").await;
    lab.wait_entry_gone("w-2", REBOOT_TIMEOUT).await;
    lab.wait_entry_gone("w-3", REBOOT_TIMEOUT).await;
    let samples = sampler.finish().await;
    for s in &samples {
        assert!(s.in_progress().len() <= 1, "one slot: {}", s.describe());
        // From the moment X's drain stopped until the queue is enabled, nothing runs.
        if s.at > x_stopped && s.at < enabled_at {
            assert!(
                s.in_progress().is_empty(),
                "in progress while disabled: {}",
                s.describe()
            );
        }
    }
    if let Some(bad) = samples
        .iter()
        .find(|s| s.is_in_progress("w-3") && s.entry("w-2").is_some())
    {
        panic!("Y in progress before X was done: {}", bad.describe());
    }
    for node in ["w-2", "w-3"] {
        assert_eq!(
            offs_since(&lab, node, enabled_at).await,
            1,
            "{node}: one reboot after re-enabling; history {:?}",
            lab.lab.history(node)
        );
        wait_uncordoned(&lab, node, Duration::from_secs(30)).await;
    }
    let x_off = lab.off_after("w-2", enabled_at).unwrap();
    let y_off = lab.off_after("w-3", enabled_at).unwrap();
    assert!(x_off < y_off, "X rebooted before Y: {x_off} vs {y_off}");

    // ----- a Rebooting entry completes while the queue is disabled (Z = w-0) -----
    let z_start = Timestamp::now();
    lab.queue("w-0").await;
    lab.wait_phase("w-0", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await;
    lab.patch_queue(json!({ "enabled": false })).await;
    wait_queue_status(&lab, "disabled", |s| !s.enabled).await;
    let z = lab.entry("w-0").await;
    assert!(
        z.as_ref()
            .is_some_and(|z| z.phase() == EntryPhase::Rebooting),
        "Z is still Rebooting once the queue is disabled (else this phase proves nothing): {}",
        lab.entries_summary().await
    );
    lab.wait_entry_gone("w-0", REBOOT_TIMEOUT).await;
    let status = queue_status(&lab).await;
    assert!(
        !status.enabled,
        "still disabled when Z completed: {status:?}"
    );
    assert_eq!(
        offs_since(&lab, "w-0", z_start).await,
        1,
        "Z rebooted once while disabled; history {:?}",
        lab.lab.history("w-0")
    );
    wait_uncordoned(&lab, "w-0", Duration::from_secs(30)).await;
    lab.patch_queue(json!({ "enabled": true })).await;
    wait_queue_status(&lab, "enabled again and idle", |s| {
        s.enabled && s.queued == 0 && s.draining == 0 && s.rebooting == 0
    })
    .await;
}
