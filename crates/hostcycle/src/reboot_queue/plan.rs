//! `plan`: what the controller would do now. Online it reads the same snapshot the
//! controller builds (`hostcycle_operator::queue::observe::load_snapshot`); offline
//! (`--from FILE`) it reads a `kubectl get nodes,rebootqueueentries,rebootqueues -o yaml`
//! dump and needs no cluster.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::Context;
use hostcycle_api::queue::{REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_core::queue::QueueSnapshot;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use serde_json::Value;

use super::{PlanArgs, api_error, output};

/// The objects of a dump that the plan reads.
#[derive(Debug, Default)]
pub struct Objects {
    /// RebootQueue `default`, when present.
    pub queue: Option<RebootQueue>,
    pub nodes: Vec<Node>,
    pub entries: Vec<RebootQueueEntry>,
    /// Things worth telling the user (ignored objects), one sentence each.
    pub notes: Vec<String>,
}

impl Objects {
    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot::from_objects(self.queue.as_ref(), &self.nodes, &self.entries)
    }
}

/// The documents of a file: one JSON value or several (concatenated), or YAML documents
/// separated by `---`.
fn documents(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not valid JSON: {e}"))
    } else {
        serde_saphyr::from_multiple::<Value>(text).map_err(|e| format!("not valid YAML: {e}"))
    }
}

/// Every object of the documents, each with the kind its list implies (a typed list such
/// as `NodeList` may leave `kind` out of its items).
fn flatten(docs: Vec<Value>) -> Result<Vec<(Value, Option<String>)>, String> {
    let mut out = Vec::new();
    for (n, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Array(items) => out.extend(items.into_iter().map(|i| (i, None))),
            Value::Object(mut map) => {
                let kind = map.get("kind").and_then(Value::as_str).map(str::to_string);
                let is_list = kind.as_deref().is_none_or(|k| k.ends_with("List"));
                match map.remove("items") {
                    Some(Value::Array(items)) if is_list => {
                        let item_kind = kind
                            .as_deref()
                            .and_then(|k| k.strip_suffix("List"))
                            .filter(|k| !k.is_empty())
                            .map(str::to_string);
                        out.extend(items.into_iter().map(|i| (i, item_kind.clone())));
                    }
                    Some(Value::Null) | None if is_list && kind.is_some() => {}
                    Some(items) => {
                        map.insert("items".into(), items);
                        out.push((Value::Object(map), None));
                    }
                    None => out.push((Value::Object(map), None)),
                }
            }
            other => {
                return Err(format!(
                    "document {} is not a Kubernetes object or List (found {})",
                    n + 1,
                    kind_of_json(&other)
                ));
            }
        }
    }
    Ok(out)
}

fn kind_of_json(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Parses a dump. Errors do not name the file; the caller adds it.
pub fn parse_objects(text: &str) -> Result<Objects, String> {
    let docs = documents(text)?;
    if docs.iter().all(Value::is_null) {
        return Err("holds no Kubernetes objects".into());
    }
    let mut objects = Objects::default();
    let mut ignored: BTreeMap<String, usize> = BTreeMap::new();
    let mut other_queues = Vec::new();
    for (n, (mut item, implied_kind)) in flatten(docs)?.into_iter().enumerate() {
        let Some(map) = item.as_object_mut() else {
            return Err(format!(
                "item {} is {}, not a Kubernetes object",
                n + 1,
                kind_of_json(&item)
            ));
        };
        let kind = match map.get("kind").and_then(Value::as_str) {
            Some(k) => k.to_string(),
            None => implied_kind
                .clone()
                .ok_or_else(|| format!("item {} has no kind", n + 1))?,
        };
        let api_version = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        let name = map
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("(no name)")
            .to_string();
        let hostcycle = api_version
            .as_deref()
            .is_none_or(|v| v.starts_with("hostcycle.io/"));
        let context = |e: serde_json::Error| format!("item {} ({kind} {name}): {e}", n + 1);
        match kind.as_str() {
            "Node" if api_version.as_deref().is_none_or(|v| v == "v1") => {
                map.insert("apiVersion".into(), "v1".into());
                map.insert("kind".into(), "Node".into());
                objects
                    .nodes
                    .push(serde_json::from_value(item).map_err(context)?);
            }
            "RebootQueueEntry" if hostcycle => {
                objects
                    .entries
                    .push(serde_json::from_value(item).map_err(context)?);
            }
            "RebootQueue" if hostcycle => {
                let queue: RebootQueue = serde_json::from_value(item).map_err(context)?;
                if name == REBOOT_QUEUE_NAME && objects.queue.is_none() {
                    objects.queue = Some(queue);
                } else {
                    other_queues.push(name);
                }
            }
            _ => *ignored.entry(kind).or_default() += 1,
        }
    }
    if !other_queues.is_empty() {
        objects.notes.push(format!(
            "ignored RebootQueue {}: only the one named `{REBOOT_QUEUE_NAME}` configures the queue",
            other_queues.join(", ")
        ));
    }
    if !ignored.is_empty() {
        let kinds: Vec<String> = ignored.iter().map(|(k, n)| format!("{n} {k}")).collect();
        objects.notes.push(format!(
            "ignored objects the plan does not read: {}",
            kinds.join(", ")
        ));
    }
    if objects.queue.is_none() {
        objects.notes.push(format!(
            "no RebootQueue `{REBOOT_QUEUE_NAME}` in the file: the default settings apply"
        ));
    }
    Ok(objects)
}

fn read_source(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the objects from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).with_context(|| {
            format!(
                "reading {} (give the output of `kubectl get nodes,rebootqueueentries,rebootqueues -o yaml`)",
                path.display()
            )
        })
    }
}

