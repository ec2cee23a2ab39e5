//! The queue's loop: observe (the cluster view's caches) → decide (`hostcycle_core::queue`) →
//! record (entry status, write-ahead) → act (cordon, workers, host annotation, uncordon,
//! removal).
//!
//! It wakes on every relevant change — an entry or the queue changed, a Node's readiness,
//! cordon, boot ID or volumes changed, a host's power changed, a worker reported (drain
//! finished, boot confirmed) — and at the next deadline (backoff expiry, drain or boot
//! timeout), with a periodic resync as a safety net.

use crate::backoff::RETRY_SOON;
use crate::cluster::errors::{is_conflict, is_not_found};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hostcycle_api::queue::{
    EntryPhase, HostReference, REBOOT_QUEUE_NAME, RebootMethod, RebootProgress, RebootQueue,
    RebootQueueEntry, RebootQueueEntryStatus, RebootQueueSpec, RebootQueueStatus,
};
use hostcycle_api::reasons::{queue_condition, queue_event_reason as reason};
use hostcycle_api::{BareMetalHost, REBOOT_ANNOTATION};
use hostcycle_core::conditions::set_condition;
use hostcycle_core::queue::address::unsafe_address_refusal;
use hostcycle_core::queue::drain::{drain_deadline, next_backoff};
use hostcycle_core::queue::reboot::{
    AfterDrain, BmcRebootStep, COMMAND_MARKER_ANNOTATION, CancelStep, REQUEST_MARKER_ANNOTATION,
    RebootCommandStep, after_drain, bmc_reboot_step, boot_deadline, boot_overdue, cancel_step,
    reboot_command_step,
};
use hostcycle_core::queue::{
    DequeueReason, EntryView, Plan, QueueConfig, QueueNodeView, QueueSnapshot, RebootTarget, plan,
    resolve_method,
};
use hostcycle_core::time::{add, elapsed, wire_precision};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::command::{self, CommandJob};
use super::cordon;
use super::drain::{self, DrainJob};
use super::eviction::Evictor;
use super::observe::{host_view, reboot_targets};
use super::{QueueControllerConfig, Report, ReportKind, Shared};
use crate::cluster::objects::{
    MachineObject, binding_index, host_reference, nodes_being_remediated,
};
use crate::cluster::{ClusterView, Kinds};
use crate::events::{EventPublisher, EventSink, node_ref};
use crate::interest::{self, HostInterest};
use crate::leader::LeaderGate;
use crate::metrics::{Metrics, NodePhaseLabels, PhaseLabels, ReasonLabels};
use hostcycle_api::reasons::EventType;

const FIELD_MANAGER: &str = "hostcycle-reboot-queue";
/// Waiting-message writes sent at once.
const MESSAGE_WRITES_IN_FLIGHT: usize = 16;

/// The caches the loop decides from (the view's).
struct Stores {
    entries: Store<RebootQueueEntry>,
    queues: Store<RebootQueue>,
    nodes: Store<Node>,
    hosts: Store<BareMetalHost>,
    machines: Vec<(kube::discovery::ApiResource, Store<DynamicObject>)>,
    /// Remediation requests: a node being remediated is never drained or rebooted.
    remediations: Store<hostcycle_api::remediation::HostRemediation>,
    /// The hosts whose changes wake the loop: the reboot targets of queued nodes.
    host_interest: HostInterest,
}

/// A worker task for one entry.
struct Worker {
    kind: WorkerKind,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerKind {
    Drain,
    Command,
}

/// The reboot queue controller, subscribed to the view at once (before the view's watches
/// start); the returned future runs it until `shutdown` fires: it waits for the caches, then
/// runs the loop once `leading` opens.
pub fn run(
    view: &ClusterView,
    config: QueueControllerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    leading: LeaderGate,
    shutdown: CancellationToken,
    synced: impl FnOnce() + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let client = view.client().clone();
    let wake = Arc::new(Notify::new());
    let stores = subscribe(view, &wake);
    let listed = view.listed(Kinds::LOOPS);
    async move {
        let evictor = loop {
            match Evictor::discover(client.clone()).await {
                Ok(e) => break e,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot discover the Eviction API version; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
            }
        };
        tracing::info!(
            eviction = evictor.api_version(),
            "reboot queue controller starting"
        );
        let (events, event_task) = EventSink::start(
            EventPublisher::new(client.clone(), "hostcycle.io/reboot-queue", identity),
            "RebootQueue",
        );
        let shared = Arc::new(Shared {
            client: client.clone(),
            metrics,
            evictor,
            events,
        });
        let mut controller = Controller::new(shared.clone(), stores, config, shutdown.clone());
        controller
            .run(wake, leading, shutdown, listed, synced)
            .await;
        // Let the last Events go out, briefly.
        drop(controller);
        drop(shared);
        let _ = tokio::time::timeout(Duration::from_secs(2), event_task).await;
    }
}

/// Subscribes to every kind the loop reads; every relevant change wakes it.
fn subscribe(view: &ClusterView, wake: &Arc<Notify>) -> Stores {
    view.entries.wake_on(wake.clone(), |_| true);
    view.queues.wake_on(wake.clone(), |_| true);

    // Nodes change every heartbeat; wake only when something the queue reads changed.
    let mut fingerprints: HashMap<String, u64> = HashMap::new();
    view.nodes.wake_on(wake.clone(), move |node: &Node| {
        let print = node_fingerprint(node);
        fingerprints.insert(node.name_any(), print) != Some(print)
    });

    let host_interest = HostInterest::default();
    let wanted = host_interest.clone();
    view.hosts
        .wake_on(wake.clone(), move |host: &BareMetalHost| wanted.wants(host));

    for (_, machines) in &view.machines {
        machines.wake_on(wake.clone(), |_| true);
    }
    view.remediations.wake_on(wake.clone(), |_| true);
    Stores {
        entries: view.entries.store().clone(),
        queues: view.queues.store().clone(),
        nodes: view.nodes.store().clone(),
        hosts: view.hosts.store().clone(),
        machines: view
            .machines
            .iter()
            .map(|(resource, feed)| (resource.clone(), feed.store().clone()))
            .collect(),
        remediations: view.remediations.store().clone(),
        host_interest,
    }
}

/// What about a Node the queue reads: readiness, cordon, role, boot ID, volumes.
fn node_fingerprint(node: &Node) -> u64 {
    let view = QueueNodeView::from_node(node);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    view.ready.hash(&mut h);
    view.api_server.hash(&mut h);
    view.unschedulable.hash(&mut h);
    view.cordoned_by_queue.hash(&mut h);
    view.boot_id.hash(&mut h);
    view.volumes_in_use.hash(&mut h);
    // A heartbeat matters only to a node whose boot is awaited; a change of its Ready
    // transition (or the first heartbeat after a boot) shows up in these.
    view.ready_heartbeat
        .map(|t| t.as_second() / 60)
        .hash(&mut h);
    h.finish()
}

struct Controller {
    shared: Arc<Shared>,
    stores: Stores,
    config: QueueControllerConfig,
    /// Objects as the loop last wrote them: newer than the cache until the watch catches up.
    written: HashMap<String, RebootQueueEntry>,
    /// UIDs the loop deleted, hidden until the cache drops them.
    deleted: HashSet<String>,
    workers: HashMap<String, Worker>,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports_rx: mpsc::UnboundedReceiver<Report>,
    last_queue_status: Option<RebootQueueStatus>,
    node_phase_series: HashSet<NodePhaseLabels>,
    /// Set by a failed write: look again soon.
    retry_soon: bool,
    /// The hosts the last snapshot resolved queued nodes to, and whether one had none.
    targeted_hosts: (HashSet<String>, bool),
    /// Cancelled when leadership ends or the process stops: every worker's token is a child,
    /// so drains and commands stop at once, not when the loop gets to them.
    work: CancellationToken,
    /// When command markers of entries that are gone were last looked for.
    last_marker_sweep: Option<tokio::time::Instant>,
}

impl Controller {
    fn new(
        shared: Arc<Shared>,
        stores: Stores,
        config: QueueControllerConfig,
        work: CancellationToken,
    ) -> Self {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        Controller {
            shared,
            stores,
            config,
            written: HashMap::new(),
            deleted: HashSet::new(),
            workers: HashMap::new(),
            reports_tx,
            reports_rx,
            last_queue_status: None,
            node_phase_series: HashSet::new(),
            retry_soon: false,
            targeted_hosts: (HashSet::new(), true),
            work,
            last_marker_sweep: None,
        }
    }

