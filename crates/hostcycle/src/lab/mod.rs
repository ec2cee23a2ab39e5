//! `hostcycle lab`: a local lab on one machine — a real control plane, a Redfish emulator with
//! six hosts (three control-plane, three workers), their BareMetalHosts, an OpenShift Machine
//! per host, simulated nodes, a sample Deployment with a PodDisruptionBudget, and the operator.
//! Runs until Ctrl-C, then tears down.
//! `hostcycle lab env` prints shell exports for a running lab (like `kind get kubeconfig`);
//! `hostcycle lab rolling-reboot` and `hostcycle lab remediate NODE` start the demos.
//!
//! Fenced failover: the lab also runs the simulated CSI driver and storage, a StatefulSet `db`
//! with ReadWriteOnce volumes on the workers and, when the server serves it, a HostHealthCheck.
//! `hostcycle lab kill-kubelet|partition|power-loss|heal NODE` reach the running lab through its
//! control socket ([`control`]); the lab's terminal shows a concise stream ([`stream`]) while
//! the operator logs to a file.

mod control;
mod failover;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use hostcycle_api::BareMetalHost;
use hostcycle_api::remediation::EXTERNAL_REMEDIATION_ANNOTATION;
use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{CsiSimConfig, NodeSimulator, SimConfig, SimHost, StorageSim};
use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::machines::{MachineKind, OPENSHIFT_MACHINE_ROLE_LABEL};
use hostcycle_testkit::{ClusterOptions, LocalCluster, cache_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

pub const LAB_NAMESPACE: &str = "default";
pub const LAB_CREDENTIALS_SECRET: &str = "lab-bmc-credentials";
const LAB_BMC_USER: &str = "admin";
const LAB_BMC_PASSWORD: &str = "lab-password";

/// Hosts of the lab: (name, is control plane).
pub const LAB_HOSTS: [(&str, bool); 6] = [
    ("cp-0", true),
    ("cp-1", true),
    ("cp-2", true),
    ("worker-0", false),
    ("worker-1", false),
    ("worker-2", false),
];

#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: Option<LabCommand>,
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Run the lab until Ctrl-C (the default).
    Run,
    /// Print shell exports (KUBECONFIG, Redfish endpoint) for the running lab.
    Env,
    /// Queue every lab node for a rolling reboot (workers first, API servers last, one at a
    /// time); watch it with `hostcycle rq wait`.
    RollingReboot,
    /// Mark the Machine of NODE for remediation (annotation
    /// `host.metal3.io/external-remediation`), as a MachineHealthCheck would.
    Remediate {
        /// The node whose Machine (by `status.nodeRef.name`) to remediate, e.g. worker-1.
        node: String,
    },
    /// Kill NODE's kubelet in the running lab: no more heartbeats or pod updates; its pods keep
    /// running and writing to their volumes (until the host loses power).
    KillKubelet {
        /// A lab host, e.g. worker-1.
        node: String,
    },
    /// Cut NODE's kubelet off the API server in the running lab (as kill-kubelet, but the
    /// kubelet still runs).
    Partition {
        /// A lab host, e.g. worker-1.
        node: String,
    },
    /// Cut NODE's power at the Redfish emulator, bypassing hostcycle.
    PowerLoss {
        /// A lab host, e.g. worker-1.
        node: String,
    },
    /// Heal NODE's kubelet (after kill-kubelet or partition) without a power cycle.
    Heal {
        /// A lab host, e.g. worker-1.
        node: String,
    },
}

impl LabArgs {
    /// Whether this runs the lab itself, whose terminal shows the stream and whose logs go to
    /// a file (set up by the lab once it has claimed its directory).
    pub fn runs_lab(&self) -> bool {
        matches!(self.command, None | Some(LabCommand::Run))
    }
}

