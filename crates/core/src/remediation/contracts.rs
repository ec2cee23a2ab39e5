//! What hostcycle agrees on with the other remediators and health checkers in the field
//! (docs/remediation.md, "Running on OpenShift" and "What the checkers read"):
//!
//! - **one remediator per trigger**: OpenShift's bare-metal machine controller (CAPBM) runs
//!   the same `host.metal3.io/external-remediation` flow, with the same keys, on every Machine
//!   of its provider. Two controllers on one trigger race, so hostcycle takes the annotation
//!   trigger only where it is switched on (`--remediation-triggers`), never on a Machine
//!   another remediator holds, and not on CAPBM's Machines unless told so;
//! - **the power-on timeout** of the annotation flow is the matching MachineHealthCheck's
//!   `nodeStartupTimeout`, as CAPBM reads it;
//! - **NodeHealthCheck's requests**: escalation is NodeHealthCheck's, and a request whose Node
//!   hostcycle deleted is not an orphan while the Node is away.

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::remediation::{
    EXTERNAL_REMEDIATION_ANNOTATION, NHC_GROUP, NHC_NODE_NAME_ANNOTATION,
    NODE_ANNOTATIONS_BACKUP_ANNOTATION, NODE_LABELS_BACKUP_ANNOTATION, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, RemediationStep,
};
use serde_json::Value;

use super::record::Record;

/// Prefix of hostcycle's own Machine markers (written for people and tools, never read back).
pub const OWN_MARKER_PREFIX: &str = "remediation.hostcycle.io/";

/// The markers metal3's flow (CAPBM's) keeps on a Machine; hostcycle writes them too, but
/// always with its own record.
pub const METAL3_MACHINE_MARKERS: [&str; 4] = [
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION,
    NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    POWER_ON_TIMEOUT_ANNOTATION,
];

/// The kind of CAPBM's provider spec (`spec.providerSpec.value.kind` of its Machines).
pub const CAPBM_PROVIDER_SPEC_KIND: &str = "BareMetalMachineProviderSpec";
/// The API group of CAPBM's provider spec.
pub const CAPBM_PROVIDER_SPEC_GROUP: &str = "baremetal.cluster.k8s.io";

/// Which triggers hostcycle takes: `hostcycle operator --remediation-triggers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triggers {
    /// `machine-annotation`: `host.metal3.io/external-remediation` on a Machine.
    pub machine_annotation: bool,
    /// `requests`: HostRemediations.
    pub requests: bool,
    /// `capbm-machines`: the annotation trigger also on Machines of CAPBM's provider (only
    /// where CAPBM's own remediation does not run).
    pub capbm_machines: bool,
}

impl Default for Triggers {
    /// `machine-annotation,requests`: both, but never a Machine CAPBM or another remediator
    /// holds.
    fn default() -> Self {
        Triggers {
            machine_annotation: true,
            requests: true,
            capbm_machines: false,
        }
    }
}

impl std::str::FromStr for Triggers {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut t = Triggers {
            machine_annotation: false,
            requests: false,
            capbm_machines: false,
        };
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "machine-annotation" => t.machine_annotation = true,
                "requests" => t.requests = true,
                "capbm-machines" => t.capbm_machines = true,
                other => {
                    return Err(format!(
                        "{:?} is not a trigger: name `machine-annotation`, `requests` or \
                         `capbm-machines`",
                        other.chars().take(64).collect::<String>()
                    ));
                }
            }
        }
        if t.capbm_machines && !t.machine_annotation {
            return Err(
                "`capbm-machines` extends `machine-annotation`: name both, or neither".into(),
            );
        }
        if !t.machine_annotation && !t.requests {
            return Err(
                "name at least one of `machine-annotation` and `requests` (to remediate \
                        nothing, leave `remediation` out of --controllers)"
                    .into(),
            );
        }
        Ok(t)
    }
}

