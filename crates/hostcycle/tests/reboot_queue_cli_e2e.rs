//! `hostcycle rq` against a real API server (no operator, no simulator: Nodes are created
//! directly). One control plane for every scenario, in order: concurrent adds from eight
//! processes, add/refuse/stdin, list in three formats, reset-backoff, online plan, cancel,
//! enable/disable, wait, then CKE's habits (addresses, `add FILE|-`, `list -o cke`,
//! `commandTimeoutSeconds: 0`). Every child process is killed on drop (by PID), also when
//! an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hostcycle_api::queue::{REBOOT_QUEUE_NAME, RebootQueue, RebootQueueEntry};
use hostcycle_testkit::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Concurrent `add` processes, and nodes each adds.
const PROCESSES: usize = 8;
const PER_PROCESS: usize = 3;

/// Longest any single CLI run may take before the test fails (and kills it).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

struct Out {
    success: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "success: {}\n--- stdout\n{}--- stderr\n{}",
            self.success, self.stdout, self.stderr
        )
    }
}

struct Rq {
    kubeconfig: PathBuf,
}

impl Rq {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hostcycle"));
        cmd.arg("rq")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Out {
        self.run_with_stdin(args, None).await
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut cmd = self.command(args);
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().expect("starting hostcycle rq");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(text.as_bytes()).await.unwrap();
            drop(pipe);
        }
        let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("hostcycle rq {args:?} ran longer than {RUN_TIMEOUT:?}"))
            .unwrap();
        Out {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs and asserts success.
    async fn ok(&self, args: &[&str]) -> Out {
        let out = self.run(args).await;
        assert!(out.success, "hostcycle rq {args:?} failed:\n{out:?}");
        out
    }
}

/// Writes the addresses a kubelet would report into the Node's status.
async fn set_node_addresses(client: &Client, name: &str, addresses: &[(&str, &str)]) {
    let addresses: Vec<Value> = addresses
        .iter()
        .map(|(kind, address)| json!({ "type": kind, "address": address }))
        .collect();
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "addresses": addresses } })),
        )
        .await
        .unwrap();
}

async fn create_node(client: &Client, name: &str, control_plane: bool) {
    let mut labels = json!({ "kubernetes.io/hostname": name });
    if control_plane {
        labels["node-role.kubernetes.io/control-plane"] = json!("");
    }
    let node: Node =
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

async fn entries(client: &Client) -> Vec<RebootQueueEntry> {
    let mut items = Api::<RebootQueueEntry>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    items.sort_by_key(|e| e.spec.index);
    items
}

async fn entry_of(client: &Client, node: &str) -> RebootQueueEntry {
    let found: Vec<RebootQueueEntry> = entries(client)
        .await
        .into_iter()
        .filter(|e| e.spec.node == node && !e.spec.cancel)
        .collect();
    assert_eq!(found.len(), 1, "one live entry for {node}: {found:?}");
    found.into_iter().next().unwrap()
}

/// What the controller does while entries are in the queue (no operator runs here): the
/// RebootQueue exists (`ensure_queue_object`) and its `status.highestIndex` records the
/// highest index seen. `add` hands out indices above it, so they never go back once entries
/// are deleted; `add` itself writes nothing on the RebootQueue.
async fn record_highest_index_as_the_controller_does(client: &Client) {
    let highest = Api::<RebootQueueEntry>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| e.spec.index)
        .max()
        .unwrap();
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let queue: RebootQueue = serde_json::from_value(
        serde_json::json!({ "metadata": { "name": REBOOT_QUEUE_NAME }, "spec": {} }),
    )
    .unwrap();
    queues.create(&PostParams::default(), &queue).await.unwrap();
    queues
        .patch_status(
            REBOOT_QUEUE_NAME,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "status": { "highestIndex": highest } })),
        )
        .await
        .unwrap();
}

