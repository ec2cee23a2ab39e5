//! A real local Kubernetes control plane: etcd, kube-apiserver (TLS, token auth, RBAC),
//! kube-controller-manager (all controllers, incl. node lifecycle) and kube-scheduler, on free
//! loopback ports in one directory. Every process is stopped by PID when the cluster drops.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::TestkitError;
use crate::pki::{self, TestCa};
use crate::process::{ManagedProcess, cache_dir, free_port, require_program};

/// Where the Debian-built v1.20.2 binaries live: `$HOSTCYCLE_K8S_BIN` or the cache.
pub fn k8s_bin_dir() -> PathBuf {
    std::env::var_os("HOSTCYCLE_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("k8s-v1.20.2"))
}

/// `$HOSTCYCLE_ETCD` or Debian's etcd-server binary.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("HOSTCYCLE_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// Knobs for a local cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How long the node-lifecycle controller waits for a heartbeat before marking a node
    /// NotReady/Unknown. Real clusters use 40 s; tests use a few seconds.
    pub node_monitor_grace_period: Duration,
    /// Default toleration for the `unreachable`/`not-ready` NoExecute taints (API server flag).
    pub default_unreachable_toleration: Duration,
    /// Directory for certificates, data and logs; a fresh temp dir when `None`.
    pub base_dir: Option<PathBuf>,
    /// Fixed API server port (the lab); a free port when `None`.
    pub apiserver_port: Option<u16>,
    /// How long to wait for each component to become ready.
    pub start_timeout: Duration,
    /// Where the control-plane binaries are; [`k8s_bin_dir`] when `None`.
    pub k8s_bin_dir: Option<PathBuf>,
    /// Extra kube-apiserver flags (e.g. to try a feature gate).
    pub extra_apiserver_args: Vec<String>,
    /// CRDs installed (and waited for) once the control plane is ready. By default
    /// hostcycle's own ([`hostcycle_api::crds`]) and both minimal Machine CRDs
    /// ([`crate::machines::machine_crds`]: `machine.openshift.io` and `cluster.x-k8s.io`).
    /// For a server that serves neither Machine kind, set `crds: hostcycle_api::crds()`.
    pub crds: Vec<CustomResourceDefinition>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            node_monitor_grace_period: Duration::from_secs(8),
            default_unreachable_toleration: Duration::from_secs(300),
            base_dir: None,
            apiserver_port: None,
            start_timeout: Duration::from_secs(60),
            k8s_bin_dir: None,
            extra_apiserver_args: Vec::new(),
            crds: hostcycle_api::crds()
                .into_iter()
                .chain(crate::machines::machine_crds())
                .chain([crate::machines::openshift_machine_health_check_crd()])
                .collect(),
        }
    }
}

/// A running local control plane. Dropping it stops every component (reverse start order).
pub struct LocalCluster {
    // Stopped in reverse order on drop: scheduler, controller manager, API server, etcd.
    processes: Vec<ManagedProcess>,
    /// How kube-apiserver was started, to start it again ([`LocalCluster::start_apiserver`]).
    apiserver: ApiServerLaunch,
    /// Certificates, data and logs.
    root: PathBuf,
    /// A temp dir of ours: deleted when the cluster drops cleanly, kept (with its logs) when
    /// starting failed or a test panicked. Never a `base_dir` the caller gave.
    delete_on_drop: bool,
    kubeconfig: PathBuf,
    server: String,
    ca_pem: String,
    client: Client,
    // Removed after every process has stopped (fields drop after `Drop::drop`).
    _etcd_data: RemoveOnDrop,
}

/// Deletes a directory when dropped: etcd's data in /dev/shm must not outlive the cluster.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("server", &self.server)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let what = what.into();
    move |source| TestkitError::Io { what, source }
}

fn other(what: &str, e: impl std::fmt::Display) -> TestkitError {
    TestkitError::Other {
        what: what.to_string(),
        message: e.to_string(),
    }
}