fn lab_dir() -> PathBuf {
    std::env::var_os("HOSTCYCLE_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("lab"))
}

pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command.unwrap_or(LabCommand::Run) {
        LabCommand::Run => run_lab().await,
        LabCommand::Env => print_env(),
        LabCommand::RollingReboot => rolling_reboot().await,
        LabCommand::Remediate { node } => remediate(&node).await,
        LabCommand::KillKubelet { node } => inject(control::FaultAction::KillKubelet, node).await,
        LabCommand::Partition { node } => inject(control::FaultAction::Partition, node).await,
        LabCommand::PowerLoss { node } => inject(control::FaultAction::PowerLoss, node).await,
        LabCommand::Heal { node } => inject(control::FaultAction::Heal, node).await,
    }
}

/// Asks the running lab, through its control socket, to do `action` to `node`.
async fn inject(action: control::FaultAction, node: String) -> anyhow::Result<()> {
    control::validate_node(&node).map_err(|e| anyhow::anyhow!(e))?;
    let dir = lab_dir();
    if running_lab_pid().is_none() {
        bail!(
            "no lab is running (looked for {}); start one with `make lab`",
            dir.join("lab.pid").display()
        );
    }
    let answer = control::send(&dir, &control::ControlRequest { action, node }).await?;
    println!("{answer}; watch the lab's terminal");
    Ok(())
}

/// Sends the process's logs (the operator's, the simulator's) to `path` instead of the
/// terminal, which shows the stream.
fn log_to_file(path: &Path) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_client=warn,kube_runtime=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Arc::new(file))
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log writer: {e}"))
}

/// The PID of a lab that is still running, if any.
fn running_lab_pid() -> Option<i32> {
    let text = std::fs::read_to_string(lab_dir().join("lab.pid")).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    alive.then_some(pid)
}

fn print_env() -> anyhow::Result<()> {
    let dir = lab_dir();
    if running_lab_pid().is_none() {
        bail!(
            "no lab is running (looked for {}); start one with `make lab`",
            dir.join("lab.pid").display()
        );
    }
    let env = std::fs::read_to_string(dir.join("lab.env"))
        .with_context(|| format!("reading {}", dir.join("lab.env").display()))?;
    print!("{env}");
    Ok(())
}

