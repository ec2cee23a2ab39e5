//! The health check loop: every tick (staleness is a matter of time) and on any change of a
//! check, a request or a queue entry, each HostHealthCheck is observed, decided
//! (`hostcycle_core::health::decide`), its status recorded, and then acted on.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hostcycle_api::health::{HostHealthCheck, NODE_LEASE_NAMESPACE};
use hostcycle_api::queue::{REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry, RebootQueueSpec};
use hostcycle_api::reasons::EventType;
use hostcycle_api::reasons::health::event_reason;
use hostcycle_api::remediation::HostRemediation;
use hostcycle_core::health::{
    Action, CheckFacts, Decision, HealthSettings, NodeHealth, Storm, Suspension, Unhealthy, decide,
    judge, rebooting_until,
};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::HealthControllerConfig;
use super::facts::{self, LeaseClock};
use crate::cluster::errors::{is_already_exists, is_conflict, is_not_found};
use crate::cluster::{ClusterView, Kinds};
use crate::events::{EventPublisher, EventSink, node_ref};
use crate::leader::LeaderGate;
use crate::metrics::{CheckLabels, CheckNodeStateLabels, HEALTH_NODE_STATES, Metrics, set_series};

const FIELD_MANAGER: &str = "hostcycle-health-check";
/// After a failed write or read: the next pass comes this soon.
const RETRY_SOON: Duration = Duration::from_secs(1);

/// The caches the loop decides from (the view's).
struct Stores {
    checks: Store<HostHealthCheck>,
    nodes: Store<Node>,
    requests: Store<HostRemediation>,
    entries: Store<RebootQueueEntry>,
    queues: Store<RebootQueue>,
    leases: Store<Lease>,
}

/// The health check controller, subscribed to the view at once (before its watches start);
/// the returned future runs it until `shutdown` fires: it waits for the caches, then judges
/// once `leading` opens.
pub fn run(
    view: &ClusterView,
    config: HealthControllerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    leading: LeaderGate,
    shutdown: CancellationToken,
    synced: impl FnOnce() + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let client = view.client().clone();
    let wake = Arc::new(Notify::new());
    let clock: Arc<Mutex<LeaseClock>> = Arc::default();
    let stores = subscribe(view, &wake, clock.clone());
    let listed = view.listed(Kinds::HEALTH);
    async move {
        let (events, event_task) = EventSink::start(
            EventPublisher::new(client.clone(), "hostcycle.io/health-check", identity),
            "HealthCheck",
        );
        let mut controller = Controller {
            client,
            config,
            metrics,
            events,
            stores,
            clock,
            watching_since: Timestamp::now(),
            own_writes: HashMap::new(),
            told: HashMap::new(),
            series: Series::default(),
            retry_soon: false,
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = listed => {
                tracing::info!("health check caches synced");
                synced();
                // A standby replica keeps its caches (and its Lease clock) warm, and stops
                // here until it leads.
                if leading.wait_to_lead(&shutdown).await {
                    // Warm-up counts from here: only now does this replica judge.
                    controller.watching_since = Timestamp::now();
                    tracing::info!("leading: the health check loop starts");
                    let mut next = tokio::time::Instant::now();
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = wake.notified() => {}
                            _ = tokio::time::sleep_until(next) => {}
                        }
                        let wait = controller.pass().await;
                        next = tokio::time::Instant::now() + wait;
                    }
                }
            }
        }
        drop(controller);
        let _ = tokio::time::timeout(Duration::from_secs(2), event_task).await;
    }
}

