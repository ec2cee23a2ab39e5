//! The remediation loop: woken by any change of a Machine, a HostRemediation, a host it
//! targets (or one carrying its power-off annotation), a target Node, any Node's readiness or a
//! queue entry — as its filters on the shared cluster view say — and at each remediation's
//! next deadline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::ClockSkew;
use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{
    HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry, RebootQueueSpec,
};
use hostcycle_api::remediation::{
    HOST_REMEDIATION_FINALIZER, HostRemediation, RemediationStep, is_remediation_power_off,
};
use hostcycle_core::binding::BindingIndex;
use hostcycle_core::remediation::contracts::{MachineClaim, MhcView, node_startup_timeout};
use hostcycle_core::remediation::escalation::allocate_slots;
use hostcycle_core::remediation::joins::{FlowOnHost, joins};
use hostcycle_core::remediation::{
    Acting, Blocker, Escalation, Observation, Record, RemediationHostView, acting_host, decide,
    wants_slot,
};
use hostcycle_core::time::add;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::RemediationControllerConfig;
use super::observe::{
    Resolved, Subject, claim, escalation, host_view, limits, node_view, record, requested, resolve,
};
use crate::backoff::RETRY_SOON;
use crate::cluster::errors::{is_conflict, is_not_found};
use crate::cluster::objects::{MachineObject, binding_index, host_reference};
use crate::cluster::{ClusterView, Kinds};
use crate::events::{EventPublisher, EventSink};
use crate::interest::{self, HostInterest};
use crate::leader::LeaderGate;
use crate::metrics::Metrics;

/// The caches the loop decides from (the view's).
pub(super) struct Stores {
    pub(super) machines: Vec<(ApiResource, Store<DynamicObject>)>,
    pub(super) requests: Store<HostRemediation>,
    pub(super) hosts: Store<BareMetalHost>,
    pub(super) nodes: Store<Node>,
    pub(super) entries: Store<RebootQueueEntry>,
    pub(super) queues: Store<RebootQueue>,
    /// The annotation flow's records (ConfigMaps in the operator's namespace).
    pub(super) records: Store<ConfigMap>,
}

/// The remediation controller, subscribed to the view at once (before the view's watches
/// start); the returned future runs it until `shutdown` fires: it waits for the caches, then
/// runs the loop once `leading` opens.
pub fn run(
    view: &ClusterView,
    config: RemediationControllerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    leading: LeaderGate,
    shutdown: CancellationToken,
    synced: impl FnOnce() + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let client = view.client().clone();
    let wake = Arc::new(Notify::new());
    let targets: Arc<Mutex<HashSet<String>>> = Arc::default();
    let host_interest = HostInterest::default();
    let stores = subscribe(view, &wake, targets.clone(), host_interest.clone());
    let listed = view.listed(Kinds::LOOPS);
    async move {
        let (events, event_task) = EventSink::start(
            EventPublisher::new(client.clone(), "hostcycle.io/remediation", identity),
            "Remediation",
        );
        tracing::info!(
            machine_kinds = ?stores.machines.iter().map(|(r, _)| format!("{}/{}", r.group, r.version)).collect::<Vec<_>>(),
            max_concurrent = config.max_concurrent,
            "remediation controller starting"
        );
        // Clocks are measured, not assumed: time-based evidence is refused beyond the bound.
        let clock = ClockSkew::new(config.max_clock_skew);
        let clock_task = tokio::spawn(crate::clock::follow(
            client.clone(),
            clock.clone(),
            metrics.clone(),
            shutdown.clone(),
        ));
        let out_of_service_served = super::release::out_of_service_served(&client).await;
        let mut controller = Controller {
            out_of_service_served,
            client,
            config,
            clock,
            metrics,
            events,
            stores,
            targets,
            host_interest,
            wake: wake.clone(),
            last_events: HashMap::new(),
            retry_soon: false,
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = listed => {
                tracing::info!("remediation caches synced");
                synced();
                // A standby replica keeps its caches warm and stops here until it leads.
                if leading.wait_to_lead(&shutdown).await {
                    tracing::info!("leading: the remediation loop starts");
                    let mut next = tokio::time::Instant::now();
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = wake.notified() => {}
                            _ = tokio::time::sleep_until(next) => {}
                        }
                        let wait = controller.pass().await;
                        next = hostcycle_bmc::deadline::deadline_after(tokio::time::Instant::now(), wait);
                    }
                }
            }
        }
        drop(controller);
        clock_task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), event_task).await;
    }
}

