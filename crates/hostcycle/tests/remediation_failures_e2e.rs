//! Machine remediation when things go wrong, end to end (real control plane, sushy-tools,
//! simulated kubelets, the real operator binary): the operator SIGKILLed at each step of the
//! annotation flow, a BMC that rejects the host controller for a while, a Node that never
//! comes back (failure and escalation for each kind of Machine), many failures at once
//! (`--max-concurrent-remediations`), and the reboot queue and remediation taking turns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::queue::*;
use common::{LabOptions, NS, SECRET, USER};
use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::EntryPhase;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HostRemediation, HostRemediationTemplate,
    MACHINE_POWER_OFF_ANNOTATION, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, REMEDIATION_FAILED_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION, REQUEST_POWER_OFF_PREFIX, RemediationPhase, RemediationStep,
    request_power_off_annotation,
};
use hostcycle_testkit::bmc_emulators::FakePower;
use hostcycle_testkit::machines::{
    MachineKind, OPENSHIFT_MACHINE_ROLE_LABEL, create_machine, create_machine_object, machine,
};
use hostcycle_testkit::wait_until;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The test's own keyed reboot annotation: the host stays off while it is there.
const HOLD: &str = "reboot.metal3.io/e2e-hold";
/// A Secret with the right user and a wrong password: the host controller's BMC calls fail.
const WRONG_SECRET: &str = "wrong-credentials";
/// A label and an annotation an administrator put on the Node; they survive its re-creation.
const LABEL_KEY: &str = "e2e.hostcycle.io/pool";
const LABEL_VALUE: &str = "gold";
const NOTE_KEY: &str = "e2e.hostcycle.io/note";
const NOTE_VALUE: &str = "kept-through-remediation";
/// One power cycle through the fake driver (2 × 1–11 s), a boot and the restore, generously.
const FLOW_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the samplers look.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

// ----- Machines ------------------------------------------------------------------------

fn machine_api(lab: &QueueLab, kind: MachineKind) -> Api<DynamicObject> {
    Api::namespaced_with(lab.client.clone(), NS, &kind.api_resource())
}

/// The Machine of a node (one per host; the host and the Node share the name).
fn machine_name(node: &str) -> String {
    format!("machine-{node}")
}

/// A Machine of `kind` naming host `node` (`metal3.io/BareMetalHost`) and Node `node`
/// (`status.nodeRef`).
async fn machine_for(
    lab: &QueueLab,
    kind: MachineKind,
    node: &str,
    labels: &[(&str, &str)],
) -> DynamicObject {
    create_machine(
        &lab.client,
        kind,
        NS,
        &machine_name(node),
        Some((NS, node)),
        Some(node),
        labels,
    )
    .await
    .unwrap()
}

/// Marks the Machine of `node` for remediation, as OpenShift's MachineHealthCheck does.
async fn trigger(lab: &QueueLab, kind: MachineKind, node: &str) {
    let patch = json!({ "metadata": { "annotations": { EXTERNAL_REMEDIATION_ANNOTATION: "" } } });
    machine_api(lab, kind)
        .patch(
            &machine_name(node),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// The trigger and every marker, backup or record of the flow on a Machine.
fn markers(m: &DynamicObject) -> Vec<String> {
    m.annotations()
        .keys()
        .filter(|k| {
            k.as_str() == EXTERNAL_REMEDIATION_ANNOTATION
                || k.starts_with("remediation.metal3.io/")
                || k.starts_with("remediation.hostcycle.io/")
        })
        .cloned()
        .collect()
}

fn has(m: &DynamicObject, key: &str) -> bool {
    m.annotations().contains_key(key)
}

fn json_map(m: &DynamicObject, key: &str) -> BTreeMap<String, String> {
    m.annotations()
        .get(key)
        .map(|v| serde_json::from_str(v).unwrap())
        .unwrap_or_default()
}

fn operator_log(lab: &QueueLab) -> String {
    lab.lab
        .operator
        .as_ref()
        .map(|p| p.log_path().display().to_string())
        .unwrap_or_default()
}

async fn wait_machine(
    lab: &QueueLab,
    kind: MachineKind,
    node: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let api = &machine_api(lab, kind);
    let name = &machine_name(node);
    let pred = &pred;
    let what = format!("{kind} {name}: {what}");
    match wait_until(&what, timeout, || async move {
        api.get_opt(name).await.ok().flatten().filter(|m| pred(m))
    })
    .await
    {
        Ok(m) => m,
        Err(e) => panic!(
            "{e}\nlast seen: {}\nhost: {:?}\npower history: {:?}\noperator log: {}",
            serde_json::to_string_pretty(&api.get_opt(name).await.ok().flatten())
                .unwrap_or_default(),
            lab.lab.hosts.get(node).await.ok().map(|h| h.metadata),
            lab.lab.history(node),
            operator_log(lab)
        ),
    }
}

/// Waits until the annotation flow of `node`'s Machine is over: trigger and markers gone.
async fn wait_flow_done(lab: &QueueLab, kind: MachineKind, node: &str) -> DynamicObject {
    wait_machine(
        lab,
        kind,
        node,
        "flow finished (no trigger, marker or backup left)",
        2 * FLOW_TIMEOUT,
        |m| markers(m).is_empty(),
    )
    .await
}

// ----- requests ------------------------------------------------------------------------

fn request_api(lab: &QueueLab) -> Api<HostRemediation> {
    Api::namespaced(lab.client.clone(), NS)
}

async fn create_template(
    lab: &QueueLab,
    name: &str,
    retry_limit: u32,
    timeout_seconds: u64,
) -> HostRemediationTemplate {
    let t: HostRemediationTemplate = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediationTemplate",
        "metadata": { "name": name, "namespace": NS },
        "spec": { "template": { "spec": { "strategy": {
            "type": "Reboot", "retryLimit": retry_limit, "timeoutSeconds": timeout_seconds,
        } } } },
    }))
    .unwrap();
    Api::<HostRemediationTemplate>::namespaced(lab.client.clone(), NS)
        .create(&PostParams::default(), &t)
        .await
        .unwrap()
}

/// A request as Cluster API's MachineHealthCheck (and OpenShift's template flow) creates it:
/// named after the Machine, in its namespace, owned by it (no controller flag), its spec the
/// template's `spec.template.spec`.
async fn request_for_machine(
    lab: &QueueLab,
    template: &HostRemediationTemplate,
    kind: MachineKind,
    m: &DynamicObject,
) -> HostRemediation {
    let r: HostRemediation = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediation",
        "metadata": {
            "name": m.name_any(),
            "namespace": NS,
            "ownerReferences": [{
                "apiVersion": kind.api_version(),
                "kind": "Machine",
                "name": m.name_any(),
                "uid": m.uid().unwrap(),
            }],
            "annotations": {
                "cluster.x-k8s.io/cloned-from-name": template.name_any(),
                "cluster.x-k8s.io/cloned-from-groupkind": "HostRemediationTemplate.hostcycle.io",
            },
        },
        "spec": serde_json::to_value(&template.spec.template.spec).unwrap(),
    }))
    .unwrap();
    request_api(lab)
        .create(&PostParams::default(), &r)
        .await
        .unwrap()
}

