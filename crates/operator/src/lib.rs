//! The hostcycle operator: kube-rs controllers, metrics, health endpoint, leader election.
//!
//! Only the holder of the leader Lease runs controllers. Losing the Lease stops them and
//! ends `run` with an error, so the process restarts clean (crash-only: all state is in
//! Kubernetes objects).

pub mod backoff;
pub mod bmh;
pub mod cluster;
pub mod deploy;
pub mod events;
pub mod http;
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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use kube::Client;
use tokio_util::sync::CancellationToken;

pub use bmh::{BmhControllerConfig, CredentialsPolicy};
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
}

impl std::fmt::Display for ControllerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ControllerName::BareMetalHost => "baremetalhost",
            ControllerName::RebootQueue => "reboot-queue",
            ControllerName::Remediation => "remediation",
        })
    }
}

impl ControllerName {
    pub const ALL: [ControllerName; 3] = [
        ControllerName::BareMetalHost,
        ControllerName::RebootQueue,
        ControllerName::Remediation,
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
    pub metrics_addr: SocketAddr,
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
    let (registry, metrics) = metrics::operator_registry();
    let ready = Arc::new(http::Readiness::default());
    let (addr, http_task) = http::serve(
        config.metrics_addr,
        Arc::new(registry),
        ready.clone(),
        shutdown.clone(),
    )
    .await
    .with_context(|| format!("binding the metrics endpoint on {}", config.metrics_addr))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");

    // Cancelled on shutdown, on a lost Lease, or when the election ends before we lead.
    let work = CancellationToken::new();
    let leading = leader::LeaderGate::new();
    let election = match &config.leader_election {
        Some(election) => {
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
            Some((follower, task))
        }
        None => {
            metrics.leader.set(1);
            leading.open();
            None
        }
    };
    // Readiness is health and synced caches, not leadership: a standby replica is ready too.
    ready.set_healthy(true);

    let stop = work.clone();
    let outer = shutdown.clone();
    tokio::spawn(async move {
        outer.cancelled().await;
        stop.cancel();
    });
    let run_bmh = config.controllers.contains(&ControllerName::BareMetalHost);
    let run_queue = config.controllers.contains(&ControllerName::RebootQueue);
    let run_remediation = config.controllers.contains(&ControllerName::Remediation);
    tracing::info!(controllers = ?config.controllers, "starting controllers");
    // `/readyz` waits for the caches of every controller that runs: together, every watch of
    // the view (and the host controller's Secret watch). Registered before anything else is
    // awaited: the process is healthy already, and would be ready without them.
    let bmh_synced = run_bmh.then(|| ready.cache_pending());
    let queue_synced = run_queue.then(|| ready.cache_pending());
    let remediation_synced = run_remediation.then(|| ready.cache_pending());
    // One watch and one cache per kind the selected controllers read, shared by them.
    let mut view = cluster::ClusterView::new(
        &client,
        cluster::Kinds::for_controllers(&config.controllers),
        config.namespace.clone(),
    )
    .await;
    tracing::info!(watches = ?view.watched(), "one shared watch per kind");
    // Each controller is a task of its own, so the runtime's workers run it beside the BMC and
    // API connections it waits on. Polled from `block_on` instead, every reconcile of all three
    // ran on the main thread, which then had to be woken for each answer the workers received
    // (a thread switch per BMC read). Each subscribes to the view when its future is made,
    // before the view's watches start: none misses an event.
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
    let watches = view.start();
    while let Some(ended) = controllers.join_next().await {
        if let Err(e) = ended
            && e.is_panic()
        {
            // Crash-only: a controller that panicked takes the process down, as it did when
            // the controllers were polled in this task.
            std::panic::resume_unwind(e.into_panic());
        }
    }
    drop(watches);
    ready.set_healthy(false);
    metrics.leader.set(0);
    http_task.abort();
    let ended = match election {
        Some((follower, manager)) if shutdown.is_cancelled() => {
            // Every controller has stopped: only now may the Lease go to another replica.
            // Dropping our end of the election's channel makes the lease manager release
            // it, so a standby replica takes over at once instead of after the lease
            // duration.
            follower.abort();
            let _ = follower.await;
            match tokio::time::timeout(Duration::from_secs(3), manager).await {
                Ok(Ok(Ok(_))) if leading.is_open() => tracing::info!("released the leader Lease"),
                Ok(Ok(Err(e))) => {
                    tracing::warn!(error = %e, "could not release the leader Lease; it expires by itself")
                }
                _ => {}
            }
            None
        }
        Some((follower, _manager)) if !follower.is_finished() => {
            follower.abort();
            None
        }
        Some((follower, _manager)) => match follower.await {
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
        },
        None => None,
    };
    if shutdown.is_cancelled() {
        return Ok(());
    }
    anyhow::bail!(ended.unwrap_or("the controllers stopped"))
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

/// `hostcycle operator` flags.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only watch BareMetalHosts in this namespace (default: all).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Controllers to run, comma-separated (default: all). A cluster whose hosts are
    /// managed by metal3's baremetal-operator runs `--controllers reboot-queue`.
    #[arg(long, value_delimiter = ',', default_values_t = ControllerName::ALL.to_vec())]
    pub controllers: Vec<ControllerName>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Campaign for a leader Lease before running controllers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease (default: $POD_NAMESPACE, else `default`).
    #[arg(long)]
    pub lease_namespace: Option<String>,
    #[arg(long, default_value = "hostcycle-operator")]
    pub lease_name: String,
    /// How long the leader Lease stays valid without renewal (whole seconds, at least 2).
    #[arg(long, default_value = "15s")]
    pub lease_duration: jiff::SignedDuration,
    /// This replica's identity (default: $POD_NAME, else the host name and PID).
    #[arg(long)]
    pub identity: Option<String>,
    /// Power-state re-check interval when nothing is changing.
    #[arg(long, default_value = "60s", value_parser = flag_duration)]
    pub steady_poll: jiff::SignedDuration,
    /// Power-state re-check interval while a change is pending.
    #[arg(long, default_value = "1s", value_parser = flag_duration)]
    pub transition_poll: jiff::SignedDuration,
    /// How long the OS gets after a soft power-off before power is cut.
    #[arg(long, default_value = "180s", value_parser = flag_duration)]
    pub soft_power_off_timeout: jiff::SignedDuration,
    /// Hosts whose power state is polled at once (steady state).
    #[arg(long, default_value_t = 64)]
    pub concurrency: u16,
    /// Hosts with a requested power action handled at once, in a lane of their own so they
    /// never wait behind polls of hung BMCs.
    #[arg(long, default_value_t = 64)]
    pub action_concurrency: u16,
    /// Deadline of one power-state read (retries included): a hung BMC holds a polling slot
    /// no longer than this.
    #[arg(long, default_value = "15s")]
    pub bmc_read_deadline: jiff::SignedDuration,
    /// Timeout of one HTTP request to a BMC.
    #[arg(long, default_value = "30s", value_parser = flag_duration)]
    pub bmc_request_timeout: jiff::SignedDuration,
    /// Deadline of one BMC call, retries included.
    #[arg(long, default_value = "120s", value_parser = flag_duration)]
    pub bmc_call_deadline: jiff::SignedDuration,
    /// Storm protection: remediations between power-off and the Node back, at most.
    #[arg(long, default_value_t = 1)]
    pub max_concurrent_remediations: usize,
    /// How long a remediation triggered by `host.metal3.io/external-remediation` waits for
    /// the Node after the power-on (HostRemediations set theirs in `spec.strategy`).
    #[arg(long, default_value = "20m", value_parser = flag_duration)]
    pub remediation_power_on_timeout: jiff::SignedDuration,
    /// How long a remediation waits for its host to be confirmed off (a status written after
    /// the power-off request, without error) before it gives up, releases the host and
    /// escalates.
    #[arg(long, default_value = "5m", value_parser = flag_duration)]
    pub remediation_power_off_timeout: jiff::SignedDuration,
    /// Which requests (HostRemediations, annotated Machines) may fence which hosts: a
    /// comma-separated list of `same-as-host` (requests fence only hosts of their own
    /// namespace), `operator-namespace` (requests in the operator's own namespace, the
    /// Lease's, may fence any host), namespaces whose requests may fence any host, or `*`
    /// (any request, any host).
    #[arg(long, default_value = "same-as-host,operator-namespace")]
    pub remediation_request_namespaces: hostcycle_core::remediation::RequestNamespaces,
    /// Which triggers remediation takes, comma-separated: `machine-annotation`
    /// (`host.metal3.io/external-remediation` on a Machine), `requests` (HostRemediations),
    /// `capbm-machines` (the annotation also on Machines of OpenShift's bare-metal machine
    /// controller, CAPBM, which remediates them itself: only where its remediation does not
    /// run). A Machine another remediator holds is never touched; a flow hostcycle started is
    /// always finished.
    #[arg(long, default_value = "machine-annotation,requests")]
    pub remediation_triggers: hostcycle_core::remediation::contracts::Triggers,
    /// Where BMC credentials may be sent, comma-separated: CIDRs (10.0.0.0/24), IPs, DNS
    /// names, domain suffixes (.bmc.example.com), or `any` (metal3's behaviour: whoever may
    /// edit a host may send its Secret's password anywhere). None by default: no credentials
    /// are sent until the BMC networks are given.
    #[arg(long, value_delimiter = ',')]
    pub bmc_networks: Vec<hostcycle_bmc::destination::BmcNetwork>,
    /// Allow plain-HTTP Redfish (`redfish+http://`), which sends the password in clear.
    #[arg(long)]
    pub allow_plain_http_bmc: bool,
    /// Use only credentials Secrets with this label (`KEY=VALUE`, e.g.
    /// `hostcycle.io/bmc-credentials=true` or metal3's `environment.metal3.io=baremetal`);
    /// only their metadata is watched. Default: any Secret a host names.
    #[arg(long, value_parser = label_requirement)]
    pub bmc_credentials_label: Option<(String, String)>,
}

/// A duration flag's value: not negative, at most
/// [`MAX_DURATION`](hostcycle_bmc::deadline::MAX_DURATION) (365 days), so that no deadline
/// or requeue computed from it can overflow.
fn flag_duration(text: &str) -> Result<jiff::SignedDuration, String> {
    hostcycle_bmc::deadline::parse_duration_flag(text)
}

/// `KEY=VALUE` of `--bmc-credentials-label`: a label key (optional DNS prefix and `/`) and
/// a label value.
fn label_requirement(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| "write KEY=VALUE, e.g. hostcycle.io/bmc-credentials=true".to_string())?;
    let name_ok = |name: &str| {
        !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let key_ok = match key.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.')
                })
                && name_ok(name)
        }
        None => name_ok(key),
    };
    if !key_ok {
        return Err(format!("{key:?} is not a label key"));
    }
    if !(value.is_empty() || name_ok(value)) {
        return Err(format!("{value:?} is not a label value"));
    }
    Ok((key.to_string(), value.to_string()))
}