    async fn run(
        &mut self,
        wake: Arc<Notify>,
        leading: LeaderGate,
        shutdown: CancellationToken,
        listed: impl Future<Output = ()>,
        synced: impl FnOnce(),
    ) {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = listed => {}
        }
        tracing::info!("reboot queue caches synced");
        synced();
        // A standby replica keeps its caches warm and stops here until it leads.
        if !leading.wait_to_lead(&shutdown).await {
            return;
        }
        tracing::info!("leading: the reboot queue loop starts");
        self.ensure_queue_object().await;
        self.shared.metrics.queue.running.set(1);
        let mut next = tokio::time::Instant::now();
        let mut reports = Vec::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = wake.notified() => {}
                report = self.reports_rx.recv() => {
                    if let Some(r) = report { reports.push(r); }
                }
                _ = tokio::time::sleep_until(next) => {}
            }
            let wait = self.pass(std::mem::take(&mut reports)).await;
            let (hosts, unresolved) = std::mem::take(&mut self.targeted_hosts);
            self.stores.host_interest.set(hosts, unresolved, &wake);
            next = hostcycle_bmc::deadline::deadline_after(tokio::time::Instant::now(), wait);
        }
        for (_, worker) in self.workers.drain() {
            worker.cancel.cancel();
            worker.handle.abort();
        }
        self.shared.metrics.queue.running.set(0);
    }

    /// Creates the `default` RebootQueue (empty spec: every default) if it is missing, so
    /// `kubectl get rq` shows the queue's status.
    async fn ensure_queue_object(&self) {
        let api: Api<RebootQueue> = Api::all(self.shared.client.clone());
        let queue = RebootQueue::new(REBOOT_QUEUE_NAME, RebootQueueSpec::default());
        match api.create(&PostParams::default(), &queue).await {
            Ok(_) => tracing::info!("created RebootQueue default with the default settings"),
            Err(e) if is_conflict(&e) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot create RebootQueue default; its status stays unwritten until it exists")
            }
        }
    }

    /// One round: reports, then the plan, then each entry's step. Returns how long to sleep
    /// at most before the next round.
    async fn pass(&mut self, mut reports: Vec<Report>) -> Duration {
        self.retry_soon = false;
        // Reports first: a finished worker's final report was sent before it finished.
        let finished: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| w.handle.is_finished())
            .map(|(uid, _)| uid.clone())
            .collect();
        while let Ok(r) = self.reports_rx.try_recv() {
            reports.push(r);
        }
        for uid in finished {
            self.workers.remove(&uid);
        }
        let now = Timestamp::now();
        let config = self.queue_config();
        for report in reports {
            self.handle_report(report, &config, now).await;
        }

        let now = Timestamp::now();
        let snapshot = self.snapshot(&config);
        let plan = plan(&snapshot, now);
        self.act(&snapshot, &plan, now).await;
        self.publish_queue_status(&snapshot, &plan, now).await;
        if self
            .last_marker_sweep
            .is_none_or(|at| at.elapsed() >= self.config.resync)
        {
            self.last_marker_sweep = Some(tokio::time::Instant::now());
            self.sweep_command_markers().await;
        }
        self.next_wake(&snapshot, now)
    }

    fn queue_config(&self) -> QueueConfig {
        self.stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .map(|q| QueueConfig::from_spec(&q.spec))
            .unwrap_or_default()
    }

    /// Entries as the loop knows them: the cache, overlaid with its own newer writes.
    fn entries(&mut self) -> Vec<RebootQueueEntry> {
        let cached = self.stores.entries.state();
        let cached_uids: HashSet<String> = cached.iter().filter_map(|e| e.uid()).collect();
        self.deleted.retain(|uid| cached_uids.contains(uid));
        let mut out = Vec::new();
        for entry in cached {
            if entry.uid().is_some_and(|u| self.deleted.contains(&u)) {
                continue;
            }
            let name = entry.name_any();
            match self.written.get(&name) {
                Some(mine) if mine.uid() == entry.uid() && newer(mine, &entry) => {
                    out.push(mine.clone())
                }
                _ => {
                    self.written.remove(&name);
                    out.push((*entry).clone());
                }
            }
        }
        out
    }

    fn entry(&mut self, name: &str, uid: &str) -> Option<RebootQueueEntry> {
        self.entries()
            .into_iter()
            .find(|e| e.name_any() == name && e.uid().as_deref() == Some(uid))
    }

    fn snapshot(&mut self, config: &QueueConfig) -> QueueSnapshot {
        let entries = self.entries();
        let nodes: Vec<Node> = self
            .stores
            .nodes
            .state()
            .iter()
            .map(|n| (**n).clone())
            .collect();
        let mut snapshot = QueueSnapshot::from_objects(None, &nodes, &entries);
        snapshot.config = config.clone();
        let machine_objects: Vec<MachineObject> = self
            .stores
            .machines
            .iter()
            .flat_map(|(resource, s)| {
                s.state().into_iter().map(|m| MachineObject {
                    object: m,
                    resource: resource.clone(),
                })
            })
            .collect();
        // Bindings only for a queue with entries (an idle queue reads no host).
        if !entries.is_empty() {
            let hosts = self.stores.hosts.state();
            let index = binding_index(
                hosts.iter().map(|h| &**h),
                machine_objects.iter().map(|m| &*m.object),
                nodes.iter(),
            );
            let by_ref: HashMap<HostReference, Arc<BareMetalHost>> =
                hosts.into_iter().map(|h| (host_reference(&h), h)).collect();
            snapshot.reboot_targets = reboot_targets(
                &index,
                entries.iter().map(|e| e.spec.node.as_str()),
                &by_ref,
            );
        }
        let mut targeted = HashSet::new();
        let mut unresolved = false;
        for target in snapshot.reboot_targets.values() {
            match target {
                RebootTarget::Host(host) | RebootTarget::UnusableHost { host, .. } => {
                    targeted.insert(interest::key(&host.namespace, &host.name));
                }
                // A host may appear, or the doubt be resolved, with any host's change.
                RebootTarget::NoHost | RebootTarget::Refused { .. } => unresolved = true,
            }
        }
        // The host a reboot was started on, should the node's mapping change meanwhile.
        for host in entries
            .iter()
            .filter_map(|e| e.status.as_ref()?.reboot.as_ref()?.host.as_ref())
        {
            targeted.insert(interest::key(&host.namespace, &host.name));
        }
        self.targeted_hosts = (targeted, unresolved);
        let requests: Vec<_> = self
            .stores
            .remediations
            .state()
            .iter()
            .map(|r| (**r).clone())
            .collect();
        snapshot.being_remediated = nodes_being_remediated(&machine_objects, &requests)
            .into_iter()
            .collect();
        snapshot
    }

    // ----- reports -------------------------------------------------------------------

    async fn handle_report(&mut self, report: Report, config: &QueueConfig, now: Timestamp) {
        let Some(entry) = self.entry(&report.entry, &report.entry_uid) else {
            if let ReportKind::RecordCommandAttempt { ack, .. } = report.kind {
                let _ = ack.send(false);
            }
            return;
        };
        let view = EntryView::from_entry(&entry);
        match report.kind {
            ReportKind::DrainProgress { message } => {
                if view.phase == EntryPhase::Draining && !view.cancel {
                    self.set_message(&entry, &format!("draining: {message}"))
                        .await;
                }
            }
            ReportKind::DrainFailed { reason } => {
                if view.phase == EntryPhase::Draining {
                    let kind = backoff_kind(&reason);
                    self.back_off(&entry, config, now, &reason, kind).await;
                }
            }
            ReportKind::DrainCompleted => {
                if view.phase == EntryPhase::Draining && !view.cancel {
                    self.start_reboot(&entry, config, now).await;
                }
            }
            ReportKind::RecordCommandAttempt {
                attempt,
                previous_error,
                ack,
            } => {
                let ok = view.phase == EntryPhase::Rebooting && !view.cancel && {
                    let message = format!(
                        "reboot command failed ({previous_error}); running attempt {attempt}"
                    );
                    self.write(&entry, |s| {
                        if let Some(r) = s.reboot.as_mut() {
                            r.command_attempts = attempt;
                        }
                        s.message = message;
                    })
                    .await
                    .is_some()
                };
                let _ = ack.send(ok);
            }
            ReportKind::RebootCommandSucceeded => {
                if view.phase == EntryPhase::Rebooting {
                    self.set_message(
                        &entry,
                        "reboot command succeeded; waiting for the boot check to print true",
                    )
                    .await;
                }
            }
            ReportKind::RebootCommandGaveUp { message } => {
                if view.phase == EntryPhase::Rebooting {
                    let text = format!(
                        "the reboot command failed ({message}); boot checks go on; after \
                         bootTimeoutSeconds cancel the entry to give up (delete it to give up \
                         at once)"
                    );
                    let failure = message.clone();
                    if let Some(written) = self
                        .write(&entry, |s| {
                            if let Some(r) = s.reboot.as_mut() {
                                r.command_failure = Some(failure);
                            }
                            s.message = text.clone();
                        })
                        .await
                    {
                        self.event_entry(
                            &written,
                            EventType::Warning,
                            reason::REBOOT_COMMAND_FAILED,
                            &text,
                        )
                        .await;
                    }
                }
            }
            ReportKind::BootCheck { booted, detail } => {
                if view.phase != EntryPhase::Rebooting {
                    return;
                }
                if booted {
                    // Also a cancelled entry waiting for its cycle: done, now it may go.
                    self.complete(&entry, now, &detail).await;
                } else if !view.cancel {
                    self.set_message(&entry, &format!("rebooting: {detail}"))
                        .await;
                }
            }
        }
    }

    // ----- acting on the plan -------------------------------------------------------------

    async fn act(&mut self, snapshot: &QueueSnapshot, plan: &Plan, now: Timestamp) {
        let by_name: HashMap<String, RebootQueueEntry> = self
            .entries()
            .into_iter()
            .map(|e| (e.name_any(), e))
            .collect();

        for dequeue in &plan.dequeue {
            if let Some(entry) = by_name.get(&dequeue.entry.name) {
                self.dequeue(entry, &dequeue.reason, now).await;
            }
        }
        for stopped in &plan.stop_draining {
            if let Some(entry) = by_name.get(&stopped.name) {
                self.stop_worker(entry);
                let text = if snapshot.being_remediated.contains(&entry.spec.node) {
                    "drain stopped: the node is being remediated; it is drained again from the \
                     start once the remediation is over"
                } else {
                    "drain stopped: the reboot queue was disabled; this node is drained again \
                     from the start when the queue is enabled"
                };
                if let Some(written) = self
                    .write(entry, |s| {
                        s.phase = Some(EntryPhase::Queued);
                        s.last_transition_time = Some(now);
                        s.message = text.into();
                    })
                    .await
                {
                    self.event_entry(&written, EventType::Normal, reason::DRAIN_STOPPED, text)
                        .await;
                }
            }
        }
        for start in &plan.start_draining {
            if let Some(entry) = by_name.get(&start.name) {
                self.start_drain(entry, snapshot, now).await;
            }
        }
        for node in &plan.uncordon {
            self.uncordon(node, "no reboot queue entry is draining or rebooting it")
                .await;
        }
        // Cancelled mid-reboot: withdrawn (or removed) now, or kept cordoned until booted.
        let mut cancel_notes: HashMap<String, String> = HashMap::new();
        for cancelled in &plan.cancel_rebooting {
            if let Some(entry) = by_name.get(&cancelled.name)
                && let Some(note) = self.cancel_rebooting(entry, now).await
            {
                cancel_notes.insert(cancelled.name.clone(), note);
            }
        }
        for (reference, phase) in &plan.in_progress {
            let Some(entry) = by_name.get(&reference.name) else {
                continue;
            };
            let cancelled = plan
                .cancel_rebooting
                .iter()
                .any(|c| c.name == reference.name);
            match phase {
                EntryPhase::Draining => self.follow_drain(entry, snapshot, now).await,
                // A cancelled entry not kept for its cycle was removed above.
                EntryPhase::Rebooting if cancelled => {
                    if let Some(note) = cancel_notes.get(&reference.name) {
                        self.follow_reboot(entry, snapshot, now, Some(note)).await
                    }
                }
                EntryPhase::Rebooting => self.follow_reboot(entry, snapshot, now, None).await,
                _ => {}
            }
        }
        // Waiting messages: many entries may need one at once (a burst of `rq add`), and
        // none of them is a step of a reboot, so they are written concurrently.
        // An entry whose node cannot be rebooted (a binding in doubt names both candidates, or
        // an address the commands must not get) also says so with the `Blocked` condition and
        // a Warning, once per distinct reason.
        let mut messages = Vec::new();
        let mut warnings = Vec::new();
        for waiting in &plan.waiting {
            if let Some(entry) = by_name.get(&waiting.entry.name) {
                let text = format!("waiting: {}", waiting.reason.summary());
                let status = entry.status.clone().unwrap_or_default();
                let blocking = waiting.reason.blocked();
                let blocked = blocking.is_some();
                let was_blocked = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == queue_condition::BLOCKED && c.status == "True");
                if status.message != text || status.phase.is_none() || blocked != was_blocked {
                    let created = entry.meta().creation_timestamp.as_ref().map(|t| t.0);
                    if let Some(blocking) = blocking {
                        warnings.push((
                            entry.clone(),
                            blocking.event_reason,
                            waiting.reason.to_string(),
                        ));
                    }
                    let condition = blocking.map(|blocking| Condition {
                        type_: queue_condition::BLOCKED.into(),
                        status: "True".into(),
                        reason: blocking.condition_reason.into(),
                        message: bounded_message(&waiting.reason.to_string()),
                        last_transition_time: Time(wire_precision(now)),
                        observed_generation: entry.metadata.generation,
                    });
                    messages.push(self.with_status(entry, |s| {
                        if s.phase.is_none() {
                            s.phase = Some(EntryPhase::Queued);
                            s.last_transition_time = Some(created.unwrap_or(now));
                        }
                        s.message = text;
                        match condition {
                            Some(condition) => set_condition(&mut s.conditions, condition),
                            None => s.conditions.retain(|c| c.type_ != queue_condition::BLOCKED),
                        }
                    }));
                }
            }
        }
        for (entry, event_reason, why) in warnings {
            self.event_entry(
                &entry,
                EventType::Warning,
                event_reason,
                &format!("node {} cannot be rebooted now: {why}", entry.spec.node),
            )
            .await;
        }
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let results: Vec<_> = futures::stream::iter(messages.into_iter().map(|next| {
            let api = api.clone();
            async move { (replace_status(&api, &next).await, next) }
        }))
        .buffer_unordered(MESSAGE_WRITES_IN_FLIGHT)
        .collect()
        .await;
        for (result, next) in results {
            self.record_write(&next, result);
        }
        // Workers whose entry is gone or no longer in their phase.
        // A cancelled entry keeps only the boot checks of a command that ran.
        let wanted: HashMap<String, WorkerKind> = self
            .entries()
            .iter()
            .filter(|e| !e.spec.cancel || e.phase() == EntryPhase::Rebooting)
            .filter_map(|e| {
                let kind = match e.phase() {
                    EntryPhase::Draining => WorkerKind::Drain,
                    EntryPhase::Rebooting
                        if e.status
                            .as_ref()
                            .and_then(|s| s.reboot.as_ref())
                            .is_some_and(|r| r.method == RebootMethod::Command) =>
                    {
                        WorkerKind::Command
                    }
                    _ => return None,
                };
                Some((e.uid()?, kind))
            })
            .collect();
        let stale: Vec<String> = self
            .workers
            .iter()
            .filter(|(uid, w)| wanted.get(*uid) != Some(&w.kind))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            if let Some(w) = self.workers.remove(&uid) {
                w.cancel.cancel();
            }
        }
    }

    async fn dequeue(&mut self, entry: &RebootQueueEntry, why: &DequeueReason, now: Timestamp) {
        self.stop_worker(entry);
        if *why == DequeueReason::NodeNotFound {
            // The cache may lag a Node created a moment ago: ask the API server.
            let nodes: Api<Node> = Api::all(self.shared.client.clone());
            match nodes.get_opt(&entry.spec.node).await {
                Ok(None) => {}
                Ok(Some(_)) => return,
                Err(e) => {
                    tracing::warn!(node = %entry.spec.node, error = %e, "cannot confirm the node is gone");
                    self.retry_soon = true;
                    return;
                }
            }
        }
        let mut current = entry.clone();
        if *why == DequeueReason::Cancelled && entry.phase() != EntryPhase::Cancelled {
            match self
                .write(entry, |s| {
                    s.phase = Some(EntryPhase::Cancelled);
                    s.last_transition_time = Some(now);
                    s.message = "cancelled; removing the entry".into();
                })
                .await
            {
                Some(written) => current = written,
                None => return,
            }
        }
        let (kind, event_reason, label) = match why {
            DequeueReason::Cancelled => (EventType::Normal, reason::CANCELLED, "Cancelled"),
            DequeueReason::NodeNotFound => {
                (EventType::Warning, reason::NODE_NOT_FOUND, "NodeNotFound")
            }
            DequeueReason::Duplicate { .. } => {
                (EventType::Warning, reason::DUPLICATE_ENTRY, "Duplicate")
            }
        };
        let note = match (why, entry.phase()) {
            (DequeueReason::Cancelled, EntryPhase::Rebooting) => format!(
                "entry {} for node {} cancelled while rebooting, before any power cycle began \
                 or after bootTimeoutSeconds; the node is uncordoned",
                entry.spec.index, entry.spec.node
            ),
            (DequeueReason::Cancelled, EntryPhase::Draining) => format!(
                "entry {} for node {} cancelled while draining; the node is uncordoned and not \
                 rebooted",
                entry.spec.index, entry.spec.node
            ),
            _ => format!(
                "entry {} for node {} removed: {why}",
                entry.spec.index, entry.spec.node
            ),
        };
        if self.delete(&current).await {
            self.clear_host_marker(&current).await;
            self.event_entry(&current, kind, event_reason, &note).await;
            self.shared
                .metrics
                .queue
                .dequeued
                .get_or_create(&ReasonLabels {
                    reason: label.into(),
                })
                .inc();
        }
    }

    async fn start_drain(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        now: Timestamp,
    ) {
        let written = self
            .write(entry, |s| {
                s.phase = Some(EntryPhase::Draining);
                s.last_transition_time = Some(now);
                s.message = "draining: cordoning the node".into();
                s.reboot = None;
                s.conditions.clear();
            })
            .await;
        let Some(written) = written else { return };
        let node = &entry.spec.node;
        let text = format!(
            "cordoning and draining node {node} (entry {}, attempt {})",
            entry.spec.index,
            written
                .status
                .as_ref()
                .map(|s| s.drain_backoff_count + 1)
                .unwrap_or(1)
        );
        self.event_entry(&written, EventType::Normal, reason::DRAIN_STARTED, &text)
            .await;
        self.shared
            .publish(
                &node_ref(node),
                EventType::Normal,
                reason::DRAIN_STARTED,
                &text,
            )
            .await;
        self.spawn_drain(&written, snapshot);
    }

    /// A drain in progress: its worker runs, and its timeout is enforced here.
    async fn follow_drain(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        now: Timestamp,
    ) {
        let view = EntryView::from_entry(entry);
        let timeout = snapshot.config.eviction_timeout;
        let since = view.last_transition.unwrap_or(now);
        if elapsed(since, now) >= timeout {
            let last = view.message.trim_start_matches("draining: ").to_string();
            let text = format!(
                "drain timed out after {}s (evictionTimeoutSeconds): {last}",
                timeout.as_secs()
            );
            self.stop_worker(entry);
            self.back_off(entry, &snapshot.config, now, &text, "timeout")
                .await;
            return;
        }
        let uid = entry.uid().unwrap_or_default();
        if !self.workers.contains_key(&uid) {
            self.spawn_drain(entry, snapshot);
        }
    }

    fn spawn_drain(&mut self, entry: &RebootQueueEntry, snapshot: &QueueSnapshot) {
        let Some(uid) = entry.uid() else { return };
        if self.workers.contains_key(&uid) {
            return;
        }
        let cancel = self.work.child_token();
        let job = DrainJob {
            entry: entry.name_any(),
            entry_uid: uid.clone(),
            node: entry.spec.node.clone(),
            config: snapshot.config.clone(),
        };
        // Every line the worker logs names its node and entry.
        let span = tracing::info_span!("drain", node = %job.node, entry = %job.entry);
        let handle = tokio::spawn(
            drain::run(
                self.shared.clone(),
                self.stores.nodes.clone(),
                job,
                self.reports_tx.clone(),
                cancel.clone(),
            )
            .instrument(span),
        );
        self.workers.insert(
            uid,
            Worker {
                kind: WorkerKind::Drain,
                cancel,
                handle,
            },
        );
    }

    fn stop_worker(&mut self, entry: &RebootQueueEntry) {
        if let Some(w) = entry.uid().and_then(|uid| self.workers.remove(&uid)) {
            w.cancel.cancel();
        }
    }

    async fn back_off(
        &mut self,
        entry: &RebootQueueEntry,
        config: &QueueConfig,
        now: Timestamp,
        why: &str,
        kind: &str,
    ) {
        self.stop_worker(entry);
        let previous = entry
            .status
            .as_ref()
            .map(|s| s.drain_backoff_count)
            .unwrap_or(0);
        let (count, expire) = next_backoff(previous, &config.backoff, now, rand::random::<f64>());
        let text = format!("drain failed ({why}); trying again after {expire} (failure {count})");
        let written = self
            .write(entry, |s| {
                s.phase = Some(EntryPhase::Queued);
                s.last_transition_time = Some(now);
                s.drain_backoff_count = count;
                s.drain_backoff_expire = Some(expire);
                s.last_drain_failure = Some(bounded_message(why));
                s.message = text.clone();
                s.reboot = None;
            })
            .await;
        if let Some(written) = written {
            self.shared
                .metrics
                .queue
                .drain_backoffs
                .get_or_create(&ReasonLabels {
                    reason: kind.into(),
                })
                .inc();
            self.event_entry(&written, EventType::Warning, reason::DRAIN_BACKOFF, &text)
                .await;
            self.shared
                .publish(
                    &node_ref(&entry.spec.node),
                    EventType::Warning,
                    reason::DRAIN_BACKOFF,
                    &text,
                )
                .await;
            // The node is uncordoned by the next plan (no entry is processing it).
            self.retry_soon = true;
        }
    }

    /// The drain is complete: check again that the reboot may start (the queue still
    /// enabled, no remediation started meanwhile), bind the host, record `Rebooting` with
    /// everything a restart needs (write-ahead), then request the reboot.
    async fn start_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        config: &QueueConfig,
        now: Timestamp,
    ) {
        let snapshot = self.snapshot(config);
        let node = &entry.spec.node;
        let target = snapshot
            .reboot_targets
            .get(node)
            .cloned()
            .unwrap_or(RebootTarget::NoHost);
        let method = match after_drain(
            config.enabled,
            snapshot.being_remediated.contains(node),
            resolve_method(&config.reboot, &target),
        ) {
            AfterDrain::Reboot(m) => m,
            AfterDrain::Stop(why) => {
                self.stop_worker(entry);
                if let Some(written) = self
                    .write(entry, |s| {
                        s.phase = Some(EntryPhase::Queued);
                        s.last_transition_time = Some(now);
                        s.message = why.clone();
                    })
                    .await
                {
                    self.event_entry(&written, EventType::Normal, reason::DRAIN_STOPPED, &why)
                        .await;
                }
                // The node is uncordoned by the next plan (no entry is processing it).
                self.retry_soon = true;
                return;
            }
            AfterDrain::Blocked(why) => {
                let text = format!("node {node} cannot be rebooted: {why}");
                self.event_entry(entry, EventType::Warning, reason::REBOOT_BLOCKED, &text)
                    .await;
                self.back_off(entry, config, now, &text, "reboot_blocked")
                    .await;
                return;
            }
        };
        // Checked again at the irreversible step (the plan checked before the drain): the
        // kubelet may have rewritten the address meanwhile.
        if method == RebootMethod::Command
            && let Some(text) = snapshot
                .nodes
                .get(node)
                .and_then(|n| unsafe_address_refusal(node, &n.address))
        {
            self.event_entry(
                entry,
                EventType::Warning,
                reason::UNSAFE_NODE_ADDRESS,
                &text,
            )
            .await;
            self.back_off(entry, config, now, &text, "unsafe_node_address")
                .await;
            return;
        }
        let drained_in = entry
            .status
            .as_ref()
            .and_then(|s| s.last_transition_time)
            .map(|t| elapsed(t, now));
        let mut progress = RebootProgress::new(method);
        progress.boot_id = snapshot.nodes.get(node).and_then(|n| n.boot_id.clone());
        progress.requested_at = Some(now);
        // Bound now, recorded with the transition: every later step acts on this host.
        let bound = match &target {
            RebootTarget::Host(host) => self
                .cached_host(host)
                .map(|h| (host.clone(), h.uid().unwrap_or_default())),
            _ => None,
        };
        if let Some((host, uid)) = &bound {
            progress.host = Some(host.clone());
            progress.host_uid = Some(uid.clone());
        }
        let message = match (&bound, method) {
            (Some((host, _)), RebootMethod::Bmc) => {
                format!("rebooting through BareMetalHost {host}")
            }
            _ => {
                progress.command_attempts = 1;
                format!(
                    "rebooting with the reboot command (attempt 1 of {})",
                    config.reboot.command_retries + 1
                )
            }
        };
        let Some(written) = self
            .write(entry, |s| {
                s.phase = Some(EntryPhase::Rebooting);
                s.last_transition_time = Some(now);
                s.message = message.clone();
                s.reboot = Some(progress.clone());
            })
            .await
        else {
            return;
        };
        // Request first: Events and metrics must not delay the reboot.
        let host = bound.as_ref().and_then(|(host, _)| self.cached_host(host));
        match (method, host) {
            (RebootMethod::Bmc, Some(host)) => self.request_host_reboot(&written, &host).await,
            (RebootMethod::Bmc, None) => self.retry_soon = true,
            (RebootMethod::Command, host) => {
                // The host's power is the command's from now on: its controller must not
                // "correct" it mid-cycle.
                if let Some(host) = &host {
                    self.mark_command_reboot(&written, host).await;
                }
                // Not refused: the address was checked above, in the same snapshot.
                self.spawn_command(&written, &snapshot, Some(1)).await;
            }
        }
        if let Some(d) = drained_in {
            self.shared
                .metrics
                .queue
                .drain_duration
                .observe(d.as_secs_f64());
        }
        self.event_entry(
            &written,
            EventType::Normal,
            reason::DRAIN_COMPLETED,
            &format!("node {node} drained"),
        )
        .await;
        self.event_entry(
            &written,
            EventType::Normal,
            reason::REBOOT_STARTED,
            &message,
        )
        .await;
        self.shared
            .publish(
                &node_ref(node),
                EventType::Normal,
                reason::REBOOT_STARTED,
                &message,
            )
            .await;
    }

    /// Merge-patches a host's metadata (its namespace and name).
    async fn patch_host(
        &self,
        host: &HostReference,
        patch: &serde_json::Value,
    ) -> Result<BareMetalHost, kube::Error> {
        let api: Api<BareMetalHost> = Api::namespaced(self.shared.client.clone(), &host.namespace);
        api.patch(&host.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
    }

    fn cached_host(&self, host: &HostReference) -> Option<Arc<BareMetalHost>> {
        self.stores
            .hosts
            .get(&ObjectRef::new(&host.name).within(&host.namespace))
    }

    /// The host recorded at `Rebooting`, if it is still that host (same uid). A host
    /// re-created under the name is returned too (its view says it was replaced).
    async fn fresh_host(&mut self, host: &HostReference) -> Option<BareMetalHost> {
        let api: Api<BareMetalHost> = Api::namespaced(self.shared.client.clone(), &host.namespace);
        match api.get_opt(&host.name).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(host = %host, error = %e, "cannot read the host; retrying");
                self.retry_soon = true;
                None
            }
        }
    }

    /// A reboot in progress: BMC steps are taken here; a Command worker runs; the boot
    /// timeout is raised once. `cancel_note`: the entry was cancelled but its cycle has
    /// begun; it is followed until the node booted, and its messages say so.
    async fn follow_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        now: Timestamp,
        cancel_note: Option<&String>,
    ) {
        let view = EntryView::from_entry(entry);
        let Some(progress) = view.reboot.clone() else {
            // Rebooting without a record (written by an older version, or by hand): the
            // safest reading is that the reboot may have been requested; wait for a boot.
            self.set_message(
                entry,
                "rebooting: no reboot record; cancel the entry to give up",
            )
            .await;
            return;
        };
        let since = view.last_transition.unwrap_or(now);
        let mut entry = entry.clone();
        if !view.boot_timed_out && boot_overdue(since, now, snapshot.config.reboot.boot_timeout) {
            entry = self.raise_boot_timeout(&entry, snapshot, since).await;
        }
        match progress.method {
            RebootMethod::Command => {
                let run = match reboot_command_step(&progress) {
                    RebootCommandStep::Run { attempt } if cancel_note.is_none() => Some(attempt),
                    _ => None,
                };
                let refused = self.spawn_command(&entry, snapshot, run).await;
                // The refusal stays the message (it is what blocks the entry); alternating
                // messages would repeat its Warning every round.
                if let Some(note) = cancel_note.filter(|_| !refused) {
                    self.set_message(&entry, note).await;
                }
            }
            RebootMethod::Bmc => {
                let host = progress.host.as_ref().and_then(|h| self.cached_host(h));
                let Some(node) = snapshot.nodes.get(&entry.spec.node) else {
                    return;
                };
                let uid = entry.uid().unwrap_or_default();
                let mut step = bmc_reboot_step(
                    &uid,
                    since,
                    &progress,
                    host.as_deref().map(host_view).as_ref(),
                    node,
                    now,
                );
                let mut host = host.map(|h| (*h).clone());
                if step == (BmcRebootStep::Request { record: false }) {
                    // The marker seems missing: asking again would be a second reboot if the
                    // cache lags the first request. Read the host from the API server.
                    host = match &progress.host {
                        Some(h) => self.fresh_host(h).await,
                        None => None,
                    };
                    step = bmc_reboot_step(
                        &uid,
                        since,
                        &progress,
                        host.as_ref().map(host_view).as_ref(),
                        node,
                        now,
                    );
                }
                match step {
                    BmcRebootStep::Request { record } if cancel_note.is_none() => {
                        let mut entry = entry.clone();
                        if record {
                            match self
                                .write(&entry, |s| {
                                    if let Some(r) = s.reboot.as_mut() {
                                        r.requested_at = Some(now);
                                    }
                                })
                                .await
                            {
                                Some(w) => entry = w,
                                None => return,
                            }
                        }
                        if let Some(host) = &host {
                            self.request_host_reboot(&entry, host).await;
                        }
                    }
                    BmcRebootStep::Request { .. } => {}
                    BmcRebootStep::RecordPowerOff { at } => {
                        let text = cancel_note.cloned().unwrap_or_else(|| {
                            "rebooting: the host is powered off; waiting for it to power on".into()
                        });
                        self.write(&entry, |s| {
                            if let Some(r) = s.reboot.as_mut() {
                                r.host_powered_off_at = Some(at);
                            }
                            s.message = text;
                        })
                        .await;
                    }
                    BmcRebootStep::Booted { boot_started } => {
                        let detail = format!(
                            "node {} is Ready after a boot that started at {boot_started}",
                            entry.spec.node
                        );
                        self.complete(&entry, now, &detail).await;
                    }
                    BmcRebootStep::Wait(text) => {
                        let text = match cancel_note {
                            Some(note) => format!("{note}; {text}"),
                            None => format!("rebooting: {text}"),
                        };
                        self.set_message(&entry, &text).await;
                    }
                }
            }
        }
    }

    /// A `Rebooting` entry was cancelled ([`cancel_step`]): withdraws a request whose cycle has
    /// not begun and removes the entry, removes an entry that reached no host, or keeps the
    /// entry (its node cordoned) until the node booted — then returns the note that says so.
    async fn cancel_rebooting(
        &mut self,
        entry: &RebootQueueEntry,
        now: Timestamp,
    ) -> Option<String> {
        let view = EntryView::from_entry(entry);
        let progress = view.reboot.clone()?;
        let uid = entry.uid().unwrap_or_default();
        let cached = progress.host.as_ref().and_then(|h| self.cached_host(h));
        let step = cancel_step(
            &uid,
            &progress,
            cached.as_deref().map(host_view).as_ref(),
            view.boot_timed_out,
        );
        match step {
            CancelStep::WaitForCycle(note) => Some(note),
            CancelStep::Remove => {
                self.dequeue(entry, &DequeueReason::Cancelled, now).await;
                None
            }
            CancelStep::Withdraw => {
                // Decided on the cache: read the host again, and withdraw only from the very
                // version read (its resourceVersion): a power-off the host controller records
                // meanwhile makes the withdrawal fail, and the cycle then runs to its end.
                let host_ref = progress.host.clone()?;
                let fresh = self.fresh_host(&host_ref).await?;
                let step = cancel_step(&uid, &progress, Some(&host_view(&fresh)), false);
                if step != CancelStep::Withdraw {
                    self.retry_soon = true;
                    return None;
                }
                let patch = json!({ "metadata": {
                    "resourceVersion": fresh.resource_version(),
                    "annotations": {
                        REBOOT_ANNOTATION: null,
                        REQUEST_MARKER_ANNOTATION: null,
                    },
                }});
                match self.patch_host(&host_ref, &patch).await {
                    Ok(_) => {
                        let text = format!(
                            "entry {} for node {} cancelled before the power cycle began: the \
                             reboot request was withdrawn from BareMetalHost {host_ref}; the node \
                             is uncordoned and not rebooted",
                            entry.spec.index, entry.spec.node
                        );
                        self.event_entry(entry, EventType::Normal, reason::REBOOT_WITHDRAWN, &text)
                            .await;
                        self.dequeue(entry, &DequeueReason::Cancelled, now).await;
                    }
                    Err(e) => {
                        tracing::debug!(host = %host_ref, error = %e, "reboot request not withdrawn (the host changed meanwhile); deciding again");
                        self.retry_soon = true;
                    }
                }
                None
            }
        }
    }

    async fn raise_boot_timeout(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        since: Timestamp,
    ) -> RebootQueueEntry {
        let timeout = snapshot.config.reboot.boot_timeout;
        let text = format!(
            "node {} has not confirmed a boot {}s (bootTimeoutSeconds) after the reboot began at \
             {since}; the entry keeps waiting and the node stays cordoned; check the host, or \
             cancel the entry",
            entry.spec.node,
            timeout.as_secs()
        );
        let now = Timestamp::now();
        let condition = Condition {
            type_: queue_condition::BOOT_TIMED_OUT.into(),
            status: "True".into(),
            reason: queue_condition::BOOT_NOT_CONFIRMED.into(),
            message: text.clone(),
            last_transition_time: Time(wire_precision(now)),
            observed_generation: entry.metadata.generation,
        };
        match self
            .write(entry, |s| {
                set_condition(&mut s.conditions, condition);
            })
            .await
        {
            Some(written) => {
                self.shared.metrics.queue.boot_timeouts.inc();
                self.event_entry(&written, EventType::Warning, reason::BOOT_TIMED_OUT, &text)
                    .await;
                self.shared
                    .publish(
                        &node_ref(&entry.spec.node),
                        EventType::Warning,
                        reason::BOOT_TIMED_OUT,
                        &text,
                    )
                    .await;
                written
            }
            None => entry.clone(),
        }
    }

    /// Starts the command worker of a rebooting entry, unless its node's address is one the
    /// commands must not get: then nothing runs, the entry's message and a Warning (once per
    /// distinct message) say why, the boot timeout still applies, and `true` is returned.
    async fn spawn_command(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        run_attempt: Option<u32>,
    ) -> bool {
        let Some(uid) = entry.uid() else {
            return false;
        };
        if self.workers.contains_key(&uid) {
            return false;
        }
        let node = &entry.spec.node;
        let Some(address) = snapshot.nodes.get(node).map(|n| n.address.clone()) else {
            return false;
        };
        let rebooting_since = entry
            .status
            .as_ref()
            .and_then(|s| s.last_transition_time)
            .unwrap_or_else(Timestamp::now);
        let job = CommandJob {
            entry: entry.name_any(),
            entry_uid: uid.clone(),
            node: node.clone(),
            address,
            rebooting_since,
            config: snapshot.config.reboot.clone(),
            run_attempt,
        };
        let job = match job.checked() {
            Ok(job) => job,
            Err(refusal) => {
                if entry.status.as_ref().map(|s| s.message.as_str()) != Some(&refusal.message) {
                    tracing::warn!(node = %node, entry = %entry.name_any(), "{}", refusal.message);
                    self.set_message(entry, &refusal.message).await;
                    self.event_entry(entry, EventType::Warning, refusal.reason, &refusal.message)
                        .await;
                    self.shared
                        .publish(
                            &node_ref(node),
                            EventType::Warning,
                            refusal.reason,
                            &refusal.message,
                        )
                        .await;
                }
                return true;
            }
        };
        let cancel = self.work.child_token();
        let span = tracing::info_span!(
            "reboot_command",
            node = %job.job().node,
            entry = %job.job().entry
        );
        let handle = tokio::spawn(
            command::run(job, self.reports_tx.clone(), cancel.clone()).instrument(span),
        );
        self.workers.insert(
            uid,
            Worker {
                kind: WorkerKind::Command,
                cancel,
                handle,
            },
        );
        false
    }

    /// Adds the suffixless reboot annotation and the request marker in one patch.
    async fn request_host_reboot(&mut self, entry: &RebootQueueEntry, host: &BareMetalHost) {
        let Some(uid) = entry.uid() else { return };
        // The uid is a precondition (immutable: a host re-created under the name refuses the
        // patch): the reboot is requested from the bound host only.
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": {
            REBOOT_ANNOTATION: "",
            REQUEST_MARKER_ANNOTATION: uid,
        }}});
        let reference = host_reference(host);
        match self.patch_host(&reference, &patch).await {
            Ok(_) => {
                tracing::info!(node = %entry.spec.node, host = %reference, "reboot requested through the BareMetalHost")
            }
            Err(e) => {
                tracing::warn!(node = %entry.spec.node, error = %e, "cannot annotate the BareMetalHost; retrying");
                self.retry_soon = true;
            }
        }
    }

    /// Marks the host as rebooted by this entry's command (see [`COMMAND_MARKER_ANNOTATION`]).
    async fn mark_command_reboot(&mut self, entry: &RebootQueueEntry, host: &BareMetalHost) {
        let Some(uid) = entry.uid() else { return };
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": {
            COMMAND_MARKER_ANNOTATION: uid,
        }}});
        if let Err(e) = self.patch_host(&host_reference(host), &patch).await {
            // Not fatal: without it the host controller may power the host on mid-cycle.
            tracing::warn!(node = %entry.spec.node, error = %e, "cannot mark the host as rebooted by command");
        }
    }

    /// Removes the markers this entry left on its host: the request marker and the command
    /// marker (best effort; the sweep removes a command marker left behind).
    async fn clear_host_marker(&self, entry: &RebootQueueEntry) {
        let Some(host) = entry
            .status
            .as_ref()
            .and_then(|s| s.reboot.as_ref())
            .and_then(|r| r.host.clone())
        else {
            return;
        };
        let Some(cached) = self.cached_host(&host) else {
            return;
        };
        let ours = |key: &str| cached.annotations().get(key) == entry.uid().as_ref();
        let mut removals = serde_json::Map::new();
        for key in [REQUEST_MARKER_ANNOTATION, COMMAND_MARKER_ANNOTATION] {
            if ours(key) {
                removals.insert(key.to_string(), serde_json::Value::Null);
            }
        }
        if removals.is_empty() {
            return;
        }
        let patch = json!({ "metadata": {
            "resourceVersion": cached.resource_version(),
            "annotations": removals,
        }});
        if let Err(e) = self.patch_host(&host, &patch).await {
            tracing::debug!(host = %host, error = %e, "markers left on the host");
        }
    }

    /// Command markers whose entry is gone (a removal lost to a crash, an entry deleted by
    /// hand): the host controller would leave that host's power alone for good.
    async fn sweep_command_markers(&mut self) {
        let marked: Vec<Arc<BareMetalHost>> = self
            .stores
            .hosts
            .state()
            .into_iter()
            .filter(|h| h.annotations().contains_key(COMMAND_MARKER_ANNOTATION))
            .collect();
        if marked.is_empty() {
            return;
        }
        let live: HashSet<String> = self.entries().iter().filter_map(|e| e.uid()).collect();
        let orphans: Vec<Arc<BareMetalHost>> = marked
            .into_iter()
            .filter(|h| {
                h.annotations()
                    .get(COMMAND_MARKER_ANNOTATION)
                    .is_some_and(|uid| !live.contains(uid))
            })
            .collect();
        if orphans.is_empty() {
            return;
        }
        // The cache may lag an entry just created: confirm with the API server.
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let Ok(list) = api.list(&Default::default()).await else {
            return;
        };
        let live: HashSet<String> = list.items.iter().filter_map(|e| e.uid()).collect();
        for host in orphans {
            let Some(uid) = host.annotations().get(COMMAND_MARKER_ANNOTATION) else {
                continue;
            };
            if live.contains(uid) {
                continue;
            }
            let patch = json!({ "metadata": {
                "resourceVersion": host.resource_version(),
                "annotations": { COMMAND_MARKER_ANNOTATION: null },
            }});
            match self.patch_host(&host_reference(&host), &patch).await {
                Ok(_) => {
                    tracing::info!(host = %host_reference(&host), "removed the command marker of a reboot queue entry that is gone")
                }
                Err(e) => {
                    tracing::debug!(host = %host_reference(&host), error = %e, "command marker not removed; next sweep")
                }
            }
        }
    }

    /// The node booted: uncordon (if the queue cordoned it), remove the entry.
    async fn complete(&mut self, entry: &RebootQueueEntry, now: Timestamp, detail: &str) {
        self.stop_worker(entry);
        let node = entry.spec.node.clone();
        // Uncordon first: if the removal is lost to a crash, the next round repeats both.
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        let uncordoned = match cordon::uncordon(&nodes, &node).await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "cannot uncordon; retrying");
                self.retry_soon = true;
                return;
            }
        };
        if !self.delete(entry).await {
            return;
        }
        self.clear_host_marker(entry).await;
        let since = entry.status.as_ref().and_then(|s| s.last_transition_time);
        if let Some(since) = since {
            self.shared
                .metrics
                .queue
                .reboot_duration
                .observe(elapsed(since, now).as_secs_f64());
        }
        // A cancelled entry kept for its power cycle ends here too, as cancelled.
        let cancelled = entry.spec.cancel;
        self.shared
            .metrics
            .queue
            .dequeued
            .get_or_create(&ReasonLabels {
                reason: if cancelled { "Cancelled" } else { "Completed" }.into(),
            })
            .inc();
        let text = format!("node {node} rebooted: {detail}");
        self.event_entry(entry, EventType::Normal, reason::BOOT_CONFIRMED, &text)
            .await;
        self.shared
            .publish(
                &node_ref(&node),
                EventType::Normal,
                reason::BOOT_CONFIRMED,
                &text,
            )
            .await;
        if uncordoned {
            self.shared
                .publish(
                    &node_ref(&node),
                    EventType::Normal,
                    reason::UNCORDONED,
                    &format!(
                        "uncordoned node {node} after its reboot (the reboot queue had cordoned it)"
                    ),
                )
                .await;
        }
        let (event_reason, note) = if cancelled {
            (
                reason::CANCELLED,
                format!(
                    "entry {} for node {node} cancelled while rebooting; its power cycle had \
                     begun and is over: the node is uncordoned and the entry removed",
                    entry.spec.index
                ),
            )
        } else {
            (
                reason::COMPLETED,
                format!(
                    "entry {} for node {node} done; the entry is removed",
                    entry.spec.index
                ),
            )
        };
        self.event_entry(entry, EventType::Normal, event_reason, &note)
            .await;
    }

    async fn uncordon(&mut self, node: &str, why: &str) {
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        match cordon::uncordon(&nodes, node).await {
            Ok(true) => {
                self.shared
                    .publish(
                        &node_ref(node),
                        EventType::Normal,
                        reason::UNCORDONED,
                        &format!("uncordoned node {node}: {why}"),
                    )
                    .await
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot uncordon; retrying");
                self.retry_soon = true;
            }
        }
    }

    // ----- writes --------------------------------------------------------------------

    async fn set_message(&mut self, entry: &RebootQueueEntry, text: &str) {
        if entry.status.as_ref().map(|s| s.message.as_str()) == Some(text) {
            return;
        }
        self.write(entry, |s| s.message = text.to_string()).await;
    }

    /// Writes the entry's status with its resourceVersion as a precondition. `None` when the
    /// write failed (a conflict: the entry changed, e.g. it was cancelled; the next round
    /// sees the change).
    async fn write(
        &mut self,
        entry: &RebootQueueEntry,
        change: impl FnOnce(&mut RebootQueueEntryStatus),
    ) -> Option<RebootQueueEntry> {
        let next = self.with_status(entry, change);
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let result = replace_status(&api, &next).await;
        self.record_write(&next, result)
    }

    /// The entry with `change` applied to its status, built on the newest version the loop
    /// knows: its own last write may be newer than the copy a caller holds (several steps of
    /// one round write the same entry).
    fn with_status(
        &self,
        entry: &RebootQueueEntry,
        change: impl FnOnce(&mut RebootQueueEntryStatus),
    ) -> RebootQueueEntry {
        let mut next = match self.written.get(&entry.name_any()) {
            Some(mine) if mine.uid() == entry.uid() && newer(mine, entry) => mine.clone(),
            _ => entry.clone(),
        };
        let mut status = next.status.take().unwrap_or_default();
        change(&mut status);
        status.message = bounded_message(&status.message);
        next.status = Some(status);
        next
    }

    /// Keeps a successful write as the newest known version; a failed one makes the loop look
    /// again soon (a conflict means the entry changed, e.g. it was cancelled).
    fn record_write(
        &mut self,
        attempted: &RebootQueueEntry,
        result: Result<RebootQueueEntry, kube::Error>,
    ) -> Option<RebootQueueEntry> {
        match result {
            Ok(written) => {
                self.written.insert(written.name_any(), written.clone());
                Some(written)
            }
            Err(e) if is_conflict(&e) || is_not_found(&e) => {
                tracing::debug!(entry = %attempted.name_any(), node = %attempted.spec.node, "entry changed meanwhile; deciding again");
                self.retry_soon = true;
                None
            }
            Err(e) => {
                tracing::warn!(entry = %attempted.name_any(), node = %attempted.spec.node, error = %e, "cannot write the entry's status; retrying");
                self.retry_soon = true;
                None
            }
        }
    }

    /// Deletes the entry (UID precondition). True when it is gone.
    async fn delete(&mut self, entry: &RebootQueueEntry) -> bool {
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: entry.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&entry.name_any(), &params).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(entry = %entry.name_any(), node = %entry.spec.node, error = %e, "cannot remove the entry; retrying");
                self.retry_soon = true;
                return false;
            }
        }
        if let Some(uid) = entry.uid() {
            self.deleted.insert(uid);
        }
        self.written.remove(&entry.name_any());
        self.forget_node_phase(&entry.spec.node);
        true
    }

    async fn event_entry(
        &self,
        entry: &RebootQueueEntry,
        kind: EventType,
        event_reason: &str,
        note: &str,
    ) {
        self.shared
            .publish(&entry_ref(entry), kind, event_reason, note)
            .await;
    }

    // ----- queue status and metrics ---------------------------------------------------

    async fn publish_queue_status(
        &mut self,
        snapshot: &QueueSnapshot,
        plan: &Plan,
        now: Timestamp,
    ) {
        let entries = self.entries();
        let mut status = RebootQueueStatus {
            enabled: snapshot.config.enabled,
            running: snapshot.config.enabled && !entries.is_empty(),
            ..Default::default()
        };
        let mut phases: BTreeMap<&'static str, i64> =
            EntryPhase::ALL.iter().map(|p| (p.as_str(), 0)).collect();
        let mut overdue = 0;
        let mut node_phases: HashSet<NodePhaseLabels> = HashSet::new();
        for e in &entries {
            let view = EntryView::from_entry(e);
            *phases.entry(view.phase.as_str()).or_default() += 1;
            match view.phase {
                EntryPhase::Queued => {
                    status.queued += 1;
                    if view.backed_off(now) {
                        status.backed_off += 1;
                    }
                }
                EntryPhase::Draining => status.draining += 1,
                EntryPhase::Rebooting => status.rebooting += 1,
                EntryPhase::Cancelled => status.cancelled += 1,
                EntryPhase::Unknown => {}
            }
            if view.boot_timed_out {
                overdue += 1;
            }
            node_phases.insert(NodePhaseLabels {
                node: view.node.clone(),
                phase: view.phase.as_str().into(),
            });
        }
        status.message = queue_message(snapshot, plan, &status);
        let metrics = &self.shared.metrics.queue;
        metrics.enabled.set(i64::from(snapshot.config.enabled));
        for (phase, count) in phases {
            metrics
                .entries
                .get_or_create(&PhaseLabels {
                    phase: phase.into(),
                })
                .set(count);
        }
        metrics.boot_overdue.set(overdue);
        metrics.backed_off.set(i64::from(status.backed_off));
        for gone in self.node_phase_series.difference(&node_phases) {
            metrics.node_phase.remove(gone);
        }
        for labels in &node_phases {
            metrics.node_phase.get_or_create(labels).set(1);
        }
        self.node_phase_series = node_phases;

        if self.last_queue_status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<RebootQueue> = Api::all(self.shared.client.clone());
        let mut body = status.clone();
        body.last_updated = Some(now);
        body.observed_generation = self
            .stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .and_then(|q| q.metadata.generation);
        let patch = json!({ "status": body });
        match api
            .patch_status(
                REBOOT_QUEUE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => self.last_queue_status = Some(status),
            Err(e) if is_not_found(&e) => {
                self.ensure_queue_object().await;
                self.retry_soon = true;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot write the RebootQueue status; retrying");
                self.retry_soon = true;
            }
        }
    }

    fn forget_node_phase(&mut self, node: &str) {
        let gone: Vec<NodePhaseLabels> = self
            .node_phase_series
            .iter()
            .filter(|l| l.node == node)
            .cloned()
            .collect();
        for labels in gone {
            self.shared.metrics.queue.node_phase.remove(&labels);
            self.node_phase_series.remove(&labels);
        }
    }

    /// The next moment the queue must look again without being woken: a backoff expiring,
    /// a drain or boot timing out, or the resync.
    fn next_wake(&self, snapshot: &QueueSnapshot, now: Timestamp) -> Duration {
        if self.retry_soon {
            return RETRY_SOON;
        }
        let mut next = add(now, self.config.resync);
        for e in &snapshot.entries {
            let candidate = match e.phase {
                EntryPhase::Queued => e.backoff_expire.filter(|t| *t > now),
                EntryPhase::Draining => e
                    .last_transition
                    .map(|t| drain_deadline(t, snapshot.config.eviction_timeout)),
                EntryPhase::Rebooting if !e.boot_timed_out => e
                    .last_transition
                    .map(|t| boot_deadline(t, snapshot.config.reboot.boot_timeout)),
                _ => None,
            };
            if let Some(t) = candidate {
                next = next.min(t);
            }
        }
        // A few milliseconds late rather than early: deadlines are checked with `>=`.
        elapsed(now, next) + Duration::from_millis(5)
    }
}

