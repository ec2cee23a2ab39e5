//! The hostcycle operator: kube-rs controllers, metrics, health endpoint, leader election.
//!
//! Only the holder of the leader Lease runs controllers. Losing the Lease stops them and
//! ends `run` with an error, so the process restarts clean (crash-only: all state is in
//! Kubernetes objects).

pub mod backoff;
pub mod bmh;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod deploy;
pub mod events;
pub mod health;
pub mod http;
pub mod http_limits;
pub mod interest;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod rbac;
pub mod remediation;
#[cfg(test)]
mod testing;
pub mod text;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use tokio_util::sync::CancellationToken;

pub use bmh::{BmhControllerConfig, CredentialsPolicy};
pub use cli::{OperatorArgs, run_cli};
pub use leader::LeaderElection;
pub use queue::QueueControllerConfig;
pub use remediation::RemediationControllerConfig;

/// The controllers `hostcycle operator --controllers` can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ControllerName {
    /// The BareMetalHost power controller (the reboot API).
    #[value(name = "baremetalhost")]
    BareMetalHost,
    /// The graceful reboot queue.
    #[value(name = "reboot-queue")]
    RebootQueue,
    /// Automatic machine remediation.
    #[value(name = "remediation")]
    Remediation,
    /// The HostHealthCheck detector: requests remediation of nodes whose Lease stopped.
    #[value(name = "health-check")]
    HealthCheck,
}

impl std::fmt::Display for ControllerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ControllerName::BareMetalHost => "baremetalhost",
            ControllerName::RebootQueue => "reboot-queue",
            ControllerName::Remediation => "remediation",
            ControllerName::HealthCheck => "health-check",
        })
    }
}

impl ControllerName {
    pub const ALL: [ControllerName; 4] = [
        ControllerName::BareMetalHost,
        ControllerName::RebootQueue,
        ControllerName::Remediation,
        ControllerName::HealthCheck,
    ];
}

/// The client settings the operator needs. kube retries 429 answers on its own by default;
/// for an eviction a 429 is a PodDisruptionBudget's refusal, which the reboot queue must see
/// at once (and retry per `evictRetries`, or delete, or back off) — not after 15 hidden
/// retries. Every controller here retries failed calls itself, with backoff.
pub fn client_config(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// Everything the operator process needs.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// `/metrics` (`--metrics-addr`).
    pub metrics_addr: SocketAddr,
    /// `/healthz` and `/readyz` (`--probe-addr`).
    pub probe_addr: SocketAddr,
    /// `None` runs without leader election (a single replica, tests).
    pub leader_election: Option<LeaderElection>,
    pub identity: String,
    /// Which controllers run (all by default).
    pub controllers: Vec<ControllerName>,
    /// The namespace whose BareMetalHosts (and their credentials Secrets) are watched; all
    /// namespaces when `None`. One host watch serves every controller.
    pub namespace: Option<String>,
    pub bmh: BmhControllerConfig,
    pub queue: QueueControllerConfig,
    pub remediation: RemediationControllerConfig,
}

/// Runs the operator until `shutdown` fires (or leadership is lost).
///
/// The watches start at once, leader or not — one per kind, shared by the controllers that
/// read it ([`cluster::ClusterView`]): a standby replica keeps its caches warm (and is ready
/// once they are synced), so when it wins the Lease it acts on the next scheduler tick
/// instead of listing everything first. Only the Lease holder acts.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // 1. Serve /metrics, and /healthz and /readyz on their own port.
    let (registry, metrics) = metrics::operator_registry();
    let ready = Arc::new(http::Readiness::default());
    let http_task = serve_endpoints(&config, registry, &ready, &shutdown).await?;
    // 2. Campaign for the leader Lease, watching meanwhile; `work` is cancelled on shutdown,
    //    on a lost Lease, or when the election ends before this replica leads.
    let work = CancellationToken::new();
    let leading = leader::LeaderGate::new();
    let campaign = campaign(&client, &config, &leading, &work, &metrics).await?;
    cancel_on(&shutdown, &work);
    // 3. Run the selected controllers over one shared view until they all stop.
    let running = Running {
        metrics: metrics.clone(),
        leading: leading.clone(),
        work,
    };
    run_controllers(&client, &config, &ready, &running).await;
    // 4. Stop serving as healthy, hand the Lease over, and say why the operator ended.
    ready.set_healthy(false);
    metrics.leader.set(0);
    http_task.abort();
    let ended = end_campaign(campaign, &shutdown, &leading).await;
    if shutdown.is_cancelled() {
        return Ok(());
    }
    anyhow::bail!(ended.unwrap_or("the controllers stopped"))
}