async fn delete_all_entries(client: &Client) {
    let api: Api<RebootQueueEntry> = Api::all(client.clone());
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    hostcycle_testkit::wait_until("every entry to be deleted", Duration::from_secs(20), || {
        let api = api.clone();
        async move {
            let left = api.list(&ListParams::default()).await.ok()?;
            left.items.is_empty().then_some(())
        }
    })
    .await
    .unwrap();
}

async fn patch_entry_status(client: &Client, name: &str, status: Value) {
    Api::<RebootQueueEntry>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
}

/// `queued <node> as entry <index>` lines, in order.
fn queued_lines(stdout: &str) -> Vec<(String, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("queued ")?;
            let (node, index) = rest.split_once(" as entry ")?;
            Some((node.to_string(), index.trim().parse().ok()?))
        })
        .collect()
}

fn row_cells(table: &str, node: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|cells| cells.get(1).map(String::as_str) == Some(node))
        .unwrap_or_else(|| panic!("no row for {node} in\n{table}"))
}

#[tokio::test]
async fn reboot_queue_cli_against_a_real_api_server() {
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let rq = Rq {
        kubeconfig: cluster.kubeconfig_path().to_path_buf(),
    };

    for name in ["worker-1", "worker-2", "worker-3", "worker-4"] {
        create_node(&client, name, false).await;
    }
    create_node(&client, "cp-1", true).await;
    let batches: Vec<Vec<String>> = (0..PROCESSES)
        .map(|p| (0..PER_PROCESS).map(|i| format!("batch-{p}-{i}")).collect())
        .collect();
    for name in batches.iter().flatten() {
        create_node(&client, name, false).await;
    }

    // No RebootQueue object yet: enabled by default, and an empty queue.
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "true\n");
    assert_eq!(rq.ok(&["list", "-o", "json"]).await.stdout.trim(), "[]");
    let empty = rq.ok(&["list"]).await;
    assert_eq!(empty.stdout, "");
    assert!(
        empty.stderr.contains("the reboot queue is empty"),
        "{empty:?}"
    );

    concurrent_adds(&rq, &client, &batches).await;
    record_highest_index_as_the_controller_does(&client).await;
    delete_all_entries(&client).await;

    add_refuse_and_stdin(&rq, &client).await;
    list_formats(&rq).await;
    reset_backoff(&rq, &client).await;
    online_plan(&rq).await;
    cancel(&rq, &client).await;
    enable_disable(&rq, &client).await;
    wait(&rq, &client).await;
    cke_habits(&rq, &client).await;
}

/// Eight processes add three nodes each at the same time: every node gets exactly one
/// entry, no index is shared, and each batch's indices increase in the order given. The
/// RebootQueue does not exist when they start, so they also race to create it.
async fn concurrent_adds(rq: &Rq, client: &Client, batches: &[Vec<String>]) {
    assert!(
        Api::<RebootQueue>::all(client.clone())
            .get_opt(REBOOT_QUEUE_NAME)
            .await
            .unwrap()
            .is_none()
    );
    let mut children = Vec::new();
    for batch in batches {
        let mut args = vec!["add"];
        args.extend(batch.iter().map(String::as_str));
        children.push(
            rq.command(&args)
                .spawn()
                .expect("starting hostcycle rq add"),
        );
    }
    let outputs = tokio::time::timeout(
        RUN_TIMEOUT,
        futures::future::join_all(children.into_iter().map(|c| c.wait_with_output())),
    )
    .await
    .expect("the concurrent adds finish");

    let mut printed: BTreeMap<String, u64> = BTreeMap::new();
    for (batch, output) in batches.iter().zip(outputs) {
        let output = output.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "add {batch:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines = queued_lines(&stdout);
        let nodes: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(nodes, *batch, "each node reported once, in order");
        assert!(
            lines.windows(2).all(|w| w[0].1 < w[1].1),
            "indices of one batch increase: {lines:?}"
        );
        printed.extend(lines);
    }

    let all = entries(client).await;
    assert_eq!(all.len(), PROCESSES * PER_PROCESS, "none lost, none extra");
    let mut by_node: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in &all {
        by_node.entry(&e.spec.node).or_default().push(e.spec.index);
        assert_eq!(
            e.metadata.name.as_deref(),
            Some(RebootQueueEntry::name_for_index(e.spec.index).as_str())
        );
    }
    for node in batches.iter().flatten() {
        assert_eq!(
            by_node.get(node.as_str()).map(Vec::len),
            Some(1),
            "{node} has exactly one entry"
        );
        assert_eq!(
            by_node[node.as_str()][0],
            printed[node],
            "{node}: the printed index is the stored one"
        );
    }
    let indices: BTreeSet<u64> = all.iter().map(|e| e.spec.index).collect();
    assert_eq!(indices.len(), all.len(), "indices are unique");
    assert!(indices.iter().all(|i| *i >= 1));

    // `add` writes nothing on the RebootQueue (queue users need no write on it): no
    // operator runs here, so none exists. Entries' names claim their indices, and every
    // add starts past the highest entry: concurrent adds hand out exactly 1..=24, a lost
    // claim would show as a duplicate (a unique name forbids it) or a gap.
    assert!(
        Api::<RebootQueue>::all(client.clone())
            .get_opt(REBOOT_QUEUE_NAME)
            .await
            .unwrap()
            .is_none(),
        "rq add created or wrote the RebootQueue"
    );
    let total = (PROCESSES * PER_PROCESS) as u64;
    assert_eq!(
        indices,
        (1..=total).collect::<BTreeSet<u64>>(),
        "indices are exactly 1..={total}"
    );
}

