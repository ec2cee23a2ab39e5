//! The record of one remediation: which step it reached and what it must remember (times,
//! the Node's labels and annotations). A request keeps it in its status; the annotation flow
//! keeps it in the Machine's annotations, with metal3's keys, so a Machine remediated by
//! OpenShift's own controller and one remediated by hostcycle look the same.

use std::collections::BTreeMap;

use hostcycle_api::ObservedBmc;
use hostcycle_api::remediation::{
    HostRemediationStatus, NODE_ANNOTATIONS_BACKUP_ANNOTATION, NODE_LABELS_BACKUP_ANNOTATION,
    NODE_SPEC_BACKUP_ANNOTATION, NodeSpecBackup, POWER_ON_TIMEOUT_ANNOTATION,
    POWERED_OFF_FOR_REMEDIATION_ANNOTATION, REMEDIATION_FAILED_ANNOTATION,
    REMEDIATION_HOST_ANNOTATION, REMEDIATION_HOST_BMC_ANNOTATION, REMEDIATION_JOINED_ANNOTATION,
    REMEDIATION_NODE_RELEASED_AT_ANNOTATION, REMEDIATION_POWERED_OFF_AT_ANNOTATION,
    REMEDIATION_STARTED_ANNOTATION, RemediationStep,
};
use jiff::Timestamp;

use crate::binding::BoundHost;

/// Where a remediation is, and what it remembers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub step: RemediationStep,
    /// Power cycles after the first.
    pub retry_count: u32,
    /// When the remediation began (the trigger was first acted on).
    pub started_at: Option<Timestamp>,
    /// The host bound when the remediation started: every later step acts on it alone.
    pub host: Option<BoundHost>,
    /// The BMC bound with it (`spec.bmc`'s address and Secret, and the identity the BMC
    /// reported): readings from any other BMC are no evidence for this flow.
    pub bmc: Option<ObservedBmc>,
    /// The remediation of another trigger this one joined (one remediation per host).
    pub joined: Option<String>,
    /// When the current power cycle began: its power-off was requested (written ahead of the
    /// request), so a host status counts as "off" only if written after it.
    pub cycle_started_at: Option<Timestamp>,
    /// When the host was first seen off in this cycle.
    pub powered_off_at: Option<Timestamp>,
    /// When the Node was seen gone in this cycle.
    pub node_released_at: Option<Timestamp>,
    /// Waiting for the Node gives up at this time.
    pub power_on_timeout_at: Option<Timestamp>,
    /// The deleted Node's labels and annotations, until restored.
    pub labels_backup: Option<BTreeMap<String, String>>,
    pub annotations_backup: Option<BTreeMap<String, String>>,
    /// The deleted Node's cordon and taints, until restored.
    pub node_spec_backup: Option<NodeSpecBackup>,
    /// Why it gave up.
    pub failure: Option<String>,
}

impl Record {
    /// Power-off requested, Node released or power-on requested: counts against
    /// `maxConcurrentRemediations`.
    pub fn in_flight(&self) -> bool {
        matches!(
            self.step,
            RemediationStep::PowerOffRequested
                | RemediationStep::NodeReleased
                | RemediationStep::PowerOnRequested
        )
    }

    /// The Node was deleted (or found gone) after the host was off.
    pub fn node_released(&self) -> bool {
        matches!(
            self.step,
            RemediationStep::NodeReleased | RemediationStep::PowerOnRequested
        )
    }

    /// Read from a request's status.
    pub fn from_status(status: &HostRemediationStatus) -> Record {
        Record {
            step: status.step,
            retry_count: status.retry_count,
            host: status
                .host
                .as_deref()
                .zip(status.host_uid.as_deref())
                .and_then(|(host, uid)| BoundHost::parse(&format!("{host}/{uid}"))),
            bmc: status.host_bmc.clone(),
            joined: status.joined.clone(),
            // The request's creation is its trigger time: the caller sets it.
            started_at: None,
            cycle_started_at: status.last_remediated,
            powered_off_at: status.powered_off_at,
            node_released_at: status.node_released_at,
            power_on_timeout_at: status.power_on_timeout_at,
            labels_backup: status.node_labels_backup.clone(),
            annotations_backup: status.node_annotations_backup.clone(),
            node_spec_backup: status.node_spec_backup.clone(),
            failure: status
                .failure
                .clone()
                .filter(|_| status.step == RemediationStep::GaveUp),
        }
    }

    /// Writes the record into a request's status (phase, message and conditions are set
    /// by the caller).
    pub fn apply_to_status(&self, status: &mut HostRemediationStatus) {
        status.step = self.step;
        status.retry_count = self.retry_count;
        if let Some(host) = &self.host {
            status.host = Some(host.reference.to_string());
        }
        status.host_uid = self.host.as_ref().map(|h| h.uid.clone());
        if self.bmc.is_some() {
            status.host_bmc = self.bmc.clone();
        }
        status.joined = self.joined.clone();
        status.last_remediated = self.cycle_started_at;
        status.powered_off_at = self.powered_off_at;
        status.node_released_at = self.node_released_at;
        status.power_on_timeout_at = self.power_on_timeout_at;
        status.node_labels_backup = self.labels_backup.clone();
        status.node_annotations_backup = self.annotations_backup.clone();
        status.node_spec_backup = self.node_spec_backup.clone();
        status.failure = self
            .failure
            .clone()
            .filter(|_| self.step == RemediationStep::GaveUp);
    }

