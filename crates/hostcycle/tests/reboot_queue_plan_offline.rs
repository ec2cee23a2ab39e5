//! `hostcycle rq plan --from FILE`: the controller's plan from a `kubectl get
//! nodes,rebootqueueentries,rebootqueues -o yaml` dump, with no cluster at all. The fixtures
//! are hand-written kubectl output; the expected JSON is exact (keys, order, reasons).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const NOW: &str = "2026-03-02T12:00:00Z";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reboot-queue")
        .join(name)
}

/// Runs the binary with no kubeconfig anywhere, so a test that needed a cluster would fail.
fn hostcycle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("running hostcycle")
}

fn plan_json(file: &str, now: &str) -> Value {
    let path = fixture(file);
    let out = hostcycle(&[
        "rq",
        "plan",
        "--from",
        path.to_str().unwrap(),
        "--now",
        now,
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "plan --from {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    // Exactly three keys, in this order.
    let keys: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  \"") && !l.starts_with("   "))
        .map(|l| l.trim().split('"').nth(1).unwrap())
        .collect();
    assert_eq!(keys, ["startDraining", "dequeue", "waiting"], "{text}");
    value
}

fn entry(index: u64, node: &str) -> Value {
    json!({ "index": index, "node": node })
}

fn why(index: u64, node: &str, reason: &str) -> Value {
    json!({ "index": index, "node": node, "reason": reason })
}

const API_AFTER_WORKERS: &str =
    "API-server node waits until no worker is queued or in progress (worker-1, worker-4, worker-5)";

#[test]
fn a_busy_queue_from_kubectl_yaml() {
    // cluster.yaml: maxConcurrentReboots 2, maxUnreachableNodes 1; worker-1 draining;
    // worker-2 backed off until 12:10; worker-3 cancelled; a duplicate of worker-1; an entry
    // for a node that does not exist; two API-server nodes (control-plane and master
    // labels); worker-4 whose backoff expired at 11:50; worker-5 unreachable (Ready
    // Unknown) but within maxUnreachableNodes.
    let plan = plan_json("cluster.yaml", NOW);
    assert_eq!(
        plan,
        json!({
            "startDraining": [entry(7, "worker-4")],
            "dequeue": [
                why(3, "worker-3", "cancelled"),
                why(4, "worker-1", "duplicate: entry 1 already queues this node"),
                why(5, "ghost-9", "node not found in the cluster"),
            ],
            "waiting": [
                why(2, "worker-2", "drain backed off after 2 failed attempts until 2026-03-02T12:10:00Z"),
                why(6, "cp-1", API_AFTER_WORKERS),
                why(8, "worker-5", "the 1 free slot goes to entries queued earlier"),
                why(9, "cp-2", API_AFTER_WORKERS),
            ],
        })
    );
}

#[test]
fn now_decides_whether_a_backoff_still_holds() {
    // After 12:10 worker-2's backoff is over: it is first in line and takes the free slot.
    let plan = plan_json("cluster.yaml", "2026-03-02T12:10:01Z");
    assert_eq!(plan["startDraining"], json!([entry(2, "worker-2")]));
    let waiting: Vec<&Value> = plan["waiting"].as_array().unwrap().iter().collect();
    assert_eq!(
        waiting[0],
        &why(
            6,
            "cp-1",
            "API-server node waits until no worker is queued or in progress (worker-1, worker-2, worker-4, worker-5)"
        )
    );
    assert_eq!(
        waiting[1],
        &why(
            7,
            "worker-4",
            "the 1 free slot goes to entries queued earlier"
        )
    );
}