async fn add_refuse_and_stdin(rq: &Rq, client: &Client) {
    // Good and unknown names: the unknown ones are reported, the good ones still queued.
    let out = rq
        .run(&["add", "worker-1", "nope-1", "worker-2", "nope-2"])
        .await;
    assert!(!out.success, "unknown names make the exit status non-zero");
    let queued = queued_lines(&out.stdout);
    assert_eq!(
        queued.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["worker-1", "worker-2"]
    );
    assert!(queued[0].1 < queued[1].1);
    assert!(
        queued[0].1 > (PROCESSES * PER_PROCESS) as u64,
        "indices never go back past what the controller recorded, even after entries are \
         deleted: {queued:?}"
    );
    for unknown in ["nope-1", "nope-2"] {
        assert!(
            out.stderr.contains(&format!("node {unknown} not found")),
            "{out:?}"
        );
    }
    assert!(!out.stdout.contains("nope"), "{out:?}");
    assert_eq!(entry_of(client, "worker-1").await.spec.index, queued[0].1);
    assert_eq!(entry_of(client, "worker-2").await.spec.index, queued[1].1);

    // A node already queued is refused; the others are still queued.
    let out = rq.run(&["add", "worker-1", "worker-3"]).await;
    assert!(!out.success);
    assert!(
        out.stderr
            .contains(&format!("already queued as entry {}", queued[0].1)),
        "{out:?}"
    );
    assert_eq!(
        queued_lines(&out.stdout)
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["worker-3"]
    );
    assert_eq!(
        entries(client)
            .await
            .iter()
            .filter(|e| e.spec.node == "worker-1")
            .count(),
        1
    );

    // Names from stdin: comments and blank lines are ignored.
    let out = rq
        .run_with_stdin(
            &["add", "-f", "-"],
            Some("# the last two\n\nworker-4\n   cp-1   # the API server\n"),
        )
        .await;
    assert!(out.success, "{out:?}");
    assert_eq!(
        queued_lines(&out.stdout)
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["worker-4", "cp-1"]
    );
}