/// Subscribes to every kind the loop reads; every relevant change wakes it.
fn subscribe(
    view: &ClusterView,
    wake: &Arc<Notify>,
    targets: Arc<Mutex<HashSet<String>>>,
    host_interest: HostInterest,
) -> Stores {
    for (_, machines) in &view.machines {
        machines.wake_on(wake.clone(), |_| true);
    }
    view.remediations.wake_on(wake.clone(), |_| true);

    view.hosts.wake_on(
        wake.clone(),
        // Also a host carrying one of remediation's power-off annotations: it may be orphaned.
        move |host: &BareMetalHost| {
            host_interest.wants(host)
                || host
                    .annotations()
                    .keys()
                    .any(|k| is_remediation_power_off(k))
        },
    );

    // Nodes change every heartbeat: wake for a target Node, or when readiness changes.
    let mut prints: HashMap<String, u64> = HashMap::new();
    view.nodes.wake_on(wake.clone(), move |node: &Node| {
        let name = node.name_any();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.uid().hash(&mut h);
        hostcycle_core::node::is_ready(node).hash(&mut h);
        let print = h.finish();
        let changed = prints.insert(name.clone(), print) != Some(print);
        let target = targets.lock().map(|t| t.contains(&name)).unwrap_or(true);
        changed || target
    });

    view.entries.wake_on(wake.clone(), |_| true);
    view.queues.wake_on(wake.clone(), |_| true);
    view.flow_records.wake_on(wake.clone(), |_| true);
    Stores {
        machines: view
            .machines
            .iter()
            .map(|(resource, feed)| (resource.clone(), feed.store().clone()))
            .collect(),
        requests: view.remediations.store().clone(),
        hosts: view.hosts.store().clone(),
        nodes: view.nodes.store().clone(),
        entries: view.entries.store().clone(),
        queues: view.queues.store().clone(),
        records: view.flow_records.store().clone(),
    }
}

pub(super) struct Controller {
    /// The cluster honours `node.kubernetes.io/out-of-service` (found at start by discovery).
    pub(super) out_of_service_served: bool,
    pub(super) client: Client,
    pub(super) config: RemediationControllerConfig,
    /// This replica's clock against the API server's.
    pub(super) clock: ClockSkew,
    pub(super) metrics: Arc<Metrics>,
    pub(super) events: EventSink,
    pub(super) stores: Stores,
    /// Nodes some remediation targets (their every change wakes the loop).
    pub(super) targets: Arc<Mutex<HashSet<String>>>,
    /// Hosts some remediation targets (only their changes wake the loop).
    pub(super) host_interest: HostInterest,
    pub(super) wake: Arc<Notify>,
    /// The Events each remediation emitted last, so a waiting one does not repeat them.
    pub(super) last_events: HashMap<String, Vec<(&'static str, String)>>,
    pub(super) retry_soon: bool,
}

/// One remediation, observed.
pub(super) struct Item {
    pub(super) subject: Subject,
    pub(super) machine: Option<MachineObject>,
    /// The host the remediation acts on ([`acting_host`]): the one its record bound, or,
    /// before the start, the one the resolver finds.
    pub(super) host: Option<Arc<BareMetalHost>>,
    pub(super) node: Option<Node>,
    pub(super) observation: Observation,
    /// A Node annotation the resolver ignored (a Warning).
    pub(super) ignored_hint: Option<String>,
}

/// The nodes the reboot queue is rebooting (cancelled or not), each with the end of its boot
/// timeout (the latest, for a node with several entries).
fn rebooting_until<'a>(
    entries: impl Iterator<Item = &'a RebootQueueEntry>,
    boot_timeout: Duration,
) -> HashMap<String, Timestamp> {
    let mut until: HashMap<String, Timestamp> = HashMap::new();
    for e in entries {
        if let Some(since) = e.rebooting_since() {
            let end = add(since, boot_timeout);
            let slot = until.entry(e.spec.node.clone()).or_insert(end);
            *slot = (*slot).max(end);
        }
    }
    until
}

