//! A rolling reboot of a fleet through the reboot queue, measured from outside.
//!
//! ```text
//! cargo bench -p hostcycle --bench reboot_queue_rolling -- [--workers 50] [--pods 20] \
//!     [--max-concurrent 5] [--transition-ms 2000] [--boot-delay-ms 2000] [--shutdown-ms 1000]
//! ```
//!
//! Starts the local control plane, a fast in-process Redfish fleet whose power changes take a
//! fixed `--transition-ms` (so the ideal schedule is known), one BareMetalHost per worker, the
//! real `hostcycle operator` binary as its own process, and simulated kubelets (boot delay
//! `--boot-delay-ms`, containers exit `--shutdown-ms` after their pod is deleted). Every worker
//! runs `--pods` pause pods (one Deployment per node, pinned to it). Then it queues every
//! worker with `maxConcurrentReboots: --max-concurrent` and records, through watches:
//! - drain complete (the node's last pod gone) → reboot requested (the host's
//!   `reboot.metal3.io` annotation), per node;
//! - boot confirmed (the host's `lastPoweredOn` written and the Node Ready with a heartbeat
//!   after it) → uncordon, per node;
//! - how far apart a node's evictions were issued (first to last pod marked for deletion);
//! - total wall time against the ideal `waves × (shutdown + 2 × transition + boot delay)`;
//! - the operator's CPU and peak RSS over the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{clock_ticks, cpu_ticks, percentile, proc_field};
use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{RebootQueue, RebootQueueEntry};
use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{NodeSimulator, SimConfig, SimHost};
use hostcycle_testkit::redfish_stub::RedfishStub;
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 50)]
    workers: usize,
    #[arg(long, default_value_t = 20)]
    pods: i32,
    #[arg(long, default_value_t = 5)]
    max_concurrent: u32,
    #[arg(long, default_value_t = 2000)]
    transition_ms: u64,
    #[arg(long, default_value_t = 2000)]
    boot_delay_ms: u64,
    #[arg(long, default_value_t = 1000)]
    shutdown_ms: u64,
    /// `bare`: pods bound to their node, not recreated when evicted. `deployments`: one
    /// Deployment per node, pinned to it (evicted pods are recreated and stay Pending until
    /// their node is back).
    #[arg(long, value_enum, default_value_t = Workload::Bare)]
    workload: Workload,
    /// cargo bench passes --bench; ignore it.
    #[arg(long, hide = true)]
    bench: bool,
}

