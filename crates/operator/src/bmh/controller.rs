//! The BareMetalHost power controller's loop: the only writer of host power.
//!
//! observe (BMC power state, credentials) → decide (`hostcycle_core::bmh`, pure) →
//! record status (write-ahead, with a resourceVersion precondition) → act (annotations,
//! power calls, Events) → record the power call's result.
//!
//! Crash-only: a power request is written to `status.lastPowerAction` before it is sent, so a
//! restart at any point resumes from the object without sending it twice.

use crate::cluster::errors::is_conflict;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use hostcycle_api::{
    BareMetalHost, BareMetalHostStatus, PowerOffMode, classify_reboot_annotation, is_detached,
    is_paused,
};
use hostcycle_bmc::{BmcConnector, BmcError, ConnectorOptions, PowerDriver, PowerOutcome};
use hostcycle_core::bmh::lanes::{Lane, LaneLimits};
use hostcycle_core::bmh::{
    Action, BmcObservation, DecideConfig, Decision, EventType, HostSnapshot, StatusUpdate,
    after_power_call, apply_status_updates, decide_with_config, observation,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::host_metrics;
use super::lanes::{LaneSlot, Lanes, LanesClosed, claim_for};
use super::observe::{DriverCache, HostBmc, SecretCache, power_call_result, read_power};
use crate::backoff::{ErrorBackoff, FailureCounts};
use crate::cluster::ClusterView;
use crate::cluster::watch::{Feed, Watched, log_watch_error};
use crate::events::{EventPublisher, EventSink};
use crate::leader::LeaderGate;
use crate::metrics::{
    BmcErrorLabels, BmcRequestLabels, ControllerLabels, Metrics, PowerActionLabels, StatusLabels,
};

const CONTROLLER: &str = "baremetalhost";
const FIELD_MANAGER: &str = "hostcycle-operator";

/// Settings of the BareMetalHost controller.
#[derive(Debug, Clone)]
pub struct BmhControllerConfig {
    pub decide: DecideConfig,
    pub bmc: ConnectorOptions,
    /// Hosts whose power state is polled at once (steady state).
    pub concurrency: u16,
    /// Hosts with a requested power action handled at once. A lane of its own: requested
    /// actions never wait behind steady-state reads of hung BMCs.
    pub action_concurrency: u16,
    /// Slots kept for remediation power-offs (hosts carrying a remediation power-off
    /// annotation), which ordinary actions and steady polls never take; such a host also
    /// takes a free action slot when these are full.
    pub fencing_concurrency: u16,
    /// Percentage of each lane the hosts of one namespace may hold at once (at least one
    /// slot): one tenant's hung BMCs never hold every slot.
    pub namespace_lane_share: u8,
    /// Slots of each lane the hosts of one BMC endpoint may hold at once.
    pub lane_slots_per_bmc: u16,
    /// Deadline of one power-state read, retries included: a hung BMC holds its slot no
    /// longer than this. Power calls keep the BMC call deadline of `bmc`.
    pub read_deadline: Duration,
    /// Deadline of the read that precedes a power action not sent yet ([`read_deadline_for`]):
    /// a black-holed BMC holds an action slot no longer than this.
    pub action_read_deadline: Duration,
    /// Retry delays of failed reconciles (status writes, annotation patches).
    pub error_backoff: ErrorBackoff,
    /// Retry delays after a conflict (the cache lagged a write).
    pub conflict_backoff: ErrorBackoff,
    /// Retry delays while the API server cannot be reached at all: short, so a requested
    /// action goes ahead within seconds of the server's return, however long it was away.
    pub unreachable_backoff: ErrorBackoff,
    /// Which Secrets may be used as BMC credentials, and where they may be sent.
    pub credentials: CredentialsPolicy,
}

/// Which Secrets serve as BMC credentials and where their contents may go (see
/// `hostcycle_bmc::destination` and docs/security.md).
#[derive(Debug, Clone, Default)]
pub struct CredentialsPolicy {
    /// `--bmc-networks`, `--allow-plain-http-bmc`. Default: no network, so nothing is sent.
    pub destinations: hostcycle_bmc::destination::CredentialDestinations,
    /// `--refuse-unverified-bmc-tls`: a host with `disableCertificateVerification: true` gets
    /// no credentials.
    pub refuse_unverified_tls: bool,
    /// `--bmc-credentials-label`: only Secrets with this label are watched and used.
    pub label: Option<(String, String)>,
}

impl BmhControllerConfig {
    /// The lanes' sizes and caps.
    pub fn lane_limits(&self) -> LaneLimits {
        LaneLimits::new(
            usize::from(self.fencing_concurrency),
            usize::from(self.action_concurrency),
            usize::from(self.concurrency),
            self.namespace_lane_share,
            usize::from(self.lane_slots_per_bmc),
        )
    }
}

impl Default for BmhControllerConfig {
    fn default() -> Self {
        BmhControllerConfig {
            decide: DecideConfig::default(),
            bmc: ConnectorOptions::default(),
            concurrency: 64,
            action_concurrency: 64,
            fencing_concurrency: 16,
            namespace_lane_share: 50,
            lane_slots_per_bmc: 8,
            read_deadline: Duration::from_secs(15),
            action_read_deadline: Duration::from_secs(5),
            error_backoff: ErrorBackoff::ERRORS,
            conflict_backoff: ErrorBackoff::CONFLICTS,
            unreachable_backoff: ErrorBackoff::API_UNREACHABLE,
            credentials: CredentialsPolicy::default(),
        }
    }
}

/// Shared state of every reconcile.
pub struct Context {
    client: Client,
    drivers: DriverCache,
    secrets: SecretCache,
    events: EventSink,
    metrics: Arc<Metrics>,
    config: BmhControllerConfig,
    /// The fencing, action and steady lanes every reconcile waits in (`super::lanes`).
    lanes: Arc<Lanes>,
    failures: FailureCounts<ObjectRef<BareMetalHost>>,
    /// Consecutive failures to reach the API server at all, counted apart: an outage must not
    /// grow the backoff of the refusals that may follow it (a restarted API server answers
    /// 403 until its RBAC cache is filled).
    unreachable: FailureCounts<ObjectRef<BareMetalHost>>,
    /// Cancelled when leadership is lost or the process stops: no BMC call starts after it.
    work: CancellationToken,
    /// The hosts as watched: a steady poll waiting for its slot looks here for an action the
    /// host asks for meanwhile.
    hosts: Store<BareMetalHost>,
}

/// Whether a host has a power action requested or under way: it then reconciles in the
/// action lane. Read from the object alone (no BMC call).
pub fn wants_action(host: &BareMetalHost) -> bool {
    let requested = host
        .annotations_or_empty()
        .keys()
        .any(|k| classify_reboot_annotation(k).is_some());
    let Some(status) = host.status.as_ref() else {
        return requested;
    };
    let in_flight = status
        .last_power_action
        .as_ref()
        .is_some_and(|a| a.is_requested());
    let provisioning = &status.provisioning;
    let reboot_pending = match (
        provisioning.pending_reboot_since,
        provisioning.last_powered_on,
    ) {
        (Some(pending), Some(on)) => pending > on,
        (Some(_), None) => true,
        (None, _) => false,
    };
    let online_differs = status.powered_on.is_some_and(|on| on != host.spec.online);
    // One reading awaiting its confirming second (a power change just seen): fencing waits
    // on it, so it is not queued behind steady polls of hung BMCs. (A run restarted by a
    // failed read has no reading: a failing BMC stays in the steady lane.)
    let confirming = status
        .power_observation
        .as_ref()
        .is_some_and(|o| o.readings == 1 && observation::unconfirmed(Some(o)));
    requested || in_flight || reboot_pending || online_differs || confirming
}

/// What went wrong in one reconcile; the controller retries after a short delay.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("BareMetalHost has no namespace")]
    NoNamespace,
    #[error("writing status of BareMetalHost {host}: {source}")]
    WriteStatus {
        host: String,
        #[source]
        source: kube::Error,
    },
    #[error("removing annotations {keys:?} from BareMetalHost {host}: {source}")]
    RemoveAnnotations {
        host: String,
        keys: Vec<String>,
        #[source]
        source: kube::Error,
    },
    #[error("BareMetalHost {host} changed while being reconciled; reconciling again")]
    Conflict { host: String },
    #[error(
        "stopped before the next BMC call of BareMetalHost {host}: leadership lost or shutting down"
    )]
    Stopped { host: String },
}

