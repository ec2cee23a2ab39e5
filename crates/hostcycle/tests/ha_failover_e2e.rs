//! High availability, proven on the real control plane: two `hostcycle operator` replicas
//! campaign for one Lease (`--lease-duration 5s`); the standby keeps its watch caches warm
//! and is ready, the leader acts. The leader is SIGKILLed at a chosen step of each flow —
//!
//! (a) a BareMetalHost reboot after the power-off, before the power-on;
//! (b) a reboot-queue entry mid-drain;
//! (c) a remediation after the Node was deleted, before the power-on —
//!
//! and the standby finishes it: no second power cycle, nothing left cordoned or off, and it
//! takes over (Lease acquired, first action) within the lease duration + 5 s of the kill. Each
//! test prints what it measured (`--no-capture` shows it; docs/high-availability.md collects
//! the figures).
//!
//! Each kill lands while the leader has nothing in flight at the BMC: the test holds the host
//! off with its own keyed reboot annotation (or keeps the drain waiting on a pod) and lets go
//! right after the kill, so the next step is the new leader's to take.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::queue::{QueueLab, cordoned, cordoned_by_queue, fast_queue, worker};
use common::remediation::{HOLD_ANNOTATION, Recorder, RemediationLab, Seen, millis};
use common::{Lab, LabOptions, NS, REBOOT, Replica};
use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use hostcycle_api::remediation::POWERED_OFF_FOR_REMEDIATION_ANNOTATION;
use hostcycle_api::{BareMetalHost, PowerActionState, PowerTarget};
use hostcycle_operator::rbac::DEFAULT_LEASE_NAME;
use hostcycle_testkit::machines::OPENSHIFT_MACHINE_ROLE_LABEL;
use hostcycle_testkit::{MachineKind, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// `--lease-duration` of both replicas.
const LEASE: Duration = Duration::from_secs(5);
/// The standby must have taken over (Lease acquired, first action taken) this soon after the
/// kill.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(LEASE.as_secs() + 5);
const FLOW_TIMEOUT: Duration = Duration::from_secs(120);
const STANDBY: &str = "e2e-standby";

fn ha_options() -> LabOptions {
    LabOptions {
        operator_args: vec!["--lease-duration".into(), format!("{}s", LEASE.as_secs())],
        ..LabOptions::default()
    }
}

/// The value of an unlabelled sample in a Prometheus text exposition.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (series, value) = line.split_once(' ')?;
        (series == name).then(|| value.trim().parse().ok())?
    })
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

