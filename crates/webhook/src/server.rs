//! The webhook's HTTPS server: rustls with ring, HTTP/1.1 (hyper), `POST
//! /validate-baremetalhost`, `GET /healthz`, `GET /metrics`.
//!
//! Limits: a bounded number of connections, a TLS handshake deadline, a body size limit and a
//! deadline to receive it, and an idle limit per connection longer than the API server's own
//! (90 s), so the client closes idle connections first and never posts onto one being closed.
//! The certificate files are read again every `tls_reload_interval` and swapped in when they
//! changed (cert-manager rotation); a pair that does not load (a key not matching the
//! certificate while the files are being replaced) keeps the previous one in use.

use std::convert::Infallible;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::decide::{Verdict, decide};
use crate::metrics::WebhookMetrics;
use crate::policy::Policy;
use crate::review::{AdmissionReviewResponse, KIND, parse_review};
use crate::{VALIDATE_PATH, review};

/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// How long a connection may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub listen: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Largest request body accepted (HTTP 413 beyond).
    pub max_body_bytes: usize,
    /// Deadline to receive a request's body (HTTP 408 beyond).
    pub request_timeout: Duration,
    /// How often the certificate files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// An idle keep-alive connection (or one sending its headers this slowly) is closed
    /// after this long.
    pub idle_timeout: Duration,
}

impl ServerOptions {
    pub fn new(listen: SocketAddr, cert_file: PathBuf, key_file: PathBuf) -> Self {
        ServerOptions {
            listen,
            cert_file,
            key_file,
            max_body_bytes: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            tls_reload_interval: Duration::from_secs(10),
            max_connections: 256,
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// What a request needs: the policy and the metrics.
#[derive(Debug)]
pub struct App {
    pub policy: Policy,
    pub metrics: WebhookMetrics,
    pub registry: Registry,
}

impl App {
    pub fn new(policy: Policy) -> Self {
        let mut registry = Registry::default();
        let metrics = WebhookMetrics::register(&mut registry);
        App {
            policy,
            metrics,
            registry,
        }
    }
}

fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_PEM_BYTES,
        "{} is larger than {MAX_PEM_BYTES} bytes",
        path.display()
    );
    Ok(bytes)
}

/// A certificate chain and its key from PEM, checked to belong together.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the certificate PEM")?;
    anyhow::ensure!(!chain.is_empty(), "no certificate in the certificate file");
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("parsing the private key PEM")?;
    CertifiedKey::from_der(chain, key, provider)
        .context("loading the key pair (does the key belong to the certificate?)")
}

struct Loaded {
    key: Arc<CertifiedKey>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

/// The serving certificate, read from its files and re-read when they change.
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl ReloadingCert {
    /// Loads the pair; an error names the file and what is wrong.
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        provider: Arc<CryptoProvider>,
    ) -> anyhow::Result<Self> {
        let cert_pem = read_bounded(cert_file)?;
        let key_pem = read_bounded(key_file)?;
        let key = certified_key(&cert_pem, &key_pem, &provider)
            .with_context(|| format!("{} and {}", cert_file.display(), key_file.display()))?;
        Ok(ReloadingCert {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            current: RwLock::new(Loaded {
                key: Arc::new(key),
                cert_pem,
                key_pem,
            }),
        })
    }

    /// Reads the files again; swaps the pair in and returns `true` when they changed and
    /// load. On an error the previous pair stays in use.
    pub fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let cert_pem = read_bounded(&self.cert_file)?;
        let key_pem = read_bounded(&self.key_file)?;
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.cert_pem == cert_pem && current.key_pem == key_pem {
                return Ok(false);
            }
        }
        let key = certified_key(&cert_pem, &key_pem, &self.provider).with_context(|| {
            format!(
                "{} and {}",
                self.cert_file.display(),
                self.key_file.display()
            )
        })?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Loaded {
            key: Arc::new(key),
            cert_pem,
            key_pem,
        };
        Ok(true)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .key
                .clone(),
        )
    }
}

/// A running server.
#[derive(Debug)]
pub struct Running {
    /// The bound address (the port when `:0` was asked for).
    pub local_addr: SocketAddr,
    /// Ends after `shutdown` fired and in-flight requests finished (or their grace ran out).
    pub task: tokio::task::JoinHandle<()>,
}

