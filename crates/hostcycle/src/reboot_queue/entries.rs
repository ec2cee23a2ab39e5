//! `list`, `cancel`, `cancel-all` and `reset-backoff`: reads and writes of entries.

use std::collections::BTreeSet;

use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{
    ListFormat, api_error, describe, is_conflict, is_object_not_found, jittered_delay,
    list_entries, output,
};

/// How many times a status write that lost a race with the controller is retried.
const STATUS_ATTEMPTS: u32 = 10;

fn listing_error(e: kube::Error) -> anyhow::Error {
    api_error(e, "listing RebootQueueEntries")
}

/// Runs `list`.
pub async fn list(client: &Client, format: ListFormat) -> anyhow::Result<()> {
    let entries = list_entries(client).await.map_err(listing_error)?;
    if entries.is_empty() && format == ListFormat::Table {
        eprintln!("the reboot queue is empty");
        return Ok(());
    }
    print!("{}", output::render_list(&entries, format)?);
    Ok(())
}

/// Which entries a `cancel` argument names: a number is an index, anything else a node.
pub fn select<'a>(entries: &'a [RebootQueueEntry], target: &str) -> Vec<&'a RebootQueueEntry> {
    let target = target.trim();
    match target.parse::<u64>() {
        Ok(index) => entries.iter().filter(|e| e.spec.index == index).collect(),
        Err(_) => {
            let node = target
                .strip_prefix("node/")
                .or_else(|| target.strip_prefix("nodes/"))
                .unwrap_or(target);
            entries.iter().filter(|e| e.spec.node == node).collect()
        }
    }
}

/// Runs `cancel INDEX|NODE…`.
pub async fn cancel(client: &Client, targets: &[String]) -> anyhow::Result<()> {
    let entries = list_entries(client).await.map_err(listing_error)?;
    let mut unknown = Vec::new();
    let mut chosen: Vec<&RebootQueueEntry> = Vec::new();
    let mut seen = BTreeSet::new();
    for target in targets {
        let found = select(&entries, target);
        if found.is_empty() {
            if target.trim().parse::<u64>().is_ok() {
                eprintln!("error: no entry has index {target}");
            } else {
                eprintln!("error: no entry queues node {target}");
            }
            unknown.push(target.as_str());
        }
        for entry in found {
            if seen.insert(entry.metadata.name.clone()) {
                chosen.push(entry);
            }
        }
    }
    cancel_entries(client, &chosen).await?;
    if !unknown.is_empty() {
        anyhow::bail!(
            "not in the queue: {} (see `hostcycle rq list`); {}",
            unknown.join(", "),
            if chosen.is_empty() {
                "nothing was cancelled"
            } else {
                "the others were cancelled"
            }
        );
    }
    Ok(())
}

/// Runs `cancel-all`.
pub async fn cancel_all(client: &Client) -> anyhow::Result<()> {
    let entries = list_entries(client).await.map_err(listing_error)?;
    if entries.is_empty() {
        println!("the reboot queue is empty; nothing to cancel");
        return Ok(());
    }
    let all: Vec<&RebootQueueEntry> = entries.iter().collect();
    cancel_entries(client, &all).await
}

async fn cancel_entries(client: &Client, entries: &[&RebootQueueEntry]) -> anyhow::Result<()> {
    let api: Api<RebootQueueEntry> = Api::all(client.clone());
    let patch = json!({ "spec": { "cancel": true } });
    for entry in entries {
        let what = describe(entry);
        if entry.spec.cancel {
            println!("{what} was already cancelled");
            continue;
        }
        let name = entry.metadata.name.clone().unwrap_or_default();
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) if entry.phase() == EntryPhase::Rebooting => {
                println!("cancelled {what} (already rebooting: the reboot finishes)");
            }
            Ok(_) => println!("cancelled {what}"),
            Err(e) if is_object_not_found(&e) => println!("{what} has already left the queue"),
            Err(e) => {
                return Err(api_error(
                    e,
                    format!("cancelling {what} (RebootQueueEntry {name})"),
                ));
            }
        }
    }
    Ok(())
}