/// What the watches saw, with the time each thing was seen.
#[derive(Default)]
struct Seen {
    /// pod uid → (node, first seen terminating, deleted).
    pods: HashMap<String, (String, Option<Timestamp>, Option<Timestamp>)>,
    /// node → time the host's reboot annotation was first seen (after the run started).
    annotated: HashMap<String, Timestamp>,
    /// node → (lastPoweredOn value, time first seen).
    powered_on: HashMap<String, (Timestamp, Timestamp)>,
    /// node → first time seen Ready with a heartbeat after the host's lastPoweredOn.
    booted: HashMap<String, Timestamp>,
    /// node → first time seen cordoned / uncordoned again.
    cordoned: HashMap<String, Timestamp>,
    uncordoned: HashMap<String, Timestamp>,
    /// Node Ready heartbeats seen (node → heartbeat values), to match with lastPoweredOn.
    heartbeats: HashMap<String, Vec<(Timestamp, Timestamp)>>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Workload {
    Bare,
    Deployments,
}

fn node_of_host(host: &str) -> String {
    host.to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transition = Duration::from_millis(args.transition_ms);
    eprintln!(
        "starting control plane, {} Redfish systems, the operator and {} simulated nodes...",
        args.workers, args.workers
    );
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let stub = RedfishStub::start_with_transition(args.workers, args.workers, transition)
        .await
        .unwrap();
    let names: Vec<String> = (0..args.workers).map(|i| format!("node-{i:03}")).collect();

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
    }
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let queue: RebootQueue = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1", "kind": "RebootQueue",
        "metadata": { "name": "default" },
        "spec": { "maxConcurrentReboots": args.max_concurrent },
    }))
    .unwrap();
    queues.create(&PostParams::default(), &queue).await.unwrap();

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
            internal_ip: format!("10.0.{}.{}", i / 250, i % 250 + 1),
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
            pod_sync_interval: Duration::from_millis(500),
            pod_shutdown_delay: Duration::from_millis(args.shutdown_ms),
            ..SimConfig::default()
        },
        sim_hosts,
    )
    .spawn();
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(
        &format!("{} simulated nodes Ready", args.workers),
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
                (ready >= args.workers).then_some(())
            }
        },
    )
    .await
    .unwrap();

    eprintln!(
        "starting {} pods ({} per node)...",
        args.workers as i32 * args.pods,
        args.pods
    );
    match args.workload {
        Workload::Bare => {
            // Pods bound to their node with no controller: evicted pods are not recreated,
            // so the run measures the queue, not the ReplicaSet controller and scheduler
            // reacting to 1,000 evictions on the same 2 cores.
            let api: Api<Pod> = Api::namespaced(client.clone(), "default");
            let pods: Vec<Pod> = names
                .iter()
                .flat_map(|node| (0..args.pods).map(move |i| (node.clone(), i)))
                .map(|(node, i)| {
                    serde_json::from_value(json!({
                        "metadata": { "name": format!("{node}-pod-{i:02}"), "labels": { "app": "bench" } },
                        "spec": {
                            "nodeName": node,
                            "containers": [{ "name": "app", "image": "registry.k8s.io/pause:3.2" }],
                        },
                    }))
                    .unwrap()
                })
                .collect();
            futures::stream::iter(pods.into_iter().map(|pod| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &pod).await.unwrap() }
            }))
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        }
        Workload::Deployments => {
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
            for name in &names {
                let mut d = hostcycle_testkit::pause_deployment(&format!("app-{name}"), args.pods);
                if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                    spec.node_selector = Some(BTreeMap::from([(
                        "kubernetes.io/hostname".to_string(),
                        name.clone(),
                    )]));
                }
                deployments
                    .create(&PostParams::default(), &d)
                    .await
                    .unwrap();
            }
        }
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let total_pods = args.workers * args.pods as usize;
    wait_until(
        &format!("{total_pods} pods Running"),
        Duration::from_secs(600),
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                let running = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                (running >= total_pods).then_some(())
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

    // Watches record when each thing happened.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let initial: HashMap<String, String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| Some((p.uid()?, p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    {
        let mut s = seen.lock().unwrap();
        for (uid, node) in &initial {
            s.pods.insert(uid.clone(), (node.clone(), None, None));
        }
    }
    let started_at = Timestamp::now();
    let watch_tasks = vec![
        tokio::spawn(watch_pods(pods.clone(), seen.clone())),
        tokio::spawn(watch_hosts(hosts.clone(), seen.clone(), started_at)),
        tokio::spawn(watch_nodes(nodes.clone(), seen.clone(), started_at)),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;

    eprintln!(
        "queueing {} workers (maxConcurrentReboots {})...",
        args.workers, args.max_concurrent
    );
    let ticks_before = cpu_ticks(pid);
    let run_start = Instant::now();
    let entries: Api<RebootQueueEntry> = Api::all(client.clone());
    for (i, name) in names.iter().enumerate() {
        let entry = RebootQueueEntry::for_node(name, i as u64 + 1);
        entries
            .create(&PostParams::default(), &entry)
            .await
            .unwrap();
    }
    wait_until(
        "every entry done (removed)",
        Duration::from_secs(1800),
        || {
            let entries = entries.clone();
            async move {
                let list = entries.list(&ListParams::default()).await.ok()?;
                list.items.is_empty().then_some(())
            }
        },
    )
    .await
    .unwrap();
    let wall = run_start.elapsed();
    let clock_ticks = clock_ticks();
    let cpu = (cpu_ticks(pid) - ticks_before) as f64 / clock_ticks / wall.as_secs_f64() * 100.0;
    let peak_rss = proc_field(pid, "VmHWM:").unwrap_or(0);
    // Let the watches catch the last uncordons.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for t in watch_tasks {
        t.abort();
    }

    let s = seen.lock().unwrap();
    let mut request_ms = Vec::new();
    let mut uncordon_ms = Vec::new();
    let mut eviction_spread_ms = Vec::new();
    let mut cordon_to_first_eviction_ms = Vec::new();
    let mut pod_exit_ms = Vec::new();
    let mut drain_ms = Vec::new();
    let mut missing = Vec::new();
    for name in &names {
        let node_pods: Vec<&(String, Option<Timestamp>, Option<Timestamp>)> =
            s.pods.values().filter(|(n, _, _)| n == name).collect();
        let drained = node_pods.iter().filter_map(|(_, _, gone)| *gone).max();
        let evicted: Vec<Timestamp> = node_pods.iter().filter_map(|(_, t, _)| *t).collect();
        if let (Some(first), Some(last)) = (evicted.iter().min(), evicted.iter().max()) {
            eviction_spread_ms.push(last.duration_since(*first).as_secs_f64() * 1000.0);
            if let Some(c) = s.cordoned.get(name) {
                cordon_to_first_eviction_ms.push(first.duration_since(*c).as_secs_f64() * 1000.0);
                if let Some(d) = drained {
                    drain_ms.push(d.duration_since(*c).as_secs_f64() * 1000.0);
                }
            }
        }
        for (_, evicted_at, gone) in &node_pods {
            if let (Some(e), Some(g)) = (evicted_at, gone) {
                pod_exit_ms.push(g.duration_since(*e).as_secs_f64() * 1000.0);
            }
        }
        match (drained, s.annotated.get(name)) {
            (Some(d), Some(a)) => request_ms.push(a.duration_since(d).as_secs_f64() * 1000.0),
            _ => missing.push(format!("{name}: drain/request")),
        }
        let confirmed = match (s.powered_on.get(name), s.booted.get(name)) {
            (Some((_, seen_lpo)), Some(ready)) => Some((*seen_lpo).max(*ready)),
            _ => None,
        };
        match (confirmed, s.uncordoned.get(name)) {
            (Some(c), Some(u)) => uncordon_ms.push(u.duration_since(c).as_secs_f64() * 1000.0),
            _ => missing.push(format!("{name}: boot/uncordon")),
        }
    }
    for v in [
        &mut request_ms,
        &mut uncordon_ms,
        &mut eviction_spread_ms,
        &mut cordon_to_first_eviction_ms,
        &mut pod_exit_ms,
        &mut drain_ms,
    ] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    let waves = args.workers.div_ceil(args.max_concurrent as usize) as f64;
    let per_node = (args.shutdown_ms + 2 * args.transition_ms + args.boot_delay_ms) as f64 / 1000.0;
    let ideal = waves * per_node;

    println!(
        "\n## Reboot queue: rolling reboot of {} workers, {} pods each ({:?}), maxConcurrentReboots {} (1 operator process, 2 cores)\n",
        args.workers, args.pods, args.workload, args.max_concurrent
    );
    println!("| measure | value |");
    println!("|---|---|");
    let row = |label: &str, v: &[f64]| {
        let unit = if label.contains("a pod") {
            "pods"
        } else {
            "nodes"
        };
        println!(
            "| {label} | p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} {unit}) |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        )
    };
    row("drain complete → reboot requested", &request_ms);
    row("boot confirmed → uncordon", &uncordon_ms);
    row(
        "a node's evictions, first → last issued",
        &eviction_spread_ms,
    );
    row(
        "cordon → first eviction (incl. the dry run)",
        &cordon_to_first_eviction_ms,
    );
    row("a pod evicted → gone (simulated kubelet)", &pod_exit_ms);
    row("cordon → drain complete", &drain_ms);
    println!("| total wall time | {:.1} s |", wall.as_secs_f64());
    println!(
        "| ideal schedule: {waves:.0} waves × ({} ms shutdown + 2 × {} ms power transition + {} ms boot) | {ideal:.1} s |",
        args.shutdown_ms, args.transition_ms, args.boot_delay_ms
    );
    println!(
        "| wall time over ideal | {:+.1} % |",
        (wall.as_secs_f64() / ideal - 1.0) * 100.0
    );
    println!("| operator CPU during the run | {cpu:.1} % of one core |");
    println!(
        "| operator peak RSS (VmHWM) | {:.1} MB |",
        peak_rss as f64 / 1024.0
    );
    let resets: usize = (0..args.workers)
        .map(|i| {
            stub.resets(i)
                .iter()
                .filter(|r| r.reset_type != "On")
                .count()
        })
        .sum();
    println!("| power-offs sent (one per node expected) | {resets} |");
    if !missing.is_empty() {
        println!("\nnot measured: {}", missing.join(", "));
    }
    drop(sim);
    drop(operator);
}