/// A request as medik8s' NodeHealthCheck creates it: named after the Node, in the template's
/// namespace, with `remediation.medik8s.io/node-name`.
async fn request_for_node(
    lab: &QueueLab,
    template: &HostRemediationTemplate,
    node: &str,
) -> HostRemediation {
    let r: HostRemediation = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "HostRemediation",
        "metadata": {
            "name": node,
            "namespace": NS,
            "labels": { "app.kubernetes.io/part-of": "node-healthcheck-controller" },
            "annotations": {
                "remediation.medik8s.io/node-name": node,
                "remediation.medik8s.io/template-name": template.name_any(),
            },
        },
        "spec": serde_json::to_value(&template.spec.template.spec).unwrap(),
    }))
    .unwrap();
    request_api(lab)
        .create(&PostParams::default(), &r)
        .await
        .unwrap()
}

fn step(r: &HostRemediation) -> RemediationStep {
    r.status.as_ref().map(|s| s.step).unwrap_or_default()
}

fn phase(r: &HostRemediation) -> Option<RemediationPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

fn message(r: &HostRemediation) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

/// (status, reason) of a condition of the request.
fn condition(r: &HostRemediation, type_: &str) -> Option<(String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn in_flight(step: RemediationStep) -> bool {
    matches!(
        step,
        RemediationStep::PowerOffRequested
            | RemediationStep::NodeReleased
            | RemediationStep::PowerOnRequested
    )
}

async fn wait_request(
    lab: &QueueLab,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&HostRemediation) -> bool,
) -> HostRemediation {
    let api = &request_api(lab);
    let pred = &pred;
    let what = format!("HostRemediation {name}: {what}");
    match wait_until(&what, timeout, || async move {
        api.get_opt(name).await.ok().flatten().filter(|r| pred(r))
    })
    .await
    {
        Ok(r) => r,
        Err(e) => panic!(
            "{e}\nlast seen: {}\noperator log: {}",
            serde_json::to_string_pretty(&api.get_opt(name).await.ok().flatten())
                .unwrap_or_default(),
            operator_log(lab)
        ),
    }
}

async fn wait_request_succeeded(lab: &QueueLab, name: &str) -> HostRemediation {
    let r = wait_request(lab, name, "phase Succeeded", 2 * FLOW_TIMEOUT, |r| {
        phase(r) == Some(RemediationPhase::Succeeded)
    })
    .await;
    assert_eq!(step(&r), RemediationStep::Done);
    assert_eq!(
        condition(&r, "Succeeded").map(|c| c.0).as_deref(),
        Some("True"),
        "{:?}",
        r.status
    );
    let status = r.status.as_ref().unwrap();
    assert!(
        status.node_labels_backup.is_none() && status.node_annotations_backup.is_none(),
        "the backups go once restored: {status:?}"
    );
    r
}

// ----- hosts ---------------------------------------------------------------------------

