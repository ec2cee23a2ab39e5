//! Running the operator in production: it rides out an API server restart, and its JSON log
//! names the host, node or entry of every line about one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::queue::{QueueLab, fast_queue, worker};
use common::{HARD, Lab, LabOptions, REBOOT};
use hostcycle_testkit::wait_until;
use jiff::Timestamp;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn signal(lab: &Lab, signal: Signal) {
    let pid = lab.operator.as_ref().expect("the operator runs").pid();
    kill(Pid::from_raw(pid as i32), signal).unwrap();
}

/// kube-apiserver is stopped under a running operator (etcd kept) and started again. A
/// reboot is requested just before the outage, while the operator is frozen (SIGSTOP), so it
/// cannot have acted before the server went away; it is thawed during the outage. Nothing
/// happens at the BMC while the server is down (no power request without its write-ahead
/// record), and once the server is back the same operator process reconnects — its watches,
/// its Lease — and carries the reboot out: one power cycle. The Lease (60 s, renewed 20 s
/// before it expires) outlasts the outage; a leader whose Lease expires during an outage
/// stops instead (`ha_failover_e2e`, `an_api_server_outage_longer_than_the_lease_...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reboot_requested_across_an_api_server_restart_completes() {
    let name = "outage-host";
    let mut lab = Lab::start_with(
        &[name],
        LabOptions {
            operator_args: vec!["--lease-duration".into(), "60s".into()],
            ..LabOptions::default()
        },
    )
    .await;
    let pid = lab.operator.as_ref().unwrap().pid();

    signal(&lab, Signal::SIGSTOP);
    let requested = Timestamp::now();
    lab.annotate(name, REBOOT, HARD).await;
    let down = Timestamp::now();
    lab.cluster.stop_apiserver();
    signal(&lab, Signal::SIGCONT);
    // Long enough for several of the operator's retries.
    lab.assert_power_stays(name, "On", Duration::from_secs(8))
        .await;
    let restarted = Timestamp::now();
    lab.cluster.start_apiserver().await.unwrap();
    let up = Timestamp::now();

    let done = lab.wait_reboot_done(name).await;
    let done_at = Timestamp::now();
    let pending = done
        .status
        .as_ref()
        .and_then(|s| s.provisioning.pending_reboot_since)
        .expect("the reboot was recorded");
    assert!(
        pending > restarted,
        "nothing was recorded while the API server was down: pendingRebootSince {pending}, \
         the server was started again at {restarted}"
    );
    let history = lab.settled_history(name).await;
    let off = history
        .off_after(restarted)
        .expect("the power-off after the outage");
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "one power cycle: {history:?}"
    );
    let secs = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64();
    eprintln!(
        "API server restart: requested {:.2} s before the outage, server down {:.1} s \
         (stopped, then started again: ready after {:.1} s); from its start again → reboot \
         recorded {:.2} s, → host seen off {:.2} s, → reboot complete {:.2} s",
        secs(requested, down),
        secs(down, restarted),
        secs(restarted, up),
        secs(restarted, pending),
        secs(restarted, off),
        secs(restarted, done_at),
    );

    // The same process carried on: it neither exited nor lost its Lease.
    let operator = lab.operator.as_mut().unwrap();
    operator.ensure_running().unwrap();
    assert_eq!(operator.pid(), pid);
    let log = std::fs::read_to_string(operator.log_path()).unwrap();
    assert!(
        !log.contains("lost the leader Lease") && !log.contains("no longer sure"),
        "{log}"
    );
    // Human-readable by default: no JSON line.
    assert!(
        log.lines().all(|l| !l.trim_start().starts_with('{')),
        "text logs by default:\n{log}"
    );
    let metrics = lab.metrics().await;
    assert!(
        metrics.lines().any(|l| l.trim() == "hostcycle_leader 1"),
        "still the leader:\n{metrics}"
    );
}

/// The fields that name what a line is about.
const SUBJECT_FIELDS: [&str; 5] = ["host", "node", "entry", "machine", "remediation"];

/// A field of a JSON log line: the event's own (flattened), or of its current span, or of
/// any span it is in.
fn field<'a>(line: &'a Value, key: &str) -> Vec<&'a str> {
    let mut found: Vec<&str> = Vec::new();
    if let Some(v) = line.get(key).and_then(Value::as_str) {
        found.push(v);
    }
    if let Some(v) = line
        .pointer(&format!("/span/{key}"))
        .and_then(Value::as_str)
    {
        found.push(v);
    }
    if let Some(spans) = line.get("spans").and_then(Value::as_array) {
        found.extend(spans.iter().filter_map(|s| s.get(key)?.as_str()));
    }
    found
}

fn message(line: &Value) -> &str {
    line.get("message").and_then(Value::as_str).unwrap_or("")
}

