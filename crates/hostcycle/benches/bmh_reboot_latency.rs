//! How fast the BareMetalHost controller turns a reboot annotation into a power-off request,
//! with a fleet of 1,000 hosts on the real API server, and what it costs at rest.
//!
//! ```text
//! cargo bench -p hostcycle --bench bmh_reboot_latency -- [--hosts 1000] [--samples 200] \
//!     [--rate 20] [--idle-seconds 90]
//! ```
//!
//! Starts the local control plane, a fast in-process Redfish fleet (one port per host; power
//! changes apply at once and every reset's arrival time is recorded), 1,000 BareMetalHosts
//! and the real `hostcycle operator` binary as its own process. Then:
//! 1. waits until every host is registered (poweredOn, OK) and reports how long that took;
//! 2. measures the operator's CPU over `--idle-seconds` at steady state (`/proc/<pid>/stat`);
//! 3. writes a hard keyed reboot annotation on `--samples` hosts at `--rate` per second and
//!    measures, per host, the time from just before the annotation PATCH is sent to the
//!    ForceOff request arriving at that host's BMC;
//! 4. reports latency percentiles and the operator's peak RSS (VmHWM).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use clap::Parser;
use common::{clock_ticks, context_switches, cpu_ticks, percentile, proc_field};
use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_testkit::redfish_stub::RedfishStub;
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The mean interval between two steady reads of a host: the default `--steady-poll` (60 s) plus
/// the controller's spread (0–10 %, uniform). Pass `--operator-arg=--steady-poll=…` and this
/// rate no longer applies.
const MEAN_STEADY_POLL_SECONDS: f64 = 63.0;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    hosts: usize,
    /// Hosts annotated for the latency measurement.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Annotations written per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Longer than the 60 s steady poll, so the idle figure includes the polling.
    #[arg(long, default_value_t = 90)]
    idle_seconds: u64,
    /// Copy the operator's log here at the end (the cluster's log directory is removed).
    /// `RUST_LOG` in the environment replaces the operator's default filter.
    #[arg(long)]
    operator_log: Option<std::path::PathBuf>,
    /// Extra arguments for `hostcycle operator` (repeat the flag), e.g.
    /// `--operator-arg=--controllers=bare-metal-host`.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
    /// Profile the operator with `perf record` during the idle window, into this file.
    #[arg(long)]
    perf_record: Option<std::path::PathBuf>,
    /// cargo bench passes --bench; ignore it.
    #[arg(long, hide = true)]
    bench: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    eprintln!(
        "starting control plane, Redfish fleet of {} and the operator...",
        args.hosts
    );
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let stub = RedfishStub::start(args.hosts, args.hosts).await.unwrap();

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret: Secret =
        serde_json::from_value(json!({ "metadata": { "name": "bmc" }, "stringData": { "username": "u", "password": "p" } })).unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let hosts: Api<BareMetalHost> = Api::namespaced(client.clone(), "default");
    let created = Instant::now();
    futures::stream::iter(0..args.hosts)
        .map(|i| {
            let hosts = hosts.clone();
            let address = stub.system_address(i);
            async move {
                let bmh =
                    BareMetalHost::externally_provisioned(&format!("host-{i:04}"), &address, "bmc");
                hosts.create(&PostParams::default(), &bmh).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    eprintln!(
        "created {} BareMetalHosts in {:.1?}",
        args.hosts,
        created.elapsed()
    );

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
        ])
        .args(&args.operator_args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "info,kube_client=warn,kube_runtime=warn".into()),
        );
    let operator = ManagedProcess::spawn("hostcycle-operator", cmd, &cluster.log_dir()).unwrap();
    let pid = operator.pid();

    let registered = Instant::now();
    wait_until(
        &format!("all {} hosts registered (poweredOn, OK)", args.hosts),
        Duration::from_secs(300),
        || {
            let hosts = hosts.clone();
            async move {
                let list = hosts.list(&ListParams::default()).await.ok()?;
                let ok = list
                    .items
                    .iter()
                    .filter(|h| {
                        let st = h.status.as_ref();
                        st.and_then(|s| s.powered_on) == Some(true)
                            && st.and_then(|s| s.operational_status).map(|s| s.as_str())
                                == Some("OK")
                    })
                    .count();
                (ok == args.hosts).then_some(())
            }
        },
    )
    .await
    .unwrap();
    let registration = registered.elapsed();
    eprintln!("all hosts registered in {registration:.1?}");

    // Let the initial burst of reconciles, events and watches settle.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reads_before = stub.reads();
    let ticks_before = cpu_ticks(pid);
    let switches_before = context_switches(pid);
    let idle_start = Instant::now();
    let perf = args.perf_record.as_ref().map(|out| {
        let mut perf = std::process::Command::new("perf");
        perf.args(["record", "-F", "999", "-o"])
            .arg(out)
            .args(["-p", &pid.to_string(), "--", "sleep"])
            .arg(args.idle_seconds.to_string());
        ManagedProcess::spawn("perf", perf, &cluster.log_dir()).unwrap()
    });
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let ticks = cpu_ticks(pid) - ticks_before;
    let idle_elapsed = idle_start.elapsed().as_secs_f64();
    let clock_ticks = clock_ticks();
    let idle_cpu = ticks as f64 / clock_ticks / idle_elapsed * 100.0;
    let idle_reads = (stub.reads() - reads_before) as f64 / idle_elapsed;
    let idle_switches = context_switches(pid).saturating_sub(switches_before) as f64 / idle_elapsed;
    let rss_idle = proc_field(pid, "VmRSS:").unwrap_or(0);
    if let Some(mut perf) = perf {
        // perf ends with the window's `sleep`; give it time to write its file (SIGTERM also
        // makes it write what it has).
        tokio::time::sleep(Duration::from_secs(5)).await;
        perf.stop();
    }

    eprintln!(
        "measuring annotation → power-off latency on {} hosts at {}/s...",
        args.samples, args.rate
    );
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let mut written = Vec::with_capacity(args.samples);
    let mut next = tokio::time::Instant::now();
    for i in 0..args.samples {
        tokio::time::sleep_until(next).await;
        next += interval;
        let name = format!("host-{i:04}");
        let patch = json!({ "metadata": { "annotations": { "reboot.metal3.io/bench": r#"{"mode":"hard"}"# } } });
        let before = Timestamp::now();
        hosts
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        written.push((i, before));
    }
    let mut latencies_ms = Vec::new();
    for (i, before) in &written {
        let arrived = wait_until(
            &format!("ForceOff for host-{i:04} at its BMC"),
            Duration::from_secs(30),
            || async {
                stub.resets(*i)
                    .into_iter()
                    .find(|r| r.reset_type == "ForceOff" && r.at > *before)
            },
        )
        .await
        .unwrap();
        latencies_ms.push(arrived.at.duration_since(*before).as_secs_f64() * 1000.0);
    }
    latencies_ms.sort_by(|a, b| a.total_cmp(b));
    let peak_rss = proc_field(pid, "VmHWM:").unwrap_or(0);
    let duplicate_offs: usize = written
        .iter()
        .map(|(i, _)| {
            stub.resets(*i)
                .iter()
                .filter(|r| r.reset_type == "ForceOff")
                .count()
                .saturating_sub(1)
        })
        .sum();

    println!(
        "\n## BareMetalHost controller, {} hosts (1 operator process, 2 cores)\n",
        args.hosts
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| initial registration of all hosts | {:.1} s |",
        registration.as_secs_f64()
    );
    println!(
        "| annotation → ForceOff at BMC, p50 | {:.1} ms |",
        percentile(&latencies_ms, 0.50)
    );
    println!(
        "| annotation → ForceOff at BMC, p90 | {:.1} ms |",
        percentile(&latencies_ms, 0.90)
    );
    println!(
        "| annotation → ForceOff at BMC, p99 | {:.1} ms |",
        percentile(&latencies_ms, 0.99)
    );
    println!(
        "| annotation → ForceOff at BMC, max | {:.1} ms |",
        latencies_ms.last().copied().unwrap_or(0.0)
    );
    println!(
        "| samples ({} annotations at {}/s) | {} |",
        args.samples,
        args.rate,
        latencies_ms.len()
    );
    println!("| duplicate power-off requests | {duplicate_offs} |");
    println!(
        "| operator CPU at steady state ({} s) | {:.2} % of one core |",
        args.idle_seconds, idle_cpu
    );
    println!(
        "| power-state reads at steady state | {:.1} /s |",
        idle_reads
    );
    // The window may hold fewer or more reads than the fleet's true steady rate (all hosts were
    // registered in one burst): CPU per read times that rate is the figure that compares.
    let cpu_ms_per_read = if idle_reads > 0.0 {
        idle_cpu * 10.0 / idle_reads
    } else {
        f64::NAN
    };
    let steady_rate = args.hosts as f64 / MEAN_STEADY_POLL_SECONDS;
    println!("| operator CPU per steady read | {cpu_ms_per_read:.3} ms |");
    println!(
        "| operator CPU at the full steady rate ({steady_rate:.1} reads/s: {} hosts / {MEAN_STEADY_POLL_SECONDS} s) | {:.2} % of one core |",
        args.hosts,
        cpu_ms_per_read * steady_rate / 10.0
    );
    println!("| operator context switches at steady state | {idle_switches:.0} /s |");
    println!(
        "| operator RSS at steady state | {:.1} MB |",
        rss_idle as f64 / 1024.0
    );
    println!(
        "| operator peak RSS (VmHWM) | {:.1} MB |",
        peak_rss as f64 / 1024.0
    );
    if let Some(path) = &args.operator_log {
        let log = cluster.log_dir().join("hostcycle-operator.log");
        match std::fs::copy(&log, path) {
            Ok(_) => eprintln!("operator log copied to {}", path.display()),
            Err(e) => eprintln!("copying {} to {}: {e}", log.display(), path.display()),
        }
    }
    drop(operator);
}