impl LocalCluster {
    /// Starts etcd, the API server, the controller manager and the scheduler and waits until
    /// each is ready (each wait has a deadline and fails fast if the component exits).
    pub async fn start(opts: ClusterOptions) -> Result<LocalCluster, TestkitError> {
        let bin = opts.k8s_bin_dir.clone().unwrap_or_else(k8s_bin_dir);
        let etcd_bin = etcd_binary();
        require_program("etcd", &etcd_bin)?;
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            require_program(c, &bin.join(c))?;
        }
        if let Some(port) = opts.apiserver_port {
            crate::process::ensure_port_free("kube-apiserver", port)?;
        }
        let (root, temp) = match &opts.base_dir {
            Some(p) => {
                std::fs::create_dir_all(p).map_err(io_err(format!("creating {}", p.display())))?;
                (p.clone(), false)
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("hostcycle-cluster-")
                    .tempdir()
                    .map_err(io_err("creating cluster temp dir"))?;
                (dir.keep(), true)
            }
        };
        match Self::start_in(&opts, &bin, &etcd_bin, &root).await {
            Ok(mut cluster) => {
                cluster.delete_on_drop = temp;
                Ok(cluster)
            }
            Err(e) => {
                let logs = root.join("logs");
                if logs.exists() || !temp {
                    eprintln!(
                        "local cluster failed to start; logs kept in {}",
                        logs.display()
                    );
                } else {
                    // Nothing ran, so there is nothing to read: do not leave the keys behind.
                    let _ = std::fs::remove_dir_all(&root);
                }
                Err(e)
            }
        }
    }

    async fn start_in(
        opts: &ClusterOptions,
        bin: &Path,
        etcd_bin: &Path,
        root: &Path,
    ) -> Result<LocalCluster, TestkitError> {
        let root = root.to_path_buf();
        let logs = root.join("logs");
        let deadline = opts.start_timeout;
        // 1. PKI: one CA, one serving cert for all components, a service-account signing key.
        let pki = ClusterPki::write(&root.join("pki"))?;
        // 2. Ports, and the kubeconfig that reaches the API server.
        let ports = ClusterPorts::pick(opts)?;
        let server = format!("https://127.0.0.1:{}", ports.api);
        let kubeconfig = root.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &pki.ca_pem, &pki.token)?;
        // 3. etcd. Its processes are declared after the data dir guard: on an error return,
        //    etcd stops before its data goes.
        let etcd_data = etcd_data_dir(&root, ports.api);
        let mut processes = vec![start_etcd(etcd_bin, &etcd_data, &ports, &logs, deadline).await?];
        // 4. kube-apiserver, waited for through the client.
        let apiserver = apiserver_launch(opts, bin, &ports, &pki);
        processes.push(apiserver.spawn(&logs)?);
        let client = client_from_kubeconfig(&kubeconfig).await?;
        wait_apiserver_started(&mut processes, &client, &server, deadline).await?;
        // 5. kube-controller-manager and kube-scheduler.
        let kcm_port = free_port()?;
        processes.push(spawn_component(
            "kube-controller-manager",
            controller_manager_args(opts, &pki),
            bin,
            &kubeconfig,
            kcm_port,
            &pki,
            &logs,
        )?);
        let sched_port = free_port()?;
        processes.push(spawn_component(
            "kube-scheduler",
            Vec::new(),
            bin,
            &kubeconfig,
            sched_port,
            &pki,
            &logs,
        )?);
        let mut cluster = LocalCluster {
            processes,
            apiserver,
            root: root.clone(),
            delete_on_drop: false,
            kubeconfig,
            server,
            ca_pem: pki.ca_pem,
            client,
            _etcd_data: etcd_data,
        };
        // 6. Both healthy, and the default ServiceAccount's token issued.
        let started = Instant::now();
        cluster
            .wait_components_healthy(kcm_port, sched_port, deadline)
            .await?;
        cluster.wait_default_service_account_token(deadline).await?;
        tracing::info!(elapsed = ?started.elapsed(), "controller manager and scheduler ready");
        // 7. The CRDs the tests use.
        cluster.install_crds(&opts.crds).await?;
        Ok(cluster)
    }

    /// Waits until the controller manager's and the scheduler's `/healthz` report ok.
    async fn wait_components_healthy(
        &mut self,
        kcm_port: u16,
        sched_port: u16,
        deadline: Duration,
    ) -> Result<(), TestkitError> {
        let http = crate::http::client(Some(&self.ca_pem))?;
        for (idx, port, name) in [
            (KCM_PROCESS, kcm_port, "kube-controller-manager"),
            (SCHEDULER_PROCESS, sched_port, "kube-scheduler"),
        ] {
            let url = format!("https://127.0.0.1:{port}/healthz");
            let proc = &mut self.processes[idx];
            wait_process(
                proc,
                &format!("{name} /healthz to report ok"),
                deadline,
                || {
                    let http = http.clone();
                    let url = url.clone();
                    async move {
                        let resp = http.get(&url).send().await.ok()?;
                        resp.status().is_success().then_some(())
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Pods cannot be created until the token controller has given the default ServiceAccount
    /// its token secret (Kubernetes < 1.24 admission requires it).
    async fn wait_default_service_account_token(
        &mut self,
        deadline: Duration,
    ) -> Result<(), TestkitError> {
        let sa: Api<ServiceAccount> = Api::namespaced(self.client.clone(), "default");
        let kcm_proc = &mut self.processes[KCM_PROCESS];
        wait_process(
            kcm_proc,
            "the default ServiceAccount and its token (kube-controller-manager)",
            deadline,
            || {
                let sa = sa.clone();
                async move {
                    let acct = sa.get_opt("default").await.ok()??;
                    acct.secrets.filter(|s| !s.is_empty()).map(|_| ())
                }
            },
        )
        .await
    }

    /// A client authenticated as cluster admin.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub fn log_dir(&self) -> PathBuf {
        self.dir().join("logs")
    }

    /// Errors naming the first component that has exited, with its log.
    pub fn ensure_running(&mut self) -> Result<(), TestkitError> {
        self.processes
            .iter_mut()
            .try_for_each(|p| p.ensure_running())
    }

    /// Stops kube-apiserver alone (SIGTERM, then SIGKILL after 5 s) and waits until it has
    /// exited. etcd, the controller manager and the scheduler keep running, and so does every
    /// client: an API server outage. [`LocalCluster::start_apiserver`] brings it back.
    pub fn stop_apiserver(&mut self) {
        if let Some(apiserver) = self.processes.get_mut(APISERVER) {
            apiserver.stop();
            tracing::info!("kube-apiserver stopped");
        }
    }

    /// Starts kube-apiserver again with the flags it first had — the same port, certificates,
    /// token file and etcd, so every client's kubeconfig still works and every object is
    /// still there — and waits until its `/readyz` reports ok. Its log is
    /// `kube-apiserver-<n>.log` (n = 2, 3 … for each restart).
    pub async fn start_apiserver(&mut self) -> Result<(), TestkitError> {
        let logs = self.log_dir();
        if let Some(running) = self.processes.get_mut(APISERVER)
            && running.ensure_running().is_ok()
        {
            return Err(other(
                "starting kube-apiserver",
                "it is running; stop it first (LocalCluster::stop_apiserver)",
            ));
        }
        self.apiserver.starts += 1;
        let mut apiserver = self.apiserver.spawn(&logs)?;
        let started = Instant::now();
        let ready =
            wait_apiserver_ready(&mut apiserver, &self.client, Duration::from_secs(60)).await;
        // Kept either way: it is stopped by PID when the cluster drops.
        if let Some(slot) = self.processes.get_mut(APISERVER) {
            *slot = apiserver;
        }
        ready?;
        tracing::info!(elapsed = ?started.elapsed(), "kube-apiserver ready again");
        Ok(())
    }

    /// Writes a kubeconfig that authenticates as ServiceAccount `namespace/name`, with a token
    /// from the TokenRequest API (valid one day), so a component can run with exactly the
    /// permissions its RBAC grants. The ServiceAccount must exist.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, TestkitError> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(86_400),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                other(
                    &format!("requesting a token for ServiceAccount {namespace}/{name}"),
                    e,
                )
            })?;
        let token = issued.status.map(|s| s.token).ok_or_else(|| {
            other(
                &format!("requesting a token for ServiceAccount {namespace}/{name}"),
                "no token in the answer",
            )
        })?;
        let path = self.dir().join(format!("kubeconfig-{namespace}-{name}"));
        write_kubeconfig(&path, &self.server, &self.ca_pem, &token)?;
        Ok(path)
    }

    /// Applies CRDs (server-side apply), then waits until each is Established and its
    /// resource is served: listed by discovery (`/apis/<group>/<version>`) and answering a
    /// list. (Established comes first: for a moment after it, the resource still answers 404
    /// and discovery does not list it yet.)
    pub async fn install_crds(
        &self,
        crds: &[CustomResourceDefinition],
    ) -> Result<(), TestkitError> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut names = Vec::new();
        for crd in crds {
            let name = crd
                .metadata
                .name
                .clone()
                .ok_or_else(|| other("installing CRD", "CRD has no name"))?;
            api.patch(
                &name,
                &PatchParams::apply("hostcycle-testkit").force(),
                &Patch::Apply(crd),
            )
            .await
            .map_err(|e| other(&format!("applying CRD {name}"), e))?;
            names.push(name);
        }
        for (crd, name) in crds.iter().zip(&names) {
            crate::wait_until(
                &format!("CRD {name} to be Established"),
                Duration::from_secs(30),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move {
                        let crd = api.get(&name).await.ok()?;
                        let established = crd
                            .status?
                            .conditions?
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True");
                        established.then_some(())
                    }
                },
            )
            .await?;
            let Some(version) = crd
                .spec
                .versions
                .iter()
                .find(|v| v.served && v.storage)
                .or_else(|| crd.spec.versions.iter().find(|v| v.served))
            else {
                continue;
            };
            let group = &crd.spec.group;
            let api_version = format!("{group}/{}", version.name);
            let resource = kube::discovery::ApiResource {
                group: group.clone(),
                version: version.name.clone(),
                api_version: api_version.clone(),
                kind: crd.spec.names.kind.clone(),
                plural: crd.spec.names.plural.clone(),
            };
            let objects: Api<kube::api::DynamicObject> =
                Api::all_with(self.client.clone(), &resource);
            crate::wait_until(
                &format!("{} ({api_version}) to be served", resource.plural),
                Duration::from_secs(30),
                || {
                    let client = self.client.clone();
                    let objects = objects.clone();
                    let api_version = api_version.clone();
                    let plural = resource.plural.clone();
                    async move {
                        let listed = client.list_api_group_resources(&api_version).await.ok()?;
                        if !listed.resources.iter().any(|r| r.name == plural) {
                            return None;
                        }
                        objects
                            .list_metadata(&kube::api::ListParams::default().limit(1))
                            .await
                            .ok()
                            .map(|_| ())
                    }
                },
            )
            .await?;
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop();
        }
        if self.delete_on_drop {
            if std::thread::panicking() {
                eprintln!(
                    "local cluster logs kept in {}",
                    self.root.join("logs").display()
                );
            } else {
                let _ = std::fs::remove_dir_all(&self.root);
            }
        }
    }
}

