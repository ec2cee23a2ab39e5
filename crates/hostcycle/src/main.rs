//! `hostcycle`: the operator and the admin CLI in one binary; built with the `lab` feature,
//! also the node simulator and the local lab (never in the production image).

#[cfg(feature = "lab")]
mod lab;
mod reboot_queue;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "hostcycle",
    version,
    about = "Safe reboots, fencing and recovery for bare-metal Kubernetes hosts"
)]
struct Cli {
    /// Log format: human-readable text or JSON lines.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "HOSTCYCLE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controllers (BareMetalHost power controller).
    Operator(hostcycle_operator::OperatorArgs),
    /// Talk to a BMC directly: power status, on, off, cycle.
    Bmc(hostcycle_bmc::cli::BmcArgs),
    /// Print the CustomResourceDefinitions as YAML (generated from the Rust types).
    Crd,
    /// Print install manifests: the CRDs and the operator's ServiceAccount and RBAC; with
    /// `--deploy`, the whole install (`deploy/`): also its Namespace, a NetworkPolicy for the
    /// metrics port, a PodDisruptionBudget, a Deployment of two replicas and a metrics Service.
    Manifests {
        /// Install for `hostcycle operator --namespace NS`: the hosts, their Secrets and
        /// Events of NS only, granted by a Role and RoleBinding in NS (NS must exist; the
        /// install leaves it as it is). The operator still runs in `--operator-namespace`;
        /// the reboot queue and remediation still need a ClusterRole for Nodes, Pods and their
        /// cluster-scoped objects (leave them out with `--controllers`).
        #[arg(long)]
        namespace: Option<String>,
        /// The operator's own namespace: its ServiceAccount, Deployment and leader Lease (the
        /// only Namespace the install creates). Must not be `--namespace`.
        #[arg(long, default_value = "hostcycle-system")]
        operator_namespace: String,
        /// Controllers the operator runs (`hostcycle operator --controllers`): only their
        /// permissions are granted.
        #[arg(long, value_delimiter = ',', default_values_t = hostcycle_operator::ControllerName::ALL.to_vec())]
        controllers: Vec<hostcycle_operator::ControllerName>,
        /// The operator's `--lease-name`.
        #[arg(long, default_value = hostcycle_operator::rbac::DEFAULT_LEASE_NAME)]
        lease_name: String,
        /// The whole install: Namespace, ServiceAccount, RBAC, Deployment and metrics
        /// Service besides the CRDs (the files under `deploy/`).
        #[arg(long)]
        deploy: bool,
        /// Operator image of the Deployment (default: ghcr.io/hostcycle/hostcycle:<version>,
        /// a placeholder: no image is built or published from this repository).
        #[arg(long, requires = "deploy")]
        image: Option<String>,
        /// The namespace whose pods the NetworkPolicy admits to the operator's metrics port
        /// (by its `kubernetes.io/metadata.name` label); every other ingress is denied.
        #[arg(long, default_value = hostcycle_operator::deploy::DEFAULT_METRICS_NAMESPACE, requires = "deploy")]
        metrics_namespace: String,
        /// The operator's `--bmc-networks`: where BMC credentials may be sent (CIDRs, IPs,
        /// DNS names, `.suffix`es, or `any`). Without it the installed operator manages no
        /// host until it is set (docs/security.md).
        #[arg(long, value_delimiter = ',', requires = "deploy")]
        bmc_networks: Vec<hostcycle_bmc::destination::BmcNetwork>,
        /// The operator's `--allow-plain-http-bmc`.
        #[arg(long, requires = "deploy")]
        allow_plain_http_bmc: bool,
        /// The operator's `--bmc-credentials-label` (`KEY=VALUE`).
        #[arg(long, requires = "deploy")]
        bmc_credentials_label: Option<String>,
        /// The operator's `--remediation-request-namespaces` (default
        /// `same-as-host,operator-namespace`).
        #[arg(long, requires = "deploy")]
        remediation_request_namespaces: Option<hostcycle_core::remediation::RequestNamespaces>,
        /// Write `crds.yaml` and `operator.yaml` into this directory instead of printing
        /// one stream.
        #[arg(long, requires = "deploy")]
        output_dir: Option<std::path::PathBuf>,
    },
    /// Run simulated kubelets that follow Redfish power states.
    #[cfg(feature = "lab")]
    Sim(hostcycle_sim::cli::SimArgs),
    /// Run a local lab: control plane, Redfish emulator, simulated nodes and the operator.
    #[cfg(feature = "lab")]
    Lab(lab::LabArgs),
    /// Manage the reboot queue: add nodes, list, cancel, enable/disable, wait, plan.
    #[command(alias = "rq")]
    RebootQueue(reboot_queue::RebootQueueArgs),
    /// Serve the optional admission webhook for BareMetalHosts (docs/webhook.md): refuses
    /// unusable reboot annotation values and, with `--allow-*`, limits reboot requests and
    /// `online: false` to listed identities. `hostcycle webhook manifests` prints its install.
    Webhook(hostcycle_webhook::cli::WebhookArgs),
}