/// Whether `decision` starts the remediation (its power-off): the step from NotStarted to
/// PowerOffRequested.
fn starts(before: &Record, decision: &hostcycle_core::remediation::Decision) -> bool {
    before.step == RemediationStep::NotStarted
        && decision
            .record
            .as_ref()
            .is_some_and(|r| r.step == RemediationStep::PowerOffRequested)
}

/// Marks each remediation that has not started and whose host another trigger's remediation
/// is running on ([`hostcycle_core::remediation::joins::joins`]).
fn join_running_flows(items: &mut [Item], now: Timestamp) {
    let keys: Vec<String> = items.iter().map(|i| i.subject.key()).collect();
    let flows: Vec<FlowOnHost> = items
        .iter()
        .zip(&keys)
        .map(|(i, key)| FlowOnHost::of(key, i.subject.created().unwrap_or(now), &i.observation))
        .collect();
    let joined: std::collections::BTreeMap<String, String> = joins(&flows)
        .into_iter()
        .map(|(k, leader)| (k.to_string(), leader.to_string()))
        .collect();
    for item in items.iter_mut() {
        item.observation.joined_running = joined.get(&item.subject.key()).cloned();
    }
}

impl Controller {
    async fn pass(&mut self) -> Duration {
        self.retry_soon = false;
        let now = Timestamp::now();
        let mut items = self.observe(now);
        for item in &mut items {
            self.follow_machine_health_check(item).await;
        }
        let mut next = self.config.resync;
        let mut in_flight = 0i64;
        let mut cannot_fence = 0i64;
        let mut left_off = 0i64;
        let mut live_keys = HashSet::new();
        for item in items {
            live_keys.insert(item.subject.key());
            if item.observation.record.in_flight() {
                in_flight += 1;
            }
            // A release step reads the node's pods and VolumeAttachments from the API server.
            let mut item = item;
            if hostcycle_core::remediation::needs_workloads(&item.observation) {
                item.observation.workloads = self.read_workloads(&item).await;
            }
            let mut decision = decide(&item.observation, now);
            // The start is the irreversible step (the power-off): decided again on what the
            // API server says now, not the caches.
            if starts(&item.observation.record, &decision) {
                match self.fresh_start_observation(&item).await {
                    Some(fresh) => {
                        item.observation = fresh;
                        decision = decide(&item.observation, now);
                    }
                    None => continue,
                }
            }
            if decision.cannot_fence {
                cannot_fence += 1;
            }
            if hostcycle_core::remediation::left_off(&item.observation) {
                left_off += 1;
            }
            if let Some(requeue) = decision.requeue {
                next = next.min(requeue);
            }
            // Every line logged while acting names the remediation, its Machine, host and Node.
            let span = item_span(&item);
            self.apply(&item, &decision, now).instrument(span).await;
        }
        self.last_events.retain(|k, _| live_keys.contains(k));
        self.metrics.remediation.in_flight.set(in_flight);
        self.metrics.remediation.cannot_fence.set(cannot_fence);
        self.metrics.remediation.left_off.set(left_off);
        self.sweep_records().await;
        self.sweep_orphans().await;
        if self.retry_soon {
            next = next.min(RETRY_SOON);
        }
        next.max(Duration::from_millis(50))
    }

