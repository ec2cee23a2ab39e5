//! `hostcycle`: the operator and the admin CLI in one binary; built with the `lab` feature,
//! also the node simulator and the local lab (never in the production image).

#[cfg(feature = "lab")]
mod lab;
mod manifests;
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
    /// Run the operator: the BareMetalHost power controller, the reboot queue and remediation
    /// (choose with `--controllers`).
    Operator(hostcycle_operator::OperatorArgs),
    /// Talk to a BMC directly: power status, on, off, cycle.
    Bmc(hostcycle_bmc::cli::BmcArgs),
    /// Print the CustomResourceDefinitions as YAML (generated from the Rust types).
    Crd,
    /// Print install manifests: the CRDs and the operator's ServiceAccount and RBAC; with
    /// `--deploy`, the whole install (`deploy/`): also its Namespace, a NetworkPolicy for the
    /// metrics port, a PodDisruptionBudget, a Deployment of two replicas and a metrics Service.
    Manifests(manifests::ManifestsArgs),
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
    // The lab logs to a file in its directory once it has claimed it; its terminal shows
    // a concise stream instead.
    #[cfg(feature = "lab")]
    let logs_to_lab_file = matches!(&cli.command, Command::Lab(args) if args.runs_lab());
    #[cfg(not(feature = "lab"))]
    let logs_to_lab_file = false;
    if !logs_to_lab_file {
        init_logging(cli.log_format, default_filter);
    }
    // One crypto provider for every TLS client in the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = match cli.command {
        Command::Operator(args) => match kube_client(args.kubeconfig.as_deref()).await {
            Ok(client) => hostcycle_operator::run_cli(args, client).await,
            Err(e) => Err(e),
        },
        Command::Bmc(args) => hostcycle_bmc::cli::run(args).await,
        Command::Crd => print_crds(),
        Command::Manifests(args) => manifests::run(args),
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
