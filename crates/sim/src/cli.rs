//! `hostcycle sim`: run simulated kubelets for the systems of a Redfish BMC (emulator).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::power::{RedfishPowerSource, http_client};
use crate::{NodeSimulator, SimConfig, SimHost};

/// Plays the kubelet for simulated hosts, following each host's Redfish power state.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Kubeconfig of the cluster the nodes join (default: $KUBECONFIG or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Base URL of the Redfish service, e.g. http://127.0.0.1:8000
    #[arg(long)]
    pub redfish: String,
    /// Redfish user (basic auth).
    #[arg(long)]
    pub redfish_username: Option<String>,
    /// File holding the Redfish password.
    #[arg(long)]
    pub redfish_password_file: Option<PathBuf>,
    /// PEM CA bundle to verify a TLS Redfish service.
    #[arg(long)]
    pub redfish_ca_file: Option<PathBuf>,
    /// Hosts as NODE=SYSTEM_ID; default: every Redfish System, named after its Name.
    #[arg(long = "host", value_name = "NODE=SYSTEM_ID")]
    pub hosts: Vec<String>,
    /// Nodes that carry the control-plane role label.
    #[arg(long = "control-plane", value_name = "NODE")]
    pub control_plane: Vec<String>,
    /// Time from power-on until the node reports Ready, e.g. 2s.
    #[arg(long, default_value = "2s")]
    pub boot_delay: jiff::SignedDuration,
    /// Node Lease renewal interval.
    #[arg(long, default_value = "2s")]
    pub lease_interval: jiff::SignedDuration,
}

fn std_duration(d: jiff::SignedDuration, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from(d).with_context(|| format!("--{flag} must not be negative"))
}

/// Every System in a Redfish service as (Id, Name).
pub async fn list_redfish_systems(
    http: &reqwest::Client,
    base: &str,
    auth: Option<&(String, String)>,
) -> anyhow::Result<Vec<(String, String)>> {
    let get = |url: String| {
        let mut req = http.get(url);
        if let Some((u, p)) = auth {
            req = req.basic_auth(u, Some(p));
        }
        req
    };
    let base = base.trim_end_matches('/');
    let collection: serde_json::Value = get(format!("{base}/redfish/v1/Systems"))
        .send()
        .await
        .context("listing Redfish systems")?
        .error_for_status()
        .context("listing Redfish systems")?
        .json()
        .await
        .context("parsing the Redfish Systems collection")?;
    let mut systems = Vec::new();
    for member in collection["Members"].as_array().into_iter().flatten() {
        let Some(path) = member["@odata.id"].as_str() else {
            continue;
        };
        let sys: serde_json::Value = get(format!("{base}{path}"))
            .send()
            .await
            .with_context(|| format!("reading Redfish system {path}"))?
            .json()
            .await
            .with_context(|| format!("parsing Redfish system {path}"))?;
        let id = sys["Id"].as_str().unwrap_or_default().to_string();
        let name = sys["Name"].as_str().unwrap_or(&id).to_string();
        systems.push((id, name));
    }
    Ok(systems)
}

/// Runs the simulator until Ctrl-C.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let client = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            kube::Client::try_from(cfg)?
        }
        None => kube::Client::try_default()
            .await
            .context("connecting to Kubernetes (set --kubeconfig or KUBECONFIG)")?,
    };
    let ca = match &args.redfish_ca_file {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let http = http_client(ca.as_deref()).map_err(anyhow::Error::msg)?;
    let auth = match (&args.redfish_username, &args.redfish_password_file) {
        (Some(u), Some(p)) => {
            let pass =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Some((u.clone(), pass.trim().to_string()))
        }
        (None, None) => None,
        _ => bail!("--redfish-username and --redfish-password-file go together"),
    };
    let pairs: Vec<(String, String)> = if args.hosts.is_empty() {
        list_redfish_systems(&http, &args.redfish, auth.as_ref())
            .await?
            .into_iter()
            .map(|(id, name)| (name, id))
            .collect()
    } else {
        args.hosts
            .iter()
            .map(|h| {
                h.split_once('=')
                    .map(|(n, s)| (n.to_string(), s.to_string()))
                    .with_context(|| format!("--host {h:?} must look like NODE=SYSTEM_ID"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    if pairs.is_empty() {
        bail!(
            "no hosts: the Redfish service at {} lists no systems and no --host was given",
            args.redfish
        );
    }
    let base = args.redfish.trim_end_matches('/');
    let hosts = pairs
        .into_iter()
        .enumerate()
        .map(|(i, (node, system))| SimHost {
            control_plane: args.control_plane.contains(&node),
            internal_ip: format!("192.0.2.{}", 10 + i),
            power: Arc::new(RedfishPowerSource::new(
                http.clone(),
                format!("{base}/redfish/v1/Systems/{system}"),
                auth.clone(),
            )),
            node_name: node,
        })
        .collect::<Vec<_>>();
    let config = SimConfig {
        boot_delay: std_duration(args.boot_delay, "boot-delay")?,
        lease_renew_interval: std_duration(args.lease_interval, "lease-interval")?,
        ..SimConfig::default()
    };
    tracing::info!(
        hosts = hosts.len(),
        "node simulator running; Ctrl-C stops it"
    );
    let handle = NodeSimulator::new(client, config, hosts).spawn();
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    handle.stop().await;
    Ok(())
}