async fn watch_pods(api: Api<Pod>, seen: Arc<Mutex<Seen>>) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let mut s = seen.lock().unwrap();
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                if p.metadata.deletion_timestamp.is_some()
                    && let Some(entry) = p.uid().and_then(|u| s.pods.get_mut(&u))
                {
                    entry.1.get_or_insert(now);
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                if let Some(entry) = p.uid().and_then(|u| s.pods.get_mut(&u)) {
                    entry.1.get_or_insert(now);
                    entry.2.get_or_insert(now);
                }
            }
            _ => {}
        }
    }
}

async fn watch_hosts(api: Api<BareMetalHost>, seen: Arc<Mutex<Seen>>, since: Timestamp) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h)) = event else {
            continue;
        };
        let node = node_of_host(&h.name_any());
        let mut s = seen.lock().unwrap();
        if h.annotations().contains_key("reboot.metal3.io") && now > since {
            s.annotated.entry(node.clone()).or_insert(now);
        }
        if let Some(lpo) = h
            .status
            .as_ref()
            .and_then(|st| st.provisioning.last_powered_on)
            .filter(|t| *t > since)
        {
            s.powered_on.entry(node.clone()).or_insert((lpo, now));
            let booted = s
                .heartbeats
                .get(&node)
                .and_then(|hb| hb.iter().find(|(beat, _)| *beat > lpo).map(|(_, at)| *at));
            if let Some(at) = booted {
                s.booted.entry(node).or_insert(at.max(now));
            }
        }
    }
}

async fn watch_nodes(api: Api<Node>, seen: Arc<Mutex<Seen>>, since: Timestamp) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event else {
            continue;
        };
        let name = n.name_any();
        let unschedulable = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == "True")
            .and_then(|c| c.last_heartbeat_time.as_ref().map(|t| t.0));
        let mut s = seen.lock().unwrap();
        if unschedulable && now > since {
            s.cordoned.entry(name.clone()).or_insert(now);
        }
        if !unschedulable && s.cordoned.contains_key(&name) {
            s.uncordoned.entry(name.clone()).or_insert(now);
        }
        if let Some(beat) = ready {
            s.heartbeats
                .entry(name.clone())
                .or_default()
                .push((beat, now));
            if let Some((lpo, _)) = s.powered_on.get(&name).copied()
                && beat > lpo
            {
                s.booted.entry(name).or_insert(now);
            }
        }
    }
}