fn span_names(line: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = line
        .get("spans")
        .and_then(Value::as_array)
        .map(|spans| {
            spans
                .iter()
                .filter_map(|s| s.get("name")?.as_str())
                .collect()
        })
        .unwrap_or_default();
    if let Some(current) = line.pointer("/span/name").and_then(Value::as_str) {
        names.push(current);
    }
    names
}

/// `hostcycle operator --log-format json` through a queued reboot (cordon, drain, the host's
/// power cycle, boot check, uncordon): every line is a JSON object; every line that mentions
/// the node (= host) names it in a field (`host=default/<name>`, `node=<name>`, or the
/// entry's, machine's or remediation's), as the event's own field or its span's; the host
/// controller's lines about the reboot carry `host`, the drain's `node` and `entry`, and every
/// Event logged names its object.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_logs_name_the_host_or_node_of_every_line_about_one() {
    let node = "json-0";
    let lab = QueueLab::start_with(
        &[worker(node)],
        fast_queue(),
        LabOptions {
            operator_args: vec!["--log-format".into(), "json".into()],
            ..LabOptions::default()
        },
    )
    .await;
    let entry = lab.queue(node).await;
    lab.wait_entry_gone(node, Duration::from_secs(120)).await;
    let log_path = lab.lab.operator.as_ref().unwrap().log_path().to_path_buf();
    // Events are logged when emitted; wait for the last one of the flow.
    let text = wait_until(
        "the operator's log to show the Completed Event",
        Duration::from_secs(30),
        || {
            let path = log_path.clone();
            async move {
                std::fs::read_to_string(&path)
                    .ok()
                    .filter(|t| t.contains("\"Completed\""))
            }
        },
    )
    .await
    .unwrap();

    let host_id = format!("default/{node}");
    let mut lines = Vec::new();
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        let line: Value = serde_json::from_str(raw)
            .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {raw}"));
        assert!(line.is_object(), "{raw}");
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line.get(key).is_some(), "no {key}: {raw}");
        }
        lines.push((raw, line));
    }

    let names_it = |line: &Value| {
        SUBJECT_FIELDS
            .iter()
            .flat_map(|key| field(line, key))
            .any(|v| v == host_id || v == node || v == entry)
    };
    for (raw, line) in &lines {
        if raw.contains(node) || raw.contains(&entry) {
            assert!(
                names_it(line),
                "a line about {node} without a field naming it:\n{raw}"
            );
        }
        // Lines about one host or node must carry its field, whatever their text says.
        let about_host = matches!(
            message(line),
            "power request sent"
                | "power request failed"
                | "reconcile failed; retrying"
                | "API server unreachable; retrying"
                | "restart outcome unknown"
                | "annotations changed meanwhile; removal retried next reconcile"
        ) || span_names(line).contains(&"reconcile");
        if about_host {
            assert!(
                field(line, "host").contains(&host_id.as_str()),
                "a line about host {host_id} without host={host_id}:\n{raw}"
            );
        }
        let about_node = matches!(
            message(line),
            "drain complete"
                | "drain failed"
                | "eviction refused by a PodDisruptionBudget; retrying"
                | "reboot requested through the BareMetalHost"
                | "cannot uncordon; retrying"
                | "cannot write the entry's status; retrying"
        ) || span_names(line).contains(&"drain");
        if about_node {
            assert!(
                field(line, "node").contains(&node),
                "a line about node {node} without node={node}:\n{raw}"
            );
        }
        if message(line) == "event" {
            let regarding = line.get("object").and_then(Value::as_str).unwrap_or("");
            assert!(
                regarding.starts_with("RebootQueue/")
                    || SUBJECT_FIELDS.iter().any(|k| !field(line, k).is_empty()),
                "an Event logged without its object's field:\n{raw}"
            );
        }
    }

    // The flow's lines are there, with their fields.
    let count = |pred: &dyn Fn(&Value) -> bool| lines.iter().filter(|(_, l)| pred(l)).count();
    assert!(
        count(
            &|l| message(l) == "power request sent" && field(l, "host").contains(&host_id.as_str())
        ) >= 2,
        "the power-off and the power-on, each with host={host_id}"
    );
    assert!(
        count(&|l| message(l) == "drain complete"
            && field(l, "node").contains(&node)
            && field(l, "entry").contains(&entry.as_str()))
            == 1,
        "drain complete with node and entry"
    );
    for reason in ["PowerOff", "PowerOn"] {
        assert!(
            count(&|l| message(l) == "event"
                && l.get("reason").and_then(Value::as_str) == Some(reason)
                && field(l, "host").contains(&host_id.as_str()))
                >= 1,
            "the {reason} Event logged with host={host_id}"
        );
    }
    assert!(
        count(&|l| message(l) == "event"
            && l.get("reason").and_then(Value::as_str) == Some("Completed")
            && (field(l, "entry").contains(&entry.as_str()) || field(l, "node").contains(&node)))
            >= 1,
        "the queue's Completed Event logged with its entry or node"
    );
}