    /// The observation of a remediation about to start, with what the start depends on read
    /// from the API server: its host (online, not marked, able to power off — and still the
    /// one the resolver found) and the reboot queue's entries (a node the queue is rebooting
    /// is not fenced meanwhile). `None`: a read failed (retried soon).
    async fn fresh_start_observation(&mut self, item: &Item) -> Option<Observation> {
        let mut observation = item.observation.clone();
        let entries: Api<RebootQueueEntry> = Api::all(self.client.clone());
        let list = match entries.list(&Default::default()).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the reboot queue's entries before a remediation starts; retrying");
                self.retry_soon = true;
                return None;
            }
        };
        let rebooting = rebooting_until(list.items.iter(), self.boot_timeout());
        observation.queue_reboot_until = observation
            .node_name
            .as_ref()
            .and_then(|node| rebooting.get(node).copied());
        if let Ok(target) = &observation.target {
            let (ns, name) = target.name.split_once('/').unwrap_or(("", &target.name));
            let hosts: Api<BareMetalHost> = Api::namespaced(self.client.clone(), ns);
            match hosts.get_opt(name).await {
                Ok(Some(h)) if h.uid().as_deref() == Some(target.uid.as_str()) => {
                    observation.target = Ok(host_view(&h, &item.subject.power_off_annotation()));
                }
                Ok(_) => {
                    observation.target = Err(Blocker::HostNotFound(target.name.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, host = %target.name, "cannot read the host before a remediation starts; retrying");
                    self.retry_soon = true;
                    return None;
                }
            }
        }
        Some(observation)
    }

    /// The reboot queue's boot timeout (its default without a queue).
    fn boot_timeout(&self) -> Duration {
        Duration::from_secs(
            self.stores
                .queues
                .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
                .map(|q| q.spec.boot_timeout_seconds())
                .unwrap_or_else(|| RebootQueueSpec::default().boot_timeout_seconds()),
        )
    }

    /// Every remediation in the cluster, observed for `decide`: resolved, its slot granted or
    /// not, and the loop woken by changes of its host and Node.
    fn observe(&self, now: Timestamp) -> Vec<Item> {
        // 1. The remediations: Machines with a flow, and the requests hostcycle takes.
        let machines = self.cached_machines();
        let subjects = self.subjects(&machines);
        if subjects.is_empty() {
            // Nothing to remediate (the usual case): the pass reads no host and no Node.
            self.follow_nothing();
            return Vec::new();
        }
        // 2. The hosts, Nodes and reboot queue, read from the caches once for all.
        let snapshot = self.snapshot(&machines);
        // 3. Each remediation resolved and observed (a Machine not hostcycle's is left out).
        let mut items: Vec<Item> = subjects
            .into_iter()
            .filter_map(|subject| self.observe_one(subject, &machines, &snapshot))
            .collect();
        // 4. One remediation per host: a trigger that arrives while another trigger's
        //    remediation runs on its host joins it.
        join_running_flows(&mut items, now);
        // 5. Storm protection: free slots go to the longest-waiting requests first.
        self.grant_slots(&mut items, now);
        // 6. The loop wakes for changes of the Nodes and hosts these remediations target.
        self.follow_targets(&items);
        items
    }

    /// Machines with the trigger or hostcycle's record of a flow, then the requests hostcycle
    /// takes. A Machine's markers alone make no flow: they are never read back.
    fn subjects(&self, machines: &[MachineObject]) -> Vec<Subject> {
        let records = super::records::index(&self.stores.records.state());
        machines
            .iter()
            .filter_map(|m| {
                let stored = m.object.uid().and_then(|uid| records.get(&uid).cloned());
                (stored.is_some() || m.triggered()).then(|| Subject::Machine(m.clone(), stored))
            })
            .chain(
                self.stores
                    .requests
                    .state()
                    .iter()
                    .filter(|r| self.takes_request(r))
                    .map(|r| Subject::Request(r.clone())),
            )
            .collect()
    }

    /// With requests switched off, one hostcycle already took is still finished (and its
    /// finalizer removed).
    fn takes_request(&self, r: &HostRemediation) -> bool {
        self.config.triggers.requests
            || r.finalizers()
                .iter()
                .any(|f| f == HOST_REMEDIATION_FINALIZER)
            || r.status
                .as_ref()
                .is_some_and(|s| s.step != RemediationStep::NotStarted)
    }

    /// No remediation: no Node and no host wakes the loop on its behalf.
    fn follow_nothing(&self) {
        if let Ok(mut t) = self.targets.lock() {
            t.clear();
        }
        self.host_interest.set(HashSet::new(), false, &self.wake);
    }

    fn snapshot(&self, machines: &[MachineObject]) -> Snapshot {
        let hosts = self.stores.hosts.state();
        let nodes = self.stores.nodes.state();
        Snapshot {
            hosts_by_ref: hosts
                .iter()
                .map(|h| (host_reference(h), h.clone()))
                .collect(),
            index: binding_index(
                hosts.iter().map(|h| &**h),
                machines.iter().map(|m| &*m.object),
                nodes.iter().map(|n| &**n),
            ),
            nodes: nodes
                .iter()
                .map(|n| (n.name_any(), (**n).clone()))
                .collect(),
            rebooting: self.rebooting_nodes(),
        }
    }

    /// The Nodes the reboot queue is rebooting (cancelled or not: a cancel stops no power cycle
    /// under way), each with the end of its boot timeout.
    fn rebooting_nodes(&self) -> HashMap<String, Timestamp> {
        rebooting_until(
            self.stores.entries.state().iter().map(|e| &**e),
            self.boot_timeout(),
        )
    }

    /// One remediation resolved to its Machine, host and Node, and observed; `None`: a
    /// Machine whose trigger is not hostcycle's.
    fn observe_one(
        &self,
        subject: Subject,
        machines: &[MachineObject],
        snapshot: &Snapshot,
    ) -> Option<Item> {
        let resolved = resolve(&subject, machines, &snapshot.index, &snapshot.hosts_by_ref);
        // One remediator per trigger: a Machine another remediator holds is left alone.
        let held_elsewhere = match self.whose(&subject, &resolved) {
            MachineClaim::Ours => None,
            MachineClaim::NotOurs => return None,
            MachineClaim::HeldElsewhere(why) => Some(why),
        };
        let node = resolved
            .node_name
            .as_ref()
            .and_then(|n| snapshot.nodes.get(n))
            .cloned();
        let mut observation =
            self.observation(&subject, &resolved, node.as_ref(), held_elsewhere, snapshot);
        let host = acting_host_object(&observation, &snapshot.hosts_by_ref);
        observation.escalation = escalation(&subject, resolved.machine.as_ref(), host.as_deref());
        Some(Item {
            subject,
            machine: resolved.machine,
            host,
            node,
            observation,
            ignored_hint: resolved.ignored_hint,
        })
    }

    /// Whose the remediation is: a request is hostcycle's; a Machine's trigger may be
    /// another remediator's.
    fn whose(&self, subject: &Subject, resolved: &Resolved) -> MachineClaim {
        match subject {
            Subject::Machine(m, stored) => claim(
                m,
                stored.is_some(),
                resolved.host.as_ref().ok().map(|h| &**h),
                &self.config.triggers,
            ),
            Subject::Request(_) => MachineClaim::Ours,
        }
    }

    /// What `decide` reads of one remediation, but its slot and escalation (set later).
    fn observation(
        &self,
        subject: &Subject,
        resolved: &Resolved,
        node: Option<&Node>,
        held_elsewhere: Option<String>,
        snapshot: &Snapshot,
    ) -> Observation {
        let power_off = subject.power_off_annotation();
        let (retry_limit, power_on_timeout) = limits(subject, self.config.power_on_timeout);
        // The record first: once it holds a binding, that host is the one acted on.
        let bound_host = record(subject)
            .host
            .map(|b| snapshot.hosts_by_ref.get(&b.reference).cloned());
        Observation {
            trigger: subject.trigger(),
            requested: requested(subject),
            target: self.target(subject, resolved, &power_off),
            bound: bound_host
                .flatten()
                .as_ref()
                .map(|h| host_view(h, &power_off)),
            node_name: resolved.node_name.clone(),
            node: node.map(node_view),
            // Another remediator's markers are not a record of hostcycle's.
            record: if held_elsewhere.is_some() {
                Record::default()
            } else {
                record(subject)
            },
            retry_limit,
            power_on_timeout,
            power_off_timeout: self.config.power_off_timeout,
            slot_free: false,
            queue_reboot_until: resolved
                .node_name
                .as_ref()
                .and_then(|n| snapshot.rebooting.get(n).copied()),
            escalation: Escalation::None(String::new()),
            held_elsewhere,
            joined_running: None,
            clock_untrusted: self.clock.untrusted(),
            release_strategy: super::release::requested_strategy(subject),
            out_of_service_served: self.out_of_service_served,
            workloads: None,
            leave_off: super::release::leave_off(subject),
        }
    }

    /// The host the resolver finds, or why none. A request may start only on a host its
    /// namespace may fence.
    fn target(
        &self,
        subject: &Subject,
        resolved: &Resolved,
        power_off: &str,
    ) -> Result<RemediationHostView, Blocker> {
        resolved
            .host
            .as_ref()
            .map(|h| host_view(h, power_off))
            .map_err(Clone::clone)
            .and_then(|h| {
                self.config
                    .request_namespaces
                    .check(&subject.namespace(), &h.name)
                    .map(|()| h)
            })
    }

    /// Only remediations that could start now compete for the free slots: a blocked one (no
    /// host, a binding in doubt, a host that cannot be powered off) or one waiting for the
    /// reboot queue takes none.
    fn grant_slots(&self, items: &mut [Item], now: Timestamp) {
        let in_flight = items
            .iter()
            .filter(|i| i.observation.record.in_flight())
            .count();
        let mut waiting: Vec<(Timestamp, String)> = items
            .iter()
            .filter(|i| wants_slot(&i.observation, now))
            .map(|i| (i.subject.created().unwrap_or(now), i.subject.key()))
            .collect();
        waiting.sort();
        let keys: Vec<String> = waiting.into_iter().map(|(_, k)| k).collect();
        let granted: HashSet<String> = allocate_slots(in_flight, self.config.max_concurrent, &keys)
            .into_iter()
            .collect();
        for item in items {
            item.observation.slot_free = granted.contains(&item.subject.key());
        }
    }

    /// Every change of a target Node wakes the loop, and of a target host: the one found, the
    /// one bound and the one acted on.
    fn follow_targets(&self, items: &[Item]) {
        if let Ok(mut t) = self.targets.lock() {
            *t = items
                .iter()
                .filter_map(|i| i.observation.node_name.clone())
                .collect();
        }
        // A remediation without a host yet may be waiting for one to appear.
        let unresolved = items.iter().any(|i| i.host.is_none());
        let targeted = items
            .iter()
            .flat_map(|i| {
                let target = i.observation.target.as_ref().ok().map(|h| h.name.clone());
                let bound = i
                    .observation
                    .record
                    .host
                    .as_ref()
                    .map(|b| b.reference.to_string());
                let acting = i
                    .host
                    .as_ref()
                    .map(|h| interest::key(&h.namespace().unwrap_or_default(), &h.name_any()));
                [target, bound, acting].into_iter().flatten()
            })
            .collect();
        self.host_interest.set(targeted, unresolved, &self.wake);
    }

    /// The annotation flow's power-on timeout is the `nodeStartupTimeout` of the OpenShift
    /// MachineHealthCheck that selects the Machine, as CAPBM reads it (the flag when none
    /// does, or it is 0). Read from the API server only when the deadline is about to be
    /// recorded: once per remediation.
    async fn follow_machine_health_check(&self, item: &mut Item) {
        let Subject::Machine(m, _) = &item.subject else {
            return;
        };
        let record = &item.observation.record;
        let recording = record.step == RemediationStep::NodeReleased
            || (record.step == RemediationStep::PowerOnRequested
                && record.power_on_timeout_at.is_none());
        if !recording || m.group() != super::observe::OPENSHIFT_GROUP {
            return;
        }
        let resource = ApiResource {
            group: super::observe::OPENSHIFT_GROUP.into(),
            version: "v1beta1".into(),
            api_version: format!("{}/v1beta1", super::observe::OPENSHIFT_GROUP),
            kind: "MachineHealthCheck".into(),
            plural: "machinehealthchecks".into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &m.object.namespace().unwrap_or_default(),
            &resource,
        );
        let list = match api.list(&Default::default()).await {
            Ok(list) => list,
            // Not served (no OpenShift Machine API): the flag's timeout.
            Err(e) if is_not_found(&e) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list MachineHealthChecks: the power-on timeout is --remediation-power-on-timeout");
                return;
            }
        };
        let mhcs: Vec<MhcView> = list
            .items
            .iter()
            .map(|o| MhcView {
                name: o.name_any(),
                selector: o.data["spec"]["selector"].clone(),
                node_startup_timeout: o.data["spec"]["nodeStartupTimeout"]
                    .as_str()
                    .map(str::to_string),
            })
            .collect();
        if let Some((name, timeout)) = node_startup_timeout(&mhcs, m.object.labels()) {
            tracing::info!(machine_health_check = %name, timeout_seconds = timeout.as_secs(), "power-on timeout from the MachineHealthCheck's nodeStartupTimeout");
            item.observation.power_on_timeout = timeout;
        }
    }

    pub(super) fn cached_machines(&self) -> Vec<MachineObject> {
        self.stores
            .machines
            .iter()
            .flat_map(|(resource, store)| {
                store.state().into_iter().map(|m| MachineObject {
                    object: m,
                    resource: resource.clone(),
                })
            })
            .collect()
    }
}

