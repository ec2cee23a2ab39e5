//! The webhook's HTTPS server: rustls with ring, HTTP/1.1 (hyper), `POST
//! /validate-baremetalhost`, `GET /healthz`, `GET /metrics`; and a plain-HTTP probe port
//! (`GET /healthz`, `GET /readyz`) of its own, so the kubelet's probes never queue behind
//! reviews.
//!
//! Staying up under abuse (anything in the cluster can reach the review port: the API
//! server is not a pod, so it cannot be singled out):
//! - a connection must finish its TLS handshake and send a complete request header within
//!   `header_timeout` of connecting, or it is closed: a silent socket holds nothing for long;
//! - at most `max_connections` are open; at the limit, a new connection replaces the oldest
//!   one that is not serving a request (first those that never sent one, then idle
//!   keep-alive ones), and is closed at once when every one is serving a request — refused,
//!   never left in the listen backlog;
//! - request bodies being received share a budget of `max_concurrent_reviews` ×
//!   `max_body_bytes`, taken as bytes arrive (a slow sender holds only what it sent), and at
//!   most `max_concurrent_reviews` reviews are parsed and decided at once, off the async
//!   workers; a review that gets neither within [`OVERLOAD_WAIT`] is answered HTTP 503;
//! - bodies have a size limit and a deadline; an idle keep-alive connection is closed after
//!   `idle_timeout`, longer than the API server's own (90 s), so the client closes idle
//!   connections first and never posts onto one being closed.
//!
//! The certificate files are read again every `tls_reload_interval` and swapped in when they
//! changed (cert-manager rotation); a pair that does not load (a key not matching the
//! certificate while the files are being replaced) keeps the previous one in use.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::decide::{Verdict, decide_review};
use crate::metrics::WebhookMetrics;
use crate::policy::Policy;
use crate::review::{AdmissionReviewResponse, KIND, read_review};
use crate::{VALIDATE_PATH, review};

/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// How long in-flight requests get to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a review waits for body budget or a decision slot before HTTP 503: a burst from
/// the API server rides it out, a flood is refused well within the API server's 5 s.
pub const OVERLOAD_WAIT: Duration = Duration::from_secs(1);
/// Probe connections served at once (the kubelet makes one per probe); more are closed.
const PROBE_CONNECTIONS: usize = 8;
/// How long a probe connection may take to send its request and get the answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub listen: SocketAddr,
    /// Where to serve the plain-HTTP probes (`/healthz`, `/readyz`); `None`: nowhere (the
    /// review port's own `/healthz` still answers).
    pub probe_listen: Option<SocketAddr>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Largest request body accepted (HTTP 413 beyond).
    pub max_body_bytes: usize,
    /// Deadline to receive a request's body (HTTP 408 beyond).
    pub request_timeout: Duration,
    /// How often the certificate files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Connections open at once on the review port (see the module's notes for what happens
    /// at the limit).
    pub max_connections: usize,
    /// A new connection must finish its TLS handshake and send a complete request header
    /// within this long, or it is closed.
    pub header_timeout: Duration,
    /// An idle keep-alive connection (or one sending a later request's headers this slowly)
    /// is closed after this long.
    pub idle_timeout: Duration,
    /// Reviews parsed and decided at once; bodies being received share a budget of this
    /// many times `max_body_bytes`.
    pub max_concurrent_reviews: usize,
}

impl ServerOptions {
    pub fn new(listen: SocketAddr, cert_file: PathBuf, key_file: PathBuf) -> Self {
        ServerOptions {
            listen,
            probe_listen: None,
            cert_file,
            key_file,
            max_body_bytes: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            tls_reload_interval: Duration::from_secs(10),
            max_connections: 256,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            max_concurrent_reviews: 8,
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
    /// The bound probe address, when probes are served.
    pub probe_addr: Option<SocketAddr>,
    /// Ends after `shutdown` fired and in-flight requests finished (or their grace ran out).
    pub task: tokio::task::JoinHandle<()>,
}

/// Binds, then serves until `shutdown` fires. Fails at once when the certificate does not
/// load or an address cannot be bound.
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
    let probe_listener = match options.probe_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for probes on {addr}"))?,
        ),
        None => None,
    };
    let probe_addr = probe_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .context("reading the bound probe address")?;

    spawn_reloader(
        certs,
        options.tls_reload_interval,
        app.clone(),
        shutdown.clone(),
    );
    let ready = Arc::new(AtomicBool::new(true));
    // The probes outlive the review port's drain, saying "not ready" meanwhile.
    let probes_stop = CancellationToken::new();
    let probes = probe_listener
        .map(|listener| tokio::spawn(serve_probes(listener, ready.clone(), probes_stop.clone())));

    let shared = Arc::new(Shared {
        app,
        options: options.clone(),
        body_budget: Arc::new(Semaphore::new(
            options
                .max_concurrent_reviews
                .max(1)
                .saturating_mul(options.max_body_bytes.max(1))
                .min(Semaphore::MAX_PERMITS),
        )),
        decisions: Arc::new(Semaphore::new(options.max_concurrent_reviews.max(1))),
        connections: Connections::new(options.max_connections.max(1)),
    });
    let task = tokio::spawn(async move {
        let mut tasks = JoinSet::new();
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                // Reap finished connection tasks as they end.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
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
            let Some(slot) = Connections::admit(&shared) else {
                // Every connection is serving a request: refuse now rather than queue.
                shared.app.metrics.closed("refused");
                tracing::debug!(%peer, "connection refused: every slot is serving a request");
                drop(tcp);
                continue;
            };
            let (acceptor, shared, shutdown) = (acceptor.clone(), shared.clone(), shutdown.clone());
            tasks.spawn(async move {
                serve_connection(tcp, peer, acceptor, slot, &shared, shutdown).await;
            });
        }
        ready.store(false, Ordering::Relaxed);
        drop(listener);
        let drained = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("connections still open after the shutdown grace period");
        }
        probes_stop.cancel();
        if let Some(probes) = probes {
            let _ = probes.await;
        }
    });
    Ok(Running {
        local_addr,
        probe_addr,
        task,
    })
}

