//! `hostcycle`: the operator, the admin CLI, the node simulator and the local lab in one binary.

mod lab;

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
    /// Print install manifests: the CRDs and the operator's ServiceAccount and RBAC.
    Manifests {
        /// Namespace of the operator's ServiceAccount.
        #[arg(long, default_value = "hostcycle-system")]
        namespace: String,
    },
    /// Run simulated kubelets that follow Redfish power states.
    Sim(hostcycle_sim::cli::SimArgs),
    /// Run a local lab: control plane, Redfish emulator, simulated nodes and the operator.
    Lab(lab::LabArgs),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_client=warn,kube_runtime=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // One crypto provider for every TLS client in the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = match cli.command {
        Command::Operator(args) => hostcycle_operator::run_cli(args).await,
        Command::Bmc(args) => hostcycle_bmc::cli::run(args).await,
        Command::Crd => print_crds(),
        Command::Manifests { namespace } => print_manifests(&namespace),
        Command::Sim(args) => hostcycle_sim::cli::run(args).await,
        Command::Lab(args) => lab::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn print_manifests(namespace: &str) -> anyhow::Result<()> {
    let mut out = hostcycle_api::crd_yaml()?;
    for object in hostcycle_operator::rbac::rbac_objects(namespace)? {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&object)?);
    }
    print!("{out}");
    Ok(())
}

fn print_crds() -> anyhow::Result<()> {
    print!("{}", hostcycle_api::crd_yaml()?);
    Ok(())
}