/// Subscribes to the kinds the loop reads. Lease changes never wake it: they are recorded in
/// the clock as the watch delivers them (so the time is when the watch saw them, not when
/// the loop came round).
fn subscribe(view: &ClusterView, wake: &Arc<Notify>, clock: Arc<Mutex<LeaseClock>>) -> Stores {
    view.node_leases
        .wake_on(wake.clone(), move |lease: &Lease| {
            lock(&clock).observe(lease, Timestamp::now());
            false
        });
    view.health_checks.wake_on(wake.clone(), |_| true);
    view.remediations.wake_on(wake.clone(), |_| true);
    view.entries.wake_on(wake.clone(), |_| true);
    Stores {
        checks: view.health_checks.store().clone(),
        nodes: view.nodes.store().clone(),
        requests: view.remediations.store().clone(),
        entries: view.entries.store().clone(),
        queues: view.queues.store().clone(),
        leases: view.node_leases.store().clone(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The metric series set at the last pass, so that a deleted check leaves none behind.
#[derive(Default)]
struct Series {
    nodes: HashSet<CheckNodeStateLabels>,
    storm: HashSet<CheckLabels>,
    suspended: HashSet<CheckLabels>,
}

/// What one pass sets the gauges to.
#[derive(Default)]
struct Gauges {
    nodes: HashMap<CheckNodeStateLabels, i64>,
    storm: HashMap<CheckLabels, i64>,
    suspended: HashMap<CheckLabels, i64>,
}

struct Controller {
    client: Client,
    config: HealthControllerConfig,
    metrics: Arc<Metrics>,
    events: EventSink,
    stores: Stores,
    clock: Arc<Mutex<LeaseClock>>,
    /// Since when this replica judges (it took the leader Lease then).
    watching_since: Timestamp,
    /// Each check's last status write (by uid) and the resourceVersion it replaced: used until
    /// the cache catches up, so a pass never decides from a stale copy of its own record.
    own_writes: HashMap<String, (String, HostHealthCheck)>,
    /// Events told, by check uid and subject, with what they said: a steady state tells
    /// nothing again.
    told: HashMap<String, String>,
    series: Series,
    retry_soon: bool,
}

/// One node's unhealthiness confirmed (or not) by live reads.
enum Confirmation {
    Confirmed,
    /// The API server's Lease differs from the one the cache showed: it was only late.
    Renewed,
    /// The Node is gone, no longer selected, excluded, or healthy by its live state.
    NotUnhealthy,
    /// A read failed: decided again next pass.
    Unknown,
}

impl Controller {
    /// One pass over every check; returns how long until the next.
    async fn pass(&mut self) -> Duration {
        self.retry_soon = false;
        let now = Timestamp::now();
        // 1. The Lease clock catches up with the cache: a (re-)list's Leases reach no filter.
        let leases = self.stores.leases.state();
        {
            let mut clock = lock(&self.clock);
            for lease in &leases {
                clock.observe(lease, now);
            }
            clock.retain(&leases.iter().map(|l| l.name_any()).collect());
        }
        // 2. Each check, on the caches.
        let nodes = self.stores.nodes.state();
        let requests = self.stores.requests.state();
        let rebooting = self.rebooting_nodes();
        let mut gauges = Gauges::default();
        let checks = self.stores.checks.state();
        let mut live = BTreeSet::new();
        for cached in &checks {
            let check = self.current(cached);
            let uid = check.metadata.uid.clone().unwrap_or_default();
            live.insert(uid);
            self.pass_check(&check, &nodes, &requests, &rebooting, now, &mut gauges)
                .await;
        }
        // 3. What deleted checks leave behind is forgotten.
        self.own_writes.retain(|uid, _| live.contains(uid));
        self.told
            .retain(|key, _| live.iter().any(|uid| key.starts_with(&format!("{uid}/"))));
        let health = &self.metrics.health;
        set_series(&health.nodes, &mut self.series.nodes, gauges.nodes);
        set_series(&health.storm_active, &mut self.series.storm, gauges.storm);
        set_series(
            &health.suspended,
            &mut self.series.suspended,
            gauges.suspended,
        );
        if self.retry_soon {
            RETRY_SOON
        } else {
            self.config.tick
        }
    }

    /// The check as this pass decides it: the cache's copy, or our own last write while the
    /// cache still shows what that write replaced.
    fn current(&mut self, cached: &Arc<HostHealthCheck>) -> HostHealthCheck {
        let uid = cached.metadata.uid.clone().unwrap_or_default();
        let version = cached.resource_version().unwrap_or_default();
        match self.own_writes.get(&uid) {
            Some((replaced, written)) if *replaced == version => written.clone(),
            _ => {
                self.own_writes.remove(&uid);
                (**cached).clone()
            }
        }
    }

    /// The nodes the reboot queue is rebooting, each with the end of its boot timeout.
    fn rebooting_nodes(&self) -> HashMap<String, Timestamp> {
        let boot_timeout = Duration::from_secs(
            self.stores
                .queues
                .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
                .map(|q| q.spec.boot_timeout_seconds())
                .unwrap_or_else(|| RebootQueueSpec::default().boot_timeout_seconds()),
        );
        let entries = self.stores.entries.state();
        rebooting_until(
            entries.iter().filter_map(|e| {
                e.rebooting_since()
                    .map(|since| (e.spec.node.as_str(), since))
            }),
            boot_timeout,
        )
    }

    fn facts(
        &self,
        check: &HostHealthCheck,
        nodes: &[Arc<Node>],
        requests: &[Arc<HostRemediation>],
        rebooting: &HashMap<String, Timestamp>,
        now: Timestamp,
    ) -> CheckFacts {
        let clock = lock(&self.clock);
        facts::check_facts(
            check,
            nodes.iter().map(|n| &**n),
            &clock,
            requests.iter().map(|r| &**r),
            rebooting,
            self.watching_since,
            now,
        )
    }

    /// Observe → decide → record → act, for one check.
    async fn pass_check(
        &mut self,
        check: &HostHealthCheck,
        nodes: &[Arc<Node>],
        requests: &[Arc<HostRemediation>],
        rebooting: &HashMap<String, Timestamp>,
        now: Timestamp,
        gauges: &mut Gauges,
    ) {
        let name = check.name_any();
        // 1. The settings; an unusable spec judges nothing and says so.
        let settings = match facts::settings(&check.spec) {
            Ok(settings) => settings,
            Err(why) => {
                let status = facts::status(check, Err(&why), now);
                if check.status.as_ref() != Some(&status) {
                    self.write_status(check, status).await;
                }
                self.tell(
                    check,
                    "spec",
                    &why,
                    None,
                    EventType::Warning,
                    event_reason::INVALID_SPEC,
                    &format!("HostHealthCheck {name} judges no node: {why}"),
                );
                return;
            }
        };
        // 2. Observe and decide; unhealthy nodes are confirmed live, then decided again.
        let mut facts = self.facts(check, nodes, requests, rebooting, now);
        let first = decide(&settings, &facts);
        let to_confirm: Vec<(String, Unhealthy)> = first
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::ConfirmLive { node, why } => Some((node.clone(), *why)),
                _ => None,
            })
            .collect();
        if !to_confirm.is_empty() {
            let confirmed = self
                .confirm_live(check, &settings, &to_confirm, rebooting, now)
                .await;
            // The clock may have learnt of renewals: the facts are read again.
            facts = self.facts(check, nodes, requests, rebooting, now);
            facts.confirmed_live = confirmed;
        }
        let decision = decide(&settings, &facts);
        // 3. Record first: a write that fails stops this check's pass.
        let status = facts::status(check, Ok(&decision), now);
        if check.status.as_ref() != Some(&status) && !self.write_status(check, status).await {
            return;
        }
        // 4. Act, then tell.
        self.tell_storm(check, &settings, facts.storm, &decision);
        self.act(check, &decision, requests).await;
        self.forget_healthy(check, &decision);
        gauge(gauges, &name, &decision);
    }

    /// Reads each node's Lease and Node from the API server: confirmed when the Lease is the
    /// very one the cache showed (not renewed since) and the live Node is still selected, not
    /// excluded, and unhealthy.
    async fn confirm_live(
        &mut self,
        check: &HostHealthCheck,
        settings: &HealthSettings,
        nodes: &[(String, Unhealthy)],
        rebooting: &HashMap<String, Timestamp>,
        now: Timestamp,
    ) -> BTreeSet<String> {
        let mut confirmed = BTreeSet::new();
        for (node, why) in nodes {
            match self
                .confirm_one(check, settings, node, *why, rebooting, now)
                .await
            {
                Confirmation::Confirmed => {
                    confirmed.insert(node.clone());
                }
                Confirmation::Renewed => {
                    tracing::info!(node, check = %check.name_any(), "the cache showed a stale Lease; the API server's was renewed: nothing is requested");
                    self.tell(
                        check,
                        &format!("unconfirmed/{node}"),
                        "renewed",
                        Some(node),
                        EventType::Normal,
                        event_reason::UNHEALTHY_NOT_CONFIRMED,
                        &format!(
                            "node {node} looked unhealthy in the cache ({}), but the API server's Lease was renewed: nothing is requested",
                            why.describe()
                        ),
                    );
                }
                Confirmation::NotUnhealthy | Confirmation::Unknown => {}
            }
        }
        confirmed
    }

    async fn confirm_one(
        &mut self,
        check: &HostHealthCheck,
        settings: &HealthSettings,
        node: &str,
        why: Unhealthy,
        rebooting: &HashMap<String, Timestamp>,
        now: Timestamp,
    ) -> Confirmation {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let (lease, live_node) = match (leases.get_opt(node).await, nodes.get_opt(node).await) {
            (Ok(lease), Ok(live_node)) => (lease, live_node),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(node, error = %e, "cannot read the Lease and Node of an unhealthy node before requesting its remediation; retrying");
                self.retry_soon = true;
                return Confirmation::Unknown;
            }
        };
        let Some(live_node) = live_node else {
            return Confirmation::NotUnhealthy;
        };
        if !facts::selects(check, &live_node) {
            return Confirmation::NotUnhealthy;
        }
        if let Some(lease) = &lease {
            let mut clock = lock(&self.clock);
            if !clock.unchanged(lease) {
                clock.observe(lease, now);
                // A node judged by its Ready condition renews its Lease all along.
                if matches!(why, Unhealthy::LeaseStale { .. }) {
                    return Confirmation::Renewed;
                }
            }
        }
        let facts = {
            let clock = lock(&self.clock);
            facts::node_facts(check, &live_node, &clock, &HashMap::new(), rebooting, now)
        };
        let judged = CheckFacts {
            now,
            watching_since: self.watching_since,
            paused: false,
            storm: Storm::Calm,
            nodes: Vec::new(),
            confirmed_live: BTreeSet::new(),
        };
        match judge(settings, &judged, &facts) {
            NodeHealth::Unhealthy(_) => Confirmation::Confirmed,
            _ => Confirmation::NotUnhealthy,
        }
    }

    /// Replaces the check's status, with the read resourceVersion as precondition. False when
    /// the write failed (retried soon).
    async fn write_status(
        &mut self,
        check: &HostHealthCheck,
        status: hostcycle_api::health::HostHealthCheckStatus,
    ) -> bool {
        let mut next = check.clone();
        next.status = Some(status);
        let api: Api<HostHealthCheck> = Api::all(self.client.clone());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match api.replace_status(&check.name_any(), &params, &next).await {
            Ok(written) => {
                self.own_writes.insert(
                    check.metadata.uid.clone().unwrap_or_default(),
                    (check.resource_version().unwrap_or_default(), written),
                );
                true
            }
            Err(e) => {
                if is_conflict(&e) {
                    tracing::debug!(check = %check.name_any(), "the check changed meanwhile; decided again");
                } else if !is_not_found(&e) {
                    tracing::warn!(check = %check.name_any(), error = %crate::text::api_error(&e, "update", "hosthealthchecks/status", ""), "cannot record the check's status; retrying");
                }
                self.retry_soon = true;
                false
            }
        }
    }

    /// Carries out the decision's actions and tells of them.
    async fn act(
        &mut self,
        check: &HostHealthCheck,
        decision: &Decision,
        requests: &[Arc<HostRemediation>],
    ) {
        let name = check.name_any();
        for action in &decision.actions {
            match action {
                Action::CreateRequest {
                    node,
                    why,
                    repeat_of,
                } => self.create_request(check, node, *why, *repeat_of).await,
                Action::DeleteRequest { node } => {
                    let ours = requests.iter().find(|r| {
                        facts::owned_by(r, check) && facts::request_node(r) == Some(node.as_str())
                    });
                    if let Some(request) = ours {
                        self.delete_request(check, node, request).await;
                    }
                }
                Action::Hold { node, why, because } => {
                    self.tell(
                        check,
                        &format!("hold/{node}"),
                        because.reason(),
                        Some(node),
                        EventType::Warning,
                        event_reason::REQUESTS_HELD,
                        &format!(
                            "node {node} is unhealthy ({}); no remediation is requested: {}",
                            why.describe(),
                            facts::suspension_text(*because)
                        ),
                    );
                }
                Action::ReportStillUnhealthy { node } => {
                    self.tell(
                        check,
                        &format!("still/{node}"),
                        "still",
                        Some(node),
                        EventType::Warning,
                        event_reason::NODE_STILL_UNHEALTHY,
                        &format!(
                            "node {node} is still unhealthy after its remediation finished; nothing more is requested for it until its request is deleted"
                        ),
                    );
                }
                // Not confirmed this pass (a read failed): decided again at the next one.
                Action::ConfirmLive { .. } => {}
            }
        }
        if let Some(Suspension::TooManyUnhealthy { unhealthy, allowed }) = decision.suspension {
            self.tell(
                check,
                "max-unhealthy",
                "exceeded",
                None,
                EventType::Warning,
                event_reason::MAX_UNHEALTHY_EXCEEDED,
                &format!(
                    "HostHealthCheck {name}: {unhealthy} selected nodes are unhealthy and maxUnhealthy allows {allowed}: no new remediation is requested"
                ),
            );
        } else {
            self.untell(check, "max-unhealthy");
        }
    }

    async fn create_request(
        &mut self,
        check: &HostHealthCheck,
        node: &str,
        why: Unhealthy,
        repeat_of: Option<Timestamp>,
    ) {
        let request = facts::request_object(
            check,
            node,
            &self.config.request_namespace,
            repeat_of.is_some(),
        );
        let request_name = request.name_any();
        let api: Api<HostRemediation> =
            Api::namespaced(self.client.clone(), &self.config.request_namespace);
        match api.create(&PostParams::default(), &request).await {
            Ok(_) => {
                self.metrics
                    .health
                    .requests_created
                    .get_or_create(&CheckLabels {
                        check: check.name_any(),
                    })
                    .inc();
                let ns = self.config.request_namespace.clone();
                self.tell(
                    check,
                    &format!("unhealthy/{node}"),
                    &request_name,
                    Some(node),
                    EventType::Warning,
                    event_reason::NODE_UNHEALTHY,
                    &format!("node {node} is unhealthy: {}", why.describe()),
                );
                if let Some(recovered) = repeat_of {
                    self.tell(
                        check,
                        &format!("repeated/{node}"),
                        &request_name,
                        Some(node),
                        EventType::Warning,
                        event_reason::REPEATED_FAILURE,
                        &format!(
                            "node {node} failed again {}s after recovering from its last remediation (at {recovered}; repeatFailureWindowSeconds is {}): its host is fenced and its workloads released, then it is left off for a person (HostRemediation {ns}/{request_name} has afterRelease: LeaveOff)",
                            hostcycle_core::time::elapsed(recovered, Timestamp::now()).as_secs(),
                            check.spec.repeat_failure_window_seconds(),
                        ),
                    );
                }
                self.tell(
                    check,
                    &format!("requested/{node}"),
                    &request_name,
                    Some(node),
                    EventType::Normal,
                    event_reason::REMEDIATION_REQUESTED,
                    &format!(
                        "requested the remediation of node {node}: HostRemediation {ns}/{request_name}"
                    ),
                );
            }
            // Made by an earlier pass the cache does not show yet (or before a restart).
            Err(e) if is_already_exists(&e) => {}
            Err(e) => {
                let text = crate::text::api_error(
                    &e,
                    "create",
                    "hostremediations",
                    &self.config.request_namespace,
                );
                tracing::warn!(node, error = %text, "cannot create the remediation request; retrying");
                self.retry_soon = true;
                self.tell(
                    check,
                    &format!("failed/{node}"),
                    &text,
                    None,
                    EventType::Warning,
                    event_reason::REQUEST_FAILED,
                    &format!("cannot request the remediation of node {node}: {text}"),
                );
            }
        }
    }

    async fn delete_request(
        &mut self,
        check: &HostHealthCheck,
        node: &str,
        request: &HostRemediation,
    ) {
        // Already being deleted: remediation's finalizer ends it.
        if request.metadata.deletion_timestamp.is_some() {
            return;
        }
        let namespace = request.namespace().unwrap_or_default();
        let api: Api<HostRemediation> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: request.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&request.name_any(), &params).await {
            Ok(_) => {
                self.metrics
                    .health
                    .requests_deleted
                    .get_or_create(&CheckLabels {
                        check: check.name_any(),
                    })
                    .inc();
                self.tell(
                    check,
                    &format!("deleted/{node}"),
                    &request.metadata.uid.clone().unwrap_or_default(),
                    Some(node),
                    EventType::Normal,
                    event_reason::REMEDIATION_REQUEST_DELETED,
                    &format!(
                        "node {node} is healthy again and its remediation finished: deleted HostRemediation {namespace}/{}",
                        request.name_any()
                    ),
                );
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => {
                let text = crate::text::api_error(&e, "delete", "hostremediations", &namespace);
                tracing::warn!(node, error = %text, "cannot delete the finished remediation request; retrying");
                self.retry_soon = true;
            }
        }
    }

    /// A storm's start and end, from the recorded state to the decided one.
    fn tell_storm(
        &mut self,
        check: &HostHealthCheck,
        settings: &HealthSettings,
        recorded: Storm,
        decision: &Decision,
    ) {
        let name = check.name_any();
        match (recorded, decision.storm) {
            (Storm::Active { .. }, Storm::Active { .. }) => {}
            (_, Storm::Active { since }) => {
                let stale = facts::stale_count(decision);
                self.tell(
                    check,
                    "storm",
                    &format!("active {since}"),
                    None,
                    EventType::Warning,
                    event_reason::STORM_DETECTED,
                    &format!(
                        "HostHealthCheck {name}: {stale} of {} selected nodes' Leases are stale at once (more than {}%): a control-plane or network failure rather than hosts; no remediation is requested until it ends and {}s have passed",
                        decision.nodes.len(),
                        settings.storm_percent,
                        settings.storm_cooldown.as_secs()
                    ),
                );
            }
            (Storm::Active { .. }, Storm::CoolingDown { until }) => {
                self.tell(
                    check,
                    "storm",
                    &format!("ended {until}"),
                    None,
                    EventType::Normal,
                    event_reason::STORM_ENDED,
                    &format!(
                        "HostHealthCheck {name}: the storm ended; remediation requests resume at {until}"
                    ),
                );
            }
            _ => {}
        }
    }

    /// A node healthy again will be told of afresh when it fails again.
    fn forget_healthy(&mut self, check: &HostHealthCheck, decision: &Decision) {
        let uid = check.metadata.uid.clone().unwrap_or_default();
        for (node, health) in &decision.nodes {
            if matches!(health, NodeHealth::Healthy) {
                for subject in [
                    "hold",
                    "still",
                    "unconfirmed",
                    "unhealthy",
                    "failed",
                    "requested",
                    "repeated",
                ] {
                    self.told.remove(&format!("{uid}/{subject}/{node}"));
                }
            }
        }
    }

    /// Tells an Event about the check (and the node, if any) unless the same was told last
    /// about this subject.
    #[allow(clippy::too_many_arguments)]
    fn tell(
        &mut self,
        check: &HostHealthCheck,
        subject: &str,
        signature: &str,
        node: Option<&str>,
        kind: EventType,
        reason: &str,
        note: &str,
    ) {
        let key = format!(
            "{}/{subject}",
            check.metadata.uid.as_deref().unwrap_or_default()
        );
        if self.told.get(&key).map(String::as_str) == Some(signature) {
            return;
        }
        self.told.insert(key, signature.to_string());
        self.events.emit(&check_ref(check), kind, reason, note);
        if let Some(node) = node {
            self.events.emit(&node_ref(node), kind, reason, note);
        }
    }

    fn untell(&mut self, check: &HostHealthCheck, subject: &str) {
        let key = format!(
            "{}/{subject}",
            check.metadata.uid.as_deref().unwrap_or_default()
        );
        self.told.remove(&key);
    }
}