/// What every controller task shares: its metrics, the leader gate and the work token.
struct Running {
    metrics: Arc<metrics::Metrics>,
    leading: leader::LeaderGate,
    work: CancellationToken,
}

/// The election running in the background: the task following it and the lease manager's.
struct Campaign {
    follower: tokio::task::JoinHandle<ElectionEnd>,
    manager: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

/// Serves `/metrics` on `--metrics-addr` and `/healthz`, `/readyz` on `--probe-addr` until
/// `shutdown`.
async fn serve_endpoints(
    config: &OperatorConfig,
    registry: prometheus_client::registry::Registry,
    ready: &Arc<http::Readiness>,
    shutdown: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let serving = http::serve(
        http::HttpOptions::new(config.metrics_addr, config.probe_addr),
        Arc::new(registry),
        ready.clone(),
        shutdown.clone(),
    )
    .await
    .with_context(|| {
        format!(
            "binding the metrics endpoint on {} and the probes on {}",
            config.metrics_addr, config.probe_addr
        )
    })?;
    tracing::info!(metrics = %serving.metrics_addr, probes = %serving.probe_addr, "serving /metrics, and /healthz and /readyz on the probe address");
    Ok(serving.task)
}

/// Starts campaigning for the leader Lease, or opens the gate at once without election.
async fn campaign(
    client: &Client,
    config: &OperatorConfig,
    leading: &leader::LeaderGate,
    work: &CancellationToken,
    metrics: &Arc<metrics::Metrics>,
) -> anyhow::Result<Option<Campaign>> {
    let Some(election) = &config.leader_election else {
        metrics.leader.set(1);
        leading.open();
        return Ok(None);
    };
    tracing::info!(lease = %format!("{}/{}", election.namespace, election.lease_name), identity = %election.identity, "campaigning for the leader Lease; watching meanwhile");
    let leader::Election { is_leader, task } = election
        .start(client.clone())
        .await
        .context("starting leader election")?;
    let follower = tokio::spawn(follow_election(
        client.clone(),
        election.clone(),
        is_leader,
        leading.clone(),
        work.clone(),
        metrics.clone(),
    ));
    Ok(Some(Campaign {
        follower,
        manager: task,
    }))
}

/// Cancels `work` once `shutdown` fires.
fn cancel_on(shutdown: &CancellationToken, work: &CancellationToken) {
    let stop = work.clone();
    let outer = shutdown.clone();
    tokio::spawn(async move {
        outer.cancelled().await;
        stop.cancel();
    });
}

/// Starts each selected controller as a task of its own over one shared [`ClusterView`]
/// and waits until every one has stopped. A controller that panics takes the process down.
///
/// [`ClusterView`]: cluster::ClusterView
async fn run_controllers(
    client: &Client,
    config: &OperatorConfig,
    ready: &Arc<http::Readiness>,
    running: &Running,
) {
    let run_bmh = config.controllers.contains(&ControllerName::BareMetalHost);
    let run_queue = config.controllers.contains(&ControllerName::RebootQueue);
    let run_remediation = config.controllers.contains(&ControllerName::Remediation);
    let run_health = config.controllers.contains(&ControllerName::HealthCheck);
    tracing::info!(controllers = ?config.controllers, "starting controllers");
    // `/readyz` waits for the caches of every controller that runs: together, every watch of
    // the view (and the host controller's Secret watch). Registered before anything else is
    // awaited: the process is healthy already, and would be ready without them.
    let bmh_synced = run_bmh.then(|| ready.cache_pending());
    let queue_synced = run_queue.then(|| ready.cache_pending());
    let remediation_synced = run_remediation.then(|| ready.cache_pending());
    let health_synced = run_health.then(|| ready.cache_pending());
    // Readiness is health and synced caches, not leadership: a standby replica is ready too.
    // Healthy only now that the caches are registered: before, `/readyz` answered 200 for a
    // moment with no cache synced (a loaded machine made that moment long enough for the
    // failover test's standby check to see).
    ready.set_healthy(true);
    // One watch and one cache per kind the selected controllers read, shared by them.
    let mut view = cluster::ClusterView::new(
        client,
        cluster::Kinds::for_controllers(&config.controllers),
        config.namespace.clone(),
        &config.remediation.record_namespace,
    )
    .await;
    tracing::info!(watches = ?view.watched(), "one shared watch per kind");
    // Each controller is a task of its own, so the runtime's workers run it beside the BMC and
    // API connections it waits on. Each subscribes to the view when its future is made,
    // before the view's watches start: none misses an event.
    let Running {
        metrics,
        leading,
        work,
    } = running;
    let mut controllers = tokio::task::JoinSet::new();
    if let Some(synced) = bmh_synced {
        controllers.spawn(bmh::run(
            &view,
            config.bmh.clone(),
            metrics.clone(),
            config.identity.clone(),
            leading.clone(),
            work.clone(),
            synced,
        ));
    }
    if let Some(synced) = queue_synced {
        controllers.spawn(queue::run(
            &view,
            config.queue.clone(),
            metrics.clone(),
            config.identity.clone(),
            leading.clone(),
            work.clone(),
            synced,
        ));
    }
    if let Some(synced) = remediation_synced {
        controllers.spawn(remediation::run(
            &view,
            config.remediation.clone(),
            metrics.clone(),
            config.identity.clone(),
            leading.clone(),
            work.clone(),
            synced,
        ));
    }
    if let Some(synced) = health_synced {
        // Requests are made in the operator's namespace, whose requests may fence any host.
        controllers.spawn(health::run(
            &view,
            health::HealthControllerConfig {
                request_namespace: config.remediation.record_namespace.clone(),
                ..health::HealthControllerConfig::default()
            },
            metrics.clone(),
            config.identity.clone(),
            leading.clone(),
            work.clone(),
            synced,
        ));
    }
    let watches = view.start();
    while let Some(ended) = controllers.join_next().await {
        if let Err(e) = ended
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    drop(watches);
}

/// After the controllers stopped: on shutdown the Lease is released (only now may it go to
/// another replica); otherwise the reason the election ended, if it did.
async fn end_campaign(
    campaign: Option<Campaign>,
    shutdown: &CancellationToken,
    leading: &leader::LeaderGate,
) -> Option<&'static str> {
    let Campaign { follower, manager } = campaign?;
    if shutdown.is_cancelled() {
        // Dropping our end of the election's channel makes the lease manager release it, so
        // a standby replica takes over at once instead of after the lease duration.
        follower.abort();
        let _ = follower.await;
        match tokio::time::timeout(Duration::from_secs(3), manager).await {
            Ok(Ok(Ok(_))) if leading.is_open() => tracing::info!("released the leader Lease"),
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "could not release the leader Lease; it expires by itself")
            }
            _ => {}
        }
        return None;
    }
    if !follower.is_finished() {
        follower.abort();
        return None;
    }
    match follower.await {
        Ok(ElectionEnd::LostLease) => {
            Some("lost the leader Lease; exiting so a fresh process can campaign again")
        }
        Ok(ElectionEnd::Lapsed) => Some(
            "the leader Lease expired with no renewal confirmed (is the API server \
             reachable?); exiting so a fresh process can campaign again",
        ),
        Ok(ElectionEnd::EndedBeforeLeading) => {
            Some("leader election ended before this replica became leader")
        }
        Err(_) => Some("the leader election task failed"),
    }
}