/// Starts the standby replica and waits until it is ready (its caches synced) and not
/// leading while the lab's operator holds the Lease. Returns it with a recorder of the Lease.
async fn start_standby(lab: &Lab) -> (Replica, Recorder<Lease>) {
    let leases: Api<Lease> = Api::namespaced(lab.client.clone(), NS);
    let lease = Recorder::start(leases.clone(), DEFAULT_LEASE_NAME).await;
    lease
        .wait(
            &format!("held by {}", lab.operator_identity()),
            Duration::from_secs(30),
            |s| holder(&s.object).as_deref() == Some(lab.operator_identity()),
        )
        .await;
    let standby = lab.start_replica(STANDBY);
    let replica = &standby;
    wait_until(
        "the standby replica's /readyz to answer 200 (caches synced)",
        Duration::from_secs(60),
        || async move { replica.get("/readyz").await.filter(|(s, _)| *s == 200) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; log {}", standby.process.log_path().display()));
    let (_, metrics) = standby.get("/metrics").await.unwrap();
    assert_eq!(
        gauge(&metrics, "hostcycle_leader"),
        Some(0.0),
        "the standby does not lead"
    );
    let log = std::fs::read_to_string(standby.process.log_path()).unwrap();
    assert!(
        log.contains("caches synced") && !log.contains("became leader"),
        "the standby watches (warm caches) without leading:\n{log}"
    );
    assert_eq!(
        holder(&leases.get(DEFAULT_LEASE_NAME).await.unwrap()).as_deref(),
        Some(lab.operator_identity())
    );
    (standby, lease)
}

/// When the standby took the Lease.
async fn lease_taken(lease: &Recorder<Lease>, standby: &Replica) -> Timestamp {
    lease
        .wait(
            &format!("held by {}", standby.identity),
            TAKEOVER_LIMIT + Duration::from_secs(30),
            |s| holder(&s.object).as_deref() == Some(standby.identity.as_str()),
        )
        .await
        .at
}

/// The first version of the host, after `since`, with a power-on requested (the write-ahead
/// record the host controller makes before its call to the BMC).
async fn power_on_requested(
    host: &Recorder<BareMetalHost>,
    since: Timestamp,
) -> Seen<BareMetalHost> {
    host.wait(
        "power-on requested (write-ahead record)",
        TAKEOVER_LIMIT + Duration::from_secs(30),
        |s| {
            s.at > since
                && s.object
                    .status
                    .as_ref()
                    .and_then(|st| st.last_power_action.as_ref())
                    .is_some_and(|a| {
                        a.action == PowerTarget::On && a.state == PowerActionState::Requested
                    })
        },
    )
    .await
}

/// The standby leads now, by its metrics.
async fn assert_leads(standby: &Replica) {
    let (_, metrics) = standby.get("/metrics").await.unwrap();
    assert_eq!(
        gauge(&metrics, "hostcycle_leader"),
        Some(1.0),
        "the standby leads after the failover"
    );
}

/// What a failover took, from the SIGKILL.
struct Takeover {
    scenario: &'static str,
    killed: Timestamp,
    lease: Timestamp,
    action: Timestamp,
    action_name: &'static str,
    done: Timestamp,
    done_name: &'static str,
}

impl Takeover {
    fn report_and_check(&self) {
        let secs = |t: Timestamp| millis(self.killed, t) as f64 / 1000.0;
        eprintln!(
            "failover {}: SIGKILL → Lease taken by the standby {:.2} s, → {} {:.2} s \
             (Lease → action {:.2} s), → {} {:.2} s; lease duration {} s",
            self.scenario,
            secs(self.lease),
            self.action_name,
            secs(self.action),
            millis(self.lease, self.action) as f64 / 1000.0,
            self.done_name,
            secs(self.done),
            LEASE.as_secs(),
        );
        let limit = TAKEOVER_LIMIT.as_millis() as i64;
        assert!(
            millis(self.killed, self.lease) <= limit,
            "{}: the Lease was taken {} ms after the kill (limit {limit} ms)",
            self.scenario,
            millis(self.killed, self.lease)
        );
        assert!(
            millis(self.killed, self.action) <= limit,
            "{}: the new leader's first action came {} ms after the kill (limit {limit} ms)",
            self.scenario,
            millis(self.killed, self.action)
        );
    }
}

/// (a) A reboot (suffixless annotation) with a client holding the host off (keyed): the
/// leader powers it off and dies while it is off. The standby takes the Lease and powers it
/// on once the hold goes: one power cycle, the power-on requested once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_finishes_a_reboot_after_the_leader_dies_between_power_off_and_on() {
    let name = "ha-host";
    let hold = "reboot.metal3.io/ha-hold";
    let mut lab = Lab::start_with(&[name], ha_options()).await;
    let (standby, lease) = start_standby(&lab).await;
    let host = Recorder::start(lab.hosts.clone(), name).await;

    lab.annotate(name, REBOOT, "").await;
    lab.annotate(name, hold, "").await;
    lab.wait_host(
        name,
        "off, the power cycle's annotation consumed, nothing in flight",
        FLOW_TIMEOUT,
        |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.powered_on) == Some(false)
                && !common::annotations(h).contains_key(REBOOT)
                && st
                    .and_then(|s| s.last_power_action.as_ref())
                    .is_some_and(|a| !a.is_requested())
        },
    )
    .await;
    lab.wait_emulator_power(name, hostcycle_testkit::bmc_emulators::FakePower::Off)
        .await;

    let killed = Timestamp::now();
    lab.kill_operator();
    lab.unannotate(name, hold).await;

    let lease_at = lease_taken(&lease, &standby).await;
    let requested = power_on_requested(&host, killed).await;
    let done = lab.wait_reboot_done(name).await;
    let done_at = Timestamp::now();
    Takeover {
        scenario: "(a) mid-reboot, between power-off and power-on",
        killed,
        lease: lease_at,
        action: requested.at,
        action_name: "power-on requested",
        done: done_at,
        done_name: "reboot complete (host on, recorded)",
    }
    .report_and_check();
    assert_leads(&standby).await;

    let history = lab.settled_history(name).await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "exactly one power cycle: {history:?}"
    );
    let last = done.status.unwrap().last_power_action.unwrap();
    assert_eq!(last.action, PowerTarget::On, "{last:?}");
    assert_eq!(
        last.attempts, 1,
        "the power-on was requested once: {last:?}"
    );
    lab.assert_power_stays(name, "On", Duration::from_secs(3))
        .await;
}

