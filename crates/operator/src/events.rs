//! Kubernetes Events (events.k8s.io/v1) about our objects.
//!
//! Like kube's `Recorder`, but repeats are folded into a series only when the note is the same
//! too: "removed annotation A" and "removed annotation B" are two Events, as an operator reading
//! `kubectl describe` expects.

use crate::cluster::errors::is_not_found;
use std::collections::HashMap;
use std::time::Duration;

use hostcycle_api::reasons::EventType;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Where Events about cluster-scoped objects are written.
pub const CLUSTER_SCOPED_EVENT_NAMESPACE: &str = "kube-system";

/// Repeats within this window become a series on the first Event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    uid: String,
    kind: EventType,
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
    /// Held only to read or update the map, never across an API call: a slow events API
    /// delays that one Event, not every other publish.
    series: std::sync::Mutex<HashMap<SeriesKey, SeriesState>>,
}

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

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

/// A unique, valid Event name for an Event about `object` at `now`: the object's name cut so
/// the whole stays a DNS subdomain of at most 253 characters, then a time suffix.
pub fn event_name(object: &str, now: Timestamp) -> String {
    let suffix = format!(".{:x}", now.as_nanosecond().max(0));
    let mut base: String = object
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.')
        .take(MAX_NAME - suffix.len())
        .collect();
    // Labels must start and end with an alphanumeric character.
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    let base = base.trim_start_matches(['-', '.']);
    let base = if base.is_empty() { "object" } else { base };
    format!("{base}{suffix}")
}

impl EventPublisher {
    pub fn new(client: Client, controller: impl Into<String>, instance: impl Into<String>) -> Self {
        EventPublisher {
            client,
            controller: controller.into(),
            instance: instance.into(),
            series: std::sync::Mutex::default(),
        }
    }

