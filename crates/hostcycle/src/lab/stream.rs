//! The lab's concise stream: one terminal line per change that matters during a failover,
//! timed from the last fault the lab was asked for (`+21.3s worker-1: …`; `heal` is no
//! fault).
//!
//! Watch tasks turn Events (events.k8s.io/v1), the lab namespace's Pods, Nodes and
//! VolumeAttachments into [`StreamInput`]s; [`StreamState`] keeps what it saw last and turns
//! each change into a [`Change`]; [`describe`] — pure, table-tested — says it in one line or
//! leaves it out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hostcycle_sim::StorageSim;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::control::FaultAction;

/// Event reasons of the HostHealthCheck controller (not in this branch's api crate yet).
const REMEDIATION_REQUESTED: &str = "RemediationRequested";
const STORM_DETECTED: &str = "StormDetected";
/// The same host and reason again within this window is a copy of the same Event (the
/// operator publishes each on the request, the host and the Node) or a repeat.
const REPEAT_WINDOW: Duration = Duration::from_secs(60);
/// Longest Event note quoted in a line.
const NOTE_CHARS: usize = 120;

/// What one watched Pod looks like to the stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    pub node: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub terminating: bool,
    /// It mounts a claim: running means its volume is attached (the simulated kubelet starts
    /// such a pod only then).
    pub has_volume: bool,
}

/// What one Node looks like to the stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    pub ready: Option<bool>,
    pub boot_id: String,
}

/// What one VolumeAttachment looks like to the stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttachmentView {
    /// The claim (`namespace/name`) of its volume when known, else the PV's name.
    pub volume: String,
    pub node: String,
    pub attached: bool,
    pub deleting: bool,
    pub attach_error: Option<String>,
}

/// What the watch tasks and the control socket tell the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamInput {
    /// A fault the lab was asked for: the stream's clock restarts.
    Fault { node: String, action: FaultAction },
    /// A new Event (each is sent once).
    Event {
        reason: String,
        regarding_kind: String,
        regarding_name: String,
        note: String,
    },
    /// A Pod of the lab namespace as it is now (`None`: deleted); `shown` for the sample
    /// StatefulSet's pods, the others only count as released.
    Pod {
        name: String,
        view: Option<PodView>,
        shown: bool,
        initial: bool,
    },
    Node {
        name: String,
        view: Option<NodeView>,
        initial: bool,
    },
    Attachment {
        name: String,
        view: Option<AttachmentView>,
        initial: bool,
    },
    /// A storage violation ("two writers", a write while not attached).
    Violation(String),
}

/// One observed change, before it is said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Fault {
        node: String,
        action: FaultAction,
    },
    Event {
        host: String,
        reason: String,
        note: String,
        /// Pods deleted from the host since its remediation started.
        pods_deleted: usize,
    },
    Pod {
        pod: String,
        before: Option<PodView>,
        after: Option<PodView>,
    },
    Node {
        node: String,
        before: Option<NodeView>,
        after: Option<NodeView>,
    },
    Attachment {
        before: Option<AttachmentView>,
        after: Option<AttachmentView>,
    },
    Violation(String),
}

/// The line for a change, without its time; `None` for a change not worth a line.
pub fn describe(change: &Change) -> Option<String> {
    match change {
        Change::Fault { node, action } => Some(format!("{node}: {}", action.done())),
        Change::Event {
            host,
            reason,
            note,
            pods_deleted,
        } => describe_event(reason, note, *pods_deleted).map(|text| format!("{host}: {text}")),
        Change::Pod { pod, before, after } => {
            describe_pod(before.as_ref(), after.as_ref()).map(|text| format!("{pod}: {text}"))
        }
        Change::Node {
            node,
            before,
            after,
        } => describe_node(before.as_ref(), after.as_ref()).map(|text| format!("{node}: {text}")),
        Change::Attachment { before, after } => {
            describe_attachment(before.as_ref(), after.as_ref())
        }
        Change::Violation(text) => Some(format!("STORAGE VIOLATION: {text}")),
    }
}