/// (b) A queued node mid-drain (its last pod held Terminating by a finalizer): the leader dies
/// with the node cordoned; the pod goes right after. The standby takes over the drain,
/// reboots the node once and uncordons it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_finishes_a_drain_the_leader_started() {
    let node = "ha-q";
    let mut lab = QueueLab::start_with(&[worker(node)], fast_queue(), ha_options()).await;
    let (standby, lease) = start_standby(&lab.lab).await;
    lab.namespace("work", &[]).await;
    lab.deployment("work", "held", 1, Some(node)).await;
    lab.wait_running("work", "held", 1).await;
    let held = lab.hold_pod("work", "held").await;

    let entry_name = lab.queue(node).await;
    let entry = Recorder::start(lab.entries.clone(), &entry_name).await;
    lab.wait_entry(
        node,
        "draining, waiting for the held pod",
        FLOW_TIMEOUT,
        |e| {
            e.phase() == EntryPhase::Draining
                && e.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("waiting for"))
        },
    )
    .await;
    assert!(
        cordoned_by_queue(&lab.node(node).await),
        "cordoned by the queue"
    );

    let killed = Timestamp::now();
    lab.lab.kill_operator();
    lab.release_pod(&held).await;

    let lease_at = lease_taken(&lease, &standby).await;
    let rebooting = entry
        .wait(
            "Rebooting (the drain finished by the new leader)",
            TAKEOVER_LIMIT + Duration::from_secs(30),
            |s: &Seen<RebootQueueEntry>| {
                s.at > killed && !s.deleted && s.object.phase() == EntryPhase::Rebooting
            },
        )
        .await;
    lab.wait_entry_gone(node, FLOW_TIMEOUT).await;
    let done_at = Timestamp::now();
    Takeover {
        scenario: "(b) mid-drain",
        killed,
        lease: lease_at,
        action: rebooting.at,
        action_name: "drain finished, reboot recorded",
        done: done_at,
        done_name: "entry done (rebooted, uncordoned, removed)",
    }
    .report_and_check();
    assert_leads(&standby).await;

    assert_eq!(lab.power_cycles(node).await, 1, "one power cycle");
    let after = lab.node(node).await;
    assert!(!cordoned(&after), "uncordoned");
    assert!(!cordoned_by_queue(&after), "no queue marker left");
    assert_eq!(hostcycle_sim::node_ready(&after), Some(true), "Ready");
    let host = lab.lab.get(node).await;
    assert_eq!(host.status.and_then(|s| s.powered_on), Some(true), "on");
    assert!(!common::has_reboot_annotation(&lab.lab.get(node).await));
}

