//! Machine remediation end to end, against the real control plane, the Redfish emulator,
//! simulated kubelets and the real `hostcycle operator` binary: the seed's flow for both
//! Machine kinds at once (and the proof that a Node is deleted only once its host is off), the
//! HostRemediation contract driven the way Cluster API's MachineHealthCheck and medik8s'
//! NodeHealthCheck drive it, and a trigger withdrawn before and after the Node's deletion
//! (OpenShift bug 1975296).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::queue::worker;
use common::remediation::*;
use hostcycle_api::BareMetalHost;
use hostcycle_api::reasons::remediation::event_reason as reason;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HOST_REMEDIATION_FINALIZER, HostRemediation,
    MACHINE_POWER_OFF_ANNOTATION, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, RemediationPhase, RemediationStep,
    request_power_off_annotation,
};
use hostcycle_testkit::MachineKind;
use hostcycle_testkit::machines::OPENSHIFT_MACHINE_ROLE_LABEL;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{DynamicObject, Patch, PatchParams};

const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// What the test puts on a Node before it is remediated.
const TEAM_LABEL: (&str, &str) = ("team", "db");
const OWNER_ANNOTATION: (&str, &str) = ("example.com/owner", "dba-oncall");
/// A key the simulated kubelet sets itself (`linux`): the re-registered Node's value wins.
const OS_LABEL: (&str, &str) = ("kubernetes.io/os", "plan9");

/// Every step of a successful flow, as Event reasons.
const FLOW_REASONS: [&str; 7] = [
    reason::STARTED,
    reason::POWERED_OFF,
    reason::NODE_DELETED,
    reason::NODE_RELEASED,
    reason::POWER_ON_REQUESTED,
    reason::NODE_RESTORED,
    reason::SUCCEEDED,
];

/// Labels and annotates the Node as a cluster admin would; returns its UID.
async fn prepare_node(lab: &RemediationLab, node: &str) -> String {
    lab.label_node(node, &[TEAM_LABEL, OS_LABEL], &[OWNER_ANNOTATION])
        .await;
    lab.node(node).await.uid().unwrap()
}

/// The re-registered Node has the custom label and annotation back, and the simulated
/// kubelet's own labels (its value wins over the backed-up one).
fn assert_node_restored(node: &Node, name: &str) {
    let labels = node.labels();
    let annotations = node.annotations();
    assert_eq!(
        labels.get(TEAM_LABEL.0).map(String::as_str),
        Some(TEAM_LABEL.1),
        "{name}: custom label restored; labels {labels:?}"
    );
    assert_eq!(
        annotations.get(OWNER_ANNOTATION.0).map(String::as_str),
        Some(OWNER_ANNOTATION.1),
        "{name}: custom annotation restored; annotations {annotations:?}"
    );
    assert_eq!(
        labels.get(OS_LABEL.0).map(String::as_str),
        Some("linux"),
        "{name}: the new Node's own value wins over the backup"
    );
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(name),
        "{name}: kubelet label kept"
    );
    assert_eq!(
        labels.get("hostcycle.io/simulated").map(String::as_str),
        Some("true"),
        "{name}: kubelet label kept"
    );
}

/// Exactly one power-off and one power-on, ending On (the emulator's truth).
async fn assert_one_power_cycle(lab: &RemediationLab, host: &str) {
    let history = lab.lab.settled_history(host).await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "{host}: exactly one power cycle; history {history:?}"
    );
    assert_eq!(
        history.0.last().map(|(_, s)| s.as_str()),
        Some("On"),
        "{host}: ends On"
    );
}

fn index_of<K: Clone>(
    seen: &[Seen<K>],
    from: usize,
    pred: impl Fn(&Seen<K>) -> bool,
) -> Option<usize> {
    seen.iter()
        .enumerate()
        .skip(from)
        .find(|(_, s)| pred(s))
        .map(|(i, _)| i)
}

/// What the recorders saw of one remediated host, and the proof of the flow's order.
struct Watched {
    machine: MachineRef,
    host: &'static str,
    old_uid: String,
    host_rec: Recorder<BareMetalHost>,
    node_rec: Recorder<Node>,
    machine_rec: Recorder<DynamicObject>,
    probe: PowerProbe,
}

/// When the annotation flow's power-off was on `host` (added, removed), from its recorder.
fn power_off_window(w: &Watched) -> (Timestamp, Timestamp) {
    let seen = w.host_rec.seen();
    let added = index_of(&seen, 0, |s| machine_power_off_requested(&s.object))
        .unwrap_or_else(|| panic!("{}: the power-off annotation was never seen", w.host));
    let removed = index_of(&seen, added, |s| !machine_power_off_requested(&s.object))
        .unwrap_or_else(|| panic!("{}: the power-off annotation was never removed", w.host));
    (seen[added].at, seen[removed].at)
}

/// Follows one remediation to its end: the emulator's Off (then the fast probe stops), the
/// Node back and Ready, the Machine clean.
async fn follow(lab: &RemediationLab, w: &Watched, marked: Timestamp) -> Node {
    let what = format!("{}: the emulator reports Off (fast probe)", w.host);
    hostcycle_testkit::wait_until(&what, CYCLE_TIMEOUT, || async {
        w.probe.first_after("Off", marked)
    })
    .await
    .unwrap();
    w.probe.stop();
    lab.wait_node_back(w.host, &w.old_uid, CYCLE_TIMEOUT).await;
    lab.wait_machine_clean(&w.machine, CYCLE_TIMEOUT).await;
    // Read after the cleanup: the Node seen at its registration may predate the restore.
    let node = lab.node(w.host).await;
    assert_ne!(
        node.uid().as_deref(),
        Some(w.old_uid.as_str()),
        "{}: a new Node",
        w.host
    );
    node
}

