//! End-to-end harness for machine remediation: a [`QueueLab`] (real control plane, sushy-tools
//! emulator, BareMetalHosts, simulated kubelets, the real operator binary) plus Machines of
//! both kinds, HostRemediation requests created the way Cluster API's MachineHealthCheck and
//! medik8s' NodeHealthCheck create them, and recorders that watch one object (a host, a Node,
//! a Machine, a request) or one emulated BMC and keep every change with the time it was seen.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, HostRemediation, HostRemediationTemplate,
    MACHINE_POWER_OFF_ANNOTATION, NHC_NODE_NAME_ANNOTATION, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, REMEDIATION_FAILED_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION, REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION,
};
use hostcycle_testkit::{MachineKind, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::queue::{HostSpec, QueueLab, fast_queue};
use super::{LabOptions, NS, PASSWORD, SECRET, USER};

/// One power cycle through the fake driver (2 × 1–11 s), a boot and a registration, with room.
pub const CYCLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Every annotation the annotation flow keeps on a Machine: the trigger and its markers.
pub const FLOW_ANNOTATIONS: [&str; 11] = [
    EXTERNAL_REMEDIATION_ANNOTATION,
    "remediation.hostcycle.io/host",
    "remediation.hostcycle.io/node-spec-backup",
    REMEDIATION_STARTED_ANNOTATION,
    REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    POWER_ON_TIMEOUT_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION,
    NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION,
];

/// A keyed reboot annotation the test puts on a host to hold it off (the host controller keeps
/// a host off while any `reboot.metal3.io/*` annotation is present).
pub const HOLD_ANNOTATION: &str = "reboot.metal3.io/e2e-hold";

/// A Secret whose password the emulator rejects: a host pointed at it cannot be powered.
pub const WRONG_SECRET: &str = "wrong-bmc-credentials";

/// The group/kind a checker writes into `cloned-from-groupkind`.
pub const TEMPLATE_GROUP_KIND: &str = "HostRemediationTemplate.hostcycle.io";

/// A [`QueueLab`] for remediation tests (derefs to it).
pub struct RemediationLab {
    pub q: QueueLab,
}

impl Deref for RemediationLab {
    type Target = QueueLab;
    fn deref(&self) -> &QueueLab {
        &self.q
    }
}

impl DerefMut for RemediationLab {
    fn deref_mut(&mut self) -> &mut QueueLab {
        &mut self.q
    }
}

/// A Machine the test created: enough to find it again.
#[derive(Clone, Debug)]
pub struct MachineRef {
    pub kind: MachineKind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for MachineRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

impl RemediationLab {
    /// Starts a lab with `hosts` (hosts, BMC systems and Nodes share their names), the queue
    /// at [`fast_queue`] (unused by remediation), and extra operator flags.
    pub async fn start(hosts: &[HostSpec], operator_args: &[&str]) -> RemediationLab {
        let options = LabOptions {
            operator_args: operator_args.iter().map(|s| s.to_string()).collect(),
            ..LabOptions::default()
        };
        RemediationLab {
            q: QueueLab::start_with(hosts, fast_queue(), options).await,
        }
    }

    /// The operator's log, for failure messages.
    pub fn operator_log(&self) -> String {
        self.lab
            .operator
            .as_ref()
            .map(|p| p.log_path().display().to_string())
            .unwrap_or_else(|| "(operator not running)".into())
    }

    // ----- Machines ------------------------------------------------------------------

    pub fn machines(&self, kind: MachineKind, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &kind.api_resource())
    }

    /// Creates a Machine of `kind` in `ns` naming host `default/<host>` and Node `node`, with
    /// `labels`, `status.phase: Running`, and `extra_status` merged into its status.
    pub async fn create_machine(
        &self,
        kind: MachineKind,
        ns: &str,
        name: &str,
        host: &str,
        node: &str,
        labels: &[(&str, &str)],
    ) -> MachineRef {
        let mut m =
            hostcycle_testkit::machine(kind, ns, name, Some((NS, host)), Some(node), labels);
        m.data["status"]["phase"] = json!("Running");
        if kind == MachineKind::ClusterApi {
            let cluster = labels
                .iter()
                .find(|(k, _)| *k == "cluster.x-k8s.io/cluster-name")
                .map(|(_, v)| *v)
                .unwrap_or("e2e");
            m.data["spec"] =
                json!({ "clusterName": cluster, "bootstrap": {}, "infrastructureRef": {} });
        }
        hostcycle_testkit::create_machine_object(&self.client, kind, &m)
            .await
            .unwrap();
        MachineRef {
            kind,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    pub async fn machine(&self, m: &MachineRef) -> DynamicObject {
        self.machines(m.kind, &m.namespace)
            .get(&m.name)
            .await
            .unwrap()
    }

    pub async fn machine_annotations(&self, m: &MachineRef) -> BTreeMap<String, String> {
        self.machine(m).await.annotations().clone()
    }

    /// Sets `host.metal3.io/external-remediation: ""` on the Machine, as OpenShift's
    /// MachineHealthCheck does.
    pub async fn mark(&self, m: &MachineRef) -> DynamicObject {
        self.patch_machine_annotations(m, json!({ EXTERNAL_REMEDIATION_ANNOTATION: "" }))
            .await
    }

    /// Removes the trigger; returns the Machine as the server has it right after.
    pub async fn unmark(&self, m: &MachineRef) -> DynamicObject {
        self.patch_machine_annotations(m, json!({ EXTERNAL_REMEDIATION_ANNOTATION: null }))
            .await
    }

    pub async fn patch_machine_annotations(
        &self,
        m: &MachineRef,
        annotations: Value,
    ) -> DynamicObject {
        self.machines(m.kind, &m.namespace)
            .patch(
                &m.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "annotations": annotations } })),
            )
            .await
            .unwrap()
    }

    pub async fn wait_machine(
        &self,
        m: &MachineRef,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&DynamicObject) -> bool,
    ) -> DynamicObject {
        let pred = &pred;
        let api = self.machines(m.kind, &m.namespace);
        let api = &api;
        let what = format!("{m}: {what}");
        match wait_until(&what, timeout, || async move {
            api.get(&m.name).await.ok().filter(|o| pred(o))
        })
        .await
        {
            Ok(o) => o,
            Err(e) => panic!(
                "{e}\nlast seen annotations: {:?}\noperator log: {}",
                api.get(&m.name).await.map(|o| o.annotations().clone()),
                self.operator_log()
            ),
        }
    }

    /// Waits until the Machine carries neither the trigger nor any marker of the flow.
    pub async fn wait_machine_clean(&self, m: &MachineRef, timeout: Duration) -> DynamicObject {
        self.wait_machine(m, "no trigger and no remediation marker", timeout, |o| {
            flow_annotations(o.annotations()).is_empty()
        })
        .await
    }

    // ----- Nodes ---------------------------------------------------------------------

    /// Adds labels and annotations to a Node.
    pub async fn label_node(
        &self,
        node: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) {
        let map = |kv: &[(&str, &str)]| -> serde_json::Map<String, Value> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect()
        };
        self.nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": {
                    "labels": map(labels),
                    "annotations": map(annotations),
                }})),
            )
            .await
            .unwrap();
    }

    /// Waits until a Node other than `old_uid` is registered and Ready.
    pub async fn wait_node_back(&self, node: &str, old_uid: &str, timeout: Duration) -> Node {
        let what = format!("Node {node}: registered again (new UID) and Ready");
        match wait_until(&what, timeout, || async {
            self.nodes.get_opt(node).await.ok().flatten().filter(|n| {
                n.uid().as_deref() != Some(old_uid) && hostcycle_sim::node_ready(n) == Some(true)
            })
        })
        .await
        {
            Ok(n) => n,
            Err(e) => panic!(
                "{e}\npower history: {:?}\noperator log: {}",
                self.lab.history(node),
                self.operator_log()
            ),
        }
    }

    // ----- hosts ---------------------------------------------------------------------

    /// Points the host at a Secret whose password the emulator rejects: the host controller
    /// cannot power it until [`Self::unblock_bmc`]. Waits until it reports the error.
    pub async fn block_bmc(&self, host: &str) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NS);
        let wrong: Secret = serde_json::from_value(json!({
            "metadata": { "name": WRONG_SECRET },
            "stringData": { "username": USER, "password": format!("not-{PASSWORD}") },
        }))
        .unwrap();
        match secrets.create(&PostParams::default(), &wrong).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating Secret {WRONG_SECRET}: {e}"),
        }
        self.set_credentials(host, WRONG_SECRET).await;
        self.lab
            .wait_host(host, "BMC credentials rejected", CYCLE_TIMEOUT, |h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.operational_status)
                    .map(|s| s.as_str())
                    == Some("error")
            })
            .await;
    }

    /// Gives the host its working credentials back and waits until it reports OK.
    pub async fn unblock_bmc(&self, host: &str) {
        self.set_credentials(host, SECRET).await;
        self.lab
            .wait_host(host, "OK with its credentials back", CYCLE_TIMEOUT, |h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.operational_status)
                    .map(|s| s.as_str())
                    == Some("OK")
            })
            .await;
    }

    async fn set_credentials(&self, host: &str, secret: &str) {
        self.lab
            .patch_spec(host, json!({ "bmc": { "credentialsName": secret } }))
            .await;
    }

    /// Waits until the emulator has reported `On` for `quiet` without a change, counting from
    /// `since` at the earliest. The fake driver applies a power change 1–11 s after it was
    /// sent, so a quiet period longer than that after the last request leaves nothing pending.
    pub async fn wait_power_settled(&self, host: &str, since: Timestamp, quiet: Duration) {
        let what = format!("{host}: the emulator On and unchanged for {quiet:?}");
        let settled = wait_until(&what, CYCLE_TIMEOUT, || async {
            let history = self.lab.settled_history(host).await;
            let (changed, state) = history.0.last().cloned()?;
            let from = changed.max(since);
            let calm = Timestamp::now().duration_since(from).unsigned_abs() >= quiet;
            (state == "On" && calm).then_some(())
        })
        .await;
        if let Err(e) = settled {
            panic!("{e}\nhistory: {:?}", self.lab.history(host));
        }
    }

    // ----- HostRemediations ----------------------------------------------------------

    pub fn requests(&self, ns: &str) -> Api<HostRemediation> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates a HostRemediationTemplate whose `spec.template.spec` is `spec`.
    pub async fn create_template(&self, ns: &str, name: &str, spec: Value) -> DynamicObject {
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "hostcycle.io/v1alpha1",
            "kind": "HostRemediationTemplate",
            "metadata": { "name": name, "namespace": ns },
            "spec": { "template": { "spec": spec } },
        }))
        .unwrap();
        self.templates(ns)
            .create(&PostParams::default(), &body)
            .await
            .unwrap()
    }

    /// The HostRemediationTemplates of `ns`, unstructured (as the checkers read them).
    pub fn templates(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            ns,
            &ApiResource::erase::<HostRemediationTemplate>(&()),
        )
    }

    fn dynamic_requests(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            ns,
            &ApiResource::erase::<HostRemediation>(&()),
        )
    }

    /// What Cluster API's MachineHealthCheck creates for an unhealthy Machine: a request
    /// named after the Machine, in its namespace, owned by it (no controller, no
    /// blockOwnerDeletion), with the template's `spec.template.spec` (read unstructured), the
    /// cluster-name label and the cloned-from annotations.
    pub async fn create_mhc_request(
        &self,
        template_ns: &str,
        template: &str,
        machine: &MachineRef,
        cluster: &str,
    ) -> HostRemediation {
        let tpl = self.templates(template_ns).get(template).await.unwrap();
        let m = self.machine(machine).await;
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "hostcycle.io/v1alpha1",
            "kind": "HostRemediation",
            "metadata": {
                "name": machine.name,
                "namespace": machine.namespace,
                "labels": { "cluster.x-k8s.io/cluster-name": cluster },
                "annotations": {
                    "cluster.x-k8s.io/cloned-from-name": template,
                    "cluster.x-k8s.io/cloned-from-groupkind": TEMPLATE_GROUP_KIND,
                },
                "ownerReferences": [{
                    "apiVersion": machine.kind.api_version(),
                    "kind": "Machine",
                    "name": machine.name,
                    "uid": m.uid().unwrap(),
                }],
            },
            "spec": tpl.data["spec"]["template"]["spec"].clone(),
        }))
        .unwrap();
        self.create_request(&machine.namespace, &body).await
    }

    /// What medik8s' NodeHealthCheck creates for an unhealthy Node: a request named after the
    /// Node, in the template's namespace, with the template's `spec.template.spec`, the
    /// node-name and template-name annotations and NHC's label; no Machine owner.
    pub async fn create_nhc_request(
        &self,
        template_ns: &str,
        template: &str,
        node: &str,
    ) -> HostRemediation {
        let tpl = self.templates(template_ns).get(template).await.unwrap();
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "hostcycle.io/v1alpha1",
            "kind": "HostRemediation",
            "metadata": {
                "name": node,
                "namespace": template_ns,
                "labels": { "app.kubernetes.io/part-of": "node-healthcheck-controller" },
                "annotations": {
                    NHC_NODE_NAME_ANNOTATION: node,
                    "remediation.medik8s.io/template-name": template,
                },
            },
            "spec": tpl.data["spec"]["template"]["spec"].clone(),
        }))
        .unwrap();
        self.create_request(template_ns, &body).await
    }

    async fn create_request(&self, ns: &str, body: &DynamicObject) -> HostRemediation {
        let created = self
            .dynamic_requests(ns)
            .create(&PostParams::default(), body)
            .await
            .unwrap();
        self.requests(ns).get(&created.name_any()).await.unwrap()
    }

    /// Deletes a request, as a health checker does once the machine is healthy.
    pub async fn delete_request(&self, ns: &str, name: &str) {
        self.requests(ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub async fn wait_request(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&HostRemediation) -> bool,
    ) -> HostRemediation {
        let pred = &pred;
        let api = self.requests(ns);
        let api = &api;
        let what = format!("HostRemediation {ns}/{name}: {what}");
        match wait_until(&what, timeout, || async move {
            api.get_opt(name).await.ok().flatten().filter(|r| pred(r))
        })
        .await
        {
            Ok(r) => r,
            Err(e) => panic!(
                "{e}\nlast seen: {}\noperator log: {}",
                api.get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .map(|r| serde_json::to_string_pretty(&r).unwrap_or_default())
                    .unwrap_or_else(|| "(gone)".into()),
                self.operator_log()
            ),
        }
    }

    pub async fn wait_request_gone(&self, ns: &str, name: &str, timeout: Duration) {
        let api = self.requests(ns);
        let what = format!("HostRemediation {ns}/{name} to be gone");
        if let Err(e) = wait_until(&what, timeout, || async {
            api.get_opt(name)
                .await
                .ok()
                .and_then(|r| r.is_none().then_some(()))
        })
        .await
        {
            panic!(
                "{e}\nlast seen: {}\noperator log: {}",
                api.get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .map(|r| serde_json::to_string_pretty(&r).unwrap_or_default())
                    .unwrap_or_default(),
                self.operator_log()
            );
        }
    }

    // ----- Events and metrics --------------------------------------------------------

    /// (type, reason, note) of every Event regarding the object of `kind` named `name`
    /// (any namespace), oldest first.
    pub async fn events_for(&self, kind: &str, name: &str) -> Vec<(String, String, String)> {
        let api: Api<Event> = Api::all(self.client.clone());
        let mut events: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
            })
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

    /// Waits until Events with each of `reasons` regard the object; returns all its Events.
    pub async fn wait_event_reasons(
        &self,
        kind: &str,
        name: &str,
        reasons: &[&str],
    ) -> Vec<(String, String, String)> {
        let what = format!("Events {reasons:?} about {kind} {name}");
        match wait_until(&what, Duration::from_secs(30), || async {
            let events = self.events_for(kind, name).await;
            reasons
                .iter()
                .all(|r| events.iter().any(|(_, reason, _)| reason == r))
                .then_some(events)
        })
        .await
        {
            Ok(events) => events,
            Err(e) => panic!(
                "{e}\nEvents now: {:#?}\noperator log: {}",
                self.events_for(kind, name).await,
                self.operator_log()
            ),
        }
    }

    /// The value of one sample of the operator's metrics.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        metric_value(&self.lab.metrics().await, name, labels)
    }

    // ----- recorders -----------------------------------------------------------------

    pub async fn watch_host(&self, name: &str) -> Recorder<BareMetalHost> {
        Recorder::start(self.lab.hosts.clone(), name).await
    }

    pub async fn watch_node(&self, name: &str) -> Recorder<Node> {
        Recorder::start(self.nodes.clone(), name).await
    }

    pub async fn watch_machine(&self, m: &MachineRef) -> Recorder<DynamicObject> {
        Recorder::start(self.machines(m.kind, &m.namespace), &m.name).await
    }

    pub async fn watch_request(&self, ns: &str, name: &str) -> Recorder<HostRemediation> {
        Recorder::start(self.requests(ns), name).await
    }

    /// Holds the host off ([`HOLD_ANNOTATION`]) the moment a version of it satisfying `pred`
    /// is seen (a watch, not a poll: within milliseconds). The task returns when it was held.
    pub async fn hold_when(
        &self,
        host: &str,
        pred: impl Fn(&BareMetalHost) -> bool + Send + 'static,
    ) -> tokio::task::JoinHandle<Timestamp> {
        let api = self.lab.hosts.clone();
        let name = host.to_string();
        on_first(
            self.lab.hosts.clone(),
            host,
            move |s| !s.deleted && pred(&s.object),
            move |_| async move {
                let patch = json!({ "metadata": { "annotations": { HOLD_ANNOTATION: "" } } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                Timestamp::now()
            },
        )
        .await
    }

    /// Holds `host` off the moment a request's power-off reaches it: its Node never returns.
    pub async fn hold_at_request_power_off(
        &self,
        host: &str,
    ) -> tokio::task::JoinHandle<Timestamp> {
        self.hold_when(host, |h| {
            h.annotations()
                .keys()
                .any(|k| k.starts_with(hostcycle_api::remediation::REQUEST_POWER_OFF_PREFIX))
        })
        .await
    }

    /// Reads the emulated BMC of `host` every `interval` and keeps each change of state.
    pub fn probe_power(&self, host: &str, interval: Duration) -> PowerProbe {
        PowerProbe::start(self, host, interval)
    }
}

/// Watches one object by name and, the moment a version (or its deletion) satisfying `pred`
/// arrives, runs `action` with it (a watch, not a poll: within milliseconds of the change).
/// Returns once the watch has listed; the task ends with the action's result.
pub async fn on_first<K, T, F, Fut>(
    api: Api<K>,
    name: &str,
    pred: impl Fn(&Seen<K>) -> bool + Send + 'static,
    action: F,
) -> tokio::task::JoinHandle<T>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    T: Send + 'static,
    F: FnOnce(Seen<K>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let name = name.to_string();
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed_tx);
        while let Some(event) = stream.next().await {
            let at = Timestamp::now();
            let (deleted, object) = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (false, o),
                Ok(watcher::Event::Delete(o)) => (true, o),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let seen = Seen {
                at,
                deleted,
                object,
            };
            if pred(&seen) {
                return action(seen).await;
            }
        }
        panic!("the watch on {name} ended");
    });
    // Listed, or already acted (the task ended, dropping the sender).
    let _ = tokio::time::timeout(Duration::from_secs(30), listed_rx)
        .await
        .expect("the watch lists within 30 s");
    task
}

