//! Watches whose cached objects keep only what the controllers read.
//!
//! Every controller caches whole objects (all BareMetalHosts up to three times: the host
//! controller's, the reboot queue's and remediation's stores). Two parts of an object are
//! never read and are often its largest: `metadata.managedFields` (server-side apply's
//! bookkeeping, one entry per writer, rewritten on every status write) and kubectl's
//! last-applied-configuration annotation (a second copy of the object). They are dropped
//! before an object is stored. Writes are unaffected: status is written to the status
//! subresource (the server ignores metadata there) and everything else is patched.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// kubectl's copy of the last applied object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// [`watcher`] whose objects lose their managed fields and last-applied annotation.
pub fn lean_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, config).modify(strip_unread_metadata)
}

/// Passes a reflector's events on and sets `listed` once the first complete list has gone
/// through (the reflector upstream has then filled its store).
///
/// This is how a controller learns that a store is ready without waiting on it: kube's
/// `Store::wait_until_ready` wakes only the task that polled it last (its `DelayedInit` is a
/// oneshot receiver), and the controller's runner already waits on the store it was given.
/// A second waiter takes that wake-up away and the runner never starts.
pub fn note_listed<K, S>(
    events: S,
    listed: tokio::sync::watch::Sender<bool>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    use futures::StreamExt as _;
    events.inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            // Once: a re-list after a broken watch says nothing new.
            listed.send_if_modified(|listed| !std::mem::replace(listed, true));
        }
    })
}

/// Drops what no controller reads from a watched object (see the module's comment).
pub fn strip_unread_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// What a waker's watch covers, for its error messages.
pub struct Watched {
    pub resource: String,
    /// Empty for every namespace (or a cluster-scoped resource).
    pub namespace: String,
}

impl Watched {
    pub fn all(resource: &str) -> Self {
        Watched {
            resource: resource.to_string(),
            namespace: String::new(),
        }
    }

    pub fn in_namespace(resource: &str, namespace: Option<&String>) -> Self {
        Watched {
            resource: resource.to_string(),
            namespace: namespace.cloned().unwrap_or_default(),
        }
    }
}

/// A reflector store of `api`'s objects, kept by a task that wakes the loop at every change.
pub fn watch_store<K>(
    api: Api<K>,
    watched: Watched,
    wake: Arc<Notify>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector(writer, lean_watcher(api, watcher::Config::default()));
    (store, spawn_waker(watched, stream, wake, |_| true))
}

pub fn spawn_waker<K, S>(
    watched: Watched,
    stream: S,
    wake: Arc<Notify>,
    mut relevant: impl FnMut(&K) -> bool + Send + 'static,
) -> JoinHandle<()>
where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let stream = stream.backoff(crate::backoff::WatchBackoff::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let wake_now = match &event {
                Ok(watcher::Event::Apply(obj)) => relevant(obj),
                Ok(watcher::Event::Delete(_) | watcher::Event::InitDone) => true,
                Ok(_) => false,
                Err(e) => {
                    // A refusal by RBAC is said in words at warn level: the controller is
                    // blind until the permission is granted.
                    let text = crate::text::watch_error(e, &watched.resource, &watched.namespace);
                    if text.starts_with("forbidden") {
                        tracing::warn!(error = %text, "watch refused; retrying with backoff");
                    } else {
                        tracing::debug!(error = %text, "watch error; the watcher retries");
                    }
                    false
                }
            };
            if wake_now {
                wake.notify_one();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    #[tokio::test]
    async fn listed_is_said_once_the_first_list_is_through() {
        use futures::StreamExt as _;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(Node::default())),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(Node::default())),
        ]);
        let mut events = Box::pin(note_listed(events, tx));
        let mut seen = 0;
        while let Some(event) = events.next().await {
            seen += 1;
            // Not before the list's end has gone through, and from then on.
            assert_eq!(*rx.borrow(), seen >= 3, "after event {seen}: {event:?}");
        }
        assert_eq!(seen, 4, "every event is passed on");
    }

    #[test]
    fn managed_fields_and_last_applied_go_everything_else_stays() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "n",
                "annotations": {
                    LAST_APPLIED_ANNOTATION: "{\"big\":\"copy\"}",
                    "reboot.metal3.io": "",
                },
                "labels": { "a": "b" },
                "managedFields": [{ "manager": "kubelet", "operation": "Update",
                                    "fieldsType": "FieldsV1", "fieldsV1": { "f:status": {} } }],
            },
            "spec": { "unschedulable": true },
        }))
        .unwrap();
        strip_unread_metadata(&mut node);
        assert_eq!(node.metadata.managed_fields, None);
        let annotations = node.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key("reboot.metal3.io"));
        assert_eq!(node.metadata.labels.unwrap()["a"], "b");
        assert_eq!(node.spec.unwrap().unschedulable, Some(true));
    }
}