/// Removes the lab's PID file when the lab ends, however it ends.
struct PidFile(PathBuf);

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn run_lab() -> anyhow::Result<()> {
    // 1. One lab at a time, in a fresh directory; logs to a file there.
    let (dir, _pid_file) = claim_lab_dir()?;
    let log_path = dir.join("operator.log");
    log_to_file(&log_path)?;
    println!(
        "Logs of the operator and the simulator: {}",
        log_path.display()
    );
    let started = Instant::now();
    // 2. The control plane.
    let cluster = start_control_plane(dir.join("cluster")).await?;
    let client = cluster.client();
    // 3. The Redfish emulator, and the objects of the hosts behind it.
    let redfish = Arc::new(start_redfish().await?);
    create_bare_metal_hosts(&client, &redfish).await?;
    create_machines(&client).await?;
    create_reboot_queue(&client).await?;
    // 4. The operator, with every controller.
    println!("Starting the operator...");
    let metrics_port = hostcycle_testkit::free_port()?;
    let operator_stop = tokio_util::sync::CancellationToken::new();
    // Cancels the operator on every early return too.
    let _operator_guard = operator_stop.clone().drop_guard();
    let operator = tokio::spawn(hostcycle_operator::run(
        client.clone(),
        lab_operator_config(metrics_port, hostcycle_testkit::free_port()?)?,
        operator_stop.clone(),
    ));
    // 5. Simulated storage and CSI driver, simulated nodes writing to it, Ready.
    println!("Starting the simulated CSI driver and storage...");
    let storage = StorageSim::new();
    let csi =
        hostcycle_sim::start_csi_sim(client.clone(), CsiSimConfig::default(), storage.clone())
            .await
            .context("starting the simulated CSI driver")?;
    let sim = start_simulated_nodes(&client, &redfish, storage.clone())?;
    wait_nodes_ready(&client, LAB_HOSTS.len(), Duration::from_secs(60)).await?;
    // 6. The stream, from here on: the sample workloads' start is its first news.
    let stream_stop = tokio_util::sync::CancellationToken::new();
    let _stream_guard = stream_stop.clone().drop_guard();
    let (stream_sender, stream_receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut stream_tasks = stream::start(
        stream::StreamSources {
            client: client.clone(),
            namespace: LAB_NAMESPACE,
            shown_app: failover::STATEFULSET,
            storage: storage.clone(),
            hosts: LAB_HOSTS.map(|(name, _)| name).to_vec(),
        },
        stream_sender.clone(),
        stream_receiver,
        stream_stop.clone(),
    );
    println!("\nWhat happens (time from the last fault):");
    create_sample_workload(&client).await?;
    failover::create_statefulset(&client).await?;
    failover::wait_statefulset_running(&client, Duration::from_secs(120)).await?;
    let health_check = failover::create_host_health_check(&client).await?;
    // 7. The control socket for `hostcycle lab kill-kubelet` and friends.
    let socket = control::bind(&dir)?;
    let control_server = tokio::spawn(control::serve(
        socket,
        control::LabTargets {
            sim: sim.control(),
            redfish: redfish.clone(),
            stream: stream_sender,
        },
        stream_stop.clone(),
    ));
    // 8. How to use it.
    write_lab_env(&dir, &cluster, &redfish)?;
    println!("\nThe hostcycle lab is up ({:.1?}).", started.elapsed());
    print_instructions(metrics_port, &cluster, &redfish, &log_path, health_check);
    // 9. Until Ctrl-C; then everything stops.
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    println!("\nStopping the lab...");
    stream_stop.cancel();
    let _ = control_server.await;
    while stream_tasks.join_next().await.is_some() {}
    operator_stop.cancel();
    match operator.await {
        Ok(Err(e)) => eprintln!("operator: {e:#}"),
        Err(e) => eprintln!("operator task: {e}"),
        Ok(Ok(())) => {}
    }
    sim.stop().await;
    csi.stop().await;
    report_violations(&storage);
    // The control server, the only other holder, has ended: this stops the emulator.
    drop(redfish);
    drop(cluster);
    println!("Lab stopped; nothing is left running.");
    Ok(())
}

/// Says whether the storage ever saw two writers or a write while not attached.
fn report_violations(storage: &StorageSim) {
    let violations = storage.violations();
    if violations.is_empty() {
        println!("Storage: no violation (never two writers, no write while not attached).");
    } else {
        println!("Storage: {} VIOLATION(S):", violations.len());
        for violation in violations {
            println!("  {violation}");
        }
    }
}

/// Refuses to start a second lab; empties the cluster directory and writes the PID file
/// (removed when the returned guard drops).
fn claim_lab_dir() -> anyhow::Result<(PathBuf, PidFile)> {
    if let Some(pid) = running_lab_pid() {
        bail!(
            "a lab is already running (pid {pid}); stop it with Ctrl-C in its terminal, or `kill {pid}`"
        );
    }
    let dir = lab_dir();
    let _ = std::fs::remove_dir_all(dir.join("cluster"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pid_path = dir.join("lab.pid");
    std::fs::write(&pid_path, std::process::id().to_string())
        .with_context(|| format!("writing {}", pid_path.display()))?;
    Ok((dir, PidFile(pid_path)))
}

async fn start_control_plane(cluster_dir: PathBuf) -> anyhow::Result<LocalCluster> {
    println!("Starting the control plane (etcd, kube-apiserver, controller manager, scheduler)...");
    LocalCluster::start(ClusterOptions {
        base_dir: Some(cluster_dir),
        node_monitor_grace_period: Duration::from_secs(20),
        ..ClusterOptions::default()
    })
    .await
    .context("starting the local control plane")
}

/// One powered-on system per lab host, behind basic auth, over plain HTTP.
async fn start_redfish() -> anyhow::Result<RedfishEmulator> {
    println!(
        "Starting the Redfish emulator with {} hosts...",
        LAB_HOSTS.len()
    );
    let systems = LAB_HOSTS
        .iter()
        .map(|(name, _)| FakeSystem::new(*name, FakePower::On))
        .collect::<Vec<_>>();
    RedfishEmulator::start(RedfishEmulatorOptions {
        systems,
        basic_auth: Some((LAB_BMC_USER.into(), LAB_BMC_PASSWORD.into())),
        tls: false,
        ..RedfishEmulatorOptions::default()
    })
    .await
    .context("starting the Redfish emulator")
}

/// Every controller, leader election on a Lease, metrics on `metrics_port` and probes on
/// `probe_port`; BMC credentials may go to loopback over plain HTTP, where the lab's
/// emulators listen.
fn lab_operator_config(
    metrics_port: u16,
    probe_port: u16,
) -> anyhow::Result<hostcycle_operator::OperatorConfig> {
    Ok(hostcycle_operator::OperatorConfig {
        metrics_addr: std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port)),
        probe_addr: std::net::SocketAddr::from(([127, 0, 0, 1], probe_port)),
        leader_election: Some(hostcycle_operator::LeaderElection {
            namespace: LAB_NAMESPACE.into(),
            lease_name: "hostcycle-operator".into(),
            identity: "lab-operator".into(),
            lease_duration: Duration::from_secs(15),
        }),
        identity: "lab-operator".into(),
        controllers: hostcycle_operator::ControllerName::ALL.to_vec(),
        namespace: None,
        bmh: hostcycle_operator::BmhControllerConfig {
            credentials: hostcycle_operator::CredentialsPolicy {
                destinations: hostcycle_bmc::destination::CredentialDestinations {
                    networks: ["127.0.0.0/8", "::1/128"]
                        .iter()
                        .map(|n| n.parse())
                        .collect::<Result<_, _>>()
                        .map_err(|e: String| anyhow::anyhow!(e))?,
                    allow_plain_http: true,
                },
                refuse_unverified_tls: false,
                label: None,
            },
            ..hostcycle_operator::BmhControllerConfig::default()
        },
        queue: hostcycle_operator::QueueControllerConfig::default(),
        remediation: hostcycle_operator::RemediationControllerConfig::default(),
    })
}

/// One simulated node per lab host, following the power of its emulated system.
fn start_simulated_nodes(
    client: &Client,
    redfish: &RedfishEmulator,
    storage: StorageSim,
) -> anyhow::Result<hostcycle_sim::SimHandle> {
    println!("Starting simulated nodes...");
    let connector = hostcycle_sim::bmc_connector();
    let credentials = BmcCredentials::new(LAB_BMC_USER, LAB_BMC_PASSWORD)?;
    let hosts = LAB_HOSTS
        .iter()
        .enumerate()
        .map(|(i, (name, cp))| {
            let bmc = connector.connect_str(
                &redfish.system_address(i)?,
                credentials.clone(),
                &HostConnectOptions::default(),
            )?;
            Ok(SimHost {
                node_name: (*name).to_string(),
                control_plane: *cp,
                internal_ip: format!("192.0.2.{}", 10 + i),
                bmc,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(
        NodeSimulator::new(client.clone(), SimConfig::default(), hosts)
            .with_storage(storage)
            .spawn(),
    )
}

/// `lab.env`: the exports `hostcycle lab env` prints.
fn write_lab_env(
    dir: &Path,
    cluster: &LocalCluster,
    redfish: &RedfishEmulator,
) -> anyhow::Result<()> {
    let env = format!(
        "export KUBECONFIG={}\nexport HOSTCYCLE_REDFISH={}\nexport HOSTCYCLE_REDFISH_USERNAME={LAB_BMC_USER}\nexport HOSTCYCLE_REDFISH_PASSWORD_FILE={}\n",
        cluster.kubeconfig_path().display(),
        redfish.endpoint(),
        write_password_file(dir)?.display(),
    );
    std::fs::write(dir.join("lab.env"), &env).context("writing lab.env")
}

fn print_instructions(
    metrics_port: u16,
    cluster: &LocalCluster,
    redfish: &RedfishEmulator,
    log_path: &Path,
    health_check: bool,
) {
    const LAB: &str = "cargo run -q -p hostcycle --features lab -- lab";
    println!("From another terminal:\n");
    println!("  eval \"$({LAB} env)\"");
    println!("  kubectl get nodes,bmh,pods,volumeattachments -o wide");
    println!(
        "\nWatch a fenced failover (this terminal shows what happens, timed from the fault):\n"
    );
    println!("  {LAB} kill-kubelet worker-1   # or: partition NODE, power-loss NODE, heal NODE");
    if health_check {
        println!(
            "\n  The HostHealthCheck notices the stale Lease, the operator powers the host off (two BMC\n  \
             readings), force-deletes its pods and clears volumesInUse, powers it on; the db pod and\n  \
             its volume come back on another worker. The same worker failing again within an hour\n  \
             is fenced and released, then left off for a person (kubectl get hr: LeftOff)."
        );
    } else {
        println!(
            "\n  This build serves no HostHealthCheck: ask for the remediation by hand, e.g.\n"
        );
        println!(
            "  kubectl create -f - <<EOF\n{}EOF",
            manual_remediation_yaml("worker-1")
        );
    }
    println!("\nWatch a reboot through the BareMetalHost API:\n");
    println!("  kubectl get bmh -w &");
    println!("  kubectl annotate bmh worker-0 reboot.metal3.io=          # soft power cycle");
    println!(
        "  kubectl annotate bmh worker-1 'reboot.metal3.io/mine={{\"mode\":\"hard\"}}'   # hard off, held"
    );
    println!("  kubectl annotate bmh worker-1 reboot.metal3.io/mine-      # release: powers on");
    println!("  kubectl get events --sort-by=.metadata.creationTimestamp");
    println!(
        "\nWatch a rolling reboot through the reboot queue (cordon, drain, reboot, uncordon):\n"
    );
    println!(
        "  cargo run -q -p hostcycle --features lab -- lab rolling-reboot   # queues every node"
    );
    println!(
        "  cargo run -q -p hostcycle --features lab -- rq wait              # progress until the queue is empty"
    );
    // `kubectl get -w` watches one resource type only.
    println!("  watch -n1 kubectl get rqe,nodes,pods -o wide");
    println!(
        "\nWatch a remediation (the Machine of a node is marked with {EXTERNAL_REMEDIATION_ANNOTATION}):\n"
    );
    println!("  cargo run -q -p hostcycle --features lab -- lab remediate worker-1");
    println!("  {WATCH_REMEDIATION}");
    println!("\nOperator metrics: http://127.0.0.1:{metrics_port}/metrics");
    println!(
        "\nRedfish emulator: {}  (user {LAB_BMC_USER}, password in $HOSTCYCLE_REDFISH_PASSWORD_FILE)",
        redfish.endpoint()
    );
    println!("Operator log:     {}", log_path.display());
    println!("Component logs:   {}", cluster.log_dir().display());
    println!("\nPress Ctrl-C to stop the lab and tear everything down.");
}

/// A HostRemediation releasing `node`'s workloads, as a HostHealthCheck would ask for it.
fn manual_remediation_yaml(node: &str) -> String {
    format!(
        "apiVersion: hostcycle.io/v1alpha1\nkind: HostRemediation\nmetadata:\n  name: {node}\n  \
         namespace: {LAB_NAMESPACE}\n  annotations:\n    remediation.medik8s.io/node-name: {node}\n\
         spec:\n  strategy:\n    release: ReleaseWorkloads\n"
    )
}

/// Queues every lab node through the reboot queue, as `hostcycle rq add` would.
async fn rolling_reboot() -> anyhow::Result<()> {
    let dir = lab_dir();
    if running_lab_pid().is_none() {
        bail!("no lab is running; start one with `make lab`");
    }
    let kubeconfig = dir.join("cluster").join("kubeconfig");
    let exe = std::env::current_exe().context("finding the hostcycle binary")?;
    // Workers first: the queue starts an entry as soon as it sees it, and an API server
    // queued alone would go first.
    let nodes: Vec<&str> = LAB_HOSTS
        .iter()
        .filter(|(_, cp)| !cp)
        .chain(LAB_HOSTS.iter().filter(|(_, cp)| *cp))
        .map(|(name, _)| *name)
        .collect();
    let status = std::process::Command::new(exe)
        .arg("reboot-queue")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("add")
        // `node/NAME`: never read as a file, whatever the current directory holds.
        .args(nodes.iter().map(|name| format!("node/{name}")))
        .status()
        .context("running `hostcycle reboot-queue add`")?;
    if !status.success() {
        bail!("queueing the lab's nodes failed ({status})");
    }
    println!(
        "\nQueued {} nodes. Watch the rolling reboot:\n",
        nodes.len()
    );
    println!(
        "  hostcycle rq wait        # or: cargo run -q -p hostcycle --features lab -- rq wait"
    );
    println!("  watch -n1 kubectl get rqe,nodes");
    Ok(())
}

/// What to watch during a remediation. The Machines are named in full: `machine` alone names
/// Cluster API's kind, which the lab serves too (without Machines). `kubectl get -w` watches
/// one resource type only, hence `watch`.
const WATCH_REMEDIATION: &str =
    "watch -n1 kubectl get machines.machine.openshift.io,bmh,nodes -o wide";

/// Marks the Machine whose `status.nodeRef.name` is `node` for remediation, as OpenShift's
/// MachineHealthCheck does: the annotation `host.metal3.io/external-remediation: ""`.
async fn remediate(node: &str) -> anyhow::Result<()> {
    let dir = lab_dir();
    if running_lab_pid().is_none() {
        bail!("no lab is running; start one with `make lab`");
    }
    let kubeconfig = dir.join("cluster").join("kubeconfig");
    let client = hostcycle_testkit::client_from_kubeconfig(&kubeconfig).await?;
    let mut matches = Vec::new();
    let mut other_nodes = Vec::new();
    for kind in MachineKind::ALL {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            // This kind is not served.
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {kind}")),
        };
        for machine in list.items {
            let node_ref = machine
                .data
                .pointer("/status/nodeRef/name")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_string();
            if node_ref == node {
                matches.push((kind, machine));
            } else if !node_ref.is_empty() {
                other_nodes.push(node_ref);
            }
        }
    }
    let (kind, machine) = match matches.len() {
        1 => matches.remove(0),
        0 => {
            other_nodes.sort();
            bail!(
                "no Machine has status.nodeRef.name {node}; nodes with a Machine: {}",
                other_nodes.join(", ")
            );
        }
        _ => bail!(
            "several Machines have status.nodeRef.name {node}: {}",
            matches
                .iter()
                .map(|(kind, m)| format!(
                    "{kind} {}/{}",
                    m.metadata.namespace.as_deref().unwrap_or_default(),
                    m.metadata.name.as_deref().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let name = machine.metadata.name.clone().unwrap_or_default();
    let already = machine
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(EXTERNAL_REMEDIATION_ANNOTATION));
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &kind.api_resource());
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": { "annotations": { EXTERNAL_REMEDIATION_ANNOTATION: "" } }
        })),
    )
    .await
    .with_context(|| format!("annotating {kind} {namespace}/{name}"))?;
    if already {
        println!(
            "Machine {namespace}/{name} (node {node}) was already marked for remediation ({EXTERNAL_REMEDIATION_ANNOTATION})."
        );
    } else {
        println!(
            "Marked Machine {namespace}/{name} (node {node}) for remediation: {EXTERNAL_REMEDIATION_ANNOTATION}"
        );
    }
    println!(
        "\nWatch it (eval \"$(cargo run -q -p hostcycle --features lab -- lab env)\" first):\n"
    );
    println!("  {WATCH_REMEDIATION}");
    println!("  kubectl get events -n {namespace} --sort-by=.metadata.creationTimestamp");
    Ok(())
}

/// One OpenShift Machine per lab host, named after it, in the hosts' namespace: its host in the
/// `metal3.io/BareMetalHost` annotation, its Node in `status.nodeRef`, OpenShift's role label
/// (`master` for control-plane hosts, `worker` otherwise) and `status.phase: Running`.
async fn create_machines(client: &Client) -> anyhow::Result<()> {
    let kind = MachineKind::OpenShift;
    for (name, control_plane) in LAB_HOSTS {
        let role = if control_plane { "master" } else { "worker" };
        let mut machine = hostcycle_testkit::machine(
            kind,
            LAB_NAMESPACE,
            name,
            Some((LAB_NAMESPACE, name)),
            Some(name),
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, role)],
        );
        machine.data["status"]["phase"] = json!("Running");
        hostcycle_testkit::create_machine_object(client, kind, &machine)
            .await
            .with_context(|| format!("creating Machine {name}"))?;
    }
    Ok(())
}

