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
