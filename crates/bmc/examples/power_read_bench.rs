//! Power-state reads per second and peak memory of the Redfish driver watching a large fleet.
//!
//! ```text
//! cargo run --release -p hostcycle-bmc --example power_read_bench -- \
//!     [--systems 1000] [--endpoints 1000] [--concurrency 64] [--seconds 20] [--tls] \
//!     [--pattern continuous|operator] [--steady-ms 60000] [--transition-ms 1000] [--watched 50]
//! ```
//!
//! The process re-runs itself as a fast Redfish stub (a separate process, so its memory is
//! not counted) serving `--systems` systems at `/redfish/v1/Systems/<n>` on `--endpoints`
//! loopback ports (`--endpoints 1000`: one port per system, like a real fleet where every
//! BMC is its own endpoint; `--endpoints 1`: all behind one). Then one driver per system, all
//! made by one `BmcConnector` (shared client), are read round-robin by `--concurrency`
//! workers for `--seconds`. Prints reads/s, latency percentiles and the peak RSS (VmHWM).
//! `--tls` serves HTTPS (certificate from a test CA the drivers are given), as real BMCs do.
//!
//! `--pattern operator` models the operator's polling instead of reading flat out: every
//! system is read once at start (the operator's first reconcile of every host, at
//! `--concurrency` at once), then again `--steady-ms` (plus up to 10 % jitter, as the operator
//! spreads its steady polls) after its previous read, except `--watched` systems being
//! rebooted, each read again `--transition-ms` after its previous read. The connector's idle
//! timeout follows the same rule as the operator's ([`idle_timeout_for_polls`]) unless
//! `--idle-timeout-ms` sets it. It reports steady and watched reads separately, with the new
//! connections (TCP + TLS handshakes) each needed, counted by the stub.
//!
//! The stub is load generation for the benchmark, not a test double.
//!
//! [`idle_timeout_for_polls`]: hostcycle_bmc::idle_timeout_for_polls
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, ConnectorOptions, HostConnectOptions, PowerDriver, PowerState,
    RedfishAuthMode, idle_timeout_for_polls,
};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