fn describe_event(reason: &str, note: &str, pods_deleted: usize) -> Option<String> {
    let note: String = note.chars().take(NOTE_CHARS).collect();
    let text = match reason {
        REMEDIATION_REQUESTED => format!("unhealthy → HostRemediation requested ({note})"),
        STORM_DETECTED => format!("remediation storm detected, holding back ({note})"),
        "RemediationStarted" => "remediation started, power-off requested".to_string(),
        "PoweredOff" => "fenced (host off, two BMC readings)".to_string(),
        "NodeDeleted" => "Node deleted (host fenced)".to_string(),
        "ReleasingWorkloads" => "releasing workloads".to_string(),
        "WorkloadsReleased" => format!(
            "workloads released ({pods_deleted} pod{} deleted, volumesInUse cleared)",
            if pods_deleted == 1 { "" } else { "s" }
        ),
        "PowerOnRequested" => "power-on requested".to_string(),
        "RemediationSucceeded" => "back (new boot)".to_string(),
        "RemediationFailed" => format!("remediation failed ({note})"),
        "CannotFence" => format!("cannot fence ({note})"),
        "RepeatedFailure" => {
            "failed again within an hour of its last recovery: it will be fenced and left off"
                .to_string()
        }
        "HostLeftOff" => "left off for a person (kubectl get hr: LeftOff; resume with \
                          spec.strategy.afterRelease: PowerOn)"
            .to_string(),
        "RemediationBlocked" => format!("remediation blocked ({note})"),
        "PowerStateCorrected" => format!("power state corrected by hostcycle ({note})"),
        _ => return None,
    };
    Some(text)
}

fn describe_pod(before: Option<&PodView>, after: Option<&PodView>) -> Option<String> {
    let on = |view: &PodView| view.node.clone().unwrap_or_else(|| "no node".into());
    match (before, after) {
        (_, None) => Some(match before.and_then(|b| b.node.as_deref()) {
            Some(node) => format!("deleted (was on {node})"),
            None => "deleted".to_string(),
        }),
        (before, Some(after)) => {
            let was_terminating = before.is_some_and(|b| b.terminating);
            let was_running_here = before
                .is_some_and(|b| b.phase == "Running" && b.node == after.node && !b.terminating);
            if after.terminating {
                return (!was_terminating).then(|| format!("terminating on {}", on(after)));
            }
            if after.phase == "Running" {
                if was_running_here {
                    // Readiness lost while running: its node stopped reporting; regained: it
                    // reports again.
                    let was_ready = before.is_some_and(|b| b.ready);
                    return match (was_ready, after.ready) {
                        (true, false) => {
                            Some(format!("not ready on {} (node unreachable)", on(after)))
                        }
                        (false, true) => Some(format!("ready again on {}", on(after))),
                        _ => None,
                    };
                }
                let volume = if after.has_volume {
                    " (volume attached)"
                } else {
                    ""
                };
                return Some(format!("Running on {}{volume}", on(after)));
            }
            let node_changed = before.map(|b| &b.node) != Some(&after.node);
            match (&after.node, node_changed || before.is_none()) {
                (Some(node), true) if after.has_volume => {
                    Some(format!("scheduled to {node}, waiting for its volume"))
                }
                (Some(node), true) => Some(format!("scheduled to {node}")),
                (None, true) => Some(format!("created ({})", after.phase)),
                _ => None,
            }
        }
    }
}

fn describe_node(before: Option<&NodeView>, after: Option<&NodeView>) -> Option<String> {
    match (before, after) {
        (Some(_), None) => Some("Node deleted".to_string()),
        (None, None) => None,
        (None, Some(after)) => Some(match after.ready {
            Some(true) => "Node registered, Ready".to_string(),
            _ => "Node registered".to_string(),
        }),
        (Some(before), Some(after)) => {
            let new_boot = !before.boot_id.is_empty() && before.boot_id != after.boot_id;
            match (before.ready, after.ready) {
                (Some(true), Some(false)) => {
                    Some("NotReady (no heartbeat: node-lifecycle controller)".to_string())
                }
                (was, Some(true)) if was != Some(true) => Some(if new_boot {
                    "Ready (new boot ID)".to_string()
                } else {
                    "Ready".to_string()
                }),
                _ if new_boot => Some("new boot ID".to_string()),
                _ => None,
            }
        }
    }
}