/// The seed's order on one host, from the watches: the host's power-off requested (hard); the
/// host's `status.poweredOn` false and the emulator Off; only then the Node deleted (once);
/// then `powered-off-for-remediation` and `power-on-will-timeout-at` on the Machine and the
/// power-off removed; the Node back; the trigger removed with every marker at once.
fn assert_flow_order(w: &Watched, marked: Timestamp) {
    let host = w.host;
    let host_seen = w.host_rec.seen();
    let node_seen = w.node_rec.seen();
    let machine_seen = w.machine_rec.seen();

    // The power-off request, hard.
    let requested = host_seen
        .iter()
        .find(|s| machine_power_off_requested(&s.object))
        .unwrap_or_else(|| panic!("{host}: no power-off request seen"));
    assert_eq!(
        requested
            .object
            .annotations()
            .get(MACHINE_POWER_OFF_ANNOTATION)
            .map(String::as_str),
        Some(r#"{"mode":"hard"}"#),
        "{host}: a hard power-off"
    );
    // The host's status says off, after the trigger.
    let status_off = host_seen
        .iter()
        .find(|s| s.at > marked && powered_on(&s.object) == Some(false))
        .unwrap_or_else(|| panic!("{host}: status.poweredOn false never seen"));
    let emulator_off = w
        .probe
        .first_after("Off", marked)
        .unwrap_or_else(|| panic!("{host}: the emulator never reported Off"));

    // The Node: deleted exactly once, re-created with a new UID.
    let deletions = w.node_rec.deletions();
    assert_eq!(
        deletions.len(),
        1,
        "{host}: the Node is deleted exactly once; seen {:?}",
        node_seen
            .iter()
            .map(|s| (s.at, s.deleted, s.object.uid()))
            .collect::<Vec<_>>()
    );
    let deleted = &deletions[0];
    assert_eq!(deleted.object.uid().as_deref(), Some(w.old_uid.as_str()));
    let uids = w.node_rec.uids();
    assert_eq!(
        uids.len(),
        2,
        "{host}: the old Node, then a new one: {uids:?}"
    );

    // The ordering proof.
    assert!(
        deleted.at > status_off.at && deleted.revision() > status_off.revision(),
        "{host}: the Node was deleted (seen {}, revision {}) before the host's status said off \
         (seen {}, revision {})",
        deleted.at,
        deleted.revision(),
        status_off.at,
        status_off.revision()
    );
    assert!(
        deleted.at > emulator_off.at,
        "{host}: the Node was deleted (seen {}) before the emulator reported Off ({})",
        deleted.at,
        emulator_off.at
    );
    let (_, released) = power_off_window(w);
    assert!(
        released > deleted.at,
        "{host}: the power-off was released ({released}) before the Node was deleted ({})",
        deleted.at
    );
    let recreated = node_seen
        .iter()
        .find(|s| !s.deleted && s.object.uid().as_deref() == Some(uids[1].as_str()))
        .unwrap();
    let host_on_again = host_seen
        .iter()
        .find(|s| s.at > status_off.at && powered_on(&s.object) == Some(true))
        .unwrap_or_else(|| panic!("{host}: status.poweredOn true again never seen"));
    println!(
        "{host}: emulator Off → host status.poweredOn=false: {} ms; status off → Node deleted: \
         {} ms; emulator Off → Node deleted: {} ms (revisions: status off {} < deletion {}); \
         Node deleted → power-off released: {} ms; status on again → Node re-registered: {} ms",
        millis(emulator_off.at, status_off.at),
        millis(status_off.at, deleted.at),
        millis(emulator_off.at, deleted.at),
        status_off.revision(),
        deleted.revision(),
        millis(deleted.at, released),
        millis(host_on_again.at, recreated.at),
    );

    // The Machine: backups before the deletion; powered-off-for-remediation once the Node is
    // gone; power-on-will-timeout-at; the trigger kept until the end, then removed with every
    // marker in one write.
    let backed_up = machine_seen
        .iter()
        .find(|s| {
            s.object
                .annotations()
                .contains_key(NODE_LABELS_BACKUP_ANNOTATION)
        })
        .unwrap_or_else(|| panic!("{}: no backup seen", w.machine));
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&backed_up.object.annotations()[NODE_LABELS_BACKUP_ANNOTATION])
            .unwrap();
    assert_eq!(
        labels.get(TEAM_LABEL.0).map(String::as_str),
        Some(TEAM_LABEL.1)
    );
    let annotations: BTreeMap<String, String> =
        serde_json::from_str(&backed_up.object.annotations()[NODE_ANNOTATIONS_BACKUP_ANNOTATION])
            .unwrap();
    assert_eq!(
        annotations.get(OWNER_ANNOTATION.0).map(String::as_str),
        Some(OWNER_ANNOTATION.1)
    );
    assert!(
        backed_up.revision() < deleted.revision(),
        "{}: the backup is written before the Node is deleted",
        w.machine
    );
    let powered_off = machine_seen
        .iter()
        .find(|s| {
            s.object
                .annotations()
                .contains_key(POWERED_OFF_FOR_REMEDIATION_ANNOTATION)
        })
        .unwrap_or_else(|| panic!("{}: powered-off-for-remediation never seen", w.machine));
    assert!(
        powered_off.revision() > deleted.revision(),
        "{}: powered-off-for-remediation only once the Node is gone",
        w.machine
    );
    let timeout_at = machine_seen
        .iter()
        .find(|s| {
            s.object
                .annotations()
                .contains_key(POWER_ON_TIMEOUT_ANNOTATION)
        })
        .unwrap_or_else(|| panic!("{}: power-on-will-timeout-at never seen", w.machine));
    let deadline: Timestamp = timeout_at.object.annotations()[POWER_ON_TIMEOUT_ANNOTATION]
        .parse()
        .unwrap_or_else(|e| panic!("{}: power-on-will-timeout-at is RFC 3339: {e}", w.machine));
    let ahead = deadline.duration_since(timeout_at.at).as_secs();
    assert!(
        (19 * 60..=20 * 60).contains(&ahead),
        "{}: power-on-will-timeout-at is the default 20m ahead, is {ahead} s",
        w.machine
    );
    assert!(
        timeout_at
            .object
            .annotations()
            .contains_key(POWERED_OFF_FOR_REMEDIATION_ANNOTATION),
        "{}: both markers are on the Machine while it powers on",
        w.machine
    );
    assert!(
        timeout_at.revision() < released_revision(w),
        "{}: power-on-will-timeout-at is recorded before the power-off is released",
        w.machine
    );
    let untriggered = index_of(&machine_seen, 0, |s| {
        s.at > marked
            && !s
                .object
                .annotations()
                .contains_key(EXTERNAL_REMEDIATION_ANNOTATION)
    })
    .unwrap_or_else(|| panic!("{}: the trigger was never removed", w.machine));
    let last = &machine_seen[untriggered];
    assert!(
        flow_annotations(last.object.annotations()).is_empty(),
        "{}: the trigger goes with every marker, in one write; first version without it: {:?}",
        w.machine,
        last.object.annotations()
    );
    assert!(
        last.at > recreated.at,
        "{}: the trigger is removed only once the Node is back",
        w.machine
    );
    assert!(
        last.object
            .annotations()
            .contains_key(hostcycle_testkit::machines::MACHINE_HOST_ANNOTATION),
        "{}: the host reference stays",
        w.machine
    );
}

