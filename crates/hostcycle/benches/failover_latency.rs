//! Fast fenced failover (issue 26): from a node's failure to its StatefulSet pod Running with
//! its ReadWriteOnce volume attached on another node, fenced first.
//!
//! ```text
//! cargo bench -p hostcycle --bench failover_latency -- [--runs 10] [--scenarios A,B,C,D,E,F,G,delete-node] \
//!     [--json target/failover.json] [--svg docs/failover-timeline.svg]
//! ```
//!
//! One lab per scenario: the real control plane (node-lifecycle, StatefulSet, attach/detach
//! controllers), the sushy-tools Redfish emulator (its fake driver applies a power change 1–11 s
//! after the request), three simulated workers whose kubelets do volumes, the simulated CSI
//! driver and its storage ledger, the real `hostcycle operator` binary, a `HostHealthCheck`
//! (Lease stale after 20 s, `release: Auto` — `ReleaseWorkloads` on 1.20) and the StatefulSet
//! `db` (1 replica, RWO). Each run fails the node under `db-0`, follows the failover, waits for
//! the node to come back, and records:
//! t_detect (the health check's request), t_fenced (the first Off the emulator reported),
//! t_pods_deleted, t_new_pod_created, t_old_attachment_gone (the storage's detach),
//! t_new_attachment, t_ready — each relative to the failure.
//!
//! Scenarios: A kubelet crash (host on), B power loss (hostcycle's host controller powers the
//! host back on, as `spec.online: true` asks: the time until the pod is Ready again, on a new
//! boot in place or elsewhere), C partition (kubelet alive, pod writing), D BMC unreachable
//! (must never release), E the API server stopped 45 s (must fence nothing), F 3 of 5 Leases
//! stale at once (must fence nothing), G a planned reboot through the reboot queue (must fence
//! nothing: one power cycle, the queue's), `delete-node` the seed's `DeleteNode` strategy for
//! comparison. Invariants checked on every run: nothing released before the first Off at the
//! emulator, the storage never saw two writers, D–G never fence or release.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../tests/common/mod.rs"]
mod lab;

use std::fmt::Write as _;
use std::time::Duration;

use clap::Parser;
use common::percentile;
use hostcycle_sim::Fault;
use jiff::Timestamp;
use kube::ResourceExt;
use lab::failover::{DB_POD, Disruption, Failover, FailoverLab, boot_id, wait_for};
use lab::queue::{HostSpec, worker};
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// Runs of each of A, B, C.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Which scenarios, comma-separated: A, B, C, D, E, F, G, delete-node.
    #[arg(long, default_value = "A,B,C,D,E,F,G,delete-node")]
    scenarios: String,
    /// Runs of the DeleteNode comparison (each waits out the attach/detach controller's six
    /// minutes).
    #[arg(long, default_value_t = 1)]
    delete_node_runs: usize,
    /// How long a host takes to boot in the DeleteNode comparison (a server's POST and OS
    /// boot; the other scenarios release before the power-on, so their boot time does not
    /// count).
    #[arg(long, default_value_t = 120)]
    delete_node_boot_secs: u64,
    /// Every run's timeline, as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// The timeline of A's median run, as an SVG picture.
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
    /// cargo bench passes --bench; ignore it.
    #[arg(long, hide = true)]
    bench: bool,
}

const WORKERS: [HostSpec; 3] = [worker("w-0"), worker("w-1"), worker("w-2")];
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// One run's marks, in seconds after the failure.
#[derive(Debug, Clone, serde::Serialize)]
struct Marks {
    scenario: String,
    node: String,
    new_node: String,
    t_detect: f64,
    t_fenced: f64,
    t_pods_deleted: f64,
    t_new_pod_created: f64,
    t_old_attachment_gone: Option<f64>,
    t_new_attachment: Option<f64>,
    t_ready: f64,
}

