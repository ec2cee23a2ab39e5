//! End-to-end harness for the BareMetalHost controller: a real control plane, the sushy-tools
//! Redfish emulator, and the real `hostcycle operator` binary as a child process (so a test can
//! SIGKILL it mid-reboot). A sampler records every host's power transitions as the emulator
//! reports them, so tests can count power cycles.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod failover;
pub mod queue;
pub mod remediation;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostcycle_api::BareMetalHost;
use hostcycle_operator::rbac;
use hostcycle_testkit::bmc_emulators::{
    FakePower, FakeSystem, RedfishEmulator, RedfishEmulatorOptions,
};
use hostcycle_testkit::{ClusterOptions, LocalCluster, ManagedProcess, free_port, wait_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const NS: &str = "default";
pub const SECRET: &str = "bmc-credentials";
pub const USER: &str = "admin";
pub const PASSWORD: &str = "e2e-password";
pub const REBOOT: &str = "reboot.metal3.io";
pub const HARD: &str = r#"{"mode":"hard"}"#;
/// Enough for a power change through the fake driver (1–11 s) plus polling.
pub const POWER_TIMEOUT: Duration = Duration::from_secs(45);

/// Power states of one emulated host as sampled, with the time of each change.
#[derive(Debug, Default, Clone)]
pub struct PowerHistory(pub Vec<(Timestamp, String)>);

impl PowerHistory {
    /// How many times the host went from On to Off.
    pub fn power_offs(&self) -> usize {
        self.0
            .windows(2)
            .filter(|w| w[0].1 == "On" && w[1].1 == "Off")
            .count()
    }
    pub fn power_ons(&self) -> usize {
        self.0
            .windows(2)
            .filter(|w| w[0].1 == "Off" && w[1].1 == "On")
            .count()
    }
    /// First time the host was seen Off after `t`.
    pub fn off_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.0
            .iter()
            .find(|(at, s)| *at > t && s == "Off")
            .map(|(at, _)| *at)
    }
}

pub struct Lab {
    pub cluster: LocalCluster,
    pub redfish: Arc<RedfishEmulator>,
    pub operator: Option<ManagedProcess>,
    pub client: Client,
    pub hosts: Api<BareMetalHost>,
    pub names: Vec<String>,
    pub metrics_port: u16,
    /// `/healthz` and `/readyz` of the operator (`--probe-addr`).
    pub probe_port: u16,
    operator_kubeconfig: PathBuf,
    histories: Vec<Arc<Mutex<PowerHistory>>>,
    sampler_stop: CancellationToken,
    operator_starts: usize,
    /// Extra `hostcycle operator` flags (kept across restarts).
    operator_args: Vec<String>,
    /// Extra environment of the operator (kept across restarts).
    operator_env: Vec<(String, String)>,
    /// Hosts with BMC credentials of their own: (user, password).
    host_credentials: BTreeMap<String, (String, String)>,
    bmc_policy_args: Vec<String>,
}

/// How to start a [`Lab`].
#[derive(Clone)]
pub struct LabOptions {
    pub cluster: ClusterOptions,
    /// Extra `hostcycle operator` flags.
    pub operator_args: Vec<String>,
    /// Wait until the operator reports every host on and OK (needs the host controller).
    pub wait_hosts_ok: bool,
    /// Extra environment of the operator, set after the default `RUST_LOG` (so it can
    /// replace it).
    pub operator_env: Vec<(String, String)>,
    /// Hosts with BMC credentials of their own, (user, password) by host name: each gets the
    /// Secret [`host_secret`] and the emulator accepts the account besides the shared
    /// [`USER`]/[`PASSWORD`] (which the other hosts, the sampler and the test use).
    pub host_credentials: BTreeMap<String, (String, String)>,
    /// Where the operator may send BMC credentials: [`LOOPBACK_BMC_POLICY`] unless a test
    /// is about that policy.
    pub bmc_policy_args: Vec<String>,
    /// Start the simulated CSI driver (attacher, provisioner) and give the simulated
    /// kubelets its storage ([`queue::QueueLab::storage`]).
    pub storage: bool,
    /// How long a simulated host takes from power-on to a Ready Node (default 1 s).
    pub boot_delay: Option<std::time::Duration>,
}