/// The revision of the host version in which the power-off annotation was gone again.
fn released_revision(w: &Watched) -> u64 {
    let seen = w.host_rec.seen();
    let added = index_of(&seen, 0, |s| machine_power_off_requested(&s.object)).unwrap();
    let removed = index_of(&seen, added, |s| !machine_power_off_requested(&s.object)).unwrap();
    seen[removed].revision()
}

/// 1 and 2. The seed's flow for an OpenShift Machine and a Cluster API Machine at once
/// (`--max-concurrent-remediations 2`): power-off (hard), the Node deleted only once the host
/// is off — proven by watches on the host and the Node (times and etcd revisions) and a fast
/// probe of the emulator — the Machine markers, the power-on, the Node back with its labels
/// and annotations, the trigger and markers removed; one power cycle per host; Events on the
/// Machine, the host and the Node; metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn annotation_flow_fences_before_releasing_for_both_machine_kinds() {
    let lab = RemediationLab::start(
        &[worker("r-0"), worker("r-1")],
        &["--max-concurrent-remediations", "2"],
    )
    .await;
    lab.namespace("openshift-machine-api", &[]).await;
    lab.namespace("cluster-a", &[]).await;
    let ocp = lab
        .create_machine(
            MachineKind::OpenShift,
            "openshift-machine-api",
            "ocp-worker-r0",
            "r-0",
            "r-0",
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
        )
        .await;
    let capi = lab
        .create_machine(
            MachineKind::ClusterApi,
            "cluster-a",
            "cluster-a-md-0-r1",
            "r-1",
            "r-1",
            &[(CLUSTER_NAME_LABEL, "cluster-a")],
        )
        .await;

    let mut watched = Vec::new();
    for (machine, host) in [(ocp, "r-0"), (capi, "r-1")] {
        let old_uid = prepare_node(&lab, host).await;
        watched.push(Watched {
            host_rec: lab.watch_host(host).await,
            node_rec: lab.watch_node(host).await,
            machine_rec: lab.watch_machine(&machine).await,
            probe: lab.probe_power(host, Duration::from_millis(10)),
            machine,
            host,
            old_uid,
        });
    }
    let marked = Timestamp::now();
    for w in &watched {
        lab.mark(&w.machine).await;
    }
    let (n0, n1) = tokio::join!(
        follow(&lab, &watched[0], marked),
        follow(&lab, &watched[1], marked)
    );
    println!(
        "both remediations done {} ms after the marks",
        millis(marked, Timestamp::now())
    );

    for (w, node) in watched.iter().zip([n0, n1]) {
        assert_flow_order(w, marked);
        assert_node_restored(&node, w.host);
        assert_one_power_cycle(&lab, w.host).await;
        let host = lab.lab.get(w.host).await;
        assert!(
            !machine_power_off_requested(&host) && powered_on(&host) == Some(true),
            "{}: on, no power-off request left",
            w.host
        );
        for (kind, name) in [
            ("Machine", w.machine.name.as_str()),
            ("BareMetalHost", w.host),
            ("Node", w.host),
        ] {
            let events = lab.wait_event_reasons(kind, name, &FLOW_REASONS).await;
            assert!(
                events.iter().all(|(t, _, _)| t == "Normal"),
                "{kind} {name}: no Warning in a clean remediation: {events:#?}"
            );
        }
    }

    // Both at once: each host's power-off was requested while the other's was still on.
    let (a0, r0) = power_off_window(&watched[0]);
    let (a1, r1) = power_off_window(&watched[1]);
    assert!(
        a1 < r0 && a0 < r1,
        "the two remediations overlap (max 2): r-0 {a0}..{r0}, r-1 {a1}..{r1}"
    );

    let what = "hostcycle_remediations_total{trigger=annotation,result=succeeded} = 2";
    let counted = hostcycle_testkit::wait_until(what, Duration::from_secs(10), || async {
        let v = lab
            .metric(
                "hostcycle_remediations_total",
                &[("trigger", "annotation"), ("result", "succeeded")],
            )
            .await;
        (v == Some(2.0)).then_some(())
    })
    .await;
    if let Err(e) = counted {
        panic!("{e}\n{}", lab.lab.metrics().await);
    }
    for histogram in [
        "hostcycle_remediation_time_to_fence_seconds_count",
        "hostcycle_remediation_time_to_release_seconds_count",
        "hostcycle_remediation_time_to_recover_seconds_count",
    ] {
        assert_eq!(
            lab.metric(histogram, &[]).await,
            Some(2.0),
            "{histogram}\n{}",
            lab.lab.metrics().await
        );
    }
    assert_eq!(
        lab.metric("hostcycle_remediations_in_flight", &[]).await,
        Some(0.0)
    );
}