fn duration(d: jiff::SignedDuration, flag: &str) -> anyhow::Result<Duration> {
    let unsigned =
        Duration::try_from(d).with_context(|| format!("--{flag} must not be negative"))?;
    hostcycle_bmc::deadline::checked_duration(unsigned)
        .map_err(|reason| anyhow::anyhow!("--{flag}: {reason}"))
}

impl OperatorArgs {
    pub fn into_config(self) -> anyhow::Result<OperatorConfig> {
        let identity = self
            .identity
            .or_else(|| std::env::var("POD_NAME").ok())
            .unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
        let mut decide = hostcycle_core::bmh::DecideConfig {
            steady_requeue: duration(self.steady_poll, "steady-poll")?,
            transition_requeue: duration(self.transition_poll, "transition-poll")?,
            soft_power_off_timeout: duration(
                self.soft_power_off_timeout,
                "soft-power-off-timeout",
            )?,
            ..Default::default()
        };
        decide.power_action_timeout = decide.power_action_timeout.max(
            decide
                .soft_power_off_timeout
                .saturating_add(Duration::from_secs(60)),
        );
        let lease_duration = duration(self.lease_duration, "lease-duration")?;
        let bmc = bmc_options(
            duration(self.bmc_request_timeout, "bmc-request-timeout")?,
            duration(self.bmc_call_deadline, "bmc-call-deadline")?,
            &decide,
        );
        let leader_election = self.leader_elect.then(|| LeaderElection {
            namespace: self
                .lease_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| "default".into()),
            lease_name: self.lease_name.clone(),
            identity: identity.clone(),
            lease_duration,
        });
        Ok(OperatorConfig {
            metrics_addr: self.metrics_addr,
            leader_election,
            identity,
            controllers: self.controllers.clone(),
            namespace: self.namespace,
            queue: QueueControllerConfig::default(),
            remediation: RemediationControllerConfig {
                max_concurrent: self.max_concurrent_remediations.max(1),
                power_on_timeout: duration(
                    self.remediation_power_on_timeout,
                    "remediation-power-on-timeout",
                )?,
                power_off_timeout: duration(
                    self.remediation_power_off_timeout,
                    "remediation-power-off-timeout",
                )?,
                triggers: self.remediation_triggers,
                request_namespaces: self
                    .remediation_request_namespaces
                    .clone()
                    .with_operator_namespace(
                        Some(
                            self.lease_namespace
                                .clone()
                                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                                .unwrap_or_else(|| "default".into()),
                        )
                        .as_deref(),
                    ),
                ..RemediationControllerConfig::default()
            },
            bmh: BmhControllerConfig {
                decide,
                concurrency: self.concurrency,
                action_concurrency: self.action_concurrency,
                read_deadline: duration(self.bmc_read_deadline, "bmc-read-deadline")?,
                bmc,
                credentials: CredentialsPolicy {
                    destinations: hostcycle_bmc::destination::CredentialDestinations {
                        networks: self.bmc_networks.clone(),
                        allow_plain_http: self.allow_plain_http_bmc,
                    },
                    label: self.bmc_credentials_label.clone(),
                },
                ..BmhControllerConfig::default()
            },
        })
    }
}

