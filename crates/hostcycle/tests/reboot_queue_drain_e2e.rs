//! The reboot queue's drain rules end to end: real control plane (disruption, ReplicaSet and
//! Job controllers, scheduler), sushy-tools Redfish emulator, simulated kubelets following
//! it, the real operator binary.
//!
//! - PodDisruptionBudgets in protected and unprotected namespaces (`protectedNamespaces`);
//!   an administrator's cordon is kept, the queue's own cordon is lifted.
//! - Running Job pods (`protectedJobPods`), and a drain that times out
//!   (`evictionTimeoutSeconds`) and is retried at once after its backoff is reset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::queue::*;
use futures::StreamExt;
use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use hostcycle_testkit::wait_until;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

/// How long the preconditions of a scenario (pods running, budgets computed) may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// A drain that fails at once (dry-run refusal, protected Job pod) backs off within this:
/// well within seconds, and before the drain could time out (`evictionTimeoutSeconds` 60).
const BACKOFF_TIMEOUT: Duration = Duration::from_secs(45);
/// The drain backoff of these tests: long enough that a backed-off entry is never retried
/// while a test runs (and jitter 1 s, so its expiry is known to the second).
const BACKOFF_BASE_SECONDS: i64 = 600;

/// The queue for these tests: long drain backoffs, otherwise the fast test defaults.
fn drain_queue(extra: serde_json::Value) -> hostcycle_api::queue::RebootQueueSpec {
    let mut spec = serde_json::to_value(fast_queue()).unwrap();
    spec["drainBackoff"] =
        json!({ "baseSeconds": BACKOFF_BASE_SECONDS, "maxSeconds": 1200, "jitterSeconds": 1 });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(spec).unwrap()
}

/// (type, reason, note) of every Event about `object` (any namespace), oldest first.
async fn events(lab: &QueueLab, object: &str) -> Vec<(String, String, String)> {
    let mut events: Vec<Event> = Api::<Event>::all(lab.client.clone())
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
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until a Warning Event with `reason` about `object` exists whose note contains
/// `needle`; returns the note.
async fn wait_warning(lab: &QueueLab, object: &str, reason: &str, needle: &str) -> String {
    let what = format!("a Warning Event {reason} about {object} mentioning {needle:?}");
    match wait_until(&what, Duration::from_secs(30), || async {
        events(lab, object)
            .await
            .into_iter()
            .find(|(t, r, n)| t == "Warning" && r == reason && n.contains(needle))
            .map(|(_, _, n)| n)
    })
    .await
    {
        Ok(note) => note,
        Err(e) => panic!(
            "{e}\nEvents about {object}: {:#?}",
            events(lab, object).await
        ),
    }
}

/// Waits until Events with every one of `reasons` about `object` exist (they are published in
/// the background, after the status they report); returns them all.
async fn events_with(
    lab: &QueueLab,
    object: &str,
    reasons: &[&str],
) -> Vec<(String, String, String)> {
    let what = format!("Events {reasons:?} about {object}");
    match wait_until(&what, Duration::from_secs(30), || async {
        let events = events(lab, object).await;
        reasons
            .iter()
            .all(|want| events.iter().any(|(_, r, _)| r == want))
            .then_some(events)
    })
    .await
    {
        Ok(events) => events,
        Err(e) => panic!(
            "{e}\nEvents about {object}: {:#?}",
            events(lab, object).await
        ),
    }
}

/// The pods of `ns` matching `selector`, as name → (uid, terminating, phase, node).
async fn pods(
    lab: &QueueLab,
    ns: &str,
    selector: &str,
) -> BTreeMap<String, (String, bool, String, String)> {
    Api::<Pod>::namespaced(lab.client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.name_any(),
                (
                    p.uid().unwrap_or_default(),
                    p.metadata.deletion_timestamp.is_some(),
                    p.status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default(),
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                ),
            )
        })
        .collect()
}

/// UIDs of the pods of `ns` matching `selector`, running on `node` and not terminating.
async fn running_uids_on(lab: &QueueLab, ns: &str, selector: &str, node: &str) -> Vec<String> {
    pods(lab, ns, selector)
        .await
        .into_values()
        .filter(|(_, terminating, phase, on)| !terminating && phase == "Running" && on == node)
        .map(|(uid, ..)| uid)
        .collect()
}

