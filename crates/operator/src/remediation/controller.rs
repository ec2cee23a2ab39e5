//! The remediation loop: woken by any change of a Machine, a HostRemediation, a host it
//! targets (or one carrying its power-off annotation), a target Node, any Node's readiness or a
//! queue entry — as its filters on the shared cluster view say — and at each remediation's
//! next deadline.

use crate::backoff::RETRY_SOON;
use crate::cluster::errors::{is_conflict, is_not_found};
use hostcycle_api::reasons::remediation::event_reason;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{HostReference, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_api::remediation::{
    CAPM3_UNHEALTHY_ANNOTATION, CAPM3_UNHEALTHY_VALUE, HOST_REMEDIATION_FINALIZER, HostRemediation,
    HostRemediationStatus, REQUEST_POWER_OFF_PREFIX, RemediationPhase, RemediationStep,
    is_remediation_power_off,
};
use hostcycle_core::conditions::set_condition as set_status_condition;
use hostcycle_core::queue::{EntryView, QueueConfig};
use hostcycle_core::remediation::escalation::{
    ConditionsLayout, allocate_slots, capi_gave_up_patch, capi_remediated_patch,
};
use hostcycle_core::remediation::orphans::orphaned_power_off_keys;
use hostcycle_core::remediation::{
    Acting, Action, Decision, Escalation, Observation, Record, Trigger, acting_host, decide,
    off_confirmed, wants_slot,
};
use hostcycle_core::time::{add, wire_precision};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::RemediationControllerConfig;
use super::observe::{
    Subject, claim, escalation, host_view, limits, node_view, record, requested, resolve,
};
use crate::cluster::objects::{MachineObject, binding_index, host_reference};
use crate::cluster::{ClusterView, Kinds};
use crate::events::{EventPublisher, EventSink, node_ref};
use crate::interest::{self, HostInterest};
use crate::leader::LeaderGate;
use crate::metrics::{Metrics, RemediationLabels};
use hostcycle_api::reasons::EventType;
use hostcycle_core::remediation::contracts::{
    MachineClaim, MhcView, node_startup_timeout, permanent_node_deletion_expected,
};

const FIELD_MANAGER: &str = "hostcycle-remediation";

/// The caches the loop decides from (the view's).
struct Stores {
    machines: Vec<(ApiResource, Store<DynamicObject>)>,
    requests: Store<HostRemediation>,
    hosts: Store<BareMetalHost>,
    nodes: Store<Node>,
    entries: Store<RebootQueueEntry>,
    queues: Store<RebootQueue>,
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
        let mut controller = Controller {
            client,
            config,
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
    }
}

struct Controller {
    client: Client,
    config: RemediationControllerConfig,
    metrics: Arc<Metrics>,
    events: EventSink,
    stores: Stores,
    /// Nodes some remediation targets (their every change wakes the loop).
    targets: Arc<Mutex<HashSet<String>>>,
    /// Hosts some remediation targets (only their changes wake the loop).
    host_interest: HostInterest,
    wake: Arc<Notify>,
    /// The Events each remediation emitted last, so a waiting one does not repeat them.
    last_events: HashMap<String, Vec<(&'static str, String)>>,
    retry_soon: bool,
}

/// One remediation, observed.
struct Item {
    subject: Subject,
    machine: Option<MachineObject>,
    /// The host the remediation acts on ([`acting_host`]): the one its record bound, or,
    /// before the start, the one the resolver finds.
    host: Option<Arc<BareMetalHost>>,
    node: Option<Node>,
    observation: Observation,
    /// A Node annotation the resolver ignored (a Warning).
    ignored_hint: Option<String>,
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
        let mut live_keys = HashSet::new();
        for item in items {
            live_keys.insert(item.subject.key());
            if item.observation.record.in_flight() {
                in_flight += 1;
            }
            let decision = decide(&item.observation, now);
            if let Some(requeue) = decision.requeue {
                next = next.min(requeue);
            }
            // Every line logged while acting names the remediation, its Machine, host and Node.
            let span = item_span(&item);
            self.apply(&item, &decision, now).instrument(span).await;
        }
        self.last_events.retain(|k, _| live_keys.contains(k));
        self.metrics.remediation.in_flight.set(in_flight);
        self.sweep_orphans().await;
        if self.retry_soon {
            next = next.min(RETRY_SOON);
        }
        next.max(Duration::from_millis(50))
    }

    fn observe(&self, now: Timestamp) -> Vec<Item> {
        let machines = self.cached_machines();
        let subjects: Vec<Subject> = machines
            .iter()
            .filter(|m| m.has_flow())
            .cloned()
            .map(Subject::Machine)
            .chain(
                self.stores
                    .requests
                    .state()
                    .iter()
                    // With requests switched off, one hostcycle already took is still
                    // finished (and its finalizer removed).
                    .filter(|r| {
                        self.config.triggers.requests
                            || r.finalizers()
                                .iter()
                                .any(|f| f == HOST_REMEDIATION_FINALIZER)
                            || r.status
                                .as_ref()
                                .is_some_and(|s| s.step != RemediationStep::NotStarted)
                    })
                    .map(|r| Subject::Request(r.clone())),
            )
            .collect();
        if subjects.is_empty() {
            // Nothing to remediate (the usual case): the pass reads no host and no Node.
            if let Ok(mut t) = self.targets.lock() {
                t.clear();
            }
            self.host_interest.set(HashSet::new(), false, &self.wake);
            return Vec::new();
        }
        let hosts = self.stores.hosts.state();
        let hosts_by_ref: HashMap<HostReference, Arc<BareMetalHost>> = hosts
            .iter()
            .map(|h| (host_reference(h), h.clone()))
            .collect();
        let node_objects = self.stores.nodes.state();
        let index = binding_index(
            hosts.iter().map(|h| &**h),
            machines.iter().map(|m| &*m.object),
            node_objects.iter().map(|n| &**n),
        );
        let nodes: BTreeMap<String, Node> = node_objects
            .iter()
            .map(|n| (n.name_any(), (**n).clone()))
            .collect();
        let queue_boot_timeout = self
            .stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .map(|q| QueueConfig::from_spec(&q.spec))
            .unwrap_or_default()
            .reboot
            .boot_timeout;
        let rebooting: HashMap<String, Timestamp> = self
            .stores
            .entries
            .state()
            .iter()
            .map(|e| EntryView::from_entry(e))
            .filter(|e| e.phase == hostcycle_api::queue::EntryPhase::Rebooting && !e.cancel)
            .filter_map(|e| Some((e.node.clone(), add(e.last_transition?, queue_boot_timeout))))
            .collect();

        let mut items: Vec<Item> = subjects
            .into_iter()
            .filter_map(|subject| {
                let resolved = resolve(&subject, &machines, &index, &hosts_by_ref);
                // One remediator per trigger: a Machine another remediator holds is left alone.
                let held_elsewhere = match &subject {
                    Subject::Machine(m) => {
                        match claim(
                            m,
                            resolved.host.as_ref().ok().map(|h| &**h),
                            &self.config.triggers,
                        ) {
                            MachineClaim::Ours => None,
                            MachineClaim::NotOurs => return None,
                            MachineClaim::HeldElsewhere(why) => Some(why),
                        }
                    }
                    Subject::Request(_) => None,
                };
                let power_off = subject.power_off_annotation();
                let node = resolved
                    .node_name
                    .as_ref()
                    .and_then(|n| nodes.get(n))
                    .cloned();
                let (retry_limit, power_on_timeout) =
                    limits(&subject, self.config.power_on_timeout);
                // The record first: once it holds a binding, that host is the one acted on.
                let bound_host = record(&subject, None)
                    .host
                    .map(|b| hosts_by_ref.get(&b.reference).cloned());
                let record_host = match &bound_host {
                    Some(bound) => bound.clone(),
                    None => resolved.host.as_ref().ok().cloned(),
                };
                let mut observation = Observation {
                    trigger: subject.trigger(),
                    requested: requested(&subject),
                    // A request may start only on a host its namespace may fence.
                    target: resolved
                        .host
                        .as_ref()
                        .map(|h| host_view(h, &power_off))
                        .map_err(Clone::clone)
                        .and_then(|h| {
                            self.config
                                .request_namespaces
                                .check(&subject.namespace(), &h.name)
                                .map(|()| h)
                        }),
                    bound: bound_host
                        .flatten()
                        .as_ref()
                        .map(|h| host_view(h, &power_off)),
                    node_name: resolved.node_name.clone(),
                    node: node.as_ref().map(node_view),
                    // Another remediator's markers are not a record of hostcycle's.
                    record: if held_elsewhere.is_some() {
                        Record::default()
                    } else {
                        record(&subject, record_host.as_deref())
                    },
                    retry_limit,
                    power_on_timeout,
                    power_off_timeout: self.config.power_off_timeout,
                    slot_free: false,
                    queue_reboot_until: resolved
                        .node_name
                        .as_ref()
                        .and_then(|n| rebooting.get(n).copied()),
                    escalation: Escalation::None(String::new()),
                    held_elsewhere,
                };
                // The host acted on, as decide sees it.
                let host = match acting_host(&observation) {
                    Acting::Host(h) => hostcycle_core::binding::parse_host_ref(&h.name, None)
                        .and_then(|r| hosts_by_ref.get(&r))
                        .cloned(),
                    _ => None,
                };
                observation.escalation =
                    escalation(&subject, resolved.machine.as_ref(), host.as_deref());
                Some(Item {
                    subject,
                    machine: resolved.machine,
                    host,
                    node,
                    observation,
                    ignored_hint: resolved.ignored_hint,
                })
            })
            .collect();

        // Storm protection: free slots go to the longest-waiting requests first.
        let in_flight = items
            .iter()
            .filter(|i| i.observation.record.in_flight())
            .count();
        // Only remediations that could start now compete: a blocked one (no host, a binding
        // in doubt, a host that cannot be powered off) or one waiting for the reboot queue
        // takes no slot.
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
        for item in &mut items {
            item.observation.slot_free = granted.contains(&item.subject.key());
        }
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
        items
    }

    async fn apply(&mut self, item: &Item, decision: &Decision, now: Timestamp) {
        let key = item.subject.key();
        // A request keeps a finalizer while it is being worked on, so cleanup finishes.
        let mut request = match &item.subject {
            Subject::Request(r) => Some((**r).clone()),
            Subject::Machine(_) => None,
        };
        if let Some(r) = &request
            && r.meta().deletion_timestamp.is_none()
            && !r
                .finalizers()
                .iter()
                .any(|f| f == HOST_REMEDIATION_FINALIZER)
        {
            match self.add_finalizer(r).await {
                Some(updated) => request = Some(updated),
                None => return,
            }
        }

        // Record first (write-ahead), then act.
        let mut machine_now = item
            .machine
            .clone()
            .filter(|_| item.subject.trigger() == Trigger::MachineAnnotation);
        match &item.subject {
            Subject::Machine(m) => {
                if let Some(next) = &decision.record {
                    match self.write_machine_record(m, next).await {
                        Some(updated) => machine_now = Some(updated),
                        None => return,
                    }
                }
            }
            Subject::Request(_) => {
                let Some(r) = request.clone() else { return };
                let record = decision
                    .record
                    .clone()
                    .unwrap_or_else(|| item.observation.record.clone());
                match self
                    .write_request_status(&r, &record, decision, item, now)
                    .await
                {
                    Some(updated) => request = Some(updated),
                    None => return,
                }
            }
        }
        self.observe_metrics(item, decision, now);

        for action in &decision.actions {
            let ok = match action {
                Action::RequestPowerOff => {
                    self.set_host_annotation(item, Some(r#"{"mode":"hard"}"#))
                        .await
                }
                Action::ReleasePowerOff => self.set_host_annotation(item, None).await,
                Action::DeleteNode => {
                    let record = decision.record.as_ref().unwrap_or(&item.observation.record);
                    self.delete_node(item, record).await
                }
                Action::RestoreNode {
                    labels,
                    annotations,
                    cordon,
                    taints,
                } => {
                    self.restore_node(item, labels, annotations, *cordon, taints)
                        .await
                }
                Action::FinishAnnotationFlow => match &machine_now {
                    Some(m) => self.finish_machine(m).await,
                    None => true,
                },
                Action::MarkHostUnhealthy => self.mark_host_unhealthy(item).await,
                Action::ClearExternallyRemediated => self.clear_externally_remediated(item).await,
                Action::Escalate(kind) => self.escalate(item, kind).await,
            };
            if !ok {
                self.retry_soon = true;
                break;
            }
        }
        // Events, once per distinct set (a waiting remediation does not repeat itself).
        let mut events = decision.events.clone();
        if let Some(hint) = &item.ignored_hint {
            events.push(hostcycle_core::remediation::Event::warning(
                event_reason::HINT_IGNORED,
                hint.clone(),
            ));
        }
        let emitted: Vec<(&'static str, String)> = events
            .iter()
            .map(|e| (e.reason, e.message.clone()))
            .collect();
        if !emitted.is_empty() && self.last_events.get(&key) != Some(&emitted) {
            let primary = primary_ref(&item.subject);
            let host = item.host.as_ref().map(|h| {
                let mut r = h.object_ref(&());
                r.field_path = None;
                r
            });
            let node = item.observation.node_name.as_deref().map(node_ref);
            for e in &events {
                let kind = e.event_type;
                self.events.emit(&primary, kind, e.reason, &e.message);
                if let Some(h) = &host {
                    self.events.emit(h, kind, e.reason, &e.message);
                }
                if let Some(n) = &node {
                    self.events.emit(n, kind, e.reason, &e.message);
                }
            }
            self.last_events.insert(key.clone(), emitted);
        }

        // A request being deleted lets go once nothing of it is left on the host.
        if let Some(r) = &request
            && r.meta().deletion_timestamp.is_some()
        {
            let step = decision
                .record
                .as_ref()
                .map(|rec| rec.step)
                .unwrap_or(item.observation.record.step);
            let settled = matches!(
                step,
                RemediationStep::NotStarted
                    | RemediationStep::Done
                    | RemediationStep::GaveUp
                    | RemediationStep::Cancelled
            );
            let host_clear = !item.host.as_ref().is_some_and(|h| {
                h.annotations()
                    .contains_key(&item.subject.power_off_annotation())
            }) || decision.actions.contains(&Action::ReleasePowerOff);
            if settled && host_clear {
                self.remove_finalizer(r).await;
            }
        }
    }

    fn observe_metrics(&self, item: &Item, decision: &Decision, now: Timestamp) {
        let Some(next) = &decision.record else { return };
        let before = &item.observation.record;
        let m = &self.metrics.remediation;
        let trigger = item.subject.trigger().as_str().to_string();
        let secs = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
            (Some(a), Some(b)) => Some(b.duration_since(a).as_secs_f64().max(0.0)),
            _ => None,
        };
        if before.powered_off_at.is_none()
            && let Some(s) = secs(next.started_at, next.powered_off_at)
        {
            m.time_to_fence.observe(s);
        }
        if before.node_released_at.is_none()
            && let Some(s) = secs(next.powered_off_at, next.node_released_at)
        {
            m.time_to_release.observe(s);
        }
        let result = match (before.step, next.step) {
            (a, RemediationStep::Done) if a != RemediationStep::Done => {
                if let Some(s) = secs(next.started_at, Some(now)) {
                    m.time_to_recover.observe(s);
                }
                Some("succeeded")
            }
            (a, RemediationStep::GaveUp) if a != RemediationStep::GaveUp => Some("failed"),
            (a, RemediationStep::Cancelled) if a != RemediationStep::Cancelled => Some("cancelled"),
            _ => None,
        };
        if let Some(result) = result {
            m.remediations
                .get_or_create(&RemediationLabels {
                    trigger,
                    result: result.into(),
                })
                .inc();
        }
    }

    // ----- writes ------------------------------------------------------------------

    fn machine_api(&self, m: &MachineObject) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &m.object.namespace().unwrap_or_default(),
            &m.resource,
        )
    }

    /// Writes the annotation flow's record onto the Machine (resourceVersion precondition).
    async fn write_machine_record(
        &mut self,
        m: &MachineObject,
        record: &Record,
    ) -> Option<MachineObject> {
        let annotations: serde_json::Map<String, Value> = record
            .machine_annotations()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map(Value::String).unwrap_or(Value::Null)))
            .collect();
        self.patch_machine(
            m,
            json!({ "metadata": {
                "resourceVersion": m.object.resource_version(),
                "annotations": annotations,
            }}),
        )
        .await
    }

    /// The flow is over: the trigger and every marker go.
    async fn finish_machine(&mut self, m: &MachineObject) -> bool {
        let annotations: serde_json::Map<String, Value> =
            crate::cluster::objects::MACHINE_RECORD_ANNOTATIONS
                .iter()
                .map(|k| (k.to_string(), Value::Null))
                .collect();
        self.patch_machine(
            m,
            json!({ "metadata": {
                "resourceVersion": m.object.resource_version(),
                "annotations": annotations,
            }}),
        )
        .await
        .is_some()
    }

    async fn patch_machine(&mut self, m: &MachineObject, patch: Value) -> Option<MachineObject> {
        match self
            .machine_api(m)
            .patch(
                &m.object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(object) => Some(MachineObject {
                object: Arc::new(object),
                resource: m.resource.clone(),
            }),
            Err(e) => {
                log_write_error(&format!("Machine {}", m.key()), &e);
                self.retry_soon = true;
                None
            }
        }
    }

    async fn add_finalizer(&mut self, r: &HostRemediation) -> Option<HostRemediation> {
        let mut finalizers = r.finalizers().to_vec();
        finalizers.push(HOST_REMEDIATION_FINALIZER.to_string());
        let patch = json!({ "metadata": { "resourceVersion": r.resource_version(), "finalizers": finalizers } });
        self.patch_request(r, &patch).await
    }

    async fn remove_finalizer(&mut self, r: &HostRemediation) {
        let finalizers: Vec<String> = r
            .finalizers()
            .iter()
            .filter(|f| *f != HOST_REMEDIATION_FINALIZER)
            .cloned()
            .collect();
        let patch = json!({ "metadata": { "resourceVersion": r.resource_version(), "finalizers": finalizers } });
        self.patch_request(r, &patch).await;
    }

    async fn patch_request(
        &mut self,
        r: &HostRemediation,
        patch: &Value,
    ) -> Option<HostRemediation> {
        let api: Api<HostRemediation> =
            Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
        match api
            .patch(&r.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(updated) => Some(updated),
            Err(e) => {
                log_write_error(&format!("HostRemediation {}", r.name_any()), &e);
                self.retry_soon = true;
                None
            }
        }
    }

    /// Writes a request's status: the record, the phase, the message and the conditions
    /// health checkers read. Skipped when nothing changed.
    async fn write_request_status(
        &mut self,
        r: &HostRemediation,
        record: &Record,
        decision: &Decision,
        item: &Item,
        now: Timestamp,
    ) -> Option<HostRemediation> {
        let before = r.status.clone().unwrap_or_default();
        let mut status = before.clone();
        record.apply_to_status(&mut status);
        status.phase = Some(decision.phase);
        status.message = crate::text::bounded(&decision.message, 1024);
        status.node = item.observation.node_name.clone();
        // The bound host once there is one (the record wrote it), else the one found now.
        status.host = record
            .host
            .as_ref()
            .map(|b| b.reference.to_string())
            .or_else(|| {
                item.observation
                    .target
                    .as_ref()
                    .ok()
                    .map(|h| h.name.clone())
            });
        let processing = matches!(
            decision.phase,
            RemediationPhase::Running | RemediationPhase::Waiting
        );
        let (succeeded, succeeded_reason) = match record.step {
            RemediationStep::Done => ("True", "RemediationSucceeded"),
            RemediationStep::GaveUp => ("False", "RemediationFailed"),
            RemediationStep::Cancelled => ("False", "RemediationCancelled"),
            _ => ("Unknown", "RemediationInProgress"),
        };
        // True from the write that decides the Node's deletion (before it is deleted, so a
        // NodeHealthCheck reacting to the deletion never takes the request for an orphan)
        // until the Node is back, also after giving up.
        let node_gone_for_now = permanent_node_deletion_expected(record, item.node.is_some());
        let generation = r.metadata.generation;
        set_condition(
            &mut status,
            "Processing",
            if processing { "True" } else { "False" },
            if processing {
                "RemediationInProgress"
            } else {
                "NotProcessing"
            },
            &decision.message,
            now,
            generation,
        );
        set_condition(
            &mut status,
            "Succeeded",
            succeeded,
            succeeded_reason,
            &decision.message,
            now,
            generation,
        );
        set_condition(
            &mut status,
            "PermanentNodeDeletionExpected",
            if node_gone_for_now { "True" } else { "False" },
            if node_gone_for_now {
                "NodeDeletedUntilPowerOn"
            } else {
                "NodeKept"
            },
            if node_gone_for_now {
                "the Node was deleted to release its workloads; it registers again after the power-on"
            } else {
                "the Node is not deleted for good"
            },
            now,
            generation,
        );
        match decision.blocked {
            Some(reason) => set_condition(
                &mut status,
                "Blocked",
                "True",
                reason,
                &decision.message,
                now,
                generation,
            ),
            None => set_condition(
                &mut status,
                "Blocked",
                "False",
                "NotBlocked",
                "",
                now,
                generation,
            ),
        }
        if status == before {
            return Some(r.clone());
        }
        let mut next = r.clone();
        next.status = Some(status);
        let api: Api<HostRemediation> =
            Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match api.replace_status(&r.name_any(), &params, &next).await {
            Ok(updated) => Some(updated),
            Err(e) => {
                log_write_error(&format!("HostRemediation {}", r.name_any()), &e);
                self.retry_soon = true;
                None
            }
        }
    }

    // ----- actions -----------------------------------------------------------------

    /// Adds (`Some(value)`) or removes this remediation's power-off annotation on its host.
    async fn set_host_annotation(&mut self, item: &Item, value: Option<&str>) -> bool {
        // No acting host (the bound one is gone or was replaced): nothing to release, and a
        // power-off is never requested from another host.
        let Some(host) = &item.host else {
            return value.is_none();
        };
        let key = item.subject.power_off_annotation();
        match self
            .patch_bound_host_annotations(host, json!({ key: value }))
            .await
        {
            Ok(()) => true,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                false
            }
        }
    }

    /// Merges `annotations` into the host's. The uid in the patch is a precondition: a host
    /// re-created under this name since it was read has another, immutable one, and the
    /// patch is refused.
    async fn patch_bound_host_annotations(
        &self,
        host: &BareMetalHost,
        annotations: serde_json::Value,
    ) -> Result<(), kube::Error> {
        let api: Api<BareMetalHost> =
            Api::namespaced(self.client.clone(), &host.namespace().unwrap_or_default());
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": annotations } });
        api.patch(
            &host.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// Deletes the Node the record backed up (UID precondition: never a newer one).
    ///
    /// Deleting the Node releases its workloads for good, so the evidence is read again
    /// first, from the API server (the cache may lag): the bound host, off in a status written
    /// after this cycle's power-off request, without error.
    async fn delete_node(&mut self, item: &Item, record: &Record) -> bool {
        let Some(node) = &item.node else { return true };
        let Some(host) = &item.host else { return false };
        let hosts: Api<BareMetalHost> =
            Api::namespaced(self.client.clone(), &host.namespace().unwrap_or_default());
        let fresh = match hosts.get_opt(&host.name_any()).await {
            Ok(Some(h)) => h,
            Ok(None) => return false,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                return false;
            }
        };
        let view = host_view(&fresh, &item.subject.power_off_annotation());
        let same_host = record.host.as_ref().is_none_or(|b| b.uid == view.uid);
        if !same_host || !off_confirmed(&view, record) {
            tracing::info!(
                node = %node.name_any(),
                remediation = %item.subject.key(),
                "a fresh read of the host does not confirm it off: the node is kept"
            );
            return false;
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: node.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&node.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(node = %node.name_any(), remediation = %item.subject.key(), "node deleted; its host is off");
                true
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => true,
            Err(e) => {
                log_write_error(&format!("Node {}", node.name_any()), &e);
                false
            }
        }
    }

    /// Adds the backed-up labels, annotations and taints the new Node lacks (its own keys
    /// win), and its cordon when `cordon`.
    async fn restore_node(
        &mut self,
        item: &Item,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        cordon: bool,
        taints: &[hostcycle_api::remediation::TaintBackup],
    ) -> bool {
        let Some(name) = &item.observation.node_name else {
            return true;
        };
        let api: Api<Node> = Api::all(self.client.clone());
        for _ in 0..5 {
            let node = match api.get_opt(name).await {
                Ok(Some(n)) => n,
                Ok(None) => return false,
                Err(e) => {
                    log_write_error(&format!("Node {name}"), &e);
                    return false;
                }
            };
            let missing = |have: &BTreeMap<String, String>, backup: &BTreeMap<String, String>| {
                backup
                    .iter()
                    .filter(|(k, _)| !have.contains_key(*k))
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect::<serde_json::Map<String, Value>>()
            };
            let add_labels = missing(node.labels(), labels);
            let add_annotations = missing(node.annotations(), annotations);
            let spec = node.spec.clone().unwrap_or_default();
            let have_taints = spec.taints.clone().unwrap_or_default();
            let add_taints: Vec<&hostcycle_api::remediation::TaintBackup> = taints
                .iter()
                .filter(|t| {
                    !have_taints
                        .iter()
                        .any(|h| h.key == t.key && h.effect == t.effect)
                })
                .collect();
            let add_cordon = cordon && spec.unschedulable != Some(true);
            if add_labels.is_empty()
                && add_annotations.is_empty()
                && add_taints.is_empty()
                && !add_cordon
            {
                return true;
            }
            let mut patch = json!({ "metadata": {
                "resourceVersion": node.resource_version(),
                "labels": add_labels,
                "annotations": add_annotations,
            }});
            if add_cordon {
                patch["spec"]["unschedulable"] = json!(true);
            }
            if !add_taints.is_empty() {
                // A merge patch replaces the whole list: the Node's own taints, then the
                // restored ones (with the resourceVersion, so none added meanwhile is lost).
                let mut all: Vec<Value> = have_taints
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect();
                all.extend(
                    add_taints
                        .iter()
                        .map(|t| json!({ "key": t.key, "value": t.value, "effect": t.effect })),
                );
                patch["spec"]["taints"] = Value::Array(all);
            }
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return true,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    log_write_error(&format!("Node {name}"), &e);
                    return false;
                }
            }
        }
        false
    }

    async fn escalate(&mut self, item: &Item, kind: &Escalation) -> bool {
        let Some(machine) = &item.machine else {
            return true;
        };
        let api = self.machine_api(machine);
        let name = machine.object.name_any();
        match kind {
            Escalation::DeleteMachine => {
                // Irreversible: read the Machine (and a request) from the API server first,
                // and delete only the very version that still gives up; a change in between
                // (409) is read again.
                for _ in 0..3 {
                    let fresh = match api.get_opt(&name).await {
                        Ok(Some(m)) => m,
                        Ok(None) => return true,
                        Err(e) => {
                            log_write_error(&format!("Machine {}", machine.key()), &e);
                            return false;
                        }
                    };
                    if fresh.uid() != machine.object.uid()
                        || fresh.meta().deletion_timestamp.is_some()
                    {
                        return true;
                    }
                    if item.observation.record.power_on_timeout_at.is_some()
                        && self.node_exists(item).await != Some(false)
                    {
                        tracing::info!(machine = %machine.key(), "the node registered meanwhile (or cannot be read): the Machine is kept");
                        return true;
                    }
                    if !self.still_gives_up(item, &fresh).await {
                        tracing::info!(machine = %machine.key(), "a fresh read shows the remediation no longer gives up: the Machine is kept");
                        return true;
                    }
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: fresh.uid(),
                            resource_version: fresh.resource_version(),
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(&name, &params).await {
                        Ok(_) => return true,
                        Err(e) if is_not_found(&e) => return true,
                        Err(e) if is_conflict(&e) => continue,
                        Err(e) => {
                            log_write_error(&format!("Machine {}", machine.key()), &e);
                            return false;
                        }
                    }
                }
                false
            }
            Escalation::MarkOwnerRemediated => {
                let current = match api.get(&name).await {
                    Ok(m) => m,
                    Err(e) => {
                        log_write_error(&format!("Machine {}", machine.key()), &e);
                        return false;
                    }
                };
                let status = current.data.get("status").cloned().unwrap_or(Value::Null);
                let mut patch = capi_gave_up_patch(
                    &status,
                    ConditionsLayout::of(&machine.resource.api_version),
                    Timestamp::now(),
                    "hostcycle gave up remediating this machine; its owner should replace it",
                    // The MachineHealthCheck set ExternallyRemediated when it made the request.
                    matches!(item.subject, Subject::Request(_)),
                );
                patch["metadata"] = json!({ "resourceVersion": current.resource_version() });
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => true,
                    Err(e) => {
                        log_write_error(&format!("Machine {} status", machine.key()), &e);
                        false
                    }
                }
            }
            Escalation::None(_) => true,
        }
    }

    /// The annotation flow's power-on timeout is the `nodeStartupTimeout` of the OpenShift
    /// MachineHealthCheck that selects the Machine, as CAPBM reads it (the flag when none
    /// does, or it is 0). Read from the API server only when the deadline is about to be
    /// recorded: once per remediation.
    async fn follow_machine_health_check(&self, item: &mut Item) {
        let Subject::Machine(m) = &item.subject else {
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

    /// Whether the remediation's Node exists, read from the API server; `None` when unknown.
    async fn node_exists(&self, item: &Item) -> Option<bool> {
        let name = item.observation.node_name.as_ref()?;
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Ok(node) => Some(node.is_some()),
            Err(e) => {
                log_write_error(&format!("Node {name}"), &e);
                None
            }
        }
    }

    /// Marks the host the remediation gave up on as CAPM3 does (`capm3.metal3.io/unhealthy`):
    /// CAPM3 chooses no such host for a new Machine, and hostcycle starts no remediation on it.
    async fn mark_host_unhealthy(&mut self, item: &Item) -> bool {
        let Some(host) = &item.host else { return true };
        let mark = json!({ CAPM3_UNHEALTHY_ANNOTATION: CAPM3_UNHEALTHY_VALUE });
        match self.patch_bound_host_annotations(host, mark).await {
            Ok(()) => true,
            Err(e) if is_not_found(&e) || is_conflict(&e) => true,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                false
            }
        }
    }

    /// Removes `ExternallyRemediated` from the request's Cluster API Machine: remediated.
    async fn clear_externally_remediated(&mut self, item: &Item) -> bool {
        let Some(machine) = &item.machine else {
            return true;
        };
        let api = self.machine_api(machine);
        let name = machine.object.name_any();
        for _ in 0..3 {
            let current = match api.get_opt(&name).await {
                Ok(Some(m)) => m,
                Ok(None) => return true,
                Err(e) => {
                    log_write_error(&format!("Machine {}", machine.key()), &e);
                    return false;
                }
            };
            let status = current.data.get("status").cloned().unwrap_or(Value::Null);
            let Some(mut patch) =
                capi_remediated_patch(&status, ConditionsLayout::of(&machine.resource.api_version))
            else {
                return true;
            };
            patch["metadata"] = json!({ "resourceVersion": current.resource_version() });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return true,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    log_write_error(&format!("Machine {} status", machine.key()), &e);
                    return false;
                }
            }
        }
        false
    }

    /// Whether the remediation still gives up on this Machine, read from the API server: the
    /// annotation flow's Machine still carries its trigger and its failure; a request still
    /// exists, is not being deleted, and no checker gave up on it.
    async fn still_gives_up(&self, item: &Item, fresh: &DynamicObject) -> bool {
        match &item.subject {
            Subject::Machine(_) => {
                let a = fresh.annotations();
                a.contains_key(hostcycle_api::remediation::EXTERNAL_REMEDIATION_ANNOTATION)
                    && a.contains_key(hostcycle_api::remediation::REMEDIATION_FAILED_ANNOTATION)
            }
            Subject::Request(r) => {
                let api: Api<HostRemediation> =
                    Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
                match api.get_opt(&r.name_any()).await {
                    Ok(Some(now)) => {
                        now.uid() == r.uid()
                            && super::observe::requested(&Subject::Request(Arc::new(now.clone())))
                            && now
                                .status
                                .as_ref()
                                .is_some_and(|s| s.step == RemediationStep::GaveUp)
                    }
                    _ => false,
                }
            }
        }
    }

    /// Power-off annotations whose remediation no longer exists (a Machine or request deleted
    /// without its cleanup): the host is released, never left off.
    async fn sweep_orphans(&mut self) {
        // Most hosts carry no power-off annotation: nothing more is read for them.
        let fenced: Vec<Arc<BareMetalHost>> = self
            .stores
            .hosts
            .state()
            .into_iter()
            .filter(|h| h.annotations().keys().any(|k| is_remediation_power_off(k)))
            .collect();
        if fenced.is_empty() {
            return;
        }
        let requests: HashSet<String> = self
            .stores
            .requests
            .state()
            .iter()
            .filter_map(|r| r.uid())
            .collect();
        let machines = self.cached_machines();
        let claims = self.machine_flow_claims(&machines);
        for host in fenced {
            let reference = host_reference(&host);
            let uid = host.uid().unwrap_or_default();
            let orphaned = orphaned_power_off_keys(
                host.annotations().keys(),
                |uid| requests.contains(uid),
                || claims.claims(&reference, &uid),
            );
            if orphaned.is_empty() {
                continue;
            }
            let ns = reference.namespace.clone();
            let name = reference.name.clone();
            for key in orphaned {
                // Confirm with the API server: the caches may lag a write of our own.
                if !self.orphan_confirmed(&key, &reference, &uid).await {
                    continue;
                }
                let api: Api<BareMetalHost> = Api::namespaced(self.client.clone(), &ns);
                let patch = json!({ "metadata": {
                    "resourceVersion": host.resource_version(),
                    "annotations": { key.clone(): null },
                }});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        let note = format!(
                            "removed {key}: the remediation that put it there is gone; the host is released"
                        );
                        self.events.emit(
                            &host.object_ref(&()),
                            EventType::Warning,
                            event_reason::ORPHAN_RELEASED,
                            &note,
                        );
                    }
                    Err(e) => {
                        let host_id = format!("{ns}/{name}");
                        let _about = tracing::info_span!("orphan", host = %host_id).entered();
                        log_write_error(&format!("BareMetalHost {host_id}"), &e);
                        self.retry_soon = true;
                    }
                }
            }
        }
    }

    fn cached_machines(&self) -> Vec<MachineObject> {
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

    /// The hosts the annotation flows of `machines` hold, by the flow's own rule: the host
    /// its record bound (namespace, name and uid), or — before it bound one — the host the
    /// resolver binds to the Machine (hosts and Nodes from the caches).
    fn machine_flow_claims(&self, machines: &[MachineObject]) -> FlowClaims {
        let mut claims = FlowClaims::default();
        let flows: Vec<&MachineObject> = machines.iter().filter(|m| m.has_flow()).collect();
        if flows.is_empty() {
            return claims;
        }
        let hosts = self.stores.hosts.state();
        let nodes = self.stores.nodes.state();
        let index = binding_index(
            hosts.iter().map(|h| &**h),
            machines.iter().map(|m| &*m.object),
            nodes.iter().map(|n| &**n),
        );
        for m in flows {
            let record = Record::from_machine_annotations(m.object.annotations(), false);
            match record.host {
                Some(bound) => {
                    claims.bound.insert((bound.reference, bound.uid));
                }
                None => {
                    if let Ok(b) = index.machine(&crate::cluster::objects::machine_key(&m.object)) {
                        claims.resolved.insert(b.host);
                    }
                }
            }
        }
        claims
    }

    async fn orphan_confirmed(&self, key: &str, host: &HostReference, uid: &str) -> bool {
        if let Some(uid) = key.strip_prefix(REQUEST_POWER_OFF_PREFIX) {
            let api: Api<HostRemediation> = Api::all(self.client.clone());
            return match api.list(&Default::default()).await {
                Ok(list) => !list.items.iter().any(|r| r.uid().as_deref() == Some(uid)),
                Err(_) => false,
            };
        }
        let mut fresh = Vec::new();
        for (resource, _) in &self.stores.machines {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            let Ok(list) = api.list(&Default::default()).await else {
                return false;
            };
            fresh.extend(list.items.into_iter().map(|m| MachineObject {
                object: Arc::new(m),
                resource: resource.clone(),
            }));
        }
        !self.machine_flow_claims(&fresh).claims(host, uid)
    }
}

