//! `wait`: progress until the queue is empty, polling once a second.

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::RebootQueueEntry;
use kube::Client;
use tokio::time::Instant;

use super::{api_error, describe, list_entries};

/// How often the entries are read.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// `entry 3 worker-1: Draining — evicting 2 pods`.
pub fn progress_line(entry: &RebootQueueEntry) -> String {
    let mut line = format!("{}: {}", describe(entry), entry.phase());
    if entry.spec.cancel && entry.phase() != hostcycle_api::queue::EntryPhase::Cancelled {
        line.push_str(" (cancel requested)");
    }
    let message = entry
        .status
        .as_ref()
        .map(|s| s.message.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    if !message.is_empty() {
        line.push_str(" — ");
        line.push_str(&message);
    }
    line
}

/// What changed since the last poll: lines to print. `seen` maps object names to
/// `(description, last line printed)` and is updated.
pub fn changes(
    seen: &mut BTreeMap<String, (String, String)>,
    entries: &[RebootQueueEntry],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut present = BTreeMap::new();
    for entry in entries {
        let name = entry.metadata.name.clone().unwrap_or_default();
        let line = progress_line(entry);
        if seen.get(&name).map(|(_, last)| last) != Some(&line) {
            out.push(line.clone());
        }
        present.insert(name, (describe(entry), line));
    }
    for (name, (what, _)) in seen.iter() {
        if !present.contains_key(name) {
            out.push(format!("{what}: left the queue"));
        }
    }
    *seen = present;
    out
}

/// Runs `wait`.
pub async fn run(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    let deadline = hostcycle_bmc::deadline::deadline_after(Instant::now(), timeout);
    let mut seen = BTreeMap::new();
    let mut last: Vec<RebootQueueEntry> = Vec::new();
    let mut last_error: Option<String> = None;
    let mut first = true;
    loop {
        match list_entries(client).await {
            Ok(entries) => {
                for line in changes(&mut seen, &entries) {
                    println!("{line}");
                }
                if entries.is_empty() {
                    println!("the reboot queue is empty");
                    return Ok(());
                }
                last = entries;
                last_error = None;
            }
            // A wrong kubeconfig should not make people wait for the timeout.
            Err(e) if first => return Err(api_error(e, "listing RebootQueueEntries")),
            Err(e) => {
                let text = format!("{:#}", api_error(e, "listing RebootQueueEntries"));
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("warning: {text}; retrying");
                }
                last_error = Some(text);
            }
        }
        first = false;
        let now = Instant::now();
        if now >= deadline {
            let still: Vec<String> = last
                .iter()
                .map(|e| format!("{} ({})", describe(e), e.phase()))
                .collect();
            let error = last_error
                .map(|e| format!("; the last read failed: {e}"))
                .unwrap_or_default();
            anyhow::bail!(
                "timed out after {:#} waiting for the reboot queue to empty; still queued: {}{error} \
                 (see `hostcycle rq list` and `hostcycle rq plan`)",
                jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX),
                still.join(", ")
            );
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostcycle_api::queue::{EntryPhase, RebootQueueEntryStatus};

    fn with_status(node: &str, index: u64, phase: EntryPhase, message: &str) -> RebootQueueEntry {
        let mut entry = RebootQueueEntry::for_node(node, index);
        entry.status = Some(RebootQueueEntryStatus {
            phase: Some(phase),
            message: message.into(),
            ..Default::default()
        });
        entry
    }

    #[test]
    fn a_line_per_change_and_per_removal() {
        let mut seen = BTreeMap::new();
        let a = RebootQueueEntry::for_node("worker-1", 3);
        let b = with_status("worker-2", 4, EntryPhase::Queued, "");
        assert_eq!(
            changes(&mut seen, &[a.clone(), b.clone()]),
            ["entry 3 worker-1: Queued", "entry 4 worker-2: Queued"]
        );
        assert!(changes(&mut seen, &[a.clone(), b.clone()]).is_empty());
        let a2 = with_status("worker-1", 3, EntryPhase::Draining, "evicting 2 pods");
        assert_eq!(
            changes(&mut seen, &[a2.clone(), b.clone()]),
            ["entry 3 worker-1: Draining — evicting 2 pods"]
        );
        assert_eq!(
            changes(&mut seen, std::slice::from_ref(&b)),
            ["entry 3 worker-1: left the queue"]
        );
        let mut b2 = b.clone();
        b2.spec.cancel = true;
        assert_eq!(
            changes(&mut seen, &[b2]),
            ["entry 4 worker-2: Queued (cancel requested)"]
        );
    }
}