#[derive(Debug, Parser)]
struct Args {
    /// Systems in the fleet.
    #[arg(long, default_value_t = 1000)]
    systems: usize,
    /// Loopback ports the systems are spread over (one per system by default).
    #[arg(long, default_value_t = 1000)]
    endpoints: usize,
    /// Reads in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long to measure.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Runtime worker threads of the client (the process being measured).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Measure with glibc's default arenas instead of the one arena `hostcycle operator`
    /// re-executes itself with (`hostcycle_bmc::malloc`).
    #[arg(long)]
    default_malloc: bool,
    /// Idle connections kept per endpoint (default: the connector's default, or the
    /// concurrency when there are fewer endpoints than workers).
    #[arg(long)]
    idle_per_endpoint: Option<usize>,
    /// Serve HTTPS instead of HTTP.
    #[arg(long)]
    tls: bool,
    /// How the systems are read.
    #[arg(long, value_enum, default_value_t = Pattern::Continuous)]
    pattern: Pattern,
    /// `--pattern operator`: the steady poll (the operator's `--steady-poll`), plus up to
    /// 10 % jitter per poll as the operator adds.
    #[arg(long, default_value_t = 60_000)]
    steady_ms: u64,
    /// `--pattern operator`: the transition poll of watched systems (`--transition-poll`).
    #[arg(long, default_value_t = 1000)]
    transition_ms: u64,
    /// `--pattern operator`: systems being rebooted (read every transition poll).
    #[arg(long, default_value_t = 50)]
    watched: usize,
    /// The connector's idle timeout (default: `idle_timeout_for_polls` of the polls with
    /// `--pattern operator`, the connector's default otherwise).
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Internal: run as the Redfish stub.
    #[arg(long, hide = true)]
    serve: bool,
    /// Internal: the stub's certificate and key (PEM files).
    #[arg(long, hide = true, requires = "key")]
    cert: Option<std::path::PathBuf>,
    #[arg(long, hide = true)]
    key: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pattern {
    /// `--concurrency` workers read the systems round-robin, flat out.
    Continuous,
    /// Steady polls of every system plus transition polls of `--watched` ones.
    Operator,
}

const USER: &str = "bench";
const PASSWORD: &str = "bench-password";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.serve {
        // The stub gets one core's worth of threads; the client under test the rest.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        return runtime.block_on(serve(args));
    }
    if !args.default_malloc {
        // As the operator runs: one malloc arena (re-executes once, before any thread).
        let _ = hostcycle_bmc::malloc::reexec_with_one_arena();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

/// A stub process, killed by PID when dropped.
struct Stub {
    child: Child,
    ports: Vec<u16>,
    /// Plain-HTTP port answering with the connections accepted so far on each port.
    control_port: u16,
    /// The CA of the stub's certificate, with `--tls`.
    ca_pem: Option<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Stub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_stub(args: &Args) -> anyhow::Result<Stub> {
    let dir = tempfile::tempdir()?;
    let mut command = Command::new(std::env::current_exe()?);
    command.args([
        "--serve",
        "--systems",
        &args.systems.to_string(),
        "--endpoints",
        &args.endpoints.to_string(),
    ]);
    let mut ca_pem = None;
    if args.tls {
        let ca = hostcycle_testkit::pki::TestCa::new("bench CA")?;
        let files = ca.write_server_cert(dir.path(), "stub", &["127.0.0.1"])?;
        command
            .arg("--cert")
            .arg(&files.cert)
            .arg("--key")
            .arg(&files.key);
        ca_pem = Some(ca.cert_pem());
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the Redfish stub")?;
    let stdout = child.stdout.take().context("stub stdout")?;
    let mut stub = Stub {
        child,
        ports: Vec::new(),
        control_port: 0,
        ca_pem,
        _dir: dir,
    };
    // The stub prints its ports on one line once it listens, then its control port.
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let mut control = String::new();
    stdout.read_line(&mut control)?;
    stub.control_port = control.trim().parse().context("the stub's control port")?;
    stub.ports = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if stub.ports.len() != args.endpoints {
        bail!(
            "the stub reported {} ports, expected {}",
            stub.ports.len(),
            args.endpoints
        );
    }
    Ok(stub)
}

impl Stub {
    /// Connections the stub has accepted so far on each of its ports.
    async fn accepted(&self) -> anyhow::Result<Vec<u64>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.control_port)).await?;
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let (_, body) = response
            .split_once("\r\n\r\n")
            .context("a malformed control response")?;
        let counts: Vec<u64> = body
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        if counts.len() != self.ports.len() {
            bail!("the stub counted {} ports", counts.len());
        }
        Ok(counts)
    }
}

fn system_json(id: usize) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
            "@odata.id": format!("/redfish/v1/Systems/{id}"),
            "Id": id.to_string(),
            "Name": format!("host-{id}"),
            "UUID": format!("00000000-0000-4000-8000-{id:012}"),
            "Manufacturer": "hostcycle bench",
            "PowerState": if id.is_multiple_of(2) { "On" } else { "Off" },
            "Status": { "State": "Enabled", "Health": "OK", "HealthRollUp": "OK" },
            "Boot": { "BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None" },
            "ProcessorSummary": { "Count": 2, "Status": { "State": "Enabled", "Health": "OK" } },
            "MemorySummary": { "TotalSystemMemoryGiB": 256, "Status": { "State": "Enabled", "Health": "OK" } },
            "Actions": { "#ComputerSystem.Reset": {
                "target": format!("/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"]
            }},
            "Links": { "Chassis": [{ "@odata.id": "/redfish/v1/Chassis/1" }], "ManagedBy": [{ "@odata.id": "/redfish/v1/Managers/1" }] },
        })
        .to_string(),
    )
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..args.systems).map(system_json).collect());
    let expected_auth: Arc<str> = Arc::from(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    ));
    let mut listeners = Vec::new();
    for _ in 0..args.endpoints {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    let ports: Vec<String> = listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port().to_string()))
        .collect::<anyhow::Result<_>>()?;
    let tls = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    let accepted: Arc<Vec<AtomicU64>> =
        Arc::new((0..args.endpoints).map(|_| AtomicU64::new(0)).collect());
    let control = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", ports.join(" "));
    println!("{}", control.local_addr()?.port());
    let counts = accepted.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = control.accept().await {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let body: Vec<String> = counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed).to_string())
                .collect();
            let response = format!("HTTP/1.0 200 OK\r\n\r\n{}", body.join(" "));
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    for (index, listener) in listeners.into_iter().enumerate() {
        let bodies = bodies.clone();
        let expected_auth = expected_auth.clone();
        let tls = tls.clone();
        let accepted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted[index].fetch_add(1, Ordering::Relaxed);
                let bodies = bodies.clone();
                let expected_auth = expected_auth.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let response = respond(&request, &bodies, &expected_auth);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let http = http1::Builder::new();
                    let _ = match tls {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(stream) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return,
                        },
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                    };
                });
            }
        });
    }
    std::future::pending::<()>().await;
    Ok(())
}

fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn respond(
    request: &Request<hyper::body::Incoming>,
    bodies: &[Bytes],
    expected_auth: &str,
) -> Response<Full<Bytes>> {
    let status = |code: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = code;
        response
    };
    let authorized = request
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == expected_auth.as_bytes());
    if !authorized {
        return status(StatusCode::UNAUTHORIZED);
    }
    let id = request
        .uri()
        .path()
        .strip_prefix("/redfish/v1/Systems/")
        .and_then(|id| id.parse::<usize>().ok());
    match id.and_then(|id| bodies.get(id)) {
        Some(body) => {
            let mut response = Response::new(Full::new(body.clone()));
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            response
        }
        None => status(StatusCode::NOT_FOUND),
    }
}

/// Latencies in 25 µs buckets up to 100 ms, then 10 ms buckets up to 10 s (fixed memory, so
/// it does not skew the RSS).
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Histogram {
    const FINE_US: u64 = 25;
    const FINE: usize = 4000;
    const COARSE_US: u64 = 10_000;
    const COARSE: usize = 990;

    fn new() -> Self {
        Histogram {
            buckets: (0..Self::FINE + Self::COARSE)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn bucket(latency: Duration) -> usize {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let fine_end = Self::FINE as u64 * Self::FINE_US;
        let bucket = if us < fine_end {
            us / Self::FINE_US
        } else {
            Self::FINE as u64 + (us - fine_end) / Self::COARSE_US
        };
        usize::try_from(bucket).map_or(Self::FINE + Self::COARSE - 1, |b| {
            b.min(Self::FINE + Self::COARSE - 1)
        })
    }

    /// The upper bound of bucket `i`.
    fn upper_bound(i: usize) -> Duration {
        let i = i as u64;
        let fine = Self::FINE as u64;
        if i < fine {
            Duration::from_micros((i + 1) * Self::FINE_US)
        } else {
            Duration::from_micros(fine * Self::FINE_US + (i - fine + 1) * Self::COARSE_US)
        }
    }

    fn record(&self, latency: Duration) {
        self.buckets[Self::bucket(latency)].fetch_add(1, Ordering::Relaxed);
    }

    /// The upper bound of the bucket holding the `p` quantile.
    fn percentile(&self, p: f64) -> Duration {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let target = (total as f64 * p).ceil() as u64;
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= target.max(1) {
                return Self::upper_bound(i);
            }
        }
        Duration::ZERO
    }
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Samples this process's RSS and open file descriptors (one per BMC connection, plus a few)
/// every 100 ms, for their averages and the most descriptors open at once.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    /// The highest RSS sampled after the instant given to [`Sampler::start`].
    rss_kib_max_later: u64,
    count: u64,
    rss_kib_sum: u64,
    fds_sum: u64,
    fds_max: u64,
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

impl Sampler {
    fn start(later: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut samples = Samples::default();
            while !stopped.load(Ordering::Relaxed) {
                let fds = open_fds();
                let rss = status_kib("VmRSS:");
                if Instant::now() >= later {
                    samples.rss_kib_max_later = samples.rss_kib_max_later.max(rss);
                }
                samples.count += 1;
                samples.rss_kib_sum += rss;
                samples.fds_sum += fds;
                samples.fds_max = samples.fds_max.max(fds);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        Sampler { stop, task }
    }

    async fn finish(self) -> anyhow::Result<Samples> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

/// Reads, errors and latencies of one kind of read.
struct Tally {
    reads: AtomicU64,
    errors: AtomicU64,
    histogram: Histogram,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            reads: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            histogram: Histogram::new(),
        }
    }

    async fn read(&self, driver: &dyn PowerDriver) {
        let t = Instant::now();
        match driver.power_state().await {
            Ok(_) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.histogram.record(t.elapsed());
            }
            Err(e) => {
                if self.errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("read error: {e}");
                }
            }
        }
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn print(&self, what: &str, seconds: f64) {
        let ms = |p: f64| self.histogram.percentile(p).as_secs_f64() * 1000.0;
        println!(
            "{what:<15} {} reads ({} errors), {:.0} reads/s, p50 {:.2} ms, p99 {:.2} ms",
            self.reads(),
            self.errors.load(Ordering::Relaxed),
            self.reads() as f64 / seconds,
            ms(0.50),
            ms(0.99)
        );
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    if args.endpoints == 0 || args.systems == 0 || args.concurrency == 0 {
        bail!("--systems, --endpoints and --concurrency must be positive");
    }
    if args.pattern == Pattern::Operator && (args.steady_ms == 0 || args.transition_ms == 0) {
        bail!("--steady-ms and --transition-ms must be positive");
    }
    let stub = start_stub(&args)?;
    let rss_before = status_kib("VmRSS:");
    // With one endpoint for the whole fleet, the per-endpoint limits must not throttle below
    // the concurrency being measured; with one endpoint per system the defaults apply.
    let defaults = ConnectorOptions::default();
    let per_endpoint = if args.endpoints < args.concurrency {
        args.concurrency
    } else {
        defaults.max_requests_per_endpoint
    };
    let idle = args
        .idle_per_endpoint
        .unwrap_or(if args.endpoints < args.concurrency {
            args.concurrency
        } else {
            defaults.idle_connections_per_endpoint
        });
    let steady = Duration::from_millis(args.steady_ms);
    let transition = Duration::from_millis(args.transition_ms);
    let idle_timeout = match (args.idle_timeout_ms, args.pattern) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, Pattern::Operator) => idle_timeout_for_polls(steady, transition),
        (None, Pattern::Continuous) => defaults.idle_timeout,
    };
    let connector = BmcConnector::new(ConnectorOptions {
        max_requests_per_endpoint: per_endpoint,
        idle_connections_per_endpoint: idle,
        idle_timeout,
        ..ConnectorOptions::default()
    });
    let host = HostConnectOptions {
        redfish_auth: RedfishAuthMode::Basic,
        ca_bundle_pem: stub.ca_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
        ..Default::default()
    };
    let scheme = if args.tls { "redfish" } else { "redfish+http" };
    let credentials = BmcCredentials::new(USER, PASSWORD)?;
    let drivers: Vec<Arc<dyn PowerDriver>> = (0..args.systems)
        .map(|id| {
            let port = stub.ports[id % stub.ports.len()];
            connector.connect_str(
                &format!("{scheme}://127.0.0.1:{port}/redfish/v1/Systems/{id}"),
                credentials.clone(),
                &host,
            )
        })
        .collect::<Result<_, _>>()?;
    let drivers = Arc::new(drivers);

    let transport = if args.tls { "HTTPS" } else { "HTTP" };
    println!(
        "systems:        {} on {} endpoint(s), {transport}",
        args.systems, args.endpoints
    );
    println!(
        "connections:    {idle} idle kept per endpoint for {} ms",
        idle_timeout.as_millis()
    );
    match args.pattern {
        Pattern::Continuous => continuous(&args, &stub, drivers).await?,
        Pattern::Operator => operator(&args, &stub, drivers, steady, transition).await?,
    }
    println!("RSS at start:   {:.1} MB", rss_before as f64 / 1024.0);
    println!(
        "RSS at end:     {:.1} MB",
        status_kib("VmRSS:") as f64 / 1024.0
    );
    println!(
        "peak RSS:       {:.1} MB (VmHWM, this process only; the stub is separate)",
        status_kib("VmHWM:") as f64 / 1024.0
    );
    drop(stub);
    Ok(())
}