    /// Read from a Machine's annotations (the annotation flow). `host_powered_off_annotation`
    /// says whether the host carries the flow's power-off annotation.
    pub fn from_machine_annotations(
        annotations: &BTreeMap<String, String>,
        host_power_off_annotation: bool,
    ) -> Record {
        let time = |key: &str| annotations.get(key).and_then(|v| v.trim().parse().ok());
        let map = |key: &str| {
            annotations
                .get(key)
                .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v).ok())
        };
        let failure = annotations.get(REMEDIATION_FAILED_ANNOTATION).cloned();
        let step = if failure.is_some() {
            RemediationStep::GaveUp
        } else if annotations.contains_key(POWER_ON_TIMEOUT_ANNOTATION) {
            RemediationStep::PowerOnRequested
        } else if annotations.contains_key(POWERED_OFF_FOR_REMEDIATION_ANNOTATION) {
            RemediationStep::NodeReleased
        } else if host_power_off_annotation
            || annotations.contains_key(REMEDIATION_STARTED_ANNOTATION)
            || annotations.contains_key(REMEDIATION_HOST_ANNOTATION)
            || annotations.contains_key(NODE_LABELS_BACKUP_ANNOTATION)
        {
            RemediationStep::PowerOffRequested
        } else {
            RemediationStep::NotStarted
        };
        Record {
            step,
            retry_count: 0,
            host: annotations
                .get(REMEDIATION_HOST_ANNOTATION)
                .and_then(|v| BoundHost::parse(v)),
            bmc: annotations
                .get(REMEDIATION_HOST_BMC_ANNOTATION)
                .and_then(|v| serde_json::from_str(v).ok()),
            joined: annotations
                .get(REMEDIATION_JOINED_ANNOTATION)
                .map(|v| crate::text::bounded(v, 512)),
            started_at: time(REMEDIATION_STARTED_ANNOTATION),
            cycle_started_at: time(REMEDIATION_STARTED_ANNOTATION),
            powered_off_at: time(REMEDIATION_POWERED_OFF_AT_ANNOTATION),
            node_released_at: time(REMEDIATION_NODE_RELEASED_AT_ANNOTATION),
            power_on_timeout_at: time(POWER_ON_TIMEOUT_ANNOTATION),
            labels_backup: map(NODE_LABELS_BACKUP_ANNOTATION),
            annotations_backup: map(NODE_ANNOTATIONS_BACKUP_ANNOTATION),
            node_spec_backup: annotations
                .get(NODE_SPEC_BACKUP_ANNOTATION)
                .and_then(|v| serde_json::from_str(v).ok()),
            failure,
        }
    }

    /// The Machine annotations that represent this record: `Some(value)` to set, `None` to
    /// remove (a JSON merge patch of `metadata.annotations`).
    ///
    /// `Done` changes none: its markers go with the trigger (`FinishAnnotationFlow`, one
    /// write), so a restart between the record and that action does not read a Machine
    /// that still has the trigger but no markers as a new remediation.
    pub fn machine_annotations(&self) -> BTreeMap<&'static str, Option<String>> {
        if self.step == RemediationStep::Done {
            return BTreeMap::new();
        }
        let json = |m: &Option<BTreeMap<String, String>>| {
            m.as_ref().and_then(|m| serde_json::to_string(m).ok())
        };
        let released = matches!(
            self.step,
            RemediationStep::NodeReleased | RemediationStep::PowerOnRequested
        );
        let active = !matches!(
            self.step,
            RemediationStep::NotStarted | RemediationStep::Done | RemediationStep::Cancelled
        );
        BTreeMap::from([
            (
                REMEDIATION_HOST_ANNOTATION,
                self.host
                    .as_ref()
                    .filter(|_| active)
                    .map(BoundHost::to_string),
            ),
            (
                REMEDIATION_JOINED_ANNOTATION,
                self.joined
                    .clone()
                    .filter(|_| self.step == RemediationStep::NotStarted),
            ),
            (
                REMEDIATION_HOST_BMC_ANNOTATION,
                self.bmc
                    .as_ref()
                    .filter(|_| active)
                    .and_then(|b| serde_json::to_string(b).ok()),
            ),
            (
                NODE_SPEC_BACKUP_ANNOTATION,
                self.node_spec_backup
                    .as_ref()
                    .and_then(|b| serde_json::to_string(b).ok())
                    .filter(|_| active),
            ),
            (
                REMEDIATION_STARTED_ANNOTATION,
                self.started_at
                    .filter(|_| active && self.step != RemediationStep::GaveUp)
                    .map(|t| t.to_string()),
            ),
            (
                POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
                released.then(String::new),
            ),
            (
                REMEDIATION_POWERED_OFF_AT_ANNOTATION,
                self.powered_off_at
                    .filter(|_| active && self.step != RemediationStep::GaveUp)
                    .map(|t| t.to_string()),
            ),
            (
                REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
                self.node_released_at
                    .filter(|_| active && self.step != RemediationStep::GaveUp)
                    .map(|t| t.to_string()),
            ),
            (
                POWER_ON_TIMEOUT_ANNOTATION,
                self.power_on_timeout_at
                    .filter(|_| self.step == RemediationStep::PowerOnRequested)
                    .map(|t| t.to_string()),
            ),
            (
                NODE_LABELS_BACKUP_ANNOTATION,
                json(&self.labels_backup).filter(|_| active),
            ),
            (
                NODE_ANNOTATIONS_BACKUP_ANNOTATION,
                json(&self.annotations_backup).filter(|_| active),
            ),
            (
                REMEDIATION_FAILED_ANNOTATION,
                self.failure
                    .clone()
                    .filter(|_| self.step == RemediationStep::GaveUp),
            ),
        ])
    }
}