fn secs(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

impl Marks {
    fn of(scenario: &str, f: &Failover) -> Marks {
        let t = |at: Timestamp| secs(f.fault_at, at);
        Marks {
            scenario: scenario.into(),
            node: f.node.clone(),
            new_node: f.new_node.clone(),
            t_detect: t(f.requested_at),
            t_fenced: t(f.off_at),
            t_pods_deleted: t(f.pod_deleted_at),
            t_new_pod_created: t(f.new_pod_created_at),
            t_old_attachment_gone: f.old_detached_at.map(t),
            t_new_attachment: f.new_attached_at.map(t),
            t_ready: t(f.running_at),
        }
    }
}

/// The invariants of a run that released: nothing before the first Off at the emulator, and
/// the storage's ground truth.
fn check_invariants(lab: &FailoverLab, f: &Failover) -> Vec<String> {
    let mut broken = Vec::new();
    if f.pod_deleted_at < f.off_at {
        broken.push(format!("pod deleted before the host was off: {f:?}"));
    }
    if f.new_attached_at.is_some_and(|t| t < f.off_at) {
        broken.push(format!(
            "volume attached elsewhere before the host was off: {f:?}"
        ));
    }
    for v in lab.storage().violations() {
        broken.push(format!("storage: {v:?}"));
    }
    broken
}

async fn start_lab(release: &str, boot_delay: Option<Duration>) -> FailoverLab {
    let lab = FailoverLab::start_booting_in(&WORKERS, &[], boot_delay).await;
    // Runs fail the same nodes again and again on purpose: the repeat-failure rule (left off
    // for a person) is off here.
    lab.health_check(json!({
        "remediation": { "release": release, "timeoutSeconds": 600 },
        "repeatFailureWindowSeconds": 0,
    }))
    .await;
    lab.wait_check_watching(3).await;
    lab
}

/// `runs` failovers of one kind in one lab, each followed until the node is back and the
/// request gone.
async fn failovers(
    scenario: &str,
    disruption: Disruption,
    release: &str,
    runs: usize,
    boot_delay: Option<Duration>,
    broken: &mut Vec<String>,
) -> Vec<Marks> {
    let lab = start_lab(release, boot_delay).await;
    let mut marks = Vec::new();
    for run in 0..runs {
        let node = FailoverLab::node_of(&lab.pods().get(DB_POD).await.unwrap());
        let old_boot = boot_id(&lab.node(&node).await);
        let f = lab.fail_db_node(disruption, RUN_TIMEOUT).await;
        broken.extend(check_invariants(&lab, &f));
        let m = Marks::of(scenario, &f);
        eprintln!(
            "{scenario} run {}: {} → {}: detect {:.1}s, fenced {:.1}s, pods deleted {:.1}s, \
             new pod {:.1}s, old detached {:?}, new attached {:?}, ready {:.1}s",
            run + 1,
            m.node,
            m.new_node,
            m.t_detect,
            m.t_fenced,
            m.t_pods_deleted,
            m.t_new_pod_created,
            m.t_old_attachment_gone,
            m.t_new_attachment,
            m.t_ready
        );
        marks.push(m);
        lab.wait_back(&node, &old_boot, RUN_TIMEOUT).await;
        wait_for(
            &format!("the request for {node} deleted once it is healthy"),
            Duration::from_secs(120),
            || async { lab.request_for(&node).await.is_none().then_some(()) },
        )
        .await;
    }
    marks
}

/// B: the host under `db-0` loses power at the emulator. hostcycle's host controller
/// corrects the power (`spec.online: true`, as metal3's does) and the node boots again, often
/// before its Lease is stale: the pod may never be seen not Ready. So B measures until `db-0`
/// is Ready again on a new boot of its node (in place) or on another node (the health check
/// fenced first), and whether a request was made.
async fn power_loss(runs: usize, broken: &mut Vec<String>) -> String {
    let lab = start_lab("Auto", None).await;
    let mut ready = Vec::new();
    let mut lines = String::new();
    for run in 0..runs {
        let pod = lab.pods().get(DB_POD).await.unwrap();
        let node = FailoverLab::node_of(&pod);
        let old_boot = boot_id(&lab.node(&node).await);
        let lost_at = Timestamp::now();
        lab.lab
            .redfish
            .set_power(
                lab.lab.index(&node),
                hostcycle_testkit::bmc_emulators::FakePower::Off,
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        let again = wait_for(
            &format!("B: {DB_POD} Ready again on a new boot of {node}, or on another node"),
            RUN_TIMEOUT,
            || async {
                let p = lab.pods().get_opt(DB_POD).await.ok().flatten()?;
                if p.metadata.deletion_timestamp.is_some() || !lab::queue::pod_ready(&p) {
                    return None;
                }
                if FailoverLab::node_of(&p) != node {
                    return Some(p);
                }
                let n = lab.nodes.get_opt(&node).await.ok().flatten()?;
                let rebooted =
                    boot_id(&n) != old_boot && hostcycle_sim::node_ready(&n) == Some(true);
                rebooted.then_some(p)
            },
        )
        .await;
        let t = secs(lost_at, Timestamp::now());
        let requested = lab.request_for(&node).await.is_some();
        let moved = FailoverLab::node_of(&again) != node;
        let _ = writeln!(
            lines,
            "  B run {}: {node}: Ready again after {t:.1}s on {} ({}; {})",
            run + 1,
            FailoverLab::node_of(&again),
            if moved { "moved" } else { "in place, new boot" },
            if requested {
                "fenced by the health check"
            } else {
                "no request: power corrected, node back before its Lease was stale"
            }
        );
        eprintln!("{}", lines.lines().last().unwrap_or_default());
        ready.push(t);
        broken.extend(
            lab.storage()
                .violations()
                .iter()
                .map(|v| format!("B storage: {v:?}")),
        );
        lab.wait_back(&node, &old_boot, RUN_TIMEOUT).await;
        wait_for("B: no request left", Duration::from_secs(180), || async {
            lab.requests().await.is_empty().then_some(())
        })
        .await;
    }
    ready.sort_by(f64::total_cmp);
    format!(
        "B (power loss; {runs} runs): pod Ready again p50 {:.1}s p95 {:.1}s max {:.1}s\n{lines}",
        percentile(&ready, 0.5),
        percentile(&ready, 0.95),
        ready.last().copied().unwrap_or(f64::NAN)
    )
}

/// E: the API server stops for `outage`: no kubelet can renew its Lease, so every Lease is
/// stale at once when it is back. That is a control-plane failure, not hosts: nothing may be
/// requested or fenced, during the outage or for `after` once it is back.
async fn apiserver_outage(outage: Duration, after: Duration, broken: &mut Vec<String>) -> String {
    let mut lab = start_lab("Auto", None).await;
    let stopped_at = Timestamp::now();
    lab.q.lab.cluster.stop_apiserver();
    tokio::time::sleep(outage).await;
    lab.q
        .lab
        .cluster
        .start_apiserver()
        .await
        .expect("kube-apiserver starts again");
    let back = secs(stopped_at, Timestamp::now());
    tokio::time::sleep(after).await;
    let requests = lab.requests().await.len();
    if requests > 0 {
        broken.push(format!("E: {requests} requests after an API server outage"));
    }
    let mut offs = 0;
    for n in &WORKERS {
        if lab.lab.history(n.name).off_after(stopped_at).is_some() {
            offs += 1;
            broken.push(format!(
                "E: {} powered off after an API server outage",
                n.name
            ));
        }
    }
    let status = lab.health_check_status().await;
    let storm = if status["storm"]["active"] == true {
        "a storm (suspended)".to_string()
    } else if let Some(until) = status["storm"]["cooldownUntil"].as_str() {
        format!("a storm, cooling down until {until}")
    } else {
        "no storm recorded".to_string()
    };
    format!(
        "E: API server stopped {}s (back and ready at {back:.1}s), watched {}s more: \
         {requests} requests, {offs} power-offs; the check saw {storm}",
        outage.as_secs(),
        after.as_secs()
    )
}

/// G: a planned reboot of the node under `db-0` through the reboot queue: cordon, drain
/// (the pod is evicted, its volume detached cleanly), reboot, uncordon. The health check
/// must not fence a node the queue is rebooting: no request, one power cycle (the queue's).
async fn planned_reboot(broken: &mut Vec<String>) -> String {
    let lab = start_lab("Auto", None).await;
    let pod = lab.pods().get(DB_POD).await.unwrap();
    let node = FailoverLab::node_of(&pod);
    let queued_at = Timestamp::now();
    lab.queue(&node).await;
    let moved = lab
        .wait_db_running(Some(pod.uid().as_deref().unwrap_or_default()), RUN_TIMEOUT)
        .await;
    let t_moved = secs(queued_at, Timestamp::now());
    lab.wait_entry_gone(&node, RUN_TIMEOUT).await;
    let t_done = secs(queued_at, Timestamp::now());
    // The check has had the whole reboot and this long after it to react, if it would.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let requests = lab.requests().await.len();
    if requests > 0 {
        broken.push(format!("G: {requests} requests during a planned reboot"));
    }
    let offs = lab.lab.settled_history(&node).await.power_offs();
    if offs != 1 {
        broken.push(format!(
            "G: {node} powered off {offs} times (the queue's once)"
        ));
    }
    broken.extend(
        lab.storage()
            .violations()
            .iter()
            .map(|v| format!("G storage: {v:?}")),
    );
    format!(
        "G: planned reboot of {node} through the queue: {DB_POD} Running on {} at {t_moved:.1}s \
         (evicted by the drain), entry done at {t_done:.1}s; {requests} requests, {offs} \
         power-off of {node} (the queue's)",
        FailoverLab::node_of(&moved)
    )
}

/// D: the node's BMC is unreachable: detected, never released for `hold`.
async fn unreachable_bmc(hold: Duration, broken: &mut Vec<String>) -> String {
    let lab = FailoverLab::start(&WORKERS, &[]).await;
    let pod = lab.pods().get(DB_POD).await.unwrap();
    let node = FailoverLab::node_of(&pod);
    lab.make_bmc_unreachable(&node).await;
    lab.health_check(json!({})).await;
    lab.wait_check_watching(3).await;
    let fault_at = Timestamp::now();
    lab.fault(&node, Fault::KubeletDead);
    let request = wait_for("D: a request", Duration::from_secs(90), || async {
        lab.request_for(&node).await
    })
    .await;
    let detect = secs(
        fault_at,
        request.metadata.creation_timestamp.clone().unwrap().0,
    );
    tokio::time::sleep(hold).await;
    let now = lab.pods().get(DB_POD).await.unwrap();
    if now.uid() != pod.uid() || now.metadata.deletion_timestamp.is_some() {
        broken.push("D: the pod was deleted with its BMC unreachable".into());
    }
    if lab.attachments().iter().any(|a| a.host != node) {
        broken.push("D: the volume moved with its BMC unreachable".into());
    }
    if lab.lab.history(&node).off_after(fault_at).is_some() {
        broken.push("D: the host was powered off?".into());
    }
    broken.extend(
        lab.storage()
            .violations()
            .iter()
            .map(|v| format!("D storage: {v:?}")),
    );
    format!(
        "D: detected at {detect:.1}s; after {}s: pod, volume and attachment kept, no power \
         change, request {}",
        hold.as_secs(),
        request.name_any()
    )
}

/// F: 3 of 5 kubelets die at once: a storm; nothing requested or fenced for `hold`.
async fn storm(hold: Duration, broken: &mut Vec<String>) -> String {
    let names = ["s-0", "s-1", "s-2", "s-3", "s-4"];
    let lab = FailoverLab::start(&names.map(worker), &[]).await;
    lab.health_check(json!({})).await;
    lab.wait_check_watching(5).await;
    let fault_at = Timestamp::now();
    for n in &names[..3] {
        lab.fault(n, Fault::KubeletDead);
    }
    let storm_at = wait_for("F: storm", Duration::from_secs(90), || async {
        let s = lab.health_check_status().await;
        (s["storm"]["active"] == true).then(Timestamp::now)
    })
    .await;
    tokio::time::sleep(hold).await;
    let requests = lab.requests().await.len();
    if requests > 0 {
        broken.push(format!("F: {requests} requests in a storm"));
    }
    for n in names {
        if lab.lab.history(n).off_after(fault_at).is_some() {
            broken.push(format!("F: {n} powered off in a storm"));
        }
    }
    format!(
        "F: storm reported at {:.1}s; {} s later: {requests} requests, no power change",
        secs(fault_at, storm_at),
        hold.as_secs()
    )
}

/// One mark of a run, if it was made.
type MarkOf = fn(&Marks) -> Option<f64>;

fn summary(name: &str, marks: &[Marks]) -> String {
    let mut out = String::new();
    let series: [(&str, MarkOf); 7] = [
        ("t_detect", |m| Some(m.t_detect)),
        ("t_fenced", |m| Some(m.t_fenced)),
        ("t_pods_deleted", |m| Some(m.t_pods_deleted)),
        ("t_new_pod_created", |m| Some(m.t_new_pod_created)),
        ("t_old_attachment_gone", |m| m.t_old_attachment_gone),
        ("t_new_attachment", |m| m.t_new_attachment),
        ("t_ready", |m| Some(m.t_ready)),
    ];
    let _ = writeln!(out, "{name} ({} runs)", marks.len());
    for (label, get) in series {
        let mut v: Vec<f64> = marks.iter().filter_map(get).collect();
        v.sort_by(f64::total_cmp);
        let _ = writeln!(
            out,
            "  {label:<22} p50 {:>6.1}s  p95 {:>6.1}s  max {:>6.1}s",
            percentile(&v, 0.5),
            percentile(&v, 0.95),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    out
}

/// One run's timeline as a picture: a bar per phase on a seconds axis.
fn svg(m: &Marks) -> String {
    let end = m.t_ready.max(1.0);
    let width = 760.0;
    let left = 190.0;
    let scale = (width - left - 30.0) / end;
    let x = |t: f64| left + t * scale;
    let phases: Vec<(&str, f64, f64, &str)> = vec![
        ("kubelet dead → detected", 0.0, m.t_detect, "#9aa5b1"),
        ("fence (BMC power-off)", m.t_detect, m.t_fenced, "#d64545"),
        (
            "Off confirmed → pods deleted",
            m.t_fenced,
            m.t_pods_deleted,
            "#e8a33d",
        ),
        (
            "volume detached",
            m.t_pods_deleted,
            m.t_old_attachment_gone.unwrap_or(m.t_pods_deleted),
            "#7e57c2",
        ),
        (
            "attached elsewhere",
            m.t_old_attachment_gone.unwrap_or(m.t_pods_deleted),
            m.t_new_attachment.unwrap_or(m.t_ready),
            "#3f8fd2",
        ),
        (
            "pod Running",
            m.t_new_attachment.unwrap_or(m.t_ready),
            m.t_ready,
            "#2e9e5b",
        ),
    ];
    let height = 40.0 + 28.0 * phases.len() as f64 + 40.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\" font-size=\"14\">\
         {} → {}: StatefulSet pod Running elsewhere in {:.1} s (fenced at {:.1} s)</text>\n",
        m.node, m.new_node, m.t_ready, m.t_fenced
    );
    for (i, (label, from, to, color)) in phases.iter().enumerate() {
        let y = 40.0 + 28.0 * i as f64;
        let w = ((to - from) * scale).max(2.0);
        let _ = writeln!(
            out,
            "<text x=\"10\" y=\"{}\">{label}</text><rect x=\"{:.1}\" y=\"{y}\" width=\"{w:.1}\" \
             height=\"18\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{}\">{:.1}s</text>",
            y + 13.0,
            x(*from),
            x(*from) + w + 4.0,
            y + 13.0,
            to
        );
    }
    let axis_y = height - 25.0;
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{axis_y}\" x2=\"{:.1}\" y2=\"{axis_y}\" stroke=\"black\"/>",
        x(end)
    );
    let mut t = 0.0;
    while t <= end {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\">{t:.0}s</text>",
            x(t) - 6.0,
            axis_y + 15.0
        );
        t += 10.0;
    }
    out.push_str("</svg>\n");
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args = Args::parse();
    lab::init_logging();
    let wanted: Vec<String> = args
        .scenarios
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let has = |s: &str| wanted.iter().any(|w| w.eq_ignore_ascii_case(s));
    let mut broken = Vec::new();
    let mut all = Vec::new();
    let mut report = String::new();
    for (name, disruption) in [
        ("A", Disruption::Kubelet(Fault::KubeletDead)),
        ("C", Disruption::Kubelet(Fault::Partitioned)),
    ] {
        if !has(name) {
            continue;
        }
        let marks = failovers(name, disruption, "Auto", args.runs, None, &mut broken).await;
        report.push_str(&summary(
            &format!("{name} (release Auto → ReleaseWorkloads)"),
            &marks,
        ));
        all.extend(marks);
    }
    if has("B") {
        report.push_str(&power_loss(args.runs, &mut broken).await);
    }
    if has("delete-node") {
        let marks = failovers(
            "delete-node",
            Disruption::Kubelet(Fault::KubeletDead),
            "DeleteNode",
            args.delete_node_runs,
            // A server's power-on self test: with the seed's flow the pod may come back on
            // the same host once it boots, so the boot time is part of its failover.
            Some(Duration::from_secs(args.delete_node_boot_secs)),
            &mut broken,
        )
        .await;
        report.push_str(&summary(
            "A with release DeleteNode (the seed's flow)",
            &marks,
        ));
        all.extend(marks);
    }
    if has("D") {
        report.push_str(&unreachable_bmc(Duration::from_secs(60), &mut broken).await);
        report.push('\n');
    }
    if has("E") {
        report.push_str(
            &apiserver_outage(
                Duration::from_secs(45),
                Duration::from_secs(90),
                &mut broken,
            )
            .await,
        );
        report.push('\n');
    }
    if has("F") {
        report.push_str(&storm(Duration::from_secs(40), &mut broken).await);
        report.push('\n');
    }
    if has("G") {
        report.push_str(&planned_reboot(&mut broken).await);
        report.push('\n');
    }
    println!("{report}");
    println!("invariant violations: {}", broken.len());
    for b in &broken {
        println!("  {b}");
    }
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&all).unwrap()).unwrap();
    }
    // The picture is of A's median run (by t_ready).
    let mut a: Vec<&Marks> = all.iter().filter(|m| m.scenario == "A").collect();
    a.sort_by(|x, y| x.t_ready.total_cmp(&y.t_ready));
    if let (Some(path), Some(median)) = (args.svg, a.get(a.len().saturating_sub(1) / 2)) {
        std::fs::write(&path, svg(median)).unwrap();
    }
    assert!(broken.is_empty(), "invariants broken");
}
