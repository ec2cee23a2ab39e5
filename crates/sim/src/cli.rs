//! `hostcycle sim`: run simulated kubelets for the systems of a Redfish BMC (emulator).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use hostcycle_bmc::{BmcCredentials, HostConnectOptions, TlsVerification};

use crate::power::bmc_connector;
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
    pub redfish_username: String,
    /// File holding the Redfish password.
    #[arg(long)]
    pub redfish_password_file: PathBuf,
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
    #[arg(long, default_value = "2s", value_parser = hostcycle_bmc::deadline::parse_duration_flag)]
    pub boot_delay: jiff::SignedDuration,
    /// Node Lease renewal interval.
    #[arg(long, default_value = "2s", value_parser = hostcycle_bmc::deadline::parse_duration_flag)]
    pub lease_interval: jiff::SignedDuration,
    /// Also run the simulated CSI driver (CSIDriver sim.csi.hostcycle.io, StorageClass
    /// hostcycle-sim-rwo, provisioner, attacher) with an in-process storage simulator; its
    /// "two writers" violations are logged on exit.
    #[arg(long)]
    pub csi: bool,
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

/// A Redfish service's base URL as a BMC address prefix (`redfish+http://host:port`).
fn address_prefix(base: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(base).with_context(|| format!("--redfish {base:?} is not a URL"))?;
    let scheme = match url.scheme() {
        "http" => "redfish+http",
        "https" => "redfish+https",
        other => bail!("--redfish must be an http:// or https:// URL, not {other}://"),
    };
    let host = url
        .host_str()
        .with_context(|| format!("--redfish {base:?} has no host"))?;
    Ok(match url.port() {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

/// Runs the simulator until Ctrl-C, registering nodes through `client`.
pub async fn run(args: SimArgs, client: kube::Client) -> anyhow::Result<()> {
    let ca = match &args.redfish_ca_file {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let password = std::fs::read_to_string(&args.redfish_password_file)
        .with_context(|| format!("reading {}", args.redfish_password_file.display()))?;
    let credentials = BmcCredentials::new(&args.redfish_username, &password)
        .context("--redfish-username and the password file must not be empty")?;
    let verification = match &ca {
        Some(pem) => TlsVerification::CaBundle(pem.clone()),
        None => TlsVerification::SystemRoots,
    };
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(hostcycle_bmc::tls::client_config(&verification)?)
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .context("building the HTTP client for Redfish discovery")?;
    let auth = (args.redfish_username.clone(), password.trim().to_string());
    let pairs: Vec<(String, String)> = if args.hosts.is_empty() {
        list_redfish_systems(&http, &args.redfish, Some(&auth))
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
    let prefix = address_prefix(&args.redfish)?;
    let connector = bmc_connector();
    let options = HostConnectOptions {
        ca_bundle_pem: ca,
        ..HostConnectOptions::default()
    };
    let hosts = pairs
        .into_iter()
        .enumerate()
        .map(|(i, (node, system))| {
            let address = format!("{prefix}/redfish/v1/Systems/{system}");
            let bmc = connector
                .connect_str(&address, credentials.clone(), &options)
                .with_context(|| format!("connecting to the BMC of {node} at {address}"))?;
            Ok(SimHost {
                control_plane: args.control_plane.contains(&node),
                internal_ip: format!("192.0.2.{}", 10 + i),
                bmc,
                node_name: node,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = SimConfig {
        boot_delay: std_duration(args.boot_delay, "boot-delay")?,
        lease_renew_interval: std_duration(args.lease_interval, "lease-interval")?,
        ..SimConfig::default()
    };
    tracing::info!(
        hosts = hosts.len(),
        "node simulator running; Ctrl-C stops it"
    );
    let storage = crate::StorageSim::new();
    let csi = if args.csi {
        let csi = crate::start_csi_sim(
            client.clone(),
            crate::CsiSimConfig::default(),
            storage.clone(),
        )
        .await
        .context("installing the simulated CSI driver and StorageClass")?;
        tracing::info!(
            driver = crate::SIM_CSI_DRIVER,
            storage_class = crate::SIM_STORAGE_CLASS,
            "simulated CSI driver running"
        );
        Some(csi)
    } else {
        None
    };
    let handle = NodeSimulator::new(client, config, hosts)
        .with_storage(storage.clone())
        .spawn();
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    handle.stop().await;
    if let Some(csi) = csi {
        csi.stop().await;
        let violations = storage.violations();
        if violations.is_empty() {
            tracing::info!("storage simulator: no two writers, no write without attachment");
        }
        for v in violations {
            tracing::warn!(violation = %v, "storage simulator");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn redfish_base_urls_become_bmc_address_prefixes() {
        assert_eq!(
            super::address_prefix("http://127.0.0.1:8000")
                .ok()
                .as_deref(),
            Some("redfish+http://127.0.0.1:8000")
        );
        assert_eq!(
            super::address_prefix("https://bmc.example/")
                .ok()
                .as_deref(),
            Some("redfish+https://bmc.example")
        );
        assert_eq!(
            super::address_prefix("https://[::1]:8443").ok().as_deref(),
            Some("redfish+https://[::1]:8443")
        );
        assert!(super::address_prefix("ftp://x").is_err());
    }
}