/// Where kube-apiserver is in [`LocalCluster::processes`] (after etcd).
const APISERVER: usize = 1;

/// The program and flags kube-apiserver was started with.
struct ApiServerLaunch {
    program: PathBuf,
    args: Vec<String>,
    /// How many times it was started (names the log of each start).
    starts: usize,
}

impl ApiServerLaunch {
    fn spawn(&self, logs: &Path) -> Result<ManagedProcess, TestkitError> {
        let mut command = std::process::Command::new(&self.program);
        command.args(&self.args);
        let name = match self.starts {
            1 => "kube-apiserver".to_string(),
            n => format!("kube-apiserver-{n}"),
        };
        ManagedProcess::spawn(&name, command, logs)
    }
}

/// Waits until kube-apiserver's `/readyz` reports ok (failing at once if it exits).
async fn wait_apiserver_ready(
    apiserver: &mut ManagedProcess,
    client: &Client,
    timeout: Duration,
) -> Result<(), TestkitError> {
    wait_process(
        apiserver,
        "kube-apiserver /readyz to report ok",
        timeout,
        || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client
                    .request_text(req)
                    .await
                    .ok()
                    .filter(|t| t.trim() == "ok")
                    .map(|_| ())
            }
        },
    )
    .await
}

/// The controller manager's and the scheduler's places in [`LocalCluster::processes`] (after
/// etcd and the API server).
const KCM_PROCESS: usize = 2;
const SCHEDULER_PROCESS: usize = 3;

