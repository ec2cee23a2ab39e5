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
//! - a connection holds at most one body of at most `max_body_bytes` (HTTP/1.1 serves one
//!   request at a time); bodies being received share a budget of `max_concurrent_reviews` ×
//!   `max_body_bytes`, taken as bytes arrive (a sender holds only what it sent), and at most
//!   `max_concurrent_reviews` reviews are parsed and decided at once, off the async workers;
//!   a review that gets neither within [`OVERLOAD_WAIT`] is answered HTTP 503;
//! - a body must arrive at `min_body_rate` after a [`BODY_GRACE`], within `request_timeout`
//!   at most ([`body_deadline_after`]);
//! - the API server sends a review at once, so the budget is kept for bodies that arrive so:
//!   one still arriving after `slow_body_after` is ended (HTTP 408) when a body that needs
//!   budget finds none free ([`slow_bodies_to_end`]), and its connection may be taken by a new
//!   one at the connection limit;
//! - an idle keep-alive connection is closed after `idle_timeout`, longer than the API
//!   server's own (90 s), so the client closes idle connections first and never posts onto
//!   one being closed.
//!
//! The connection limits are [`hostcycle_operator::http_limits`], shared with the operator's
//! metrics and probe ports.
//!
//! The certificate files are read again every `tls_reload_interval` and swapped in when they
//! changed (cert-manager rotation); a pair that does not load (a key not matching the
//! certificate while the files are being replaced) keeps the previous one in use.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use hostcycle_operator::http_limits::{
    Closed, ConnectionEvents, ConnectionLimits, ConnectionTable, Ended, NoEvents,
    PROBE_CONNECTIONS, RequestSlot, Slot, respond, serve_connection as serve_http, serve_plain,
    text,
};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
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
/// How late a body may be on its transfer at `--min-body-rate`: round trips, a busy node.
pub const BODY_GRACE: Duration = Duration::from_secs(1);
/// How often a body waiting for budget looks again for slow bodies to end.
const BUDGET_RECHECK: Duration = Duration::from_millis(50);
/// Largest request header on the review port (the API server's are a few hundred bytes).
const MAX_HEADER_BYTES: usize = 64 * 1024;

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
    /// The longest a request's body may take to arrive (HTTP 408 beyond).
    pub request_timeout: Duration,
    /// Bytes per second a body must arrive at, after [`BODY_GRACE`] (HTTP 408 beyond); 0:
    /// only `request_timeout`.
    pub min_body_rate: u64,
    /// A body still arriving after this long gives its budget up (HTTP 408) to one that
    /// needs it, and its connection may be taken by a new one at the connection limit.
    pub slow_body_after: Duration,
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
            min_body_rate: 1024 * 1024,
            slow_body_after: Duration::from_millis(500),
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
    let probes = probe_listener.map(|listener| {
        let ready = ready.clone();
        tokio::spawn(serve_plain(
            listener,
            PROBE_CONNECTIONS,
            ConnectionLimits::probes(),
            Arc::new(NoEvents),
            move |request| {
                let ready = ready.load(Ordering::Relaxed);
                async move { probe_response(&request, ready) }
            },
            probes_stop.clone(),
        ))
    });

    let shared = Arc::new(Shared {
        app: app.clone(),
        options: options.clone(),
        body_budget: Arc::new(Semaphore::new(
            options
                .max_concurrent_reviews
                .max(1)
                .saturating_mul(options.max_body_bytes.max(1))
                .min(Semaphore::MAX_PERMITS),
        )),
        decisions: Arc::new(Semaphore::new(options.max_concurrent_reviews.max(1))),
        arrivals: Arrivals::default(),
        connections: ConnectionTable::new(
            options.max_connections,
            Arc::new(CountedConnections(app.clone())),
        ),
        limits: ConnectionLimits {
            header_timeout: options.header_timeout,
            idle_timeout: options.idle_timeout,
            keep_alive: true,
            max_header_bytes: MAX_HEADER_BYTES,
            shutdown_grace: SHUTDOWN_GRACE,
        },
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
            let Some(slot) = shared.connections.admit() else {
                // Every connection is serving a request: refuse now rather than queue.
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
    /// Bodies being received: who holds how much budget since when.
    arrivals: Arrivals,
    connections: Arc<ConnectionTable>,
    limits: ConnectionLimits,
}

/// The review port's connections, counted in the webhook's metrics.
struct CountedConnections(Arc<App>);

impl ConnectionEvents for CountedConnections {
    fn open(&self, open: usize) {
        self.0.metrics.open_connections.set(open as i64);
    }

    fn closed(&self, why: Closed) {
        self.0.metrics.closed(why.as_str());
    }
}

/// A body being received, as the budget's arbiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arriving {
    pub id: u64,
    /// When its request header was read.
    pub started: Instant,
    /// Budget it holds, in bytes.
    pub held: usize,
    /// Already told to end (its budget comes free as it does).
    pub ending: bool,
}

/// Which bodies to end so that `needed` more bytes of budget come free for body `asking`:
/// those still arriving `slow_after` after their header (the API server sends a review at
/// once), oldest first, until they and those already ending hold `needed`. Pure: the
/// caller ends them.
pub fn slow_bodies_to_end(
    arriving: &[Arriving],
    needed: usize,
    slow_after: Duration,
    now: Instant,
    asking: u64,
) -> Vec<u64> {
    let mut freeing: usize = arriving
        .iter()
        .filter(|body| body.ending)
        .map(|body| body.held)
        .sum();
    let mut slow: Vec<&Arriving> = arriving
        .iter()
        .filter(|body| {
            !body.ending
                && body.id != asking
                && body.held > 0
                && now.saturating_duration_since(body.started) >= slow_after
        })
        .collect();
    slow.sort_by_key(|body| (body.started, body.id));
    let mut end = Vec::new();
    for body in slow {
        if freeing >= needed {
            break;
        }
        freeing += body.held;
        end.push(body.id);
    }
    end
}

/// How long a body of `length` bytes may take: [`BODY_GRACE`] plus its transfer at
/// `min_rate` bytes per second (0: no rate), at most `cap`.
pub fn body_deadline_after(length: u64, min_rate: u64, cap: Duration) -> Duration {
    if min_rate == 0 {
        return cap;
    }
    // Beyond what a Duration holds, the cap decides.
    Duration::try_from_secs_f64(length as f64 / min_rate as f64)
        .map_or(cap, |transfer| BODY_GRACE.saturating_add(transfer).min(cap))
}

/// The bodies being received.
#[derive(Default)]
struct Arrivals {
    next_id: AtomicU64,
    bodies: Mutex<BTreeMap<u64, ArrivalState>>,
}

struct ArrivalState {
    started: Instant,
    held: Arc<AtomicUsize>,
    end: CancellationToken,
}

/// One body's entry in [`Arrivals`]; dropping it removes the entry.
struct Arrival<'a> {
    id: u64,
    started: Instant,
    arrivals: &'a Arrivals,
    held: Arc<AtomicUsize>,
    /// Fires when the body is to give its budget up.
    end: CancellationToken,
}