#[test]
fn no_reboot_queue_in_the_file_means_defaults() {
    // no-queue.json (`-o json`, no RebootQueue): maxUnreachableNodes defaults to 0, and
    // worker-c is NotReady without being in the queue, so nothing starts. worker-b is
    // rebooting (and NotReady): it does not count as unreachable.
    let reason = "1 unreachable node not being rebooted (worker-c) exceeds maxUnreachableNodes=0";
    assert_eq!(
        plan_json("no-queue.json", NOW),
        json!({
            "startDraining": [],
            "dequeue": [],
            "waiting": [why(1, "worker-a", reason), why(2, "cp-a", reason)],
        })
    );
    let path = fixture("no-queue.json");
    let out = hostcycle(&["rq", "plan", "--from", path.to_str().unwrap(), "--now", NOW]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("queue: enabled; maxConcurrentReboots 1, maxUnreachableNodes 0\n"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no RebootQueue `default` in the file"),
        "{stderr}"
    );
}

#[test]
fn a_disabled_queue_starts_nothing_but_still_dequeues() {
    // disabled.yaml: RebootQueue default has enabled: false (a second RebootQueue,
    // `staging`, is ignored); worker-1 draining, worker-3 rebooting, a cancelled entry.
    assert_eq!(
        plan_json("disabled.yaml", NOW),
        json!({
            "startDraining": [],
            "dequeue": [why(4, "worker-2", "cancelled")],
            "waiting": [
                why(1, "worker-1", "the reboot queue is disabled"),
                why(2, "worker-2", "the reboot queue is disabled"),
            ],
        })
    );
}

#[test]
fn the_table_shows_entries_in_progress_and_nodes_to_uncordon() {
    let path = fixture("cluster.yaml");
    let out = hostcycle(&[
        "reboot-queue",
        "plan",
        "--from",
        path.to_str().unwrap(),
        "--now",
        NOW,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "queue: enabled; maxConcurrentReboots 2, maxUnreachableNodes 1"
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["INDEX", "NODE", "PHASE", "PLAN", "WHY"]
    );
    let row = |index: &str| -> String {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(index))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no row for entry {index}:\n{stdout}"))
    };
    assert_eq!(row("1"), "1 worker-1 Draining in progress");
    assert_eq!(row("7"), "7 worker-4 Queued start draining");
    assert_eq!(row("3"), "3 worker-3 Queued remove cancelled");
    assert!(row("8").ends_with("wait the 1 free slot goes to entries queued earlier"));
    // worker-6 carries the queue's cordon but no entry is processing it; worker-1 is
    // draining, so its cordon stays.
    assert_eq!(
        lines.last().copied(),
        Some(
            "uncordon worker-6: cordoned by the reboot queue, and no entry is draining or rebooting it"
        )
    );

    let path = fixture("disabled.yaml");
    let out = hostcycle(&["rq", "plan", "--from", path.to_str().unwrap(), "--now", NOW]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("queue: disabled (spec.enabled: false)"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")
                == "1 worker-1 Draining stop draining the reboot queue is disabled"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ignored RebootQueue staging"), "{stderr}");
}

#[test]
fn a_single_object_and_stdin() {
    assert_eq!(
        plan_json("single-entry.yaml", NOW),
        json!({
            "startDraining": [],
            "dequeue": [why(42, "worker-1", "node not found in the cluster")],
            "waiting": [],
        })
    );
    // `--from -` reads stdin.
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(["rq", "plan", "--from", "-", "--now", NOW, "-o", "json"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(&std::fs::read(fixture("disabled.yaml")).unwrap())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["dequeue"], json!([why(4, "worker-2", "cancelled")]));
}

#[test]
fn a_malformed_file_fails_naming_the_file() {
    for (file, what) in [
        ("malformed.yaml", "not valid YAML"),
        ("bad-entry.yaml", "item 1 (RebootQueueEntry rqe-0000000001)"),
        ("does-not-exist.yaml", "No such file"),
    ] {
        let path = fixture(file);
        let out = hostcycle(&["rq", "plan", "--from", path.to_str().unwrap(), "-o", "json"]);
        assert!(!out.status.success(), "{file} must fail");
        assert!(out.stdout.is_empty(), "{file}: nothing on stdout");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(path.to_str().unwrap()),
            "{file}: the error names the file: {stderr}"
        );
        assert!(stderr.contains(what), "{file}: {stderr}");
    }
}

#[test]
fn bad_flags_are_refused() {
    let path = fixture("cluster.yaml");
    let out = hostcycle(&[
        "rq",
        "plan",
        "--from",
        path.to_str().unwrap(),
        "--now",
        "yesterday",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--now"));
}
