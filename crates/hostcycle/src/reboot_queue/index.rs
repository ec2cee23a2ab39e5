//! Index allocation: unique, strictly increasing indices even with many `add`s at once,
//! without writing the RebootQueue.
//!
//! Entry names derive from the index (`RebootQueueEntry::name_for_index`), so creating an
//! entry claims its index atomically: of two `add`s that picked the same index, the second
//! create fails with AlreadyExists and its nodes get a fresh block after a short random
//! delay. The first free index is past every existing entry and past what the RebootQueue
//! records ([`RebootQueue::next_index`]: the highest index the controller has seen, and the
//! annotation older versions wrote), so indices keep increasing after entries leave.
//!
//! Older versions reserved blocks in an annotation of the RebootQueue. That needed a patch
//! of the RebootQueue, which RBAC cannot limit to one annotation: whoever could queue a
//! reboot could rewrite the queue's configuration. `add` now only reads it.

use hostcycle_api::queue::{REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use kube::Client;
use kube::api::{Api, PostParams};

use super::{api_error, is_already_exists, jittered_delay, list_entries};

/// How many times entries that collided with a concurrent `add` get a fresh block.
pub const CREATE_ROUNDS: u32 = 60;

/// The first index of the next block: past what the queue records, past every existing
/// entry, and never 0.
pub fn next_index(recorded: Option<u64>, highest_entry: Option<u64>) -> u64 {
    recorded
        .unwrap_or(0)
        .max(highest_entry.map_or(0, |h| h.saturating_add(1)))
        .max(1)
}

/// The first free index now (a read: nothing is reserved).
pub async fn first_free(client: &Client) -> anyhow::Result<u64> {
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let recorded = queues
        .get_opt(REBOOT_QUEUE_NAME)
        .await
        .map_err(|e| api_error(e, format!("reading RebootQueue {REBOOT_QUEUE_NAME}")))?
        .and_then(|q| q.next_index());
    let highest = list_entries(client)
        .await
        .map_err(|e| api_error(e, "listing RebootQueueEntries"))?
        .iter()
        .map(|e| e.spec.index)
        .max();
    Ok(next_index(recorded, highest))
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
    for round in 0..CREATE_ROUNDS {
        if remaining.is_empty() {
            return Ok(());
        }
        let first = first_free(client).await?;
        if first.checked_add(remaining.len() as u64).is_none() {
            anyhow::bail!("the reboot queue's indices are exhausted (next index {first})");
        }
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
                    tracing::debug!(
                        index,
                        "a concurrent add took this index; trying a new block"
                    );
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
        tokio::time::sleep(jittered_delay(round)).await;
    }
    let left: Vec<&str> = remaining.iter().map(String::as_str).collect();
    anyhow::bail!(
        "entries kept colliding with concurrent adds after {CREATE_ROUNDS} fresh blocks; not \
         queued: {}. Try again.",
        left.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_index_is_past_what_the_queue_records_and_every_entry() {
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
                "recorded {annotation:?}, highest entry {highest:?}"
            );
        }
    }
}