/// A request's status in a few words, for messages.
fn summary(r: &HostRemediation) -> String {
    let s = r.status.clone().unwrap_or_default();
    format!(
        "phase {:?} step {:?} processing {} succeeded {} permanentNodeDeletionExpected {} ({})",
        s.phase(),
        s.step,
        condition_status(r, "Processing"),
        condition_status(r, "Succeeded"),
        condition_status(r, "PermanentNodeDeletionExpected"),
        s.message
    )
}

/// The end state every successful request shares, whoever created it: Succeeded, conditions
/// Succeeded=True, Processing=False, PermanentNodeDeletionExpected=False, the backups gone from
/// the status (restored), the finalizer kept (the checker deletes the request), not deleted.
fn assert_request_succeeded(r: &HostRemediation, host: &str) {
    let name = r.name_any();
    let status = r.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase(),
        RemediationPhase::Succeeded,
        "{name}: {}",
        summary(r)
    );
    assert_eq!(status.step, RemediationStep::Done, "{name}");
    assert_eq!(
        condition_status(r, "Succeeded"),
        "True",
        "{name}: {}",
        summary(r)
    );
    assert_eq!(
        condition_status(r, "Processing"),
        "False",
        "{name}: {}",
        summary(r)
    );
    assert_eq!(
        condition_status(r, "PermanentNodeDeletionExpected"),
        "False",
        "{name}: the Node is back"
    );
    assert_eq!(status.node.as_deref(), Some(host), "{name}: status.node");
    assert_eq!(
        status.host.as_deref(),
        Some(format!("{}/{host}", common::NS).as_str()),
        "{name}: status.host"
    );
    assert_eq!(status.retry_count, 0, "{name}: no retry");
    assert!(
        status.node_labels_backup.is_none() && status.node_annotations_backup.is_none(),
        "{name}: the backups are restored and dropped: {status:?}"
    );
    assert!(
        r.finalizers()
            .iter()
            .any(|f| f == HOST_REMEDIATION_FINALIZER),
        "{name}: the finalizer stays until the checker deletes the request"
    );
    assert!(
        r.metadata.deletion_timestamp.is_none(),
        "{name}: not deleted"
    );
}