/// Waits until the Job's one pod runs on `node`; returns (name, uid).
async fn wait_job_pod(lab: &QueueLab, ns: &str, job: &str, node: &str) -> (String, String) {
    let what = format!("the pod of Job {ns}/{job} Running on {node}");
    wait_until(&what, SETUP_TIMEOUT, || async {
        pods(lab, ns, &format!("job={job}"))
            .await
            .into_iter()
            .find(|(_, (_, terminating, phase, on))| {
                !terminating && phase == "Running" && on == node
            })
            .map(|(name, (uid, ..))| (name, uid))
    })
    .await
    .unwrap()
}

/// Waits until the disruption controller has computed the budget: `healthy` pods, and no
/// disruption allowed.
async fn wait_pdb_blocking(lab: &QueueLab, ns: &str, name: &str, healthy: i64) {
    let policy = kube::discovery::group(&lab.client, "policy").await.unwrap();
    let (resource, _) = policy.recommended_kind("PodDisruptionBudget").unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(lab.client.clone(), ns, &resource);
    let what = format!("PodDisruptionBudget {ns}/{name}: {healthy} healthy, 0 disruptions allowed");
    wait_until(&what, SETUP_TIMEOUT, || async {
        let pdb = api.get(name).await.ok()?;
        let status = pdb.data.get("status")?;
        let observed = status.get("observedGeneration")?.as_i64()?;
        (observed >= pdb.metadata.generation.unwrap_or(1)
            && status.get("currentHealthy")?.as_i64()? == healthy
            && status.get("disruptionsAllowed")?.as_i64()? == 0)
            .then_some(())
    })
    .await
    .unwrap();
}

/// Waits until the entry for `node` went back to `Queued` after a failed drain.
async fn wait_backed_off(lab: &QueueLab, node: &str, timeout: Duration) -> RebootQueueEntry {
    lab.wait_entry(node, "backed off after a failed drain", timeout, |e| {
        e.phase() == EntryPhase::Queued
            && e.status
                .as_ref()
                .is_some_and(|s| s.drain_backoff_count >= 1)
    })
    .await
}

/// Waits until `node` is schedulable and carries no queue annotation.
async fn wait_uncordoned(lab: &QueueLab, node: &str, why: &str) -> Node {
    lab.wait_node(node, why, REBOOT_TIMEOUT, |n| {
        !cordoned(n) && !cordoned_by_queue(n)
    })
    .await
}

/// Checks a backed-off entry: one failure, an expiry `BACKOFF_BASE_SECONDS` (+ < 1 s jitter)
/// after the transition back to `Queued`, which is in the future.
fn assert_backoff(entry: &RebootQueueEntry, node: &str) {
    let status = entry.status.as_ref().unwrap();
    assert_eq!(status.phase(), EntryPhase::Queued, "{node}: {status:?}");
    assert_eq!(status.drain_backoff_count, 1, "{node}: {status:?}");
    let expire = status.drain_backoff_expire.expect("drainBackoffExpire set");
    let since = status.last_transition_time.expect("lastTransitionTime set");
    let delay = expire.duration_since(since);
    assert!(
        delay >= SignedDuration::from_secs(BACKOFF_BASE_SECONDS)
            && delay <= SignedDuration::from_secs(BACKOFF_BASE_SECONDS + 1),
        "{node}: backoff of {delay:?} (expire {expire}, since {since})"
    );
    assert!(
        expire > Timestamp::now() + SignedDuration::from_secs(BACKOFF_BASE_SECONDS - 120),
        "{node}: backoff expiry {expire} must be ~10 minutes ahead"
    );
}