impl Arrivals {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ArrivalState>> {
        self.bodies.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin(&self) -> Arrival<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (started, held, end) = (
            Instant::now(),
            Arc::new(AtomicUsize::new(0)),
            CancellationToken::new(),
        );
        self.lock().insert(
            id,
            ArrivalState {
                started,
                held: held.clone(),
                end: end.clone(),
            },
        );
        Arrival {
            id,
            started,
            arrivals: self,
            held,
            end,
        }
    }

    /// Ends the slow bodies [`slow_bodies_to_end`] picks; returns how many.
    fn end_slow(&self, needed: usize, slow_after: Duration, asking: u64) -> usize {
        let bodies = self.lock();
        let arriving: Vec<Arriving> = bodies
            .iter()
            .map(|(id, body)| Arriving {
                id: *id,
                started: body.started,
                held: body.held.load(Ordering::Relaxed),
                ending: body.end.is_cancelled(),
            })
            .collect();
        let end = slow_bodies_to_end(&arriving, needed, slow_after, Instant::now(), asking);
        for id in &end {
            if let Some(body) = bodies.get(id) {
                body.end.cancel();
            }
        }
        end.len()
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.arrivals.lock().remove(&self.id);
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
    let evict = slot.evicted().clone();
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
    let handler = {
        let shared = shared.clone();
        move |request, slot: RequestSlot| {
            let shared = shared.clone();
            async move { handle(&shared, request, slot).await }
        }
    };
    match serve_http(tls, slot, deadline, &shared.limits, handler, &shutdown).await {
        Ended::NoRequest => {
            shared.app.metrics.closed(Closed::NoRequest.as_str());
            tracing::debug!(%peer, "no complete request header within the header timeout");
        }
        Ended::Error(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
        Ended::Done | Ended::Closed => {}
    }
}

async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
    slot: RequestSlot,
) -> Response<Full<Bytes>> {
    let app = &shared.app;
    let path = request.uri().path().to_string();
    match (request.method(), path.as_str()) {
        (&Method::POST, VALIDATE_PATH) => review_request(shared, request, slot).await,
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
    }
}

/// Why a body was not received.
enum BodyError {
    TooLarge,
    Timeout,
    /// Still arriving after `slow_body_after`: its budget went to a body that needed it.
    TooSlow,
    Overloaded,
    Read(hyper::Error),
}

/// Receives a body within the size limit and its deadline, taking budget for its bytes as
/// they arrive; the permit returned holds them until the review is answered.
async fn receive_body(
    shared: &Shared,
    declared: Option<u64>,
    mut body: Incoming,
    slot: &RequestSlot,
) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), BodyError> {
    let options = &shared.options;
    let max = options.max_body_bytes;
    if declared.is_some_and(|length| length > max as u64) {
        return Err(BodyError::TooLarge);
    }
    let arrival = shared.arrivals.begin();
    let deadline = arrival.started
        + body_deadline_after(
            declared.unwrap_or(max as u64),
            options.min_body_rate,
            options.request_timeout,
        );
    let slow_from = arrival.started + options.slow_body_after;
    // The declared length, once: no doubling copies. Pages are only touched as bytes arrive.
    let mut bytes = Vec::with_capacity(declared.map_or(0, |length| length as usize));
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout_at(deadline, body.frame()) => match frame {
                Err(_) => return Err(BodyError::Timeout),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BodyError::Read(e)),
                Ok(Some(Ok(frame))) => frame,
            },
            // Slow by now: at the connection limit, a new connection may take this one's place.
            () = tokio::time::sleep_until(slow_from), if Instant::now() < slow_from => {
                slot.mark_evictable();
                continue;
            }
            () = arrival.end.cancelled() => return Err(BodyError::TooSlow),
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
        let permit = take_budget(shared, &arrival, count, deadline).await?;
        match held.as_mut() {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        arrival.held.fetch_add(data.len(), Ordering::Relaxed);
        bytes.extend_from_slice(&data);
    }
    Ok((bytes, held))
}