/// Runs `plan --from FILE`.
pub fn run_offline(args: &PlanArgs) -> anyhow::Result<()> {
    let Some(path) = &args.from else {
        anyhow::bail!("plan --from needs a file");
    };
    let source = if path == Path::new("-") {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let text = read_source(path)?;
    let objects = parse_objects(&text).map_err(|e| {
        anyhow::anyhow!(
            "{source}: {e}\n(expected the output of \
             `kubectl get nodes,rebootqueueentries,rebootqueues -o yaml`, or -o json)"
        )
    })?;
    for note in &objects.notes {
        eprintln!("note: {note}");
    }
    print_plan(&objects.snapshot(), args)
}

/// Runs `plan` against the API server.
pub async fn run_online(client: &Client, args: &PlanArgs) -> anyhow::Result<()> {
    let snapshot = hostcycle_operator::queue::observe::load_snapshot(client)
        .await
        .map_err(|e| {
            api_error(
                e,
                "reading the reboot queue (RebootQueue default, Nodes, RebootQueueEntries, \
                 BareMetalHosts)",
            )
        })?;
    print_plan(&snapshot, args)
}

fn print_plan(snapshot: &QueueSnapshot, args: &PlanArgs) -> anyhow::Result<()> {
    let now = args.now.unwrap_or_else(Timestamp::now);
    let plan = hostcycle_core::queue::plan(snapshot, now);
    print!("{}", output::render_plan(snapshot, &plan, args.output)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_YAML: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: worker-1\n";

    #[test]
    fn a_single_object_a_list_and_a_typed_list() {
        let objects = parse_objects(NODE_YAML).unwrap_or_default();
        assert_eq!(objects.nodes.len(), 1);

        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}\nmetadata:\n  resourceVersion: \"\"\n",
            NODE_YAML.trim_end().replace('\n', "\n  ")
        );
        let objects = parse_objects(&list).unwrap_or_default();
        assert_eq!(objects.nodes.len(), 1);

        let typed = r#"{"kind":"NodeList","apiVersion":"v1","items":[{"metadata":{"name":"a"}}]}"#;
        let objects = parse_objects(typed).unwrap_or_default();
        assert_eq!(objects.nodes.len(), 1, "items of a NodeList are Nodes");

        let multi = format!(
            "{NODE_YAML}---\n{}",
            NODE_YAML.replace("worker-1", "worker-2")
        );
        let objects = parse_objects(&multi).unwrap_or_default();
        assert_eq!(objects.nodes.len(), 2);
    }

    #[test]
    fn other_kinds_are_ignored_with_a_note() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p\n";
        let objects = parse_objects(text).unwrap_or_default();
        assert!(objects.nodes.is_empty());
        assert!(
            objects.notes.iter().any(|n| n.contains("1 Pod")),
            "{:?}",
            objects.notes
        );
    }

    #[test]
    fn bad_input_is_named() {
        let cases = [
            ("", "holds no Kubernetes objects"),
            ("{\"kind\": ", "not valid JSON"),
            ("items: [\n", "not valid YAML"),
            ("- 3\n", "item 1 is a number"),
            ("metadata:\n  name: x\n", "item 1 has no kind"),
            (
                "apiVersion: hostcycle.io/v1alpha1\nkind: RebootQueueEntry\nmetadata:\n  name: rqe-1\nspec:\n  node: w\n  index: many\n",
                "item 1 (RebootQueueEntry rqe-1)",
            ),
        ];
        for (text, want) in cases {
            match parse_objects(text) {
                Ok(_) => panic!("{text:?} must fail"),
                Err(e) => assert!(e.contains(want), "{text:?}: {e}"),
            }
        }
    }
}