/// The caches one pass reads, indexed once for every remediation.
struct Snapshot {
    hosts_by_ref: HashMap<HostReference, Arc<BareMetalHost>>,
    index: BindingIndex,
    nodes: BTreeMap<String, Node>,
    /// The Nodes the reboot queue is rebooting, with the end of each one's boot timeout.
    rebooting: HashMap<String, Timestamp>,
}

/// The host `decide` acts on ([`acting_host`]), when it has one.
fn acting_host_object(
    observation: &Observation,
    hosts: &HashMap<HostReference, Arc<BareMetalHost>>,
) -> Option<Arc<BareMetalHost>> {
    match acting_host(observation) {
        Acting::Host(h) => hostcycle_core::binding::parse_host_ref(&h.name, None)
            .and_then(|r| hosts.get(&r))
            .cloned(),
        _ => None,
    }
}

/// The span of one remediation's step: its key, and its Machine, host and Node when known.
fn item_span(item: &Item) -> tracing::Span {
    let qualified = |ns: Option<String>, name: String| match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    };
    let machine = item
        .machine
        .as_ref()
        .map(|m| qualified(m.object.namespace(), m.object.name_any()));
    let host = item
        .host
        .as_ref()
        .map(|h| qualified(h.namespace(), h.name_any()));
    tracing::info_span!(
        "remediation",
        remediation = %item.subject.key(),
        machine = machine.as_deref(),
        host = host.as_deref(),
        node = item.observation.node_name.as_deref(),
    )
}

