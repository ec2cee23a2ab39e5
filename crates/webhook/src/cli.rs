//! `hostcycle webhook`: serve the admission webhook; `hostcycle webhook manifests`: print its
//! install objects.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hostcycle_duration::parse_duration;
use tokio_util::sync::CancellationToken;

use crate::manifests::{FailurePolicy, PdbVersion, WebhookInstall, webhook_yaml};
use crate::policy::{Policy, ServiceAccountName, operator_service_account};
use crate::server::{App, ServerOptions, serve};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct WebhookArgs {
    #[command(subcommand)]
    pub command: Option<WebhookCommand>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum WebhookCommand {
    /// Print the webhook's install objects as YAML: Service, Deployment (running `hostcycle
    /// webhook` with the TLS Secret `hostcycle-webhook-tls` mounted) and the
    /// ValidatingWebhookConfiguration; with `--cert-manager` also cert-manager's Issuers and
    /// Certificates (a self-signed CA and the serving certificate).
    Manifests(ManifestsArgs),
}

/// Who may request power changes. Any `--allow-*` flag turns the allow-list on.
#[derive(Debug, Clone, clap::Args)]
pub struct AllowArgs {
    /// A user who may add, remove or change `reboot.metal3.io` annotations, set
    /// `spec.online` to false, change `spec.bmc`, add, remove or change the
    /// `baremetalhost.metal3.io/paused` and `/detached` annotations, and add, change or
    /// remove `spec.consumerRef` (repeatable). Any
    /// `--allow-*` flag restricts these changes to the listed identities plus
    /// `--operator-service-account`.
    #[arg(long = "allow-user", value_name = "USER")]
    pub allow_users: Vec<String>,
    /// A group whose members may (repeatable), e.g. `system:masters` or
    /// `system:serviceaccounts:NAMESPACE`.
    #[arg(long = "allow-group", value_name = "GROUP")]
    pub allow_groups: Vec<String>,
    /// A ServiceAccount that may (repeatable).
    #[arg(long = "allow-service-account", value_name = "NAMESPACE:NAME")]
    pub allow_service_accounts: Vec<ServiceAccountName>,
    /// The operator's ServiceAccount, always allowed when the allow-list is on: the reboot
    /// queue and remediation add and remove their annotations with it, and the host
    /// controller removes `reboot.metal3.io` after a reboot's power-off
    /// [default: hostcycle-system:hostcycle-operator; for `manifests`, NAMESPACE:hostcycle-operator].
    #[arg(long, value_name = "NAMESPACE:NAME")]
    pub operator_service_account: Option<ServiceAccountName>,
    /// With the allow-list on, also restrict setting `spec.bmc` when a host is created: only
    /// listed identities may then create hosts with a BMC (enrolling hosts, GitOps tools and
    /// `clusterctl move` included). On by default with an allow-list, because otherwise a
    /// BMC an update may not change could be changed by deleting and re-creating the host;
    /// `--restrict-bmc-on-create=false`: creating a host is governed by RBAC alone.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub restrict_bmc_on_create: Option<bool>,
    /// With the allow-list on, also restrict setting `spec.consumerRef` when a host is
    /// created: only listed identities may then create hosts already consumed (`clusterctl
    /// move` and installers included). Off: creating a host is governed by RBAC alone.
    #[arg(long)]
    pub restrict_consumer_ref_on_create: bool,
}

impl AllowArgs {
    fn has_allow_list(&self) -> bool {
        !(self.allow_users.is_empty()
            && self.allow_groups.is_empty()
            && self.allow_service_accounts.is_empty())
    }

    /// Whether setting `spec.bmc` on a create is restricted, once an allow-list is on:
    /// unless `--restrict-bmc-on-create=false` says otherwise.
    pub fn restrict_bmc_on_create(&self) -> bool {
        self.restrict_bmc_on_create.unwrap_or(true)
    }

    /// Refuses flags that would do nothing.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.restrict_bmc_on_create != Some(true) || self.has_allow_list(),
            "--restrict-bmc-on-create restricts to the allow-list, and none is given: add \
             --allow-user, --allow-group or --allow-service-account"
        );
        anyhow::ensure!(
            !self.restrict_consumer_ref_on_create || self.has_allow_list(),
            "--restrict-consumer-ref-on-create restricts to the allow-list, and none is given: \
             add --allow-user, --allow-group or --allow-service-account"
        );
        Ok(())
    }

    /// The policy these flags ask for.
    pub fn policy(&self) -> Policy {
        if !self.has_allow_list() {
            return Policy::validate_only();
        }
        Policy {
            restrict_bmc_on_create: self.restrict_bmc_on_create(),
            restrict_consumer_ref_on_create: self.restrict_consumer_ref_on_create,
            ..Policy::allow_list(
                self.allow_users.iter().cloned(),
                self.allow_groups.iter().cloned(),
                self.allow_service_accounts.iter().cloned(),
                [self
                    .operator_service_account
                    .clone()
                    .unwrap_or_else(operator_service_account)],
            )
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to serve HTTPS on (reviews, `/healthz`, `/metrics`).
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Address to serve the kubelet's probes on, plain HTTP: `/healthz` (liveness) and
    /// `/readyz` (readiness). A port of their own, so probes never wait behind reviews.
    #[arg(long, default_value = "0.0.0.0:9440")]
    pub probe_addr: SocketAddr,
    /// PEM certificate chain to serve (re-read when it changes).
    #[arg(long, required = true, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the certificate (re-read when it changes).
    #[arg(long, required = true, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// How often the certificate files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// Largest AdmissionReview body accepted.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// The longest a request's body may take to arrive.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Bytes per second a request's body must arrive at, after 1 s of grace (so a 4 MiB
    /// body gets 5 s, a 2 KiB one about 1 s; at most `--request-timeout`). 0: no rate.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub min_body_rate: u64,
    /// The API server sends a review at once: a body still arriving after this long gives
    /// its budget up (HTTP 408) when a body that arrives needs it, and its connection may be
    /// taken by a new one at `--max-connections`.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub slow_body_after: Duration,
    /// A new connection must finish its TLS handshake and send a complete request header
    /// within this long, or it is closed.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// An idle keep-alive connection is closed after this long (longer than the API
    /// server's own 90 s, so it closes first).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Connections open at once. At the limit a new connection replaces the oldest one not
    /// serving a request, or is closed at once when all are.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Reviews parsed and decided at once; bodies being received share a budget of this
    /// many times `--max-request-bytes`. Beyond, after a 1 s wait: HTTP 503.
    #[arg(long, default_value_t = 8)]
    pub max_concurrent_reviews: usize,
    #[command(flatten)]
    pub allow: AllowArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// Namespace of the Deployment, Service and TLS Secret (the operator's).
    #[arg(long, default_value = "hostcycle-system")]
    pub namespace: String,
    /// Image of the Deployment (default: the operator's image, which carries the webhook).
    #[arg(long)]
    pub image: Option<String>,
    /// `Fail`: host edits are refused while no webhook replica answers (the operator's own
    /// annotation writes included); `Ignore`: they go through unchecked. Default: `Fail` with
    /// an allow-list, `Ignore` without (docs/webhook.md).
    #[arg(long, value_enum)]
    pub failure_policy: Option<FailurePolicy>,
    /// PEM file of the CA that signed the webhook's certificate, put in `caBundle`.
    #[arg(long, value_name = "FILE", conflicts_with = "cert_manager")]
    pub ca_bundle_file: Option<PathBuf>,
    /// Let cert-manager issue the certificate (from a self-signed CA it keeps) and inject
    /// `caBundle`.
    #[arg(long)]
    pub cert_manager: bool,
    /// API version of the PodDisruptionBudget: `v1` (Kubernetes ≥ 1.21) or `v1beta1`
    /// (older clusters; removed in 1.25).
    #[arg(long, value_enum, default_value = "v1")]
    pub pdb_version: PdbVersion,
    #[command(flatten)]
    pub allow: AllowArgs,
}

impl ManifestsArgs {
    pub fn install(&self) -> anyhow::Result<WebhookInstall> {
        self.allow.check()?;
        let mut install = WebhookInstall::new(&self.namespace);
        if let Some(image) = &self.image {
            install.image = image.clone();
        }
        install.allow_users = self.allow.allow_users.clone();
        install.allow_groups = self.allow.allow_groups.clone();
        install.allow_service_accounts = self.allow.allow_service_accounts.clone();
        if let Some(sa) = &self.allow.operator_service_account {
            install.operator_service_account = sa.clone();
        }
        install.restrict_bmc_on_create = self.allow.restrict_bmc_on_create();
        install.restrict_consumer_ref_on_create = self.allow.restrict_consumer_ref_on_create;
        install.failure_policy = self.failure_policy;
        install.cert_manager = self.cert_manager;
        install.pdb_version = self.pdb_version;
        if let Some(path) = &self.ca_bundle_file {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            anyhow::ensure!(
                pem.contains("-----BEGIN CERTIFICATE-----"),
                "{} holds no PEM certificate",
                path.display()
            );
            install.ca_bundle_pem = Some(pem);
        }
        Ok(install)
    }
}

/// Runs `hostcycle webhook` (until SIGTERM or Ctrl-C) or one of its subcommands.
pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    match args.command {
        Some(WebhookCommand::Manifests(manifests)) => {
            print!("{}", webhook_yaml(&manifests.install()?)?);
            Ok(())
        }
        None => run_server(args.serve).await,
    }
}