async fn list_formats(rq: &Rq) {
    let table = rq.ok(&["list"]).await.stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "INDEX",
            "NODE",
            "PHASE",
            "CANCEL",
            "BACKOFF-UNTIL",
            "MESSAGE"
        ]
    );
    let nodes: Vec<String> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert_eq!(
        nodes,
        ["worker-1", "worker-2", "worker-3", "worker-4", "cp-1"]
    );
    assert_eq!(
        row_cells(&table, "worker-3")[2..5],
        ["Queued", "false", "-"]
    );

    let json_text = rq.ok(&["list", "-o", "json"]).await.stdout;
    let json: Value = serde_json::from_str(&json_text).unwrap();
    let items = json.as_array().unwrap();
    assert_eq!(items.len(), 5);
    let keys: BTreeSet<&str> = items[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "index",
            "node",
            "name",
            "phase",
            "cancel",
            "lastTransitionTime",
            "drainBackoffCount",
            "drainBackoffExpire",
            "message"
        ])
    );
    assert_eq!(items[0]["node"], "worker-1");
    assert_eq!(items[0]["phase"], "Queued");
    assert_eq!(items[0]["cancel"], false);
    let index = items[0]["index"].as_u64().unwrap();
    assert_eq!(
        items[0]["name"],
        RebootQueueEntry::name_for_index(index).as_str()
    );
    let indices: Vec<u64> = items.iter().map(|i| i["index"].as_u64().unwrap()).collect();
    assert!(indices.windows(2).all(|w| w[0] < w[1]), "sorted by index");

    let yaml_text = rq.ok(&["list", "-o", "yaml"]).await.stdout;
    let yaml: Value = serde_saphyr::from_str(&yaml_text).unwrap();
    assert_eq!(yaml, json, "YAML and JSON say the same:\n{yaml_text}");
}

async fn reset_backoff(rq: &Rq, client: &Client) {
    let entry = entry_of(client, "worker-2").await;
    let name = entry.metadata.name.clone().unwrap();
    patch_entry_status(
        client,
        &name,
        json!({
            "phase": "Queued",
            "drainBackoffCount": 2,
            "drainBackoffExpire": "2030-01-01T00:00:00Z",
            "message": "drain failed: job pod batch/etl is running",
        }),
    )
    .await;
    let table = rq.ok(&["list"]).await.stdout;
    let cells = row_cells(&table, "worker-2");
    assert_eq!(cells[4], "2030-01-01T00:00:00Z", "{table}");
    assert_eq!(
        cells[5..].join(" "),
        "drain failed: job pod batch/etl is running"
    );

    // The online plan shows why worker-2 waits.
    let plan: Value = serde_json::from_str(&rq.ok(&["plan", "-o", "json"]).await.stdout).unwrap();
    let worker_2 = plan["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["node"] == "worker-2")
        .cloned();
    assert_eq!(
        worker_2,
        Some(json!({
            "index": entry.spec.index,
            "node": "worker-2",
            "reason": "drain backed off after 2 failed attempts until 2030-01-01T00:00:00Z",
        }))
    );

    let out = rq.ok(&["reset-backoff"]).await;
    assert_eq!(
        out.stdout.trim(),
        format!(
            "reset the drain backoff of entry {} worker-2 (was 2 failed drains, backed off \
             until 2030-01-01T00:00:00Z)",
            entry.spec.index
        )
    );
    let status = entry_of(client, "worker-2").await.status.unwrap();
    assert_eq!(status.drain_backoff_count, 0);
    assert_eq!(status.drain_backoff_expire, None);
    assert_eq!(
        status.message, "drain failed: job pod batch/etl is running",
        "the rest of the status is kept"
    );
    assert_eq!(
        rq.ok(&["reset-backoff"]).await.stdout,
        "no entry has a drain backoff\n"
    );
}

async fn online_plan(rq: &Rq) {
    let text = rq.ok(&["plan", "-o", "json"]).await.stdout;
    let plan: Value = serde_json::from_str(&text).unwrap();
    let keys: BTreeSet<&str> = plan
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["startDraining", "dequeue", "waiting"])
    );
    // The Nodes were created without a kubelet: none is Ready, so nothing may start and
    // every live entry waits.
    assert_eq!(plan["startDraining"], json!([]));
    assert_eq!(plan["waiting"].as_array().unwrap().len(), 5, "{text}");

    let table = rq.ok(&["plan"]).await.stdout;
    assert!(table.starts_with("queue: enabled;"), "{table}");
    assert!(table.contains("cp-1"), "{table}");
}