impl ReconcileError {
    /// The API server could not be reached (no answer at all, as opposed to a refusal).
    pub fn api_unreachable(&self) -> bool {
        match self {
            ReconcileError::WriteStatus { source, .. }
            | ReconcileError::RemoveAnnotations { source, .. } => {
                !matches!(source, kube::Error::Api(_))
            }
            _ => false,
        }
    }
}

/// The controller, subscribed to the view's hosts at once (before the view's watches start);
/// the returned future runs it until `shutdown` fires. Its Secret watch starts with it and
/// `synced` is called once the hosts and Secret metadata are listed; reconciles start only
/// once `leading` opens, with one of every cached host.
pub fn run(
    view: &ClusterView,
    config: BmhControllerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    leading: LeaderGate,
    shutdown: CancellationToken,
    synced: impl FnOnce() + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let client = view.client().clone();
    let hosts = view.hosts.clone();
    // Every host the shared watch lists, changes or deletes, from its first list on.
    let touched = hosts.touched();
    let namespace = view.host_namespace().cloned();
    async move {
        let watched_secrets = Watched::in_namespace("secrets (metadata)", namespace.as_ref());
        // Secrets: metadata only (`Api<PartialObjectMeta<_>>` lists and watches metadata).
        let secrets: Api<PartialObjectMeta<Secret>> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        // A host's credentials Secret is fetched by name when it is first
        // needed and again only when its resourceVersion changes.
        let (secret_store, secret_writer) = reflector::store::<PartialObjectMeta<Secret>>();
        // With `--bmc-credentials-label`, only the labelled Secrets are listed at all.
        let secret_watch_config = match &config.credentials.label {
            Some((key, value)) => watcher::Config::default().labels(&format!("{key}={value}")),
            None => watcher::Config::default(),
        };
        // React to spec and annotation changes, deletions, Secrets and our own requeues — not
        // to status-only updates (our own writes): those would bypass the error backoff.
        let host_events = touched
            .map(Ok::<BareMetalHost, watcher::Error>)
            .predicate_filter(spec_or_annotations, PredicateConfig::default());
        let (secrets_listed, mut secrets_listed_rx) = tokio::sync::watch::channel(false);
        // The Secret cache waits for it before it says a Secret is not labelled.
        let secrets_listed_for_cache = secrets_listed.subscribe();
        let secret_events = crate::cluster::watch::note_listed(
            reflector(
                secret_writer,
                watcher::watcher(secrets, secret_watch_config)
                    .modify(crate::cluster::watch::keep_identity_only),
            ),
            secrets_listed,
        )
        .map_err(move |e| {
            log_watch_error(&e, &watched_secrets);
            e
        })
        .backoff(crate::backoff::WatchBackoff::default())
        .touched_objects();
        // The watches run from now on, leader or not: a standby replica's caches stay warm.
        let (host_events, host_watch) = forward_when_leading(host_events, leading.clone());
        let (secret_events, secret_watch) = forward_when_leading(secret_events, leading.clone());
        // Both caches filled: said from the watch streams, never by waiting on a store (the
        // controller's runner waits on the host store; see `cluster::watch`).
        let sync_stop = shutdown.clone();
        // Reconciles start once the hosts are listed; Secrets are read by name when a host
        // needs one, so a refused Secret watch does not hold every host back.
        let hosts_listed = hosts.clone();
        let sync_task = tokio::spawn(async move {
            // The guards `wait_for` returns are not Send: only whether it happened is kept.
            let listed = futures::future::join(hosts_listed.wait_listed(), async {
                secrets_listed_rx.wait_for(|listed| *listed).await.is_ok()
            });
            tokio::select! {
                _ = sync_stop.cancelled() => {}
                ((), true) = listed => {
                    tracing::info!("BareMetalHost and Secret caches synced");
                    synced();
                }
            }
        });
        if leading.wait_to_lead(&shutdown).await {
            act(
                client,
                config,
                metrics,
                &identity,
                (hosts, host_events),
                (secret_store, secrets_listed_for_cache, secret_events),
                shutdown,
            )
            .await;
        }
        sync_task.abort();
        host_watch.abort();
        secret_watch.abort();
    }
}

/// Objects of a watch stream, passed on only while this replica leads.
type Forwarded<K> = futures::channel::mpsc::UnboundedReceiver<Result<K, watcher::Error>>;

