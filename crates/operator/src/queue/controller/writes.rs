//! The loop's writes to entries: every status write carries the entry's resourceVersion as
//! a precondition (a cancel can never be lost to it), builds on the loop's own newest write,
//! and is remembered until the cache catches up; a removal carries the entry's uid.

use hostcycle_api::queue::{RebootQueueEntry, RebootQueueEntryStatus};
use hostcycle_api::reasons::EventType;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};

use super::{Controller, FIELD_MANAGER};
use crate::cluster::errors::{is_conflict, is_not_found};

impl Controller {
    /// Writes the entry's status with its resourceVersion as a precondition. `None` when the
    /// write failed (a conflict: the entry changed, e.g. it was cancelled; the next round
    /// sees the change).
    pub(super) async fn write(
        &mut self,
        entry: &RebootQueueEntry,
        change: impl FnOnce(&mut RebootQueueEntryStatus),
    ) -> Option<RebootQueueEntry> {
        let next = self.with_status(entry, change);
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let result = replace_status(&api, &next).await;
        self.record_write(&next, result)
    }

    /// The entry with `change` applied to its status, built on the newest version the loop
    /// knows: its own last write may be newer than the copy a caller holds (several steps of
    /// one round write the same entry).
    pub(super) fn with_status(
        &self,
        entry: &RebootQueueEntry,
        change: impl FnOnce(&mut RebootQueueEntryStatus),
    ) -> RebootQueueEntry {
        let mut next = match self.written.get(&entry.name_any()) {
            Some(mine) if mine.uid() == entry.uid() && newer(mine, entry) => mine.clone(),
            _ => entry.clone(),
        };
        let mut status = next.status.take().unwrap_or_default();
        change(&mut status);
        status.message = bounded_message(&status.message);
        next.status = Some(status);
        next
    }

    /// Keeps a successful write as the newest known version; a failed one makes the loop look
    /// again soon (a conflict means the entry changed, e.g. it was cancelled).
    pub(super) fn record_write(
        &mut self,
        attempted: &RebootQueueEntry,
        result: Result<RebootQueueEntry, kube::Error>,
    ) -> Option<RebootQueueEntry> {
        match result {
            Ok(written) => {
                self.written.insert(written.name_any(), written.clone());
                Some(written)
            }
            Err(e) if is_conflict(&e) || is_not_found(&e) => {
                tracing::debug!(entry = %attempted.name_any(), node = %attempted.spec.node, "entry changed meanwhile; deciding again");
                self.retry_soon = true;
                None
            }
            Err(e) => {
                tracing::warn!(entry = %attempted.name_any(), node = %attempted.spec.node, error = %e, "cannot write the entry's status; retrying");
                self.retry_soon = true;
                None
            }
        }
    }

    /// Deletes the entry (UID precondition). True when it is gone.
    pub(super) async fn delete(&mut self, entry: &RebootQueueEntry) -> bool {
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: entry.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&entry.name_any(), &params).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(entry = %entry.name_any(), node = %entry.spec.node, error = %e, "cannot remove the entry; retrying");
                self.retry_soon = true;
                return false;
            }
        }
        if let Some(uid) = entry.uid() {
            self.deleted.insert(uid);
        }
        self.written.remove(&entry.name_any());
        self.forget_node_phase(&entry.spec.node);
        true
    }

    pub(super) async fn event_entry(
        &self,
        entry: &RebootQueueEntry,
        kind: EventType,
        event_reason: &str,
        note: &str,
    ) {
        self.shared
            .publish(&entry_ref(entry), kind, event_reason, note)
            .await;
    }
}

/// Writes an entry's status with its resourceVersion as a precondition.
pub(super) async fn replace_status(
    api: &Api<RebootQueueEntry>,
    next: &RebootQueueEntry,
) -> Result<RebootQueueEntry, kube::Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    api.replace_status(&next.name_any(), &params, next).await
}

/// True when `mine` is newer than `cached` (resourceVersions are etcd revisions; when
/// they do not parse, the cache wins).
pub(super) fn newer(mine: &RebootQueueEntry, cached: &RebootQueueEntry) -> bool {
    let parse = |e: &RebootQueueEntry| -> Option<u64> { e.resource_version()?.parse().ok() };
    match (parse(mine), parse(cached)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

fn entry_ref(entry: &RebootQueueEntry) -> ObjectReference {
    let mut r = entry.object_ref(&());
    r.namespace = None;
    r
}

/// Status messages stay short: they are shown in `kubectl get` columns.
pub(super) fn bounded_message(text: &str) -> String {
    crate::text::bounded(text, 1024)
}