    /// Publishes one Event about `regarding`. `action` says what the controller did
    /// (e.g. `PowerManagement`); `reason` is CamelCase.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: EventType,
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
        let repeat = {
            let mut series = self.lock_series();
            series.retain(|_, s| now.duration_since(s.last).unsigned_abs() < SERIES_WINDOW);
            series
                .get(&key)
                .map(|s| (s.name.clone(), s.count.saturating_add(1)))
        };
        if let Some((name, count)) = repeat {
            let patch = json!({ "series": { "count": count, "lastObservedTime": MicroTime(now) } });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Some(state) = self.lock_series().get_mut(&key) {
                        state.count = state.count.max(count);
                        state.last = now;
                    }
                    return Ok(());
                }
                // Expired or deleted meanwhile: start a new Event below.
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let base = regarding.name.clone().unwrap_or_else(|| "object".into());
        let name = event_name(&base, now);
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
        self.lock_series().insert(
            key,
            SeriesState {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn lock_series(&self) -> std::sync::MutexGuard<'_, HashMap<SeriesKey, SeriesState>> {
        match self.series.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Events handed to one background task that publishes them in order, so emitting one never
/// holds up a controller (a slow events API must not delay a power-off or an uncordon).
/// Dropping every clone ends the task once the queued Events are out.
#[derive(Clone)]
pub struct EventSink {
    action: &'static str,
    sender: tokio::sync::mpsc::UnboundedSender<(ObjectReference, EventType, String, String)>,
}

impl EventSink {
    /// A sink publishing through `publisher` with this `action`, and its task.
    pub fn start(
        publisher: EventPublisher,
        action: &'static str,
    ) -> (EventSink, tokio::task::JoinHandle<()>) {
        let (sender, mut queue) =
            tokio::sync::mpsc::unbounded_channel::<(ObjectReference, EventType, String, String)>();
        let task = tokio::spawn(async move {
            while let Some((regarding, kind, reason, note)) = queue.recv().await {
                if let Err(e) = publisher
                    .publish(&regarding, kind, &reason, action, &note)
                    .await
                {
                    let about = LogSubject::of(&regarding);
                    tracing::warn!(
                        host = about.host.as_deref(),
                        node = about.node.as_deref(),
                        machine = about.machine.as_deref(),
                        entry = about.entry.as_deref(),
                        remediation = about.remediation.as_deref(),
                        reason,
                        error = %e,
                        "could not publish event"
                    );
                }
            }
        });
        (EventSink { action, sender }, task)
    }

    /// Logs the Event and queues it (best effort, never blocks).
    pub fn emit(&self, regarding: &ObjectReference, kind: EventType, reason: &str, note: &str) {
        let object = format!(
            "{}/{}",
            regarding.kind.as_deref().unwrap_or("object"),
            regarding.name.as_deref().unwrap_or("")
        );
        let action = self.action;
        let about = LogSubject::of(regarding);
        let (host, node, machine, entry, remediation) = (
            about.host.as_deref(),
            about.node.as_deref(),
            about.machine.as_deref(),
            about.entry.as_deref(),
            about.remediation.as_deref(),
        );
        match kind {
            EventType::Normal => tracing::info!(
                %object, host, node, machine, entry, remediation, reason, note, action, "event"
            ),
            EventType::Warning => tracing::warn!(
                %object, host, node, machine, entry, remediation, reason, note, action, "event"
            ),
        }
        let _ = self.sender.send((
            regarding.clone(),
            kind,
            reason.to_string(),
            note.to_string(),
        ));
    }
}

/// The log field naming an Event's object, by its kind — `host`, `node`, `machine`, `entry`
/// or `remediation`, `namespace/name` when namespaced — the same fields every other log line
/// about that object carries, so one search finds both.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LogSubject {
    pub host: Option<String>,
    pub node: Option<String>,
    pub machine: Option<String>,
    pub entry: Option<String>,
    pub remediation: Option<String>,
}

impl LogSubject {
    pub fn of(regarding: &ObjectReference) -> LogSubject {
        let name = regarding.name.clone().unwrap_or_default();
        let qualified = match regarding.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
            _ => name.clone(),
        };
        let mut subject = LogSubject::default();
        match regarding.kind.as_deref() {
            Some("BareMetalHost") => subject.host = Some(qualified),
            Some("Node") => subject.node = Some(name),
            Some("Machine") => subject.machine = Some(qualified),
            Some("RebootQueueEntry") => subject.entry = Some(name),
            Some("HostRemediation") => subject.remediation = Some(qualified),
            _ => {}
        }
        subject
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::fake_client;
    use std::sync::Arc;
    use std::sync::Mutex as StdMutex;

    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn event_names_are_valid_for_any_object_name() {
        let now = Timestamp::now();
        let long = "h".repeat(253);
        let dotted = format!("{}.{}", "a".repeat(200), "b".repeat(52));
        let cut_at_dash = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        for object in [
            "host-1",
            long.as_str(),
            dotted.as_str(),
            cut_at_dash.as_str(),
            "",
            "-.-",
            "UPPER_case",
        ] {
            let name = event_name(object, now);
            assert!(
                is_dns_subdomain(&name),
                "{object:?} → {name:?} ({})",
                name.len()
            );
        }
        assert!(event_name(&long, now).starts_with("hhhh"));
        assert_ne!(
            event_name("a", now),
            event_name(
                "a",
                now.checked_add(jiff::SignedDuration::from_nanos(1))
                    .unwrap()
            )
        );
    }

    /// What the fake events API received.
    #[derive(Default)]
    struct Seen {
        created: Vec<String>,
        patched: Vec<String>,
    }

    fn events_api(seen: Arc<StdMutex<Seen>>, slow: &'static str) -> kube::Client {
        fake_client(move |req| {
            let seen = seen.clone();
            async move {
                let body = req.json();
                if req.method == http::Method::POST {
                    let regarding = body["regarding"]["name"].as_str().unwrap_or_default();
                    if regarding == slow {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    let name = body["metadata"]["name"].as_str().unwrap_or_default();
                    seen.lock().unwrap().created.push(name.to_string());
                    (201, body)
                } else {
                    let name = req.path.rsplit('/').next().unwrap_or_default().to_string();
                    seen.lock().unwrap().patched.push(name.clone());
                    (
                        200,
                        json!({ "apiVersion": "events.k8s.io/v1", "kind": "Event",
                                "metadata": { "name": name, "namespace": "ns" },
                                "eventTime": MicroTime(Timestamp::now()) }),
                    )
                }
            }
        })
    }

    fn about(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("BareMetalHost".into()),
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    /// One slow events API call (for one host) must not hold up Events about other hosts.
    #[tokio::test]
    async fn a_slow_event_does_not_hold_up_others() {
        let seen = Arc::new(StdMutex::new(Seen::default()));
        let publisher = Arc::new(EventPublisher::new(
            events_api(seen.clone(), "slow"),
            "test",
            "instance",
        ));
        let slow = {
            let publisher = publisher.clone();
            tokio::spawn(async move {
                publisher
                    .publish(&about("slow"), EventType::Warning, "BMCError", "A", "down")
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fast = tokio::time::timeout(
            Duration::from_secs(2),
            publisher.publish(&about("fast"), EventType::Normal, "PowerOff", "A", "off"),
        )
        .await;
        assert!(
            matches!(fast, Ok(Ok(()))),
            "an Event about another host waited for the slow one: {fast:?}"
        );
        assert!(!slow.is_finished());
        slow.abort();
    }

    /// Repeats (same object, reason and note) fold into one Event's series.
    #[tokio::test]
    async fn repeats_fold_into_a_series() {
        let seen = Arc::new(StdMutex::new(Seen::default()));
        let publisher = EventPublisher::new(events_api(seen.clone(), ""), "test", "instance");
        let long = "h".repeat(253);
        for _ in 0..4 {
            publisher
                .publish(
                    &about(&long),
                    EventType::Warning,
                    "BMCError",
                    "A",
                    "unreachable",
                )
                .await
                .unwrap();
        }
        publisher
            .publish(
                &about(&long),
                EventType::Warning,
                "BMCError",
                "A",
                "other note",
            )
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.created.len(), 2, "{:?}", seen.created);
        assert_eq!(seen.patched.len(), 3);
        assert!(seen.patched.iter().all(|p| *p == seen.created[0]));
        assert!(
            seen.created.iter().all(|n| is_dns_subdomain(n)),
            "{:?}",
            seen.created
        );
    }

    #[test]
    fn the_log_names_an_events_object_with_the_field_of_its_kind() {
        let reference = |kind: &str, ns: Option<&str>, name: &str| ObjectReference {
            kind: Some(kind.into()),
            namespace: ns.map(String::from),
            name: Some(name.into()),
            ..Default::default()
        };
        let host = LogSubject::of(&reference("BareMetalHost", Some("metal"), "h-1"));
        assert_eq!(host.host.as_deref(), Some("metal/h-1"));
        assert_eq!(host.node, None);
        let node = LogSubject::of(&reference("Node", None, "worker-1"));
        assert_eq!(node.node.as_deref(), Some("worker-1"));
        let machine = LogSubject::of(&reference("Machine", Some("openshift"), "m"));
        assert_eq!(machine.machine.as_deref(), Some("openshift/m"));
        let entry = LogSubject::of(&reference("RebootQueueEntry", None, "worker-1-3"));
        assert_eq!(entry.entry.as_deref(), Some("worker-1-3"));
        let request = LogSubject::of(&reference("HostRemediation", Some("ns"), "r"));
        assert_eq!(request.remediation.as_deref(), Some("ns/r"));
        assert_eq!(
            LogSubject::of(&reference("RebootQueue", None, "default")),
            LogSubject::default()
        );
    }
}