/// (c) A remediation (OpenShift's Machine annotation) after the Node was deleted, before the
/// power-on (the test holds the host off): the leader dies; the hold goes right after. The
/// standby powers the host on and waits for the Node: one power cycle, the Node back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_finishes_a_remediation_after_the_node_was_deleted() {
    let node = "ha-r";
    let args = ha_options().operator_args;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut lab = RemediationLab::start(&[worker(node)], &args).await;
    let (standby, lease) = start_standby(&lab.lab).await;
    let machine = lab
        .create_machine(
            MachineKind::OpenShift,
            NS,
            "ha-r-machine",
            node,
            node,
            &[(OPENSHIFT_MACHINE_ROLE_LABEL, "worker")],
        )
        .await;
    let old_uid = lab.node(node).await.uid().unwrap();
    let host = lab.watch_host(node).await;
    // Held off from the moment the remediation asks for the power-off: the host controller
    // keeps a host off while any keyed reboot annotation is there.
    let held = lab
        .hold_when(node, |h| {
            h.annotations()
                .contains_key(hostcycle_api::remediation::MACHINE_POWER_OFF_ANNOTATION)
        })
        .await;
    lab.mark(&machine).await;
    held.await.unwrap();
    lab.wait_machine(
        &machine,
        "the Node released with the host off",
        FLOW_TIMEOUT,
        |m| {
            m.annotations()
                .contains_key(POWERED_OFF_FOR_REMEDIATION_ANNOTATION)
        },
    )
    .await;
    lab.lab
        .wait_host(node, "off, nothing in flight", FLOW_TIMEOUT, |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.powered_on) == Some(false)
                && st
                    .and_then(|s| s.last_power_action.as_ref())
                    .is_some_and(|a| !a.is_requested())
        })
        .await;
    assert!(
        lab.nodes.get_opt(node).await.unwrap().is_none(),
        "the Node is deleted"
    );

    let killed = Timestamp::now();
    lab.lab.kill_operator();
    lab.lab.unannotate(node, HOLD_ANNOTATION).await;

    let lease_at = lease_taken(&lease, &standby).await;
    let requested = power_on_requested(&host, killed).await;
    lab.wait_node_back(node, &old_uid, FLOW_TIMEOUT).await;
    lab.wait_machine_clean(&machine, FLOW_TIMEOUT).await;
    let done_at = Timestamp::now();
    Takeover {
        scenario: "(c) mid-remediation, Node deleted, before the power-on",
        killed,
        lease: lease_at,
        action: requested.at,
        action_name: "power-on requested",
        done: done_at,
        done_name: "Node back and Ready, Machine clean",
    }
    .report_and_check();
    assert_leads(&standby).await;

    lab.wait_power_settled(node, Timestamp::now(), Duration::from_secs(2))
        .await;
    assert_eq!(lab.power_cycles(node).await, 1, "one power cycle");
    let after: BareMetalHost = lab.lab.get(node).await;
    assert_eq!(after.status.as_ref().and_then(|s| s.powered_on), Some(true));
    let reboot_keys: BTreeMap<&String, &String> = after
        .annotations()
        .iter()
        .filter(|(k, _)| k.starts_with("reboot.metal3.io"))
        .collect();
    assert!(
        reboot_keys.is_empty(),
        "no reboot annotation left: {reboot_keys:?}"
    );
    assert!(!cordoned(&lab.node(node).await), "the Node is schedulable");
}