/// The emulators listen on loopback, over plain HTTP; any Secret a host names may be sent.
pub const LOOPBACK_BMC_POLICY: [&str; 5] = [
    "--bmc-networks",
    "127.0.0.0/8,::1/128",
    "--allow-plain-http-bmc",
    "--bmc-credentials-label",
    "none",
];

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            cluster: ClusterOptions::default(),
            operator_args: Vec::new(),
            wait_hosts_ok: true,
            operator_env: Vec::new(),
            host_credentials: BTreeMap::new(),
            bmc_policy_args: LOOPBACK_BMC_POLICY.map(String::from).to_vec(),
            storage: false,
            boot_delay: None,
        }
    }
}

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,kube_client=off")
        .with_test_writer()
        .try_init();
}

impl Lab {
    /// Starts everything with one BareMetalHost per name (online, externally provisioned,
    /// powered on) and waits until the operator reports each one on and OK.
    pub async fn start(names: &[&str]) -> Lab {
        Lab::start_with(names, LabOptions::default()).await
    }

    /// Like [`Lab::start`], with options.
    pub async fn start_with(names: &[&str], options: LabOptions) -> Lab {
        init_logging();
        let cluster = LocalCluster::start(options.cluster.clone()).await.unwrap();
        let systems: Vec<FakeSystem> = names
            .iter()
            .map(|n| FakeSystem::new(*n, FakePower::On))
            .collect();
        let redfish = Arc::new(
            RedfishEmulator::start(RedfishEmulatorOptions {
                systems,
                basic_auth: Some((USER.into(), PASSWORD.into())),
                extra_users: options.host_credentials.values().cloned().collect(),
                tls: false,
                ..RedfishEmulatorOptions::default()
            })
            .await
            .unwrap(),
        );
        let client = cluster.client();
        // The operator runs as its own ServiceAccount with the ClusterRole it ships, so these
        // tests also prove its RBAC is sufficient.
        install_operator_rbac(&client).await;
        let operator_kubeconfig = cluster
            .service_account_kubeconfig(NS, rbac::OPERATOR_NAME)
            .await
            .unwrap();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": SECRET },
            "stringData": { "username": USER, "password": PASSWORD },
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        for (host, (user, password)) in &options.host_credentials {
            create_credentials_secret(&client, &host_secret(host), user, password).await;
        }
        let hosts: Api<BareMetalHost> = Api::namespaced(client.clone(), NS);
        for (i, name) in names.iter().enumerate() {
            let secret = if options.host_credentials.contains_key(*name) {
                host_secret(name)
            } else {
                SECRET.to_string()
            };
            let bmh = BareMetalHost::externally_provisioned(
                name,
                &redfish.system_address(i).unwrap(),
                &secret,
            );
            hosts.create(&PostParams::default(), &bmh).await.unwrap();
        }
        let sampler_stop = CancellationToken::new();
        let histories: Vec<Arc<Mutex<PowerHistory>>> =
            (0..names.len()).map(|_| Arc::default()).collect();
        for (i, history) in histories.iter().enumerate() {
            tokio::spawn(sample_power(
                redfish.clone(),
                i,
                history.clone(),
                sampler_stop.clone(),
            ));
        }
        let mut lab = Lab {
            cluster,
            redfish,
            operator: None,
            client,
            hosts,
            operator_kubeconfig,
            names: names.iter().map(|s| s.to_string()).collect(),
            metrics_port: free_port().unwrap(),
            probe_port: free_port().unwrap(),
            histories,
            sampler_stop,
            operator_starts: 0,
            operator_args: options.operator_args.clone(),
            operator_env: options.operator_env.clone(),
            host_credentials: options.host_credentials.clone(),
            bmc_policy_args: options.bmc_policy_args.clone(),
        };
        lab.start_operator();
        if !options.wait_hosts_ok {
            return lab;
        }
        for name in names {
            lab.wait_host(
                name,
                "powered on and OK after registration",
                POWER_TIMEOUT,
                |h| {
                    let st = h.status.as_ref();
                    st.and_then(|s| s.powered_on) == Some(true)
                        && st.and_then(|s| s.operational_status).map(|s| s.as_str()) == Some("OK")
                },
            )
            .await;
        }
        lab
    }

