//! `hostcycle rq add NODE|ADDRESS|FILE|-…` and `-f FILE`: queue nodes that exist and are
//! not queued yet.
//!
//! An argument is read as a node list when it is `-` (stdin) or names an existing regular
//! file, as CKE's `ckecli reboot-queue add FILE`; otherwise it is a Node name or address.
//! An argument that is both a file and a Node refuses the `add` (say `./NAME` or
//! `-f NAME` for the file, `node/NAME` for the Node). Tokens resolve to Nodes with the pure
//! [`targets`] module.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams};

use super::targets::{self, MAX_INPUT_BYTES, MAX_TOKENS, Match, NodeFacts, Token};
use super::{AddArgs, api_error, index, list_entries};

/// Where a positional argument's tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// The argument itself, a Node name or address.
    Argument(String),
    /// A file named by a positional argument (the argument as given).
    ArgumentFile(String),
    /// `-f FILE` (`-`: stdin).
    FlagFile(String),
}

/// Reads a node list, at most [`MAX_INPUT_BYTES`].
fn read_list(path: &str) -> anyhow::Result<String> {
    let what = if path == "-" {
        "stdin".to_string()
    } else {
        path.to_string()
    };
    let mut bytes = Vec::new();
    let read = if path == "-" {
        std::io::stdin()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(Path::new(path))
            .with_context(|| format!("opening node list {what}"))?
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
    };
    read.with_context(|| format!("reading node list {what}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        anyhow::bail!(
            "node list {what} is larger than {} KiB; nothing was queued (split it, or queue \
             fewer nodes at once)",
            MAX_INPUT_BYTES / 1024
        );
    }
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("node list {what} is not UTF-8 text; nothing was queued"))
}

/// The sources in the order given: positional arguments, then `-f FILE`.
fn sources(args: &AddArgs) -> anyhow::Result<Vec<Source>> {
    let mut sources: Vec<Source> = args
        .nodes
        .iter()
        .map(|arg| {
            let is_file = arg == "-" || std::fs::metadata(arg).is_ok_and(|m| m.is_file());
            if is_file {
                Source::ArgumentFile(arg.clone())
            } else {
                Source::Argument(arg.clone())
            }
        })
        .collect();
    if let Some(path) = &args.file {
        sources.push(Source::FlagFile(path.display().to_string()));
    }
    let stdin_uses = sources
        .iter()
        .filter(|s| matches!(s, Source::ArgumentFile(p) | Source::FlagFile(p) if p == "-"))
        .count();
    if stdin_uses > 1 {
        anyhow::bail!("`-` (stdin) is given {stdin_uses} times; stdin can be read only once");
    }
    Ok(sources)
}

/// Every token, in order; files and stdin are read here.
fn tokens(sources: &[Source]) -> anyhow::Result<Vec<Token>> {
    let mut tokens = Vec::new();
    for source in sources {
        match source {
            Source::Argument(arg) => tokens.push(Token {
                text: targets::normalize(arg),
                origin: None,
            }),
            Source::ArgumentFile(path) | Source::FlagFile(path) => {
                let origin = if path == "-" { "stdin" } else { path };
                tokens.extend(
                    targets::parse_tokens(&read_list(path)?)
                        .into_iter()
                        .map(|text| Token {
                            text,
                            origin: Some(origin.to_string()),
                        }),
                );
            }
        }
        if tokens.len() > MAX_TOKENS {
            anyhow::bail!(
                "more than {MAX_TOKENS} node names or addresses given; nothing was queued \
                 (queue fewer nodes at once)"
            );
        }
    }
    tokens.retain(|t| !t.text.is_empty());
    if tokens.is_empty() {
        anyhow::bail!(
            "no node names or addresses given (the input holds only blank space and \
             comments); name nodes as arguments, or separated by spaces or newlines in FILE \
             (`-`: stdin)"
        );
    }
    Ok(tokens)
}

/// Positional arguments read as files that also name a Node: which one was meant?
fn file_or_node(sources: &[Source], nodes: &[NodeFacts]) -> Vec<String> {
    sources
        .iter()
        .filter_map(|s| match s {
            Source::ArgumentFile(path) if path != "-" => Some(path),
            _ => None,
        })
        .filter(|path| {
            !matches!(
                targets::match_token(&targets::normalize(path), nodes),
                Match::NotFound { .. }
            )
        })
        .map(|path| {
            format!(
                "{path} is both a file and a Node; write ./{path} (or -f {path}) to read the \
                 file, node/{path} to queue the Node"
            )
        })
        .collect()
}

/// Runs `add`.
pub async fn run(client: &Client, args: &AddArgs) -> anyhow::Result<()> {
    let sources = sources(args)?;
    let tokens = tokens(&sources)?;
    let nodes: Vec<NodeFacts> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(e, "listing Nodes"))?
        .items
        .iter()
        .map(NodeFacts::from_node)
        .collect();
    let mut problems = file_or_node(&sources, &nodes);
    let resolution = match targets::resolve(&tokens, &nodes) {
        Ok(resolution) => Some(resolution),
        Err(more) => {
            problems.extend(more);
            None
        }
    };
    let resolution = match resolution {
        Some(resolution) if problems.is_empty() => resolution,
        _ => {
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            anyhow::bail!(
                "nothing was queued: {} of the names, addresses or files given cannot be \
                 matched to exactly one Node (see above)",
                problems.len()
            );
        }
    };
    for note in &resolution.notes {
        eprintln!("note: {note}");
    }
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

    let not_found = resolution.unknown_names;
    for name in &not_found {
        eprintln!("error: node {name} not found in the cluster; not queued");
    }
    let mut refused = Vec::new();
    let mut to_queue = Vec::new();
    for name in resolution.nodes {
        if let Some(index) = queued.get(name.as_str()) {
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn facts(name: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            addresses: vec![("InternalIP".into(), "10.0.0.1".into())],
        }
    }

    #[test]
    fn a_file_argument_that_is_also_a_node_is_named() {
        let nodes = [facts("worker-1")];
        let sources = [
            Source::ArgumentFile("worker-1".into()),
            Source::ArgumentFile("10.0.0.1".into()),
            Source::ArgumentFile("nodes.txt".into()),
            Source::ArgumentFile("-".into()),
            Source::FlagFile("worker-1".into()),
            Source::Argument("worker-1".into()),
        ];
        let problems = file_or_node(&sources, &nodes);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("worker-1 is both a file and a Node; write ./worker-1"));
        assert!(problems[1].starts_with("10.0.0.1 is both a file and a Node"));
    }

    #[test]
    fn stdin_is_read_once() {
        let args = AddArgs {
            nodes: vec!["-".into()],
            file: Some("-".into()),
        };
        let err = sources(&args).unwrap_err().to_string();
        assert!(err.contains("stdin can be read only once"), "{err}");
    }
}
