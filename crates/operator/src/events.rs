//! Kubernetes Events (events.k8s.io/v1) about our objects.
//!
//! Like kube's `Recorder`, but repeats are folded into a series only when the note is the same
//! too: "removed annotation A" and "removed annotation B" are two Events, as an operator reading
//! `kubectl describe` expects.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;

/// Where Events about cluster-scoped objects are written.
pub const CLUSTER_SCOPED_EVENT_NAMESPACE: &str = "kube-system";

/// Repeats within this window become a series on the first Event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Normal,
    Warning,
}

impl EventKind {
    fn as_str(self) -> &'static str {
        match self {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    uid: String,
    kind: EventKind,
    reason: String,
    note: String,
}

#[derive(Debug, Clone)]
struct SeriesState {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events as one reporting controller instance.
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<SeriesKey, SeriesState>>,
}

impl EventPublisher {
    pub fn new(client: Client, controller: impl Into<String>, instance: impl Into<String>) -> Self {
        EventPublisher {
            client,
            controller: controller.into(),
            instance: instance.into(),
            series: Mutex::default(),
        }
    }

    /// Publishes one Event about `regarding`. `action` says what the controller did
    /// (e.g. `PowerManagement`); `reason` is CamelCase.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: EventKind,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        // Events about cluster-scoped objects (Nodes, queue entries) live in kube-system:
        // Kubernetes 1.20 accepts no other namespace for them through events.k8s.io/v1, and
        // `kubectl describe` finds them there as well.
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| CLUSTER_SCOPED_EVENT_NAMESPACE.into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let now = Timestamp::now();
        let key = SeriesKey {
            uid: regarding.uid.clone().unwrap_or_default(),
            kind,
            reason: reason.to_string(),
            note: note.to_string(),
        };
        let mut series = self.series.lock().await;
        series.retain(|_, s| now.duration_since(s.last).unsigned_abs() < SERIES_WINDOW);
        if let Some(state) = series.get_mut(&key) {
            state.count += 1;
            state.last = now;
            let patch =
                json!({ "series": { "count": state.count, "lastObservedTime": MicroTime(now) } });
            match api
                .patch(&state.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                // Expired or deleted meanwhile: start a new Event below.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let base = regarding.name.clone().unwrap_or_else(|| "object".into());
        let name = format!("{base}.{:x}", now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(kind.as_str().to_string()),
            reason: Some(reason.to_string()),
            action: Some(action.to_string()),
            // events.k8s.io/v1 limits the note to 1 KiB.
            note: Some(crate::text::bounded(note, 1024)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        series.insert(
            key,
            SeriesState {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

/// Events handed to one background task that publishes them in order, so emitting one never
/// holds up a controller (a slow events API must not delay a power-off or an uncordon).
/// Dropping every clone ends the task once the queued Events are out.
#[derive(Clone)]
pub struct EventSink {
    action: &'static str,
    sender: tokio::sync::mpsc::UnboundedSender<(ObjectReference, EventKind, String, String)>,
}

impl EventSink {
    /// A sink publishing through `publisher` with this `action`, and its task.
    pub fn start(
        publisher: EventPublisher,
        action: &'static str,
    ) -> (EventSink, tokio::task::JoinHandle<()>) {
        let (sender, mut queue) =
            tokio::sync::mpsc::unbounded_channel::<(ObjectReference, EventKind, String, String)>();
        let task = tokio::spawn(async move {
            while let Some((regarding, kind, reason, note)) = queue.recv().await {
                if let Err(e) = publisher
                    .publish(&regarding, kind, &reason, action, &note)
                    .await
                {
                    tracing::warn!(object = ?regarding.name, reason, error = %e, "could not publish event");
                }
            }
        });
        (EventSink { action, sender }, task)
    }

    /// Logs the Event and queues it (best effort, never blocks).
    pub fn emit(&self, regarding: &ObjectReference, kind: EventKind, reason: &str, note: &str) {
        let object = format!(
            "{}/{}",
            regarding.kind.as_deref().unwrap_or("object"),
            regarding.name.as_deref().unwrap_or("")
        );
        let action = self.action;
        match kind {
            EventKind::Normal => tracing::info!(%object, reason, note, action, "event"),
            EventKind::Warning => tracing::warn!(%object, reason, note, action, "event"),
        }
        let _ = self.sender.send((
            regarding.clone(),
            kind,
            reason.to_string(),
            note.to_string(),
        ));
    }
}