/// The expiry a fenced leader logged: `… before it expired … expired_at=<timestamp>`.
fn fenced_at(log: &str) -> Option<Timestamp> {
    let line = strip_ansi(log.lines().find(|l| l.contains("before it expired"))?);
    let rest = &line[line.find("expired_at=")? + "expired_at=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The text without terminal colour codes (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// (d) The API server goes away for longer than the Lease. Neither replica can reach it; the
/// leader's lease manager would only learn of a lost Lease at its next successful read, after
/// up to 30 s of backoff, so the leader stops by itself the moment its Lease expires without
/// a renewal seen (and exits, to campaign afresh). Once the server is back, the standby takes
/// the Lease — only after the leader stopped — and is the one leader: it carries out a
/// reboot requested then, with one power cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_server_outage_longer_than_the_lease_leaves_one_leader() {
    let name = "ha-outage";
    let mut lab = Lab::start_with(&[name], ha_options()).await;
    let (standby, _lease) = start_standby(&lab).await;
    let leases: Api<Lease> = Api::namespaced(lab.client.clone(), NS);

    let down = Timestamp::now();
    lab.cluster.stop_apiserver();
    let leader = lab.operator.as_mut().unwrap();
    let log_path = leader.log_path().to_path_buf();
    // Polled here rather than with `wait_until`: `ensure_running` reaps the process.
    let deadline = tokio::time::Instant::now() + LEASE + Duration::from_secs(20);
    let exited = loop {
        if leader.ensure_running().is_err() {
            break Timestamp::now();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader did not stop by itself once its Lease expired; log {}",
            log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = std::fs::read_to_string(&log_path).unwrap();
    let expiry = fenced_at(&log).unwrap_or_else(|| {
        panic!("the leader says why it stopped, with its Lease's expiry:\n{log}")
    });
    assert!(
        millis(expiry, exited) < 3000,
        "the leader stopped {} ms after its Lease expired at {expiry}",
        millis(expiry, exited)
    );
    lab.kill_operator(); // forgets the exited process
    // The outage goes on well past the expiry.
    let since_down = Timestamp::now().duration_since(down).as_secs_f64();
    if since_down < 12.0 {
        tokio::time::sleep(Duration::from_secs_f64(12.0 - since_down)).await;
    }
    let restarted = Timestamp::now();
    lab.cluster.start_apiserver().await.unwrap();

    let leases = &leases;
    let taken = wait_until(
        "the standby to take the Lease once the API server is back",
        Duration::from_secs(60),
        || async move {
            let lease = leases.get(DEFAULT_LEASE_NAME).await.ok()?;
            (holder(&lease).as_deref() == Some(STANDBY)).then_some(lease)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; standby log {}", standby.process.log_path().display()));
    let taken_at = Timestamp::now();
    let acquired = taken
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.clone())
        .expect("acquireTime")
        .0;
    assert!(
        acquired > exited && acquired > expiry,
        "the standby took the Lease at {acquired}, the old leader stopped at {exited} \
         (its Lease expired at {expiry})"
    );
    wait_until(
        "the standby to lead (hostcycle_leader 1)",
        Duration::from_secs(30),
        || async {
            let (_, metrics) = standby.get("/metrics").await?;
            (gauge(&metrics, "hostcycle_leader") == Some(1.0)).then_some(())
        },
    )
    .await
    .unwrap();
    eprintln!(
        "failover (d) API server outage of {:.1} s with a {} s Lease: the leader stopped \
         {:.2} s after the outage began ({} ms after its Lease expired); API server started \
         again → standby holds the Lease {:.2} s",
        restarted.duration_since(down).as_secs_f64(),
        LEASE.as_secs(),
        exited.duration_since(down).as_secs_f64(),
        millis(expiry, exited),
        taken_at.duration_since(restarted).as_secs_f64(),
    );

    // The one leader left works: a reboot requested now is carried out once.
    lab.annotate(name, REBOOT, common::HARD).await;
    lab.wait_reboot_done(name).await;
    let history = lab.settled_history(name).await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "exactly one power cycle: {history:?}"
    );
}

/// A clean shutdown (SIGTERM, as in a rolling update) hands the Lease over at once: the
/// leader stops its controllers, then releases the Lease. With a 30 s Lease (renewed when
/// 10 s are left), waiting for it to expire would take at least 10 s; the standby has it
/// within a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_shutdown_hands_the_lease_over_at_once() {
    let lease_duration = Duration::from_secs(30);
    let options = LabOptions {
        operator_args: vec![
            "--lease-duration".into(),
            format!("{}s", lease_duration.as_secs()),
        ],
        ..LabOptions::default()
    };
    let mut lab = Lab::start_with(&["ha-handover"], options).await;
    let (standby, lease) = start_standby(&lab).await;

    let leader = lab.operator.as_mut().unwrap();
    let stopped = Timestamp::now();
    kill(Pid::from_raw(leader.pid() as i32), Signal::SIGTERM).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while leader.ensure_running().is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader exits on SIGTERM; log {}",
            leader.log_path().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(leader.log_path()).unwrap();
    assert!(log.contains("released the leader Lease"), "{log}");
    let taken = lease_taken(&lease, &standby).await;
    let after = millis(stopped, taken);
    eprintln!(
        "clean shutdown: SIGTERM → Lease taken by the standby {:.2} s (lease duration {} s)",
        after as f64 / 1000.0,
        lease_duration.as_secs()
    );
    assert!(
        after < 8000,
        "the standby took the Lease {after} ms after the SIGTERM: it waited for the Lease to \
         expire instead of being handed it"
    );
    wait_until(
        "the standby to lead (hostcycle_leader 1)",
        Duration::from_secs(30),
        || async {
            let (_, metrics) = standby.get("/metrics").await?;
            (gauge(&metrics, "hostcycle_leader") == Some(1.0)).then_some(())
        },
    )
    .await
    .unwrap();
}