/// The lab's reboot queue: PodDisruptionBudget refusals are retried for a minute (the demo
/// Deployment's PDB lets one pod go at a time), and a failed drain is retried after ~30 s.
async fn create_reboot_queue(client: &Client) -> anyhow::Result<()> {
    use hostcycle_api::queue::{DrainBackoffSpec, RebootQueue, RebootQueueSpec, RebootSpec};
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let queue = RebootQueue::new(
        hostcycle_api::queue::REBOOT_QUEUE_NAME,
        RebootQueueSpec {
            evict_retries: Some(30),
            evict_interval_seconds: Some(2),
            eviction_timeout_seconds: Some(300),
            drain_backoff: Some(DrainBackoffSpec {
                base_seconds: Some(30),
                max_seconds: Some(120),
                jitter_seconds: Some(10),
            }),
            reboot: Some(RebootSpec {
                boot_timeout_seconds: Some(600),
                ..RebootSpec::default()
            }),
            ..RebootQueueSpec::default()
        },
    );
    queues
        .create(&PostParams::default(), &queue)
        .await
        .context("creating RebootQueue default")?;
    Ok(())
}

fn write_password_file(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("bmc-password");
    hostcycle_testkit::pki::write_private(&path, LAB_BMC_PASSWORD)?;
    Ok(path)
}

