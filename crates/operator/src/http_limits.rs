//! The limits every hostcycle HTTP server keeps — the operator's metrics and probe ports, the
//! webhook's review and probe ports — so that sockets which say nothing, or say it slowly,
//! cannot keep an answer from the kubelet, Prometheus or the API server:
//! - at most `max` connections are open ([`ConnectionTable`]); at the limit a new connection
//!   replaces the oldest one that is not serving a request (first those that never sent one,
//!   then idle keep-alive ones, then those whose request its server marked
//!   [`RequestSlot::mark_evictable`], e.g. a body arriving too slowly), and is refused (closed
//!   at once) when every one is serving a request — never left in the listen backlog;
//! - a connection must send a complete request header within the header timeout of
//!   connecting, or it is closed; an idle keep-alive connection is closed after the idle
//!   timeout ([`serve_connection`]);
//! - request headers are bounded in size ([`ConnectionLimits::max_header_bytes`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a server closed a connection to protect itself (the webhook counts them by these
/// names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Every connection was serving a request: the new one was closed at once.
    Refused,
    /// Closed to make room for a new connection: it was not serving a request.
    Evicted,
    /// No complete request header within the header timeout.
    NoRequest,
}

impl Closed {
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Refused => "refused",
            Closed::Evicted => "evicted",
            Closed::NoRequest => "no_request",
        }
    }
}

/// What a server wants to know about its connections (for its metrics).
pub trait ConnectionEvents: Send + Sync {
    /// `open` connections are open now.
    fn open(&self, _open: usize) {}
    /// A connection was closed, or refused, for `why`.
    fn closed(&self, _why: Closed) {}
}

/// Counts nothing.
#[derive(Debug, Default)]
pub struct NoEvents;

impl ConnectionEvents for NoEvents {}

/// No complete request header yet.
const WAITING: u8 = 0;
/// Between requests (keep-alive).
const IDLE: u8 = 1;
/// Serving a request.
const BUSY: u8 = 2;
/// Serving a request its server may drop to make room (e.g. a body arriving too slowly).
const EVICTABLE: u8 = 3;

/// The request a handler serves, as its connection's place sees it.
#[derive(Debug, Clone)]
pub struct RequestSlot {
    state: Arc<AtomicU8>,
}

impl RequestSlot {
    /// Lets a new connection take this one's place while this request is being served: the
    /// request is dropped unanswered when that happens.
    pub fn mark_evictable(&self) {
        let _ = self
            .state
            .compare_exchange(BUSY, EVICTABLE, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// The open connections of one port, oldest first, and what each is doing.
pub struct ConnectionTable {
    max: usize,
    events: Arc<dyn ConnectionEvents>,
    table: Mutex<Table>,
}

impl std::fmt::Debug for ConnectionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionTable")
            .field("max", &self.max)
            .field("open", &self.lock().open.len())
            .finish()
    }
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

/// One connection's place in its [`ConnectionTable`]; dropping it frees the place.
pub struct Slot {
    id: u64,
    table: Arc<ConnectionTable>,
    shared: SlotState,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("id", &self.id).finish()
    }
}

impl Slot {
    /// Fires when the connection was evicted to make room for a newer one.
    pub fn evicted(&self) -> &CancellationToken {
        &self.shared.evict
    }

    /// Whether the connection has not sent a complete request header yet.
    pub fn waiting_for_first_request(&self) -> bool {
        self.shared.state.load(Ordering::Relaxed) == WAITING
    }