impl std::fmt::Display for Triggers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.machine_annotation {
            parts.push("machine-annotation");
        }
        if self.capbm_machines {
            parts.push("capbm-machines");
        }
        if self.requests {
            parts.push("requests");
        }
        f.write_str(&parts.join(","))
    }
}

/// What the claim rule reads of a Machine.
#[derive(Debug, Clone, Copy)]
pub struct MachineFacts<'a> {
    pub annotations: &'a BTreeMap<String, String>,
    /// hostcycle holds a record of a flow on this Machine (its own store, which only it
    /// writes).
    pub own_record: bool,
    /// Its host carries `reboot.metal3.io/capbm-requested-power-off`.
    pub host_power_off: bool,
    /// Its provider is CAPBM ([`is_capbm_provider`]).
    pub capbm_provider: bool,
}

/// Whose the annotation trigger on a Machine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineClaim {
    /// hostcycle remediates it (or finishes the flow it started).
    Ours,
    /// Not a remediation for hostcycle: no trigger, or the trigger is switched off.
    NotOurs,
    /// Another remediator holds it (or will): hostcycle does nothing, says why (a Warning).
    HeldElsewhere(String),
}

/// Whose the annotation trigger on this Machine is. A flow hostcycle started (its own record,
/// in its own store) is always finished, whatever the flags: its host is never left off. Else
/// the trigger is hostcycle's only when switched on, when no marker of a flow — another
/// remediator's, or hostcycle's own without its record (forged, or left by a flow that gave
/// up) — is on the Machine or its host, and — unless `capbm-machines` — when CAPBM does not
/// run the same flow on it.
pub fn machine_claim(triggers: &Triggers, m: &MachineFacts<'_>) -> MachineClaim {
    if m.own_record {
        return MachineClaim::Ours;
    }
    if !m.annotations.contains_key(EXTERNAL_REMEDIATION_ANNOTATION) || !triggers.machine_annotation
    {
        return MachineClaim::NotOurs;
    }
    let own: Vec<&str> = m
        .annotations
        .keys()
        .filter(|k| k.starts_with(OWN_MARKER_PREFIX))
        .map(String::as_str)
        .take(4)
        .collect();
    if !own.is_empty() {
        return MachineClaim::HeldElsewhere(format!(
            "hostcycle's markers ({}) are on this Machine but hostcycle holds no record of a \
             flow on it: they are left from a flow that gave up, or were written by someone \
             else; hostcycle never reads markers as a record and does not act on them — \
             remove them to remediate the Machine afresh",
            own.iter()
                .map(|k| crate::text::bounded(k, 96))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut foreign: Vec<&str> = METAL3_MACHINE_MARKERS
        .iter()
        .copied()
        .filter(|k| m.annotations.contains_key(*k))
        .collect();
    if m.host_power_off {
        foreign.push("its host's reboot.metal3.io/capbm-requested-power-off");
    }
    if !foreign.is_empty() {
        return MachineClaim::HeldElsewhere(format!(
            "another remediator (OpenShift's bare-metal machine controller, CAPBM) holds this \
             Machine: {} without hostcycle's record (remediation.hostcycle.io/*); hostcycle \
             does not act on it",
            foreign.join(", ")
        ));
    }
    if m.capbm_provider && !triggers.capbm_machines {
        return MachineClaim::HeldElsewhere(
            "the Machine's provider is OpenShift's bare-metal machine controller (CAPBM), which \
             remediates on this trigger itself; hostcycle leaves it to CAPBM (let hostcycle take \
             it with --remediation-triggers=machine-annotation,capbm-machines,requests only \
             where CAPBM's remediation does not run, or use a HostRemediationTemplate)"
                .into(),
        );
    }
    MachineClaim::Ours
}

/// Whether a Machine's spec names CAPBM's provider (`spec.providerSpec.value` of kind
/// `BareMetalMachineProviderSpec`, group `baremetal.cluster.k8s.io`).
pub fn is_capbm_provider(spec: &Value) -> bool {
    let value = &spec["providerSpec"]["value"];
    value["kind"].as_str() == Some(CAPBM_PROVIDER_SPEC_KIND)
        || value["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with(&format!("{CAPBM_PROVIDER_SPEC_GROUP}/")))
}

/// A MachineHealthCheck (`machine.openshift.io`), as the power-on timeout reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct MhcView {
    pub name: String,
    /// `spec.selector` (a label selector).
    pub selector: Value,
    /// `spec.nodeStartupTimeout` (a Go duration; the API server defaults it to `10m`).
    pub node_startup_timeout: Option<String>,
}

/// The power-on timeout CAPBM would use for a Machine with these labels: the
/// `nodeStartupTimeout` of the first MachineHealthCheck (by name) that selects it, when set
/// and not zero; `None` (the flag's) otherwise. Returns the MachineHealthCheck's name too.
pub fn node_startup_timeout(
    mhcs: &[MhcView],
    labels: &BTreeMap<String, String>,
) -> Option<(String, Duration)> {
    let mut sorted: Vec<&MhcView> = mhcs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mhc = sorted
        .into_iter()
        .find(|m| selector_matches(&m.selector, labels))?;
    let timeout = parse_go_duration(mhc.node_startup_timeout.as_deref()?)?;
    (!timeout.is_zero()).then(|| (mhc.name.clone(), timeout))
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`. An empty
/// selector selects everything (Kubernetes' rule); an unknown operator selects nothing.
pub fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector["matchLabels"].as_object();
    let labels_ok = match_labels.into_iter().flatten().all(|(k, v)| {
        v.as_str()
            .is_some_and(|v| labels.get(k).map(String::as_str) == Some(v))
    });
    let expressions = selector["matchExpressions"].as_array();
    let expressions_ok = expressions.into_iter().flatten().all(|e| {
        let Some(key) = e["key"].as_str() else {
            return false;
        };
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let have = labels.get(key).map(String::as_str);
        match e["operator"].as_str() {
            Some("In") => have.is_some_and(|h| values.contains(&h)),
            Some("NotIn") => have.is_none_or(|h| !values.contains(&h)),
            Some("Exists") => have.is_some(),
            Some("DoesNotExist") => have.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

/// A Go duration (`"10m"`, `"1h30m"`, `"1.5h"`, `"300ms"`, `"0"`): what Kubernetes'
/// `metav1.Duration` holds. `None` when it is not one (or negative).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return None;
        }
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    (total.is_finite() && total < 1e12).then(|| Duration::from_secs_f64(total))
}

/// Whether a request comes from medik8s' NodeHealthCheck: its `remediation.medik8s.io/
/// node-name` annotation, or an owner of NodeHealthCheck's group. NodeHealthCheck escalates
/// itself (to its next remediator), so hostcycle never deletes a Machine for it.
pub fn is_nhc_request<'a>(
    annotations: &BTreeMap<String, String>,
    owners: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> bool {
    annotations.contains_key(NHC_NODE_NAME_ANNOTATION)
        || owners.into_iter().any(|(api_version, kind)| {
            api_version.starts_with(&format!("{NHC_GROUP}/")) && kind == "NodeHealthCheck"
        })
}

/// `PermanentNodeDeletionExpected` of a request: True from the write that decides the Node's
/// deletion until the Node is back — also after giving up while it is still away, so
/// NodeHealthCheck does not take the request for an orphan (and delete it) but escalates
/// once the Node registers again and `Succeeded` is False.
pub fn permanent_node_deletion_expected(record: &Record, node_exists: bool) -> bool {
    let deletion_decided = record.labels_backup.is_some();
    match record.step {
        RemediationStep::PowerOffRequested => deletion_decided,
        RemediationStep::NodeReleased | RemediationStep::PowerOnRequested => !node_exists,
        RemediationStep::GaveUp => {
            (deletion_decided || record.node_released_at.is_some()) && !node_exists
        }
        RemediationStep::NotStarted | RemediationStep::Done | RemediationStep::Cancelled => false,
    }
}