/// 3(a). Cluster API's MachineHealthCheck: the request named after the Machine, in its
/// namespace, owned by it (no controller), spec copied from the template.
async fn machine_health_check_flow(lab: &RemediationLab, machine: &MachineRef, host: &str) {
    let old_uid = prepare_node(lab, host).await;
    let node_rec = lab.watch_node(host).await;
    let request_rec = lab.watch_request(&machine.namespace, &machine.name).await;
    let request = lab
        .create_mhc_request(&machine.namespace, "hostcycle-reboot", machine, "cluster-b")
        .await;
    let owner = &request.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (None, None),
        "as Cluster API creates it"
    );
    let strategy = request.spec.strategy.clone().unwrap();
    assert_eq!(
        (
            strategy.type_.as_deref(),
            strategy.retry_limit,
            strategy.timeout_seconds
        ),
        (Some("Reboot"), Some(1), Some(120)),
        "the spec is the template's"
    );
    let key = request_power_off_annotation(&request.uid().unwrap());
    let ns = machine.namespace.as_str();
    let name = machine.name.as_str();
    lab.wait_request(ns, name, "the finalizer", CYCLE_TIMEOUT, |r| {
        r.finalizers()
            .iter()
            .any(|f| f == HOST_REMEDIATION_FINALIZER)
    })
    .await;
    let key_for_host = key.clone();
    lab.lab
        .wait_host(
            host,
            "the request's power-off annotation",
            CYCLE_TIMEOUT,
            |h| {
                h.annotations().get(&key_for_host).map(String::as_str) == Some(r#"{"mode":"hard"}"#)
            },
        )
        .await;
    let node = lab.wait_node_back(host, &old_uid, CYCLE_TIMEOUT).await;
    let done = lab
        .wait_request(ns, name, "phase Succeeded", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Succeeded)
        })
        .await;
    // Read after Succeeded: the Node seen at its registration may predate the restore.
    let node_now = lab.node(host).await;
    assert_eq!(node.uid(), node_now.uid());
    assert_node_restored(&node_now, host);
    assert_request_succeeded(&done, host);
    assert_eq!(node_rec.deletions().len(), 1, "{host}: Node deleted once");
    assert!(
        request_rec
            .seen()
            .iter()
            .filter_map(|s| s.object.status.clone())
            .any(|s| s
                .node_labels_backup
                .as_ref()
                .and_then(|l| l.get(TEAM_LABEL.0))
                .is_some()),
        "{name}: the Node's labels were backed up in the request's status"
    );
    assert_one_power_cycle(lab, host).await;
    assert!(
        !lab.lab.get(host).await.annotations().contains_key(&key),
        "{host}: the request's power-off is released"
    );
    for (kind, object) in [
        ("HostRemediation", name),
        ("BareMetalHost", host),
        ("Node", host),
    ] {
        lab.wait_event_reasons(kind, object, &FLOW_REASONS).await;
    }
    assert!(
        flow_annotations(&lab.machine_annotations(machine).await).is_empty(),
        "{machine}: a request keeps its record in its status, not on the Machine"
    );
    // Still there after all of the above: only the checker deletes it.
    let still = lab.requests(ns).get(name).await.unwrap();
    assert_request_succeeded(&still, host);

    // Healthy again: the MachineHealthCheck deletes the request; the finalizer goes with it.
    lab.delete_request(ns, name).await;
    lab.wait_request_gone(ns, name, Duration::from_secs(30))
        .await;
    assert!(
        request_rec.first(|s| s.deleted).is_some(),
        "{name}: deleted for good"
    );
    assert_eq!(
        node_rec.deletions().len(),
        1,
        "{host}: its deletion touched no Node"
    );
    assert_one_power_cycle(lab, host).await;
}

/// 3(b). medik8s' NodeHealthCheck: the request named after the Node in the template's
/// namespace, no Machine; the host found through the node → host mapping. The host is held
/// off (by the test) after the power-off so the conditions can be read while the Node is gone.
async fn node_health_check_flow(lab: &RemediationLab, template_ns: &str, host: &'static str) {
    let old_uid = prepare_node(lab, host).await;
    let node_rec = lab.watch_node(host).await;
    let request_rec = lab.watch_request(template_ns, host).await;
    let hold = lab
        .hold_when(host, |h| {
            h.annotations()
                .keys()
                .any(|k| k.starts_with(hostcycle_api::remediation::REQUEST_POWER_OFF_PREFIX))
        })
        .await;
    let request = lab
        .create_nhc_request(template_ns, "hostcycle-reboot", host)
        .await;
    assert!(
        request.metadata.owner_references.is_none(),
        "no Machine owner"
    );
    let key = request_power_off_annotation(&request.uid().unwrap());
    tokio::time::timeout(CYCLE_TIMEOUT, hold)
        .await
        .expect("the request's power-off reaches the host")
        .unwrap();

    // Running: Processing=True, Succeeded=Unknown.
    let running = request_rec
        .wait("Running with Processing=True", CYCLE_TIMEOUT, |s| {
            s.object.status.as_ref().map(|st| st.phase()) == Some(RemediationPhase::Running)
        })
        .await;
    assert_eq!(
        condition_status(&running.object, "Processing"),
        "True",
        "{}",
        summary(&running.object)
    );
    assert_eq!(
        condition_status(&running.object, "Succeeded"),
        "Unknown",
        "{}",
        summary(&running.object)
    );
    let status = running.object.status.clone().unwrap();
    assert_eq!(
        (status.node.as_deref(), status.host.as_deref()),
        (Some(host), Some(format!("{}/{host}", common::NS).as_str())),
        "the host is found through the Node's name"
    );

    // The Node is deleted; the power-on is requested but the host is held off: Waiting, the
    // Node gone, PermanentNodeDeletionExpected=True (so NodeHealthCheck keeps the request).
    node_rec
        .wait("the Node deleted", CYCLE_TIMEOUT, |s| s.deleted)
        .await;
    let waiting = lab
        .wait_request(
            template_ns,
            host,
            "Waiting with PermanentNodeDeletionExpected=True",
            CYCLE_TIMEOUT,
            |r| {
                r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Waiting)
                    && condition_status(r, "PermanentNodeDeletionExpected") == "True"
            },
        )
        .await;
    assert_eq!(
        condition_status(&waiting, "Processing"),
        "True",
        "{}",
        summary(&waiting)
    );
    assert_eq!(
        condition_status(&waiting, "Succeeded"),
        "Unknown",
        "{}",
        summary(&waiting)
    );
    assert_eq!(
        waiting.status.as_ref().unwrap().step,
        RemediationStep::PowerOnRequested
    );
    assert!(
        lab.nodes.get_opt(host).await.unwrap().is_none(),
        "{host}: the Node is gone while PermanentNodeDeletionExpected=True"
    );
    let held = lab.lab.get(host).await;
    assert!(
        !held.annotations().contains_key(&key) && powered_on(&held) == Some(false),
        "{host}: power-on requested (the request's annotation is gone) while the test holds it off"
    );
    lab.lab.unannotate(host, HOLD_ANNOTATION).await;

    let node = lab.wait_node_back(host, &old_uid, CYCLE_TIMEOUT).await;
    let done = lab
        .wait_request(template_ns, host, "phase Succeeded", CYCLE_TIMEOUT, |r| {
            r.status.as_ref().map(|s| s.phase()) == Some(RemediationPhase::Succeeded)
        })
        .await;
    // Read after Succeeded: the Node seen at its registration may predate the restore.
    let node_now = lab.node(host).await;
    assert_eq!(node.uid(), node_now.uid());
    assert_node_restored(&node_now, host);
    assert_request_succeeded(&done, host);
    for s in request_rec.seen().iter().filter(|s| !s.deleted) {
        let phase = s.object.status.as_ref().map(|st| st.phase());
        if matches!(
            phase,
            Some(RemediationPhase::Running | RemediationPhase::Waiting)
        ) {
            assert_eq!(
                condition_status(&s.object, "Processing"),
                "True",
                "Processing=True whenever running: {}",
                summary(&s.object)
            );
        }
        assert_ne!(
            condition_status(&s.object, "Succeeded"),
            "False",
            "never Succeeded=False: {}",
            summary(&s.object)
        );
    }
    assert_eq!(node_rec.deletions().len(), 1, "{host}: Node deleted once");
    assert_one_power_cycle(lab, host).await;
    for (kind, object) in [
        ("HostRemediation", host),
        ("BareMetalHost", host),
        ("Node", host),
    ] {
        lab.wait_event_reasons(kind, object, &FLOW_REASONS).await;
    }
    let still = lab.requests(template_ns).get(host).await.unwrap();
    assert_request_succeeded(&still, host);

    // Healthy: NodeHealthCheck deletes the request.
    lab.delete_request(template_ns, host).await;
    lab.wait_request_gone(template_ns, host, Duration::from_secs(30))
        .await;
    assert_eq!(
        node_rec.deletions().len(),
        1,
        "{host}: its deletion touched no Node"
    );
}