fn describe_attachment(
    before: Option<&AttachmentView>,
    after: Option<&AttachmentView>,
) -> Option<String> {
    match (before, after) {
        (None, None) => None,
        (Some(before), None) => Some(format!(
            "volume {}: detached from {}",
            before.volume, before.node
        )),
        (before, Some(after)) => {
            let volume = &after.volume;
            let node = &after.node;
            if after.deleting {
                return (!before.is_some_and(|b| b.deleting))
                    .then(|| format!("volume {volume}: detaching from {node}"));
            }
            if after.attached {
                return (!before.is_some_and(|b| b.attached))
                    .then(|| format!("volume {volume}: attached to {node}"));
            }
            if let Some(error) = &after.attach_error
                && before.and_then(|b| b.attach_error.as_ref()) != Some(error)
            {
                let error: String = error.chars().take(NOTE_CHARS).collect();
                return Some(format!(
                    "volume {volume}: attach to {node} refused ({error})"
                ));
            }
            before
                .is_none()
                .then(|| format!("volume {volume}: attach to {node} requested"))
        }
    }
}

/// The lab host an Event is about: the regarded object when it is a host's Node or
/// BareMetalHost (named as their Node in the lab), else the first host its note names.
pub fn event_host(
    regarding_kind: &str,
    regarding_name: &str,
    note: &str,
    hosts: &[&str],
) -> Option<String> {
    if matches!(regarding_kind, "Node" | "BareMetalHost") && hosts.contains(&regarding_name) {
        return Some(regarding_name.to_string());
    }
    if hosts.contains(&regarding_name) {
        return Some(regarding_name.to_string());
    }
    note.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .map(|word| word.trim_end_matches('.'))
        .find(|word| hosts.contains(word))
        .map(str::to_string)
}

/// What the stream saw last, and when its clock started.
pub struct StreamState {
    hosts: Vec<&'static str>,
    origin: Instant,
    pods: BTreeMap<String, PodView>,
    nodes: BTreeMap<String, NodeView>,
    attachments: BTreeMap<String, AttachmentView>,
    /// When each (host, reason) was last said.
    said: BTreeMap<(String, String), Instant>,
    /// Pods deleted from each host since its remediation started.
    deleted_from: BTreeMap<String, usize>,
}

impl StreamState {
    pub fn new(hosts: Vec<&'static str>, now: Instant) -> Self {
        StreamState {
            hosts,
            origin: now,
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            attachments: BTreeMap::new(),
            said: BTreeMap::new(),
            deleted_from: BTreeMap::new(),
        }
    }

    /// The lines for one input, each timed from the last fault.
    pub fn observe(&mut self, input: StreamInput, now: Instant) -> Vec<String> {
        let change = match input {
            StreamInput::Fault { node, action } => {
                // Healing is no new fault: what follows the last one keeps its clock.
                if action != FaultAction::Heal {
                    self.origin = now;
                    self.deleted_from.insert(node.clone(), 0);
                }
                Some(Change::Fault { node, action })
            }
            StreamInput::Event {
                reason,
                regarding_kind,
                regarding_name,
                note,
            } => self.event(reason, &regarding_kind, &regarding_name, note, now),
            StreamInput::Pod {
                name,
                view,
                shown,
                initial,
            } => {
                let before = remember(&mut self.pods, &name, view.clone());
                if let (Some(node), None) = (before.as_ref().and_then(|b| b.node.clone()), &view) {
                    *self.deleted_from.entry(node).or_default() += 1;
                }
                (shown && !(initial && before.is_none())).then_some(Change::Pod {
                    pod: name,
                    before,
                    after: view,
                })
            }
            StreamInput::Node {
                name,
                view,
                initial,
            } => {
                let before = remember(&mut self.nodes, &name, view.clone());
                (!(initial && before.is_none())).then_some(Change::Node {
                    node: name,
                    before,
                    after: view,
                })
            }
            StreamInput::Attachment {
                name,
                view,
                initial,
            } => {
                let before = remember(&mut self.attachments, &name, view.clone());
                (!(initial && before.is_none())).then_some(Change::Attachment {
                    before,
                    after: view,
                })
            }
            StreamInput::Violation(text) => Some(Change::Violation(text)),
        };
        change
            .as_ref()
            .and_then(describe)
            .map(|text| {
                let elapsed = now.saturating_duration_since(self.origin);
                format!("{:>+8.1}s {text}", elapsed.as_secs_f64())
            })
            .into_iter()
            .collect()
    }

