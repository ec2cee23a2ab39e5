//! The reboot queue controller: cordon, PDB-aware drain, reboot through the BMC or a
//! command, boot check, uncordon — CKE's rules (`hostcycle_core::queue`), event-driven.
//!
//! One loop ([`controller`]) owns every write to `RebootQueueEntry` status: it observes
//! (watch caches of entries, the queue, Nodes, BareMetalHosts and Machines), decides with the
//! pure functions of `hostcycle_core::queue`, records the decision (write-ahead, with a
//! resourceVersion precondition), then acts. Long steps run in per-entry workers ([`drain`],
//! [`command`]) that report back; they never write the entry, so the controller never writes
//! `spec` and a cancel can never be lost to a status write.
//!
//! Crash-only: every step is recorded before it is taken, so a restart at any point resumes
//! from the objects alone, with no second reboot and no node left cordoned.

pub mod command;
pub mod controller;
pub mod cordon;
pub mod drain;
pub mod eviction;
pub mod observe;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use tokio::sync::{mpsc, oneshot};

use crate::events::{EventKind, EventPublisher};
use crate::metrics::Metrics;
use eviction::Evictor;

/// Settings of the reboot queue controller.
#[derive(Debug, Clone)]
pub struct QueueControllerConfig {
    /// Namespace whose BareMetalHosts are watched; all namespaces when `None`.
    pub host_namespace: Option<String>,
    /// Re-evaluate the whole queue at least this often, even without any change.
    pub resync: Duration,
}

impl Default for QueueControllerConfig {
    fn default() -> Self {
        QueueControllerConfig {
            host_namespace: None,
            resync: Duration::from_secs(30),
        }
    }
}

/// What the loop and its workers share.
pub struct Shared {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub evictor: Evictor,
    /// Events go out through one background task, in order, so publishing never holds up the
    /// loop (a slow events API must not delay a reboot request or an uncordon).
    events: mpsc::UnboundedSender<(ObjectReference, EventKind, String, String)>,
}

impl Shared {
    /// `Shared` and the task that publishes its Events (stops when `Shared` is dropped).
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        evictor: Evictor,
        publisher: EventPublisher,
    ) -> (Shared, tokio::task::JoinHandle<()>) {
        let (events, mut queue) =
            mpsc::unbounded_channel::<(ObjectReference, EventKind, String, String)>();
        let task = tokio::spawn(async move {
            while let Some((regarding, kind, reason, note)) = queue.recv().await {
                if let Err(e) = publisher
                    .publish(&regarding, kind, &reason, "RebootQueue", &note)
                    .await
                {
                    tracing::warn!(object = ?regarding.name, reason, error = %e, "could not publish event");
                }
            }
        });
        (
            Shared {
                client,
                metrics,
                evictor,
                events,
            },
            task,
        )
    }

    /// Logs an Event and hands it to the publisher task (best effort, never blocks).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: EventKind,
        reason: &str,
        note: &str,
    ) {
        let object = format!(
            "{}/{}",
            regarding.kind.as_deref().unwrap_or("object"),
            regarding.name.as_deref().unwrap_or("")
        );
        match kind {
            EventKind::Normal => tracing::info!(%object, reason, note, "event"),
            EventKind::Warning => tracing::warn!(%object, reason, note, "event"),
        }
        let _ = self.events.send((
            regarding.clone(),
            kind,
            reason.to_string(),
            note.to_string(),
        ));
    }
}

/// A reference to a Node for Events.
pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        // Cluster-scoped: the publisher writes its Events to kube-system.
        namespace: None,
        ..Default::default()
    }
}

/// A worker's report to the loop about one entry (by name and UID: a report about an entry
/// that was deleted and re-created is ignored).
#[derive(Debug)]
pub struct Report {
    pub entry: String,
    pub entry_uid: String,
    pub kind: ReportKind,
}

#[derive(Debug)]
pub enum ReportKind {
    /// The drain is under way; the text says what it waits for.
    DrainProgress {
        message: String,
    },
    DrainCompleted,
    DrainFailed {
        reason: String,
    },
    /// Record attempt `attempt` of the reboot command, then answer `true` on `ack` (write-
    /// ahead); `false` stops the worker.
    RecordCommandAttempt {
        attempt: u32,
        previous_error: String,
        ack: oneshot::Sender<bool>,
    },
    RebootCommandSucceeded,
    RebootCommandGaveUp {
        message: String,
    },
    BootCheck {
        booted: bool,
        detail: String,
    },
}

pub use controller::run;