/// BMC connection settings with the given request timeout and per-call deadline. Idle
/// connections are kept for a time derived from the polls
/// ([`hostcycle_bmc::idle_timeout_for_polls`]): reused while a change is watched, and
/// between steady reads only when they are frequent.
fn bmc_options(
    request_timeout: Duration,
    call_deadline: Duration,
    polls: &hostcycle_core::bmh::DecideConfig,
) -> hostcycle_bmc::ConnectorOptions {
    let mut options = hostcycle_bmc::ConnectorOptions {
        request_timeout,
        idle_timeout: hostcycle_bmc::idle_timeout_for_polls(
            polls.steady_requeue,
            polls.transition_requeue,
        ),
        ..Default::default()
    };
    options.connect_timeout = options.connect_timeout.min(request_timeout);
    options.retry.deadline = call_deadline;
    options
}

/// `hostcycle operator`: runs until SIGTERM/Ctrl-C.
pub async fn run_cli(args: OperatorArgs, client: Client) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        trigger.cancel();
    });
    run(client, config, shutdown).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        operator: OperatorArgs,
    }

    /// The credentials policy flags: none given sends credentials nowhere; each flag reaches
    /// the host controller's configuration; bad values are refused at start.
    #[test]
    fn credentials_policy_flags() {
        let config = Cli::try_parse_from(["x"])
            .unwrap()
            .operator
            .into_config()
            .unwrap();
        assert!(config.bmh.credentials.destinations.networks.is_empty());
        assert!(!config.bmh.credentials.destinations.allow_plain_http);
        assert_eq!(config.bmh.credentials.label, None);
        // The operator's namespace (the Lease's; here `default`) is resolved in.
        assert_eq!(
            config.remediation.request_namespaces.to_string(),
            "same-as-host,operator-namespace,default"
        );
        let config = Cli::try_parse_from([
            "x",
            "--bmc-networks",
            "10.0.0.0/24,.bmc.example",
            "--bmc-networks=fd00::/64",
            "--allow-plain-http-bmc",
            "--bmc-credentials-label",
            "environment.metal3.io=baremetal",
            "--remediation-request-namespaces",
            "same-as-host,remediators",
        ])
        .unwrap()
        .operator
        .into_config()
        .unwrap();
        let networks: Vec<String> = config
            .bmh
            .credentials
            .destinations
            .networks
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(networks, ["10.0.0.0/24", ".bmc.example", "fd00::/64"]);
        assert!(config.bmh.credentials.destinations.allow_plain_http);
        assert_eq!(
            config.bmh.credentials.label,
            Some(("environment.metal3.io".into(), "baremetal".into()))
        );
        assert!(
            config
                .remediation
                .request_namespaces
                .allows("remediators", "metal")
        );
        for bad in [
            ["--bmc-networks", "10.0.0.0/99"],
            ["--bmc-credentials-label", "novalue"],
            ["--bmc-credentials-label", "-bad=x"],
            ["--bmc-credentials-label", "a=b c"],
            ["--remediation-request-namespaces", "Not_A_Namespace"],
            ["--remediation-triggers", "capbm-machines,requests"],
            ["--remediation-triggers", "annotations"],
            ["--remediation-triggers", ""],
        ] {
            assert!(
                Cli::try_parse_from(["x", bad[0], bad[1]]).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    const DURATION_FLAGS: &[&str] = &[
        "--steady-poll",
        "--transition-poll",
        "--soft-power-off-timeout",
        "--bmc-request-timeout",
        "--bmc-call-deadline",
        "--remediation-power-on-timeout",
        "--remediation-power-off-timeout",
    ];

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
                const DISCOVERY: [&str; 3] =
                    ["/apis", "/apis/cluster.x-k8s.io/v1beta1", "/apis/policy/v1"];
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

    fn test_config(controllers: &[ControllerName], metrics_addr: SocketAddr) -> OperatorConfig {
        OperatorConfig {
            metrics_addr,
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
    const LOOP_KINDS: [&str; 5] = [
        "/api/v1/nodes",
        "/apis/cluster.x-k8s.io/v1beta1/machines",
        "/apis/hostcycle.io/v1alpha1/hostremediations",
        "/apis/hostcycle.io/v1alpha1/rebootqueueentries",
        "/apis/hostcycle.io/v1alpha1/rebootqueues",
    ];

    #[tokio::test]
    async fn every_kind_is_watched_once_by_all_three_controllers() {
        let mut expected = vec![HOSTS, SECRETS];
        expected.extend(LOOP_KINDS);
        expected.sort();
        let lists = lists_sent(&ControllerName::ALL, &expected).await;
        assert_eq!(lists, expected, "one list per kind, then its one watch");
    }

    #[tokio::test]
    async fn the_reboot_queue_alone_watches_no_secret() {
        let mut expected = vec![HOSTS];
        expected.extend(LOOP_KINDS);
        expected.sort();
        let lists = lists_sent(&[ControllerName::RebootQueue], &expected).await;
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

    #[test]
    fn huge_durations_are_refused_by_every_flag() {
        for flag in DURATION_FLAGS {
            for value in ["9223372036854775807s", "8785h", "18446744073709551615s"] {
                let err = Cli::try_parse_from(["operator", flag, value]).unwrap_err();
                let text = err.to_string();
                assert!(
                    text.contains("maximum of 365 days") || text.contains("not a duration"),
                    "{flag} {value}: {text}"
                );
            }
            let ok = Cli::try_parse_from(["operator", flag, "8760h"]).unwrap();
            ok.operator.into_config().unwrap();
        }
    }

    #[test]
    fn config_from_out_of_range_values_is_an_error_not_a_panic() {
        let mut args = Cli::try_parse_from(["operator"]).unwrap().operator;
        args.soft_power_off_timeout = jiff::SignedDuration::MAX;
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--soft-power-off-timeout"), "{err}");
        assert!(err.contains("365 days"), "{err}");
    }

    #[test]
    fn bmc_idle_timeout_is_derived_from_the_polls() {
        let idle = |flags: &[&str]| {
            let mut argv = vec!["operator"];
            argv.extend_from_slice(flags);
            let config = Cli::try_parse_from(argv)
                .unwrap()
                .operator
                .into_config()
                .unwrap();
            config.bmh.bmc.idle_timeout
        };
        // Defaults (60 s, 1 s): kept across transition polls only; a steady read a minute
        // later would never find it.
        assert_eq!(idle(&[]), Duration::from_secs(3));
        assert_eq!(idle(&["--steady-poll", "20s"]), Duration::from_secs(3));
        // Frequent steady polls reuse their connection.
        assert_eq!(idle(&["--steady-poll", "8s"]), Duration::from_secs(10));
        assert_eq!(
            idle(&["--steady-poll", "20s", "--transition-poll", "5s"]),
            Duration::from_secs(15)
        );
    }
}
