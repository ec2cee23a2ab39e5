//! `hostcycle rq add NODE… | -f FILE`: queue nodes that exist and are not queued yet.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::{AddArgs, api_error, index, list_entries};

/// Node names from a file's text: one a line; blank lines and `#` comments are ignored;
/// `node/NAME` (what `kubectl get nodes -o name` prints) is accepted.
pub fn parse_names(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(normalize)
        .collect()
}

fn normalize(name: &str) -> String {
    let name = name.trim();
    name.strip_prefix("node/")
        .or_else(|| name.strip_prefix("nodes/"))
        .unwrap_or(name)
        .to_string()
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading node names from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading node names from {}", path.display()))
    }
}

/// The names to queue, in order, each once (repeats are reported on stderr).
fn requested_names(args: &AddArgs) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = args.nodes.iter().map(|n| normalize(n)).collect();
    if let Some(path) = &args.file {
        names.extend(parse_names(&read_file(path)?));
    }
    let mut seen = BTreeSet::new();
    let mut unique = Vec::new();
    for name in names {
        if name.is_empty() {
            continue;
        }
        if seen.insert(name.clone()) {
            unique.push(name);
        } else {
            eprintln!("note: node {name} is given more than once; it is queued once");
        }
    }
    if unique.is_empty() {
        anyhow::bail!(
            "no node names given (the file holds only blank lines and comments); \
             name nodes as arguments or one a line with -f FILE"
        );
    }
    Ok(unique)
}

/// Runs `add`.
pub async fn run(client: &Client, args: &AddArgs) -> anyhow::Result<()> {
    let names = requested_names(args)?;
    let nodes: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(e, "listing Nodes"))?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let entries = list_entries(client)
        .await
        .map_err(|e| api_error(e, "listing RebootQueueEntries"))?;
    // The first entry of each node that is neither cancelled nor being cancelled.
    let mut queued: BTreeMap<&str, u64> = BTreeMap::new();
    for entry in &entries {
        let cancelled =
            entry.spec.cancel || entry.phase() == hostcycle_api::queue::EntryPhase::Cancelled;
        if !cancelled {
            queued
                .entry(entry.spec.node.as_str())
                .or_insert(entry.spec.index);
        }
    }

    let mut not_found = Vec::new();
    let mut refused = Vec::new();
    let mut to_queue = Vec::new();
    for name in names {
        if !nodes.contains(&name) {
            eprintln!("error: node {name} not found in the cluster; not queued");
            not_found.push(name);
        } else if let Some(index) = queued.get(name.as_str()) {
            eprintln!(
                "error: node {name} is already queued as entry {index}; not queued again \
                 (cancel it first with `hostcycle rq cancel {index}` to re-queue)"
            );
            refused.push(name);
        } else {
            to_queue.push(name);
        }
    }

    index::create_entries(client, &to_queue, |node, index| {
        println!("queued {node} as entry {index}");
    })
    .await?;

    if not_found.is_empty() && refused.is_empty() {
        return Ok(());
    }
    let mut parts = Vec::new();
    if !not_found.is_empty() {
        parts.push(format!("not found: {}", not_found.join(", ")));
    }
    if !refused.is_empty() {
        parts.push(format!("already queued: {}", refused.join(", ")));
    }
    let verdict = if to_queue.is_empty() {
        "nothing was queued".to_string()
    } else {
        format!("the valid ones ({}) were queued", to_queue.len())
    };
    anyhow::bail!(
        "{} of {} nodes were not queued ({}); {verdict}",
        not_found.len() + refused.len(),
        not_found.len() + refused.len() + to_queue.len(),
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_a_file() {
        let text =
            "# rack 3\n\nworker-1\n  worker-2   # the noisy one\nnode/worker-3\n#worker-4\n\t\n";
        assert_eq!(parse_names(text), ["worker-1", "worker-2", "worker-3"]);
        assert!(parse_names("").is_empty());
        assert!(parse_names("# only a comment\n\n").is_empty());
    }
}