/// 3. The HostRemediation contract as the checkers drive it: a HostRemediationTemplate
/// (Reboot, retryLimit 1, timeoutSeconds 120) in the Machines' namespace (Cluster API reads it
/// there) and in NodeHealthCheck's namespace; (a) a request as Cluster API's
/// MachineHealthCheck creates it, (b) one as medik8s' NodeHealthCheck creates it, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_remediation_requests_as_machine_and_node_health_checks_create_them() {
    let lab = RemediationLab::start(
        &[worker("b-0"), worker("b-1")],
        &["--max-concurrent-remediations", "2"],
    )
    .await;
    lab.namespace("cluster-b", &[]).await;
    lab.namespace("node-health", &[]).await;
    let strategy = serde_json::json!({
        "strategy": { "type": "Reboot", "retryLimit": 1, "timeoutSeconds": 120 }
    });
    for ns in ["cluster-b", "node-health"] {
        lab.create_template(ns, "hostcycle-reboot", strategy.clone())
            .await;
    }
    let machine = lab
        .create_machine(
            MachineKind::ClusterApi,
            "cluster-b",
            "cluster-b-md-0-b0",
            "b-0",
            "b-0",
            &[(CLUSTER_NAME_LABEL, "cluster-b")],
        )
        .await;
    let started = Timestamp::now();
    tokio::join!(
        machine_health_check_flow(&lab, &machine, "b-0"),
        node_health_check_flow(&lab, "node-health", "b-1"),
    );
    println!(
        "both requests done {} ms after the start",
        millis(started, Timestamp::now())
    );
    assert_eq!(
        lab.metric(
            "hostcycle_remediations_total",
            &[("trigger", "request"), ("result", "succeeded")]
        )
        .await,
        Some(2.0),
        "{}",
        lab.lab.metrics().await
    );
}

/// The host ends On and OK, was never left off, and its Node was never deleted.
async fn assert_released_untouched(lab: &RemediationLab, host: &str, node_rec: &Recorder<Node>) {
    let h = lab
        .lab
        .wait_host(host, "on, no reboot annotation", CYCLE_TIMEOUT, |h| {
            powered_on(h) == Some(true) && !common::has_reboot_annotation(h)
        })
        .await;
    assert!(!common::has_reboot_annotation(&h));
    let history = lab.lab.settled_history(host).await;
    assert_eq!(
        history.0.last().map(|(_, s)| s.as_str()),
        Some("On"),
        "{host}: never left off: {history:?}"
    );
    assert_eq!(
        history.power_offs(),
        history.power_ons(),
        "{host}: every power-off was followed by a power-on: {history:?}"
    );
    assert!(
        node_rec.deletions().is_empty() && node_rec.uids().len() == 1,
        "{host}: the Node was never deleted: {:?}",
        node_rec.uids()
    );
}

