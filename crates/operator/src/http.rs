//! The operator's HTTP endpoints: `/metrics` on `--metrics-addr`, the kubelet's `/healthz`
//! and `/readyz` on `--probe-addr`, both within [`crate::http_limits`] (a connection cap with
//! eviction of idle connections, a header timeout, bounded request headers).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http_limits::{
    ConnectionLimits, NoEvents, PROBE_CONNECTIONS, respond, serve_plain, text,
};

/// What `/readyz` answers: ready once the process is healthy (it reached the API server and,
/// with leader election, is campaigning) and every cache a running controller registered is
/// synced. Leadership is *not* part of it — a standby replica is ready, so a rolling update
/// of two replicas completes; `hostcycle_leader` says who leads.
#[derive(Debug, Default)]
pub struct Readiness {
    healthy: AtomicBool,
    unsynced: AtomicUsize,
}

impl Readiness {
    /// The process is up and talking to the API server (or not, with `false`).
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Registers a cache that must be synced before the process is ready again; call the
    /// returned function once it is.
    pub fn cache_pending(self: &Arc<Self>) -> impl FnOnce() + Send + 'static {
        self.unsynced.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        move || {
            me.unsynced.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        if !self.healthy.load(Ordering::SeqCst) {
            Err("not ready: not connected to the API server yet")
        } else if self.unsynced.load(Ordering::SeqCst) > 0 {
            Err("not ready: caches not synced yet")
        } else {
            Ok(())
        }
    }
}

/// Where and within which limits the operator serves HTTP.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `/metrics` (`--metrics-addr`): what the NetworkPolicy admits scrapers to.
    pub metrics_addr: SocketAddr,
    /// `/healthz` and `/readyz` (`--probe-addr`): the kubelet's, on a port of their own so
    /// scrapers (or anything the metrics port admits) never hold a probe up.
    pub probe_addr: SocketAddr,
    /// Connections open at once on the metrics port (see [`crate::http_limits`] for what
    /// happens at the limit).
    pub max_connections: usize,
    /// How the metrics port serves a connection.
    pub limits: ConnectionLimits,
}

/// Connections open at once on the metrics port: a few scrapers and a few people.
pub const METRICS_CONNECTIONS: usize = 64;

impl HttpOptions {
    /// The operator's limits on the given addresses: 64 connections, 5 s for a first request
    /// header, idle keep-alive connections closed after 120 s (longer than Prometheus's
    /// usual scrape interval), request headers up to 16 KiB.
    pub fn new(metrics_addr: SocketAddr, probe_addr: SocketAddr) -> Self {
        HttpOptions {
            metrics_addr,
            probe_addr,
            max_connections: METRICS_CONNECTIONS,
            limits: ConnectionLimits {
                header_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(120),
                keep_alive: true,
                max_header_bytes: 16 * 1024,
                shutdown_grace: Duration::from_secs(5),
            },
        }
    }
}

/// The bound addresses (the ports when `:0` was asked for) and the task serving both.
#[derive(Debug)]
pub struct Serving {
    pub metrics_addr: SocketAddr,
    pub probe_addr: SocketAddr,
    /// Ends after `shutdown` fired and requests in flight finished.
    pub task: tokio::task::JoinHandle<()>,
}

/// Serves `/metrics` on the metrics address and `/healthz`, `/readyz` on the probe address
/// until `shutdown` fires. Binds both before returning.
pub async fn serve(
    options: HttpOptions,
    registry: Arc<Registry>,
    ready: Arc<Readiness>,
    shutdown: CancellationToken,
) -> std::io::Result<Serving> {
    let metrics_listener = TcpListener::bind(options.metrics_addr).await?;
    let probe_listener = TcpListener::bind(options.probe_addr).await?;
    let metrics_addr = metrics_listener.local_addr()?;
    let probe_addr = probe_listener.local_addr()?;
    let metrics = serve_plain(
        metrics_listener,
        options.max_connections,
        options.limits.clone(),
        Arc::new(NoEvents),
        move |request| {
            let registry = registry.clone();
            async move { metrics_response(&request, &registry) }
        },
        shutdown.clone(),
    );
    let probes = serve_plain(
        probe_listener,
        PROBE_CONNECTIONS,
        ConnectionLimits::probes(),
        Arc::new(NoEvents),
        move |request| {
            let ready = ready.clone();
            async move { probe_response(&request, &ready) }
        },
        shutdown,
    );
    let task = tokio::spawn(async move {
        tokio::join!(metrics, probes);
    });
    Ok(Serving {
        metrics_addr,
        probe_addr,
        task,
    })
}

fn metrics_response(request: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => respond(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                ),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        (_, "/metrics") => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found (probes are on --probe-addr)",
        ),
    }
}