    /// Starts (or restarts) the operator binary.
    pub fn start_operator(&mut self) {
        self.operator_starts += 1;
        let cmd =
            self.operator_command(self.operator_identity(), self.metrics_port, self.probe_port);
        let name = format!("hostcycle-operator-{}", self.operator_starts);
        self.operator = Some(ManagedProcess::spawn(&name, cmd, &self.cluster.log_dir()).unwrap());
    }

    /// Starts another replica of the operator: the same flags as [`Lab::start_operator`]
    /// (extra flags included), its own identity, metrics and probe ports. It campaigns for the
    /// same Lease; stopped by PID when dropped.
    pub fn start_replica(&self, identity: &str) -> Replica {
        let (metrics_port, probe_port) = (free_port().unwrap(), free_port().unwrap());
        let cmd = self.operator_command(identity, metrics_port, probe_port);
        let name = format!("hostcycle-operator-{identity}");
        Replica {
            process: ManagedProcess::spawn(&name, cmd, &self.cluster.log_dir()).unwrap(),
            identity: identity.to_string(),
            metrics_port,
            probe_port,
        }
    }

    /// The identity of the operator [`Lab::start_operator`] starts.
    pub fn operator_identity(&self) -> &'static str {
        "e2e-operator"
    }

    fn operator_command(
        &self,
        identity: &str,
        metrics_port: u16,
        probe_port: u16,
    ) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
        cmd.args(["operator", "--kubeconfig"])
            .arg(&self.operator_kubeconfig)
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
                "--probe-addr",
                &format!("127.0.0.1:{probe_port}"),
                "--lease-namespace",
                NS,
                "--identity",
                identity,
                "--steady-poll",
                "5s",
                "--transition-poll",
                "500ms",
                // Local emulators answer in milliseconds; a hung BMC must fail within seconds.
                "--bmc-request-timeout",
                "3s",
                "--bmc-call-deadline",
                "8s",
            ])
            .args(&self.bmc_policy_args)
            .args(&self.operator_args)
            .env(
                "RUST_LOG",
                "info,hostcycle_operator=debug,kube_client=warn,kube_runtime=warn",
            )
            .envs(self.operator_env.iter().map(|(k, v)| (k, v)));
        // The rig keeps every host in `default` and Machines and templates in the namespaces
        // the real tools use (openshift-machine-api, …), which a cluster keeps together; a
        // test about the namespace rule passes the flag itself.
        if !self
            .operator_args
            .iter()
            .any(|a| a.starts_with("--remediation-request-namespaces"))
        {
            cmd.arg("--remediation-request-namespaces=*");
        }
        cmd
    }

    /// Replaces the BMC credentials policy flags from the operator's next start on.
    pub fn set_bmc_policy(&mut self, args: &[&str]) {
        self.bmc_policy_args = args.iter().map(|a| a.to_string()).collect();
    }

    /// Sets (or replaces) a variable of the operator's environment from its next start on.
    pub fn set_operator_env(&mut self, key: &str, value: &str) {
        self.operator_env.retain(|(k, _)| k != key);
        self.operator_env.push((key.to_string(), value.to_string()));
    }

    /// The BMC (user, password) of `host`: its own ([`LabOptions::host_credentials`]) or the
    /// shared [`USER`]/[`PASSWORD`].
    pub fn credentials(&self, host: &str) -> (String, String) {
        self.host_credentials
            .get(host)
            .cloned()
            .unwrap_or_else(|| (USER.to_string(), PASSWORD.to_string()))
    }

    /// SIGKILLs the operator (a crash: no cleanup).
    pub fn kill_operator(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.kill_now();
        }
    }

    pub fn index(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).unwrap()
    }

    pub fn history(&self, name: &str) -> PowerHistory {
        self.histories[self.index(name)].lock().unwrap().clone()
    }

    /// The power history once the sampler has caught up with the emulator's current state.
    pub async fn settled_history(&self, name: &str) -> PowerHistory {
        let now = self.redfish.power_state(self.index(name)).await.unwrap();
        let what = format!("power sampler of {name} to record the current state {now}");
        wait_until(&what, Duration::from_secs(5), || async {
            let h = self.history(name);
            (h.0.last().map(|(_, s)| s == &now) == Some(true)).then_some(h)
        })
        .await
        .unwrap()
    }

    pub async fn get(&self, name: &str) -> BareMetalHost {
        self.hosts.get(name).await.unwrap()
    }

    pub async fn annotate(&self, name: &str, key: &str, value: &str) {
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        self.hosts
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn unannotate(&self, name: &str, key: &str) {
        let patch = json!({ "metadata": { "annotations": { key: null } } });
        self.hosts
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn patch_spec(&self, name: &str, spec: serde_json::Value) {
        let patch = json!({ "spec": spec });
        self.hosts
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn wait_host(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&BareMetalHost) -> bool,
    ) -> BareMetalHost {
        let pred = &pred;
        let what = format!("BareMetalHost {name}: {what}");
        let result = wait_until(&what, timeout, || async move {
            let h = self.hosts.get(name).await.ok()?;
            pred(&h).then_some(h)
        })
        .await;
        match result {
            Ok(h) => h,
            Err(e) => {
                let h = self.hosts.get(name).await.ok();
                // Hosts outside the emulator (added by a test) have no sampled history.
                let history = self
                    .names
                    .iter()
                    .any(|n| n == name)
                    .then(|| self.history(name));
                panic!(
                    "{e}\nlast seen: {}\npower history: {:?}\noperator log: {:?}",
                    serde_json::to_string_pretty(&h).unwrap_or_default(),
                    history,
                    self.operator.as_ref().map(|p| p.log_path().to_path_buf())
                );
            }
        }
    }

    /// Waits until the host is on, has no reboot annotation, and lastPoweredOn is after
    /// pendingRebootSince: the reboot is complete.
    pub async fn wait_reboot_done(&self, name: &str) -> BareMetalHost {
        self.wait_host(
            name,
            "reboot complete (on, lastPoweredOn > pendingRebootSince, no reboot annotation)",
            Duration::from_secs(90),
            |h| {
                let st = h.status.as_ref();
                let prov = st.map(|s| &s.provisioning);
                let done = match (
                    prov.and_then(|p| p.last_powered_on),
                    prov.and_then(|p| p.pending_reboot_since),
                ) {
                    (Some(on), Some(pending)) => on > pending,
                    _ => false,
                };
                done && st.and_then(|s| s.powered_on) == Some(true) && !has_reboot_annotation(h)
            },
        )
        .await
    }

    /// Asserts the host stays in `expected` power for `for_how_long` (emulator truth).
    pub async fn assert_power_stays(&self, name: &str, expected: &str, for_how_long: Duration) {
        let deadline = tokio::time::Instant::now() + for_how_long;
        while tokio::time::Instant::now() < deadline {
            let state = self.redfish.power_state(self.index(name)).await.unwrap();
            assert_eq!(
                state,
                expected,
                "{name} must stay {expected}; history {:?}",
                self.history(name)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    pub async fn wait_emulator_power(&self, name: &str, expected: FakePower) {
        self.redfish
            .wait_for_power(self.index(name), expected, POWER_TIMEOUT)
            .await
            .unwrap();
    }

    /// (type, reason, note) of every Event about `name`, oldest first.
    pub async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let mut events: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        events.sort_by_key(|e| {
            e.event_time
                .clone()
                .map(|t| t.0)
                .or(e.metadata.creation_timestamp.clone().map(|t| t.0))
        });
        events
            .into_iter()
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The Events about `name` once `ready` holds for them. Events go out from a background
    /// task after the step they describe, so a test that saw the step waits for its Event.
    pub async fn events_when(
        &self,
        name: &str,
        what: &str,
        ready: impl Fn(&[(String, String, String)]) -> bool,
    ) -> Vec<(String, String, String)> {
        let waited = format!("Events about {name}: {what}");
        let ready = &ready;
        match wait_until(&waited, Duration::from_secs(30), || async move {
            let events = self.events(name).await;
            ready(&events).then_some(events)
        })
        .await
        {
            Ok(events) => events,
            Err(e) => panic!("{e}\nEvents now: {:?}", self.events(name).await),
        }
    }

    /// How many times an Event with `reason` was published about `name`: identical notes fold
    /// into one Event with a series, whose count says how often it happened.
    pub async fn event_count(&self, name: &str, reason: &str) -> i32 {
        let api: Api<Event> = Api::namespaced(self.client.clone(), NS);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum()
    }

    /// Waits until Events with `reason` about `name` count `want` (series included).
    pub async fn wait_event_count(&self, name: &str, reason: &str, want: i32) {
        let what = format!("{want} {reason} Events for {name}");
        if let Err(e) = wait_until(&what, Duration::from_secs(30), || async {
            (self.event_count(name, reason).await == want).then_some(())
        })
        .await
        {
            panic!(
                "{e}: counted {}\nEvents now: {:?}",
                self.event_count(name, reason).await,
                self.events(name).await
            );
        }
    }

    /// Waits until an Event with `reason` exists for `name`.
    pub async fn wait_event(&self, name: &str, reason: &str) {
        let what = format!("a {reason} Event for {name}");
        wait_until(&what, POWER_TIMEOUT, || async {
            self.event_reasons(name)
                .await
                .iter()
                .any(|r| r == reason)
                .then_some(())
        })
        .await
        .unwrap();
    }

    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.events(name)
            .await
            .into_iter()
            .map(|(_, r, _)| r)
            .collect()
    }

    pub async fn metrics(&self) -> String {
        let http = hostcycle_testkit::http::client(None).unwrap();
        http.get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// A second operator process of a [`Lab`] ([`Lab::start_replica`]).
pub struct Replica {
    pub process: ManagedProcess,
    pub identity: String,
    pub metrics_port: u16,
    pub probe_port: u16,
}

impl Replica {
    /// GET `path` on the replica: `/healthz` and `/readyz` on its probe port, anything else
    /// on its metrics port. (status, body), or `None` if it does not answer (yet).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let http = hostcycle_testkit::http::client(None).ok()?;
        let port = match path {
            "/healthz" | "/readyz" => self.probe_port,
            _ => self.metrics_port,
        };
        let response = http
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.sampler_stop.cancel();
        if std::thread::panicking()
            && let Some(p) = &self.operator
        {
            eprintln!("operator log: {}", p.log_path().display());
        }
    }
}

/// The credentials Secret of a host with its own BMC credentials.
pub fn host_secret(host: &str) -> String {
    format!("{host}-bmc-credentials")
}

/// Creates a BMC credentials Secret (`username`, `password`) in [`NS`].
pub async fn create_credentials_secret(client: &Client, name: &str, user: &str, password: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": name },
        "stringData": { "username": user, "password": password },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {name}: {e}"));
}

/// Creates the operator's ServiceAccount and RBAC exactly as `hostcycle manifests` ships them
/// for an operator in `NS` watching every namespace.
pub async fn install_operator_rbac(client: &Client) {
    install_rbac(client, &rbac::RbacOptions::cluster_wide(NS)).await;
}

/// Creates every object `hostcycle manifests` generates for `options` (CRDs aside).
pub async fn install_rbac(client: &Client, options: &rbac::RbacOptions) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    for object in rbac::rbac_objects(options).unwrap() {
        let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                object["apiVersion"].as_str().unwrap().to_string(),
            ),
        };
        let kind = object["kind"].as_str().unwrap().to_string();
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
        let obj: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        let api: Api<DynamicObject> = match &obj.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {kind} {:?}: {e}", obj.metadata.name));
    }
}

pub fn has_reboot_annotation(h: &BareMetalHost) -> bool {
    h.metadata.annotations.as_ref().is_some_and(|a| {
        a.keys()
            .any(|k| k == REBOOT || k.starts_with("reboot.metal3.io/"))
    })
}

pub fn annotations(h: &BareMetalHost) -> BTreeMap<String, String> {
    h.metadata.annotations.clone().unwrap_or_default()
}

async fn sample_power(
    redfish: Arc<RedfishEmulator>,
    index: usize,
    history: Arc<Mutex<PowerHistory>>,
    stop: CancellationToken,
) {
    loop {
        if let Ok(state) = redfish.power_state(index).await {
            let mut h = history.lock().unwrap();
            if h.0.last().map(|(_, s)| s != &state).unwrap_or(true) {
                h.0.push((Timestamp::now(), state));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

pub fn ts(h: &BareMetalHost) -> (Option<Timestamp>, Option<Timestamp>) {
    let p = h.status.as_ref().map(|s| &s.provisioning);
    (
        p.and_then(|p| p.pending_reboot_since),
        p.and_then(|p| p.last_powered_on),
    )
}
