//! The BareMetalHost controller under adverse conditions, end to end (real control plane, the
//! real operator binary as its own ServiceAccount with exactly the RBAC `hostcycle manifests`
//! generates): hundreds of hung BMCs, a stolen leader Lease, two replicas' readiness, a
//! namespaced install, a missing permission, a host name of 253 characters, and a status
//! value from a newer writer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hostcycle_api::BareMetalHost;
use hostcycle_operator::{ControllerName, rbac};
use hostcycle_testkit::redfish_stub::RedfishStub;
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const SECRET: &str = "bmc";
/// The operator's own namespace in the namespaced installs (never the hosts').
const OPERATOR_NS: &str = "hostcycle-system";
const HARD: &str = r#"{"mode":"hard"}"#;

/// A control plane, a fast Redfish fleet and the operator's ServiceAccount.
struct Rig {
    cluster: LocalCluster,
    client: Client,
    stub: RedfishStub,
    kubeconfig: PathBuf,
    operators: Vec<ManagedProcess>,
    starts: usize,
}

impl Rig {
    /// Installs exactly `options`' RBAC; the operator runs in `options.namespace` (its
    /// ServiceAccount is there), and a watched namespace exists before the install.
    async fn start(systems: usize, options: &rbac::RbacOptions) -> Rig {
        common::init_logging();
        let cluster = LocalCluster::start(ClusterOptions::default())
            .await
            .unwrap();
        let client = cluster.client();
        ensure_namespace(&client, &options.namespace).await;
        if let Some(watched) = &options.watch_namespace {
            ensure_namespace(&client, watched).await;
        }
        common::install_rbac(&client, options).await;
        let kubeconfig = cluster
            .service_account_kubeconfig(&options.namespace, rbac::OPERATOR_NAME)
            .await
            .unwrap();
        let stub = RedfishStub::start(systems, systems).await.unwrap();
        Rig {
            cluster,
            client,
            stub,
            kubeconfig,
            operators: Vec::new(),
            starts: 0,
        }
    }

    fn hosts(&self, ns: &str) -> Api<BareMetalHost> {
        Api::namespaced(self.client.clone(), ns)
    }

    async fn secret(&self, ns: &str) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": SECRET },
            "stringData": { "username": "u", "password": "p" },
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    async fn host(&self, ns: &str, name: &str, address: &str) {
        let bmh = BareMetalHost::externally_provisioned(name, address, SECRET);
        self.hosts(ns)
            .create(&PostParams::default(), &bmh)
            .await
            .unwrap();
    }

