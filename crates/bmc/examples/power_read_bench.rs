//! Power-state reads per second and peak memory of the Redfish driver watching a large fleet.
//!
//! ```text
//! cargo run --release -p hostcycle-bmc --example power_read_bench -- \
//!     [--systems 1000] [--endpoints 1000] [--concurrency 64] [--seconds 20] [--tls]
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
//! The stub is load generation for the benchmark, not a test double.
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
use clap::Parser;
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, ConnectorOptions, HostConnectOptions, PowerDriver, PowerState,
    RedfishAuthMode,
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
    /// Idle connections kept per endpoint (default: the connector's default, or the
    /// concurrency when there are fewer endpoints than workers).
    #[arg(long)]
    idle_per_endpoint: Option<usize>,
    /// Serve HTTPS instead of HTTP.
    #[arg(long)]
    tls: bool,
    /// Internal: run as the Redfish stub.
    #[arg(long, hide = true)]
    serve: bool,
    /// Internal: the stub's certificate and key (PEM files).
    #[arg(long, hide = true, requires = "key")]
    cert: Option<std::path::PathBuf>,
    #[arg(long, hide = true)]
    key: Option<std::path::PathBuf>,
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
        ca_pem,
        _dir: dir,
    };
    // The stub prints its ports on one line once it listens.
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
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
    println!("{}", ports.join(" "));
    for listener in listeners {
        let bodies = bodies.clone();
        let expected_auth = expected_auth.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
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

/// Latencies in 25 µs buckets up to 100 ms (fixed memory, so it does not skew the RSS).
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Histogram {
    const BUCKET_US: u64 = 25;
    const BUCKETS: usize = 4000;

    fn new() -> Self {
        Histogram {
            buckets: (0..Self::BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn record(&self, latency: Duration) {
        let bucket = (latency.as_micros() as u64 / Self::BUCKET_US) as usize;
        self.buckets[bucket.min(Self::BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
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
                return Duration::from_micros((i as u64 + 1) * Self::BUCKET_US);
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

async fn bench(args: Args) -> anyhow::Result<()> {
    if args.endpoints == 0 || args.systems == 0 || args.concurrency == 0 {
        bail!("--systems, --endpoints and --concurrency must be positive");
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
    let connector = BmcConnector::new(ConnectorOptions {
        max_requests_per_endpoint: per_endpoint,
        idle_connections_per_endpoint: idle,
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
    let histogram = Arc::new(Histogram::new());
    let next = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (drivers, next, reads, errors, stop, histogram) = (
                drivers.clone(),
                next.clone(),
                reads.clone(),
                errors.clone(),
                stop.clone(),
                histogram.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize % drivers.len();
                    let t = Instant::now();
                    match drivers[i].power_state().await {
                        Ok(_) => {
                            reads.fetch_add(1, Ordering::Relaxed);
                            histogram.record(t.elapsed());
                        }
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!("read error: {e}");
                            }
                        }
                    }
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
    let percentile = |p: f64| histogram.percentile(p);
    let reads = reads.load(Ordering::Relaxed);
    let peak_kib = status_kib("VmHWM:");
    let transport = if args.tls { "HTTPS" } else { "HTTP" };
    println!(
        "systems:        {} on {} endpoint(s), {transport}",
        args.systems, args.endpoints
    );
    println!(
        "concurrency:    {} (idle connections kept per endpoint: {idle})",
        args.concurrency
    );
    println!("duration:       {elapsed:.1} s");
    println!(
        "reads:          {reads} ({} errors)",
        errors.load(Ordering::Relaxed)
    );
    println!("reads/s:        {:.0}", reads as f64 / elapsed);
    println!(
        "latency p50:    {:.2} ms",
        percentile(0.50).as_secs_f64() * 1000.0
    );
    println!(
        "latency p99:    {:.2} ms",
        percentile(0.99).as_secs_f64() * 1000.0
    );
    println!("RSS at start:   {:.1} MB", rss_before as f64 / 1024.0);
    println!(
        "RSS warmed up:  {:.1} MB (every driver read once)",
        rss_after_warm_up as f64 / 1024.0
    );
    println!(
        "RSS at end:     {:.1} MB",
        status_kib("VmRSS:") as f64 / 1024.0
    );
    println!(
        "peak RSS:       {:.1} MB (VmHWM, this process only; the stub is separate)",
        peak_kib as f64 / 1024.0
    );
    drop(stub);
    Ok(())
}