    fn event(
        &mut self,
        reason: String,
        regarding_kind: &str,
        regarding_name: &str,
        note: String,
        now: Instant,
    ) -> Option<Change> {
        let host = event_host(regarding_kind, regarding_name, &note, &self.hosts)?;
        let key = (host.clone(), reason.clone());
        if let Some(last) = self.said.get(&key)
            && now.saturating_duration_since(*last) < REPEAT_WINDOW
        {
            return None;
        }
        self.said.insert(key, now);
        if matches!(
            reason.as_str(),
            REMEDIATION_REQUESTED | "RemediationStarted"
        ) {
            self.deleted_from.insert(host.clone(), 0);
        }
        let pods_deleted = self.deleted_from.get(&host).copied().unwrap_or(0);
        Some(Change::Event {
            host,
            reason,
            note,
            pods_deleted,
        })
    }
}

/// Stores `view` (or forgets the object when `None`), returning what was there before.
fn remember<V>(map: &mut BTreeMap<String, V>, name: &str, view: Option<V>) -> Option<V> {
    match view {
        Some(view) => map.insert(name.to_string(), view),
        None => map.remove(name),
    }
}

/// What the stream watches.
pub struct StreamSources {
    pub client: Client,
    /// The namespace of the pods watched.
    pub namespace: &'static str,
    /// The `app` label of the pods shown (the sample StatefulSet's).
    pub shown_app: &'static str,
    pub storage: StorageSim,
    pub hosts: Vec<&'static str>,
}

/// Starts the watch tasks and the printer; they all stop when `stop` fires.
pub fn start(
    sources: StreamSources,
    sender: UnboundedSender<StreamInput>,
    receiver: UnboundedReceiver<StreamInput>,
    stop: CancellationToken,
) -> tokio::task::JoinSet<()> {
    let StreamSources {
        client,
        namespace,
        shown_app,
        storage,
        hosts,
    } = sources;
    let mut tasks = tokio::task::JoinSet::new();
    let started_at = jiff::Timestamp::now();
    tasks.spawn(until(stop.clone(), print(receiver, hosts)));
    tasks.spawn(until(
        stop.clone(),
        watch_events(client.clone(), started_at, sender.clone()),
    ));
    tasks.spawn(until(
        stop.clone(),
        watch_pods(
            client.clone(),
            namespace.to_string(),
            shown_app,
            sender.clone(),
        ),
    ));
    tasks.spawn(until(
        stop.clone(),
        watch_nodes(client.clone(), sender.clone()),
    ));
    tasks.spawn(until(
        stop.clone(),
        watch_attachments(client, sender.clone()),
    ));
    tasks.spawn(until(stop, watch_violations(storage, sender)));
    tasks
}

async fn until(stop: CancellationToken, task: impl std::future::Future<Output = ()>) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = task => {}
    }
}