/// Binds, then serves until `shutdown` fires. Fails at once when the certificate does not
/// load or the address cannot be bound.
pub async fn serve(
    options: ServerOptions,
    app: Arc<App>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = Arc::new(ReloadingCert::load(
        &options.cert_file,
        &options.key_file,
        provider.clone(),
    )?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(certs.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    let local_addr = listener.local_addr().context("reading the bound address")?;

    spawn_reloader(
        certs,
        options.tls_reload_interval,
        app.clone(),
        shutdown.clone(),
    );

    let connections = Arc::new(Semaphore::new(options.max_connections));
    let task = tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // E.g. out of file descriptors: wait a little instead of spinning.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            let shutdown = shutdown.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let _permit = permit;
                serve_connection(tcp, peer, acceptor, app, options, shutdown).await;
            });
        }
        drop(listener);
        // Every connection task holds a permit: all of them back means all are done.
        let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(
            SHUTDOWN_GRACE + Duration::from_secs(1),
            connections.acquire_many(all),
        )
        .await;
        if drained.is_err() {
            tracing::warn!("connections still open after the shutdown grace period");
        }
    });
    Ok(Running { local_addr, task })
}

fn spawn_reloader(
    certs: Arc<ReloadingCert>,
    every: Duration,
    app: Arc<App>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let certs = certs.clone();
            match tokio::task::spawn_blocking(move || certs.reload_if_changed()).await {
                Ok(Ok(true)) => {
                    app.metrics.reload(true);
                    tracing::info!("serving certificate reloaded");
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    app.metrics.reload(false);
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "serving certificate not reloaded; the previous one stays in use"
                    );
                }
                Err(e) => tracing::warn!(error = %e, "certificate reload task failed"),
            }
        }
    });
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    app: Arc<App>,
    options: ServerOptions,
    shutdown: CancellationToken,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let limits = Limits {
        max_body_bytes: options.max_body_bytes,
        request_timeout: options.request_timeout,
    };
    let service = service_fn(move |request| handle(app.clone(), limits, request));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.idle_timeout);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    max_body_bytes: usize,
    request_timeout: Duration,
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut body = body.into();
    body.push('\n');
    respond(status, "text/plain; charset=utf-8", body)
}

async fn handle(
    app: Arc<App>,
    limits: Limits,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let response = match (request.method(), path.as_str()) {
        (&Method::POST, VALIDATE_PATH) => review_request(&app, limits, request.into_body()).await,
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/metrics") => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &app.registry) {
                Ok(()) => respond(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed"),
            }
        }
        (_, VALIDATE_PATH | "/healthz" | "/metrics") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(response)
}

async fn review_request(app: &App, limits: Limits, body: Incoming) -> Response<Full<Bytes>> {
    let bad_request = |status: StatusCode, message: String| {
        app.metrics.review("none", "bad_request");
        tracing::warn!(status = status.as_u16(), %message, "refused a request that is not a usable AdmissionReview");
        text(status, message)
    };
    let collected = tokio::time::timeout(
        limits.request_timeout,
        Limited::new(body, limits.max_body_bytes).collect(),
    )
    .await;
    let bytes = match collected {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return bad_request(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {} bytes", limits.max_body_bytes),
            );
        }
        Ok(Err(e)) => {
            return bad_request(StatusCode::BAD_REQUEST, format!("reading the body: {e}"));
        }
        Err(_) => {
            return bad_request(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {:?}",
                    limits.request_timeout
                ),
            );
        }
    };
    let (api_version, request) = match parse_review(&bytes) {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let verdict = decide(&app.policy, &request);
    log_verdict(&request, &verdict);
    app.metrics
        .review(request.operation.as_str(), verdict.outcome.as_str());
    let answer = AdmissionReviewResponse {
        api_version,
        kind: KIND,
        response: verdict.response(&request.uid),
    };
    match serde_json::to_vec(&answer) {
        Ok(json) => respond(StatusCode::OK, "application/json", json),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer: {e}"),
        ),
    }
}

fn log_verdict(request: &review::AdmissionRequest, verdict: &Verdict) {
    let host = request.object_name();
    let user = request.user_info.username.as_str();
    let dry_run = request.dry_run.unwrap_or(false);
    let operation = request.operation.as_str();
    if !verdict.is_allowed() {
        tracing::info!(
            %host, %user, operation, dry_run,
            outcome = verdict.outcome.as_str(),
            message = %verdict.message,
            "denied"
        );
    } else if !verdict.changes.is_empty() {
        let changes: Vec<String> = verdict.changes.iter().map(|c| c.to_string()).collect();
        tracing::info!(%host, %user, operation, dry_run, changes = %changes.join(", "), "power request allowed");
    } else {
        tracing::debug!(%host, %user, operation, outcome = verdict.outcome.as_str(), "allowed");
    }
}
