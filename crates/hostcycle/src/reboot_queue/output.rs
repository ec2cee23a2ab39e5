//! What the commands print: aligned tables, and JSON / YAML with stable field order.

use std::collections::BTreeMap;

use anyhow::Context;
use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use hostcycle_core::queue::{AwayRef, Plan, QueueSnapshot};
use jiff::Timestamp;
use serde::Serialize;

use super::{ListFormat, PlanFormat};

/// Columns separated by at least two spaces; the last column is not padded. Cells are
/// made single-line.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let clean = |cell: &str| cell.split_whitespace().collect::<Vec<_>>().join(" ");
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| clean(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count()) + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(headers.to_vec())];
    for row in &rows {
        out.push(line(row.iter().map(String::as_str).collect()));
    }
    out.join("\n") + "\n"
}

/// One entry as `list -o json|yaml` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedEntry {
    pub index: u64,
    pub node: String,
    pub name: String,
    pub phase: String,
    pub cancel: bool,
    pub last_transition_time: Option<Timestamp>,
    pub drain_backoff_count: u32,
    pub drain_backoff_expire: Option<Timestamp>,
    pub message: String,
}

impl ListedEntry {
    pub fn from_entry(entry: &RebootQueueEntry) -> Self {
        let status = entry.status.clone().unwrap_or_default();
        ListedEntry {
            index: entry.spec.index,
            node: entry.spec.node.clone(),
            name: entry.metadata.name.clone().unwrap_or_default(),
            phase: entry.phase().to_string(),
            cancel: entry.spec.cancel,
            last_transition_time: status.last_transition_time,
            drain_backoff_count: status.drain_backoff_count,
            drain_backoff_expire: status.drain_backoff_expire,
            message: status.message,
        }
    }
}

/// Go's zero `time.Time` as `encoding/json` writes it: ckecli prints it for a time never
/// set (`omitempty` does not apply to structs).
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// One entry as `ckecli reboot-queue list` prints it (CKE's `RebootQueueEntry`): the same
/// keys in the same order, `index` as a string, `drain_backoff_count` left out when 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CkeEntry {
    pub index: String,
    /// The Node's name: hostcycle's entries name Nodes where CKE's hold addresses.
    pub node: String,
    pub status: &'static str,
    pub last_transition_time: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub drain_backoff_count: u32,
    pub drain_backoff_expire: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// CKE's status for an entry: a cancel asked for is `cancelled` at once (CKE's `cancel`
/// writes that status), a phase this version does not know counts as `queued` (as the
/// controller treats it).
pub fn cke_status(entry: &RebootQueueEntry) -> &'static str {
    if entry.spec.cancel {
        return "cancelled";
    }
    match entry.phase() {
        EntryPhase::Queued | EntryPhase::Unknown => "queued",
        EntryPhase::Draining => "draining",
        EntryPhase::Rebooting => "rebooting",
        EntryPhase::Cancelled => "cancelled",
    }
}

impl CkeEntry {
    pub fn from_entry(entry: &RebootQueueEntry) -> Self {
        let status = entry.status.clone().unwrap_or_default();
        let time =
            |t: Option<Timestamp>| t.map_or_else(|| GO_ZERO_TIME.to_string(), |t| t.to_string());
        CkeEntry {
            index: entry.spec.index.to_string(),
            node: entry.spec.node.clone(),
            status: cke_status(entry),
            last_transition_time: time(status.last_transition_time),
            drain_backoff_count: status.drain_backoff_count,
            drain_backoff_expire: time(status.drain_backoff_expire),
        }
    }
}

/// `list -o cke`: what ckecli's JSON encoder writes — four-space indent, a final newline,
/// and `null` for an empty queue (ckecli encodes a nil slice).
pub fn render_cke(entries: &[RebootQueueEntry]) -> anyhow::Result<String> {
    let listed: Option<Vec<CkeEntry>> =
        (!entries.is_empty()).then(|| entries.iter().map(CkeEntry::from_entry).collect());
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    listed
        .serialize(&mut serializer)
        .context("rendering CKE's JSON")?;
    out.push(b'\n');
    String::from_utf8(out).context("rendering CKE's JSON")
}

