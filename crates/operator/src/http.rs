//! The operator's HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

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

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    ready: Arc<Readiness>,
}

/// Serves metrics and health until `shutdown` fires. Returns the bound address at once.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    ready: Arc<Readiness>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, ready });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok((bound, task))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.ready.check() {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

#[cfg(test)]
mod tests {
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
}
