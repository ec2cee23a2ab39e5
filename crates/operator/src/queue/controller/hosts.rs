//! The loop's writes to BareMetalHosts: the reboot request and the markers that say which
//! entry a host's reboot belongs to (see `hostcycle_core::queue::reboot`), and the sweep of
//! markers whose entry is gone.

use std::collections::HashSet;
use std::sync::Arc;

use hostcycle_api::BareMetalHost;
use hostcycle_api::REBOOT_ANNOTATION;
use hostcycle_api::queue::{HostReference, RebootQueueEntry};
use hostcycle_core::queue::reboot::{COMMAND_MARKER_ANNOTATION, REQUEST_MARKER_ANNOTATION};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::Controller;
use crate::cluster::objects::host_reference;

impl Controller {
    /// Merge-patches a host's metadata (its namespace and name).
    pub(super) async fn patch_host(
        &self,
        host: &HostReference,
        patch: &serde_json::Value,
    ) -> Result<BareMetalHost, kube::Error> {
        let api: Api<BareMetalHost> = Api::namespaced(self.shared.client.clone(), &host.namespace);
        api.patch(&host.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
    }

    pub(super) fn cached_host(&self, host: &HostReference) -> Option<Arc<BareMetalHost>> {
        self.stores
            .hosts
            .get(&ObjectRef::new(&host.name).within(&host.namespace))
    }

    /// The host recorded at `Rebooting`, if it is still that host (same uid). A host
    /// re-created under the name is returned too (its view says it was replaced).
    pub(super) async fn fresh_host(&mut self, host: &HostReference) -> Option<BareMetalHost> {
        let api: Api<BareMetalHost> = Api::namespaced(self.shared.client.clone(), &host.namespace);
        match api.get_opt(&host.name).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(host = %host, error = %e, "cannot read the host; retrying");
                self.retry_soon = true;
                None
            }
        }
    }

    /// Adds the suffixless reboot annotation and the request marker in one patch.
    pub(super) async fn request_host_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        host: &BareMetalHost,
    ) {
        let Some(uid) = entry.uid() else { return };
        // The uid is a precondition (immutable: a host re-created under the name refuses the
        // patch): the reboot is requested from the bound host only.
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": {
            REBOOT_ANNOTATION: "",
            REQUEST_MARKER_ANNOTATION: uid,
        }}});
        let reference = host_reference(host);
        match self.patch_host(&reference, &patch).await {
            Ok(_) => {
                tracing::info!(node = %entry.spec.node, host = %reference, "reboot requested through the BareMetalHost")
            }
            Err(e) => {
                tracing::warn!(node = %entry.spec.node, error = %e, "cannot annotate the BareMetalHost; retrying");
                self.retry_soon = true;
            }
        }
    }

    /// Marks the host as rebooted by this entry's command (see [`COMMAND_MARKER_ANNOTATION`]).
    pub(super) async fn mark_command_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        host: &BareMetalHost,
    ) {
        let Some(uid) = entry.uid() else { return };
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": {
            COMMAND_MARKER_ANNOTATION: uid,
        }}});
        if let Err(e) = self.patch_host(&host_reference(host), &patch).await {
            // Not fatal: without it the host controller may power the host on mid-cycle.
            tracing::warn!(node = %entry.spec.node, error = %e, "cannot mark the host as rebooted by command");
        }
    }

    /// Removes the markers this entry left on its host: the request marker and the command
    /// marker (best effort; the sweep removes a command marker left behind).
    pub(super) async fn clear_host_marker(&self, entry: &RebootQueueEntry) {
        let Some(host) = entry
            .status
            .as_ref()
            .and_then(|s| s.reboot.as_ref())
            .and_then(|r| r.host.clone())
        else {
            return;
        };
        let Some(cached) = self.cached_host(&host) else {
            return;
        };
        let ours = |key: &str| cached.annotations().get(key) == entry.uid().as_ref();
        let mut removals = serde_json::Map::new();
        for key in [REQUEST_MARKER_ANNOTATION, COMMAND_MARKER_ANNOTATION] {
            if ours(key) {
                removals.insert(key.to_string(), serde_json::Value::Null);
            }
        }
        if removals.is_empty() {
            return;
        }
        let patch = json!({ "metadata": {
            "resourceVersion": cached.resource_version(),
            "annotations": removals,
        }});
        if let Err(e) = self.patch_host(&host, &patch).await {
            tracing::debug!(host = %host, error = %e, "markers left on the host");
        }
    }

    /// Command markers whose entry is gone (a removal lost to a crash, an entry deleted by
    /// hand): the host controller would leave that host's power alone for good.
    pub(super) async fn sweep_command_markers(&mut self) {
        let marked: Vec<Arc<BareMetalHost>> = self
            .stores
            .hosts
            .state()
            .into_iter()
            .filter(|h| h.annotations().contains_key(COMMAND_MARKER_ANNOTATION))
            .collect();
        if marked.is_empty() {
            return;
        }
        let live: HashSet<String> = self.entries().iter().filter_map(|e| e.uid()).collect();
        let orphans: Vec<Arc<BareMetalHost>> = marked
            .into_iter()
            .filter(|h| {
                h.annotations()
                    .get(COMMAND_MARKER_ANNOTATION)
                    .is_some_and(|uid| !live.contains(uid))
            })
            .collect();
        if orphans.is_empty() {
            return;
        }
        // The cache may lag an entry just created: confirm with the API server.
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let Ok(list) = api.list(&Default::default()).await else {
            return;
        };
        let live: HashSet<String> = list.items.iter().filter_map(|e| e.uid()).collect();
        for host in orphans {
            let Some(uid) = host.annotations().get(COMMAND_MARKER_ANNOTATION) else {
                continue;
            };
            if live.contains(uid) {
                continue;
            }
            let patch = json!({ "metadata": {
                "resourceVersion": host.resource_version(),
                "annotations": { COMMAND_MARKER_ANNOTATION: null },
            }});
            match self.patch_host(&host_reference(&host), &patch).await {
                Ok(_) => {
                    tracing::info!(host = %host_reference(&host), "removed the command marker of a reboot queue entry that is gone")
                }
                Err(e) => {
                    tracing::debug!(host = %host_reference(&host), error = %e, "command marker not removed; next sweep")
                }
            }
        }
    }
}
