//! The queue's loop: observe (the cluster view's caches) → decide (`hostcycle_core::queue`) →
//! record (entry status, write-ahead) → act (cordon, workers, host annotation, uncordon,
//! removal).
//!
//! It wakes on every relevant change — an entry or the queue changed, a Node's readiness,
//! cordon, boot ID or volumes changed, a host's power changed, a worker reported (drain
//! finished, boot confirmed) — and at the next deadline (backoff expiry, drain or boot
//! timeout), with a periodic resync as a safety net.
//!
//! By role: this file is the loop (a pass: reports, snapshot, plan, act, queue status, next
//! wake); [`act`] carries out the plan and the workers' reports, one per-entry decision of
//! `hostcycle_core::queue::entry` at a time; [`reboot`] starts and follows reboots;
//! [`workers`] runs drains and commands; [`writes`] and [`hosts`] are the writes to entries
//! and to BareMetalHosts; [`status`] the RebootQueue's status and gauges.

mod act;
mod hosts;
mod reboot;
mod status;
mod workers;
mod writes;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{
    EntryPhase, HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry, RebootQueueSpec,
    RebootQueueStatus,
};
use hostcycle_core::queue::commands::CommandSets;
use hostcycle_core::queue::drain::drain_deadline;
use hostcycle_core::queue::reboot::boot_deadline;
use hostcycle_core::queue::{QueueConfig, QueueNodeView, QueueSnapshot, RebootTarget, plan};
use hostcycle_core::time::{add, elapsed};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::eviction::Evictor;
use super::observe::{fill_gate_view, reboot_targets};
use super::{QueueControllerConfig, Report, Shared};
use crate::backoff::RETRY_SOON;
use crate::cluster::errors::is_conflict;
use crate::cluster::objects::{MachineObject, binding_index, host_reference};
use crate::cluster::{ClusterView, Kinds};
use crate::events::{EventPublisher, EventSink};
use crate::interest::{self, HostInterest};
use crate::leader::LeaderGate;
use crate::metrics::{Metrics, NodePhaseLabels};
use hostcycle_core::queue::entry::WorkerKind;
use writes::newer;

const FIELD_MANAGER: &str = "hostcycle-reboot-queue";
/// Waiting-message writes sent at once.
const MESSAGE_WRITES_IN_FLIGHT: usize = 16;

/// The caches the loop decides from (the view's).
struct Stores {
    entries: Store<RebootQueueEntry>,
    queues: Store<RebootQueue>,
    /// The operator's command sets (ConfigMap `hostcycle-reboot-commands`): what `Command`
    /// runs. The RebootQueue only names a set.
    reboot_commands: Store<ConfigMap>,
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
    view.reboot_commands.wake_on(wake.clone(), |_| true);

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
        reboot_commands: view.reboot_commands.store().clone(),
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

/// The hosts a pass depended on — the reboot targets of queued nodes, the hosts of reboots
/// under way, the held-off hosts the gate counts — and whether a target is unresolved (then
/// every host change matters).
fn targeted_hosts(
    snapshot: &QueueSnapshot,
    entries: &[RebootQueueEntry],
    held: &BTreeSet<HostReference>,
) -> (HashSet<String>, bool) {
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
    // The host a reboot was started on, should the node's mapping change meanwhile; and a
    // held-off host: the gate opens when it is back.
    let started = entries
        .iter()
        .filter_map(|e| e.status.as_ref()?.reboot.as_ref()?.host.as_ref());
    for host in started.chain(held.iter()) {
        targeted.insert(interest::key(&host.namespace, &host.name));
    }
    (targeted, unresolved)
}

/// What about a Node the queue reads: readiness, cordon, role, boot ID, volumes, addresses
/// (a command's address must be no other Node's).
fn node_fingerprint(node: &Node) -> u64 {
    let view = QueueNodeView::from_node(node);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    view.ready.hash(&mut h);
    view.api_server.hash(&mut h);
    view.unschedulable.hash(&mut h);
    view.cordoned_by_queue.hash(&mut h);
    view.boot_id.hash(&mut h);
    view.volumes_in_use.hash(&mut h);
    view.reported_addresses.hash(&mut h);
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
        // The feed watches that one ConfigMap by name: whatever it holds is it.
        let commands = self.stores.reboot_commands.state();
        let command_sets = CommandSets::from_config_map_data(
            commands
                .first()
                .map(|c| c.data.as_ref().unwrap_or(&BTreeMap::new()).clone())
                .as_ref(),
        );
        let spec = self
            .stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .map(|q| q.spec.clone())
            .unwrap_or_default();
        QueueConfig::resolve(&spec, &command_sets)
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
        let nodes: Vec<Node> = self
            .stores
            .nodes
            .state()
            .iter()
            .map(|n| (**n).clone())
            .collect();
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
        let hosts = self.stores.hosts.state();
        let requests: Vec<_> = self
            .stores
            .remediations
            .state()
            .iter()
            .map(|r| (**r).clone())
            .collect();
        self.snapshot_of(config, nodes, machine_objects, hosts, requests)
    }