fn probe_response(request: &Request<Incoming>, ready: &Readiness) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/readyz") => match ready.check() {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
        },
        (_, "/healthz" | "/readyz") => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ready_means_healthy_and_synced_not_leading() {
        let ready = Arc::new(Readiness::default());
        assert!(ready.check().is_err(), "not healthy yet");
        // A standby replica: healthy, no controller running, so nothing to sync: ready.
        ready.set_healthy(true);
        assert_eq!(ready.check(), Ok(()));
        // Leading: controllers start and register their caches; not ready until synced.
        let hosts = ready.cache_pending();
        let other = ready.cache_pending();
        assert_eq!(ready.check(), Err("not ready: caches not synced yet"));
        hosts();
        assert!(ready.check().is_err());
        other();
        assert_eq!(ready.check(), Ok(()));
        ready.set_healthy(false);
        assert!(ready.check().is_err());
    }

    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// `GET path` on `addr`: the status code, or `None` without an answer within 2 s.
    async fn get(addr: SocketAddr, path: &str) -> Option<u16> {
        let exchange = async {
            let mut tcp = TcpStream::connect(addr).await.ok()?;
            tcp.write_all(
                format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .ok()?;
            let mut answer = Vec::new();
            tcp.read_to_end(&mut answer).await.ok()?;
            let text = String::from_utf8_lossy(&answer).to_string();
            text.split_whitespace().nth(1)?.parse().ok()
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .ok()
            .flatten()
    }

    /// Whether the server closed `socket` (EOF or reset) before `deadline`.
    async fn closed_by(socket: &mut TcpStream, deadline: Instant) -> bool {
        let mut buf = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, socket.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return true,
                // An answer (e.g. 408) before the close: keep reading until the close.
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Issue 25, point 6: the metrics server had no connection cap and no header timeout.
    /// Hundreds of silent sockets and a slowloris header must not keep a scrape from being
    /// answered, and the server closes them rather than holding them forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_sockets_and_slow_headers_neither_stop_a_scrape_nor_stay_open() {
        let ready = Arc::new(Readiness::default());
        ready.set_healthy(true);
        let shutdown = CancellationToken::new();
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let Serving {
            metrics_addr: addr,
            probe_addr,
            task,
        } = serve(
            HttpOptions::new(loopback, loopback),
            Arc::new(Registry::default()),
            ready,
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(get(addr, "/metrics").await, Some(200));
        // Probes have a port of their own: the kubelet's, not the scrapers'.
        assert_ne!(probe_addr.port(), addr.port());
        assert_eq!(get(probe_addr, "/healthz").await, Some(200));
        assert_eq!(get(probe_addr, "/readyz").await, Some(200));
        assert_eq!(get(addr, "/readyz").await, Some(404));
        assert_eq!(get(addr, "/healthz").await, Some(404));
        assert_eq!(get(probe_addr, "/metrics").await, Some(404));

        let opened = Instant::now();
        let mut idle = Vec::new();
        for _ in 0..300 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Slowloris: a request line, then a header byte now and then, never the blank line.
        let mut slow = Vec::new();
        for _ in 0..8 {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            socket
                .write_all(b"GET /metrics HTTP/1.1\r\nx-slow: ")
                .await
                .unwrap();
            slow.push(socket);
        }
        let dripping = tokio::spawn(async move {
            for _ in 0..100 {
                for socket in &mut slow {
                    let _ = socket.write_all(b"a").await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            slow
        });

        let started = Instant::now();
        assert_eq!(
            get(addr, "/metrics").await,
            Some(200),
            "the scrape was not answered"
        );
        println!(
            "a scrape with 300 idle and 8 slowloris sockets open took {:?}",
            started.elapsed()
        );
        // Sockets on the metrics port do not reach the probes.
        let started = Instant::now();
        assert_eq!(get(probe_addr, "/healthz").await, Some(200));
        assert_eq!(get(probe_addr, "/readyz").await, Some(200));
        println!("the probes answered in {:?}", started.elapsed());
        // Nor do silent sockets on the probe port itself: the oldest make room.
        let mut idle_probes = Vec::new();
        for _ in 0..50 {
            idle_probes.push(TcpStream::connect(probe_addr).await.unwrap());
        }
        assert_eq!(get(probe_addr, "/readyz").await, Some(200));
        drop(idle_probes);

        // Silent sockets are closed after the header timeout (5 s), not held forever.
        let deadline = opened + Duration::from_secs(10);
        for (i, socket) in idle.iter_mut().enumerate() {
            assert!(
                closed_by(socket, deadline).await,
                "idle socket {i} still open {:?} after it connected",
                opened.elapsed()
            );
        }
        // So are the slowloris ones, though they keep sending header bytes.
        let mut slow = dripping.await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(1);
        for (i, socket) in slow.iter_mut().enumerate() {
            assert!(
                closed_by(socket, deadline).await,
                "slowloris socket {i} still open {:?} after it connected",
                opened.elapsed()
            );
        }
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    }
}