/// The files of a local cluster's PKI, and what its kubeconfig needs.
struct ClusterPki {
    dir: PathBuf,
    ca_pem: String,
    ca_file: PathBuf,
    serving: pki::PemFiles,
    sa_key_file: PathBuf,
    sa_pub_file: PathBuf,
    token: String,
    token_file: PathBuf,
}

impl ClusterPki {
    /// One CA, one serving cert for all components, a service-account signing key and an
    /// admin token, written to `dir`.
    fn write(dir: &Path) -> Result<ClusterPki, TestkitError> {
        std::fs::create_dir_all(dir).map_err(io_err("creating pki dir"))?;
        let ca = TestCa::new("hostcycle-local-ca")?;
        let ca_pem = ca.cert_pem();
        let ca_file = dir.join("ca.crt");
        pki::write_private(&ca_file, &ca_pem)?;
        let serving = ca.write_server_cert(
            dir,
            "serving",
            &[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "10.0.0.1",
            ],
        )?;
        let (sa_key, sa_pub) = pki::key_pair_pem()?;
        let sa_key_file = dir.join("sa.key");
        let sa_pub_file = dir.join("sa.pub");
        pki::write_private(&sa_key_file, &sa_key)?;
        pki::write_private(&sa_pub_file, &sa_pub)?;
        let token = random_token();
        let token_file = dir.join("tokens.csv");
        pki::write_private(
            &token_file,
            &format!("{token},admin,admin,\"system:masters\"\n"),
        )?;
        Ok(ClusterPki {
            dir: dir.to_path_buf(),
            ca_pem,
            ca_file,
            serving,
            sa_key_file,
            sa_pub_file,
            token,
            token_file,
        })
    }
}