    /// The snapshot of an irreversible step (a reboot's start): Nodes, Machines and
    /// remediation requests read from the API server, not the caches, which may lag a
    /// remediation that just began or a Node that just went; the hosts as cached (the bound
    /// one is read again before its request). `None`: a read failed (retried soon).
    pub(super) async fn fresh_snapshot(&mut self, config: &QueueConfig) -> Option<QueueSnapshot> {
        let client = self.shared.client.clone();
        let params = kube::api::ListParams::default();
        let nodes = match Api::<Node>::all(client.clone()).list(&params).await {
            Ok(list) => list.items,
            Err(e) => return self.fresh_read_failed("Nodes", &e),
        };
        let requests = match Api::<hostcycle_api::remediation::HostRemediation>::all(client.clone())
            .list(&params)
            .await
        {
            Ok(list) => list.items,
            Err(e) => return self.fresh_read_failed("HostRemediations", &e),
        };
        let mut machine_objects = Vec::new();
        let resources: Vec<kube::discovery::ApiResource> = self
            .stores
            .machines
            .iter()
            .map(|(r, _)| r.clone())
            .collect();
        for resource in resources {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            match api.list(&params).await {
                Ok(list) => machine_objects.extend(list.items.into_iter().map(|m| MachineObject {
                    object: Arc::new(m),
                    resource: resource.clone(),
                })),
                Err(e) => return self.fresh_read_failed("Machines", &e),
            }
        }
        let hosts = self.stores.hosts.state();
        Some(self.snapshot_of(config, nodes, machine_objects, hosts, requests))
    }

    fn fresh_read_failed(&mut self, what: &str, e: &kube::Error) -> Option<QueueSnapshot> {
        tracing::warn!(error = %e, "cannot read {what} from the API server before a reboot starts; retrying");
        self.retry_soon = true;
        None
    }

    fn snapshot_of(
        &mut self,
        config: &QueueConfig,
        nodes: Vec<Node>,
        machine_objects: Vec<MachineObject>,
        hosts: Vec<Arc<BareMetalHost>>,
        requests: Vec<hostcycle_api::remediation::HostRemediation>,
    ) -> QueueSnapshot {
        let entries = self.entries();
        let mut snapshot = QueueSnapshot::from_objects(None, &nodes, &entries);
        snapshot.config = config.clone();
        // Bindings and the gate's view only for a queue with entries (an idle queue reads no
        // host, and has nobody to hold back).
        let mut held = BTreeSet::new();
        if !entries.is_empty() {
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
            held = fill_gate_view(&mut snapshot, &index, &machine_objects, &requests, &by_ref);
        }
        self.targeted_hosts = targeted_hosts(&snapshot, &entries, &held);
        snapshot
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