async fn print(mut receiver: UnboundedReceiver<StreamInput>, hosts: Vec<&'static str>) {
    use std::io::Write;
    let mut state = StreamState::new(hosts, Instant::now());
    while let Some(input) = receiver.recv().await {
        for line in state.observe(input, Instant::now()) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// A watcher's event, reduced: the object and whether it came from a (re)list.
enum Seen<K> {
    Applied(K, bool),
    Deleted(K),
}

/// The objects a watch on `api` sees; watch errors are retried after a pause (the lab's API
/// server may be busy, never gone while the lab runs).
fn seen_objects<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Seen<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, config).filter_map(|event| async move {
        match event {
            Ok(watcher::Event::Apply(object)) => Some(Seen::Applied(object, false)),
            Ok(watcher::Event::InitApply(object)) => Some(Seen::Applied(object, true)),
            Ok(watcher::Event::Delete(object)) => Some(Seen::Deleted(object)),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
            Err(e) => {
                tracing::debug!(error = %e, "lab stream: watch error, retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                None
            }
        }
    })
}

async fn watch_events(
    client: Client,
    started_at: jiff::Timestamp,
    sender: UnboundedSender<StreamInput>,
) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut events = std::pin::pin!(seen_objects(
        Api::<Event>::all(client),
        watcher::Config::default()
    ));
    while let Some(seen_event) = events.next().await {
        let Seen::Applied(event, _) = seen_event else {
            continue;
        };
        let time = event
            .event_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0));
        // Older Events (a relist) and series updates of one already sent are not news.
        if time.is_some_and(|t| t < started_at) {
            continue;
        }
        let Some(uid) = event.metadata.uid.clone() else {
            continue;
        };
        if !seen.insert(uid) {
            continue;
        }
        let regarding = event.regarding.clone().unwrap_or_default();
        let _ = sender.send(StreamInput::Event {
            reason: event.reason.clone().unwrap_or_default(),
            regarding_kind: regarding.kind.unwrap_or_default(),
            regarding_name: regarding.name.unwrap_or_default(),
            note: event.note.clone().unwrap_or_default(),
        });
    }
}

async fn watch_pods(
    client: Client,
    namespace: String,
    shown_app: &'static str,
    sender: UnboundedSender<StreamInput>,
) {
    let mut pods = std::pin::pin!(seen_objects(
        Api::<Pod>::namespaced(client, &namespace),
        watcher::Config::default()
    ));
    while let Some(seen) = pods.next().await {
        let (pod, view, initial) = match seen {
            Seen::Applied(pod, initial) => {
                let view = pod_view(&pod);
                (pod, Some(view), initial)
            }
            Seen::Deleted(pod) => (pod, None, false),
        };
        let shown = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .is_some_and(|app| app == shown_app);
        let _ = sender.send(StreamInput::Pod {
            name: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
            view,
            shown,
            initial,
        });
    }
}

fn pod_view(pod: &Pod) -> PodView {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    PodView {
        node: spec.and_then(|s| s.node_name.clone()),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True"),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        has_volume: spec
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some())),
    }
}

async fn watch_nodes(client: Client, sender: UnboundedSender<StreamInput>) {
    let mut nodes = std::pin::pin!(seen_objects(
        Api::<Node>::all(client),
        watcher::Config::default()
    ));
    while let Some(seen) = nodes.next().await {
        let (name, view, initial) = match seen {
            Seen::Applied(node, initial) => {
                let view = NodeView {
                    ready: hostcycle_sim::node_ready(&node),
                    boot_id: node
                        .status
                        .as_ref()
                        .and_then(|s| s.node_info.as_ref())
                        .map(|i| i.boot_id.clone())
                        .unwrap_or_default(),
                };
                (node.metadata.name, Some(view), initial)
            }
            Seen::Deleted(node) => (node.metadata.name, None, false),
        };
        let _ = sender.send(StreamInput::Node {
            name: name.unwrap_or_default(),
            view,
            initial,
        });
    }
}

async fn watch_attachments(client: Client, sender: UnboundedSender<StreamInput>) {
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    // PV name → its claim, looked up once per volume.
    let mut claims: BTreeMap<String, String> = BTreeMap::new();
    let mut attachments = std::pin::pin!(seen_objects(
        Api::<VolumeAttachment>::all(client),
        watcher::Config::default()
    ));
    while let Some(seen) = attachments.next().await {
        let (attachment, deleted, initial) = match seen {
            Seen::Applied(a, initial) => (a, false, initial),
            Seen::Deleted(a) => (a, true, false),
        };
        let pv = attachment
            .spec
            .source
            .persistent_volume_name
            .clone()
            .unwrap_or_default();
        if !claims.contains_key(&pv)
            && let Ok(Some(volume)) = volumes.get_opt(&pv).await
            && let Some(claim) = volume.spec.and_then(|s| s.claim_ref)
        {
            claims.insert(
                pv.clone(),
                format!(
                    "{}/{}",
                    claim.namespace.unwrap_or_default(),
                    claim.name.unwrap_or_default()
                ),
            );
        }
        let status = attachment.status.as_ref();
        let view = AttachmentView {
            volume: claims.get(&pv).cloned().unwrap_or(pv),
            node: attachment.spec.node_name.clone(),
            attached: status.is_some_and(|s| s.attached),
            deleting: attachment.metadata.deletion_timestamp.is_some(),
            attach_error: status
                .and_then(|s| s.attach_error.as_ref())
                .and_then(|e| e.message.clone()),
        };
        let _ = sender.send(StreamInput::Attachment {
            name: attachment.metadata.name.clone().unwrap_or_default(),
            view: (!deleted).then_some(view),
            initial,
        });
    }
}