/// The entry's status message.
fn message(entry: &RebootQueueEntry) -> String {
    entry
        .status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

/// Checks that must hold but are reported at the end of the test, so one wrong status
/// message does not hide the outcome of every later scenario.
#[derive(Default)]
struct Later(Vec<String>);

impl Later {
    fn check(&mut self, ok: bool, what: String) {
        if !ok {
            eprintln!("CHECK FAILED (reported at the end): {what}");
            self.0.push(what);
        }
    }

    fn assert_all(self) {
        assert!(
            self.0.is_empty(),
            "{} check(s) failed:\n- {}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// Every version of one Node seen by a watch: (unschedulable, queue annotation present).
struct NodeWatch {
    states: Arc<Mutex<Vec<(bool, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeWatch {
    async fn start(client: &Client, name: &str) -> NodeWatch {
        let api: Api<Node> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let states: Arc<Mutex<Vec<(bool, bool)>>> = Arc::default();
        let sink = states.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, config).default_backoff().applied_objects();
            futures::pin_mut!(stream);
            while let Some(node) = stream.next().await {
                if let Ok(node) = node {
                    sink.lock()
                        .unwrap()
                        .push((cordoned(&node), cordoned_by_queue(&node)));
                }
            }
        });
        let watch = NodeWatch { states, task };
        wait_until(
            &format!("the watch of Node {name} to see it"),
            Duration::from_secs(30),
            || async { (!watch.states().is_empty()).then_some(()) },
        )
        .await
        .unwrap();
        watch
    }

    fn states(&self) -> Vec<(bool, bool)> {
        self.states.lock().unwrap().clone()
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Protected vs unprotected namespaces under a PodDisruptionBudget that allows nothing.
///
/// 1a. `guarded` (protected): the eviction dry-run is refused, so the drain backs off at once,
///     before touching anything: no pod evicted or deleted, the node uncordoned, never
///     rebooted.
/// 1b. `scratch` (unprotected): the refused pods are deleted (PodDeleted Warnings on the
///     Node); the node drains, reboots once, is uncordoned, and its entry is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pdb_refusals_back_off_in_protected_namespaces_and_delete_elsewhere() {
    let spec = drain_queue(json!({
        "protectedNamespaces": { "matchLabels": { "protected": "true" } },
        "evictRetries": 0,
    }));
    let lab = QueueLab::start(&[worker("w-a"), worker("w-b")], spec).await;
    let mut later = Later::default();

    // ----- 1a: protected namespace -----------------------------------------------------
    lab.namespace("guarded", &[("protected", "true")]).await;
    lab.deployment("guarded", "web", 2, Some("w-a")).await;
    lab.pdb("guarded", "web", 2).await;
    lab.wait_running("guarded", "web", 2).await;
    wait_pdb_blocking(&lab, "guarded", "web", 2).await;
    let guarded_before = running_uids_on(&lab, "guarded", "app=web", "w-a").await;
    assert_eq!(guarded_before.len(), 2, "both guarded pods run on w-a");
    let guarded_names: Vec<String> = pods(&lab, "guarded", "app=web").await.into_keys().collect();

    let entry_a = lab.queue("w-a").await;
    let backed_off = wait_backed_off(&lab, "w-a", BACKOFF_TIMEOUT).await;
    assert_backoff(&backed_off, "w-a");
    wait_uncordoned(&lab, "w-a", "uncordoned after the drain backed off").await;
    let note = wait_warning(&lab, &entry_a, "DrainBackoff", "guarded/").await;
    assert!(
        note.contains("PodDisruptionBudget") && guarded_names.iter().any(|n| note.contains(n)),
        "the DrainBackoff Event names the budget and the pod: {note}"
    );
    wait_warning(&lab, "w-a", "DrainBackoff", "guarded/").await;
    // What `kubectl get rqe` shows for the next ten minutes must say why.
    let settled = lab.entry("w-a").await.unwrap();
    let text = message(&settled);
    later.check(
        text.contains("PodDisruptionBudget") && guarded_names.iter().any(|n| text.contains(n)),
        format!(
            "1a: the backed-off entry's message names the PodDisruptionBudget refusal and the \
             pod (guarded pods {guarded_names:?}); it is {text:?}"
        ),
    );
    // Nothing was evicted or deleted: the same pods still run.
    let mut guarded_after = running_uids_on(&lab, "guarded", "app=web", "w-a").await;
    let mut before_sorted = guarded_before.clone();
    before_sorted.sort();
    guarded_after.sort();
    assert_eq!(
        guarded_after, before_sorted,
        "no guarded pod was evicted or deleted"
    );
    let metrics = lab.lab.metrics().await;
    for absent in [
        "hostcycle_reboot_queue_evictions_total{result=\"evicted\"}",
        "hostcycle_reboot_queue_evictions_total{result=\"deleted\"}",
    ] {
        assert!(
            !metrics.contains(absent),
            "the dry-run refusal evicts nothing: {absent} in\n{metrics}"
        );
    }
    assert!(
        metrics.contains("hostcycle_reboot_queue_drain_backoffs_total{reason=\"eviction\"} 1"),
        "one eviction backoff in\n{metrics}"
    );
    assert_eq!(lab.power_cycles("w-a").await, 0, "w-a was not rebooted");

    // ----- 1b: unprotected namespace ---------------------------------------------------
    lab.namespace("scratch", &[]).await;
    lab.deployment("scratch", "web", 2, Some("w-b")).await;
    lab.pdb("scratch", "web", 2).await;
    lab.wait_running("scratch", "web", 2).await;
    wait_pdb_blocking(&lab, "scratch", "web", 2).await;
    let scratch_before = pods(&lab, "scratch", "app=web").await;
    assert_eq!(scratch_before.len(), 2);
    assert!(
        scratch_before.values().all(|(_, _, _, on)| on == "w-b"),
        "{scratch_before:?}"
    );

    let entry_b = lab.queue("w-b").await;
    lab.wait_node("w-b", "cordoned by the queue", REBOOT_TIMEOUT, |n| {
        cordoned(n) && cordoned_by_queue(n)
    })
    .await;
    lab.wait_entry_gone("w-b", REBOOT_TIMEOUT).await;
    wait_uncordoned(&lab, "w-b", "uncordoned after its reboot").await;
    assert_eq!(lab.power_cycles("w-b").await, 1, "w-b: one power cycle");
    for name in scratch_before.keys() {
        wait_warning(&lab, "w-b", "PodDeleted", &format!("scratch/{name}")).await;
    }
    let scratch_after = pods(&lab, "scratch", "app=web").await;
    for (name, (uid, ..)) in &scratch_before {
        assert!(
            scratch_after.values().all(|(u, ..)| u != uid),
            "scratch/{name} was deleted: {scratch_after:?}"
        );
    }
    let b_events = events_with(
        &lab,
        &entry_b,
        &["DrainCompleted", "RebootStarted", "Completed"],
    )
    .await;
    assert!(
        !b_events.iter().any(|(_, r, _)| r == "DrainBackoff"),
        "w-b never backed off: {b_events:?}"
    );
    for r in ["DrainCompleted", "RebootStarted", "Completed"] {
        assert!(
            b_events.iter().any(|(_, x, _)| x == r),
            "entry Event {r} in {b_events:?}"
        );
    }
    let metrics = lab.lab.metrics().await;
    for m in [
        "hostcycle_reboot_queue_evictions_total{result=\"refused\"} 2",
        "hostcycle_reboot_queue_evictions_total{result=\"deleted\"} 2",
        "hostcycle_reboot_queue_dequeued_total{reason=\"Completed\"} 1",
    ] {
        assert!(metrics.contains(m), "metric {m} in\n{metrics}");
    }
    // The replacements come back on w-b once it is schedulable again.
    lab.wait_running("scratch", "web", 2).await;

    // w-a's entry stayed backed off all along, untouched; cancel it to leave the queue clean.
    let a_now = lab.entry("w-a").await.expect("w-a's entry is still queued");
    assert_eq!(a_now.phase(), EntryPhase::Queued);
    assert_eq!(a_now.status.as_ref().unwrap().drain_backoff_count, 1);
    lab.cancel("w-a").await;
    lab.wait_entry_gone("w-a", REBOOT_TIMEOUT).await;
    let mut guarded_end = running_uids_on(&lab, "guarded", "app=web", "w-a").await;
    guarded_end.sort();
    assert_eq!(
        guarded_end, before_sorted,
        "the guarded pods were never moved"
    );
    let a = lab.node("w-a").await;
    assert!(
        !cordoned(&a) && !cordoned_by_queue(&a),
        "w-a left schedulable"
    );
    assert_eq!(lab.power_cycles("w-a").await, 0, "w-a was never rebooted");

    assert_eq!(lab.power_cycles("w-b").await, 1, "w-b rebooted once");
    later.assert_all();
}

/// An administrator's cordon stays: a node cordoned by hand (no queue annotation) is drained
/// and rebooted once, and is still cordoned afterwards, never having carried the queue's
/// annotation. A node the queue cordoned itself, rebooted alongside, is uncordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn administrator_cordon_stays_queue_cordon_is_lifted() {
    // Both nodes are processed at once, to keep the test short.
    let spec = drain_queue(json!({ "maxConcurrentReboots": 2 }));
    let lab = QueueLab::start(&[worker("w-f"), worker("w-g")], spec).await;
    // A pod on w-f, so that its drain has something to evict.
    lab.namespace("apps", &[]).await;
    lab.deployment("apps", "on-f", 1, Some("w-f")).await;
    lab.wait_running("apps", "on-f", 1).await;
    let on_f = running_uids_on(&lab, "apps", "app=on-f", "w-f").await;
    assert_eq!(on_f.len(), 1);
    let watch_f = NodeWatch::start(&lab.client, "w-f").await;
    let watch_g = NodeWatch::start(&lab.client, "w-g").await;
    lab.nodes
        .patch(
            "w-f",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    lab.wait_node(
        "w-f",
        "cordoned by the administrator",
        SETUP_TIMEOUT,
        cordoned,
    )
    .await;
    let started = Timestamp::now();
    lab.queue("w-f").await;
    lab.queue("w-g").await;
    lab.wait_entry_gone("w-f", REBOOT_TIMEOUT).await;
    lab.wait_entry_gone("w-g", REBOOT_TIMEOUT).await;
    wait_uncordoned(&lab, "w-g", "uncordoned after its reboot").await;

    for node in ["w-f", "w-g"] {
        assert_eq!(lab.power_cycles(node).await, 1, "{node}: one power cycle");
        assert!(lab.off_after(node, started).is_some());
    }
    let f = lab.node("w-f").await;
    assert!(cordoned(&f), "w-f is still cordoned after its reboot");
    assert!(
        !cordoned_by_queue(&f),
        "w-f never carries the queue's annotation"
    );
    let f_states = watch_f.states();
    assert!(
        f_states.iter().all(|(_, annotated)| !annotated),
        "w-f never carried the queue's annotation: {f_states:?}"
    );
    let first_cordoned = f_states.iter().position(|(c, _)| *c).unwrap();
    assert!(
        f_states[first_cordoned..].iter().all(|(c, _)| *c),
        "w-f stayed cordoned from the administrator's cordon on: {f_states:?}"
    );
    let f_reasons = lab
        .wait_event_reasons_about("w-f", &["BootConfirmed"])
        .await;
    assert!(
        !f_reasons.iter().any(|r| r == "Uncordoned"),
        "no Uncordoned Event for w-f: {f_reasons:?}"
    );
    assert!(
        f_reasons.iter().any(|r| r == "BootConfirmed"),
        "{f_reasons:?}"
    );
    let g_states = watch_g.states();
    assert!(
        g_states.iter().any(|(c, a)| *c && *a),
        "the queue cordoned w-g (with its annotation): {g_states:?}"
    );
    lab.wait_event_reasons_about("w-g", &["Uncordoned"]).await;
    let g = lab.node("w-g").await;
    assert!(!cordoned(&g) && !cordoned_by_queue(&g), "w-g uncordoned");
    // w-f's pod was evicted; its replacement cannot go back to the still cordoned w-f.
    let left = pods(&lab, "apps", "app=on-f").await;
    assert!(
        left.values()
            .all(|(uid, _, _, node)| *uid != on_f[0] && node.is_empty()),
        "the evicted pod is gone and its replacement stays unscheduled: {left:?}"
    );
    let metrics = lab.lab.metrics().await;
    for m in [
        "hostcycle_reboot_queue_evictions_total{result=\"evicted\"} 1",
        "hostcycle_reboot_queue_dequeued_total{reason=\"Completed\"} 2",
    ] {
        assert!(metrics.contains(m), "metric {m} in\n{metrics}");
    }
}

/// Running Job pods and a drain that times out.
///
/// 2a. Default config (every running Job pod protected): the drain backs off before touching
///     anything; the Job pod keeps running; the node is uncordoned and not rebooted.
/// 2b. `protectedJobPods: critical=true`: an unlabelled Job pod is deleted and its node
///     reboots; a labelled Job pod on another node is not touched.
/// 3.  A pod held by a finalizer outlives `evictionTimeoutSeconds`: the drain backs off for
///     ten minutes and the node is uncordoned. Once the finalizer is removed and the backoff
///     reset as `hostcycle rq reset-backoff` does it, the node drains and reboots at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_pods_and_drain_timeout_then_reset_backoff() {
    let lab = QueueLab::start(
        &[worker("w-c"), worker("w-d"), worker("w-e")],
        drain_queue(json!({})),
    )
    .await;
    let mut later = Later::default();

    // ----- 2a: every running Job pod is protected by default ---------------------------
    lab.namespace("batch", &[]).await;
    lab.job("batch", "held", "w-c", &[]).await;
    let (held_pod, held_uid) = wait_job_pod(&lab, "batch", "held", "w-c").await;
    let entry_c = lab.queue("w-c").await;
    let backed_off = wait_backed_off(&lab, "w-c", BACKOFF_TIMEOUT).await;
    assert_backoff(&backed_off, "w-c");
    wait_uncordoned(&lab, "w-c", "uncordoned after the drain backed off").await;
    let note = wait_warning(&lab, &entry_c, "DrainBackoff", &format!("batch/{held_pod}")).await;
    assert!(note.contains("Job pod"), "{note}");
    let settled = lab.entry("w-c").await.unwrap();
    let text = message(&settled);
    later.check(
        text.contains("Job pod") && text.contains(&held_pod),
        format!(
            "2a: the backed-off entry's message names the protected Job pod batch/{held_pod}; \
             it is {text:?}"
        ),
    );
    assert_eq!(
        running_uids_on(&lab, "batch", "job=held", "w-c").await,
        vec![held_uid.clone()],
        "the protected Job pod still runs, untouched"
    );
    let metrics = lab.lab.metrics().await;
    assert!(
        metrics.contains("hostcycle_reboot_queue_drain_backoffs_total{reason=\"job_pods\"} 1"),
        "one job_pods backoff in\n{metrics}"
    );
    assert!(
        !metrics.contains("hostcycle_reboot_queue_evictions_total{"),
        "nothing evicted or deleted in\n{metrics}"
    );
    // The gauge HostcycleRebootQueueBackedOff alerts on: one entry waiting out a backoff.
    wait_until(
        "hostcycle_reboot_queue_backed_off_entries 1",
        Duration::from_secs(30),
        || async {
            let metrics = lab.lab.metrics().await;
            metrics
                .lines()
                .any(|l| l == "hostcycle_reboot_queue_backed_off_entries 1")
                .then_some(())
        },
    )
    .await
    .unwrap();
    lab.cancel("w-c").await;
    lab.wait_entry_gone("w-c", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("w-c").await, 0, "w-c was not rebooted");

    // ----- 2b: only labelled Job pods are protected -------------------------------------
    lab.patch_queue(json!({ "protectedJobPods": { "matchLabels": { "critical": "true" } } }))
        .await;
    lab.job("batch", "critical", "w-c", &[("critical", "true")])
        .await;
    lab.job("batch", "plain", "w-d", &[]).await;
    let (_, critical_uid) = wait_job_pod(&lab, "batch", "critical", "w-c").await;
    let (plain_pod, plain_uid) = wait_job_pod(&lab, "batch", "plain", "w-d").await;
    let entry_d = lab.queue("w-d").await;
    lab.wait_entry_gone("w-d", REBOOT_TIMEOUT).await;
    wait_uncordoned(&lab, "w-d", "uncordoned after its reboot").await;
    assert_eq!(lab.power_cycles("w-d").await, 1, "w-d: one power cycle");
    wait_warning(&lab, "w-d", "PodDeleted", &format!("batch/{plain_pod}")).await;
    assert!(
        pods(&lab, "batch", "job=plain")
            .await
            .values()
            .all(|(uid, ..)| *uid != plain_uid),
        "the unprotected Job pod was deleted"
    );
    assert!(
        !events(&lab, &entry_d)
            .await
            .iter()
            .any(|(_, r, _)| r == "DrainBackoff"),
        "w-d drained at the first try"
    );
    assert_eq!(
        running_uids_on(&lab, "batch", "job=critical", "w-c").await,
        vec![critical_uid],
        "the labelled Job pod on w-c was not touched"
    );
    assert_eq!(
        running_uids_on(&lab, "batch", "job=held", "w-c").await,
        vec![held_uid],
        "the Job pod on w-c was not touched"
    );
    assert_eq!(lab.power_cycles("w-c").await, 0, "w-c was never rebooted");

    // ----- 3: drain timeout, then reset-backoff -----------------------------------------
    lab.patch_queue(json!({ "evictionTimeoutSeconds": 8 }))
        .await;
    lab.namespace("hold", &[]).await;
    lab.deployment("hold", "sticky", 1, Some("w-e")).await;
    lab.wait_running("hold", "sticky", 1).await;
    let sticky = pods(&lab, "hold", "app=sticky").await;
    let (sticky_pod, (sticky_uid, ..)) = sticky.into_iter().next().unwrap();
    let hold_pods: Api<Pod> = Api::namespaced(lab.client.clone(), "hold");
    hold_pods
        .patch(
            &sticky_pod,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": ["hostcycle.io/e2e-hold"] } })),
        )
        .await
        .unwrap();

    let entry_e = lab.queue("w-e").await;
    lab.wait_entry(
        "w-e",
        "draining, waiting for the held pod",
        REBOOT_TIMEOUT,
        |e| e.phase() == EntryPhase::Draining && message(e).contains(&sticky_pod),
    )
    .await;
    let backed_off = wait_backed_off(&lab, "w-e", BACKOFF_TIMEOUT).await;
    assert_backoff(&backed_off, "w-e");
    wait_uncordoned(&lab, "w-e", "uncordoned after the drain timed out").await;
    let note = wait_warning(&lab, &entry_e, "DrainBackoff", "timed out").await;
    assert!(
        note.contains(&sticky_pod),
        "the Event names the pod: {note}"
    );
    wait_warning(&lab, "w-e", "DrainBackoff", "timed out").await;
    let settled = lab.entry("w-e").await.unwrap();
    let text = message(&settled);
    later.check(
        text.contains("timed out"),
        format!("3: the backed-off entry's message says the drain timed out; it is {text:?}"),
    );
    let held = hold_pods.get(&sticky_pod).await.unwrap();
    assert_eq!(held.uid().as_deref(), Some(sticky_uid.as_str()));
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "the held pod was evicted and is Terminating"
    );
    assert_eq!(lab.power_cycles("w-e").await, 0, "w-e not rebooted yet");
    let metrics = lab.lab.metrics().await;
    assert!(
        metrics.contains("hostcycle_reboot_queue_drain_backoffs_total{reason=\"timeout\"} 1"),
        "one timeout backoff in\n{metrics}"
    );

    // Release the pod, then reset the backoff as `hostcycle rq reset-backoff` does. (The
    // eviction timeout goes back up first so that the retry cannot time out on a loaded
    // machine: what is tested here is that the reset lets the entry go at once.)
    lab.patch_queue(json!({ "evictionTimeoutSeconds": 60 }))
        .await;
    hold_pods
        .patch(
            &sticky_pod,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    wait_until(
        &format!("the held pod hold/{sticky_pod} to be gone"),
        SETUP_TIMEOUT,
        || async {
            let p = hold_pods.get_opt(&sticky_pod).await.ok()?;
            p.is_none_or(|p| p.uid().as_deref() != Some(sticky_uid.as_str()))
                .then_some(())
        },
    )
    .await
    .unwrap();
    let entry = lab.entry("w-e").await.unwrap();
    let expire = entry
        .status
        .as_ref()
        .and_then(|s| s.drain_backoff_expire)
        .unwrap();
    let reset = json!({
        "metadata": { "resourceVersion": entry.resource_version() },
        "status": { "drainBackoffCount": null, "drainBackoffExpire": null },
    });
    lab.entries
        .patch_status(&entry_e, &PatchParams::default(), &Patch::Merge(&reset))
        .await
        .unwrap();
    let reset_at = Timestamp::now();
    lab.wait_entry_gone("w-e", REBOOT_TIMEOUT).await;
    let done = Timestamp::now();
    assert!(
        done < expire,
        "w-e rebooted at {done}, before its backoff expiry {expire}"
    );
    assert!(
        lab.off_after("w-e", reset_at).is_some(),
        "w-e powered off after the reset"
    );
    assert_eq!(lab.power_cycles("w-e").await, 1, "w-e: one power cycle");
    wait_uncordoned(&lab, "w-e", "uncordoned after its reboot").await;
    let metrics = lab.lab.metrics().await;
    for m in [
        "hostcycle_reboot_queue_drain_backoffs_total{reason=\"timeout\"} 1",
        "hostcycle_reboot_queue_drain_backoffs_total{reason=\"job_pods\"} 1",
        "hostcycle_reboot_queue_dequeued_total{reason=\"Completed\"} 2",
    ] {
        assert!(metrics.contains(m), "metric {m} in\n{metrics}");
    }
    later.assert_all();
}