/// The flow's annotations (trigger and markers) a Machine carries.
pub fn flow_annotations(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    annotations
        .iter()
        .filter(|(k, _)| FLOW_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The host's `status.poweredOn`.
pub fn powered_on(h: &BareMetalHost) -> Option<bool> {
    h.status.as_ref().and_then(|s| s.powered_on)
}

/// Whether the host carries the annotation flow's power-off request.
pub fn machine_power_off_requested(h: &BareMetalHost) -> bool {
    h.annotations().contains_key(MACHINE_POWER_OFF_ANNOTATION)
}

/// Whether the host carries a request's power-off annotation.
pub fn request_power_off_requested(h: &BareMetalHost) -> bool {
    h.annotations()
        .keys()
        .any(|k| k.starts_with(hostcycle_api::remediation::REQUEST_POWER_OFF_PREFIX))
}

/// The host's `status.operationalStatus`, as metal3 spells it.
pub fn operational_status(h: &BareMetalHost) -> Option<&'static str> {
    h.status
        .as_ref()
        .and_then(|s| s.operational_status)
        .map(|s| s.as_str())
}

/// The template the seams and trust tests make their requests from: one power cycle, 120 s
/// for the Node to come back.
pub async fn one_cycle_template(lab: &RemediationLab, ns: &str, name: &str) {
    lab.create_template(
        ns,
        name,
        json!({ "strategy": { "type": "Reboot", "retryLimit": 0, "timeoutSeconds": 120 } }),
    )
    .await;
}

/// A condition of a request: (status, reason).
pub fn condition(r: &HostRemediation, type_: &str) -> Option<(String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// The status of a request's condition (`True`, `False`, `Unknown`), or `""`.
pub fn condition_status(r: &HostRemediation, type_: &str) -> String {
    condition(r, type_).map(|(s, _)| s).unwrap_or_default()
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (labels matched as
/// a subset).
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(k, v)| label_text.split(',').any(|p| p == format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// One observation by a [`Recorder`].
#[derive(Clone, Debug)]
pub struct Seen<K> {
    /// When the test received it.
    pub at: Timestamp,
    /// A deletion (the object is its last state).
    pub deleted: bool,
    pub object: K,
}

impl<K: Resource> Seen<K> {
    /// The object's resourceVersion (the etcd revision of the change; for a deletion, of the
    /// deletion).
    pub fn revision(&self) -> u64 {
        self.object
            .meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// Watches one object by name and keeps every version seen (and its deletion) with the time
/// it arrived. Stops when dropped.
pub struct Recorder<K: Clone> {
    seen: Arc<Mutex<Vec<Seen<K>>>>,
    stop: CancellationToken,
    name: String,
}

impl<K> Recorder<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    /// Starts watching and returns once the initial list is in (so no later change is missed).
    pub async fn start(api: Api<K>, name: &str) -> Recorder<K> {
        let seen: Arc<Mutex<Vec<Seen<K>>>> = Arc::default();
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut stream = watcher(api, config).default_backoff().boxed();
        let task_seen = seen.clone();
        let task_stop = stop.clone();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                let next = tokio::select! {
                    _ = task_stop.cancelled() => return,
                    next = stream.next() => next,
                };
                let Some(event) = next else { return };
                let Ok(event) = event else { continue };
                let at = Timestamp::now();
                let (deleted, object) = match event {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => (false, o),
                    watcher::Event::Delete(o) => (true, o),
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    watcher::Event::Init => continue,
                };
                task_seen.lock().unwrap().push(Seen {
                    at,
                    deleted,
                    object,
                });
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .unwrap_or_else(|_| panic!("the watch on {name} did not list within 30 s"))
            .unwrap_or_else(|_| panic!("the watch on {name} ended before listing"));
        Recorder {
            seen,
            stop,
            name: name.to_string(),
        }
    }

    pub fn seen(&self) -> Vec<Seen<K>> {
        self.seen.lock().unwrap().clone()
    }

    /// The first version (or deletion) satisfying `pred`.
    pub fn first(&self, pred: impl Fn(&Seen<K>) -> bool) -> Option<Seen<K>> {
        self.seen.lock().unwrap().iter().find(|s| pred(s)).cloned()
    }

    /// The deletions seen.
    pub fn deletions(&self) -> Vec<Seen<K>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.deleted)
            .cloned()
            .collect()
    }

    /// The distinct UIDs seen, in order (a re-created object has a new one).
    pub fn uids(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.seen.lock().unwrap().iter() {
            if let Some(uid) = s.object.meta().uid.clone()
                && out.last() != Some(&uid)
            {
                out.push(uid);
            }
        }
        out
    }

    /// Waits until a version (or deletion) satisfying `pred` has been seen.
    pub async fn wait(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Seen<K>) -> bool,
    ) -> Seen<K> {
        let pred = &pred;
        let what = format!("{} (watched): {what}", self.name);
        wait_until(&what, timeout, || async move { self.first(pred) })
            .await
            .unwrap()
    }
}

impl<K: Clone> Drop for Recorder<K> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One reading of an emulated BMC.
#[derive(Clone, Debug)]
pub struct PowerReading {
    /// When the request was sent.
    pub sent: Timestamp,
    /// When the answer arrived.
    pub at: Timestamp,
    pub state: String,
}

/// Reads one emulated BMC every `interval` (much faster than the Lab's sampler) and keeps each
/// change. The fake driver flips its state on the first read after the change is due, so a
/// fast probe is, nearly always, the first to see it. Stops when dropped.
pub struct PowerProbe {
    changes: Arc<Mutex<Vec<PowerReading>>>,
    stop: CancellationToken,
}

impl PowerProbe {
    fn start(lab: &RemediationLab, host: &str, interval: Duration) -> PowerProbe {
        let redfish = lab.lab.redfish.clone();
        let index = lab.lab.index(host);
        let changes: Arc<Mutex<Vec<PowerReading>>> = Arc::default();
        let stop = CancellationToken::new();
        let (task_changes, task_stop) = (changes.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let sent = Timestamp::now();
                if let Ok(state) = redfish.power_state(index).await {
                    let at = Timestamp::now();
                    let mut c = task_changes.lock().unwrap();
                    if c.last().map(|r| r.state != state).unwrap_or(true) {
                        c.push(PowerReading { sent, at, state });
                    }
                }
                tokio::select! {
                    _ = task_stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        PowerProbe { changes, stop }
    }

    pub fn changes(&self) -> Vec<PowerReading> {
        self.changes.lock().unwrap().clone()
    }

    /// The first reading of `state` answered after `t`.
    pub fn first_after(&self, state: &str, t: Timestamp) -> Option<PowerReading> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.state == state && r.at > t)
            .cloned()
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for PowerProbe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Milliseconds from `a` to `b` (negative when `b` is earlier).
pub fn millis(a: Timestamp, b: Timestamp) -> i64 {
    b.duration_since(a).as_millis() as i64
}

/// The condition of type `t` in a JSON list of conditions (a Machine's), or `null`.
pub fn find_condition(list: &Value, t: &str) -> Value {
    list.as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == t).cloned())
        .unwrap_or(Value::Null)
}