/// 4(a). The trigger removed after the power-off was requested, before the host is off (its
/// BMC rejects the host controller meanwhile, so it cannot be off): cancelled.
async fn withdrawn_before_power_off(lab: &RemediationLab, machine: &MachineRef, host: &str) {
    let node_rec = lab.watch_node(host).await;
    lab.block_bmc(host).await;
    lab.mark(machine).await;
    lab.lab
        .wait_host(
            host,
            "the power-off requested",
            CYCLE_TIMEOUT,
            machine_power_off_requested,
        )
        .await;
    let at_withdrawal = lab.unmark(machine).await;
    println!(
        "{host}: trigger removed with the power-off requested; the Machine then had {:?}",
        flow_annotations(at_withdrawal.annotations())
    );
    lab.lab
        .wait_host(host, "the power-off request removed", CYCLE_TIMEOUT, |h| {
            !machine_power_off_requested(h)
        })
        .await;
    lab.wait_machine_clean(machine, CYCLE_TIMEOUT).await;
    let events = lab
        .wait_event_reasons(
            "Machine",
            &machine.name,
            &[reason::STARTED, reason::CANCELLED],
        )
        .await;
    assert!(
        !events
            .iter()
            .any(|(_, r, _)| r == reason::NODE_DELETED || r == reason::POWERED_OFF),
        "{machine}: cancelled before anything else: {events:#?}"
    );
    lab.unblock_bmc(host).await;
    assert_released_untouched(lab, host, &node_rec).await;
    assert!(
        flow_annotations(&lab.machine_annotations(machine).await).is_empty(),
        "{machine}: no marker left"
    );
}

/// 4(b). The trigger removed right after the Node was deleted: the flow finishes.
async fn withdrawn_after_node_deletion(lab: &RemediationLab, machine: &MachineRef, host: &str) {
    let old_uid = prepare_node(lab, host).await;
    let node_rec = lab.watch_node(host).await;
    // The trigger goes the moment the Node's deletion arrives (a watch, not a poll).
    let machines = lab.machines(machine.kind, &machine.namespace);
    let name = machine.name.clone();
    let withdraw = on_first(
        lab.nodes.clone(),
        host,
        |s| s.deleted,
        move |deleted| async move {
            let patch = serde_json::json!({ "metadata": { "annotations": {
                EXTERNAL_REMEDIATION_ANNOTATION: null,
            }}});
            let m = machines
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            (deleted, Timestamp::now(), m)
        },
    )
    .await;
    lab.mark(machine).await;
    let (deleted, withdrawn, at_withdrawal) = tokio::time::timeout(CYCLE_TIMEOUT, withdraw)
        .await
        .expect("the Node is deleted")
        .unwrap();
    println!(
        "{host}: trigger removed {} ms after the Node's deletion arrived; the Machine then had {:?}",
        millis(deleted.at, withdrawn),
        flow_annotations(at_withdrawal.annotations())
            .keys()
            .collect::<Vec<_>>()
    );
    let node = lab.wait_node_back(host, &old_uid, CYCLE_TIMEOUT).await;
    lab.wait_machine_clean(machine, CYCLE_TIMEOUT).await;
    let node_now = lab
        .wait_node(host, "labels restored", CYCLE_TIMEOUT, |n| {
            n.labels().contains_key(TEAM_LABEL.0)
        })
        .await;
    assert_eq!(node.uid(), node_now.uid());
    assert_node_restored(&node_now, host);
    assert_one_power_cycle(lab, host).await;
    assert_eq!(node_rec.deletions().len(), 1, "{host}: Node deleted once");
    let events = lab
        .wait_event_reasons(
            "Machine",
            &machine.name,
            &[reason::POWER_ON_REQUESTED, reason::SUCCEEDED],
        )
        .await;
    assert!(
        !events.iter().any(|(_, r, _)| r == reason::CANCELLED),
        "{machine}: not cancelled once the Node was deleted: {events:#?}"
    );
    let h = lab.lab.get(host).await;
    assert!(!machine_power_off_requested(&h) && powered_on(&h) == Some(true));
}

/// 4(a), at a watch's speed and with a working BMC: the trigger goes the moment the power-off
/// request arrives on the host. The host may or may not power off (the fake driver may already
/// have the power-off pending); either way it ends On, its Node is never deleted, and the
/// Machine is left without a marker.
async fn withdrawn_as_soon_as_requested(lab: &RemediationLab, machine: &MachineRef, host: &str) {
    let node_rec = lab.watch_node(host).await;
    let machines = lab.machines(machine.kind, &machine.namespace);
    let name = machine.name.clone();
    let withdraw = on_first(
        lab.lab.hosts.clone(),
        host,
        |s| !s.deleted && machine_power_off_requested(&s.object),
        move |requested| async move {
            let patch = serde_json::json!({ "metadata": { "annotations": {
                EXTERNAL_REMEDIATION_ANNOTATION: null,
            }}});
            machines
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            (requested, Timestamp::now())
        },
    )
    .await;
    lab.mark(machine).await;
    let (requested, withdrawn) = tokio::time::timeout(CYCLE_TIMEOUT, withdraw)
        .await
        .expect("the power-off request reaches the host")
        .unwrap();
    let released = lab
        .lab
        .wait_host(host, "the power-off request removed", CYCLE_TIMEOUT, |h| {
            !machine_power_off_requested(h)
        })
        .await;
    lab.wait_machine_clean(machine, CYCLE_TIMEOUT).await;
    let events = lab
        .wait_event_reasons(
            "Machine",
            &machine.name,
            &[reason::STARTED, reason::CANCELLED],
        )
        .await;
    assert!(
        !events.iter().any(|(_, r, _)| r == reason::NODE_DELETED),
        "{machine}: cancelled before the Node's deletion: {events:#?}"
    );
    lab.wait_power_settled(host, Timestamp::now(), Duration::from_secs(13))
        .await;
    assert_released_untouched(lab, host, &node_rec).await;
    let history = lab.lab.settled_history(host).await;
    println!(
        "{host}: trigger removed {} ms after the power-off request arrived; power-offs since: {} \
         (host resourceVersion at release {})",
        millis(requested.at, withdrawn),
        history.power_offs(),
        released.resource_version().unwrap_or_default()
    );
}