/// Sends each new storage violation once (there should be none).
async fn watch_violations(storage: StorageSim, sender: UnboundedSender<StreamInput>) {
    let mut said = BTreeSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for violation in storage.violations() {
            let text = violation.to_string();
            if said.insert(text.clone()) {
                let _ = sender.send(StreamInput::Violation(text));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: Option<&str>, phase: &str, ready: bool, terminating: bool) -> PodView {
        PodView {
            node: node.map(str::to_string),
            phase: phase.into(),
            ready,
            terminating,
            has_volume: true,
        }
    }

    fn node(ready: Option<bool>, boot_id: &str) -> NodeView {
        NodeView {
            ready,
            boot_id: boot_id.into(),
        }
    }

    fn attachment(
        node: &str,
        attached: bool,
        deleting: bool,
        error: Option<&str>,
    ) -> AttachmentView {
        AttachmentView {
            volume: "default/data-db-1".into(),
            node: node.into(),
            attached,
            deleting,
            attach_error: error.map(str::to_string),
        }
    }

    fn event(reason: &str, note: &str, pods_deleted: usize) -> Change {
        Change::Event {
            host: "worker-1".into(),
            reason: reason.into(),
            note: note.into(),
            pods_deleted,
        }
    }

    fn pod_change(before: Option<PodView>, after: Option<PodView>) -> Change {
        Change::Pod {
            pod: "default/db-1".into(),
            before,
            after,
        }
    }

    fn node_change(before: Option<NodeView>, after: Option<NodeView>) -> Change {
        Change::Node {
            node: "worker-1".into(),
            before,
            after,
        }
    }

    #[test]
    fn lines_for_changes() {
        let w1 = Some("worker-1");
        let w2 = Some("worker-2");
        let cases: Vec<(Change, Option<&str>)> = vec![
            (
                Change::Fault {
                    node: "worker-1".into(),
                    action: FaultAction::KillKubelet,
                },
                Some("worker-1: kubelet killed"),
            ),
            (
                Change::Fault {
                    node: "worker-2".into(),
                    action: FaultAction::PowerLoss,
                },
                Some("worker-2: power lost (cut at the BMC emulator)"),
            ),
            (
                event(REMEDIATION_REQUESTED, "Lease stale for 21s", 0),
                Some("worker-1: unhealthy → HostRemediation requested (Lease stale for 21s)"),
            ),
            (
                event("PoweredOff", "host worker-1 is off", 0),
                Some("worker-1: fenced (host off, two BMC readings)"),
            ),
            (
                event("WorkloadsReleased", "", 2),
                Some("worker-1: workloads released (2 pods deleted, volumesInUse cleared)"),
            ),
            (
                event("WorkloadsReleased", "", 1),
                Some("worker-1: workloads released (1 pod deleted, volumesInUse cleared)"),
            ),
            (
                event("RemediationSucceeded", "node worker-1 is back", 0),
                Some("worker-1: back (new boot)"),
            ),
            (
                event(
                    "RepeatedFailure",
                    "node worker-1 failed again 74s after …",
                    0,
                ),
                Some(
                    "worker-1: failed again within an hour of its last recovery: it will be \
                     fenced and left off",
                ),
            ),
            (
                event("HostLeftOff", "host default/worker-1 is left off …", 0),
                Some(
                    "worker-1: left off for a person (kubectl get hr: LeftOff; resume with \
                     spec.strategy.afterRelease: PowerOn)",
                ),
            ),
            (event("SomethingNew", "whatever", 0), None),
            (
                event("PowerOn", "a reason hostcycle uses elsewhere", 0),
                None,
            ),
            // Pods of the StatefulSet.
            (
                pod_change(None, Some(pod(None, "Pending", false, false))),
                Some("default/db-1: created (Pending)"),
            ),
            (
                pod_change(
                    Some(pod(None, "Pending", false, false)),
                    Some(pod(w2, "Pending", false, false)),
                ),
                Some("default/db-1: scheduled to worker-2, waiting for its volume"),
            ),
            (
                pod_change(
                    Some(pod(w2, "Pending", false, false)),
                    Some(pod(w2, "Running", true, false)),
                ),
                Some("default/db-1: Running on worker-2 (volume attached)"),
            ),
            (
                pod_change(
                    Some(pod(w2, "Running", true, false)),
                    Some(pod(w2, "Running", true, false)),
                ),
                None,
            ),
            (
                pod_change(
                    Some(pod(w1, "Running", true, false)),
                    Some(pod(w1, "Running", false, false)),
                ),
                Some("default/db-1: not ready on worker-1 (node unreachable)"),
            ),
            (
                pod_change(
                    Some(pod(w1, "Running", false, false)),
                    Some(pod(w1, "Running", true, false)),
                ),
                Some("default/db-1: ready again on worker-1"),
            ),
            (
                pod_change(
                    Some(pod(w1, "Running", false, false)),
                    Some(pod(w1, "Running", false, true)),
                ),
                Some("default/db-1: terminating on worker-1"),
            ),
            (
                pod_change(
                    Some(pod(w1, "Running", false, true)),
                    Some(pod(w1, "Running", false, true)),
                ),
                None,
            ),
            (
                pod_change(Some(pod(w1, "Running", false, true)), None),
                Some("default/db-1: deleted (was on worker-1)"),
            ),
            // Nodes.
            (
                node_change(Some(node(Some(true), "a")), Some(node(Some(false), "a"))),
                Some("worker-1: NotReady (no heartbeat: node-lifecycle controller)"),
            ),
            (
                node_change(Some(node(Some(false), "a")), Some(node(Some(true), "b"))),
                Some("worker-1: Ready (new boot ID)"),
            ),
            (
                node_change(Some(node(Some(false), "a")), Some(node(Some(true), "a"))),
                Some("worker-1: Ready"),
            ),
            (
                node_change(Some(node(Some(true), "a")), Some(node(Some(true), "a"))),
                None,
            ),
            (
                node_change(Some(node(Some(false), "a")), None),
                Some("worker-1: Node deleted"),
            ),
            // VolumeAttachments.
            (
                Change::Attachment {
                    before: None,
                    after: Some(attachment("worker-2", false, false, None)),
                },
                Some("volume default/data-db-1: attach to worker-2 requested"),
            ),
            (
                Change::Attachment {
                    before: Some(attachment("worker-2", false, false, None)),
                    after: Some(attachment(
                        "worker-2",
                        false,
                        false,
                        Some("attached to worker-1"),
                    )),
                },
                Some("volume default/data-db-1: attach to worker-2 refused (attached to worker-1)"),
            ),
            (
                Change::Attachment {
                    before: Some(attachment("worker-2", false, false, None)),
                    after: Some(attachment("worker-2", true, false, None)),
                },
                Some("volume default/data-db-1: attached to worker-2"),
            ),
            (
                Change::Attachment {
                    before: Some(attachment("worker-1", true, false, None)),
                    after: Some(attachment("worker-1", true, true, None)),
                },
                Some("volume default/data-db-1: detaching from worker-1"),
            ),
            (
                Change::Attachment {
                    before: Some(attachment("worker-1", true, true, None)),
                    after: None,
                },
                Some("volume default/data-db-1: detached from worker-1"),
            ),
            (
                Change::Violation("two writers on volume v".into()),
                Some("STORAGE VIOLATION: two writers on volume v"),
            ),
        ];
        for (change, expected) in cases {
            assert_eq!(describe(&change).as_deref(), expected, "{change:?}");
        }
    }

    #[test]
    fn events_are_tied_to_hosts() {
        let hosts = ["worker-0", "worker-1", "worker-10"];
        let cases = [
            ("Node", "worker-1", "", Some("worker-1")),
            ("BareMetalHost", "worker-0", "", Some("worker-0")),
            ("HostRemediation", "worker-1", "", Some("worker-1")),
            (
                "HostRemediation",
                "req-abc",
                "host worker-10 is off (two BMC readings)",
                Some("worker-10"),
            ),
            (
                "HostRemediation",
                "req-abc",
                "node worker-1.",
                Some("worker-1"),
            ),
            ("HostRemediation", "req-abc", "node worker-1x", None),
            ("HostHealthCheck", "workers", "nothing about a host", None),
        ];
        for (kind, name, note, expected) in cases {
            assert_eq!(
                event_host(kind, name, note, &hosts).as_deref(),
                expected,
                "{kind} {name} {note:?}"
            );
        }
    }

    #[test]
    fn the_clock_restarts_at_each_fault_and_copies_are_said_once() {
        let start = Instant::now();
        let mut state = StreamState::new(vec!["worker-1", "worker-2"], start);
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        let event = |kind: &str, reason: &str| StreamInput::Event {
            reason: reason.into(),
            regarding_kind: kind.into(),
            regarding_name: "worker-1".into(),
            note: String::new(),
        };
        let pod = |node: &str, view: Option<PodView>| StreamInput::Pod {
            name: format!("default/{node}-pod"),
            view,
            shown: false,
            initial: false,
        };
        // An initial listing is remembered, not said.
        let initial = StreamInput::Pod {
            name: "default/db-1".into(),
            view: Some(pod_view_running("worker-1")),
            shown: true,
            initial: true,
        };
        assert!(state.observe(initial, at(1.0)).is_empty());
        assert_eq!(
            state.observe(
                StreamInput::Fault {
                    node: "worker-1".into(),
                    action: FaultAction::KillKubelet
                },
                at(10.0)
            ),
            ["    +0.0s worker-1: kubelet killed"]
        );
        assert_eq!(
            state.observe(event("Node", "RemediationStarted"), at(31.25)),
            ["   +21.2s worker-1: remediation started, power-off requested"]
        );
        // The same Event on the BareMetalHost: a copy.
        assert!(
            state
                .observe(event("BareMetalHost", "RemediationStarted"), at(31.3))
                .is_empty()
        );
        // Two pods leave worker-1 (one not shown), one leaves worker-2.
        let _ = state.observe(
            pod("worker-1", Some(pod_view_running("worker-1"))),
            at(32.0),
        );
        let _ = state.observe(
            pod("worker-2", Some(pod_view_running("worker-2"))),
            at(32.0),
        );
        assert!(state.observe(pod("worker-1", None), at(33.0)).is_empty());
        assert!(state.observe(pod("worker-2", None), at(33.0)).is_empty());
        assert_eq!(
            state.observe(
                StreamInput::Pod {
                    name: "default/db-1".into(),
                    view: None,
                    shown: true,
                    initial: false
                },
                at(33.5)
            ),
            ["   +23.5s default/db-1: deleted (was on worker-1)"]
        );
        assert_eq!(
            state.observe(event("Node", "WorkloadsReleased"), at(34.0)),
            ["   +24.0s worker-1: workloads released (2 pods deleted, volumesInUse cleared)"]
        );
        // Healing another host keeps the clock of the fault.
        assert_eq!(
            state.observe(
                StreamInput::Fault {
                    node: "worker-2".into(),
                    action: FaultAction::Heal
                },
                at(35.0)
            ),
            ["   +25.0s worker-2: kubelet healed"]
        );
    }

    fn pod_view_running(node: &str) -> PodView {
        PodView {
            node: Some(node.into()),
            phase: "Running".into(),
            ready: true,
            terminating: false,
            has_volume: true,
        }
    }
}