/// mimalloc instead of glibc's malloc: at 5,000 hosts a third less CPU per steady BMC read and
/// a lower peak RSS than glibc even with one arena (docs/benchmarks.md, "Scale: 5,000
/// BareMetalHosts"). Built without transparent huge pages (`no_thp`): with them the operator's
/// peak RSS grew by half.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> std::process::ExitCode {
    // The admin CLI reports API errors itself; the client's own logs would repeat them.
    let default_filter = match cli.command {
        Command::RebootQueue(_) => "warn,kube_client=off,kube_runtime=off",
        _ => "info,kube_client=warn,kube_runtime=warn",
    };
    init_logging(cli.log_format, default_filter);
    // One crypto provider for every TLS client in the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = match cli.command {
        Command::Operator(args) => match kube_client(args.kubeconfig.as_deref()).await {
            Ok(client) => hostcycle_operator::run_cli(args, client).await,
            Err(e) => Err(e),
        },
        Command::Bmc(args) => hostcycle_bmc::cli::run(args).await,
        Command::Crd => print_crds(),
        Command::Manifests {
            namespace,
            operator_namespace,
            controllers,
            lease_name,
            deploy,
            image,
            metrics_namespace,
            bmc_networks,
            allow_plain_http_bmc,
            bmc_credentials_label,
            remediation_request_namespaces,
            output_dir,
        } => {
            let rbac = hostcycle_operator::rbac::RbacOptions {
                namespace: operator_namespace,
                watch_namespace: namespace,
                controllers,
                lease_name,
            };
            if deploy {
                write_deploy(
                    &hostcycle_operator::deploy::DeployOptions {
                        rbac,
                        image: image.unwrap_or_else(hostcycle_operator::deploy::default_image),
                        metrics_namespace,
                        policy: hostcycle_operator::deploy::OperatorPolicy {
                            bmc_networks: bmc_networks.iter().map(ToString::to_string).collect(),
                            allow_plain_http_bmc,
                            bmc_credentials_label,
                            remediation_request_namespaces: remediation_request_namespaces
                                .map(|r| r.to_string()),
                        },
                    },
                    output_dir.as_deref(),
                )
            } else {
                print_manifests(&rbac)
            }
        }
        #[cfg(feature = "lab")]
        Command::Sim(args) => match kube_client(args.kubeconfig.as_deref()).await {
            Ok(client) => hostcycle_sim::cli::run(args, client).await,
            Err(e) => Err(e),
        },
        #[cfg(feature = "lab")]
        Command::Lab(args) => lab::run(args).await,
        Command::RebootQueue(args) => reboot_queue::run(args).await,
        Command::Webhook(args) => hostcycle_webhook::cli::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated, leaving out a cause whose text the message
/// before it already holds (many errors quote their cause, which anyhow's `{:#}` repeats).
fn error_chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

/// A client for `--kubeconfig`, or for `$KUBECONFIG` / the in-cluster config without it.
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "connecting to Kubernetes (set --kubeconfig or KUBECONFIG, or run in a cluster)",
        )?,
    };
    kube::Client::try_from(hostcycle_operator::client_config(config))
        .context("building the Kubernetes client")
}

fn print_manifests(options: &hostcycle_operator::rbac::RbacOptions) -> anyhow::Result<()> {
    let mut out = hostcycle_api::crds_yaml()?;
    for object in hostcycle_operator::rbac::rbac_objects(options)? {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&object)?);
    }
    print!("{out}");
    Ok(())
}

/// `hostcycle manifests --deploy`: the files of `deploy/` into `dir`, or one stream on
/// standard output.
fn write_deploy(
    options: &hostcycle_operator::deploy::DeployOptions,
    dir: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let files = hostcycle_operator::deploy::render(options)?;
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating directory {}", dir.display()))?;
            for (name, text) in files {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        None => {
            let stream: Vec<String> = files.into_iter().map(|(_, text)| text).collect();
            print!("{}", stream.join("---\n"));
        }
    }
    Ok(())
}

fn print_crds() -> anyhow::Result<()> {
    print!("{}", hostcycle_api::crds_yaml()?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("read failed after 2 attempts: {last}")]
    struct Quoting {
        #[source]
        last: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_quotes_is_said_once() {
        let quoting = Quoting {
            last: std::io::Error::other("connection refused"),
        };
        let error = anyhow::Error::new(quoting).context("hostcycle bmc status");
        assert_eq!(
            error_chain(&error),
            "hostcycle bmc status: read failed after 2 attempts: connection refused"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