/// etcd's client and peer ports and the API server's.
struct ClusterPorts {
    etcd: u16,
    etcd_peer: u16,
    api: u16,
}

impl ClusterPorts {
    fn pick(opts: &ClusterOptions) -> Result<ClusterPorts, TestkitError> {
        let etcd = free_port()?;
        let etcd_peer = free_port()?;
        let api = match opts.apiserver_port {
            Some(p) => p,
            None => free_port()?,
        };
        Ok(ClusterPorts {
            etcd,
            etcd_peer,
            api,
        })
    }
}

/// etcd keeps its data in tmpfs when available: fsync there is free, which keeps large-fleet
/// tests fast without an unsafe etcd flag. The directory starts empty; stale ones of earlier
/// runs are pruned.
fn etcd_data_dir(root: &Path, api_port: u16) -> RemoveOnDrop {
    let root_name = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let etcd_data =
        RemoveOnDrop(shm_or(root).join(format!("hostcycle-etcd-{root_name}-{api_port}")));
    let _ = std::fs::remove_dir_all(&etcd_data.0);
    prune_stale_etcd_dirs(&shm_or(root));
    etcd_data
}

/// Starts etcd on `ports` and waits until it accepts connections.
async fn start_etcd(
    etcd_bin: &Path,
    data: &RemoveOnDrop,
    ports: &ClusterPorts,
    logs: &Path,
    deadline: Duration,
) -> Result<ManagedProcess, TestkitError> {
    let (etcd_port, etcd_peer_port) = (ports.etcd, ports.etcd_peer);
    let mut etcd = std::process::Command::new(etcd_bin);
    etcd.args(["--name", "default", "--data-dir"])
        .arg(&data.0)
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{etcd_peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{etcd_peer_port}"),
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{etcd_peer_port}"),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]);
    let mut etcd = ManagedProcess::spawn("etcd", etcd, logs)?;
    let started = Instant::now();
    wait_tcp(&mut etcd, etcd_port, deadline).await?;
    tracing::info!(elapsed = ?started.elapsed(), port = etcd_port, "etcd ready");
    Ok(etcd)
}

/// How kube-apiserver starts: TLS, token auth, RBAC, on etcd, plus the caller's extra flags.
fn apiserver_launch(
    opts: &ClusterOptions,
    bin: &Path,
    ports: &ClusterPorts,
    pki: &ClusterPki,
) -> ApiServerLaunch {
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={}", ports.api),
        "--insecure-port=0".into(),
        format!("--tls-cert-file={}", pki.serving.cert.display()),
        format!("--tls-private-key-file={}", pki.serving.key.display()),
        format!("--client-ca-file={}", pki.ca_file.display()),
        format!("--token-auth-file={}", pki.token_file.display()),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-key-file={}", pki.sa_pub_file.display()),
        format!(
            "--service-account-signing-key-file={}",
            pki.sa_key_file.display()
        ),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        // The kubernetes Service cannot point at a loopback address; we do not need it.
        "--endpoint-reconciler-type=none".into(),
        format!(
            "--default-unreachable-toleration-seconds={}",
            opts.default_unreachable_toleration.as_secs()
        ),
        format!(
            "--default-not-ready-toleration-seconds={}",
            opts.default_unreachable_toleration.as_secs()
        ),
        format!("--cert-dir={}", pki.dir.display()),
        "--profiling=false".into(),
    ];
    args.extend(opts.extra_apiserver_args.iter().cloned());
    ApiServerLaunch {
        program: bin.join("kube-apiserver"),
        args,
        starts: 1,
    }
}

