//! HostHealthCheck (issue 26, part 1) end to end: the real control plane, the real operator
//! binary under its own ServiceAccount (`--controllers health-check`: the remediation
//! controller is off, so the requests' status is the test's to write), Nodes created by the
//! test and their Leases in `kube-node-lease` renewed by a loop of the test's (no kubelet).
//!
//! One cluster, one operator, five checks over disjoint groups of nodes, judged at once:
//!
//! - `main` (5 nodes): a-0's Lease stops → a request `main-a-0`, owned by the check, with the
//!   node-name annotation and `release: Auto`; once the Lease is renewed again and the
//!   request's step is `Done`, the request is deleted.
//! - `storm` (5 nodes, scenario F): three Leases stop at once → `status.storm.active`, an Event
//!   `StormDetected`, no request.
//! - `warm` (2 nodes, `warmUpSeconds: 20`): w-0's Lease is stale before the operator starts;
//!   no request before the warm-up has passed, then one.
//! - `excluded` (2 nodes): e-0 carries the exclude label and its Lease stops: no request.
//! - `paused` (2 nodes, `pauseRequests: true`): p-0's Lease stops: `Suspended=Paused`, no
//!   request; unpaused, its request comes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{NS, init_logging, install_operator_rbac};
use hostcycle_api::health::{DEFAULT_EXCLUDE_LABEL, HostHealthCheck};
use hostcycle_api::remediation::{HostRemediation, NHC_NODE_NAME_ANNOTATION};
use hostcycle_operator::rbac::OPERATOR_NAME;
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const GROUP_LABEL: &str = "e2e.hostcycle.io/group";
/// How often the test renews the Leases it keeps alive (a kubelet: every 10 s).
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// Enough for warm-up, staleness (10 s), a live confirmation and a write on a loaded machine.
const DETECTED: Duration = Duration::from_secs(60);

/// Renews the Leases of the nodes in `renewing` every [`RENEW_EVERY`] until `stop`.
fn renew_leases(client: Client, renewing: Arc<Mutex<HashSet<String>>>, stop: CancellationToken) {
    tokio::spawn(async move {
        let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
        loop {
            let names: Vec<String> = renewing.lock().unwrap().iter().cloned().collect();
            for name in names {
                let patch = json!({ "spec": { "renewTime": MicroTime(jiff::Timestamp::now()) } });
                if let Err(e) = leases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(lease = %name, error = %e, "renewing a Lease failed");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RENEW_EVERY) => {}
            }
        }
    });
}

async fn create_node(client: &Client, name: &str, group: &str, labels: &[(&str, &str)]) {
    let mut all: BTreeMap<String, String> = BTreeMap::from([
        (GROUP_LABEL.to_string(), group.to_string()),
        ("kubernetes.io/hostname".to_string(), name.to_string()),
    ]);
    all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let node: Node =
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": all } })).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "kube-node-lease" },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": 40,
                  "renewTime": MicroTime(jiff::Timestamp::now()) },
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_or_else(|e| panic!("creating Lease {name}: {e}"));
}

async fn create_check(client: &Client, name: &str, group: &str, extra: serde_json::Value) {
    let mut spec = json!({
        "selector": { "matchLabels": { GROUP_LABEL: group } },
        "leaseStaleAfterSeconds": 10,
        "warmUpSeconds": 5,
        "maxUnhealthy": 1,
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let check: HostHealthCheck = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1", "kind": "HostHealthCheck",
        "metadata": { "name": name }, "spec": spec,
    }))
    .unwrap();
    Api::<HostHealthCheck>::all(client.clone())
        .create(&PostParams::default(), &check)
        .await
        .unwrap_or_else(|e| panic!("creating HostHealthCheck {name}: {e}"));
}

struct Rig {
    client: Client,
    requests: Api<HostRemediation>,
    checks: Api<HostHealthCheck>,
    operator: ManagedProcess,
}

impl Rig {
    async fn request(&self, name: &str) -> Option<HostRemediation> {
        self.requests.get_opt(name).await.unwrap()
    }