/// Why [`follow_election`] returned.
enum ElectionEnd {
    LostLease,
    /// [`LeaderElection::confirm_held`] saw the Lease expire without a renewal.
    Lapsed,
    EndedBeforeLeading,
}

/// Opens the gate when this replica wins the Lease; cancels `work` when it loses it (before
/// anything else: no BMC call starts after that) — as the lease manager says, or as its own
/// reads of the Lease show first (taken, or expired without a renewal seen) — or when the
/// election ends before this replica led.
async fn follow_election(
    client: Client,
    election: LeaderElection,
    mut is_leader: tokio::sync::watch::Receiver<bool>,
    leading: leader::LeaderGate,
    work: CancellationToken,
    metrics: Arc<metrics::Metrics>,
) -> ElectionEnd {
    if !leader::wait_for_leadership(&mut is_leader).await {
        tracing::error!("leader election ended before this replica became leader; stopping");
        work.cancel();
        return ElectionEnd::EndedBeforeLeading;
    }
    tracing::info!("became leader");
    metrics.leader.set(1);
    leading.open();
    let lost = async {
        loop {
            if is_leader.changed().await.is_err() || !*is_leader.borrow() {
                return;
            }
        }
    };
    let end = tokio::select! {
        _ = lost => {
            work.cancel();
            tracing::error!("lost the leader Lease; stopping all work");
            ElectionEnd::LostLease
        }
        lapse = election.confirm_held(client) => {
            work.cancel();
            match lapse {
                leader::LeaseLapse::Taken { holder } => {
                    tracing::error!(holder = holder.as_deref().unwrap_or(""), "lost the leader Lease; stopping all work");
                    ElectionEnd::LostLease
                }
                leader::LeaseLapse::Expired { at } => {
                    tracing::error!(expired_at = %at, "could not confirm a renewal of the leader Lease before it expired; stopping all work");
                    ElectionEnd::Lapsed
                }
            }
        }
    };
    metrics.leader.set(0);
    end
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A fake API server that serves one Machine kind (cluster.x-k8s.io) and `policy/v1`,
    /// lists nothing and never ends a watch. Every other GET's path is logged in `lists`. A
    /// request for a `held` path is answered once its receiver says true.
    fn fake_api(
        lists: Arc<std::sync::Mutex<Vec<String>>>,
        held: Vec<(&'static str, tokio::sync::watch::Receiver<bool>)>,
    ) -> Client {
        use crate::testing::{FakeRequest, fake_client};
        use serde_json::json;
        fake_client(move |req: FakeRequest| {
            let log = lists.clone();
            // Every GET but discovery is logged, before it is held.
            let release = held
                .iter()
                .find(|(path, _)| *path == req.path)
                .map(|(_, release)| release.clone());
            async move {
                if req.query.contains("watch=true") {
                    // Nothing changes after the list.
                    std::future::pending::<()>().await;
                }
                // Discovery, and `/version`: the remediation controller's clock check reads
                // the API server's `Date` from it; it lists and watches nothing.
                const DISCOVERY: [&str; 4] = [
                    "/apis",
                    "/apis/cluster.x-k8s.io/v1beta1",
                    "/apis/policy/v1",
                    "/version",
                ];
                if req.method.as_str() == "GET" && !DISCOVERY.contains(&req.path.as_str()) {
                    log.lock().unwrap().push(req.path.clone());
                }
                if let Some(mut release) = release {
                    let _ = release.wait_for(|released| *released).await;
                }
                let group = |name: &str, version: &str| {
                    let gv =
                        json!({ "groupVersion": format!("{name}/{version}"), "version": version });
                    json!({ "name": name, "versions": [gv.clone()], "preferredVersion": gv })
                };
                match (req.method.as_str(), req.path.as_str()) {
                    ("GET", "/apis") => (
                        200,
                        json!({ "kind": "APIGroupList", "apiVersion": "v1",
                                "groups": [group("cluster.x-k8s.io", "v1beta1"),
                                           group("policy", "v1")] }),
                    ),
                    ("GET", "/apis/cluster.x-k8s.io/v1beta1") => (
                        200,
                        json!({ "kind": "APIResourceList", "apiVersion": "v1",
                                "groupVersion": "cluster.x-k8s.io/v1beta1",
                                "resources": [{ "name": "machines", "singularName": "machine",
                                                "namespaced": true, "kind": "Machine",
                                                "verbs": ["get", "list", "watch"] }] }),
                    ),
                    ("GET", "/apis/policy/v1") => (
                        200,
                        json!({ "kind": "APIResourceList", "apiVersion": "v1",
                                "groupVersion": "policy/v1", "resources": [] }),
                    ),
                    ("GET", _) => (
                        200,
                        json!({ "apiVersion": "v1", "kind": "List", "items": [],
                                "metadata": { "resourceVersion": "1" } }),
                    ),
                    // Events, the RebootQueue's creation, status writes: accepted.
                    _ => (201, json!({})),
                }
            }
        })
    }

    /// `probe_addr` serves `/readyz`; the metrics port is any free one.
    fn test_config(controllers: &[ControllerName], probe_addr: SocketAddr) -> OperatorConfig {
        OperatorConfig {
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            probe_addr,
            leader_election: None,
            identity: "test".into(),
            controllers: controllers.to_vec(),
            namespace: None,
            bmh: BmhControllerConfig::default(),
            queue: QueueControllerConfig::default(),
            remediation: RemediationControllerConfig::default(),
        }
    }

    /// Lists `run` sent for each path, with the controllers given, on [`fake_api`]. Returns
    /// once each of `expected` was listed and a little more time has passed.
    async fn lists_sent(controllers: &[ControllerName], expected: &[&str]) -> Vec<String> {
        let lists = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let client = fake_api(lists.clone(), Vec::new());
        let config = test_config(controllers, "127.0.0.1:0".parse().unwrap());
        let shutdown = CancellationToken::new();
        let operator = tokio::spawn(run(client, config, shutdown.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !expected
            .iter()
            .all(|path| lists.lock().unwrap().iter().any(|p| p == path))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for any second watch of a kind to list it too.
        tokio::time::sleep(Duration::from_millis(500)).await;
        shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), operator).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        let mut lists = lists.lock().unwrap().clone();
        lists.sort();
        lists
    }

    const HOSTS: &str = "/apis/metal3.io/v1alpha1/baremetalhosts";
    const SECRETS: &str = "/api/v1/secrets";
    const LOOP_KINDS: [&str; 7] = [
        // ConfigMaps in the operator's namespace only, two sets: the annotation flow's
        // records (by label) and the reboot queue's command sets (one, by name).
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/nodes",
        "/apis/cluster.x-k8s.io/v1beta1/machines",
        "/apis/hostcycle.io/v1alpha1/hostremediations",
        "/apis/hostcycle.io/v1alpha1/rebootqueueentries",
        "/apis/hostcycle.io/v1alpha1/rebootqueues",
    ];

    /// What the health check reads besides the loops' kinds.
    const HEALTH_KINDS: [&str; 2] = [
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        "/apis/hostcycle.io/v1alpha1/hosthealthchecks",
    ];

    #[tokio::test]
    async fn every_kind_is_watched_once_by_all_four_controllers() {
        let mut expected = vec![HOSTS, SECRETS];
        expected.extend(LOOP_KINDS);
        expected.extend(HEALTH_KINDS);
        expected.sort();
        let lists = lists_sent(&ControllerName::ALL, &expected).await;
        assert_eq!(
            lists, expected,
            "one list per kind (per selector), then its one watch"
        );
    }

    #[tokio::test]
    async fn the_reboot_queue_alone_watches_no_secret() {
        let mut expected = vec![HOSTS];
        expected.extend(LOOP_KINDS);
        expected.sort();
        let lists = lists_sent(&[ControllerName::RebootQueue], &expected).await;
        assert_eq!(lists, expected);
    }

    /// The health check alone: no host, Secret, Machine or ConfigMap.
    #[tokio::test]
    async fn the_health_check_alone_watches_what_it_reads() {
        let mut expected = vec![
            "/api/v1/nodes",
            "/apis/hostcycle.io/v1alpha1/hostremediations",
            "/apis/hostcycle.io/v1alpha1/rebootqueueentries",
            "/apis/hostcycle.io/v1alpha1/rebootqueues",
        ];
        expected.extend(HEALTH_KINDS);
        expected.sort();
        let lists = lists_sent(&[ControllerName::HealthCheck], &expected).await;
        assert_eq!(lists, expected);
    }

    #[tokio::test]
    async fn the_host_controller_alone_watches_hosts_and_secrets_only() {
        let mut expected = vec![HOSTS, SECRETS];
        expected.sort();
        let lists = lists_sent(&[ControllerName::BareMetalHost], &expected).await;
        assert_eq!(lists, expected);
    }

    /// The status line of `GET /readyz` on `addr`; `None` while nothing listens there.
    async fn readyz(addr: SocketAddr) -> Option<String> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        answer.lines().next().map(str::to_string)
    }

    /// `/readyz` answers 503 until every watch is listed — while the Machine kinds are being
    /// discovered, and while one list (the Nodes') is held back — then 200. The process is
    /// healthy (no leader election) from the start.
    #[tokio::test]
    async fn not_ready_until_every_watch_is_listed() {
        let lists = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (discovered, discovery) = tokio::sync::watch::channel(false);
        let (nodes_listed, nodes) = tokio::sync::watch::channel(false);
        let client = fake_api(
            lists.clone(),
            vec![("/apis", discovery), ("/api/v1/nodes", nodes)],
        );
        let port = hostcycle_testkit::free_port().unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let shutdown = CancellationToken::new();
        let operator = tokio::spawn(run(
            client,
            test_config(&ControllerName::ALL, addr),
            shutdown.clone(),
        ));
        // Twenty answers while `until` holds, all 503.
        let not_ready_while = async |what: &str, until: &dyn Fn() -> bool| {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut answers = Vec::new();
            while answers.len() < 20 || !until() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: still waiting after {} answers",
                    answers.len()
                );
                answers.extend(readyz(addr).await);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let ready = answers.iter().filter(|a| !a.contains(" 503 ")).count();
            assert_eq!(
                ready,
                0,
                "{what}: {ready} of {} answers not 503",
                answers.len()
            );
        };
        not_ready_while("while the Machine kinds are discovered", &|| true).await;
        discovered.send_replace(true);
        not_ready_while("before the Nodes were listed", &|| {
            lists.lock().unwrap().iter().any(|p| p == "/api/v1/nodes")
        })
        .await;
        nodes_listed.send_replace(true);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            last = readyz(addr).await;
            if last.as_deref().is_some_and(|a| a.contains(" 200 ")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            last.as_deref().is_some_and(|a| a.contains(" 200 ")),
            "not ready 10 s after every list: {last:?}"
        );
        shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), operator).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }
}
