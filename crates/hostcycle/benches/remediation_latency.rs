//! How fast remediation moves from step to step, with many machines failing at once.
//!
//! ```text
//! cargo bench -p hostcycle --bench remediation_latency -- [--machines 20] [--max-concurrent 5] \
//!     [--transition-ms 2000] [--boot-delay-ms 2000]
//! ```
//!
//! Starts the local control plane (with the Machine CRDs), a fast in-process Redfish fleet
//! whose power changes take a fixed `--transition-ms` (the arrival of every reset is
//! recorded), one BareMetalHost and one OpenShift Machine per host, the real
//! `hostcycle operator` binary (`--max-concurrent-remediations`, `--transition-poll 250ms`) as
//! its own process, and simulated kubelets. Then it marks every Machine with
//! `host.metal3.io/external-remediation` at once and records, through watches and the stub:
//! - trigger → ForceOff at the BMC (machines that got a slot at once), and slot granted
//!   (`remediation.hostcycle.io/started-at` written) → ForceOff for all;
//! - BMC off (the ForceOff's arrival + the transition time) → Node deleted;
//! - Node deleted → power-on requested (the `On` reset at the BMC);
//! - Node Ready again → cleanup done (the trigger and every marker gone from the Machine);
//! - the total, and the operator's CPU and peak RSS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{clock_ticks, cpu_ticks, percentile, proc_field};
use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_api::remediation::{EXTERNAL_REMEDIATION_ANNOTATION, REMEDIATION_STARTED_ANNOTATION};
use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{NodeSimulator, SimConfig, SimHost};
use hostcycle_testkit::machines::{MachineKind, create_machine};
use hostcycle_testkit::redfish_stub::RedfishStub;
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 20)]
    machines: usize,
    #[arg(long, default_value_t = 5)]
    max_concurrent: usize,
    #[arg(long, default_value_t = 2000)]
    transition_ms: u64,
    #[arg(long, default_value_t = 2000)]
    boot_delay_ms: u64,
    /// cargo bench passes --bench; ignore it.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Default)]