    async fn request_names(&self) -> Vec<String> {
        self.requests
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|r| r.name_any())
            .collect()
    }

    async fn wait_request(&self, name: &str, timeout: Duration) -> HostRemediation {
        match wait_until(&format!("HostRemediation {name}"), timeout, || async {
            self.request(name).await
        })
        .await
        {
            Ok(r) => r,
            Err(e) => panic!("{e}\n{}", self.diagnosis().await),
        }
    }

    async fn check(&self, name: &str) -> HostHealthCheck {
        self.checks.get(name).await.unwrap()
    }

    async fn wait_check(
        &self,
        name: &str,
        what: &str,
        ok: impl Fn(&HostHealthCheck) -> bool,
    ) -> HostHealthCheck {
        let ok = &ok;
        match wait_until(
            &format!("HostHealthCheck {name}: {what}"),
            DETECTED,
            || async {
                let check = self.check(name).await;
                ok(&check).then_some(check)
            },
        )
        .await
        {
            Ok(c) => c,
            Err(e) => panic!("{e}\n{}", self.diagnosis().await),
        }
    }

    /// Every check's status and every request, and where the operator's log is.
    async fn diagnosis(&self) -> String {
        let checks = self.checks.list(&ListParams::default()).await.unwrap();
        let statuses: Vec<String> = checks
            .items
            .iter()
            .map(|c| format!("{}: {:?}", c.name_any(), c.status))
            .collect();
        format!(
            "checks:\n  {}\nrequests: {:?}\noperator log: {}",
            statuses.join("\n  "),
            self.request_names().await,
            self.operator.log_path().display()
        )
    }

    /// (reason, note) of the Events about the HostHealthCheck `check` (in kube-system).
    async fn check_events(&self, check: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("HostHealthCheck") && r.name.as_deref() == Some(check)
                })
            })
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    async fn wait_event(&self, check: &str, reason: &str) -> String {
        match wait_until(
            &format!("a {reason} Event about {check}"),
            Duration::from_secs(30),
            || async {
                self.check_events(check)
                    .await
                    .into_iter()
                    .find(|(r, _)| r == reason)
                    .map(|(_, note)| note)
            },
        )
        .await
        {
            Ok(note) => note,
            Err(e) => panic!("{e}\nEvents: {:?}", self.check_events(check).await),
        }
    }
}