/// Waits until the API server (the last process started) answers through `client`.
async fn wait_apiserver_started(
    processes: &mut [ManagedProcess],
    client: &Client,
    server: &str,
    deadline: Duration,
) -> Result<(), TestkitError> {
    let started = Instant::now();
    let api_proc = processes
        .last_mut()
        .ok_or_else(|| other("cluster", "no api server process"))?;
    wait_apiserver_ready(api_proc, client, deadline).await?;
    tracing::info!(elapsed = ?started.elapsed(), %server, "kube-apiserver ready");
    Ok(())
}

/// kube-controller-manager's own flags: every controller (node lifecycle included), at the
/// options' node-monitor grace period.
fn controller_manager_args(opts: &ClusterOptions, pki: &ClusterPki) -> Vec<String> {
    vec![
        format!(
            "--service-account-private-key-file={}",
            pki.sa_key_file.display()
        ),
        format!("--root-ca-file={}", pki.ca_file.display()),
        "--controllers=*".into(),
        "--use-service-account-credentials=false".into(),
        format!(
            "--node-monitor-grace-period={}s",
            opts.node_monitor_grace_period.as_secs().max(2)
        ),
        "--node-monitor-period=1s".into(),
        "--allocate-node-cidrs=false".into(),
    ]
}

/// Starts the control-plane component `name` (a binary in `bin`) on `port` with the common
/// flags and its own `args`.
fn spawn_component(
    name: &str,
    args: Vec<String>,
    bin: &Path,
    kubeconfig: &Path,
    port: u16,
    pki: &ClusterPki,
    logs: &Path,
) -> Result<ManagedProcess, TestkitError> {
    let mut command = std::process::Command::new(bin.join(name));
    command
        .args(component_common_args(kubeconfig, port, &pki.serving))
        .args(args);
    ManagedProcess::spawn(name, command, logs)
}

fn component_common_args(kubeconfig: &Path, port: u16, serving: &pki::PemFiles) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--port=0".into(),
        "--leader-elect=false".into(),
        format!("--tls-cert-file={}", serving.cert.display()),
        format!("--tls-private-key-file={}", serving.key.display()),
    ]
}

/// Removes etcd data dirs in `dir` that no running process uses and that are older than two
/// minutes (left by a killed test).
fn prune_stale_etcd_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let in_use: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .filter(|c| c.contains("hostcycle-etcd-"))
        .collect();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // A dir younger than two minutes may belong to an etcd that is starting right now.
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(120));
        if name.starts_with("hostcycle-etcd-")
            && old
            && !in_use.iter().any(|c| c.contains(&*path.to_string_lossy()))
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn shm_or(fallback: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempfile_in(shm).is_ok() {
        shm.to_path_buf()
    } else {
        fallback.to_path_buf()
    }
}

fn random_token() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    token: &str,
) -> Result<(), TestkitError> {
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hostcycle\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_data}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: hostcycle\n  context:\n    cluster: hostcycle\n    user: admin\ncurrent-context: hostcycle\n"
    );
    pki::write_private(path, &text)
}

/// A kube client for a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, TestkitError> {
    let kc = Kubeconfig::read_from(path)
        .map_err(|e| other(&format!("reading kubeconfig {}", path.display()), e))?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| other(&format!("loading kubeconfig {}", path.display()), e))?;
    // As the operator's client (see `hostcycle_operator::client_config`): a 429 from an
    // eviction is a PodDisruptionBudget's answer, not something to retry blindly.
    config.default_retry = false;
    Client::try_from(config).map_err(|e| other("building Kubernetes client", e))
}

async fn wait_tcp(
    proc: &mut ManagedProcess,
    port: u16,
    timeout: Duration,
) -> Result<(), TestkitError> {
    let what = format!("{} to listen on 127.0.0.1:{port}", proc.name());
    wait_process(proc, &what, timeout, || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
}

/// Like `wait_until`, but fails at once with the component's log if it exits meanwhile.
pub async fn wait_process<T, F, Fut>(
    proc: &mut ManagedProcess,
    what: &str,
    timeout: Duration,
    mut poll: F,
) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let what = format!("{what} (log: {})", proc.log_path().display());
    crate::process::wait_until_fallible(&what, timeout, || {
        let running = proc.ensure_running();
        let next = poll();
        async move {
            running?;
            Ok(next.await)
        }
    })
    .await
}
