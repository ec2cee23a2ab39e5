//! Index allocation: unique, strictly increasing indices even with many `add`s at once.
//!
//! The next free index lives in the [`NEXT_INDEX_ANNOTATION`] of RebootQueue `default`. A
//! block of N indices is reserved with compare-and-swap: read the queue, compute the next
//! index, then write `next + N` with a merge patch carrying the read `resourceVersion` (a
//! precondition: the API server answers 409 Conflict when anyone wrote in between, and the
//! reservation is retried after a short random delay). Entry names derive from the index,
//! so even an index handed out twice (an annotation edited by hand) cannot make two entries:
//! the second create fails with AlreadyExists and its nodes get a fresh block.

use hostcycle_api::queue::{
    NEXT_INDEX_ANNOTATION, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry,
};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{
    api_error, get_or_create_queue, is_already_exists, is_conflict, is_object_not_found,
    jittered_delay, list_entries,
};

/// How many times a reservation that lost a race is tried again.
pub const RESERVE_ATTEMPTS: u32 = 60;
/// How many times entries that collided with existing ones get a fresh block.
const CREATE_ROUNDS: u32 = 10;

/// The first index of the next block: past the annotation, past every existing entry, and
/// never 0.
pub fn next_index(annotation: Option<u64>, highest_entry: Option<u64>) -> u64 {
    annotation
        .unwrap_or(0)
        .max(highest_entry.map_or(0, |h| h.saturating_add(1)))
        .max(1)
}

/// Reserves `count` consecutive indices and returns the first.
pub async fn reserve(client: &Client, count: u64) -> anyhow::Result<u64> {
    let queues: Api<RebootQueue> = Api::all(client.clone());
    for attempt in 0..RESERVE_ATTEMPTS {
        let queue = get_or_create_queue(client).await?;
        let Some(resource_version) = queue.metadata.resource_version.clone() else {
            anyhow::bail!(
                "RebootQueue {REBOOT_QUEUE_NAME} came back without a resourceVersion; \
                 cannot reserve indices safely"
            );
        };
        let highest = list_entries(client)
            .await
            .map_err(|e| api_error(e, "listing RebootQueueEntries"))?
            .iter()
            .map(|e| e.spec.index)
            .max();
        let next = next_index(queue.next_index(), highest);
        let Some(end) = next.checked_add(count) else {
            anyhow::bail!("the reboot queue's indices are exhausted (next index {next})");
        };
        let patch = json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { NEXT_INDEX_ANNOTATION: end.to_string() },
            }
        });
        match queues
            .patch(
                REBOOT_QUEUE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(next),
            // Someone else reserved (or the queue was deleted) in between: read again.
            Err(e) if is_conflict(&e) || is_object_not_found(&e) => {
                tracing::debug!(attempt, "index reservation lost a race; retrying");
                tokio::time::sleep(jittered_delay(attempt)).await;
            }
            Err(e) => {
                return Err(api_error(
                    e,
                    format!(
                        "reserving indices (annotation {NEXT_INDEX_ANNOTATION} on RebootQueue \
                         {REBOOT_QUEUE_NAME})"
                    ),
                ));
            }
        }
    }
    anyhow::bail!(
        "could not reserve indices: the annotation {NEXT_INDEX_ANNOTATION} on RebootQueue \
         {REBOOT_QUEUE_NAME} changed under every one of {RESERVE_ATTEMPTS} attempts (too many \
         concurrent adds); nothing more was queued, try again"
    )
}

/// Creates one entry per node, in order, with strictly increasing indices. Each created
/// entry is reported to `queued` at once (so a later failure still shows what was queued).
pub async fn create_entries(
    client: &Client,
    nodes: &[String],
    mut queued: impl FnMut(&str, u64),
) -> anyhow::Result<()> {
    let api: Api<RebootQueueEntry> = Api::all(client.clone());
    let mut remaining: &[String] = nodes;
    for _ in 0..CREATE_ROUNDS {
        if remaining.is_empty() {
            return Ok(());
        }
        let first = reserve(client, remaining.len() as u64).await?;
        let mut collided = false;
        let mut done = 0;
        for (offset, node) in remaining.iter().enumerate() {
            let index = first + offset as u64;
            match api
                .create(
                    &PostParams::default(),
                    &RebootQueueEntry::for_node(node, index),
                )
                .await
            {
                Ok(_) => {
                    queued(node, index);
                    done += 1;
                }
                Err(e) if is_already_exists(&e) => {
                    tracing::debug!(index, "entry name already taken; reserving a new block");
                    collided = true;
                    break;
                }
                Err(e) => {
                    let left: Vec<&str> = remaining[done..].iter().map(String::as_str).collect();
                    return Err(api_error(
                        e,
                        format!(
                            "creating RebootQueueEntry {} for node {node} (not queued: {})",
                            RebootQueueEntry::name_for_index(index),
                            left.join(", ")
                        ),
                    ));
                }
            }
        }
        remaining = &remaining[done..];
        if !collided {
            return Ok(());
        }
    }
    let left: Vec<&str> = remaining.iter().map(String::as_str).collect();
    anyhow::bail!(
        "entries kept colliding with existing ones after {CREATE_ROUNDS} fresh reservations; \
         not queued: {}. Is the annotation {NEXT_INDEX_ANNOTATION} being reset? Try again.",
        left.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_index_is_past_the_annotation_and_every_entry() {
        #[rustfmt::skip]
        let cases = [
            (None, None, 1),
            (Some(0), None, 1),
            (Some(7), None, 7),
            (None, Some(4), 5),
            (Some(7), Some(4), 7),
            (Some(3), Some(9), 10),
            (Some(5), Some(4), 5),
            (None, Some(u64::MAX), u64::MAX),
        ];
        for (annotation, highest, want) in cases {
            assert_eq!(
                next_index(annotation, highest),
                want,
                "annotation {annotation:?}, highest entry {highest:?}"
            );
        }
    }
}
