//! `hostcycle operator`: its flags, the configuration they make, and the process that runs
//! until SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::{
    BmhControllerConfig, ControllerName, CredentialsPolicy, LeaderElection, OperatorConfig,
    QueueControllerConfig, RemediationControllerConfig, run,
};

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
    /// Address of /metrics (plain HTTP; at most 64 connections, 5 s for a request header).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Address of the kubelet's probes, /healthz and /readyz: a port of their own, so
    /// scrapers never hold a probe up.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub probe_addr: SocketAddr,
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
    /// Slots kept for remediation power-offs (fencing), which ordinary reboots and steady
    /// polls never take; a power-off for remediation also takes a free action slot.
    #[arg(long, default_value_t = 16)]
    pub fencing_concurrency: u16,
    /// Percentage (1-100) of each lane the hosts of one namespace may hold at once (at least
    /// one slot), so one namespace's hung BMCs never hold every slot.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub namespace_lane_share: u8,
    /// Slots of each lane the hosts of one BMC endpoint (scheme, host, port) may hold at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub lane_slots_per_bmc: u16,
    /// Deadline of one power-state read (retries included): a hung BMC holds a polling slot
    /// no longer than this.
    #[arg(long, default_value = "15s")]
    pub bmc_read_deadline: jiff::SignedDuration,
    /// Deadline of the power-state read that precedes a power action not sent yet: a
    /// black-holed BMC holds an action slot no longer than this (at most --bmc-read-deadline).
    #[arg(long, default_value = "5s", value_parser = flag_duration)]
    pub bmc_action_read_deadline: jiff::SignedDuration,
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
    /// How long a remediation waits for its host to be confirmed off (two BMC readings `Off`
    /// from the bound BMC, made after the power-off request) before it holds with
    /// `CannotFence`: the Node is kept, nothing is escalated, and a person decides.
    #[arg(long, default_value = "5m", value_parser = flag_duration)]
    pub remediation_power_off_timeout: jiff::SignedDuration,
    /// Beyond this skew between the operator's clock and the API server's (measured from its
    /// `Date` header every 30 s), a remediation refuses time-based power evidence and holds:
    /// times written by different clocks (readings, requests) cannot be compared.
    #[arg(long, default_value = "2s", value_parser = flag_duration)]
    pub max_clock_skew: jiff::SignedDuration,
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
    /// Refuse hosts that turn off the check of their BMC's TLS certificate
    /// (`spec.bmc.disableCertificateVerification: true`): a host editor could otherwise send
    /// the password to whoever answers for the BMC's address. Off by default, as in metal3,
    /// where BMCs with self-signed certificates are common.
    #[arg(long)]
    pub refuse_unverified_bmc_tls: bool,
    /// Use only credentials Secrets with this label (`KEY=VALUE`, e.g.
    /// `hostcycle.io/bmc-credentials=true` or metal3's `environment.metal3.io=baremetal`);
    /// only their metadata is watched. `none`: any Secret a host names. Required with
    /// `--bmc-networks` other than `any`: whoever may edit a host should not be able to send
    /// any Secret of its namespace (a database's, a registry's) to a BMC unnoticed, so the
    /// administrator chooses.
    #[arg(long, value_parser = credentials_label)]
    pub bmc_credentials_label: Option<CredentialsLabel>,
}

/// `--bmc-credentials-label`: a label credentials Secrets must carry, or `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialsLabel {
    /// `none`: any Secret a host names (metal3's behaviour).
    AnySecret,
    /// `KEY=VALUE`.
    Label(String, String),
}

pub fn credentials_label(text: &str) -> Result<CredentialsLabel, String> {
    if text == "none" {
        return Ok(CredentialsLabel::AnySecret);
    }
    label_requirement(text).map(|(k, v)| CredentialsLabel::Label(k, v))
}

/// Refuses BMC networks without a choice of credentials Secrets: with `--bmc-networks`
/// narrower than `any`, the administrator cares where credentials go, and must also say
/// which Secrets may be sent (a label, or `none` for any).
pub fn check_credentials_choice(
    networks: &[hostcycle_bmc::destination::BmcNetwork],
    label: Option<&CredentialsLabel>,
) -> anyhow::Result<()> {
    let narrowed = !networks.is_empty()
        && !networks
            .iter()
            .any(|n| matches!(n, hostcycle_bmc::destination::BmcNetwork::Any));
    if narrowed && label.is_none() {
        anyhow::bail!(
            "--bmc-networks is set but --bmc-credentials-label is not: say which Secrets may \
             be sent to BMCs — a label they carry (metal3's operator labels the Secrets it has \
             used environment.metal3.io=baremetal; or e.g. hostcycle.io/bmc-credentials=true), \
             or `none` for any Secret a host names (docs/security.md#where-bmc-credentials-may-go)"
        );
    }
    Ok(())
}

/// A duration flag's value, in the one command-line grammar: not negative, at most
/// [`MAX_DURATION`](hostcycle_duration::MAX_DURATION) (365 days), so that no deadline or
/// requeue computed from it can overflow.
fn flag_duration(text: &str) -> Result<jiff::SignedDuration, hostcycle_duration::DurationError> {
    hostcycle_duration::parse_signed_duration(text)
}