async fn cancel(rq: &Rq, client: &Client) {
    let worker_1 = entry_of(client, "worker-1").await.spec.index;
    let worker_3 = entry_of(client, "worker-3").await.spec.index;
    let out = rq
        .run(&[
            "cancel",
            &worker_1.to_string(),
            "worker-3",
            "nope",
            "999999",
        ])
        .await;
    assert!(
        !out.success,
        "unknown targets make the exit status non-zero"
    );
    assert!(out.stderr.contains("nope"), "{out:?}");
    assert!(out.stderr.contains("999999"), "{out:?}");
    assert!(
        out.stdout
            .contains(&format!("cancelled entry {worker_1} worker-1")),
        "{out:?}"
    );
    assert!(
        out.stdout
            .contains(&format!("cancelled entry {worker_3} worker-3")),
        "{out:?}"
    );
    let cancelled: Vec<String> = entries(client)
        .await
        .into_iter()
        .filter(|e| e.spec.cancel)
        .map(|e| e.spec.node)
        .collect();
    assert_eq!(cancelled, ["worker-1", "worker-3"]);

    // A cancelled node may be queued again.
    let out = rq.ok(&["add", "worker-1"]).await;
    assert_eq!(queued_lines(&out.stdout)[0].0, "worker-1");

    let out = rq.ok(&["cancel-all"]).await;
    assert!(
        out.stdout
            .contains(&format!("entry {worker_1} worker-1 was already cancelled")),
        "{out:?}"
    );
    let all = entries(client).await;
    assert_eq!(all.len(), 6);
    assert!(all.iter().all(|e| e.spec.cancel), "{all:?}");
    let table = rq.ok(&["list"]).await.stdout;
    assert_eq!(row_cells(&table, "cp-1")[3], "true");
}

async fn enable_disable(rq: &Rq, client: &Client) {
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let enabled = || async { queues.get(REBOOT_QUEUE_NAME).await.unwrap().spec.enabled };

    assert!(rq.ok(&["disable"]).await.stdout.contains("disabled"));
    assert_eq!(enabled().await, Some(false));
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "false\n");
    let plan = rq.ok(&["plan"]).await.stdout;
    assert!(plan.starts_with("queue: disabled"), "{plan}");
    rq.ok(&["enable"]).await;
    assert_eq!(enabled().await, Some(true));
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "true\n");

    // Without a RebootQueue object: is-enabled says true, disable creates one.
    queues
        .delete(REBOOT_QUEUE_NAME, &DeleteParams::default())
        .await
        .unwrap();
    hostcycle_testkit::wait_until(
        "RebootQueue default to be deleted",
        Duration::from_secs(20),
        || {
            let queues = queues.clone();
            async move {
                queues
                    .get_opt(REBOOT_QUEUE_NAME)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "true\n");
    let out = rq.ok(&["disable"]).await;
    assert!(
        out.stdout.contains("created RebootQueue default"),
        "{out:?}"
    );
    assert_eq!(enabled().await, Some(false));
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "false\n");
    rq.ok(&["enable"]).await;
    assert_eq!(rq.ok(&["is-enabled"]).await.stdout, "true\n");
}

/// Reads lines from `lines` until one equals `want`; returns every line read.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    want: &str,
    seen: &mut Vec<String>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let next = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("`rq wait` never printed {want:?}; it printed {seen:?}"))
            .unwrap();
        match next {
            Some(line) => {
                let done = line == want;
                seen.push(line);
                if done {
                    return;
                }
            }
            None => panic!("`rq wait` exited before printing {want:?}; it printed {seen:?}"),
        }
    }
}

