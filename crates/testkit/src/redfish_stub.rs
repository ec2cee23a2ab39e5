//! A fast in-process Redfish BMC fleet for benchmarks: power changes apply at once (or after
//! a fixed, deterministic delay), and the arrival time of every reset request is recorded, so
//! a benchmark can measure how long a request took to reach "the BMC". Load generation, not a
//! test double for functional tests (those use sushy-tools).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use jiff::Timestamp;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::TestkitError;

/// One reset request as the stub received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetRecord {
    pub at: Timestamp,
    pub reset_type: String,
}

struct Fleet {
    powered_on: Vec<AtomicBool>,
    /// A requested power state and when it takes effect.
    pending: Vec<Mutex<Option<(bool, std::time::Instant)>>>,
    /// How long a power change takes.
    transition: std::time::Duration,
    resets: Vec<Mutex<Vec<ResetRecord>>>,
    reads: AtomicU64,
    /// How long a power-state read takes to answer (a slow BMC).
    read_delay: Mutex<std::time::Duration>,
    /// Arrival time of every request (reads and resets), oldest first.
    requests: Mutex<Vec<Timestamp>>,
}

impl Fleet {
    /// System `id`'s power, applying a pending change whose time has come.
    fn power(&self, id: usize) -> Option<bool> {
        let power = self.powered_on.get(id)?;
        let mut pending = lock(self.pending.get(id)?);
        if let Some((target, at)) = *pending
            && std::time::Instant::now() >= at
        {
            power.store(target, Ordering::SeqCst);
            *pending = None;
        }
        Some(power.load(Ordering::SeqCst))
    }

    fn set_power(&self, id: usize, on: bool) {
        let (Some(power), Some(pending)) = (self.powered_on.get(id), self.pending.get(id)) else {
            return;
        };
        if self.transition.is_zero() {
            power.store(on, Ordering::SeqCst);
        } else {
            *lock(pending) = Some((on, std::time::Instant::now() + self.transition));
        }
    }
}

/// A fleet of fast Redfish systems `0..n`, spread over `endpoints` loopback ports.
pub struct RedfishStub {
    fleet: Arc<Fleet>,
    ports: Vec<u16>,
    stop: CancellationToken,
}

impl Drop for RedfishStub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct AppState {
    fleet: Arc<Fleet>,
}

impl RedfishStub {
    /// Serves `systems` systems (all powered on) on `endpoints` ports; system `i` lives on
    /// port `i % endpoints`.
    pub async fn start(systems: usize, endpoints: usize) -> Result<RedfishStub, TestkitError> {
        Self::start_with_transition(systems, endpoints, std::time::Duration::ZERO).await
    }

    /// Like [`RedfishStub::start`], but every power change takes `transition` to happen (as
    /// on real hardware), always the same, so a benchmark has a known ideal schedule.
    pub async fn start_with_transition(
        systems: usize,
        endpoints: usize,
        transition: std::time::Duration,
    ) -> Result<RedfishStub, TestkitError> {
        let fleet = Arc::new(Fleet {
            powered_on: (0..systems).map(|_| AtomicBool::new(true)).collect(),
            pending: (0..systems).map(|_| Mutex::new(None)).collect(),
            transition,
            resets: (0..systems).map(|_| Mutex::new(Vec::new())).collect(),
            reads: AtomicU64::new(0),
            read_delay: Mutex::new(std::time::Duration::ZERO),
            requests: Mutex::new(Vec::new()),
        });
        let stop = CancellationToken::new();
        let app = Router::new()
            .route("/redfish/v1/Systems/{id}", get(system))
            .route(
                "/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset",
                post(reset),
            )
            .with_state(AppState {
                fleet: fleet.clone(),
            });
        let mut ports = Vec::new();
        for _ in 0..endpoints.max(1) {
            let (listener, port) = crate::process::bind_loopback("a Redfish stub endpoint").await?;
            ports.push(port);
            let app = app.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await;
            });
        }
        Ok(RedfishStub { fleet, ports, stop })
    }

    /// `redfish+http://127.0.0.1:PORT/redfish/v1/Systems/<i>`.
    pub fn system_address(&self, i: usize) -> String {
        format!(
            "redfish+http://127.0.0.1:{}/redfish/v1/Systems/{i}",
            self.ports[i % self.ports.len()]
        )
    }

    /// Every reset request system `i` received, oldest first.
    pub fn resets(&self, i: usize) -> Vec<ResetRecord> {
        self.fleet
            .resets
            .get(i)
            .map(|r| lock(r).clone())
            .unwrap_or_default()
    }

    /// Power-state reads served so far.
    pub fn reads(&self) -> u64 {
        self.fleet.reads.load(Ordering::Relaxed)
    }

    /// From now on every power-state read answers only after `delay` (a slow BMC).
    pub fn set_read_delay(&self, delay: std::time::Duration) {
        *lock(&self.fleet.read_delay) = delay;
    }

    /// Arrival times of every request any system received (reads and resets), oldest first.
    pub fn requests(&self) -> Vec<Timestamp> {
        lock(&self.fleet.requests).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

async fn system(State(state): State<AppState>, Path(id): Path<usize>) -> Response {
    lock(&state.fleet.requests).push(Timestamp::now());
    let delay = *lock(&state.fleet.read_delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let Some(power) = state.fleet.power(id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    state.fleet.reads.fetch_add(1, Ordering::Relaxed);
    let power = if power { "On" } else { "Off" };
    axum::Json(json!({
        "@odata.id": format!("/redfish/v1/Systems/{id}"),
        "Id": id.to_string(),
        "Name": format!("stub-{id}"),
        "PowerState": power,
        "Actions": { "#ComputerSystem.Reset": {
            "target": format!("/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "ForceRestart"],
        }},
    }))
    .into_response()
}

async fn reset(
    State(state): State<AppState>,
    Path(id): Path<usize>,
    body: axum::body::Bytes,
) -> Response {
    let at = Timestamp::now();
    lock(&state.fleet.requests).push(at);
    let Some(log) = state.fleet.resets.get(id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let reset_type = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("ResetType")
                .and_then(|t| t.as_str())
                .map(str::to_string)
        })
        .unwrap_or_default();
    match reset_type.as_str() {
        "On" | "ForceOn" => state.fleet.set_power(id, true),
        "ForceOff" | "GracefulShutdown" => state.fleet.set_power(id, false),
        "ForceRestart" => {}
        _ => return StatusCode::BAD_REQUEST.into_response(),
    }
    lock(log).push(ResetRecord { at, reset_type });
    StatusCode::NO_CONTENT.into_response()
}