/// Budget for `count` more bytes of `arrival`'s body: at once when free, else after ending
/// slow bodies that hold enough, within [`OVERLOAD_WAIT`] (and the body's deadline).
async fn take_budget(
    shared: &Shared,
    arrival: &Arrival<'_>,
    count: u32,
    deadline: Instant,
) -> Result<OwnedSemaphorePermit, BodyError> {
    let budget = &shared.body_budget;
    if let Ok(permit) = budget.clone().try_acquire_many_owned(count) {
        return Ok(permit);
    }
    let give_up = (Instant::now() + OVERLOAD_WAIT).min(deadline);
    loop {
        let needed = (count as usize).saturating_sub(budget.available_permits());
        let ended = shared
            .arrivals
            .end_slow(needed, shared.options.slow_body_after, arrival.id);
        if ended > 0 {
            tracing::info!(
                ended,
                "ended request bodies still arriving after --slow-body-after: a body that \
                 arrived at once needed their budget"
            );
        }
        let look_again = (Instant::now() + BUDGET_RECHECK).min(give_up);
        tokio::select! {
            permit = tokio::time::timeout_at(look_again, budget.clone().acquire_many_owned(count)) => match permit {
                Ok(Ok(permit)) => return Ok(permit),
                Ok(Err(_)) => return Err(BodyError::Overloaded),
                Err(_) if Instant::now() >= give_up => return Err(BodyError::Overloaded),
                Err(_) => {}
            },
            () = arrival.end.cancelled() => return Err(BodyError::TooSlow),
        }
    }
}