async fn create_wrong_secret(lab: &QueueLab) {
    let wrong: Secret = serde_json::from_value(json!({
        "metadata": { "name": WRONG_SECRET },
        "stringData": { "username": USER, "password": "not-the-password" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(lab.client.clone(), NS)
        .create(&PostParams::default(), &wrong)
        .await
        .unwrap();
}

async fn set_credentials(lab: &QueueLab, host: &str, secret: &str) {
    lab.lab
        .patch_spec(host, json!({ "bmc": { "credentialsName": secret } }))
        .await;
}

fn host_error(h: &BareMetalHost) -> bool {
    h.status
        .as_ref()
        .and_then(|s| s.operational_status)
        .map(|s| s.as_str())
        == Some("error")
}

/// Points the host at the wrong credentials and waits until the host controller fails.
async fn break_bmc(lab: &QueueLab, host: &str) -> BareMetalHost {
    set_credentials(lab, host, WRONG_SECRET).await;
    lab.lab
        .wait_host(host, "BMC credentials rejected", FLOW_TIMEOUT, host_error)
        .await
}

async fn fix_bmc(lab: &QueueLab, host: &str) {
    set_credentials(lab, host, SECRET).await;
}

async fn hold(lab: &QueueLab, host: &str) {
    lab.lab.annotate(host, HOLD, "").await;
}

async fn release_hold(lab: &QueueLab, host: &str) {
    lab.lab.unannotate(host, HOLD).await;
}

/// Off by the host's status, and no power action of the host controller in flight.
fn off_and_idle(h: &BareMetalHost) -> bool {
    let st = h.status.as_ref();
    st.and_then(|s| s.powered_on) == Some(false)
        && st
            .and_then(|s| s.last_power_action.as_ref())
            .is_some_and(|a| !a.is_requested())
}

/// Every `reboot.metal3.io` annotation on the host.
fn reboot_keys(h: &BareMetalHost) -> BTreeSet<String> {
    h.annotations()
        .keys()
        .filter(|k| k.as_str() == "reboot.metal3.io" || k.starts_with("reboot.metal3.io/"))
        .cloned()
        .collect()
}

/// The power-off annotations of remediations (either flow) on the host.
fn remediation_keys(h: &BareMetalHost) -> Vec<String> {
    h.annotations()
        .keys()
        .filter(|k| {
            k.as_str() == MACHINE_POWER_OFF_ANNOTATION || k.starts_with(REQUEST_POWER_OFF_PREFIX)
        })
        .cloned()
        .collect()
}

/// The host is on again, nothing holds or reboots it, and the emulator agrees.
async fn wait_host_back_on(lab: &QueueLab, host: &str) {
    lab.lab.wait_emulator_power(host, FakePower::On).await;
    lab.lab
        .wait_host(
            host,
            "on, with no reboot annotation left",
            FLOW_TIMEOUT,
            |h| {
                h.status.as_ref().and_then(|s| s.powered_on) == Some(true)
                    && reboot_keys(h).is_empty()
            },
        )
        .await;
}

// ----- Nodes ---------------------------------------------------------------------------

/// Puts the test's label and annotation on the Node; returns its UID.
async fn mark_node(lab: &QueueLab, node: &str) -> String {
    let patch = json!({ "metadata": {
        "labels": { LABEL_KEY: LABEL_VALUE },
        "annotations": { NOTE_KEY: NOTE_VALUE },
    }});
    lab.nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
        .uid()
        .unwrap()
}

fn node_ready(n: &Node) -> bool {
    hostcycle_sim::node_ready(n) == Some(true)
}

fn node_restored(n: &Node) -> bool {
    n.labels().get(LABEL_KEY).map(String::as_str) == Some(LABEL_VALUE)
        && n.annotations().get(NOTE_KEY).map(String::as_str) == Some(NOTE_VALUE)
}

/// Waits until the Node was re-created (a new UID), is Ready and has its label and
/// annotation back.
async fn wait_node_restored(lab: &QueueLab, node: &str, old_uid: &str) -> Node {
    let nodes = &lab.nodes;
    let what = format!("Node {node}: re-registered, Ready, its label and annotation restored");
    match wait_until(&what, 2 * FLOW_TIMEOUT, || async move {
        nodes
            .get_opt(node)
            .await
            .ok()
            .flatten()
            .filter(|n| n.uid().as_deref() != Some(old_uid) && node_ready(n) && node_restored(n))
    })
    .await
    {
        Ok(n) => n,
        Err(e) => panic!(
            "{e}\nnode now: {:?}\npower history: {:?}\noperator log: {}",
            nodes.get_opt(node).await.ok().flatten().map(|n| n.metadata),
            lab.lab.history(node),
            operator_log(lab)
        ),
    }
}

/// After a remediation: the Node is back (re-created, Ready, label and annotation restored),
/// the host on with no annotation left, and exactly `cycles` power cycles seen.
async fn assert_recovered(lab: &QueueLab, node: &str, old_uid: &str, cycles: usize) {
    wait_node_restored(lab, node, old_uid).await;
    wait_host_back_on(lab, node).await;
    assert_eq!(
        lab.power_cycles(node).await,
        cycles,
        "{node}: power history {:?}",
        lab.lab.history(node)
    );
}

// ----- Events, metrics, logs -----------------------------------------------------------

#[derive(Debug)]
struct Seen {
    type_: String,
    reason: String,
    note: String,
    count: i32,
}

/// The Events about the object of `kind` named `name` (any namespace), oldest first.
async fn events_of(lab: &QueueLab, kind: &str, name: &str) -> Vec<Seen> {
    let mut events: Vec<Event> = Api::<Event>::all(lab.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .collect();
    events.sort_by_key(|e| {
        e.event_time
            .clone()
            .map(|t| t.0)
            .or(e.metadata.creation_timestamp.clone().map(|t| t.0))
    });
    events
        .into_iter()
        .map(|e| Seen {
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            note: e.note.unwrap_or_default(),
            count: e.series.map(|s| s.count).unwrap_or(1),
        })
        .collect()
}

/// The Events about the object once one with each of `reasons` is there (Events go out from
/// a background task after the step they describe).
async fn events_with(lab: &QueueLab, kind: &str, name: &str, reasons: &[&str]) -> Vec<Seen> {
    let what = format!("Events {reasons:?} about {kind} {name}");
    let found = wait_until(&what, Duration::from_secs(30), || async {
        let events = events_of(lab, kind, name).await;
        reasons
            .iter()
            .all(|want| events.iter().any(|e| e.reason == *want))
            .then_some(events)
    })
    .await;
    match found {
        Ok(events) => events,
        Err(e) => panic!("{e}\nEvents now: {:?}", events_of(lab, kind, name).await),
    }
}

/// The Events about the object once one with `reason` says `needle` (a step may publish two
/// Events with one reason, in order, from a background task).
async fn events_noting(
    lab: &QueueLab,
    kind: &str,
    name: &str,
    reason: &str,
    needle: &str,
) -> Vec<Seen> {
    let what = format!("a {reason} Event about {kind} {name} saying {needle:?}");
    let found = wait_until(&what, Duration::from_secs(30), || async {
        let events = events_of(lab, kind, name).await;
        events
            .iter()
            .any(|e| e.reason == reason && e.note.contains(needle))
            .then_some(events)
    })
    .await;
    match found {
        Ok(events) => events,
        Err(e) => panic!("{e}\nEvents now: {:?}", events_of(lab, kind, name).await),
    }
}

/// How many times an Event with `reason` was published about the object (series counted).
fn times(events: &[Seen], reason: &str) -> i32 {
    events
        .iter()
        .filter(|e| e.reason == reason)
        .map(|e| e.count)
        .sum()
}

fn warning(events: &[Seen], reason: &str) -> bool {
    events
        .iter()
        .any(|e| e.reason == reason && e.type_ == "Warning")
}

/// The value of a metric sample with these labels (0 when absent).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once('}'))
        .find(|(ls, _)| {
            labels
                .iter()
                .all(|(k, v)| ls.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, value)| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Kills the operator (SIGKILL) and starts a new one; returns once the new one's remediation
/// controller has synced its caches (its first pass follows at once).
async fn kill_and_restart(lab: &mut QueueLab) {
    lab.lab.kill_operator();
    lab.lab.start_operator();
    let path = lab.lab.operator.as_ref().unwrap().log_path().to_path_buf();
    let what = format!(
        "the restarted operator's remediation controller to sync ({})",
        path.display()
    );
    wait_until(&what, Duration::from_secs(60), || {
        let path = path.clone();
        async move {
            std::fs::read_to_string(&path)
                .ok()
                .filter(|t| t.contains("remediation caches synced"))
                .map(|_| ())
        }
    })
    .await
    .unwrap();
}

// ----- samplers ------------------------------------------------------------------------

/// Samples something every [`SAMPLE_EVERY`] in the background until finished.
struct Sampler<T> {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Sampler<T> {
    fn start<F, Fut>(mut sample: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<T>> + Send,
    {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                if let Some(s) = sample().await {
                    out.push(s);
                }
                tokio::select! {
                    _ = token.cancelled() => return out,
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
            }
        });
        Sampler { stop, task }
    }

    async fn finish(self) -> Vec<T> {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// Fencing before release: samples whether the original Node still exists, then the
/// emulator's power. The remediation may delete the Node only once the host is off, so a
/// sample with the Node gone must come after (or with) a sample with the host off.
fn watch_fencing(lab: &QueueLab, node: &str, uid: &str) -> Sampler<(bool, String)> {
    let nodes = lab.nodes.clone();
    let redfish = lab.lab.redfish.clone();
    let index = lab.lab.index(node);
    let (node, uid) = (node.to_string(), uid.to_string());
    Sampler::start(move || {
        let (nodes, redfish, node, uid) =
            (nodes.clone(), redfish.clone(), node.clone(), uid.clone());
        async move {
            let present = match nodes.get_opt(&node).await {
                Ok(n) => n.is_some_and(|n| n.uid().as_deref() == Some(uid.as_str())),
                Err(_) => return None,
            };
            let power = redfish.power_state(index).await.ok()?;
            Some((present, power))
        }
    })
}

fn assert_fenced_before_release(node: &str, samples: &[(bool, String)]) {
    let first_off = samples.iter().position(|(_, p)| p == "Off");
    let first_gone = samples.iter().position(|(present, _)| !present);
    assert!(
        first_gone.is_some(),
        "{node}: the Node was never seen deleted ({} samples)",
        samples.len()
    );
    assert!(
        first_off.is_some_and(|off| off <= first_gone.unwrap()),
        "{node}: the Node was deleted while the host was on: first off at sample {first_off:?}, \
         node gone at sample {first_gone:?}: {samples:?}"
    );
}

/// Counts how often `key` appeared on host `host`, from a watch (so a short presence is not
/// missed).
fn count_appearances(
    lab: &QueueLab,
    host: &str,
    key: String,
) -> (Arc<Mutex<usize>>, CancellationToken) {
    let api: Api<BareMetalHost> = Api::namespaced(lab.client.clone(), NS);
    let config = watcher::Config::default().fields(&format!("metadata.name={host}"));
    let count = Arc::new(Mutex::new(0));
    let stop = CancellationToken::new();
    let (c, s) = (count.clone(), stop.clone());
    tokio::spawn(async move {
        let mut present = false;
        let mut stream = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            tokio::select! {
                _ = s.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(h)) => {
                        let now = h.annotations().contains_key(&key);
                        if now && !present {
                            *c.lock().unwrap() += 1;
                        }
                        present = now;
                    }
                    Some(Err(_)) => {}
                    None => return,
                },
            }
        }
    });
    (count, stop)
}

/// An OpenShift Machine for `node` with `role` that could be reprovisioned: owned by a
/// controller (`owner` stands in for a MachineSet: a real object, so the garbage collector
/// finds it), its host provisioned by metal3 (a consumer, not externally provisioned).
async fn reprovisionable_machine(lab: &QueueLab, owner: &ConfigMap, node: &str, role: &str) {
    let mut m = machine(
        MachineKind::OpenShift,
        NS,
        &machine_name(node),
        Some((NS, node)),
        Some(node),
        &[(OPENSHIFT_MACHINE_ROLE_LABEL, role)],
    );
    m.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    create_machine_object(&lab.client, MachineKind::OpenShift, &m)
        .await
        .unwrap();
    lab.lab
        .patch_spec(
            node,
            json!({
                "externallyProvisioned": false,
                "consumerRef": {
                    "apiVersion": MachineKind::OpenShift.api_version(),
                    "kind": "Machine",
                    "name": machine_name(node),
                    "namespace": NS,
                },
            }),
        )
        .await;
    lab.lab
        .wait_host(node, "provisioned, on", FLOW_TIMEOUT, |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.provisioning.state.as_ref())
                .map(|s| s.as_str())
                == Some("provisioned")
                && st.and_then(|s| s.powered_on) == Some(true)
        })
        .await;
}

// ----- the tests -----------------------------------------------------------------------

/// The annotation flow with the operator SIGKILLed at three points, each at a moment when the
/// host controller has nothing in flight:
/// (a) right after the power-off was requested (started-at recorded, the host annotated) —
///     the host's BMC rejects the host controller until after the restart;
/// (b) after the Node was deleted, before the power-on (the test holds the host off);
/// (c) after the power-on was requested, before the Node is back (the BMC rejects the host
///     controller again until after the restart).
///
/// Each time the restarted operator resumes from the Machine's record: exactly one power
/// cycle, the Node back with the administrator's label and annotation (the backups survive
/// the kill), no marker left, one `RemediationStarted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn annotation_flow_resumes_after_a_sigkill_at_each_step() {
    let hosts = [worker("k-a"), worker("k-b"), worker("k-c")];
    let mut lab = QueueLab::start(&hosts, fast_queue()).await;
    let kind = MachineKind::OpenShift;
    create_wrong_secret(&lab).await;
    for h in &hosts {
        machine_for(
            &lab,
            kind,
            h.name,
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
        )
        .await;
    }

    // (a) Killed right after the power-off request.
    let uid_a = mark_node(&lab, "k-a").await;
    break_bmc(&lab, "k-a").await;
    trigger(&lab, kind, "k-a").await;
    let started = wait_machine(
        &lab,
        kind,
        "k-a",
        "started-at recorded",
        FLOW_TIMEOUT,
        |m| has(m, REMEDIATION_STARTED_ANNOTATION),
    )
    .await;
    let requested = lab
        .lab
        .wait_host("k-a", "the flow's power-off request", FLOW_TIMEOUT, |h| {
            h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)
        })
        .await;
    assert_eq!(
        requested
            .annotations()
            .get(MACHINE_POWER_OFF_ANNOTATION)
            .map(String::as_str),
        Some(r#"{"mode":"hard"}"#)
    );
    kill_and_restart(&mut lab).await;
    let resumed = machine_api(&lab, kind)
        .get(&machine_name("k-a"))
        .await
        .unwrap();
    assert_eq!(
        resumed.annotations().get(REMEDIATION_STARTED_ANNOTATION),
        started.annotations().get(REMEDIATION_STARTED_ANNOTATION),
        "the restarted operator keeps the record"
    );
    assert!(
        !has(&resumed, NODE_LABELS_BACKUP_ANNOTATION),
        "the host is still on: nothing backed up, nothing released"
    );
    assert_eq!(
        lab.node("k-a").await.uid().as_deref(),
        Some(uid_a.as_str()),
        "the Node stays while the host is on"
    );
    fix_bmc(&lab, "k-a").await;
    wait_flow_done(&lab, kind, "k-a").await;
    assert_recovered(&lab, "k-a", &uid_a, 1).await;

    // (b) Killed after the Node was deleted, before the power-on.
    let uid_b = mark_node(&lab, "k-b").await;
    trigger(&lab, kind, "k-b").await;
    lab.lab
        .wait_host("k-b", "the flow's power-off request", FLOW_TIMEOUT, |h| {
            h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)
        })
        .await;
    hold(&lab, "k-b").await;
    let released = wait_machine(
        &lab,
        kind,
        "k-b",
        "powered-off-for-remediation (host off, Node released)",
        FLOW_TIMEOUT,
        |m| has(m, POWERED_OFF_FOR_REMEDIATION_ANNOTATION),
    )
    .await;
    lab.lab
        .wait_host(
            "k-b",
            "off, held, nothing in flight",
            FLOW_TIMEOUT,
            off_and_idle,
        )
        .await;
    assert!(
        lab.nodes.get_opt("k-b").await.unwrap().is_none(),
        "the Node is released"
    );
    let labels_backup = json_map(&released, NODE_LABELS_BACKUP_ANNOTATION);
    let annotations_backup = json_map(&released, NODE_ANNOTATIONS_BACKUP_ANNOTATION);
    assert_eq!(
        labels_backup.get(LABEL_KEY).map(String::as_str),
        Some(LABEL_VALUE),
        "{labels_backup:?}"
    );
    assert_eq!(
        annotations_backup.get(NOTE_KEY).map(String::as_str),
        Some(NOTE_VALUE),
        "{annotations_backup:?}"
    );
    kill_and_restart(&mut lab).await;
    let resumed = wait_machine(
        &lab,
        kind,
        "k-b",
        "power-on requested (the record kept through the kill)",
        FLOW_TIMEOUT,
        |m| has(m, POWER_ON_TIMEOUT_ANNOTATION),
    )
    .await;
    assert!(has(&resumed, POWERED_OFF_FOR_REMEDIATION_ANNOTATION));
    assert_eq!(
        json_map(&resumed, NODE_LABELS_BACKUP_ANNOTATION),
        labels_backup,
        "labels backup intact through the kill"
    );
    assert_eq!(
        json_map(&resumed, NODE_ANNOTATIONS_BACKUP_ANNOTATION),
        annotations_backup,
        "annotations backup intact through the kill"
    );
    release_hold(&lab, "k-b").await;
    wait_flow_done(&lab, kind, "k-b").await;
    assert_recovered(&lab, "k-b", &uid_b, 1).await;

    // (c) Killed after the power-on was requested, before the Node is back.
    let uid_c = mark_node(&lab, "k-c").await;
    trigger(&lab, kind, "k-c").await;
    lab.lab
        .wait_host("k-c", "the flow's power-off request", FLOW_TIMEOUT, |h| {
            h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)
        })
        .await;
    hold(&lab, "k-c").await;
    let waiting = wait_machine(
        &lab,
        kind,
        "k-c",
        "power-on-will-timeout-at",
        FLOW_TIMEOUT,
        |m| has(m, POWER_ON_TIMEOUT_ANNOTATION),
    )
    .await;
    lab.lab
        .wait_host(
            "k-c",
            "off, the flow's power-off released, nothing in flight",
            FLOW_TIMEOUT,
            |h| off_and_idle(h) && !h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION),
        )
        .await;
    // Power-on requested and nothing holds the host any more, but its BMC rejects the host
    // controller: the kill cannot land inside a power call.
    break_bmc(&lab, "k-c").await;
    release_hold(&lab, "k-c").await;
    kill_and_restart(&mut lab).await;
    let resumed = machine_api(&lab, kind)
        .get(&machine_name("k-c"))
        .await
        .unwrap();
    assert_eq!(
        resumed.annotations().get(POWER_ON_TIMEOUT_ANNOTATION),
        waiting.annotations().get(POWER_ON_TIMEOUT_ANNOTATION),
        "still waiting for the Node, same deadline"
    );
    assert_eq!(
        json_map(&resumed, NODE_LABELS_BACKUP_ANNOTATION),
        json_map(&waiting, NODE_LABELS_BACKUP_ANNOTATION),
        "labels backup intact through the kill"
    );
    assert!(
        !lab.lab
            .get("k-c")
            .await
            .annotations()
            .contains_key(MACHINE_POWER_OFF_ANNOTATION),
        "no new power-off request"
    );
    fix_bmc(&lab, "k-c").await;
    wait_flow_done(&lab, kind, "k-c").await;
    assert_recovered(&lab, "k-c", &uid_c, 1).await;

    // Events are published after the step's record and action, so one emitted at the moment
    // of a kill may be lost (the restarted operator does not repeat a recorded step). Those
    // of the steps the restarted operator took must be there, and the flow never started
    // over.
    for (node, after_restart) in [
        (
            "k-a",
            &[
                "PoweredOff",
                "NodeDeleted",
                "NodeReleased",
                "PowerOnRequested",
            ][..],
        ),
        ("k-b", &[][..]),
        ("k-c", &[][..]),
    ] {
        let wanted: Vec<&str> = after_restart
            .iter()
            .chain(&["NodeRestored", "RemediationSucceeded"])
            .copied()
            .collect();
        let events = events_with(&lab, "Machine", &machine_name(node), &wanted).await;
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
        assert!(
            times(&events, "RemediationStarted") <= 1,
            "{node}: never started again after the restart: {reasons:?}"
        );
        for reason in after_restart.iter().chain(&["NodeRestored"]) {
            assert!(reasons.contains(reason), "{node}: {reason} in {reasons:?}");
        }
        assert_eq!(
            times(&events, "RemediationSucceeded"),
            1,
            "{node}: {reasons:?}"
        );
    }
}

