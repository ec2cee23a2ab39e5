//! deploy/monitoring: the alerts (PrometheusRule), their promtool unit tests and the Grafana
//! dashboard name only metrics the operator really exports, with label values the code really
//! sets; promtool accepts every expression, and the alerts fire (and stay quiet) as their
//! unit tests say.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod install_tools;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hostcycle_api::reasons::condition_reason as reason;
use install_tools::*;
use serde_json::{Value, json};

/// Where every alert's `runbook_url` points: a section of docs/troubleshooting.md.
const RUNBOOK_BASE: &str = "https://example.invalid/hostcycle/blob/main/docs/troubleshooting.md#";

/// The runbook sections the alerts link to, one per alert.
const RUNBOOK_ANCHORS: [&str; 18] = [
    "operator-down",
    "no-leader",
    "multiple-leaders",
    "reconcile-errors",
    "bmc-unreachable",
    "bmc-credentials-rejected",
    "bmc-failing",
    "many-bmcs-unhealthy",
    "reboot-stuck",
    "host-held-off",
    "queue-backed-off",
    "boot-timeout",
    "reboot-queue-stalled",
    "reboot-queue-disabled",
    "cannot-fence",
    "host-left-off",
    "remediation-failed",
    "health-check-storm",
];

fn monitoring_file(name: &str) -> std::path::PathBuf {
    deploy_dir().join("monitoring").join(name)
}

fn rule() -> Value {
    let objects = objects(&read(&monitoring_file("prometheus-rule.yaml")));
    assert_eq!(objects.len(), 1);
    objects.into_iter().next().unwrap()
}

fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read(&monitoring_file("grafana-dashboard.json")))
        .expect("grafana-dashboard.json is JSON")
}

/// One `metric{label op "value"}` matcher of a PromQL expression.
#[derive(Debug)]
struct Matcher {
    metric: String,
    label: String,
    op: String,
    value: String,
}

/// The `hostcycle_*` metric names in a PromQL expression (identifiers standing alone or
/// followed by `{`, `[` or `)`; string literals skipped), and their label matchers.
fn scan(expr: &str) -> (BTreeSet<String>, Vec<Matcher>) {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut matchers = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_string = |i: &mut usize| {
        let quote = chars[*i];
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            if chars[*i] == '\\' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            skip_string(&mut i);
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        if !word.starts_with("hostcycle_") {
            continue;
        }
        names.insert(word.clone());
        while i < chars.len() && chars[i] == ' ' {
            i += 1;
        }
        if i >= chars.len() || chars[i] != '{' {
            continue;
        }
        // Label matchers up to the closing brace.
        i += 1;
        loop {
            while i < chars.len() && (chars[i] == ' ' || chars[i] == ',') {
                i += 1;
            }
            if i >= chars.len() || chars[i] == '}' {
                i += 1;
                break;
            }
            let label_start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let label: String = chars[label_start..i].iter().collect();
            while chars[i] == ' ' {
                i += 1;
            }
            let op_start = i;
            while "=!~".contains(chars[i]) {
                i += 1;
            }
            let op: String = chars[op_start..i].iter().collect();
            while chars[i] == ' ' {
                i += 1;
            }
            let value_start = i + 1;
            skip_string(&mut i);
            let value: String = chars[value_start..i - 1].iter().collect();
            assert!(
                !label.is_empty() && ["=", "!=", "=~", "!~"].contains(&op.as_str()),
                "cannot read the matchers of {word} in {expr}"
            );
            matchers.push(Matcher {
                metric: word.clone(),
                label,
                op,
                value,
            });
        }
    }
    (names, matchers)
}

#[test]
fn the_scanner_reads_names_and_matchers() {
    let (names, matchers) = scan(
        r#"sum by (namespace) (rate(hostcycle_a_total{reason=~"X|Y", host!="b{c"}[5m])) / hostcycle_b > 0 and on() absent(hostcycle_c) or label_replace(up, "x", "hostcycle_not_a_metric", "", "")"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["hostcycle_a_total", "hostcycle_b", "hostcycle_c"].map(String::from))
    );
    let read: Vec<(&str, &str, &str)> = matchers
        .iter()
        .map(|m| (m.label.as_str(), m.op.as_str(), m.value.as_str()))
        .collect();
    assert_eq!(read, [("reason", "=~", "X|Y"), ("host", "!=", "b{c")]);
}

