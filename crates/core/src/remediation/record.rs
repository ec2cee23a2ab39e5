//! The record of one remediation: which step it reached and what it must remember (times,
//! the Node's labels and annotations). A request keeps it in its status; the annotation flow
//! keeps it in a [`MachineFlowRecord`] in the operator's namespace. Both are written by
//! hostcycle alone. The annotation flow also writes metal3's markers onto the Machine, so a
//! Machine remediated by OpenShift's own controller and one remediated by hostcycle look the
//! same to other tools — but those markers are never read back.

use std::collections::BTreeMap;

use hostcycle_api::ObservedBmc;
use hostcycle_api::remediation::{
    HostRemediationStatus, MachineFlowRecord, NODE_ANNOTATIONS_BACKUP_ANNOTATION,
    NODE_LABELS_BACKUP_ANNOTATION, NODE_SPEC_BACKUP_ANNOTATION, NodeSpecBackup,
    POWER_ON_TIMEOUT_ANNOTATION, POWERED_OFF_FOR_REMEDIATION_ANNOTATION,
    REMEDIATION_FAILED_ANNOTATION, REMEDIATION_HOST_ANNOTATION, REMEDIATION_HOST_BMC_ANNOTATION,
    REMEDIATION_JOINED_ANNOTATION, REMEDIATION_NODE_RELEASED_AT_ANNOTATION,
    REMEDIATION_POWERED_OFF_AT_ANNOTATION, REMEDIATION_STARTED_ANNOTATION, RemediationStep,
};
use jiff::Timestamp;

use crate::binding::BoundHost;
use crate::remediation::release::Release;

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
    /// How the workloads are released, resolved at the start (`None`: `DeleteNode`, as
    /// records written before strategies existed).
    pub release: Option<Release>,
    /// The Node's bootID when the flow started: the run being fenced.
    pub fenced_boot_id: Option<String>,
    /// When releasing the workloads began (then the flow is finished, never cancelled).
    pub release_started_at: Option<Timestamp>,
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

    /// It still keeps a deleted Node's labels, annotations or taints to restore.
    pub fn holds_backup(&self) -> bool {
        self.labels_backup.is_some()
            || self.annotations_backup.is_some()
            || self.node_spec_backup.is_some()
    }

    /// The annotation flow's record may go once its trigger is gone: it gave up and has
    /// nothing left to restore (a flow that ends otherwise removes its record itself). Its
    /// failure marker stays on the Machine for people and tools; a new trigger is held until
    /// someone removes it.
    pub fn retires_without_trigger(&self) -> bool {
        self.step == RemediationStep::GaveUp && !self.holds_backup()
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
            release: status.release.as_deref().and_then(Release::parse),
            fenced_boot_id: status.fenced_boot_id.clone(),
            release_started_at: status.release_started_at,
        }
    }

    /// The release the flow runs (records without one: `DeleteNode`).
    pub fn release(&self) -> Release {
        self.release.unwrap_or(Release::DeleteNode)
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
        status.release = self.release.map(|r| r.as_str().to_string());
        status.fenced_boot_id = self.fenced_boot_id.clone();
        status.release_started_at = self.release_started_at;
    }

    /// Read from the annotation flow's record ([`MachineFlowRecord`]), which only hostcycle
    /// writes. The Machine's own annotations are never read back as a record: they are
    /// markers for other tools, and anyone who may edit the Machine may write them.
    pub fn from_machine_flow(stored: &MachineFlowRecord) -> Record {
        Record {
            started_at: stored.started_at,
            ..Record::from_status(&stored.status)
        }
    }

    /// The annotation flow's record of this, for the Machine `machine`
    /// (`<group>/<namespace>/<name>`) with uid `machine_uid`.
    pub fn to_machine_flow(&self, machine: &str, machine_uid: &str) -> MachineFlowRecord {
        let mut status = HostRemediationStatus::default();
        self.apply_to_status(&mut status);
        MachineFlowRecord {
            machine: machine.to_string(),
            machine_uid: machine_uid.to_string(),
            started_at: self.started_at,
            status,
        }
    }

    /// The field a record under way lacks, if any: such a record cannot be followed safely
    /// (which host it bound, when it began), so the flow gives up cleanly instead of waiting
    /// for ever.
    pub fn missing_field(&self) -> Option<&'static str> {
        if !self.in_flight() {
            return None;
        }
        if self.host.is_none() {
            return Some("the host it bound");
        }
        if self.started_at.is_none() {
            return Some("when it started");
        }
        None
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