/// The gauges of one check after a pass.
fn gauge(gauges: &mut Gauges, check: &str, decision: &Decision) {
    let mut by_state: HashMap<&str, i64> = HEALTH_NODE_STATES.iter().map(|s| (*s, 0)).collect();
    for (_, health) in &decision.nodes {
        let state = match health {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Unhealthy(_) => "unhealthy",
            NodeHealth::Excluded => "excluded",
            NodeHealth::Rebooting => "rebooting",
            NodeHealth::WarmingUp => "warming_up",
        };
        *by_state.entry(state).or_default() += 1;
    }
    for (state, count) in by_state {
        gauges.nodes.insert(
            CheckNodeStateLabels {
                check: check.to_string(),
                state: state.to_string(),
            },
            count,
        );
    }
    let labels = CheckLabels {
        check: check.to_string(),
    };
    gauges.storm.insert(
        labels.clone(),
        i64::from(matches!(decision.storm, Storm::Active { .. })),
    );
    gauges
        .suspended
        .insert(labels, i64::from(decision.suspension.is_some()));
}

/// A reference to a HostHealthCheck for Events (cluster-scoped: they go to kube-system).
fn check_ref(check: &HostHealthCheck) -> ObjectReference {
    ObjectReference {
        api_version: Some("hostcycle.io/v1alpha1".into()),
        kind: Some("HostHealthCheck".into()),
        name: Some(check.name_any()),
        uid: check.metadata.uid.clone(),
        namespace: None,
        ..Default::default()
    }
}