/// `list` output; `entries` must be sorted by index.
pub fn render_list(entries: &[RebootQueueEntry], format: ListFormat) -> anyhow::Result<String> {
    let listed: Vec<ListedEntry> = entries.iter().map(ListedEntry::from_entry).collect();
    Ok(match format {
        ListFormat::Cke => render_cke(entries)?,
        ListFormat::Json => serde_json::to_string_pretty(&listed).context("rendering JSON")? + "\n",
        ListFormat::Yaml => serde_saphyr::to_string(&listed).context("rendering YAML")?,
        ListFormat::Table => {
            let rows: Vec<Vec<String>> = listed
                .iter()
                .map(|e| {
                    vec![
                        e.index.to_string(),
                        e.node.clone(),
                        e.phase.clone(),
                        e.cancel.to_string(),
                        e.drain_backoff_expire
                            .map(|t| t.to_string())
                            .unwrap_or_else(|| "-".into()),
                        e.message.clone(),
                    ]
                })
                .collect();
            table(
                &[
                    "INDEX",
                    "NODE",
                    "PHASE",
                    "CANCEL",
                    "BACKOFF-UNTIL",
                    "MESSAGE",
                ],
                &rows,
            )
        }
    })
}

/// An entry that starts draining.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedEntry {
    pub index: u64,
    pub node: String,
}

/// An entry with the reason it leaves the queue or waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExplainedEntry {
    pub index: u64,
    pub node: String,
    pub reason: String,
}

/// `plan -o json`: exactly these three keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanJson {
    pub start_draining: Vec<PlannedEntry>,
    pub dequeue: Vec<ExplainedEntry>,
    pub waiting: Vec<ExplainedEntry>,
}

impl PlanJson {
    pub fn from_plan(plan: &Plan) -> Self {
        PlanJson {
            start_draining: plan
                .start_draining
                .iter()
                .map(|e| PlannedEntry {
                    index: e.index,
                    node: e.node.clone(),
                })
                .collect(),
            dequeue: plan
                .dequeue
                .iter()
                .map(|d| ExplainedEntry {
                    index: d.entry.index,
                    node: d.entry.node.clone(),
                    reason: d.reason.to_string(),
                })
                .collect(),
            waiting: plan
                .waiting
                .iter()
                .map(|w| ExplainedEntry {
                    index: w.entry.index,
                    node: w.entry.node.clone(),
                    reason: w.reason.to_string(),
                })
                .collect(),
        }
    }
}

/// `plan` output.
pub fn render_plan(
    snapshot: &QueueSnapshot,
    plan: &Plan,
    format: PlanFormat,
) -> anyhow::Result<String> {
    match format {
        PlanFormat::Json => Ok(serde_json::to_string_pretty(&PlanJson::from_plan(plan))
            .context("rendering JSON")?
            + "\n"),
        PlanFormat::Table => Ok(plan_table(snapshot, plan)),
    }
}

fn plan_table(snapshot: &QueueSnapshot, plan: &Plan) -> String {
    let config = &snapshot.config;
    let mut out = format!(
        "queue: {}; maxConcurrentReboots {}, maxUnreachableNodes {}\n",
        if config.enabled {
            "enabled"
        } else {
            "disabled (spec.enabled: false)"
        },
        config.max_concurrent_reboots,
        config.max_unreachable_nodes,
    );
    // What happens to each entry, by object name; later inserts win.
    let mut what: BTreeMap<&str, (&str, String)> = BTreeMap::new();
    for w in &plan.waiting {
        what.insert(&w.entry.name, ("wait", w.reason.to_string()));
    }
    for (e, _) in &plan.in_progress {
        what.insert(&e.name, ("in progress", String::new()));
    }
    for e in &plan.start_draining {
        what.insert(&e.name, ("start draining", String::new()));
    }
    for e in &plan.stop_draining {
        let why = what
            .get(e.name.as_str())
            .map(|w| w.1.clone())
            .unwrap_or_default();
        what.insert(&e.name, ("stop draining", why));
    }
    for d in &plan.dequeue {
        what.insert(&d.entry.name, ("remove", d.reason.to_string()));
    }
    let mut entries: Vec<_> = snapshot.entries.iter().collect();
    entries.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.name.cmp(&b.name)));
    if entries.is_empty() {
        out.push_str("the reboot queue is empty\n");
    } else {
        let rows: Vec<Vec<String>> = entries
            .iter()
            .map(|e| {
                let (action, why) = what
                    .get(e.name.as_str())
                    .cloned()
                    .unwrap_or(("-", String::new()));
                vec![
                    e.index.to_string(),
                    e.node.clone(),
                    e.phase.to_string(),
                    action.to_string(),
                    why,
                ]
            })
            .collect();
        out.push_str(&table(&["INDEX", "NODE", "PHASE", "PLAN", "WHY"], &rows));
    }
    for node in &plan.uncordon {
        out.push_str(&format!(
            "uncordon {node}: cordoned by the reboot queue, and no entry is draining or \
             rebooting it\n"
        ));
    }
    out.push_str(&away_lines(snapshot));
    out
}