/// Writes an entry's status with its resourceVersion as a precondition.
async fn replace_status(
    api: &Api<RebootQueueEntry>,
    next: &RebootQueueEntry,
) -> Result<RebootQueueEntry, kube::Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    api.replace_status(&next.name_any(), &params, next).await
}

/// True when `mine` is newer than `cached` (resourceVersions are etcd revisions; when
/// they do not parse, the cache wins).
fn newer(mine: &RebootQueueEntry, cached: &RebootQueueEntry) -> bool {
    let parse = |e: &RebootQueueEntry| -> Option<u64> { e.resource_version()?.parse().ok() };
    match (parse(mine), parse(cached)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

fn entry_ref(entry: &RebootQueueEntry) -> ObjectReference {
    let mut r = entry.object_ref(&());
    r.namespace = None;
    r
}

fn backoff_kind(reason: &str) -> &'static str {
    if reason.contains("Job pod") {
        "job_pods"
    } else if reason.contains("eviction") || reason.contains("PodDisruptionBudget") {
        "eviction"
    } else {
        "error"
    }
}

/// Status messages stay short: they are shown in `kubectl get` columns.
fn bounded_message(text: &str) -> String {
    crate::text::bounded(text, 1024)
}

fn queue_message(snapshot: &QueueSnapshot, plan: &Plan, status: &RebootQueueStatus) -> String {
    if !snapshot.config.enabled {
        return format!(
            "disabled: no new drains ({} rebooting, {} queued)",
            status.rebooting, status.queued
        );
    }
    if snapshot.entries.is_empty() {
        return "idle: the queue is empty".into();
    }
    let waiting_reasons: BTreeSet<String> =
        plan.waiting.iter().map(|w| w.reason.to_string()).collect();
    let mut text = format!(
        "{} draining, {} rebooting, {} queued ({} backed off)",
        status.draining, status.rebooting, status.queued, status.backed_off
    );
    if status.draining + status.rebooting == 0
        && let Some(first) = waiting_reasons.iter().next()
    {
        text.push_str(&format!("; waiting: {first}"));
    }
    text
}
