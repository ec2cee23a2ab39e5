//! The reboot queue controller: cordon, PDB-aware drain, reboot through the BMC or a
//! command, boot check, uncordon — CKE's rules (`hostcycle_core::queue`), event-driven.
//!
//! One loop ([`controller`]) owns every write to `RebootQueueEntry` status: it observes (the
//! caches of the shared cluster view, [`crate::cluster`]: entries, the queue, Nodes,
//! BareMetalHosts, Machines and HostRemediations, with filters of its own saying which
//! changes wake it), decides with the pure functions of `hostcycle_core::queue`, records the
//! decision (write-ahead, with a resourceVersion precondition), then acts. Long steps run in per-entry workers ([`drain`],
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
use tokio::sync::oneshot;

use crate::events::EventSink;
use crate::metrics::Metrics;
use eviction::Evictor;
use hostcycle_api::reasons::EventType;

/// Settings of the reboot queue controller.
#[derive(Debug, Clone)]
pub struct QueueControllerConfig {
    /// Re-evaluate the whole queue at least this often, even without any change.
    pub resync: Duration,
}

impl Default for QueueControllerConfig {
    fn default() -> Self {
        QueueControllerConfig {
            resync: Duration::from_secs(30),
        }
    }
}

/// What the loop and its workers share.
pub struct Shared {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub evictor: Evictor,
    pub events: EventSink,
}

impl Shared {
    /// Logs an Event and queues it for publishing (best effort, never blocks).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: EventType,
        reason: &str,
        note: &str,
    ) {
        self.events.emit(regarding, kind, reason, note);
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