/// One line per node the gate counts as away (`snapshot.away`), API servers said so.
fn away_lines(snapshot: &QueueSnapshot) -> String {
    let mut out = String::new();
    for (node, away) in &snapshot.away {
        let described = AwayRef {
            node: node.clone(),
            why: away.why.clone(),
            has_node: away.has_node,
        };
        let role = if away.api_server {
            "; an API server: no other API-server node starts meanwhile"
        } else {
            ""
        };
        let line = format!("away: {described}; counts as unreachable (maxUnreachableNodes){role}");
        // Names and reasons come from objects anyone may write: no control character reaches
        // the terminal.
        out.extend(line.chars().map(|c| if c.is_control() { ' ' } else { c }));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tables_align_and_stay_single_line() {
        let rows = vec![
            vec!["1".into(), "worker-1".into(), "Draining".into()],
            vec!["12".into(), "w".into(), "evicting\n2 pods".into()],
        ];
        assert_eq!(
            table(&["INDEX", "NODE", "MESSAGE"], &rows),
            "INDEX  NODE      MESSAGE\n\
             1      worker-1  Draining\n\
             12     w         evicting 2 pods\n"
        );
    }

    fn entry(index: u64, node: &str, status: serde_json::Value) -> RebootQueueEntry {
        let mut entry = RebootQueueEntry::for_node(node, index);
        entry.status = Some(serde_json::from_value(status).unwrap());
        entry
    }

    /// CKE's keys, order and shapes: `index` a string, Go's zero time for a time never set,
    /// `drain_backoff_count` only when not 0.
    #[test]
    fn cke_json_has_ckes_fields_and_shapes() {
        let queued = entry(7, "worker-1", serde_json::json!({ "phase": "Queued" }));
        let backed_off = entry(
            8,
            "worker-2",
            serde_json::json!({
                "phase": "Queued",
                "lastTransitionTime": "2026-03-02T12:00:00Z",
                "drainBackoffCount": 2,
                "drainBackoffExpire": "2026-03-02T12:10:00.5Z",
            }),
        );
        assert_eq!(
            render_cke(&[queued, backed_off]).unwrap(),
            r#"[
    {
        "index": "7",
        "node": "worker-1",
        "status": "queued",
        "last_transition_time": "0001-01-01T00:00:00Z",
        "drain_backoff_expire": "0001-01-01T00:00:00Z"
    },
    {
        "index": "8",
        "node": "worker-2",
        "status": "queued",
        "last_transition_time": "2026-03-02T12:00:00Z",
        "drain_backoff_count": 2,
        "drain_backoff_expire": "2026-03-02T12:10:00.5Z"
    }
]
"#
        );
        assert_eq!(
            render_cke(&[]).unwrap(),
            "null\n",
            "ckecli prints a nil slice"
        );
    }

    #[test]
    fn phases_map_to_ckes_statuses() {
        for (phase, want) in [
            ("Queued", "queued"),
            ("Draining", "draining"),
            ("Rebooting", "rebooting"),
            ("Cancelled", "cancelled"),
            ("SomethingNew", "queued"),
        ] {
            let e = entry(1, "w", serde_json::json!({ "phase": phase }));
            assert_eq!(cke_status(&e), want, "{phase}");
        }
        let mut cancelling = entry(1, "w", serde_json::json!({ "phase": "Rebooting" }));
        cancelling.spec.cancel = true;
        assert_eq!(cke_status(&cancelling), "cancelled");
        assert_eq!(cke_status(&RebootQueueEntry::for_node("w", 1)), "queued");
    }

    /// `rq plan` names every node the gate counts as away, and says which are API servers.
    #[test]
    fn the_plan_table_names_away_nodes() {
        let mut snapshot = QueueSnapshot::default();
        snapshot.away.insert(
            "cp-0".into(),
            hostcycle_core::queue::AwayNode {
                why: "Machine capi/m-cp-0 has nodeRef cp-0 but no Node exists".into(),
                api_server: true,
                has_node: false,
            },
        );
        snapshot.away.insert(
            "w-0".into(),
            hostcycle_core::queue::AwayNode {
                why: "its BareMetalHost metal/w-0 is held off (reboot.metal3.io/x\u{1b}[2J)".into(),
                api_server: false,
                has_node: true,
            },
        );
        let plan = hostcycle_core::queue::plan(&snapshot, Timestamp::UNIX_EPOCH);
        let text = plan_table(&snapshot, &plan);
        assert!(
            text.contains(
                "away: node cp-0 is absent (Machine capi/m-cp-0 has nodeRef cp-0 but no Node \
                 exists); counts as unreachable (maxUnreachableNodes); an API server: no other \
                 API-server node starts meanwhile\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("away: node w-0 is away (its BareMetalHost metal/w-0 is held off"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "no control character: {text:?}");
    }

    #[test]
    fn empty_cells_leave_no_trailing_spaces() {
        let rows = vec![vec!["1".into(), String::new()]];
        assert_eq!(table(&["A", "B"], &rows), "A  B\n1\n");
    }
}