    /// Starts an operator replica; returns its metrics port and its probe port.
    fn start_operator(&mut self, args: &[&str]) -> (u16, u16) {
        self.starts += 1;
        let (port, probe_port) = (free_port().unwrap(), free_port().unwrap());
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
        cmd.args(["operator", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(["--probe-addr", &format!("127.0.0.1:{probe_port}")])
            .args(["--identity", &format!("replica-{}", self.starts)])
            .args(["--steady-poll", "5s", "--transition-poll", "500ms"])
            // The emulators listen on loopback, over plain HTTP.
            .args([
                "--bmc-networks",
                "127.0.0.0/8,::1/128",
                "--allow-plain-http-bmc",
                "--bmc-credentials-label",
                "none",
            ])
            .args(args)
            .env(
                "RUST_LOG",
                "info,hostcycle_operator=debug,kube_client=warn,kube_runtime=warn",
            );
        let name = format!("hostcycle-operator-{}", self.starts);
        self.operators
            .push(ManagedProcess::spawn(&name, cmd, &self.cluster.log_dir()).unwrap());
        (port, probe_port)
    }

    fn log(&self, replica: usize) -> String {
        std::fs::read_to_string(self.operators[replica].log_path()).unwrap_or_default()
    }

    async fn wait_host(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&BareMetalHost) -> bool,
    ) -> BareMetalHost {
        let hosts = self.hosts(ns);
        let what = format!("BareMetalHost {ns}/{name}: {what}");
        let pred = &pred;
        let hosts = &hosts;
        match wait_until(&what, timeout, || async move {
            let h = hosts.get(name).await.ok()?;
            pred(&h).then_some(h)
        })
        .await
        {
            Ok(h) => h,
            Err(e) => panic!(
                "{e}\nlast seen: {:?}\noperator logs: {:?}",
                hosts.get(name).await.ok().map(|h| h.status),
                self.operators
                    .iter()
                    .map(|p| p.log_path().to_path_buf())
                    .collect::<Vec<_>>()
            ),
        }
    }

    async fn wait_registered(&self, ns: &str, name: &str, timeout: Duration) {
        self.wait_host(ns, name, "powered on and OK", timeout, |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.powered_on) == Some(true)
                && st.and_then(|s| s.operational_status).map(|s| s.as_str()) == Some("OK")
        })
        .await;
    }

    async fn annotate(&self, ns: &str, name: &str, key: &str, value: &str) {
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        self.hosts(ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await.unwrap().is_none() {
        let ns: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        api.create(&PostParams::default(), &ns).await.unwrap();
    }
}

async fn get_text(port: u16, path: &str) -> Option<(u16, String)> {
    let http = hostcycle_testkit::http::client(None).ok()?;
    let response = http
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

fn leader_gauge(metrics: &str) -> Option<i64> {
    metrics
        .lines()
        .find(|l| l.starts_with("hostcycle_leader "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Loopback BMCs that accept connections and never answer.
struct HungBmcs {
    ports: Vec<u16>,
    accepted: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HungBmcs {
    async fn start(n: usize) -> HungBmcs {
        let accepted = Arc::new(AtomicUsize::new(0));
        let mut ports = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let accepted = accepted.clone();
            tasks.push(tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((socket, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    held.push(socket);
                }
            }));
        }
        HungBmcs {
            ports,
            accepted,
            tasks,
        }
    }

    /// Waits (60 s at most) until the BMCs have accepted `count` connections in all.
    async fn wait_accepted(&self, count: usize, what: &str) {
        let accepted = self.accepted.clone();
        wait_until(what, Duration::from_secs(60), || {
            let accepted = accepted.clone();
            async move { (accepted.load(Ordering::SeqCst) >= count).then_some(()) }
        })
        .await
        .unwrap();
    }
}

impl Drop for HungBmcs {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// 200 BMCs that never answer keep every steady-state polling slot busy for as long as they
/// are allowed to; a hard reboot of a healthy host must still reach its BMC within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reboot_is_not_queued_behind_hung_bmcs() {
    let mut rig = Rig::start(1, &rbac::RbacOptions::cluster_wide("default")).await;
    rig.secret("default").await;
    rig.host("default", "healthy", &rig.stub.system_address(0))
        .await;
    // Production deadlines: 30 s per request, 120 s per call.
    rig.start_operator(&["--leader-elect", "false", "--controllers", "baremetalhost"]);
    rig.wait_registered("default", "healthy", Duration::from_secs(60))
        .await;

    let hung = HungBmcs::start(200).await;
    for (i, port) in hung.ports.iter().enumerate() {
        let address = format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1");
        rig.host("default", &format!("hung-{i}"), &address).await;
    }
    // Every polling slot namespace default may hold (its share of the steady lane) is taken by
    // a read that will never be answered, and the healthy host's next steady poll waits behind
    // 200 hung ones of its own namespace.
    hung.wait_accepted(
        64,
        "64 connections to hung BMCs (every polling slot of the namespace busy)",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = Timestamp::now();
    rig.annotate("default", "healthy", "reboot.metal3.io/latency", HARD)
        .await;
    let stub = &rig.stub;
    let off = wait_until(
        "a ForceOff at the healthy host's BMC",
        Duration::from_secs(150),
        || async move {
            stub.resets(0)
                .into_iter()
                .find(|r| r.reset_type == "ForceOff" && r.at > before)
        },
    )
    .await
    .unwrap();
    let latency = off.at.duration_since(before);
    assert!(
        latency < jiff::SignedDuration::from_secs(1),
        "ForceOff took {latency:#} behind {} hung BMCs (operator log {:?})",
        hung.ports.len(),
        rig.operators[0].log_path()
    );
}

/// How long a hard power-off through sushy-tools takes when nothing stands in its way: the
/// reconcile (a power-state read, the write-ahead status, the ForceOff) takes well under a
/// second; sushy's fake driver applies the change 1–11 s after the request; the operator then
/// sees it at its next transition poll (`--transition-poll 500ms`) and records it. 11 s +
/// 4 s for the rest and a loaded CI machine.
const POWER_OFF_BOUND: Duration = Duration::from_secs(15);

/// How soon after its request a power-off is decided and recorded (`lastPowerAction`) when
/// a slot is free: one reconcile, a read of a healthy BMC and a status write (< 1 s), with
/// room for a loaded machine. Behind hung BMCs holding every action slot it is 13 s or more.
const DECIDED_BOUND: Duration = Duration::from_secs(3);

/// One namespace's 64 hosts aimed at BMCs that accept and never answer (inside the allowed
/// networks), each asked to reboot so that each claims an action slot, delay neither another
/// namespace's reboot nor a remediation's power-off of a third namespace's host: both are
/// decided within `DECIDED_BOUND` and done within `POWER_OFF_BOUND`. Before the fair lanes,
/// the 64 reads held all 64 action slots for 15 s each and both waited for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_namespaces_hung_bmcs_delay_no_other_namespaces_power_off() {
    use hostcycle_api::remediation::MACHINE_POWER_OFF_ANNOTATION;
    use hostcycle_testkit::bmc_emulators::{FakeSystem, RedfishEmulator, RedfishEmulatorOptions};
    let mut rig = Rig::start(1, &rbac::RbacOptions::cluster_wide("default")).await;
    for ns in ["tenant", "other", "fenced"] {
        ensure_namespace(&rig.client, ns).await;
        rig.secret(ns).await;
    }
    let sushy = RedfishEmulator::start(RedfishEmulatorOptions {
        systems: vec![
            FakeSystem::new("rebooted", hostcycle_testkit::bmc_emulators::FakePower::On),
            FakeSystem::new("fenced", hostcycle_testkit::bmc_emulators::FakePower::On),
        ],
        basic_auth: Some(("u".into(), "p".into())),
        ..RedfishEmulatorOptions::default()
    })
    .await
    .unwrap();
    rig.host("other", "rebooted", &sushy.system_address(0).unwrap())
        .await;
    rig.host("fenced", "fenced", &sushy.system_address(1).unwrap())
        .await;
    // Default lanes (64 action slots); production BMC deadlines.
    let (metrics_port, _) =
        rig.start_operator(&["--leader-elect", "false", "--controllers", "baremetalhost"]);
    rig.wait_registered("other", "rebooted", Duration::from_secs(60))
        .await;
    rig.wait_registered("fenced", "fenced", Duration::from_secs(60))
        .await;

    // The tenant's hosts: each asks for a reboot, so each claims an action slot and holds it
    // while its power-state read waits on a BMC that never answers.
    let hung = HungBmcs::start(64).await;
    for (i, port) in hung.ports.iter().enumerate() {
        let address = format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1");
        let mut bmh = BareMetalHost::externally_provisioned(&format!("hung-{i}"), &address, SECRET);
        bmh.metadata.annotations = Some([("reboot.metal3.io/tenant".into(), HARD.into())].into());
        rig.hosts("tenant")
            .create(&PostParams::default(), &bmh)
            .await
            .unwrap();
    }
    hung.wait_accepted(
        64,
        "64 connections to the tenant's hung BMCs (each a reboot's read)",
    )
    .await;

    // A reboot in another namespace, and a remediation's power-off (the annotation flow's key,
    // as the remediation controller writes it) in a third.
    let requested = Timestamp::now();
    rig.annotate("other", "rebooted", "reboot.metal3.io/maintenance", HARD)
        .await;
    rig.annotate("fenced", "fenced", MACHINE_POWER_OFF_ANNOTATION, HARD)
        .await;
    for (ns, name) in [("other", "rebooted"), ("fenced", "fenced")] {
        let off = rig
            .wait_host(ns, name, "powered off", POWER_OFF_BOUND, |h| {
                h.status.as_ref().and_then(|s| s.powered_on) == Some(false)
            })
            .await;
        let action = off
            .status
            .as_ref()
            .and_then(|s| s.last_power_action.as_ref())
            .expect("a recorded power action");
        let decided = action.requested_at.duration_since(requested);
        eprintln!(
            "{ns}/{name}: decided after {decided:#}, seen off after {:#}",
            Timestamp::now().duration_since(requested)
        );
        assert!(
            decided < jiff::SignedDuration::try_from(DECIDED_BOUND).unwrap(),
            "{ns}/{name}: the power-off was decided {decided:#} after its request, behind 64 \
             hung BMCs of namespace tenant (operator log {:?})",
            rig.operators[0].log_path()
        );
    }
    // The operator's view: the tenant holds at most its share of the action lane (32 of 64;
    // one more slot may be the held host of namespace other, polled while it stays off).
    let (_, metrics) = get_text(metrics_port, "/metrics").await.unwrap();
    let gauge = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    let waiting = gauge("hostcycle_lane_waiting{lane=\"action\"}");
    let in_use = gauge("hostcycle_lane_slots_in_use{lane=\"action\"}");
    assert!(
        in_use <= 33.0,
        "action lane: {in_use} slots in use, {waiting} waiting"
    );
}

/// A replica whose Lease is taken over stops before its next BMC call, even in the middle of
/// a reconcile: the read in flight is abandoned and the power-off that would follow is never
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_lease_stops_bmc_calls() {
    let mut rig = Rig::start(1, &rbac::RbacOptions::cluster_wide("default")).await;
    rig.secret("default").await;
    rig.host("default", "h", &rig.stub.system_address(0)).await;
    rig.start_operator(&[
        "--lease-namespace",
        "default",
        "--lease-duration",
        "2s",
        "--controllers",
        "baremetalhost",
    ]);
    rig.wait_registered("default", "h", Duration::from_secs(60))
        .await;

    // The BMC becomes slow; a reboot starts with a read that takes 8 s.
    rig.stub.set_read_delay(Duration::from_secs(8));
    let annotated = Timestamp::now();
    rig.annotate("default", "h", "reboot.metal3.io/steal", HARD)
        .await;
    let stub = &rig.stub;
    wait_until(
        "a power-state read after the reboot request",
        Duration::from_secs(20),
        || async move { stub.requests().into_iter().find(|t| *t > annotated) },
    )
    .await
    .unwrap();

    // Another replica takes the Lease over.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(rig.client.clone(), "default");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now());
    let stolen = json!({ "spec": {
        "holderIdentity": "thief",
        "leaseDurationSeconds": 3600,
        "acquireTime": now,
        "renewTime": now,
    }});
    leases
        .patch(
            rbac::DEFAULT_LEASE_NAME,
            &PatchParams::default(),
            &Patch::Merge(&stolen),
        )
        .await
        .unwrap();
    let stolen_at = Timestamp::now();

    // The operator notices and exits; no BMC call reaches the stub after the read in flight.
    let log = rig.operators[0].log_path().to_path_buf();
    wait_until(
        "the operator to report the lost Lease",
        Duration::from_secs(20),
        || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log)
                    .ok()?
                    .contains("lost the leader Lease")
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after: Vec<Timestamp> = rig
        .stub
        .requests()
        .into_iter()
        .filter(|t| *t > stolen_at)
        .collect();
    assert!(
        after.is_empty(),
        "BMC calls after the Lease was lost: {after:?}"
    );
    assert!(
        rig.stub.resets(0).iter().all(|r| r.at < annotated),
        "a power call after the Lease was lost: {:?} (log {log:?})",
        rig.stub.resets(0)
    );
}

/// Two replicas: both become ready (a standby is healthy), one leads, as
/// `hostcycle_leader` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_replicas_are_ready_and_one_leads() {
    let mut rig = Rig::start(1, &rbac::RbacOptions::cluster_wide("default")).await;
    rig.secret("default").await;
    rig.host("default", "h", &rig.stub.system_address(0)).await;
    let args = [
        "--lease-namespace",
        "default",
        "--controllers",
        "baremetalhost",
    ];
    let first = rig.start_operator(&args);
    rig.wait_registered("default", "h", Duration::from_secs(60))
        .await;
    let second = rig.start_operator(&args);
    for (_, port) in [first, second] {
        wait_until(
            &format!("/readyz of the replica on port {port} to answer 200"),
            Duration::from_secs(30),
            || async move { get_text(port, "/readyz").await.filter(|(s, _)| *s == 200) },
        )
        .await
        .unwrap();
    }
    let mut leaders = Vec::new();
    for (port, _) in [first, second] {
        let (_, metrics) = get_text(port, "/metrics").await.unwrap();
        leaders.push(leader_gauge(&metrics));
    }
    assert_eq!(
        leaders,
        [Some(1), Some(0)],
        "hostcycle_leader of each replica"
    );
}

/// A namespaced install: the operator runs as its ServiceAccount in its own namespace with
/// exactly the Roles `hostcycle manifests --namespace metal --controllers baremetalhost`
/// generates (the Lease's in its namespace, the hosts' in metal; no cluster-wide rule), reboots
/// its hosts — one with a 253-character name, whose Events must be valid objects — and never
/// touches a host in another namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespaced_install_runs_with_exactly_its_role() {
    let options = rbac::RbacOptions {
        controllers: vec![ControllerName::BareMetalHost],
        ..rbac::RbacOptions::namespaced(OPERATOR_NS, "metal")
    };
    let mut rig = Rig::start(3, &options).await;
    ensure_namespace(&rig.client, "other").await;
    rig.secret("metal").await;
    rig.secret("other").await;
    let long = format!("h{}", "x".repeat(251)) + "1";
    assert_eq!(long.len(), 253);
    rig.host("metal", &long, &rig.stub.system_address(0)).await;
    rig.host("metal", "short", &rig.stub.system_address(1))
        .await;
    rig.host("other", "foreign", &rig.stub.system_address(2))
        .await;
    rig.start_operator(&[
        "--namespace",
        "metal",
        "--lease-namespace",
        OPERATOR_NS,
        "--controllers",
        "baremetalhost",
    ]);
    for name in [long.as_str(), "short"] {
        rig.wait_registered("metal", name, Duration::from_secs(60))
            .await;
        rig.annotate("metal", name, "reboot.metal3.io/e2e", HARD)
            .await;
    }
    let stub = &rig.stub;
    for i in [0, 1] {
        wait_until(
            &format!("ForceOff then On at system {i}"),
            Duration::from_secs(60),
            || async move {
                let types: Vec<String> = stub.resets(i).into_iter().map(|r| r.reset_type).collect();
                (types.iter().any(|t| t == "ForceOff")).then_some(())
            },
        )
        .await
        .unwrap();
    }
    // Events about the 253-character host exist: their names are valid.
    let events: Api<Event> = Api::namespaced(rig.client.clone(), "metal");
    let long_ref = long.clone();
    let events = &events;
    let found = wait_until(
        "Events about the 253-character host",
        Duration::from_secs(30),
        || {
            let long = long_ref.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                let about: Vec<Event> = list
                    .items
                    .into_iter()
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&long))
                    .collect();
                (!about.is_empty()).then_some(about)
            }
        },
    )
    .await
    .unwrap();
    for event in found {
        assert!(event.name_any().len() <= 253, "{}", event.name_any());
    }
    // The host outside the namespace is never touched.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let foreign = rig.hosts("other").get("foreign").await.unwrap();
    assert!(foreign.status.is_none(), "{:?}", foreign.status);
    assert!(rig.stub.resets(2).is_empty());
    let log = rig.log(0);
    assert!(
        !log.contains("forbidden"),
        "a refused call with the generated Role:\n{log}"
    );
}