    /// Whether eviction drops the connection at once: it has sent no request yet, or the
    /// request it is serving was marked evictable.
    fn drop_at_once(&self) -> bool {
        matches!(
            self.shared.state.load(Ordering::Relaxed),
            WAITING | EVICTABLE
        )
    }
}

impl ConnectionTable {
    /// A table of at most `max` (at least 1) connections.
    pub fn new(max: usize, events: Arc<dyn ConnectionEvents>) -> Arc<Self> {
        Arc::new(ConnectionTable {
            max: max.max(1),
            events,
            table: Mutex::new(Table::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// A place for a new connection: a free one, or the oldest connection's that is not
    /// serving a request (those that never sent one first, then idle ones), or else whose
    /// request was marked evictable; `None` (counted as refused) when there is none.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut table = self.lock();
        if table.open.len() >= self.max {
            let victim = [WAITING, IDLE, EVICTABLE].into_iter().find_map(|wanted| {
                table
                    .open
                    .iter()
                    .find(|(_, slot)| slot.state.load(Ordering::Relaxed) == wanted)
                    .map(|(id, _)| *id)
            });
            let Some(victim) = victim else {
                drop(table);
                self.events.closed(Closed::Refused);
                return None;
            };
            if let Some(evicted) = table.open.remove(&victim) {
                evicted.evict.cancel();
                self.events.closed(Closed::Evicted);
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let shared = SlotState {
            state: Arc::new(AtomicU8::new(WAITING)),
            evict: CancellationToken::new(),
        };
        table.open.insert(id, shared.clone());
        let open = table.open.len();
        drop(table);
        self.events.open(open);
        Some(Slot {
            id,
            table: self.clone(),
            shared,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        table.open.remove(&self.id);
        let open = table.open.len();
        drop(table);
        self.table.events.open(open);
    }
}

/// How one connection is served.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A connection must send a complete first request header within this long of
    /// connecting (the TLS handshake included, for the webhook).
    pub header_timeout: Duration,
    /// An idle keep-alive connection (or one sending a later request's header this slowly)
    /// is closed after this long.
    pub idle_timeout: Duration,
    /// Serve more than one request per connection.
    pub keep_alive: bool,
    /// Largest request header read (at least 8 KiB: hyper's smallest buffer).
    pub max_header_bytes: usize,
    /// How long requests in flight get to finish on shutdown.
    pub shutdown_grace: Duration,
}

impl ConnectionLimits {
    /// The kubelet's probes: one short request per connection, 2 s for all of it.
    pub fn probes() -> Self {
        ConnectionLimits {
            header_timeout: PROBE_TIMEOUT,
            idle_timeout: PROBE_TIMEOUT,
            keep_alive: false,
            max_header_bytes: 16 * 1024,
            shutdown_grace: PROBE_TIMEOUT,
        }
    }
}

/// How long a probe connection may take to send its request and get the answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Probe connections open at once (the kubelet makes one per probe).
pub const PROBE_CONNECTIONS: usize = 8;
/// hyper's smallest read buffer.
const MIN_HEADER_BYTES: usize = 8 * 1024;

/// How a connection ended.
#[derive(Debug)]
pub enum Ended {
    /// The client closed it, or it was not to be kept alive.
    Done,
    /// No complete request header within the header timeout.
    NoRequest,
    /// Evicted before its first request, or closed gracefully after eviction or shutdown.
    Closed,
    /// An HTTP or I/O error (a header too large, a reset…).
    Error(hyper::Error),
}

/// Serves HTTP/1.1 on `io` with `handler` until the client closes, the first request header
/// misses `first_header_by`, the slot is evicted or `shutdown` fires. The slot is marked
/// busy while a request is being answered, so it is not evicted then (unless the handler
/// marks its [`RequestSlot`] evictable).
pub async fn serve_connection<I, F, Fut>(
    io: I,
    slot: Slot,
    first_header_by: Instant,
    limits: &ConnectionLimits,
    handler: F,
    shutdown: &CancellationToken,
) -> Ended
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>, RequestSlot) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let state = slot.shared.state.clone();
    let service = service_fn(move |request| {
        let (handler, state) = (handler.clone(), state.clone());
        async move {
            state.store(BUSY, Ordering::Relaxed);
            let response = handler(
                request,
                RequestSlot {
                    state: state.clone(),
                },
            )
            .await;
            state.store(IDLE, Ordering::Relaxed);
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .keep_alive(limits.keep_alive)
        .max_buf_size(limits.max_header_bytes.max(MIN_HEADER_BYTES));
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let first_header = tokio::time::sleep_until(first_header_by);
    tokio::pin!(first_header);
    let mut waiting_for_first = true;
    let evict = slot.shared.evict.clone();
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                return match served {
                    Ok(()) => Ended::Done,
                    Err(e) => Ended::Error(e),
                };
            }
            _ = &mut first_header, if waiting_for_first => {
                if slot.waiting_for_first_request() {
                    return Ended::NoRequest;
                }
                waiting_for_first = false;
            }
            _ = evict.cancelled() => {
                // Made room for a newer connection: it was not serving a request, or one
                // that may be dropped.
                if slot.drop_at_once() {
                    return Ended::Closed;
                }
                break;
            }
            _ = shutdown.cancelled() => break,
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.shutdown_grace, connection).await;
    drop(slot);
    Ended::Closed
}

/// Serves plain HTTP on `listener` within `limits`, at most `max_connections` at once, until
/// `shutdown` fires; then lets requests in flight finish within the grace period.
pub async fn serve_plain<F, Fut>(
    listener: TcpListener,
    max_connections: usize,
    limits: ConnectionLimits,
    events: Arc<dyn ConnectionEvents>,
    handler: F,
    shutdown: CancellationToken,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let handler = move |request, _: RequestSlot| handler(request);
    let table = ConnectionTable::new(max_connections, events.clone());
    let limits = Arc::new(limits);
    let mut tasks = JoinSet::new();
    loop {
        let (tcp, peer): (_, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => break,
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
        let Some(slot) = table.admit() else {
            tracing::debug!(%peer, "connection refused: every slot is serving a request");
            continue;
        };
        let first_header_by = Instant::now() + limits.header_timeout;
        let (limits, events, handler, shutdown) = (
            limits.clone(),
            events.clone(),
            handler.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            match serve_connection(tcp, slot, first_header_by, &limits, handler, &shutdown).await {
                Ended::NoRequest => {
                    events.closed(Closed::NoRequest);
                    tracing::debug!(%peer, "no complete request header within the header timeout");
                }
                Ended::Error(e) => {
                    tracing::debug!(%peer, error = %e, "connection ended with an error")
                }
                Ended::Done | Ended::Closed => {}
            }
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.shutdown_grace + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
    }
}

/// A response of `status` with `body`.
pub fn respond(
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

/// A plain-text response: `body` and a newline.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut body = body.into();
    body.push('\n');
    respond(status, "text/plain; charset=utf-8", body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Default)]
    struct Counted(Mutex<Vec<Closed>>);

    impl ConnectionEvents for Counted {
        fn closed(&self, why: Closed) {
            self.0.lock().unwrap().push(why);
        }
    }

    /// At the limit a new connection takes the place of the oldest one that never sent a
    /// request, then of an idle one, and is refused when all are serving a request.
    #[test]
    fn a_full_table_evicts_waiting_then_idle_connections_and_refuses_when_all_are_busy() {
        let events = Arc::new(Counted::default());
        let table = ConnectionTable::new(2, events.clone());
        let first = table.admit().unwrap();
        let second = table.admit().unwrap();
        first.shared.state.store(IDLE, Ordering::Relaxed);
        // The second never sent a request: it goes before the idle first.
        let third = table.admit().unwrap();
        assert!(second.evicted().is_cancelled());
        assert!(!first.evicted().is_cancelled());
        drop(second);
        assert_eq!(table.open(), 2);
        third.shared.state.store(BUSY, Ordering::Relaxed);
        let fourth = table.admit().unwrap();
        assert!(first.evicted().is_cancelled());
        drop(first);
        fourth.shared.state.store(BUSY, Ordering::Relaxed);
        assert!(table.admit().is_none(), "every connection serves a request");
        // A request its server marked evictable (a body arriving too slowly) makes room.
        RequestSlot {
            state: third.shared.state.clone(),
        }
        .mark_evictable();
        assert!(third.drop_at_once());
        let fifth = table.admit().unwrap();
        assert!(third.evicted().is_cancelled());
        drop(third);
        assert_eq!(
            *events.0.lock().unwrap(),
            [
                Closed::Evicted,
                Closed::Evicted,
                Closed::Refused,
                Closed::Evicted
            ]
        );
        drop((fourth, fifth));
        assert_eq!(table.open(), 0);
    }
}