async fn wait(rq: &Rq, client: &Client) {
    delete_all_entries(client).await;
    let out = rq.ok(&["wait", "--timeout", "5s"]).await;
    assert_eq!(out.stdout, "the reboot queue is empty\n");

    let out = rq.ok(&["add", "worker-1", "worker-2"]).await;
    let queued = queued_lines(&out.stdout);
    let (i1, i2) = (queued[0].1, queued[1].1);

    // Times out, non-zero, naming what is still queued.
    let started = Instant::now();
    let out = rq.run(&["wait", "--timeout", "2s"]).await;
    let took = started.elapsed();
    assert!(!out.success, "{out:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "{took:?}"
    );
    assert!(out.stderr.contains("timed out after 2s"), "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "still queued: entry {i1} worker-1 (Queued), entry {i2} worker-2 (Queued)"
        )),
        "{out:?}"
    );
    assert!(
        out.stdout.starts_with(&format!(
            "entry {i1} worker-1: Queued\nentry {i2} worker-2: Queued\n"
        )),
        "{out:?}"
    );

    // Shows progress, and returns once the entries are gone.
    let mut child = rq
        .command(&["wait", "--timeout", "60s"])
        .spawn()
        .expect("starting hostcycle rq wait");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    read_until(
        &mut lines,
        &format!("entry {i2} worker-2: Queued"),
        &mut seen,
    )
    .await;
    let name = RebootQueueEntry::name_for_index(i1);
    patch_entry_status(
        client,
        &name,
        json!({ "phase": "Draining", "message": "evicting 2 pods" }),
    )
    .await;
    read_until(
        &mut lines,
        &format!("entry {i1} worker-1: Draining — evicting 2 pods"),
        &mut seen,
    )
    .await;
    delete_all_entries(client).await;
    read_until(&mut lines, "the reboot queue is empty", &mut seen).await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("`rq wait` exits once the queue is empty")
        .unwrap();
    assert!(status.success(), "{seen:?}");
    assert!(
        seen.contains(&format!("entry {i1} worker-1: left the queue")),
        "{seen:?}"
    );
}