async fn create_bare_metal_hosts(client: &Client, redfish: &RedfishEmulator) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), LAB_NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": LAB_CREDENTIALS_SECRET },
        "stringData": { "username": LAB_BMC_USER, "password": LAB_BMC_PASSWORD },
    }))?;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .context("creating the BMC credentials Secret")?;
    let hosts: Api<BareMetalHost> = Api::namespaced(client.clone(), LAB_NAMESPACE);
    for (index, (name, _)) in LAB_HOSTS.iter().enumerate() {
        let address = redfish.system_address(index)?;
        let bmh = BareMetalHost::externally_provisioned(name, &address, LAB_CREDENTIALS_SECRET);
        hosts
            .create(&PostParams::default(), &bmh)
            .await
            .with_context(|| format!("creating BareMetalHost {name}"))?;
    }
    Ok(())
}

async fn wait_nodes_ready(client: &Client, count: usize, timeout: Duration) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    hostcycle_testkit::wait_until(
        &format!("{count} simulated nodes to be Ready"),
        timeout,
        || {
            let nodes = nodes.clone();
            async move {
                let list = nodes.list(&ListParams::default()).await.ok()?;
                (list
                    .items
                    .iter()
                    .filter(|n| hostcycle_sim::node_ready(n) == Some(true))
                    .count()
                    >= count)
                    .then_some(())
            }
        },
    )
    .await?;
    Ok(())
}

/// A Deployment of 3 replicas guarded by a PodDisruptionBudget (minAvailable 2); the PDB's API
/// version is chosen by discovery (policy/v1beta1 on 1.20, policy/v1 on current Kubernetes).
async fn create_sample_workload(client: &Client) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), LAB_NAMESPACE);
    let deployment = hostcycle_testkit::pause_deployment("demo", 3);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .context("creating Deployment demo")?;
    let policy = kube::discovery::group(client, "policy")
        .await
        .context("discovering the policy API group")?;
    let (resource, _) = policy
        .recommended_kind("PodDisruptionBudget")
        .context("the API server serves no PodDisruptionBudget kind")?;
    let pdbs: Api<DynamicObject> = Api::namespaced_with(client.clone(), LAB_NAMESPACE, &resource);
    let pdb: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version,
        "kind": "PodDisruptionBudget",
        "metadata": { "name": "demo" },
        "spec": { "minAvailable": 2, "selector": { "matchLabels": { "app": "demo" } } },
    }))?;
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .context("creating PodDisruptionBudget demo")?;
    Ok(())
}