/// Drives `events` (and so the reflector behind it) in a task of its own and passes its
/// objects on once `leading` is open. Before that they are dropped: they are in the cache
/// (or will be, at the end of the first list), and the controller reconciles every cached
/// object once the first list is through.
fn forward_when_leading<K: Send + 'static>(
    events: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    leading: LeaderGate,
) -> (Forwarded<K>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let task = tokio::spawn(async move {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            // Errors were logged where they arose; the watcher retries by itself.
            if let Ok(object) = event
                && leading.is_open()
                && tx.unbounded_send(Ok(object)).is_err()
            {
                return;
            }
        }
    });
    (rx, task)
}

/// The controller proper, on the lead replica: reconciles every cached host once the hosts
/// are listed (at once if they are), then each one its watches touch, until `shutdown` fires.
async fn act(
    client: Client,
    config: BmhControllerConfig,
    metrics: Arc<Metrics>,
    identity: &str,
    (hosts, host_events): (Feed<BareMetalHost>, Forwarded<BareMetalHost>),
    (secret_store, secrets_listed, secret_events): (
        Store<PartialObjectMeta<Secret>>,
        tokio::sync::watch::Receiver<bool>,
        Forwarded<PartialObjectMeta<Secret>>,
    ),
    shutdown: CancellationToken,
) {
    let store = hosts.store().clone();
    let (events, _event_task) = EventSink::start(
        EventPublisher::new(client.clone(), "hostcycle.io/operator", identity),
        "PowerManagement",
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        // The connector resolves BMC names under the same networks the credentials check
        // uses: one flag, checked by name here and by resolved address at connect time.
        drivers: DriverCache::new(BmcConnector::new(ConnectorOptions {
            bmc_networks: config.credentials.destinations.networks.clone(),
            ..config.bmc.clone()
        })),
        secrets: SecretCache::watching(secret_store, secrets_listed),
        events,
        metrics: metrics.clone(),
        lanes: Lanes::new(config.lane_limits(), metrics.clone()),
        failures: FailureCounts::default(),
        unreachable: FailureCounts::default(),
        work: shutdown.clone(),
        config: config.clone(),
        hosts: store.clone(),
    });
    tracing::info!(
        hosts = store.state().len(),
        "leading: reconciling every host"
    );
    // Reconciles are not limited here: each waits for a slot of its lane (fencing, action or
    // steady; `super::lanes`).
    let controller = Controller::for_stream(host_events, store.clone())
        .with_config(controller::Config::default().concurrency(0))
        // Every cached host once the hosts are listed (at once if they are): what changed
        // while this replica stood by. Objects the watch passed on before this replica led
        // were dropped, and a Lease can be won before the first list is through.
        .reconcile_all_on(futures::stream::once(async move {
            hosts.wait_listed().await;
        }));
    // A fixed credentials Secret must bring its hosts back at once, not after the backoff.
    let host_store = store.clone();
    let controller =
        controller.watches_stream(secret_events, move |secret: PartialObjectMeta<Secret>| {
            let ns = secret.namespace();
            let name = secret.name_any();
            host_store
                .state()
                .into_iter()
                .filter(|h| {
                    h.namespace() == ns
                        && h.spec
                            .bmc
                            .as_ref()
                            .is_some_and(|b| b.credentials_name.trim() == name)
                })
                .map(|h| ObjectRef::from_obj(&*h))
                .collect::<Vec<_>>()
        });
    let housekeeping_task = tokio::spawn(housekeeping(store, ctx.clone(), shutdown.clone()));
    let stop = shutdown.clone();
    controller
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                log_reconcile_error(&e);
            }
        })
        .await;
    housekeeping_task.abort();
    // Free the BMCs' session slots: a session left behind can lock an administrator out.
    ctx.drivers.close_all(Duration::from_secs(5)).await;
}

/// The controller's own errors (a failed reconcile is also logged by `error_policy`).
fn log_reconcile_error(error: &controller::Error<ReconcileError, watcher::Error>) {
    match error {
        controller::Error::ReconcilerFailed(e, host) => {
            let host = format!(
                "{}/{}",
                host.namespace.as_deref().unwrap_or_default(),
                host.name
            );
            tracing::debug!(%host, error = %e, "reconcile failed");
        }
        other => tracing::debug!(error = %other, "controller error"),
    }
}

/// What a reconcile reacts to: the generation (spec) and the annotations.
fn spec_or_annotations(host: &BareMetalHost) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    host.metadata.generation.hash(&mut hasher);
    host.metadata.annotations.hash(&mut hasher);
    host.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// Every few seconds: keeps `hostcycle_hosts{operational_status}` and the per-host series