/// Every expression of the alerts, their unit tests' input series and the dashboard,
/// with where it came from.
fn every_expression() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for alert in alerts(&rule()) {
        exprs.push((
            format!("alert {}", alert["alert"].as_str().unwrap()),
            alert["expr"].as_str().unwrap().to_string(),
        ));
    }
    let tests: Value = serde_saphyr::from_str(&read(&monitoring_file("alerts-test.yaml"))).unwrap();
    for test in tests["tests"].as_array().unwrap() {
        for series in test["input_series"].as_array().unwrap() {
            exprs.push((
                format!("alerts-test.yaml {:?}", test["name"].as_str().unwrap()),
                series["series"].as_str().unwrap().to_string(),
            ));
        }
    }
    let dashboard = dashboard();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                format!("dashboard panel {:?}", panel["title"].as_str().unwrap()),
                target["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            exprs.push((
                format!("dashboard variable {}", variable["name"]),
                query.to_string(),
            ));
        }
    }
    exprs
}

/// The label values each labelled metric is ever exported with, from the code.
fn label_values() -> BTreeMap<(&'static str, &'static str), Vec<String>> {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let phases: Vec<String> = hostcycle_api::queue::EntryPhase::ALL
        .iter()
        .map(|p| p.as_str().to_string())
        .collect();
    BTreeMap::from([
        (
            (
                "hostcycle_host_bmc_unhealthy_since_timestamp_seconds",
                "reason",
            ),
            strings(&[
                reason::BMC_UNREACHABLE,
                reason::CREDENTIALS_REJECTED,
                reason::BMC_ERROR,
                reason::POWER_ACTION_FAILED,
                reason::POWER_ACTION_TIMED_OUT,
            ]),
        ),
        (
            (
                "hostcycle_host_reboot_pending_since_timestamp_seconds",
                "reason",
            ),
            strings(&[
                reason::AWAITING_POWER_OFF,
                reason::AWAITING_POWER_ON,
                reason::AWAITING_RESTART,
                reason::HELD_BY_ANNOTATIONS,
                reason::OFFLINE,
            ]),
        ),
        (("hostcycle_reboot_queue_entries", "phase"), phases.clone()),
        (("hostcycle_reboot_queue_node_phase", "phase"), phases),
        (
            ("hostcycle_remediations_total", "result"),
            strings(&hostcycle_operator::metrics::REMEDIATION_RESULTS),
        ),
        (
            ("hostcycle_remediations_total", "trigger"),
            [
                hostcycle_core::remediation::Trigger::MachineAnnotation,
                hostcycle_core::remediation::Trigger::Request,
            ]
            .map(|t| t.as_str().to_string())
            .to_vec(),
        ),
    ])
}