async fn run_server(args: ServeArgs) -> anyhow::Result<()> {
    let (Some(cert_file), Some(key_file)) = (args.tls_cert_file, args.tls_key_file) else {
        anyhow::bail!("--tls-cert-file and --tls-key-file are required");
    };
    args.allow.check()?;
    let policy = args.allow.policy();
    let options = ServerOptions {
        probe_listen: Some(args.probe_addr),
        max_body_bytes: args.max_request_bytes,
        request_timeout: args.request_timeout,
        min_body_rate: args.min_body_rate,
        slow_body_after: args.slow_body_after,
        tls_reload_interval: args.tls_reload_interval,
        max_connections: args.max_connections.max(1),
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        max_concurrent_reviews: args.max_concurrent_reviews.max(1),
        ..ServerOptions::new(args.listen, cert_file, key_file)
    };
    let shutdown = CancellationToken::new();
    let running = serve(
        options,
        Arc::new(App::new(policy.clone())),
        shutdown.clone(),
    )
    .await?;
    let allowed = match &policy.allow {
        Some(list) => list.describe(),
        None => "everyone RBAC lets edit hosts (no allow-list)".to_string(),
    };
    let probes = running
        .probe_addr
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        address = %running.local_addr,
        %probes,
        power_requests_allowed_to = %allowed,
        restrict_bmc_on_create = policy.restrict_bmc_on_create,
        restrict_consumer_ref_on_create = policy.restrict_consumer_ref_on_create,
        "webhook serving"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
    running.task.await.context("the server task failed")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Command {
        Webhook(WebhookArgs),
    }

    fn parse(args: &[&str]) -> Result<WebhookArgs, clap::Error> {
        let cli = Cli::try_parse_from(["hostcycle"].iter().chain(args))?;
        let Command::Webhook(args) = cli.command;
        Ok(args)
    }

    #[test]
    fn serving_needs_the_certificate_files() {
        let err = parse(&["webhook"]).unwrap_err();
        assert!(err.to_string().contains("--tls-cert-file"), "{err}");
        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--request-timeout=3s",
        ])
        .unwrap();
        assert_eq!(args.serve.request_timeout, Duration::from_secs(3));
        assert_eq!(args.serve.allow.policy(), Policy::validate_only());
    }

    #[test]
    fn any_allow_flag_turns_the_allow_list_on_with_the_operator() {
        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--allow-group=power-admins",
        ])
        .unwrap();
        let list = args.serve.allow.policy().allow.unwrap();
        assert!(list.groups.contains("power-admins"));
        assert!(list.service_accounts.contains(&operator_service_account()));

        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--allow-service-account=tenant:rebooter",
            "--operator-service-account=ops:hc",
        ])
        .unwrap();
        let list = args.serve.allow.policy().allow.unwrap();
        let names: Vec<String> = list
            .service_accounts
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(names, ["ops:hc", "tenant:rebooter"]);

        let err = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--allow-service-account=rebooter",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("NAMESPACE:NAME"), "{err}");
    }

    #[test]
    fn manifests_need_no_certificate_flags() {
        let args = parse(&[
            "webhook",
            "manifests",
            "--namespace=ops",
            "--allow-user=alice",
        ])
        .unwrap();
        let Some(WebhookCommand::Manifests(manifests)) = args.command else {
            panic!("manifests subcommand");
        };
        let install = manifests.install().unwrap();
        assert_eq!(
            install.operator_service_account.to_string(),
            "ops:hostcycle-operator"
        );
        assert_eq!(install.failure_policy(), FailurePolicy::Fail);
    }

    #[test]
    fn abuse_limits_and_the_probe_port_have_defaults() {
        let args = parse(&["webhook", "--tls-cert-file=c", "--tls-key-file=k"]).unwrap();
        let serve = args.serve;
        assert_eq!(serve.probe_addr, "0.0.0.0:9440".parse().unwrap());
        assert_eq!(serve.header_timeout, Duration::from_secs(5));
        assert_eq!(serve.idle_timeout, Duration::from_secs(120));
        assert_eq!(serve.max_connections, 256);
        assert_eq!(serve.max_concurrent_reviews, 8);
        assert_eq!(serve.allow.restrict_bmc_on_create, None);
        assert!(!serve.allow.restrict_consumer_ref_on_create);

        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--probe-addr=127.0.0.1:1234",
            "--header-timeout=2s",
            "--max-concurrent-reviews=3",
        ])
        .unwrap();
        assert_eq!(args.serve.probe_addr.port(), 1234);
        assert_eq!(args.serve.header_timeout, Duration::from_secs(2));
        assert_eq!(args.serve.max_concurrent_reviews, 3);
    }

    #[test]
    fn restricting_bmc_on_create_needs_an_allow_list() {
        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--restrict-bmc-on-create",
        ])
        .unwrap();
        let err = args.serve.allow.check().unwrap_err();
        assert!(
            err.to_string()
                .contains("--allow-user, --allow-group or --allow-service-account"),
            "{err}"
        );
        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--restrict-bmc-on-create",
            "--allow-user=alice",
        ])
        .unwrap();
        args.serve.allow.check().unwrap();
        assert!(args.serve.allow.policy().restrict_bmc_on_create);

        let args = parse(&["webhook", "manifests", "--restrict-bmc-on-create"]).unwrap();
        let Some(WebhookCommand::Manifests(manifests)) = args.command else {
            panic!("manifests subcommand");
        };
        assert!(manifests.install().is_err());
        let args = parse(&[
            "webhook",
            "manifests",
            "--restrict-bmc-on-create",
            "--allow-group=power-admins",
            "--pdb-version=v1beta1",
        ])
        .unwrap();
        let Some(WebhookCommand::Manifests(manifests)) = args.command else {
            panic!("manifests subcommand");
        };
        let install = manifests.install().unwrap();
        assert!(install.restrict_bmc_on_create);
        assert_eq!(install.pdb_version, PdbVersion::V1beta1);
    }

    #[test]
    fn restricting_consumer_ref_on_create_needs_an_allow_list() {
        let flag = "--restrict-consumer-ref-on-create";
        let args = parse(&["webhook", "--tls-cert-file=c", "--tls-key-file=k", flag]).unwrap();
        let err = args.serve.allow.check().unwrap_err();
        assert!(err.to_string().contains(flag), "{err}");
        let args = parse(&[
            "webhook",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            flag,
            "--allow-user=alice",
        ])
        .unwrap();
        args.serve.allow.check().unwrap();
        let policy = args.serve.allow.policy();
        assert!(policy.restrict_consumer_ref_on_create);

        let args = parse(&["webhook", "manifests", flag]).unwrap();
        let Some(WebhookCommand::Manifests(manifests)) = args.command else {
            panic!("manifests subcommand");
        };
        assert!(manifests.install().is_err());
        let args = parse(&["webhook", "manifests", flag, "--allow-group=power-admins"]).unwrap();
        let Some(WebhookCommand::Manifests(manifests)) = args.command else {
            panic!("manifests subcommand");
        };
        let install = manifests.install().unwrap();
        assert!(install.restrict_consumer_ref_on_create);
    }

    /// Issue 25 point 5: with an allow-list, a host's BMC cannot be changed by deleting and
    /// re-creating the host, unless the administrator says so.
    #[test]
    fn with_an_allow_list_setting_bmc_on_create_is_restricted_by_default() {
        let serve = |extra: &[&str]| {
            let mut argv = vec!["webhook", "--tls-cert-file=c", "--tls-key-file=k"];
            argv.extend_from_slice(extra);
            let args = parse(&argv).unwrap();
            args.serve.allow.check().unwrap();
            args.serve.allow.policy()
        };
        assert!(serve(&["--allow-user=alice"]).restrict_bmc_on_create);
        assert!(serve(&["--allow-group=ops", "--restrict-bmc-on-create"]).restrict_bmc_on_create);
        assert!(
            serve(&["--allow-group=ops", "--restrict-bmc-on-create=true"]).restrict_bmc_on_create
        );
        assert!(
            !serve(&["--allow-group=ops", "--restrict-bmc-on-create=false"]).restrict_bmc_on_create
        );
        // Without an allow-list nothing is restricted, and opting out is not an error.
        assert!(!serve(&[]).restrict_bmc_on_create);
        assert!(!serve(&["--restrict-bmc-on-create=false"]).restrict_bmc_on_create);
        // The consumerRef restriction stays opt-in: one flag, one restriction.
        assert!(!serve(&["--allow-user=alice"]).restrict_consumer_ref_on_create);

        let install = |extra: &[&str]| {
            let mut argv = vec!["webhook", "manifests"];
            argv.extend_from_slice(extra);
            let Some(WebhookCommand::Manifests(manifests)) = parse(&argv).unwrap().command else {
                panic!("manifests subcommand");
            };
            manifests.install().unwrap()
        };
        assert!(install(&["--allow-group=power-admins"]).restrict_bmc_on_create);
        assert!(
            !install(&[
                "--allow-group=power-admins",
                "--restrict-bmc-on-create=false"
            ])
            .restrict_bmc_on_create
        );
    }
}