/// (2) The host's BMC rejects the host controller while a remediation (a HostRemediation, as
/// OpenShift's template flow creates it) waits for the power-off: the request keeps waiting,
/// its message carries the host controller's error, the host stays on and the Node is not
/// deleted; once the credentials are fixed the remediation completes, the Node deleted only
/// after the host was off.
///
/// (4) Two machines failing at once with `--max-concurrent-remediations 1` (the default):
/// the second request stays `Pending`, "waiting for a slot", until the first is done; never
/// both in flight (requests and hosts sampled every 200 ms); both complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bmc_outage_waits_and_concurrent_failures_take_turns() {
    let hosts = [worker("b-0"), worker("s-0"), worker("s-1")];
    let lab = QueueLab::start(&hosts, fast_queue()).await;
    create_wrong_secret(&lab).await;
    let template = create_template(&lab, "reboot", 1, 600).await;

    // (2) BMC outage. Broken before the request: the host controller could otherwise power
    // the host off before a credentials change reached it.
    let machine = machine_for(
        &lab,
        MachineKind::OpenShift,
        "b-0",
        &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
    )
    .await;
    let uid = mark_node(&lab, "b-0").await;
    break_bmc(&lab, "b-0").await;
    let fencing = watch_fencing(&lab, "b-0", &uid);
    let request = request_for_machine(&lab, &template, MachineKind::OpenShift, &machine).await;
    let name = request.name_any();
    let waiting = wait_request(
        &lab,
        &name,
        "waiting for the power-off, with the host controller's error",
        FLOW_TIMEOUT,
        |r| {
            step(r) == RemediationStep::PowerOffRequested
                && message(r).contains("the host controller reports")
        },
    )
    .await;
    let host = lab.lab.get("b-0").await;
    let error = host.status.as_ref().unwrap().error_message.clone();
    assert!(!error.is_empty(), "the host controller reports an error");
    let head: String = error.chars().take(40).collect();
    assert!(
        message(&waiting).contains(&head),
        "the request's message {:?} carries the host's error {error:?}",
        message(&waiting)
    );
    assert_eq!(phase(&waiting), Some(RemediationPhase::Running));
    assert_eq!(
        condition(&waiting, "Processing").map(|c| c.0).as_deref(),
        Some("True")
    );
    assert!(
        host.annotations()
            .contains_key(&request_power_off_annotation(&request.uid().unwrap())),
        "the power-off is requested"
    );
    assert!(
        warning(
            &events_with(&lab, "BareMetalHost", "b-0", &["BMCError"]).await,
            "BMCError"
        ),
        "the host controller's BMCError Warning on the host"
    );
    // For a while: the host stays on, its Node stays, the request keeps waiting.
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        let r = request_api(&lab).get(&name).await.unwrap();
        assert_eq!(
            step(&r),
            RemediationStep::PowerOffRequested,
            "{:?}",
            r.status
        );
        assert_eq!(
            lab.lab
                .redfish
                .power_state(lab.lab.index("b-0"))
                .await
                .unwrap(),
            "On"
        );
        assert_eq!(
            lab.node("b-0").await.uid().as_deref(),
            Some(uid.as_str()),
            "no Node is deleted while the host is on"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fix_bmc(&lab, "b-0").await;
    wait_request_succeeded(&lab, &name).await;
    assert_recovered(&lab, "b-0", &uid, 1).await;
    assert_fenced_before_release("b-0", &fencing.finish().await);
    // Its checker deletes it once healthy: the finalizer lets go, nothing is left on the host.
    request_api(&lab)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let (api, gone) = (&request_api(&lab), &name);
    wait_until(
        &format!("HostRemediation {name} to be gone"),
        FLOW_TIMEOUT,
        || async move {
            api.get_opt(gone)
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    assert!(reboot_keys(&lab.lab.get("b-0").await).is_empty());

    // (4) Two at once: a Cluster API Machine's request (MachineHealthCheck) and a Node's
    // request (NodeHealthCheck).
    let m0 = machine_for(&lab, MachineKind::ClusterApi, "s-0", &[]).await;
    let uids = [mark_node(&lab, "s-0").await, mark_node(&lab, "s-1").await];
    let r0 = request_for_machine(&lab, &template, MachineKind::ClusterApi, &m0).await;
    let r1 = request_for_node(&lab, &template, "s-1").await;
    let names = [r0.name_any(), r1.name_any()];
    type Snapshot = (BTreeMap<String, (RemediationStep, String)>, Vec<String>);
    let sampler: Sampler<Snapshot> = {
        let requests = request_api(&lab);
        let hosts = lab.lab.hosts.clone();
        let names = names.clone();
        Sampler::start(move || {
            let (requests, hosts, names) = (requests.clone(), hosts.clone(), names.clone());
            async move {
                let list = requests.list(&ListParams::default()).await.ok()?;
                let steps = list
                    .items
                    .iter()
                    .filter(|r| names.contains(&r.name_any()))
                    .map(|r| (r.name_any(), (step(r), message(r))))
                    .collect();
                let fenced = hosts
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter(|h| !remediation_keys(h).is_empty())
                    .map(|h| h.name_any())
                    .collect();
                Some((steps, fenced))
            }
        })
    };
    let api = &request_api(&lab);
    let names_ref = &names;
    let first = wait_until(
        "one of the two requests to start",
        FLOW_TIMEOUT,
        || async move {
            for n in names_ref {
                if let Some(r) = api.get_opt(n).await.ok().flatten()
                    && in_flight(step(&r))
                {
                    return Some(n.clone());
                }
            }
            None
        },
    )
    .await
    .unwrap();
    let second = names.iter().find(|n| **n != first).unwrap().clone();
    let pending = wait_request(
        &lab,
        &second,
        "Pending, waiting for a slot",
        FLOW_TIMEOUT,
        |r| {
            phase(r) == Some(RemediationPhase::Pending) && message(r).contains("waiting for a slot")
        },
    )
    .await;
    assert_eq!(step(&pending), RemediationStep::NotStarted);
    assert!(
        in_flight(step(&request_api(&lab).get(&first).await.unwrap())),
        "the first is still in flight while the second waits"
    );
    wait_request_succeeded(&lab, &first).await;
    wait_request_succeeded(&lab, &second).await;
    let samples = sampler.finish().await;
    assert!(samples.len() > 20, "sampled: {}", samples.len());
    let mut first_done_at = None;
    let mut second_started_at = None;
    for (i, (steps, fenced)) in samples.iter().enumerate() {
        let flying: Vec<&String> = steps
            .iter()
            .filter(|(_, (s, _))| in_flight(*s))
            .map(|(n, _)| n)
            .collect();
        assert!(flying.len() <= 1, "both in flight at sample {i}: {steps:?}");
        assert!(
            fenced.len() <= 1,
            "two hosts fenced at once at sample {i}: {fenced:?}"
        );
        let step_of = |n: &str| steps.get(n).map(|(s, _)| *s).unwrap_or_default();
        if step_of(&first) == RemediationStep::Done {
            first_done_at.get_or_insert(i);
        }
        if step_of(&second) != RemediationStep::NotStarted {
            second_started_at.get_or_insert(i);
        }
        if in_flight(step_of(&first)) {
            let (s, m) = steps.get(&second).cloned().unwrap_or_default();
            assert_eq!(s, RemediationStep::NotStarted, "sample {i}: {steps:?}");
            assert!(
                m.is_empty() || m.contains("waiting for a slot"),
                "sample {i}: the second's message {m:?}"
            );
        }
    }
    assert!(
        second_started_at.is_some()
            && first_done_at.is_some_and(|d| d <= second_started_at.unwrap()),
        "the second starts only once the first is done (first done at sample {first_done_at:?}, second started at {second_started_at:?})"
    );
    assert_recovered(&lab, "s-0", &uids[0], 1).await;
    assert_recovered(&lab, "s-1", &uids[1], 1).await;
}

/// (3) A Node that never comes back (the test holds its host off after the flow's power-off):
/// (a) an OpenShift worker Machine with a controller owner, whose host metal3 provisioned,
///     is deleted after `--remediation-power-on-timeout` (20 s), the flow's host annotation
///     gone;
/// (b) an OpenShift `master` Machine is not deleted: `remediation.hostcycle.io/failed`, a
///     `RemediationFailed` Warning, `hostcycle_remediations_total{result="failed"}`;
/// (c) a request (`timeoutSeconds: 20`, `retryLimit: 1`) for a Cluster API Machine power
///     cycles twice (`RemediationRetry`), then fails (`Failed`, `Succeeded=False`) and sets
///     `OwnerRemediated=False` in both condition formats on the Machine.
///
/// Once the holds are released every host comes back on, nothing left off, and Nodes that
/// return after all get their labels back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_never_returns_fails_and_escalates() {
    let hosts = [worker("f-w"), worker("f-m"), worker("f-c")];
    let options = LabOptions {
        operator_args: vec![
            "--remediation-power-on-timeout".into(),
            "20s".into(),
            "--max-concurrent-remediations".into(),
            "3".into(),
        ],
        ..LabOptions::default()
    };
    let lab = QueueLab::start_with(&hosts, fast_queue(), options).await;

    // f-w and f-m could be reprovisioned: owned by a controller, their hosts provisioned by
    // metal3. Only f-m's role (master) keeps it from being deleted.
    let owner = Api::<ConfigMap>::namespaced(lab.client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "machineset-f" } })).unwrap(),
        )
        .await
        .unwrap();
    reprovisionable_machine(&lab, &owner, "f-w", "worker").await;
    reprovisionable_machine(&lab, &owner, "f-m", "master").await;
    let capi_machine = machine_for(&lab, MachineKind::ClusterApi, "f-c", &[]).await;
    let template = create_template(&lab, "reboot-fast", 1, 20).await;
    let uids: BTreeMap<&str, String> = [
        ("f-w", mark_node(&lab, "f-w").await),
        ("f-m", mark_node(&lab, "f-m").await),
        ("f-c", mark_node(&lab, "f-c").await),
    ]
    .into();

    trigger(&lab, MachineKind::OpenShift, "f-w").await;
    trigger(&lab, MachineKind::OpenShift, "f-m").await;
    let request =
        request_for_machine(&lab, &template, MachineKind::ClusterApi, &capi_machine).await;
    let request_key = request_power_off_annotation(&request.uid().unwrap());
    let (appearances, stop_counting) = count_appearances(&lab, "f-c", request_key.clone());
    for (host, key) in [
        ("f-w", MACHINE_POWER_OFF_ANNOTATION.to_string()),
        ("f-m", MACHINE_POWER_OFF_ANNOTATION.to_string()),
        ("f-c", request_key.clone()),
    ] {
        lab.lab
            .wait_host(host, "the flow's power-off request", FLOW_TIMEOUT, |h| {
                h.annotations().contains_key(&key)
            })
            .await;
        hold(&lab, host).await;
    }

    // (a) Deleted, so its MachineSet replaces it.
    let api = &machine_api(&lab, MachineKind::OpenShift);
    wait_until(
        "the reprovisionable worker Machine machine-f-w to be deleted",
        2 * FLOW_TIMEOUT,
        || async move {
            api.get_opt(&machine_name("f-w"))
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log: {}", operator_log(&lab)));
    let events = events_with(
        &lab,
        "Machine",
        &machine_name("f-w"),
        &["RemediationFailed", "RemediationEscalated"],
    )
    .await;
    assert!(warning(&events, "RemediationFailed"), "{events:?}");
    assert!(
        events.iter().any(|e| e.reason == "RemediationEscalated"
            && e.type_ == "Warning"
            && e.note.contains("deleting the Machine")),
        "{events:?}"
    );
    assert_eq!(
        reboot_keys(&lab.lab.get("f-w").await),
        BTreeSet::from([HOLD.to_string()]),
        "the flow's power-off annotation is gone; only the test's hold is left"
    );

    // (b) A control-plane Machine is never deleted.
    let failed = wait_machine(
        &lab,
        MachineKind::OpenShift,
        "f-m",
        "remediation.hostcycle.io/failed",
        2 * FLOW_TIMEOUT,
        |m| has(m, REMEDIATION_FAILED_ANNOTATION),
    )
    .await;
    assert!(
        failed.annotations()[REMEDIATION_FAILED_ANNOTATION].contains("did not come back"),
        "{:?}",
        failed.annotations()
    );
    // The failure and, after it, why there is no escalation: two RemediationFailed Events.
    let events = events_noting(
        &lab,
        "Machine",
        &machine_name("f-m"),
        "RemediationFailed",
        "control-plane Machine",
    )
    .await;
    assert!(warning(&events, "RemediationFailed"), "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.reason == "RemediationFailed" && e.note.contains("control-plane Machine")),
        "the Warning says why it is not deleted: {events:?}"
    );
    assert_eq!(times(&events, "RemediationEscalated"), 0, "{events:?}");
    assert_eq!(
        reboot_keys(&lab.lab.get("f-m").await),
        BTreeSet::from([HOLD.to_string()])
    );

    // (c) Two power cycles, then OwnerRemediated=False on the Cluster API Machine.
    let gave_up = wait_request(
        &lab,
        &request.name_any(),
        "phase Failed",
        3 * FLOW_TIMEOUT,
        |r| phase(r) == Some(RemediationPhase::Failed),
    )
    .await;
    let status = gave_up.status.as_ref().unwrap();
    assert_eq!(status.step, RemediationStep::GaveUp);
    assert_eq!(status.retry_count, 1, "one retry: {status:?}");
    assert_eq!(
        condition(&gave_up, "Succeeded"),
        Some(("False".into(), "RemediationFailed".into()))
    );
    assert_eq!(
        condition(&gave_up, "Processing").map(|c| c.0).as_deref(),
        Some("False")
    );
    let events = events_with(
        &lab,
        "HostRemediation",
        &request.name_any(),
        &[
            "RemediationRetry",
            "RemediationFailed",
            "RemediationEscalated",
        ],
    )
    .await;
    assert!(warning(&events, "RemediationRetry"), "{events:?}");
    assert!(warning(&events, "RemediationFailed"), "{events:?}");
    assert!(warning(&events, "RemediationEscalated"), "{events:?}");
    assert_eq!(
        *appearances.lock().unwrap(),
        2,
        "the request's power-off was put on the host for each of the two cycles"
    );
    stop_counting.cancel();
    let capi = machine_api(&lab, MachineKind::ClusterApi)
        .get(&machine_name("f-c"))
        .await
        .unwrap();
    let owner_remediated = |conditions: &Value| -> Option<Value> {
        conditions
            .as_array()?
            .iter()
            .find(|c| c["type"] == "OwnerRemediated")
            .cloned()
    };
    let v1beta1 = owner_remediated(&capi.data["status"]["conditions"])
        .unwrap_or_else(|| panic!("OwnerRemediated in status.conditions: {}", capi.data));
    assert_eq!(v1beta1["status"], "False");
    assert_eq!(v1beta1["reason"], "WaitingForRemediation");
    assert_eq!(v1beta1["severity"], "Warning");
    let v1beta2 =
        owner_remediated(&capi.data["status"]["v1beta2"]["conditions"]).unwrap_or_else(|| {
            panic!(
                "OwnerRemediated in status.v1beta2.conditions: {}",
                capi.data
            )
        });
    assert_eq!(v1beta2["status"], "False");
    assert_eq!(v1beta2["reason"], "WaitingForRemediation");
    assert_eq!(
        capi.data["status"]["nodeRef"]["name"], "f-c",
        "the rest of the status is kept"
    );
    assert_eq!(
        reboot_keys(&lab.lab.get("f-c").await),
        BTreeSet::from([HOLD.to_string()])
    );

    let metrics = lab.lab.metrics().await;
    let failed_total = |trigger: &str| {
        metric(
            &metrics,
            "hostcycle_remediations_total",
            &[("trigger", trigger), ("result", "failed")],
        )
    };
    assert_eq!(failed_total("annotation"), 2.0, "{metrics}");
    assert_eq!(failed_total("request"), 1.0, "{metrics}");

    // Released: every host comes back on; a Node that returns after all gets its labels back.
    for host in ["f-w", "f-m", "f-c"] {
        release_hold(&lab, host).await;
    }
    for host in ["f-w", "f-m", "f-c"] {
        wait_host_back_on(&lab, host).await;
        assert_eq!(
            lab.power_cycles(host).await,
            1,
            "{host}: held off throughout, one power-off: {:?}",
            lab.lab.history(host)
        );
    }
    lab.wait_node("f-w", "back and Ready", FLOW_TIMEOUT, node_ready)
        .await;
    wait_node_restored(&lab, "f-m", &uids["f-m"]).await;
    wait_node_restored(&lab, "f-c", &uids["f-c"]).await;
    let master = wait_machine(
        &lab,
        MachineKind::OpenShift,
        "f-m",
        "backups dropped once the Node has them",
        FLOW_TIMEOUT,
        |m| !has(m, NODE_LABELS_BACKUP_ANNOTATION) && !has(m, NODE_ANNOTATIONS_BACKUP_ANNOTATION),
    )
    .await;
    assert!(
        has(&master, REMEDIATION_FAILED_ANNOTATION),
        "still marked failed"
    );
}

/// (5b) A node mid-reboot in the queue (entry `Rebooting`, the test holding its host off) is
/// remediated only after that reboot is over: the request waits (`Pending`, the message
/// names the reboot queue) and starts once the entry is gone — two power cycles in all.
///
/// (5a) A node being remediated is never drained by the queue: an entry queued while the
/// remediation is under way (host fenced, then held off with the Node released) stays
/// `Queued`, "being remediated"; once the remediation is over the queue drains and reboots
/// the node — two power cycles in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remediation_and_the_reboot_queue_take_turns() {
    let hosts = [worker("q-a"), worker("q-b")];
    let lab = QueueLab::start(&hosts, fast_queue()).await;
    create_wrong_secret(&lab).await;
    let template = create_template(&lab, "reboot", 1, 600).await;

    // (5b) Queue first, then the remediation.
    let mb = machine_for(&lab, MachineKind::ClusterApi, "q-b", &[]).await;
    let uid_b = mark_node(&lab, "q-b").await;
    lab.queue("q-b").await;
    let entry_uid = lab
        .wait_phase("q-b", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await
        .uid()
        .unwrap();
    lab.lab
        .wait_host("q-b", "the queue's reboot request", REBOOT_TIMEOUT, |h| {
            h.annotations().get("hostcycle.io/reboot-queue-request") == Some(&entry_uid)
        })
        .await;
    hold(&lab, "q-b").await;
    lab.lab
        .wait_host(
            "q-b",
            "off, held, nothing in flight",
            REBOOT_TIMEOUT,
            off_and_idle,
        )
        .await;
    let request = request_for_machine(&lab, &template, MachineKind::ClusterApi, &mb).await;
    let name = request.name_any();
    let sampler: Sampler<(RemediationStep, bool)> = {
        let requests = request_api(&lab);
        let entries = lab.entries.clone();
        let name = name.clone();
        Sampler::start(move || {
            let (requests, entries, name) = (requests.clone(), entries.clone(), name.clone());
            async move {
                // The request first: an entry present after it was seen started was present
                // then too (entries are not re-created).
                let s = step(&requests.get(&name).await.ok()?);
                let queued = entries
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .any(|e| e.spec.node == "q-b");
                Some((s, queued))
            }
        })
    };
    let pending = wait_request(
        &lab,
        &name,
        "Pending, waiting for the reboot queue",
        FLOW_TIMEOUT,
        |r| phase(r) == Some(RemediationPhase::Pending) && message(r).contains("reboot queue"),
    )
    .await;
    assert_eq!(
        step(&pending),
        RemediationStep::NotStarted,
        "{:?}",
        pending.status
    );
    assert!(
        remediation_keys(&lab.lab.get("q-b").await).is_empty(),
        "no power-off of the remediation while the queue reboots the node"
    );
    assert_eq!(
        lab.entry("q-b").await.map(|e| e.phase()),
        Some(EntryPhase::Rebooting)
    );
    release_hold(&lab, "q-b").await;
    lab.wait_entry_gone("q-b", REBOOT_TIMEOUT).await;
    wait_request_succeeded(&lab, &name).await;
    let samples = sampler.finish().await;
    assert!(samples.len() > 10, "sampled: {}", samples.len());
    for (i, (s, queued)) in samples.iter().enumerate() {
        assert!(
            !(*s != RemediationStep::NotStarted && *queued),
            "sample {i}: the remediation ran ({s:?}) while the queue's entry existed"
        );
    }
    assert_recovered(&lab, "q-b", &uid_b, 2).await;
    assert!(!cordoned(&lab.node("q-b").await), "q-b uncordoned");

    // (5a) The remediation first, then the queue.
    let kind = MachineKind::OpenShift;
    machine_for(
        &lab,
        kind,
        "q-a",
        &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
    )
    .await;
    let uid_a = mark_node(&lab, "q-a").await;
    break_bmc(&lab, "q-a").await;
    trigger(&lab, kind, "q-a").await;
    lab.lab
        .wait_host("q-a", "the flow's power-off request", FLOW_TIMEOUT, |h| {
            h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)
        })
        .await;
    hold(&lab, "q-a").await;
    lab.queue("q-a").await;
    let sampler: Sampler<(EntryPhase, usize)> = {
        let entries = lab.entries.clone();
        let machines = machine_api(&lab, kind);
        Sampler::start(move || {
            let (entries, machines) = (entries.clone(), machines.clone());
            async move {
                // The entry first: a Machine with the flow after the entry was seen in
                // progress had it then too (the flow does not start again).
                let entry = entries
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| e.spec.node == "q-a")?;
                let m = machines.get(&machine_name("q-a")).await.ok()?;
                Some((entry.phase(), markers(&m).len()))
            }
        })
    };
    let waiting = |what: &'static str| {
        lab.wait_entry("q-a", what, REBOOT_TIMEOUT, |e| {
            e.phase() == EntryPhase::Queued
                && e.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("being remediated"))
        })
    };
    waiting("Queued: the node is being remediated").await;
    assert!(
        !cordoned(&lab.node("q-a").await),
        "not drained: not cordoned"
    );
    fix_bmc(&lab, "q-a").await;
    wait_machine(
        &lab,
        kind,
        "q-a",
        "host off, Node released, power-on requested",
        FLOW_TIMEOUT,
        |m| has(m, POWER_ON_TIMEOUT_ANNOTATION),
    )
    .await;
    lab.lab
        .wait_host(
            "q-a",
            "off, held, nothing in flight",
            FLOW_TIMEOUT,
            off_and_idle,
        )
        .await;
    assert!(
        lab.nodes.get_opt("q-a").await.unwrap().is_none(),
        "the Node is released"
    );
    waiting("still Queued while the remediation has the Node released").await;
    release_hold(&lab, "q-a").await;
    wait_flow_done(&lab, kind, "q-a").await;
    lab.wait_entry_gone("q-a", 2 * REBOOT_TIMEOUT).await;
    let samples = sampler.finish().await;
    assert!(
        samples
            .iter()
            .any(|(p, _)| matches!(p, EntryPhase::Draining | EntryPhase::Rebooting)),
        "the queue drained and rebooted q-a after the remediation: {samples:?}"
    );
    for (i, (p, flow)) in samples.iter().enumerate() {
        assert!(
            !(matches!(p, EntryPhase::Draining | EntryPhase::Rebooting) && *flow > 0),
            "sample {i}: entry {p:?} while the remediation was under way"
        );
    }
    assert_recovered(&lab, "q-a", &uid_a, 2).await;
    assert!(!cordoned(&lab.node("q-a").await), "q-a uncordoned");
}
