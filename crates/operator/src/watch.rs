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

use futures::Stream;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

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