/// (`host_metrics`) current and drops the drivers and backoff counts of hosts that no longer
/// exist.
async fn housekeeping(
    store: kube::runtime::reflector::Store<BareMetalHost>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) {
    let metrics = ctx.metrics.clone();
    let mut unhealthy_series = std::collections::HashSet::new();
    let mut pending_series = std::collections::HashSet::new();
    loop {
        // Runs over every host every few seconds: it borrows from the cache and allocates
        // nothing per host, so it stays a small part of the CPU at rest with thousands.
        let hosts = store.state();
        let live: std::collections::HashSet<&str> = hosts
            .iter()
            .filter_map(|h| h.metadata.uid.as_deref())
            .collect();
        // An empty store may just not be synced yet; never drop every driver on that.
        if !live.is_empty() {
            ctx.drivers.retain_hosts(|uid| live.contains(uid));
        }
        ctx.secrets.retain_watched();
        // Backoff counts of deleted hosts (a host that comes back starts afresh).
        ctx.failures.retain(|key| store.get(key).is_some());
        ctx.unreachable.retain(|key| store.get(key).is_some());
        let mut counts = std::collections::BTreeMap::<&str, i64>::new();
        for s in ["OK", "discovered", "error", "detached", ""] {
            counts.insert(s, 0);
        }
        for host in &hosts {
            let status = host
                .status
                .as_ref()
                .and_then(|s| s.operational_status)
                .map(|s| s.as_str())
                .unwrap_or("");
            *counts.entry(status).or_default() += 1;
        }
        for (status, count) in counts {
            metrics
                .hosts
                .get_or_create(&StatusLabels {
                    operational_status: status.to_string(),
                })
                .set(count);
        }
        let series = host_metrics::host_series(hosts.iter().map(|h| &**h));
        crate::metrics::set_series(
            &metrics.bmc_unhealthy_since,
            &mut unhealthy_series,
            series.bmc_unhealthy_since,
        );
        crate::metrics::set_series(
            &metrics.reboot_pending_since,
            &mut pending_series,
            series.reboot_pending_since,
        );
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

fn error_policy(
    host: Arc<BareMetalHost>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> controller::Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ControllerLabels {
            controller: CONTROLLER.into(),
        })
        .inc();
    let key = ObjectRef::from_obj(&*host);
    let random = rand::random::<f64>();
    if error.api_unreachable() {
        let failures = ctx.unreachable.failed(key.clone());
        ctx.failures.succeeded(&key);
        let after = ctx.config.unreachable_backoff.delay(failures, random);
        tracing::warn!(host = %host_id(&host), error = %error, failures, retry_in = ?after, "API server unreachable; retrying");
        return controller::Action::requeue(after);
    }
    ctx.unreachable.succeeded(&key);
    let failures = ctx.failures.failed(key);
    match error {
        ReconcileError::Conflict { .. } => {
            controller::Action::requeue(ctx.config.conflict_backoff.delay(failures, random))
        }
        // Not retried: the work stops (the process exits or a new leader takes over).
        ReconcileError::Stopped { .. } => controller::Action::await_change(),
        _ => {
            let after = ctx.config.error_backoff.delay(failures, random);
            tracing::warn!(host = %host_id(&host), error = %error, failures, retry_in = ?after, "reconcile failed; retrying");
            controller::Action::requeue(after)
        }
    }
}

/// Runs `call` unless the work is stopped (lost leadership, shutdown) first; a call in flight
/// is abandoned when it stops (the write-ahead status lets the next leader resume).
async fn unless_stopped<T>(
    ctx: &Context,
    host: &BareMetalHost,
    call: impl std::future::Future<Output = T>,
) -> Result<T, ReconcileError> {
    let stopped = || ReconcileError::Stopped {
        host: host_id(host),
    };
    if ctx.work.is_cancelled() {
        return Err(stopped());
    }
    tokio::select! {
        biased;
        _ = ctx.work.cancelled() => Err(stopped()),
        out = call => Ok(out),
    }
}

fn host_id(host: &BareMetalHost) -> String {
    format!(
        "{}/{}",
        host.namespace().unwrap_or_default(),
        host.name_any()
    )
}

async fn reconcile(
    host: Arc<BareMetalHost>,
    ctx: Arc<Context>,
) -> Result<controller::Action, ReconcileError> {
    // A reconcile waiting for its slot yields to a more urgent claim its host makes meanwhile
    // (a reboot annotation added while every steady slot is held by hung BMCs, a remediation
    // power-off while an ordinary action waits): kube-rs runs one reconcile per host at a
    // time, so the new trigger would otherwise wait for this one. The promoted reconcile is
    // decided on the host as it is now.
    let claim = claim_for(&host);
    let waiting = {
        let ctx = ctx.clone();
        let host = host.clone();
        async move {
            let class = claim.class;
            tokio::select! {
                slot = ctx.lanes.acquire(claim) => (host, slot),
                promoted = promoted(&ctx, &host, class) => promoted,
            }
        }
    };
    let (host, slot) = unless_stopped(&ctx, &host, Box::pin(waiting)).await?;
    let _slot = match slot {
        Ok(slot) => slot,
        Err(LanesClosed) => {
            return Err(ReconcileError::Stopped {
                host: host_id(&host),
            });
        }
    };
    // Every line logged while reconciling (the BMC drivers' too) names the host. Boxed: every
    // host's reconcile exists at once while it waits for a slot (5,000 at the start with 5,000
    // hosts); unboxed, each waiting one would reserve the ~10 KB the running reconcile needs.
    let span = tracing::info_span!("reconcile", host = %host_id(&host));
    let result = Box::pin(reconcile_in_lane(&host, &ctx).instrument(span)).await;
    if result.is_ok() {
        let key = ObjectRef::from_obj(&*host);
        ctx.failures.succeeded(&key);
        ctx.unreachable.succeeded(&key);
    }
    result
}

/// Resolves once the watched host makes a claim more urgent than `waiting_as` (see
/// [`claim_for`]: a requested action outranks a steady poll, a remediation power-off any
/// other action) and that claim is served: the latest host and its slot.
async fn promoted(
    ctx: &Arc<Context>,
    host: &Arc<BareMetalHost>,
    waiting_as: Lane,
) -> (Arc<BareMetalHost>, Result<LaneSlot, LanesClosed>) {
    if waiting_as == Lane::Fencing {
        // Nothing outranks a power-off for remediation.
        return std::future::pending().await;
    }
    let key = ObjectRef::from_obj(&**host);
    loop {
        tokio::time::sleep(PROMOTION_CHECK).await;
        let Some(latest) = ctx.hosts.get(&key) else {
            continue;
        };
        let claim = claim_for(&latest);
        if claim.class < waiting_as {
            let slot = ctx.lanes.acquire(claim).await;
            return (latest, slot);
        }
    }
}

/// How often a reconcile waiting for its slot looks for a more urgent claim of its host.
const PROMOTION_CHECK: Duration = Duration::from_millis(100);

/// The deadline of the power-state read a reconcile of `host` makes. The read that precedes
/// a power action not sent yet gets the short `action_read_deadline`: a black-holed BMC then
/// holds an action slot no longer than that. Reads that follow a power call (an action in
/// flight, a reading awaiting its confirming second) and steady polls keep `read_deadline`:
/// a slow BMC must still be seen reaching the state it was asked for.
pub fn read_deadline_for(host: &BareMetalHost, config: &BmhControllerConfig) -> Duration {
    let status = host.status.as_ref();
    let in_flight = status
        .and_then(|s| s.last_power_action.as_ref())
        .is_some_and(|a| a.is_requested());
    let confirming = status
        .and_then(|s| s.power_observation.as_ref())
        .is_some_and(|o| o.readings == 1 && observation::unconfirmed(Some(o)));
    if wants_action(host) && !in_flight && !confirming {
        config.action_read_deadline.min(config.read_deadline)
    } else {
        config.read_deadline
    }
}

async fn reconcile_in_lane(
    host: &Arc<BareMetalHost>,
    ctx: &Arc<Context>,
) -> Result<controller::Action, ReconcileError> {
    ctx.metrics
        .reconciles
        .get_or_create(&ControllerLabels {
            controller: CONTROLLER.into(),
        })
        .inc();
    let ns = host.namespace().ok_or(ReconcileError::NoNamespace)?;
    let api: Api<BareMetalHost> = Api::namespaced(ctx.client.clone(), &ns);
    if host.meta().deletion_timestamp.is_some() {
        ctx.drivers.forget(&host.uid().unwrap_or_default());
        return Ok(controller::Action::await_change());
    }
    // Paused: no action at all, not even a BMC query.
    if is_paused(host.annotations_or_empty()) {
        return Ok(controller::Action::await_change());
    }
    // 1. Observe: the BMC's power state (when the host has a BMC and is not detached).
    let (observation, identity, credentials, driver) = observe_bmc(host, ctx).await?;
    // 2. Decide.
    let now = Timestamp::now();
    let snapshot =
        HostSnapshot::from_host(host, observation, credentials).with_bmc_identity(identity);
    let decision = decide_with_config(&snapshot, now, &ctx.config.decide);
    let requeue = decision.requeue_after;
    if decision.status.is_empty() && decision.actions.is_empty() {
        // A steady read that changed nothing: no copy of the host, no write.
        return Ok(requeue_action(requeue));
    }
    // 3. Record (write-ahead).
    let mut current = (**host).clone();
    if !decision.status.is_empty() {
        current = write_status(&api, &current, &decision.status, now, &ctx.metrics).await?;
    }
    // 4. Act.
    let follow_up_requeue =
        carry_out(ctx, &api, current, driver.as_deref(), &decision.actions).await?;
    let requeue = match (requeue, follow_up_requeue) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(requeue_action(requeue))
}

/// What the host's BMC says now (and what it says it is), the credentials that worked, and
/// the driver for the actions.
async fn observe_bmc(
    host: &Arc<BareMetalHost>,
    ctx: &Arc<Context>,
) -> Result<
    (
        BmcObservation,
        Option<String>,
        Option<hostcycle_api::host::CredentialsStatus>,
        Option<Arc<dyn PowerDriver>>,
    ),
    ReconcileError,
> {
    let has_bmc = host
        .spec
        .bmc
        .as_ref()
        .is_some_and(|b| !b.address.trim().is_empty());
    if is_detached(host.annotations_or_empty()) || !has_bmc {
        return Ok((BmcObservation::NotQueried, None, None, None));
    }
    match ctx
        .drivers
        .driver_for(&ctx.client, &ctx.secrets, &ctx.config.credentials, host)
        .await
    {
        Ok(HostBmc {
            driver,
            credentials,
        }) => {
            let deadline = read_deadline_for(host, &ctx.config);
            let read = read_power(driver.as_ref(), &ctx.metrics, deadline);
            let (obs, identity) = unless_stopped(ctx, host, read).await?;
            Ok((obs, identity, Some(credentials), Some(driver)))
        }
        Err(failure) => Ok((BmcObservation::Failed(failure), None, None, None)),
    }
}

/// Carries out the decided actions in order, after the status is recorded; returns how soon
/// to look again because of what the actions met.
async fn carry_out(
    ctx: &Arc<Context>,
    api: &Api<BareMetalHost>,
    mut current: BareMetalHost,
    driver: Option<&dyn PowerDriver>,
    actions: &[Action],
) -> Result<Option<Duration>, ReconcileError> {
    let mut follow_up_requeue = None;
    for action in actions {
        let call = match action {
            Action::RemoveAnnotations { keys, .. } => {
                // The write-ahead status is already recorded: a conflict here must not skip a
                // power call that follows. The removal is decided again next time.
                match remove_annotations(api, &current, keys).await {
                    Ok(updated) => current = updated,
                    Err(ReconcileError::Conflict { .. }) => {
                        tracing::debug!(host = %host_id(&current), ?keys, "annotations changed meanwhile; removal retried next reconcile");
                        follow_up_requeue = Some(Duration::from_millis(200));
                    }
                    Err(e) => return Err(e),
                }
                continue;
            }
            Action::EmitEvent(event) => {
                publish(ctx, &current, event.type_, event.reason, &event.message);
                continue;
            }
            Action::PowerOff { mode } => PowerCall::Off(*mode),
            Action::PowerOn => PowerCall::On,
            Action::Restart { mode } => PowerCall::Restart(*mode),
        };
        let Some(driver) = driver else { continue };
        // Like every BMC call, not started (or abandoned) once leadership ends.
        let is_restart = matches!(call, PowerCall::Restart(_));
        let result = unless_stopped(ctx, &current, power_call(driver, call, &ctx.metrics)).await?;
        if let (true, Err(e @ BmcError::OutcomeUnknown { .. })) = (is_restart, &result) {
            // Accepting a restart completes the reboot, so an unknown outcome must not count
            // as accepted: the request stays in flight and is sent again after the
            // power-action timeout.
            tracing::warn!(host = %host_id(&current), error = %e, "restart outcome unknown");
            follow_up_requeue = Some(ctx.config.decide.transition_requeue);
            continue;
        }
        let (next, requeue) = record_power_result(ctx, api, &current, &result).await?;
        current = next;
        follow_up_requeue = requeue;
    }
    Ok(follow_up_requeue)
}

fn requeue_action(requeue: Option<Duration>) -> controller::Action {
    match requeue {
        Some(after) => controller::Action::requeue(spread(after)),
        None => controller::Action::await_change(),
    }
}

/// Adds up to 10 % to long requeues so a fleet's steady-state polls spread out instead of
/// hitting the BMCs and the API server in the same second, then moves the requeue to the next
/// [`POLL_TICK`] boundary so the polls that fall due within one tick run as one batch.
/// `after` is first capped at [`MAX_DURATION`](hostcycle_duration::MAX_DURATION): the
/// requeue timer cannot take much more, and adding to it must not overflow.
fn spread(after: Duration) -> Duration {
    let after = after.min(hostcycle_duration::MAX_DURATION);
    if after < Duration::from_secs(10) {
        return after;
    }
    let tenth_ms = u64::try_from(after.as_millis() / 10)
        .unwrap_or(u64::MAX)
        .max(1);
    let spread = after.saturating_add(Duration::from_millis(rand::random_range(0..tenth_ms)));
    let epoch = *TICK_EPOCH.get_or_init(std::time::Instant::now);
    to_tick(spread, epoch.elapsed(), POLL_TICK)
}

/// Steady polls are aligned to boundaries this far apart. The reads due within one tick then
/// start together: one timer wake-up and one pass of the runtime for all of them, instead of a
/// thread's sleep and wake-up per read. At 5,000 hosts that is ~80 reads per wake-up, and a
/// third of the CPU per steady read (see docs/benchmarks.md).
const POLL_TICK: Duration = Duration::from_secs(1);

/// The process's tick clock starts here.
static TICK_EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// `after`, lengthened (by less than one `tick`) to end on a multiple of `tick` counted from
/// the tick clock's start; `now` is the time since that start.
fn to_tick(after: Duration, now: Duration, tick: Duration) -> Duration {
    let tick = tick.as_nanos();
    if tick == 0 {
        return after;
    }
    let end = now.saturating_add(after).as_nanos();
    let past_boundary = end % tick;
    if past_boundary == 0 {
        return after;
    }
    let to_boundary = u64::try_from(tick - past_boundary).unwrap_or(0);
    after.saturating_add(Duration::from_nanos(to_boundary))
}

/// Applies status updates and writes the status with the object's resourceVersion as a
/// precondition; a conflict aborts the reconcile (nothing was acted on yet).
async fn write_status(
    api: &Api<BareMetalHost>,
    host: &BareMetalHost,
    updates: &[StatusUpdate],
    now: Timestamp,
    metrics: &Metrics,
) -> Result<BareMetalHost, ReconcileError> {
    let mut status: BareMetalHostStatus = host.status.clone().unwrap_or_default();
    apply_status_updates(&mut status, updates, now, host.metadata.generation);
    let completed_reboot = updates.iter().find_map(|update| match update {
        StatusUpdate::SetLastPoweredOn(at) => status
            .provisioning
            .pending_reboot_since
            .filter(|pending| at > pending),
        _ => None,
    });
    let mut next = host.clone();
    next.status = Some(status);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.replace_status(&host.name_any(), &pp, &next).await {
        Ok(written) => {
            // Counted once the completion is recorded, so a retried write never counts twice.
            if let Some(pending) = completed_reboot {
                metrics
                    .reboot_duration
                    .observe(now.duration_since(pending).as_secs_f64().max(0.0));
            }
            Ok(written)
        }
        Err(e) if is_conflict(&e) => Err(ReconcileError::Conflict {
            host: host_id(host),
        }),
        Err(source) => Err(ReconcileError::WriteStatus {
            host: host_id(host),
            source,
        }),
    }
}

/// Records a power call's outcome. The call has happened, so its record must not be lost to
/// a concurrent change: on a conflict, re-read the object and apply the (idempotent) updates
/// again.
async fn write_status_after_call(
    api: &Api<BareMetalHost>,
    host: &BareMetalHost,
    updates: &[StatusUpdate],
    now: Timestamp,
    metrics: &Metrics,
) -> Result<BareMetalHost, ReconcileError> {
    let mut latest = host.clone();
    for _ in 0..5 {
        match write_status(api, &latest, updates, now, metrics).await {
            Err(ReconcileError::Conflict { .. }) => {
                latest = api.get(&host.name_any()).await.map_err(|source| {
                    ReconcileError::WriteStatus {
                        host: host_id(host),
                        source,
                    }
                })?;
            }
            other => return other,
        }
    }
    Err(ReconcileError::Conflict {
        host: host_id(host),
    })
}

/// Removes annotations, failing on a concurrent change (resourceVersion precondition).
async fn remove_annotations(
    api: &Api<BareMetalHost>,
    host: &BareMetalHost,
    keys: &[String],
) -> Result<BareMetalHost, ReconcileError> {
    let removals: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    let patch = json!({ "metadata": { "resourceVersion": host.resource_version(), "annotations": removals } });
    match api
        .patch(
            &host.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(updated) => Ok(updated),
        Err(e) if is_conflict(&e) => Err(ReconcileError::Conflict {
            host: host_id(host),
        }),
        Err(source) => Err(ReconcileError::RemoveAnnotations {
            host: host_id(host),
            keys: keys.to_vec(),
            source,
        }),
    }
}

#[derive(Debug, Clone, Copy)]
enum PowerCall {
    On,
    Off(PowerOffMode),
    /// spec.disablePowerOff: GracefulRestart (falling back to ForceRestart) or ForceRestart.
    Restart(PowerOffMode),
}

/// Sends one power request, timing it and counting the result.
async fn power_call(
    driver: &dyn PowerDriver,
    call: PowerCall,
    metrics: &Metrics,
) -> Result<PowerOutcome, BmcError> {
    let started = Instant::now();
    let (result, action, mode, operation) = match call {
        PowerCall::On => (driver.power_on().await, "on", "none", "power_on"),
        PowerCall::Off(mode) => (
            driver.power_off(bmc_mode(mode)).await,
            "off",
            mode.as_str(),
            "power_off",
        ),
        PowerCall::Restart(mode) => (
            driver.reboot(bmc_mode(mode)).await,
            "restart",
            mode.as_str(),
            "reboot",
        ),
    };
    let kind = driver.description().kind.to_string();
    metrics
        .bmc_request_duration
        .get_or_create(&BmcRequestLabels {
            driver: kind.clone(),
            operation: operation.into(),
        })
        .observe(started.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics
        .power_actions
        .get_or_create(&PowerActionLabels {
            action: action.into(),
            mode: mode.into(),
            result: outcome.into(),
        })
        .inc();
    if let Err(e) = &result {
        metrics
            .bmc_errors
            .get_or_create(&BmcErrorLabels {
                driver: kind,
                operation: operation.into(),
                kind: e.reason().into(),
            })
            .inc();
    }
    result
}

fn bmc_mode(mode: PowerOffMode) -> hostcycle_bmc::PowerOffMode {
    match mode {
        PowerOffMode::Soft => hostcycle_bmc::PowerOffMode::Soft,
        PowerOffMode::Hard => hostcycle_bmc::PowerOffMode::Hard,
    }
}

/// Records what a power call did (fallback to hard, failure) with `after_power_call`.
async fn record_power_result(
    ctx: &Context,
    api: &Api<BareMetalHost>,
    host: &BareMetalHost,
    result: &Result<PowerOutcome, BmcError>,
) -> Result<(BareMetalHost, Option<Duration>), ReconcileError> {
    match result {
        Ok(outcome) => {
            tracing::info!(host = %host_id(host), outcome = %outcome, "power request sent")
        }
        Err(e) => tracing::warn!(host = %host_id(host), error = %e, "power request failed"),
    }
    let call = power_call_result(result);
    let now = Timestamp::now();
    let status = host.status.clone().unwrap_or_default();
    let follow: Decision = after_power_call(&status, &call, now, &ctx.config.decide);
    let mut current = host.clone();
    if !follow.status.is_empty() {
        current = write_status_after_call(api, host, &follow.status, now, &ctx.metrics).await?;
    }
    for event in follow.events() {
        publish(ctx, &current, event.type_, event.reason, &event.message);
    }
    Ok((current, follow.requeue_after))
}

/// Logs an Event about the host and queues it for publishing: a slow events API never holds
/// up a reconcile (failures are logged by the sink, never fatal).
fn publish(ctx: &Context, host: &BareMetalHost, type_: EventType, reason: &str, message: &str) {
    ctx.events
        .emit(&host.object_ref(&()), type_, reason, message);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A reading awaiting its confirming second goes to the action lane (fencing waits on
    /// it); a confirmed run, or one a failed read restarted, does not.
    #[test]
    fn a_reading_awaiting_confirmation_takes_the_action_lane() {
        use hostcycle_api::{ObservedBmc, ObservedPowerState, PowerObservation};
        let host = |readings: u32, state: ObservedPowerState| {
            let mut h = BareMetalHost::new("h", Default::default());
            h.spec.online = true;
            h.status = Some(hostcycle_api::BareMetalHostStatus {
                powered_on: Some(true),
                power_observation: Some(PowerObservation {
                    state,
                    bmc: ObservedBmc::default(),
                    readings,
                    since: (readings > 0).then(Timestamp::now),
                    confirmed_at: None,
                }),
                ..Default::default()
            });
            h
        };
        assert!(wants_action(&host(1, ObservedPowerState::On)));
        assert!(wants_action(&host(1, ObservedPowerState::Off)));
        assert!(!wants_action(&host(2, ObservedPowerState::On)));
        assert!(
            !wants_action(&host(0, ObservedPowerState::On)),
            "a failing BMC"
        );
        assert!(!wants_action(&host(1, ObservedPowerState::Unknown)));
    }

    /// The read before a power action not sent yet has the short deadline; reads following a
    /// power call and steady polls the long one.
    #[test]
    fn only_the_read_before_an_action_has_the_short_deadline() {
        use hostcycle_api::{
            LastPowerAction, ObservedBmc, ObservedPowerState, PowerActionState, PowerActionTrigger,
            PowerObservation, PowerTarget,
        };
        let config = BmhControllerConfig::default();
        let (short, long) = (config.action_read_deadline, config.read_deadline);
        assert!(short < long);
        let host = |annotation: Option<&str>, action: Option<PowerActionState>, readings: u32| {
            let mut h = BareMetalHost::externally_provisioned("h", "redfish://192.0.2.1", "bmc");
            h.spec.online = true;
            if let Some(key) = annotation {
                h.metadata.annotations = Some([(key.to_string(), String::new())].into());
            }
            h.status = Some(hostcycle_api::BareMetalHostStatus {
                powered_on: Some(true),
                last_power_action: action.map(|state| LastPowerAction {
                    action: PowerTarget::Off,
                    mode: None,
                    trigger: PowerActionTrigger::RebootRequested,
                    state,
                    requested_at: Timestamp::now(),
                    last_attempt_at: Timestamp::now(),
                    attempts: 1,
                    completed_at: None,
                    hard_fallback: None,
                    failure: None,
                    restart: false,
                }),
                power_observation: Some(PowerObservation {
                    state: ObservedPowerState::On,
                    bmc: ObservedBmc::default(),
                    readings,
                    since: (readings > 0).then(Timestamp::now),
                    confirmed_at: None,
                }),
                ..Default::default()
            });
            h
        };
        let fence = hostcycle_api::remediation::MACHINE_POWER_OFF_ANNOTATION;
        #[rustfmt::skip]
        let cases = [
            ("steady poll", host(None, None, 2), long),
            ("reboot requested", host(Some("reboot.metal3.io"), None, 2), short),
            ("power-off for remediation requested", host(Some(fence), None, 2), short),
            ("previous action failed", host(Some("reboot.metal3.io"), Some(PowerActionState::Failed), 0), short),
            ("power call in flight", host(Some("reboot.metal3.io"), Some(PowerActionState::Requested), 0), long),
            ("a reading awaiting its confirmation", host(None, None, 1), long),
        ];
        for (what, h, expected) in cases {
            assert_eq!(read_deadline_for(&h, &config), expected, "{what}");
        }
        let mut longer_than_reads = BmhControllerConfig {
            action_read_deadline: Duration::from_secs(60),
            ..BmhControllerConfig::default()
        };
        longer_than_reads.read_deadline = Duration::from_secs(10);
        assert_eq!(
            read_deadline_for(&host(Some("reboot.metal3.io"), None, 2), &longer_than_reads),
            Duration::from_secs(10),
            "never longer than --bmc-read-deadline"
        );
    }

    #[test]
    fn steady_polls_end_on_a_tick_boundary() {
        let ms = Duration::from_millis;
        let tick = ms(1000);
        #[rustfmt::skip]
        let cases = [
            // (time since the tick clock's start, requeue asked, requeue given)
            (ms(0),      ms(60_000), ms(60_000)),
            (ms(250),    ms(60_000), ms(60_750)),
            (ms(999),    ms(60_000), ms(60_001)),
            (ms(1000),   ms(60_000), ms(60_000)),
            (ms(12_345), ms(61_234), ms(61_655)),
        ];
        for (now, after, expected) in cases {
            assert_eq!(
                to_tick(after, now, tick),
                expected,
                "now {now:?}, after {after:?}"
            );
        }
    }

    #[test]
    fn steady_polls_of_a_fleet_fall_due_together() {
        // Hosts finishing their reads at different moments of a tick, each requeued after its
        // own spread: all fall due on a boundary, never earlier than asked, at most a tick later.
        let tick = Duration::from_secs(1);
        for i in 0..1_000u64 {
            let now = Duration::from_micros(i * 7_919);
            let after = Duration::from_millis(60_000 + (i * 37) % 6_000);
            let given = to_tick(after, now, tick);
            assert!(
                given >= after && given < after + tick,
                "{now:?} {after:?} {given:?}"
            );
            assert_eq!(
                (now + given).as_nanos() % tick.as_nanos(),
                0,
                "{now:?} {after:?}"
            );
        }
    }

    #[test]
    fn short_requeues_are_neither_spread_nor_aligned() {
        for after in [
            Duration::ZERO,
            Duration::from_millis(200),
            Duration::from_secs(9),
        ] {
            assert_eq!(spread(after), after);
        }
        let long = spread(Duration::from_secs(60));
        assert!(
            long >= Duration::from_secs(60) && long < Duration::from_secs(67),
            "{long:?}"
        );
    }

    #[test]
    fn only_an_api_server_that_does_not_answer_is_unreachable() {
        let unreachable = kube::Error::Service("client error (Connect)".into());
        let refused = kube::Error::Api(
            kube::core::Status::failure("etcd timeout", "Timeout")
                .with_code(504)
                .boxed(),
        );
        let write = |source| ReconcileError::WriteStatus {
            host: "ns/h".into(),
            source,
        };
        assert!(write(unreachable).api_unreachable());
        assert!(!write(refused).api_unreachable());
        let patch = ReconcileError::RemoveAnnotations {
            host: "ns/h".into(),
            keys: vec!["reboot.metal3.io".into()],
            source: kube::Error::Service("connection reset".into()),
        };
        assert!(patch.api_unreachable());
        assert!(
            !ReconcileError::Conflict {
                host: "ns/h".into()
            }
            .api_unreachable()
        );
        // However long the outage, a retry comes within seconds of the server's return.
        let config = BmhControllerConfig::default();
        assert!(config.unreachable_backoff.delay(u32::MAX, 0.999) < Duration::from_secs(7));
    }

    /// The Lease can be won while the first list of hosts is still being paged in (5,000 hosts
    /// are ten pages). Hosts of the pages before were not passed on (this replica did not
    /// lead) and are not in the store yet (it fills at the list's end): they must still be
    /// reconciled. Here the Lease is won between page 1 (host `a`) and page 2 (host `b`).
    #[tokio::test]
    async fn hosts_paged_in_before_the_lease_was_won_are_reconciled() {
        use crate::testing::{FakeRequest, fake_client};
        use serde_json::json;
        let leading = LeaderGate::new();
        let (page_two_asked, mut page_two_asked_rx) = tokio::sync::watch::channel(false);
        let page_two_asked = Arc::new(page_two_asked);
        let (written_tx, mut written) = tokio::sync::mpsc::unbounded_channel::<String>();
        let gate = leading.clone();
        let client = fake_client(move |req: FakeRequest| {
            let gate = gate.clone();
            let page_two_asked = page_two_asked.clone();
            let written_tx = written_tx.clone();
            async move {
                let host = |name: &str| {
                    json!({
                        "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                        "metadata": { "name": name, "namespace": "default",
                                      "uid": format!("uid-{name}"), "resourceVersion": "1" },
                        "spec": { "online": true },
                    })
                };
                let list = |items: Vec<serde_json::Value>, next: Option<&str>| {
                    json!({
                        "apiVersion": "v1", "kind": "List", "items": items,
                        "metadata": { "resourceVersion": "1", "continue": next },
                    })
                };
                if req.query.contains("watch=true") {
                    // Nothing changes after the list.
                    std::future::pending::<()>().await;
                }
                match (req.method.as_str(), req.path.as_str()) {
                    ("GET", "/apis/metal3.io/v1alpha1/baremetalhosts") => {
                        if req.query.contains("continue=") {
                            page_two_asked.send_replace(true);
                            // Answered once this replica leads, and a little later: the
                            // controller has started by then.
                            gate.wait_to_lead(&CancellationToken::new()).await;
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            (200, list(vec![host("b")], None))
                        } else {
                            (200, list(vec![host("a")], Some("page-2")))
                        }
                    }
                    ("GET", "/api/v1/secrets") => (200, list(vec![], None)),
                    ("PUT", path) if path.ends_with("/status") => {
                        let mut body = req.json();
                        let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                        let _ = written_tx.send(name);
                        body["metadata"]["resourceVersion"] = json!("2");
                        (200, body)
                    }
                    // Events and anything else: accepted.
                    _ => (201, json!({})),
                }
            }
        });
        let shutdown = CancellationToken::new();
        let mut view = ClusterView::new(
            &client,
            crate::cluster::Kinds::for_controllers(&[crate::ControllerName::BareMetalHost]),
            None,
            "default",
        )
        .await;
        let controller = run(
            &view,
            BmhControllerConfig::default(),
            Metrics::register(&mut crate::metrics::new_registry()),
            "test".into(),
            leading.clone(),
            shutdown.clone(),
            || {},
        );
        let watches = view.start();
        let controller = tokio::spawn(controller);
        let asked = tokio::time::timeout(
            Duration::from_secs(10),
            page_two_asked_rx.wait_for(|asked| *asked),
        )
        .await;
        assert!(
            matches!(asked, Ok(Ok(_))),
            "waited 10 s for the host list's second page to be asked for"
        );
        leading.open();
        let mut reconciled = std::collections::BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while reconciled.len() < 2 {
            match tokio::time::timeout_at(deadline, written.recv()).await {
                Ok(Some(name)) => {
                    reconciled.insert(name);
                }
                _ => break,
            }
        }
        shutdown.cancel();
        let _ = controller.await;
        drop(watches);
        assert_eq!(
            reconciled.into_iter().collect::<Vec<_>>(),
            ["a", "b"],
            "hosts whose status was written within 10 s of winning the Lease"
        );
    }

    /// Every host's reconcile future exists while it waits for a lane: it must stay small.
    #[tokio::test]
    async fn a_reconcile_waiting_for_its_lane_is_small() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (events, _task) = EventSink::start(
            EventPublisher::new(client.clone(), "hostcycle.io/operator", "test"),
            "PowerManagement",
        );
        let (secrets, _writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let ctx = Arc::new(Context {
            client,
            drivers: DriverCache::new(BmcConnector::new(Default::default())),
            secrets: SecretCache::new(secrets),
            events,
            metrics: Metrics::register(&mut crate::metrics::new_registry()),
            lanes: Lanes::new(
                LaneLimits::new(1, 1, 1, 100, 1),
                Metrics::register(&mut crate::metrics::new_registry()),
            ),
            failures: FailureCounts::default(),
            unreachable: FailureCounts::default(),
            work: CancellationToken::new(),
            config: BmhControllerConfig::default(),
            hosts: reflector::store::<BareMetalHost>().0,
        });
        let host = Arc::new(BareMetalHost::externally_provisioned(
            "h",
            "redfish://192.0.2.1",
            "bmc",
        ));
        let waiting = reconcile(host, ctx);
        let size = std::mem::size_of_val(&waiting);
        assert!(size <= 1024, "a waiting reconcile takes {size} bytes");
    }
}