/// How CKE's users queue nodes: by address, a whitespace-separated list on stdin or in a
/// FILE, `list -o cke`, and `commandTimeoutSeconds: 0`.
async fn cke_habits(rq: &Rq, client: &Client) {
    delete_all_entries(client).await;
    let nodes = |out: &Out| -> Vec<String> {
        queued_lines(&out.stdout)
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    set_node_addresses(
        client,
        "worker-1",
        &[("InternalIP", "10.0.0.11"), ("Hostname", "worker-1")],
    )
    .await;
    set_node_addresses(
        client,
        "worker-3",
        &[("InternalIP", "fd00::13"), ("ExternalIP", "203.0.113.13")],
    )
    .await;
    // Two Nodes with one address (a copied Node, a reused address).
    for twin in ["twin-a", "twin-b"] {
        create_node(client, twin, false).await;
        set_node_addresses(client, twin, &[("InternalIP", "10.0.0.99")]).await;
    }

    // An InternalIP queues its Node.
    let out = rq.run(&["add", "10.0.0.11"]).await;
    assert!(out.success, "{out:?}");
    assert_eq!(nodes(&out), ["worker-1"]);
    assert!(
        out.stderr
            .contains("note: 10.0.0.11 is Node worker-1 (InternalIP 10.0.0.11)"),
        "{out:?}"
    );

    // An ambiguous address refuses the whole add, naming both Nodes: nothing is queued,
    // not even the good name before it.
    let out = rq.run(&["add", "worker-2", "10.0.0.99"]).await;
    assert!(!out.success, "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    assert!(
        out.stderr.contains(
            "10.0.0.99 matches 2 Nodes: twin-a (InternalIP 10.0.0.99), twin-b (InternalIP \
             10.0.0.99); name the Node instead"
        ),
        "{out:?}"
    );
    assert!(out.stderr.contains("nothing was queued"), "{out:?}");
    // So does an address no Node has.
    let out = rq.run(&["add", "worker-2", "10.9.9.9"]).await;
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr.contains("address 10.9.9.9 is no Node's"),
        "{out:?}"
    );
    assert_eq!(
        entries(client)
            .await
            .iter()
            .map(|e| e.spec.node.as_str())
            .collect::<Vec<_>>(),
        ["worker-1"],
        "refused adds queue nothing"
    );

    // `printf 'worker-2 cp-1' | hostcycle rq add -`: one line, two names.
    let out = rq
        .run_with_stdin(&["add", "-"], Some("worker-2 cp-1"))
        .await;
    assert!(out.success, "{out:?}");
    assert_eq!(nodes(&out), ["worker-2", "cp-1"]);

    // `hostcycle rq add FILE`: names and addresses (v6, external, bracketed) mixed over
    // lines and tabs; a Node named twice is queued once.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("reboot-list");
    std::fs::write(
        &file,
        "worker-4\t[fd00::0:13]\n\n  203.0.113.13 # worker-3 again\n",
    )
    .unwrap();
    let out = rq.run(&["add", file.to_str().unwrap()]).await;
    assert!(out.success, "{out:?}");
    assert_eq!(nodes(&out), ["worker-4", "worker-3"]);
    assert!(out.stderr.contains("names Node worker-3 again"), "{out:?}");

    // CKE's JSON: its keys, `index` as a string, its statuses.
    let worker_4 = entry_of(client, "worker-4").await;
    patch_entry_status(
        client,
        worker_4.metadata.name.as_deref().unwrap(),
        json!({ "phase": "Draining", "lastTransitionTime": "2026-03-02T12:00:00Z",
                "drainBackoffCount": 1, "drainBackoffExpire": "2026-03-02T11:00:00Z" }),
    )
    .await;
    let text = rq.ok(&["list", "-o", "cke"]).await.stdout;
    let listed: Value = serde_json::from_str(&text).unwrap();
    let listed = listed.as_array().unwrap();
    let listed_nodes: Vec<&str> = listed.iter().map(|e| e["node"].as_str().unwrap()).collect();
    assert_eq!(
        listed_nodes,
        ["worker-1", "worker-2", "cp-1", "worker-4", "worker-3"],
        "{text}"
    );
    let keys = |e: &Value| -> Vec<String> { e.as_object().unwrap().keys().cloned().collect() };
    let mut first_keys = keys(&listed[0]);
    first_keys.sort();
    assert_eq!(
        first_keys,
        [
            "drain_backoff_expire",
            "index",
            "last_transition_time",
            "node",
            "status"
        ],
        "{text}"
    );
    assert_eq!(
        listed[0]["index"],
        json!(entry_of(client, "worker-1").await.spec.index.to_string())
    );
    assert_eq!(listed[0]["status"], "queued");
    assert_eq!(listed[0]["drain_backoff_expire"], "0001-01-01T00:00:00Z");
    assert_eq!(
        listed[3],
        json!({
            "index": worker_4.spec.index.to_string(),
            "node": "worker-4",
            "status": "draining",
            "last_transition_time": "2026-03-02T12:00:00Z",
            "drain_backoff_count": 1,
            "drain_backoff_expire": "2026-03-02T11:00:00Z",
        })
    );
    assert!(
        text.starts_with("[\n    {\n        \"index\""),
        "ckecli's indent: {text}"
    );
    rq.ok(&["cancel", "cp-1"]).await;
    let listed: Value = serde_json::from_str(&rq.ok(&["list", "-o", "cke"]).await.stdout).unwrap();
    assert_eq!(listed[2]["status"], "cancelled");
    delete_all_entries(client).await;
    assert_eq!(rq.ok(&["list", "-o", "cke"]).await.stdout, "null\n");

    // `commandTimeoutSeconds: 0` (CKE's "no timeout") passes the API server's validation
    // and is kept as 0; a negative value does not.
    let queues: Api<RebootQueue> = Api::all(client.clone());
    queues
        .patch(
            REBOOT_QUEUE_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "reboot": { "commandTimeoutSeconds": 0 } } })),
        )
        .await
        .unwrap();
    let stored = queues.get(REBOOT_QUEUE_NAME).await.unwrap();
    assert_eq!(
        stored.spec.reboot.and_then(|r| r.command_timeout_seconds),
        Some(0)
    );
    let refused = queues
        .patch(
            REBOOT_QUEUE_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "reboot": { "commandTimeoutSeconds": -1 } } })),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );
}