/// `KEY=VALUE` of `--bmc-credentials-label` and `hostcycle manifests --metrics-scraper-label`: a label key (optional DNS prefix and `/`) and
/// a label value.
pub fn label_requirement(text: &str) -> Result<(String, String), String> {
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
    hostcycle_duration::checked_duration(unsigned)
        .map_err(|reason| anyhow::anyhow!("--{flag}: {reason}"))
}

impl OperatorArgs {
    pub fn into_config(self) -> anyhow::Result<OperatorConfig> {
        check_credentials_choice(&self.bmc_networks, self.bmc_credentials_label.as_ref())?;
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
        // The operator's namespace: the Lease's, and where the annotation flow's records live.
        let operator_namespace = self
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into());
        let leader_election = self.leader_elect.then(|| LeaderElection {
            namespace: operator_namespace.clone(),
            lease_name: self.lease_name.clone(),
            identity: identity.clone(),
            lease_duration,
        });
        Ok(OperatorConfig {
            metrics_addr: self.metrics_addr,
            probe_addr: self.probe_addr,
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
                max_clock_skew: duration(self.max_clock_skew, "max-clock-skew")?,
                request_namespaces: self
                    .remediation_request_namespaces
                    .clone()
                    .with_operator_namespace(Some(operator_namespace.as_str())),
                record_namespace: operator_namespace.clone(),
                ..RemediationControllerConfig::default()
            },
            bmh: BmhControllerConfig {
                decide,
                concurrency: self.concurrency,
                action_concurrency: self.action_concurrency,
                fencing_concurrency: self.fencing_concurrency,
                namespace_lane_share: self.namespace_lane_share,
                lane_slots_per_bmc: self.lane_slots_per_bmc,
                read_deadline: duration(self.bmc_read_deadline, "bmc-read-deadline")?,
                action_read_deadline: duration(
                    self.bmc_action_read_deadline,
                    "bmc-action-read-deadline",
                )?,
                bmc,
                credentials: CredentialsPolicy {
                    destinations: hostcycle_bmc::destination::CredentialDestinations {
                        networks: self.bmc_networks.clone(),
                        allow_plain_http: self.allow_plain_http_bmc,
                    },
                    refuse_unverified_tls: self.refuse_unverified_bmc_tls,
                    label: match &self.bmc_credentials_label {
                        Some(CredentialsLabel::Label(key, value)) => {
                            Some((key.clone(), value.clone()))
                        }
                        Some(CredentialsLabel::AnySecret) | None => None,
                    },
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
        assert!(!config.bmh.credentials.refuse_unverified_tls);
        assert_eq!(config.bmh.credentials.label, None);
        // The operator's namespace (the Lease's; here `default`) is resolved in.
        assert_eq!(
            config.remediation.request_namespaces.to_string(),
            "same-as-host,operator-namespace,default"
        );
        // Networks narrower than `any` need a choice of Secrets: a label, or `none`.
        let refused = Cli::try_parse_from(["x", "--bmc-networks", "10.0.0.0/24"])
            .unwrap()
            .operator
            .into_config()
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--bmc-credentials-label is not"),
            "{refused}"
        );
        for ok in [
            &["x", "--bmc-networks", "any"][..],
            &[
                "x",
                "--bmc-networks",
                "10.0.0.0/24",
                "--bmc-credentials-label",
                "none",
            ][..],
        ] {
            let config = Cli::try_parse_from(ok)
                .unwrap()
                .operator
                .into_config()
                .unwrap();
            assert_eq!(config.bmh.credentials.label, None, "{ok:?}");
        }
        let config = Cli::try_parse_from([
            "x",
            "--bmc-networks",
            "10.0.0.0/24,.bmc.example",
            "--bmc-networks=fd00::/64",
            "--allow-plain-http-bmc",
            "--refuse-unverified-bmc-tls",
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
        assert!(config.bmh.credentials.refuse_unverified_tls);
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

    /// The lane flags reach the host controller; out-of-range values are refused at start.
    #[test]
    fn lane_flags() {
        use hostcycle_core::bmh::lanes::Lane;
        let parse = |flags: &[&str]| {
            let mut argv = vec!["operator"];
            argv.extend_from_slice(flags);
            Cli::try_parse_from(argv).map(|cli| cli.operator.into_config().unwrap().bmh)
        };
        let defaults = parse(&[]).unwrap();
        let limits = defaults.lane_limits();
        assert_eq!(
            Lane::ALL.map(|l| (limits.capacity(l), limits.per_namespace(l))),
            [(16, 8), (64, 32), (64, 32)]
        );
        assert_eq!(limits.per_bmc(), 8);
        assert_eq!(defaults.action_read_deadline, Duration::from_secs(5));
        let set = parse(&[
            "--fencing-concurrency",
            "4",
            "--namespace-lane-share",
            "100",
            "--lane-slots-per-bmc",
            "2",
            "--bmc-action-read-deadline",
            "2s",
        ])
        .unwrap();
        let limits = set.lane_limits();
        assert_eq!(
            Lane::ALL.map(|l| limits.per_namespace(l)),
            [4, 64, 64],
            "a namespace may take whole lanes"
        );
        assert_eq!(limits.per_bmc(), 2);
        assert_eq!(set.action_read_deadline, Duration::from_secs(2));
        for refused in [
            &["--namespace-lane-share", "0"][..],
            &["--namespace-lane-share", "101"],
            &["--lane-slots-per-bmc", "0"],
            &["--bmc-action-read-deadline", "-1s"],
        ] {
            assert!(parse(refused).is_err(), "{refused:?} accepted");
        }
    }
}