fn has_backoff(entry: &RebootQueueEntry) -> bool {
    entry
        .status
        .as_ref()
        .is_some_and(|s| s.drain_backoff_count > 0 || s.drain_backoff_expire.is_some())
}

fn backoff_text(entry: &RebootQueueEntry) -> String {
    let Some(status) = &entry.status else {
        return String::new();
    };
    let count = status.drain_backoff_count;
    let failures = format!("{count} failed drain{}", if count == 1 { "" } else { "s" });
    match status.drain_backoff_expire {
        Some(until) => format!("{failures}, backed off until {until}"),
        None => failures,
    }
}

/// Runs `reset-backoff`: clears `drainBackoffCount` and `drainBackoffExpire` through the
/// status subresource, with the read resourceVersion as a precondition (the controller
/// writes status the same way, so a conflict means: read again and retry).
pub async fn reset_backoff(client: &Client) -> anyhow::Result<()> {
    let api: Api<RebootQueueEntry> = Api::all(client.clone());
    let entries = list_entries(client).await.map_err(listing_error)?;
    let backed_off: Vec<&RebootQueueEntry> = entries.iter().filter(|e| has_backoff(e)).collect();
    if backed_off.is_empty() {
        println!("no entry has a drain backoff");
        return Ok(());
    }
    let mut failed = Vec::new();
    for entry in backed_off {
        let what = describe(entry);
        let name = entry.metadata.name.clone().unwrap_or_default();
        let mut current = entry.clone();
        let mut attempt = 0;
        loop {
            if !has_backoff(&current) {
                println!("{what}: no drain backoff any more");
                break;
            }
            if attempt >= STATUS_ATTEMPTS {
                eprintln!(
                    "error: {what}: its status changed under each of {STATUS_ATTEMPTS} \
                     attempts; run `hostcycle rq reset-backoff` again"
                );
                failed.push(what.clone());
                break;
            }
            let patch = json!({
                "metadata": { "resourceVersion": current.metadata.resource_version },
                "status": { "drainBackoffCount": null, "drainBackoffExpire": null },
            });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    println!(
                        "reset the drain backoff of {what} (was {})",
                        backoff_text(&current)
                    );
                    break;
                }
                Err(e) if is_conflict(&e) => {
                    tokio::time::sleep(jittered_delay(attempt)).await;
                    attempt += 1;
                    match api.get_opt(&name).await {
                        Ok(Some(fresh)) => current = fresh,
                        Ok(None) => {
                            println!("{what} has left the queue");
                            break;
                        }
                        Err(e) => {
                            eprintln!("error: {:#}", api_error(e, format!("reading {what}")));
                            failed.push(what.clone());
                            break;
                        }
                    }
                }
                Err(e) if is_object_not_found(&e) => {
                    println!("{what} has left the queue");
                    break;
                }
                Err(e) => {
                    eprintln!(
                        "error: {:#}",
                        api_error(e, format!("resetting the drain backoff of {what}"))
                    );
                    failed.push(what.clone());
                    break;
                }
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "the drain backoff of {} was not reset (see above)",
            failed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_indexes_and_anything_else_a_node() {
        let mut cancelled = RebootQueueEntry::for_node("worker-1", 1);
        cancelled.spec.cancel = true;
        let entries = vec![
            cancelled,
            RebootQueueEntry::for_node("worker-2", 2),
            RebootQueueEntry::for_node("worker-1", 3),
            RebootQueueEntry::for_node("7", 4),
        ];
        let indexes =
            |t: &str| -> Vec<u64> { select(&entries, t).iter().map(|e| e.spec.index).collect() };
        assert_eq!(indexes("2"), [2]);
        assert_eq!(indexes("worker-1"), [1, 3]);
        assert_eq!(indexes("node/worker-2"), [2]);
        assert_eq!(indexes("9"), Vec::<u64>::new());
        assert_eq!(
            indexes("7"),
            Vec::<u64>::new(),
            "a number is always an index"
        );
    }
}