/// 4(c). A request deleted mid-flow, before the Node's deletion (the host's BMC rejects the
/// host controller, so it cannot be off): released, finalizer removed, gone.
async fn request_deleted_before_node_deletion(
    lab: &RemediationLab,
    machine: &MachineRef,
    host: &str,
) {
    let node_rec = lab.watch_node(host).await;
    lab.block_bmc(host).await;
    let request = lab
        .create_mhc_request(&machine.namespace, "hostcycle-reboot", machine, "cluster-c")
        .await;
    let key = request_power_off_annotation(&request.uid().unwrap());
    let (ns, name) = (machine.namespace.as_str(), machine.name.as_str());
    lab.wait_request(ns, name, "the finalizer", CYCLE_TIMEOUT, |r| {
        r.finalizers()
            .iter()
            .any(|f| f == HOST_REMEDIATION_FINALIZER)
    })
    .await;
    let key_for_host = key.clone();
    lab.lab
        .wait_host(host, "the request's power-off", CYCLE_TIMEOUT, move |h| {
            h.annotations().contains_key(&key_for_host)
        })
        .await;
    let running = lab.requests(ns).get(name).await.unwrap();
    assert_eq!(
        running.status.as_ref().map(|s| s.phase()),
        Some(RemediationPhase::Running),
        "{}",
        summary(&running)
    );
    lab.delete_request(ns, name).await;
    lab.wait_request_gone(ns, name, Duration::from_secs(60))
        .await;
    assert!(
        !lab.lab.get(host).await.annotations().contains_key(&key),
        "{host}: the host is released before the request goes"
    );
    let events = lab
        .wait_event_reasons(
            "HostRemediation",
            name,
            &[reason::STARTED, reason::CANCELLED],
        )
        .await;
    assert!(
        !events.iter().any(|(_, r, _)| r == reason::NODE_DELETED),
        "{name}: {events:#?}"
    );
    lab.unblock_bmc(host).await;
    assert_released_untouched(lab, host, &node_rec).await;
}

/// 4. OpenShift bug 1975296, and its request twin: the trigger removed before the Node's
/// deletion cancels (the host released, never left off, the Node kept, no marker left) — with
/// the host's BMC refusing the host controller meanwhile (c-0), and at a watch's speed with a
/// working BMC (c-2, after its request scenario); after the deletion, the flow finishes
/// (power-on, Node back with its labels, markers removed; c-1); a request deleted before the
/// Node's deletion releases the host and lets go of its finalizer (c-2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trigger_withdrawn_before_and_after_the_node_deletion() {
    let lab = RemediationLab::start(
        &[worker("c-0"), worker("c-1"), worker("c-2")],
        &["--max-concurrent-remediations", "3"],
    )
    .await;
    lab.namespace("openshift-machine-api", &[]).await;
    lab.namespace("cluster-c", &[]).await;
    let role = [(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")];
    let before = lab
        .create_machine(
            MachineKind::OpenShift,
            "openshift-machine-api",
            "ocp-worker-c0",
            "c-0",
            "c-0",
            &role,
        )
        .await;
    let after = lab
        .create_machine(
            MachineKind::OpenShift,
            "openshift-machine-api",
            "ocp-worker-c1",
            "c-1",
            "c-1",
            &role,
        )
        .await;
    let requested = lab
        .create_machine(
            MachineKind::ClusterApi,
            "cluster-c",
            "cluster-c-md-0-c2",
            "c-2",
            "c-2",
            &[(CLUSTER_NAME_LABEL, "cluster-c")],
        )
        .await;
    lab.create_template(
        "cluster-c",
        "hostcycle-reboot",
        serde_json::json!({ "strategy": { "type": "Reboot", "retryLimit": 1, "timeoutSeconds": 120 } }),
    )
    .await;
    let started = Timestamp::now();
    tokio::join!(
        withdrawn_before_power_off(&lab, &before, "c-0"),
        withdrawn_after_node_deletion(&lab, &after, "c-1"),
        async {
            request_deleted_before_node_deletion(&lab, &requested, "c-2").await;
            // The same host, now through the annotation flow of its (Cluster API) Machine.
            withdrawn_as_soon_as_requested(&lab, &requested, "c-2").await;
        },
    );
    println!(
        "all three done {} ms after the start",
        millis(started, Timestamp::now())
    );
    for (trigger, result, count) in [
        ("annotation", "cancelled", 2.0),
        ("annotation", "succeeded", 1.0),
        ("request", "cancelled", 1.0),
    ] {
        assert_eq!(
            lab.metric(
                "hostcycle_remediations_total",
                &[("trigger", trigger), ("result", result)]
            )
            .await,
            Some(count),
            "{trigger}/{result}\n{}",
            lab.lab.metrics().await
        );
    }
}