fn print_samples(samples: &Samples) {
    let n = samples.count.max(1);
    println!(
        "mean RSS:       {:.1} MB (sampled every 100 ms)",
        (samples.rss_kib_sum / n) as f64 / 1024.0
    );
    println!(
        "open fds:       mean {}, max {} (one per BMC connection, plus a few)",
        samples.fds_sum / n,
        samples.fds_max
    );
}

/// `--concurrency` workers read the systems round-robin for `--seconds`.
async fn continuous(
    args: &Args,
    stub: &Stub,
    drivers: Arc<Vec<Arc<dyn PowerDriver>>>,
) -> anyhow::Result<()> {
    // Warm-up: every driver reads once (and every connection is opened).
    for (id, driver) in drivers.iter().enumerate() {
        let expected = if id.is_multiple_of(2) {
            PowerState::On
        } else {
            PowerState::Off
        };
        let state = driver.power_state().await?;
        if state != expected {
            bail!("system {id} read {state}, expected {expected}");
        }
    }

    let rss_after_warm_up = status_kib("VmRSS:");
    let accepted_before: u64 = stub.accepted().await?.iter().sum();
    let sampler = Sampler::start(Instant::now());
    let tally = Arc::new(Tally::new());
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (drivers, next, stop, tally) =
                (drivers.clone(), next.clone(), stop.clone(), tally.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize % drivers.len();
                    tally.read(drivers[i].as_ref()).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let samples = sampler.finish().await?;
    let accepted: u64 = stub.accepted().await?.iter().sum::<u64>() - accepted_before;
    println!(
        "pattern:        continuous, concurrency {}",
        args.concurrency
    );
    println!("duration:       {elapsed:.1} s");
    tally.print("reads:", elapsed);
    println!(
        "new connections: {accepted} while measuring ({:.4} per read)",
        accepted as f64 / tally.reads().max(1) as f64
    );
    println!(
        "RSS warmed up:  {:.1} MB (every driver read once)",
        rss_after_warm_up as f64 / 1024.0
    );
    print_samples(&samples);
    Ok(())
}

/// The operator's polls: every system read at start (at `--concurrency` at once), then
/// `--steady-ms` after its previous read; `--watched` systems `--transition-ms` after it.
async fn operator(
    args: &Args,
    stub: &Stub,
    drivers: Arc<Vec<Arc<dyn PowerDriver>>>,
    steady: Duration,
    transition: Duration,
) -> anyhow::Result<()> {
    let watched = args.watched.min(args.systems);
    let accepted_before = stub.accepted().await?;
    // The start's burst opens a connection to every system at once; after one steady
    // interval the polls have their steady rhythm.
    let sampler = Sampler::start(Instant::now() + steady);
    let permits = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let steady_tally = Arc::new(Tally::new());
    let watched_tally = Arc::new(Tally::new());
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let tasks: Vec<_> = drivers
        .iter()
        .enumerate()
        .map(|(id, driver)| {
            let (driver, permits) = (driver.clone(), permits.clone());
            let (tally, interval) = if id < watched {
                (watched_tally.clone(), transition)
            } else {
                (steady_tally.clone(), steady)
            };
            let mut seed = id as u64 ^ 0x9e37_79b9_7f4a_7c15;
            tokio::spawn(async move {
                loop {
                    // The operator's reconcile concurrency.
                    let Ok(permit) = permits.acquire().await else {
                        return;
                    };
                    tally.read(driver.as_ref()).await;
                    drop(permit);
                    // The operator spreads steady polls by up to 10 %; a cheap deterministic
                    // generator stands in for its random numbers.
                    let jitter = if id < watched {
                        Duration::ZERO
                    } else {
                        seed = seed
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        interval.mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64 / 10.0)
                    };
                    let next = Instant::now() + interval + jitter;
                    if next >= end {
                        return;
                    }
                    tokio::time::sleep_until(next.into()).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let samples = sampler.finish().await?;
    let accepted_after = stub.accepted().await?;
    let endpoints = stub.ports.len();
    let watched_ports: std::collections::BTreeSet<usize> =
        (0..watched).map(|id| id % endpoints).collect();
    let steady_ports: std::collections::BTreeSet<usize> =
        (watched..args.systems).map(|id| id % endpoints).collect();
    let new_on = |ports: &std::collections::BTreeSet<usize>| -> u64 {
        ports
            .iter()
            .map(|&p| accepted_after[p] - accepted_before[p])
            .sum()
    };
    println!(
        "pattern:        operator: {} systems every {} ms, {watched} watched every {} ms; \
         concurrency {}",
        args.systems - watched,
        steady.as_millis(),
        transition.as_millis(),
        args.concurrency
    );
    println!("duration:       {elapsed:.1} s");
    steady_tally.print("steady reads:", elapsed);
    watched_tally.print("watched reads:", elapsed);
    if watched > 0 {
        // A watched system reads once per transition poll plus its latency, at best.
        let ideal = watched as f64 * elapsed / transition.as_secs_f64();
        println!(
            "watched polls:  {:.1} % of one read every {} ms per watched system",
            100.0 * watched_tally.reads() as f64 / ideal,
            transition.as_millis()
        );
    }
    if watched_ports.is_disjoint(&steady_ports) {
        let steady_new = new_on(&steady_ports);
        let watched_new = new_on(&watched_ports);
        println!(
            "new connections: steady {steady_new} ({:.3} per read), watched {watched_new} \
             ({:.4} per read after each system's first)",
            steady_new as f64 / steady_tally.reads().max(1) as f64,
            watched_new.saturating_sub(watched_ports.len() as u64) as f64
                / watched_tally.reads().max(1) as f64
        );
    } else {
        let total: u64 = accepted_after.iter().sum::<u64>() - accepted_before.iter().sum::<u64>();
        println!("new connections: {total} (watched and steady systems share endpoints)");
    }
    print_samples(&samples);
    println!(
        "max RSS later:  {:.1} MB (sampled, after the first steady interval: without the \
         start's burst)",
        samples.rss_kib_max_later as f64 / 1024.0
    );
    Ok(())
}