/// What every connection task shares.
struct Shared {
    app: Arc<App>,
    options: ServerOptions,
    /// Bytes of request bodies being received, at most `max_concurrent_reviews` ×
    /// `max_body_bytes`.
    body_budget: Arc<Semaphore>,
    /// Reviews being parsed and decided.
    decisions: Arc<Semaphore>,
    connections: Connections,
}

/// No complete request header yet.
const WAITING: u8 = 0;
/// Between requests (keep-alive).
const IDLE: u8 = 1;
/// Serving a request.
const BUSY: u8 = 2;

/// The open connections of the review port, oldest first, and what each is doing.
struct Connections {
    max: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: BTreeMap<u64, SlotState>,
}

#[derive(Clone)]
struct SlotState {
    state: Arc<AtomicU8>,
    evict: CancellationToken,
}

/// One connection's place; leaving it (dropping) frees it.
struct Slot {
    id: u64,
    owner: Arc<Shared>,
    shared: SlotState,
}

impl Connections {
    fn new(max: usize) -> Self {
        Connections {
            max,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection: a free one, or the oldest connection's that is not
    /// serving a request (those that never sent one first); `None` when every one is.
    fn admit(owner: &Arc<Shared>) -> Option<Slot> {
        let (this, metrics) = (&owner.connections, &owner.app.metrics);
        let mut table = this.lock();
        if table.open.len() >= this.max {
            let victim = [WAITING, IDLE].into_iter().find_map(|wanted| {
                table
                    .open
                    .iter()
                    .find(|(_, slot)| slot.state.load(Ordering::Relaxed) == wanted)
                    .map(|(id, _)| *id)
            })?;
            if let Some(evicted) = table.open.remove(&victim) {
                evicted.evict.cancel();
                metrics.closed("evicted");
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let shared = SlotState {
            state: Arc::new(AtomicU8::new(WAITING)),
            evict: CancellationToken::new(),
        };
        table.open.insert(id, shared.clone());
        metrics.open_connections.set(table.open.len() as i64);
        drop(table);
        Some(Slot {
            id,
            owner: owner.clone(),
            shared,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.owner.connections.lock();
        table.open.remove(&self.id);
        self.owner
            .app
            .metrics
            .open_connections
            .set(table.open.len() as i64);
    }
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
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    slot: Slot,
    shared: &Arc<Shared>,
    shutdown: CancellationToken,
) {
    let options = &shared.options;
    // The whole way to a first request header — handshake included — has one deadline.
    let deadline = Instant::now() + options.header_timeout;
    let evict = slot.shared.evict.clone();
    let state = slot.shared.state.clone();
    let tls = tokio::select! {
        handshake = tokio::time::timeout_at(deadline, acceptor.accept(tcp)) => match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                shared.app.metrics.closed("no_request");
                tracing::debug!(%peer, "TLS handshake not done within the header timeout");
                return;
            }
        },
        _ = evict.cancelled() => return,
        _ = shutdown.cancelled() => return,
    };
    let service = {
        let (shared, state) = (shared.clone(), state.clone());
        service_fn(move |request| {
            let (shared, state) = (shared.clone(), state.clone());
            async move {
                state.store(BUSY, Ordering::Relaxed);
                let response = handle(&shared, request).await;
                state.store(IDLE, Ordering::Relaxed);
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.idle_timeout);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    let first_header = tokio::time::sleep_until(deadline);
    tokio::pin!(first_header);
    let mut waiting_for_first = true;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = &mut first_header, if waiting_for_first => {
                if state.load(Ordering::Relaxed) == WAITING {
                    shared.app.metrics.closed("no_request");
                    tracing::debug!(%peer, "no complete request header within the header timeout");
                    return;
                }
                waiting_for_first = false;
            }
            _ = evict.cancelled() => {
                // Made room for a newer connection: it was not serving a request.
                if state.load(Ordering::Relaxed) == WAITING {
                    return;
                }
                break;
            }
            _ = shutdown.cancelled() => break,
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
    drop(slot);
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
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let app = &shared.app;
    let path = request.uri().path().to_string();
    let response = match (request.method(), path.as_str()) {
        (&Method::POST, VALIDATE_PATH) => review_request(shared, request).await,
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

/// Why a body was not received.
enum BodyError {
    TooLarge,
    Timeout,
    Overloaded,
    Read(hyper::Error),
}

/// Receives a body within the size limit and the deadline, taking budget for its bytes as
/// they arrive; the permit returned holds them until the review is answered.
async fn receive_body(
    shared: &Shared,
    declared: Option<u64>,
    mut body: Incoming,
) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), BodyError> {
    let max = shared.options.max_body_bytes;
    if declared.is_some_and(|length| length > max as u64) {
        return Err(BodyError::TooLarge);
    }
    let deadline = Instant::now() + shared.options.request_timeout;
    // The declared length, once: no doubling copies. Pages are only touched as bytes arrive.
    let mut bytes = Vec::with_capacity(declared.map_or(0, |length| length as usize));
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > max {
            return Err(BodyError::TooLarge);
        }
        let Ok(count) = u32::try_from(data.len()) else {
            return Err(BodyError::TooLarge);
        };
        let wait = OVERLOAD_WAIT.min(deadline.saturating_duration_since(Instant::now()));
        let permit =
            match tokio::time::timeout(wait, shared.body_budget.clone().acquire_many_owned(count))
                .await
            {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) | Err(_) => return Err(BodyError::Overloaded),
            };
        match held.as_mut() {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        bytes.extend_from_slice(&data);
    }
    Ok((bytes, held))
}

async fn review_request(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let app = &shared.app;
    let limits = &shared.options;
    let bad_request = |status: StatusCode, message: String| {
        app.metrics.review("none", "bad_request");
        tracing::warn!(status = status.as_u16(), %message, "refused a request that is not a usable AdmissionReview");
        text(status, message)
    };
    let overloaded = |what: &str| {
        app.metrics.review("none", "overloaded");
        tracing::warn!(
            "refused a review: the webhook is overloaded ({what}); the API server applies the failurePolicy"
        );
        let mut response = text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the webhook is overloaded: {what} (at most {} reviews at once); retry",
                limits.max_concurrent_reviews
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        response
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (bytes, budget) = match receive_body(shared, declared, request.into_body()).await {
        Ok(received) => received,
        Err(BodyError::TooLarge) => {
            return bad_request(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {} bytes", limits.max_body_bytes),
            );
        }
        Err(BodyError::Timeout) => {
            return bad_request(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {:?}",
                    limits.request_timeout
                ),
            );
        }
        Err(BodyError::Read(e)) => {
            return bad_request(StatusCode::BAD_REQUEST, format!("reading the body: {e}"));
        }
        Err(BodyError::Overloaded) => return overloaded("too many request bodies arriving"),
    };
    let decision =
        match tokio::time::timeout(OVERLOAD_WAIT, shared.decisions.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return overloaded("too many reviews being decided"),
        };
    // Parsing a large body takes milliseconds: off the async workers, so accepting,
    // handshakes and probes never wait for it.
    let app_for_decision = app.clone();
    let decided = tokio::task::spawn_blocking(move || {
        let _held = (decision, budget);
        let parsed = read_review(&bytes)?;
        drop(bytes);
        let verdict = decide_review(&app_for_decision.policy, &parsed);
        Ok::<_, review::ReviewError>((parsed, verdict))
    })
    .await;
    let (parsed, verdict) = match decided {
        Ok(Ok(decided)) => decided,
        Ok(Err(e)) => return bad_request(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("deciding the review failed: {e}"),
            );
        }
    };
    let request = &parsed.request;
    log_verdict(request, &verdict);
    app.metrics
        .review(request.operation.as_str(), verdict.outcome.as_str());
    let answer = AdmissionReviewResponse {
        api_version: parsed.api_version.clone(),
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

/// The probe port: plain HTTP, one request per connection, a few connections at once (more
/// are closed), short deadlines. `/healthz`: the process serves; `/readyz`: it takes reviews
/// (503 from the start of shutdown until the review port has drained).
async fn serve_probes(listener: TcpListener, ready: Arc<AtomicBool>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(PROBE_CONNECTIONS));
    let mut tasks = JoinSet::new();
    loop {
        let (tcp, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a probe connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let ready = ready.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request: Request<Incoming>| {
                let ready = ready.load(Ordering::Relaxed);
                async move {
                    let response = match (request.method(), request.uri().path()) {
                        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
                        (&Method::GET, "/readyz") if ready => text(StatusCode::OK, "ready"),
                        (&Method::GET, "/readyz") => {
                            text(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                        }
                        _ => text(StatusCode::NOT_FOUND, "not found"),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(PROBE_TIMEOUT)
                .keep_alive(false);
            let connection = builder.serve_connection(TokioIo::new(tcp), service);
            let _ = tokio::time::timeout(PROBE_TIMEOUT, connection).await;
        });
    }
    tasks.abort_all();
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