pub(super) fn log_write_error(what: &str, e: &kube::Error) {
    match e {
        _ if is_conflict(e) => {
            tracing::debug!(object = what, "changed meanwhile; deciding again")
        }
        _ => tracing::warn!(object = what, error = %e, "write failed; retrying"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hostcycle_core::remediation::Decision;

    /// Only the step into the power-off is re-decided on a fresh read (the irreversible
    /// start); every other decision stands on the caches, its record's precondition guarding
    /// it.
    #[test]
    fn only_the_start_is_decided_again_on_a_fresh_read() {
        let decision = |record: Option<Record>| Decision {
            record,
            actions: vec![],
            events: vec![],
            phase: hostcycle_api::remediation::RemediationPhase::Running,
            message: String::new(),
            blocked: None,
            requeue: None,
            cannot_fence: false,
        };
        let with = |step| {
            decision(Some(Record {
                step,
                ..Record::default()
            }))
        };
        let not_started = Record::default();
        let powering_off = Record {
            step: RemediationStep::PowerOffRequested,
            ..Record::default()
        };
        assert!(starts(
            &not_started,
            &with(RemediationStep::PowerOffRequested)
        ));
        assert!(!starts(&not_started, &with(RemediationStep::NotStarted)));
        assert!(!starts(&not_started, &with(RemediationStep::Cancelled)));
        assert!(!starts(
            &powering_off,
            &with(RemediationStep::PowerOffRequested)
        ));
        assert!(!starts(&not_started, &decision(None)));
    }
}
