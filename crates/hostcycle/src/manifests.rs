//! `hostcycle manifests`: its flags and the install manifests it prints or writes.

use anyhow::Context;
use clap::Args;
use hostcycle_operator::deploy::{DeployOptions, OperatorPolicy, default_image, render};
use hostcycle_operator::rbac::{RbacOptions, rbac_objects};

/// `hostcycle manifests` flags.
#[derive(Debug, Args)]
pub struct ManifestsArgs {
    /// Install for `hostcycle operator --namespace NS`: the hosts, their Secrets and
    /// Events of NS only, granted by a Role and RoleBinding in NS (NS must exist; the
    /// install leaves it as it is). The operator still runs in `--operator-namespace`;
    /// the reboot queue and remediation still need a ClusterRole for Nodes, Pods and their
    /// cluster-scoped objects (leave them out with `--controllers`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// The operator's own namespace: its ServiceAccount, Deployment and leader Lease (the
    /// only Namespace the install creates). Must not be `--namespace`.
    #[arg(long, default_value = "hostcycle-system")]
    pub operator_namespace: String,
    /// Controllers the operator runs (`hostcycle operator --controllers`): only their
    /// permissions are granted.
    #[arg(long, value_delimiter = ',', default_values_t = hostcycle_operator::ControllerName::ALL.to_vec())]
    pub controllers: Vec<hostcycle_operator::ControllerName>,
    /// The operator's `--lease-name`.
    #[arg(long, default_value = hostcycle_operator::rbac::DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// The whole install: Namespace, ServiceAccount, RBAC, Deployment and metrics
    /// Service besides the CRDs (the files under `deploy/`).
    #[arg(long)]
    pub deploy: bool,
    /// Operator image of the Deployment (default: ghcr.io/hostcycle/hostcycle:<version>,
    /// a placeholder: no image is built or published from this repository).
    #[arg(long, requires = "deploy")]
    pub image: Option<String>,
    /// The label (`KEY=VALUE`) of the namespaces whose pods the NetworkPolicy admits to the
    /// operator's metrics port; every other ingress is denied. An administrator sets it on
    /// the monitoring namespace (`kubectl label namespace monitoring
    /// hostcycle.io/metrics-scraper=true`): not a namespace's name, which whoever creates it
    /// chooses.
    #[arg(long, default_value = hostcycle_operator::deploy::DEFAULT_METRICS_SCRAPERS,
          value_parser = hostcycle_operator::cli::label_requirement, requires = "deploy")]
    pub metrics_scraper_label: (String, String),
    /// The operator's `--bmc-networks`: where BMC credentials may be sent (CIDRs, IPs,
    /// DNS names, `.suffix`es, or `any`). Without it the installed operator manages no
    /// host until it is set (docs/security.md).
    #[arg(long, value_delimiter = ',', requires = "deploy")]
    pub bmc_networks: Vec<hostcycle_bmc::destination::BmcNetwork>,
    /// The operator's `--allow-plain-http-bmc`.
    #[arg(long, requires = "deploy")]
    pub allow_plain_http_bmc: bool,
    /// The operator's `--refuse-unverified-bmc-tls`.
    #[arg(long, requires = "deploy")]
    pub refuse_unverified_bmc_tls: bool,
    /// The operator's `--bmc-credentials-label` (`KEY=VALUE`, or `none`); required with
    /// `--bmc-networks` other than `any`.
    #[arg(long, requires = "deploy", value_parser = checked_credentials_label)]
    pub bmc_credentials_label: Option<String>,
    /// The operator's `--remediation-request-namespaces` (default
    /// `same-as-host,operator-namespace`).
    #[arg(long, requires = "deploy")]
    pub remediation_request_namespaces: Option<hostcycle_core::remediation::RequestNamespaces>,
    /// Write `crds.yaml` and `operator.yaml` into this directory instead of printing
    /// one stream.
    #[arg(long, requires = "deploy")]
    pub output_dir: Option<std::path::PathBuf>,
}

/// `hostcycle manifests`: the CRDs and RBAC, or with `--deploy` the whole install.
pub fn run(args: ManifestsArgs) -> anyhow::Result<()> {
    let ManifestsArgs {
        namespace,
        operator_namespace,
        controllers,
        lease_name,
        deploy,
        image,
        metrics_scraper_label,
        bmc_networks,
        allow_plain_http_bmc,
        refuse_unverified_bmc_tls,
        bmc_credentials_label,
        remediation_request_namespaces,
        output_dir,
    } = args;
    let rbac = RbacOptions {
        namespace: operator_namespace,
        watch_namespace: namespace,
        controllers,
        lease_name,
    };
    if deploy {
        // The operator would refuse to start: say so now, not in a crash-looping pod.
        hostcycle_operator::cli::check_credentials_choice(
            &bmc_networks,
            bmc_credentials_label
                .as_deref()
                .and_then(|l| hostcycle_operator::cli::credentials_label(l).ok())
                .as_ref(),
        )?;
        write_deploy(
            &DeployOptions {
                rbac,
                image: image.unwrap_or_else(default_image),
                metrics_scraper_label,
                policy: OperatorPolicy {
                    bmc_networks: bmc_networks.iter().map(ToString::to_string).collect(),
                    allow_plain_http_bmc,
                    refuse_unverified_bmc_tls,
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

fn print_manifests(options: &RbacOptions) -> anyhow::Result<()> {
    let mut out = hostcycle_api::crds_yaml()?;
    for object in rbac_objects(options)? {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&object)?);
    }
    print!("{out}");
    Ok(())
}

/// `hostcycle manifests --deploy`: the files of `deploy/` into `dir`, or one stream on
/// standard output.
fn write_deploy(options: &DeployOptions, dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    let files = render(options)?;
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

/// `--bmc-credentials-label` as the operator will parse it, kept as written.
fn checked_credentials_label(text: &str) -> Result<String, String> {
    hostcycle_operator::cli::credentials_label(text).map(|_| text.to_string())
}