#[test]
fn alerts_their_tests_and_the_dashboard_use_only_exported_metrics_and_label_values() {
    let exported: BTreeSet<String> = hostcycle_operator::metrics::exported_sample_names()
        .unwrap()
        .into_iter()
        .collect();
    let values = label_values();
    let mut used = BTreeSet::new();
    for (source, expr) in every_expression() {
        let (names, matchers) = scan(&expr);
        for name in names {
            assert!(
                exported.contains(&name),
                "{source} uses {name}, which the operator does not export: {expr}\n\
                 exported: {exported:#?}"
            );
            used.insert(name);
        }
        for m in matchers {
            let Some(allowed) = values.get(&(m.metric.as_str(), m.label.as_str())) else {
                continue;
            };
            let alternatives: Vec<&str> = if m.op.ends_with('~') {
                m.value.split('|').collect()
            } else {
                vec![m.value.as_str()]
            };
            for value in alternatives {
                assert!(
                    allowed.iter().any(|a| a == value),
                    "{source}: {}{{{}{}\"{value}\"}}: the code sets {} only to {allowed:?}",
                    m.metric,
                    m.label,
                    m.op,
                    m.label
                );
            }
        }
    }
    // The scanner found the metrics the alerts are about.
    for name in [
        "hostcycle_leader",
        "hostcycle_host_bmc_unhealthy_since_timestamp_seconds",
        "hostcycle_host_reboot_pending_since_timestamp_seconds",
        "hostcycle_reboot_queue_backed_off_entries",
        "hostcycle_reboot_queue_boot_overdue_entries",
        "hostcycle_remediations_total",
        "hostcycle_reconcile_errors_total",
    ] {
        assert!(used.contains(name), "{name} not found in any expression");
    }
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook() {
    let rule = rule();
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let mut anchors = Vec::new();
    let mut names = BTreeSet::new();
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().expect("only alerting rules");
        assert!(names.insert(name), "{name} twice");
        assert!(name.starts_with("Hostcycle"), "{name}");
        let severity = alert["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                alert["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| s.len() > 10),
                "{name} has no {annotation}"
            );
        }
        let runbook = alert["annotations"]["runbook_url"].as_str().unwrap_or("");
        let anchor = runbook
            .strip_prefix(RUNBOOK_BASE)
            .unwrap_or_else(|| panic!("{name}: runbook_url {runbook:?} is not {RUNBOOK_BASE}…"));
        anchors.push(anchor.to_string());
    }
    assert_eq!(anchors, RUNBOOK_ANCHORS, "the runbook sections, in order");
    // The runbook's sections, once docs/troubleshooting.md exists (written separately).
    let runbook = repo_root().join("docs/troubleshooting.md");
    if let Ok(text) = std::fs::read_to_string(&runbook) {
        let slugs: BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|h| {
                h.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect();
        for anchor in RUNBOOK_ANCHORS {
            assert!(
                slugs.contains(anchor),
                "docs/troubleshooting.md has no section #{anchor}"
            );
        }
    } else {
        eprintln!(
            "docs/troubleshooting.md does not exist yet: its sections {RUNBOOK_ANCHORS:?} are not checked"
        );
    }
}

/// The PrometheusRule's `spec` as a Prometheus rules file in `dir`.
fn write_rules_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("hostcycle-rules.yaml");
    std::fs::write(&path, serde_json::to_string(&rule()["spec"]).unwrap()).unwrap();
    path
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let rules = write_rules_file(dir.path());
    let checked = run(&promtool, &["check", "rules", rules.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS"), "{checked}");

    // Every alert is shown to fire in the unit tests.
    let tests_text = read(&monitoring_file("alerts-test.yaml"));
    let tests: Value = serde_saphyr::from_str(&tests_text).unwrap();
    let fired: BTreeSet<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    let rule = rule();
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            fired.contains(name),
            "alerts-test.yaml never shows {name} firing"
        );
    }
    let test_file = dir.path().join("alerts-test.yaml");
    std::fs::write(&test_file, tests_text).unwrap();
    let output = run_raw(&promtool, &["test", "rules", test_file.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_dashboard_is_well_formed_and_promtool_parses_every_query() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "hostcycle-overview");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "namespace"]);

    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut recording = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_i64().unwrap()),
            "{title}: id reused"
        );
        let grid = &panel["gridPos"];
        let (x, y, w, h) = (
            grid["x"].as_i64().unwrap(),
            grid["y"].as_i64().unwrap(),
            grid["w"].as_i64().unwrap(),
            grid["h"].as_i64().unwrap(),
        );
        assert!(x >= 0 && w > 0 && x + w <= 24 && h > 0, "{title}: {grid}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}: every panel says what it shows"
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(
                target["datasource"],
                json!({ "type": "prometheus", "uid": "${datasource}" }),
                "{title}"
            );
            // Grafana's variables as a query would see them.
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$namespace", ".*")
                .replace("$__rate_interval", "5m");
            recording.push(json!({
                "record": format!("dashboard:panel_{}_{}", panel["id"], target["refId"].as_str().unwrap()),
                "expr": expr,
            }));
        }
    }
    assert!(recording.len() > 20, "{} queries", recording.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    let rules = json!({ "groups": [{ "name": "dashboard", "rules": recording }] });
    std::fs::write(&file, serde_json::to_string(&rules).unwrap()).unwrap();
    run(&promtool(), &["check", "rules", file.to_str().unwrap()]);
}