/// Without the Secrets rule, the operator says which verb on which resource was refused,
/// in its log and in the host's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_permission_is_named() {
    let options = rbac::RbacOptions {
        controllers: vec![ControllerName::BareMetalHost],
        ..rbac::RbacOptions::namespaced(OPERATOR_NS, "metal")
    };
    let mut rig = Rig::start(1, &options).await;
    // Take the Secrets rule out of the generated Role.
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(rig.client.clone(), "metal");
    let mut role = roles.get(rbac::OPERATOR_NAME).await.unwrap();
    role.rules.as_mut().unwrap().retain(|r| {
        !r.resources
            .as_ref()
            .is_some_and(|res| res.iter().any(|x| x == "secrets"))
    });
    roles
        .replace(rbac::OPERATOR_NAME, &PostParams::default(), &role)
        .await
        .unwrap();
    rig.secret("metal").await;
    rig.host("metal", "h", &rig.stub.system_address(0)).await;
    rig.start_operator(&[
        "--namespace",
        "metal",
        "--lease-namespace",
        OPERATOR_NS,
        "--controllers",
        "baremetalhost",
    ]);
    let host = rig
        .wait_host(
            "metal",
            "h",
            "an error naming the refused call",
            Duration::from_secs(60),
            |h| {
                h.status
                    .as_ref()
                    .is_some_and(|s| s.error_message.contains("forbidden"))
            },
        )
        .await;
    let message = host.status.unwrap().error_message;
    assert!(
        message.contains("forbidden: cannot get secrets in namespace metal"),
        "{message}"
    );
    let log_path = rig.operators[0].log_path().to_path_buf();
    wait_until(
        "the operator log to name the refused watch",
        Duration::from_secs(30),
        || {
            let log_path = log_path.clone();
            async move {
                std::fs::read_to_string(&log_path)
                    .ok()?
                    .contains("forbidden: cannot list secrets (metadata) in namespace metal")
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// A newer writer's status value this version does not know must not stall the watch: the
/// host is still reconciled (and other hosts too).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_status_value_does_not_stall_the_watch() {
    let mut rig = Rig::start(2, &rbac::RbacOptions::cluster_wide("default")).await;
    rig.secret("default").await;
    rig.host("default", "newer", &rig.stub.system_address(0))
        .await;
    rig.host("default", "plain", &rig.stub.system_address(1))
        .await;
    // A newer CRD that allows more values (as a newer operator version would install).
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(rig.client.clone());
    let base = "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties";
    let crd = crds.get("baremetalhosts.metal3.io").await.unwrap();
    let schema = serde_json::to_value(&crd).unwrap();
    let mut ops = Vec::new();
    for field in ["operationalStatus", "errorType"] {
        let path = format!("{base}/{field}/enum");
        if schema.pointer(&path).is_some() {
            ops.push(json!({ "op": "remove", "path": path }));
        }
    }
    crds.patch(
        "baremetalhosts.metal3.io",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(json!(ops)).unwrap()),
    )
    .await
    .unwrap();
    let status = json!({ "status": {
        "operationalStatus": "quarantined",
        "errorType": "firmware update error",
        "poweredOn": true,
    }});
    let hosts = rig.hosts("default");
    wait_until(
        "the unknown status values to be accepted by the API server",
        Duration::from_secs(20),
        || {
            let (hosts, status) = (hosts.clone(), status.clone());
            async move {
                hosts
                    .patch_status("newer", &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .ok()
            }
        },
    )
    .await
    .unwrap();
    // Listing decodes: one unknown value does not fail the whole list.
    let list = hosts.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    rig.start_operator(&["--leader-elect", "false", "--controllers", "baremetalhost"]);
    rig.wait_registered("default", "plain", Duration::from_secs(60))
        .await;
    rig.wait_registered("default", "newer", Duration::from_secs(60))
        .await;
}