/// Hosts held by annotation flows: bound ones (with their uid), and ones a flow that has not
/// bound yet resolves to.
#[derive(Default)]
struct FlowClaims {
    bound: HashSet<(HostReference, String)>,
    resolved: HashSet<HostReference>,
}

impl FlowClaims {
    fn claims(&self, host: &HostReference, uid: &str) -> bool {
        self.resolved.contains(host) || self.bound.contains(&(host.clone(), uid.to_string()))
    }
}

fn primary_ref(subject: &Subject) -> ObjectReference {
    match subject {
        Subject::Machine(m) => ObjectReference {
            api_version: Some(m.resource.api_version.clone()),
            kind: Some(m.resource.kind.clone()),
            name: Some(m.object.name_any()),
            namespace: m.object.namespace(),
            uid: m.object.uid(),
            ..Default::default()
        },
        Subject::Request(r) => r.object_ref(&()),
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

fn log_write_error(what: &str, e: &kube::Error) {
    match e {
        _ if is_conflict(e) => {
            tracing::debug!(object = what, "changed meanwhile; deciding again")
        }
        _ => tracing::warn!(object = what, error = %e, "write failed; retrying"),
    }
}

/// Sets a condition; `lastTransitionTime` changes only with `status`.
fn set_condition(
    status: &mut HostRemediationStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let fresh = Condition {
        type_: type_.to_string(),
        status: value.to_string(),
        reason: reason.to_string(),
        message: crate::text::bounded(message, 1024),
        last_transition_time: Time(wire_precision(now)),
        observed_generation: generation,
    };
    set_status_condition(&mut status.conditions, fresh);
}