async fn review_request(
    shared: &Shared,
    request: Request<Incoming>,
    slot: RequestSlot,
) -> Response<Full<Bytes>> {
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
    let (bytes, budget) = match receive_body(shared, declared, request.into_body(), &slot).await {
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
                    "request body not received in time (at {} bytes/s after {BODY_GRACE:?}, \
                     within {:?} at most)",
                    limits.min_body_rate, limits.request_timeout
                ),
            );
        }
        Err(BodyError::TooSlow) => {
            return bad_request(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body still arriving after {:?}: its budget went to a body that \
                     arrived at once",
                    limits.slow_body_after
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

/// The probe port's answers: `/healthz`: the process serves; `/readyz`: it takes reviews
/// (503 from the start of shutdown until the review port has drained).
fn probe_response(request: &Request<Incoming>, ready: bool) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/readyz") if ready => text(StatusCode::OK, "ready"),
        (&Method::GET, "/readyz") => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
        _ => text(StatusCode::NOT_FOUND, "not found"),
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
            allowed = %verdict.allowed_identities,
            "denied"
        );
    } else if !verdict.changes.is_empty() {
        let changes: Vec<String> = verdict.changes.iter().map(|c| c.to_string()).collect();
        tracing::info!(%host, %user, operation, dry_run, changes = %changes.join(", "), "power request allowed");
    } else {
        tracing::debug!(%host, %user, operation, outcome = verdict.outcome.as_str(), "allowed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(id: u64, age_ms: u64, held: usize, ending: bool, now: Instant) -> Arriving {
        Arriving {
            id,
            started: now - Duration::from_millis(age_ms),
            held,
            ending,
        }
    }

    /// Bodies still arriving after `slow_after` give their budget up, oldest first, only as
    /// much as is needed; young ones (the API server's, arriving at once) and the one asking
    /// never do.
    #[test]
    fn slow_bodies_to_end_oldest_first_only_what_is_needed() {
        let now = Instant::now();
        let slow_after = Duration::from_millis(500);
        let bodies = [
            body(1, 2_000, 4_000, false, now),
            body(2, 3_000, 4_000, false, now),
            body(3, 100, 4_000, false, now),
            body(4, 5_000, 4_000, false, now),
        ];
        // Body 4 asks: the oldest other slow one is 2, then 1; 3 is young.
        assert_eq!(slow_bodies_to_end(&bodies, 1, slow_after, now, 4), [2]);
        assert_eq!(
            slow_bodies_to_end(&bodies, 4_001, slow_after, now, 4),
            [2, 1]
        );
        assert_eq!(
            slow_bodies_to_end(&bodies, 1_000_000, slow_after, now, 4),
            [2, 1],
            "never a young body, never the one asking"
        );
        assert_eq!(
            slow_bodies_to_end(&bodies, 0, slow_after, now, 4),
            [] as [u64; 0]
        );
    }

    #[test]
    fn slow_bodies_to_end_count_those_already_ending() {
        let now = Instant::now();
        let slow_after = Duration::from_millis(500);
        let bodies = [
            body(1, 2_000, 4_000, true, now),
            body(2, 3_000, 4_000, false, now),
            body(3, 4_000, 0, false, now),
        ];
        assert_eq!(
            slow_bodies_to_end(&bodies, 4_000, slow_after, now, 9),
            [] as [u64; 0],
            "body 1 is ending already and frees enough"
        );
        assert_eq!(
            slow_bodies_to_end(&bodies, 4_001, slow_after, now, 9),
            [2],
            "a body holding nothing frees nothing"
        );
    }

    #[test]
    fn body_deadlines_are_a_grace_plus_the_transfer_at_the_minimum_rate() {
        let cap = Duration::from_secs(10);
        let mib = 1024 * 1024;
        assert_eq!(
            body_deadline_after(4 * mib, mib, cap),
            Duration::from_secs(5)
        );
        assert_eq!(body_deadline_after(0, mib, cap), BODY_GRACE);
        assert!(body_deadline_after(2048, mib, cap) < Duration::from_millis(1_010));
        assert_eq!(
            body_deadline_after(64 * mib, mib, cap),
            cap,
            "at most the cap"
        );
        assert_eq!(body_deadline_after(4 * mib, 0, cap), cap, "0: no rate");
    }
}