fn condition_reason(check: &HostHealthCheck, type_: &str) -> Option<String> {
    check
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_checks_request_remediation_of_stale_nodes_and_hold_back_in_storms() {
    init_logging();
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    install_operator_rbac(&client).await;
    let kubeconfig = cluster
        .service_account_kubeconfig(NS, OPERATOR_NAME)
        .await
        .unwrap();

    // Nodes and their Leases; every Lease but w-0's is renewed.
    let mut all = Vec::new();
    for (group, count) in [("a", 5), ("s", 5), ("w", 2), ("e", 2), ("p", 2)] {
        for i in 0..count {
            let name = format!("{group}-{i}");
            let labels: &[(&str, &str)] = if name == "e-0" {
                &[(DEFAULT_EXCLUDE_LABEL, "")]
            } else {
                &[]
            };
            create_node(&client, &name, group, labels).await;
            all.push(name);
        }
    }
    let renewing: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(
        all.iter().filter(|n| *n != "w-0").cloned().collect(),
    ));
    let stop_renewing = CancellationToken::new();
    let _stop_renewing = stop_renewing.clone().drop_guard();
    renew_leases(client.clone(), renewing.clone(), stop_renewing.clone());

    create_check(&client, "main", "a", json!({})).await;
    create_check(&client, "storm", "s", json!({ "maxUnhealthy": 5 })).await;
    create_check(&client, "warm", "w", json!({ "warmUpSeconds": 20 })).await;
    create_check(&client, "excluded", "e", json!({})).await;
    create_check(&client, "paused", "p", json!({ "pauseRequests": true })).await;

    // The failures: each of these Leases stops now.
    for stopped in ["a-0", "s-0", "s-1", "s-2", "e-0", "p-0"] {
        renewing.lock().unwrap().remove(stopped);
    }
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
    cmd.args(["operator", "--kubeconfig"])
        .arg(&kubeconfig)
        .args([
            "--controllers",
            "health-check",
            "--metrics-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
            "--probe-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
            "--lease-namespace",
            NS,
            "--identity",
            "e2e-health",
        ])
        .env("RUST_LOG", "info,hostcycle_operator=debug,kube_client=warn");
    let started = tokio::time::Instant::now();
    let operator = ManagedProcess::spawn("hostcycle-operator", cmd, &cluster.log_dir()).unwrap();
    let rig = Rig {
        requests: Api::namespaced(client.clone(), NS),
        checks: Api::all(client.clone()),
        client: client.clone(),
        operator,
    };

    // (c) Warm-up: w-0 was stale before the operator started; for the warm-up's 20 s (counted
    // from taking the leader Lease, after the start) nothing is requested for it.
    let mut saw_warming_up = false;
    while started.elapsed() < Duration::from_secs(18) {
        assert!(
            rig.request("warm-w-0").await.is_none(),
            "w-0 was requested {:?} after the operator started, inside warmUpSeconds",
            started.elapsed()
        );
        let warm = rig.check("warm").await;
        saw_warming_up |= condition_reason(&warm, "Suspended").as_deref() == Some("WarmingUp");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        saw_warming_up,
        "the warm check said Suspended=WarmingUp meanwhile\n{}",
        rig.diagnosis().await
    );

    // (a) a-0's Lease stopped: its request, made the way remediation reads it.
    let request = rig.wait_request("main-a-0", DETECTED).await;
    let main = rig.check("main").await;
    let owner = &request.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("HostHealthCheck", "main", Some(true))
    );
    assert_eq!(Some(owner.uid.as_str()), main.metadata.uid.as_deref());
    assert_eq!(request.annotations()[NHC_NODE_NAME_ANNOTATION], "a-0");
    assert_eq!(request.labels()["hostcycle.io/health-check"], "main");
    let strategy = request.spec.strategy.clone().unwrap();
    assert_eq!(strategy.release.as_deref(), Some("Auto"));
    let main = rig
        .wait_check("main", "a-0 listed unhealthy", |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.unhealthy_nodes == ["a-0"] && s.observed_nodes == 5)
        })
        .await;
    assert_eq!(main.status.unwrap().healthy_nodes, 4);
    rig.wait_event("main", "RemediationRequested").await;
    rig.wait_event("main", "NodeUnhealthy").await;

    // (b) Scenario F: three of five Leases stopped at once is a storm; nothing is requested.
    let storm = rig
        .wait_check("storm", "storm active", |c| {
            c.status
                .as_ref()
                .and_then(|s| s.storm.as_ref())
                .is_some_and(|s| s.active && s.stale_count == 3)
        })
        .await;
    assert_eq!(
        condition_reason(&storm, "Suspended").as_deref(),
        Some("StormActive")
    );
    let note = rig.wait_event("storm", "StormDetected").await;
    assert!(note.contains("3 of 5"), "{note}");

    // (d) The excluded node and the paused check: nothing requested, though both nodes have
    // been stale longer than a-0, which was requested.
    let excluded = rig.check("excluded").await;
    let status = excluded.status.clone().unwrap();
    assert_eq!(
        (
            status.observed_nodes,
            status.healthy_nodes,
            status.unhealthy_node_count
        ),
        (2, 1, 0),
        "{status:?}"
    );
    let paused = rig
        .wait_check("paused", "Suspended=Paused with p-0 unhealthy", |c| {
            condition_reason(c, "Suspended").as_deref() == Some("Paused")
                && c.status
                    .as_ref()
                    .is_some_and(|s| s.unhealthy_nodes == ["p-0"])
        })
        .await;
    assert!(paused.status.is_some());
    let names = rig.request_names().await;
    for never in [
        "storm-s-0",
        "storm-s-1",
        "storm-s-2",
        "excluded-e-0",
        "paused-p-0",
    ] {
        assert!(
            !names.iter().any(|n| n == never),
            "{never} must not be requested: {names:?}"
        );
    }
    rig.checks
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "pauseRequests": false } })),
        )
        .await
        .unwrap();
    rig.wait_request("paused-p-0", DETECTED).await;

    // (c) After its warm-up, w-0 is requested.
    rig.wait_request("warm-w-0", DETECTED).await;

    // (a) a-0 is back (its Lease renewed) and its remediation is done: the request goes.
    renewing.lock().unwrap().insert("a-0".into());
    rig.requests
        .patch_status(
            "main-a-0",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "step": "Done", "phase": "Succeeded" } })),
        )
        .await
        .unwrap();
    if let Err(e) = wait_until("main-a-0 deleted", DETECTED, || async {
        rig.request("main-a-0").await.is_none().then_some(())
    })
    .await
    {
        panic!("{e}\n{}", rig.diagnosis().await);
    }
    rig.wait_event("main", "RemediationRequestDeleted").await;
    let main = rig
        .wait_check("main", "all healthy again", |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.healthy_nodes == 5 && s.unhealthy_nodes.is_empty())
        })
        .await;
    assert_eq!(
        condition_reason(&main, "Ready").as_deref(),
        Some("Watching")
    );
    // Still no request in the storm.
    let names = rig.request_names().await;
    assert!(!names.iter().any(|n| n.starts_with("storm-")), "{names:?}");
}