struct Seen {
    /// node → when the Machine got started-at (slot granted).
    started: HashMap<String, Timestamp>,
    /// node → when the Machine's trigger and markers were all gone.
    cleaned: HashMap<String, Timestamp>,
    /// node → when the Node was deleted.
    deleted: HashMap<String, Timestamp>,
    /// node → first time Ready again after its deletion.
    ready_again: HashMap<String, Timestamp>,
    /// host → (first Off reading, the second one that confirmed it) as the host controller
    /// recorded them (`status.powerObservation`), after the run began.
    off_readings: HashMap<String, (Timestamp, Timestamp)>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transition = Duration::from_millis(args.transition_ms);
    eprintln!(
        "starting control plane, {} hosts and Machines, the operator and simulated nodes...",
        args.machines
    );
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let stub = RedfishStub::start_with_transition(args.machines, args.machines, transition)
        .await
        .unwrap();
    let names: Vec<String> = (0..args.machines).map(|i| format!("node-{i:03}")).collect();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret: Secret = serde_json::from_value(
        json!({ "metadata": { "name": "bmc" }, "stringData": { "username": "u", "password": "p" } }),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let hosts: Api<BareMetalHost> = Api::namespaced(client.clone(), "default");
    for (i, name) in names.iter().enumerate() {
        let bmh = BareMetalHost::externally_provisioned(name, &stub.system_address(i), "bmc");
        hosts.create(&PostParams::default(), &bmh).await.unwrap();
        create_machine(
            &client,
            MachineKind::OpenShift,
            "default",
            name,
            Some(("default", name)),
            Some(name),
            &[("machine.openshift.io/cluster-api-machine-role", "worker")],
        )
        .await
        .unwrap();
    }

    let metrics_port = free_port().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
    cmd.args(["operator", "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        // The emulators listen on loopback, over plain HTTP.
        .args([
            "--bmc-networks",
            "127.0.0.0/8,::1/128",
            "--allow-plain-http-bmc",
            "--bmc-credentials-label",
            "none",
            // Machines and hosts of the rig live in different namespaces.
            "--remediation-request-namespaces=*",
        ])
        .args([
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
            "--probe-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
            "--lease-namespace",
            "default",
            "--transition-poll",
            "250ms",
            "--max-concurrent-remediations",
            &args.max_concurrent.to_string(),
        ])
        .env("RUST_LOG", "info,kube_client=warn,kube_runtime=warn");
    let operator = ManagedProcess::spawn("hostcycle-operator", cmd, &cluster.log_dir()).unwrap();
    let pid = operator.pid();

    let connector = hostcycle_sim::bmc_connector();
    let credentials = BmcCredentials::new("u", "p").unwrap();
    let sim_hosts = names
        .iter()
        .enumerate()
        .map(|(i, name)| SimHost {
            node_name: name.clone(),
            control_plane: false,
            internal_ip: format!("10.0.0.{}", i + 1),
            bmc: connector
                .connect_str(
                    &stub.system_address(i),
                    credentials.clone(),
                    &HostConnectOptions::default(),
                )
                .unwrap(),
        })
        .collect();
    let sim = NodeSimulator::new(
        client.clone(),
        SimConfig {
            boot_delay: Duration::from_millis(args.boot_delay_ms),
            power_poll_interval: Duration::from_millis(200),
            ..SimConfig::default()
        },
        sim_hosts,
    )
    .spawn();
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(
        &format!("{} simulated nodes Ready", args.machines),
        Duration::from_secs(120),
        || {
            let nodes = nodes.clone();
            async move {
                let list = nodes.list(&ListParams::default()).await.ok()?;
                let ready = list
                    .items
                    .iter()
                    .filter(|n| hostcycle_sim::node_ready(n) == Some(true))
                    .count();
                (ready >= args.machines).then_some(())
            }
        },
    )
    .await
    .unwrap();
    wait_until(
        "every host registered by the operator (poweredOn)",
        Duration::from_secs(120),
        || {
            let hosts = hosts.clone();
            async move {
                let list = hosts.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .all(|h| h.status.as_ref().and_then(|s| s.powered_on) == Some(true))
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();

    let seen = Arc::new(Mutex::new(Seen::default()));
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &MachineKind::OpenShift.api_resource(),
    );
    let watch_tasks = vec![
        tokio::spawn(watch_machines(machines.clone(), seen.clone())),
        tokio::spawn(watch_nodes(nodes.clone(), seen.clone())),
        tokio::spawn(watch_hosts(hosts.clone(), seen.clone(), Timestamp::now())),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;

    eprintln!(
        "marking {} Machines for remediation (maxConcurrentRemediations {})...",
        args.machines, args.max_concurrent
    );
    let ticks_before = cpu_ticks(pid);
    let run_start = Instant::now();
    let mut triggered: HashMap<String, Timestamp> = HashMap::new();
    for name in &names {
        let patch =
            json!({ "metadata": { "annotations": { EXTERNAL_REMEDIATION_ANNOTATION: "" } } });
        triggered.insert(name.clone(), Timestamp::now());
        machines
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    wait_until(
        "every remediation done (no trigger left)",
        Duration::from_secs(1800),
        || {
            let seen = seen.clone();
            let names = names.clone();
            async move {
                let s = seen.lock().unwrap();
                names
                    .iter()
                    .all(|n| s.cleaned.contains_key(n))
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let wall = run_start.elapsed();
    let cpu = (cpu_ticks(pid) - ticks_before) as f64 / clock_ticks() / wall.as_secs_f64() * 100.0;
    let peak_rss = proc_field(pid, "VmHWM:").unwrap_or(0);
    for t in watch_tasks {
        t.abort();
    }

    let s = seen.lock().unwrap();
    let ms = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64() * 1000.0;
    let mut first_wave = Vec::new();
    let mut slot_to_off = Vec::new();
    let mut off_to_release = Vec::new();
    let mut first_read_to_release = Vec::new();
    let mut confirmed_to_release = Vec::new();
    let mut release_to_on = Vec::new();
    let mut ready_to_clean = Vec::new();
    let mut power_offs = 0;
    let mut missing = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let resets = stub.resets(i);
        power_offs += resets.iter().filter(|r| r.reset_type == "ForceOff").count();
        let off = resets
            .iter()
            .find(|r| r.reset_type == "ForceOff")
            .map(|r| r.at);
        let on = resets.iter().find(|r| r.reset_type == "On").map(|r| r.at);
        let (Some(off), Some(on), Some(started), Some(deleted), Some(ready), Some(cleaned)) = (
            off,
            on,
            s.started.get(name).copied(),
            s.deleted.get(name).copied(),
            s.ready_again.get(name).copied(),
            s.cleaned.get(name).copied(),
        ) else {
            missing.push(name.clone());
            continue;
        };
        let trigger = triggered[name];
        // Machines whose remediation started within a second of the trigger got a slot at once.
        if ms(trigger, started) < 1000.0 {
            first_wave.push(ms(trigger, off));
        }
        slot_to_off.push(ms(started, off));
        let bmc_off = off + jiff::SignedDuration::try_from(transition).unwrap();
        off_to_release.push(ms(bmc_off, deleted));
        if let Some((first, confirmed)) = s.off_readings.get(name).copied() {
            first_read_to_release.push(ms(first, deleted));
            confirmed_to_release.push(ms(confirmed, deleted));
        }
        release_to_on.push(ms(deleted, on));
        ready_to_clean.push(ms(ready, cleaned));
    }
    for v in [
        &mut first_wave,
        &mut slot_to_off,
        &mut off_to_release,
        &mut first_read_to_release,
        &mut confirmed_to_release,
        &mut release_to_on,
        &mut ready_to_clean,
    ] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    println!(
        "\n## Remediation: {} machines failing at once, maxConcurrentRemediations {} (1 operator process, 2 cores)\n",
        args.machines, args.max_concurrent
    );
    println!("| measure | value |");
    println!("|---|---|");
    let row = |label: &str, v: &[f64]| {
        println!(
            "| {label} | p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} machines) |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        )
    };
    row(
        "trigger → ForceOff at the BMC (got a slot at once)",
        &first_wave,
    );
    row("slot granted → ForceOff at the BMC", &slot_to_off);
    row("BMC off → Node released (deleted)", &off_to_release);
    row(
        "first Off reading → Node released (two readings ≥ 1 s apart)",
        &first_read_to_release,
    );
    row(
        "second Off reading (confirmed) → Node released",
        &confirmed_to_release,
    );
    row(
        "Node released → power-on requested at the BMC",
        &release_to_on,
    );
    row("Node Ready again → cleanup done", &ready_to_clean);
    println!("| total wall time | {:.1} s |", wall.as_secs_f64());
    println!("| power-offs sent (one per machine expected) | {power_offs} |");
    println!("| operator CPU during the run | {cpu:.1} % of one core |");
    println!(
        "| operator peak RSS (VmHWM) | {:.1} MB |",
        peak_rss as f64 / 1024.0
    );
    if !missing.is_empty() {
        println!("\nnot measured: {}", missing.join(", "));
    }
    drop(sim);
    drop(operator);
}

async fn watch_machines(api: Api<DynamicObject>, seen: Arc<Mutex<Seen>>) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event else {
            continue;
        };
        let name = m.name_any();
        let a = m.annotations();
        let mut s = seen.lock().unwrap();
        if a.contains_key(REMEDIATION_STARTED_ANNOTATION) {
            s.started.entry(name.clone()).or_insert(now);
        }
        let flow = a.keys().any(|k| {
            k == EXTERNAL_REMEDIATION_ANNOTATION
                || k.starts_with("remediation.metal3.io/")
                || k.starts_with("remediation.hostcycle.io/")
        });
        if !flow && s.started.contains_key(&name) {
            s.cleaned.entry(name).or_insert(now);
        }
    }
}

/// Records, per host, the first confirmed Off run the host controller wrote after `since`.
async fn watch_hosts(api: Api<BareMetalHost>, seen: Arc<Mutex<Seen>>, since: Timestamp) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h)) = event else {
            continue;
        };
        let Some(o) = h.status.as_ref().and_then(|s| s.power_observation.as_ref()) else {
            continue;
        };
        if o.state == hostcycle_api::ObservedPowerState::Off
            && o.confirmed()
            && let (Some(first), Some(confirmed)) = (o.since, o.confirmed_at)
            && first > since
        {
            let mut s = seen.lock().unwrap();
            s.off_readings
                .entry(h.name_any())
                .or_insert((first, confirmed));
        }
    }
}

async fn watch_nodes(api: Api<Node>, seen: Arc<Mutex<Seen>>) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let mut s = seen.lock().unwrap();
        match event {
            Ok(watcher::Event::Delete(n)) => {
                s.deleted.entry(n.name_any()).or_insert(now);
            }
            Ok(watcher::Event::Apply(n)) => {
                let name = n.name_any();
                if s.deleted.contains_key(&name) && hostcycle_sim::node_ready(&n) == Some(true) {
                    s.ready_again.entry(name).or_insert(now);
                }
            }
            _ => {}
        }
    }
}
