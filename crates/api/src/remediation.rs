//! Machine remediation: the annotations of the metal3 external-remediation flow, and the
//! `HostRemediation` / `HostRemediationTemplate` resources (`hostcycle.io/v1alpha1`,
//! namespaced) through which Cluster API's MachineHealthCheck and medik8s' NodeHealthCheck
//! ask hostcycle to remediate a machine.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// On a Machine: remediate it (set by OpenShift's MachineHealthCheck, or by hand).
pub const EXTERNAL_REMEDIATION_ANNOTATION: &str = "host.metal3.io/external-remediation";
/// On a Machine: its host is off and its Node is gone (remediated, as opposed to "needs
/// remediation").
pub const POWERED_OFF_FOR_REMEDIATION_ANNOTATION: &str =
    "remediation.metal3.io/powered-off-for-remediation";
/// On a Machine: when waiting for the Node to come back gives up (RFC 3339).
pub const POWER_ON_TIMEOUT_ANNOTATION: &str = "remediation.metal3.io/power-on-will-timeout-at";
/// On a Machine (annotation flow) : the deleted Node's labels, as a JSON object.
pub const NODE_LABELS_BACKUP_ANNOTATION: &str = "remediation.metal3.io/node-labels-backup";
/// On a Machine (annotation flow): the deleted Node's annotations, as a JSON object.
pub const NODE_ANNOTATIONS_BACKUP_ANNOTATION: &str =
    "remediation.metal3.io/node-annotations-backup";
/// On a BareMetalHost: the power-off of the annotation flow (value `{"mode":"hard"}`).
pub const MACHINE_POWER_OFF_ANNOTATION: &str = "reboot.metal3.io/capbm-requested-power-off";
/// On a Machine (annotation flow): when the remediation began (RFC 3339), for the metrics.
pub const REMEDIATION_STARTED_ANNOTATION: &str = "remediation.hostcycle.io/started-at";
/// On a Machine (annotation flow): when the host was first seen off (RFC 3339).
pub const REMEDIATION_POWERED_OFF_AT_ANNOTATION: &str = "remediation.hostcycle.io/powered-off-at";
/// On a Machine (annotation flow): when the Node was seen gone (RFC 3339).
pub const REMEDIATION_NODE_RELEASED_AT_ANNOTATION: &str =
    "remediation.hostcycle.io/node-released-at";
/// On a Machine (annotation flow): the remediation gave up (the reason); the flow stops here.
pub const REMEDIATION_FAILED_ANNOTATION: &str = "remediation.hostcycle.io/failed";
/// On a Machine (annotation flow): the host the flow is bound to when it starts,
/// `<namespace>/<name>/<uid>`; every later step acts on this host, never on a new lookup.
pub const REMEDIATION_HOST_ANNOTATION: &str = "remediation.hostcycle.io/host";
/// On a Machine (annotation flow): the BMC bound with the host (JSON: address, Secret,
/// identity); only readings from it confirm the host off for this flow.
pub const REMEDIATION_HOST_BMC_ANNOTATION: &str = "remediation.hostcycle.io/host-bmc";
/// On a Machine (annotation flow): the remediation of another trigger this one joined (one
/// remediation per host); it ends with that one.
pub const REMEDIATION_JOINED_ANNOTATION: &str = "remediation.hostcycle.io/joined";
/// On a Machine (annotation flow): the deleted Node's cordon and taints, as a JSON
/// [`NodeSpecBackup`].
pub const NODE_SPEC_BACKUP_ANNOTATION: &str = "remediation.hostcycle.io/node-spec-backup";
/// On a HostRemediation: the name of the Node it is about (set by NodeHealthCheck).
pub const NHC_NODE_NAME_ANNOTATION: &str = "remediation.medik8s.io/node-name";
/// On a HostRemediation: NodeHealthCheck gave up on it and escalated elsewhere.
pub const NHC_TIMED_OUT_ANNOTATION: &str = "remediation.medik8s.io/nhc-timed-out";
/// On a HostRemediationTemplate: NodeHealthCheck may use several templates of this kind in one
/// `escalatingRemediations` chain (it then names requests with `generateName` and finds the
/// Node through `remediation.medik8s.io/node-name`).
pub const NHC_MULTIPLE_TEMPLATES_ANNOTATION: &str =
    "remediation.medik8s.io/multiple-templates-support";
/// The API group of medik8s' NodeHealthCheck (an owner of the requests it creates).
pub const NHC_GROUP: &str = "remediation.medik8s.io";
/// On a BareMetalHost: a remediation gave up on it, CAPM3's mark; CAPM3 chooses no such host
/// for a new Machine, and hostcycle starts no remediation on it. An administrator removes it
/// once the machine is repaired.
pub const CAPM3_UNHEALTHY_ANNOTATION: &str = "capm3.metal3.io/unhealthy";
/// CAPM3's former key of the same mark (its API before v1beta2), honoured on read.
pub const CAPM3_UNHEALTHY_DEPRECATED_ANNOTATION: &str = "capi.metal3.io/unhealthy";
/// The value hostcycle writes under [`CAPM3_UNHEALTHY_ANNOTATION`] (only the key counts).
pub const CAPM3_UNHEALTHY_VALUE: &str = "hostcycle/RemediationFailed";

/// The unhealthy mark a host carries (either key), if any.
pub fn unhealthy_mark(annotations: &BTreeMap<String, String>) -> Option<&'static str> {
    [
        CAPM3_UNHEALTHY_ANNOTATION,
        CAPM3_UNHEALTHY_DEPRECATED_ANNOTATION,
    ]
    .into_iter()
    .find(|k| annotations.contains_key(*k))
}

/// Finalizer on a HostRemediation: cleanup finishes before the object goes.
pub const HOST_REMEDIATION_FINALIZER: &str = "hostcycle.io/remediation";
/// Prefix of the power-off annotation a HostRemediation puts on its host
/// (`reboot.metal3.io/hostcycle-remediation-<uid>`), one per request.
pub const REQUEST_POWER_OFF_PREFIX: &str = "reboot.metal3.io/hostcycle-remediation-";

/// The power-off annotation of the HostRemediation with this UID.
pub fn request_power_off_annotation(uid: &str) -> String {
    format!("{REQUEST_POWER_OFF_PREFIX}{uid}")
}

/// Whether `key` is one of the power-off annotations remediation puts on a host: the
/// annotation flow's (`MACHINE_POWER_OFF_ANNOTATION`) or a HostRemediation's.
pub fn is_remediation_power_off(key: &str) -> bool {
    key == MACHINE_POWER_OFF_ANNOTATION || key.starts_with(REQUEST_POWER_OFF_PREFIX)
}

/// Default `spec.strategy.retryLimit`.
pub const DEFAULT_RETRY_LIMIT: u32 = 1;
/// Default `spec.strategy.timeoutSeconds`: how long the Node may take to come back.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 600;

/// What to do to a failed machine, and how patiently.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStrategy {
    /// `Reboot` (the only one, and the default): power off, release the Node, power on,
    /// wait for it. Any other value is refused when the object is created: a request for a
    /// strategy hostcycle does not have must not become a power cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["Reboot"]))]
    pub type_: Option<String>,
    /// Power cycles after the first one when the Node does not come back (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_limit: Option<u32>,
    /// How long the Node may take to register again after the power-on (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<u64>,
    /// How the node's workloads are released once the host is confirmed off (two BMC
    /// readings `Off` after hostcycle's power-off): `DeleteNode` (the default: back the Node
    /// up and delete it), `ReleaseWorkloads` (force-delete its pods and clear its
    /// `status.volumesInUse`; the Node stays, tainted `hostcycle.io/fenced`),
    /// `OutOfServiceTaint` (Kubernetes 1.28 and later: the
    /// `node.kubernetes.io/out-of-service` taint, plus force-deleting the pods) or `Auto`
    /// (`OutOfServiceTaint` where the cluster serves it, else `ReleaseWorkloads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["DeleteNode", "ReleaseWorkloads", "OutOfServiceTaint", "Auto"]))]
    pub release: Option<String>,
    /// What happens once the workloads are released: `PowerOn` (the default: power the host
    /// on and wait for its Node) or `LeaveOff` (the host stays off, reported by the
    /// `HostLeftOff` Event, the `LeftOff` condition and a metric, until a person sets
    /// `PowerOn` or deletes the request). A `HostHealthCheck` sets `LeaveOff` for a node that
    /// fails again within its `repeatFailureWindowSeconds`, so a broken machine is not cycled
    /// for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["PowerOn", "LeaveOff"]))]
    pub after_release: Option<String>,
}

impl RemediationStrategy {
    /// `afterRelease: LeaveOff`.
    pub fn leave_off(&self) -> bool {
        self.after_release.as_deref() == Some(after_release::LEAVE_OFF)
    }
}

/// `spec.strategy.afterRelease` values.
pub mod after_release {
    pub const POWER_ON: &str = "PowerOn";
    pub const LEAVE_OFF: &str = "LeaveOff";
}

/// `spec.strategy.release` values.
pub mod release_strategy {
    pub const DELETE_NODE: &str = "DeleteNode";
    pub const RELEASE_WORKLOADS: &str = "ReleaseWorkloads";
    pub const OUT_OF_SERVICE_TAINT: &str = "OutOfServiceTaint";
    pub const AUTO: &str = "Auto";
}

/// The taint on a Node whose host a remediation is fencing (from the power-off request until
/// the Node is Ready again with a new boot), so nothing new is scheduled onto it.
pub const FENCED_TAINT_KEY: &str = "hostcycle.io/fenced";
/// Kubernetes' out-of-service taint (1.28 and later): the pod GC and the attach/detach
/// controller release a tainted NotReady node's pods and volumes at once.
pub const OUT_OF_SERVICE_TAINT_KEY: &str = "node.kubernetes.io/out-of-service";
/// The value hostcycle puts on the out-of-service taint.
pub const OUT_OF_SERVICE_TAINT_VALUE: &str = "nodeshutdown";
/// On a Node: the out-of-service taint on it is hostcycle's (value: the remediation's uid);
/// hostcycle removes only a taint so marked.
pub const OUT_OF_SERVICE_OURS_ANNOTATION: &str = "remediation.hostcycle.io/out-of-service-taint";

/// A request to remediate one machine: created from a [`HostRemediationTemplate`] by Cluster
/// API's MachineHealthCheck (named after the Machine, owned by it) or medik8s'
/// NodeHealthCheck (named after the Node), and deleted by them once it is healthy again.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "hostcycle.io",
    version = "v1alpha1",
    kind = "HostRemediation",
    plural = "hostremediations",
    singular = "hostremediation",
    shortname = "hr",
    namespaced,
    status = "HostRemediationStatus",
    derive = "PartialEq",
    doc = "HostRemediation asks hostcycle to fence and recover one machine: power off, release its Node, power on, wait for it.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Step", type_ = "string", json_path = ".status.step"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(name = "Retries", type_ = "integer", json_path = ".status.retryCount"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<RemediationStrategy>,
    /// Fields this version does not model, kept.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The template a health checker copies `spec.template.spec` from.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "hostcycle.io",
    version = "v1alpha1",
    kind = "HostRemediationTemplate",
    plural = "hostremediationtemplates",
    singular = "hostremediationtemplate",
    shortname = "hrt",
    namespaced,
    derive = "PartialEq",
    doc = "HostRemediationTemplate is what MachineHealthCheck and NodeHealthCheck create HostRemediations from."
)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediationTemplateSpec {
    pub template: HostRemediationTemplateResource,
}

/// `spec.template` of a [`HostRemediationTemplate`]: what each request is made of. Cluster
/// API's MachineHealthCheck copies all of it (the `metadata` labels and annotations onto the
/// request, with its own); NodeHealthCheck copies `spec` only.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediationTemplateResource {
    /// Labels and annotations of the requests made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    /// The request's `spec`. Required: a template without it would make requests that say
    /// nothing (`{}` is a valid spec: a Reboot with the defaults).
    pub spec: HostRemediationSpec,
}

/// The part of an object's metadata a template may set (Cluster API's `ObjectMeta`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateObjectMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What an administrator set on a Node's spec, kept while the Node is deleted and put back
/// when it registers again: the cordon (unless the reboot queue's) and the taints other
/// than the ones Kubernetes manages itself (`node.kubernetes.io/…`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpecBackup {
    /// `spec.unschedulable` was set by someone other than the reboot queue.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<TaintBackup>,
}

impl NodeSpecBackup {
    pub fn is_empty(&self) -> bool {
        !self.unschedulable && self.taints.is_empty()
    }
}

/// A Node taint, as backed up.
#[derive(
    Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct TaintBackup {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// Where a remediation stands. `Running`, `Waiting`, `Deleting machine` and `Failed` are
/// CAPM3's `Metal3Remediation` phases, for people who know those; `Pending` (not started
/// yet) and `Succeeded` are hostcycle's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RemediationPhase {
    /// Not started: waiting for a slot, for a reboot in the queue, or for its target.
    #[default]
    Pending,
    /// Powering off and releasing the Node.
    Running,
    /// Powered on again; waiting for the Node.
    Waiting,
    /// The Node came back; labels and annotations are restored.
    Succeeded,
    /// Gave up; the Machine is being deleted so its owner replaces it.
    DeletingMachine,
    /// Gave up.
    Failed,
    /// A value this version does not know.
    Unknown,
}

impl RemediationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Waiting => "Waiting",
            Self::Succeeded => "Succeeded",
            Self::DeletingMachine => "Deleting machine",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
        }
    }
}

impl Serialize for RemediationPhase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RemediationPhase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "Pending" => Self::Pending,
            "Running" => Self::Running,
            "Waiting" => Self::Waiting,
            "Succeeded" => Self::Succeeded,
            "Deleting machine" => Self::DeletingMachine,
            "Failed" => Self::Failed,
            _ => Self::Unknown,
        })
    }
}

impl JsonSchema for RemediationPhase {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RemediationPhase".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "Pending, Running, Waiting, Succeeded, Deleting machine or Failed.",
        })
    }
}

/// The step of the flow (finer than the phase). Written before the step's action is taken.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum RemediationStep {
    /// Nothing done yet.
    #[default]
    NotStarted,
    /// The host's power-off is requested; the Node is released once the host is off.
    PowerOffRequested,
    /// The host is off and the Node is gone.
    NodeReleased,
    /// Power-on requested; waiting for the Node to register again.
    PowerOnRequested,
    /// The Node is back with its labels and annotations.
    Done,
    /// Gave up (see the message); escalation, if any, is done.
    GaveUp,
    /// The trigger went away before the Node was deleted: the host was released.
    Cancelled,
}

/// What hostcycle records about a HostRemediation (the backups live here too).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RemediationPhase>,
    #[serde(default)]
    pub step: RemediationStep,
    /// The Node being remediated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The BareMetalHost, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The uid of the host bound when the remediation started: every later step acts on
    /// this host only (a host re-created under the same name is not it).
    #[serde(default, rename = "hostUID", skip_serializing_if = "Option::is_none")]
    pub host_uid: Option<String>,
    /// The host's BMC bound with it (address, Secret, the identity the BMC reported): only
    /// readings from this BMC confirm the host off for this remediation.
    #[serde(default, rename = "hostBMC", skip_serializing_if = "Option::is_none")]
    pub host_bmc: Option<crate::host::ObservedBmc>,
    /// The remediation of another trigger running on the same host, which this one joined: it
    /// starts no flow of its own and ends with that one (one remediation per host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined: Option<String>,
    /// Power cycles after the first.
    #[serde(default)]
    pub retry_count: u32,
    /// When the current power cycle began (CAPM3's `lastRemediated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remediated: Option<Timestamp>,
    /// When the host was first seen off in the current cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub powered_off_at: Option<Timestamp>,
    /// When the Node was gone (released) in the current cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_released_at: Option<Timestamp>,
    /// Waiting for the Node gives up at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on_timeout_at: Option<Timestamp>,
    /// The deleted Node's labels, restored when it comes back (keys on the new Node win).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_labels_backup: Option<BTreeMap<String, String>>,
    /// The deleted Node's annotations, restored likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_annotations_backup: Option<BTreeMap<String, String>>,
    /// The deleted Node's cordon and taints, restored likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_spec_backup: Option<NodeSpecBackup>,
    /// How the workloads are released (`DeleteNode`, `ReleaseWorkloads` or
    /// `OutOfServiceTaint`): `spec.strategy.release` resolved when the flow started, kept for
    /// the whole flow. Absent: `DeleteNode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// The Node's `status.nodeInfo.bootID` when the flow started: the run being fenced. The
    /// Node counts as back only when Ready with another one.
    #[serde(
        default,
        rename = "fencedBootID",
        skip_serializing_if = "Option::is_none"
    )]
    pub fenced_boot_id: Option<String>,
    /// When releasing the workloads began (after the host was confirmed off): from then on
    /// the flow is not cancelled, only finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_started_at: Option<Timestamp>,
    /// Why the remediation gave up (step `GaveUp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// In words: what the remediation does or waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Processing`, `Succeeded`, `PermanentNodeDeletionExpected` (NodeHealthCheck reads
    /// these), and `Blocked`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl HostRemediationStatus {
    pub fn phase(&self) -> RemediationPhase {
        self.phase.unwrap_or_default()
    }
}

/// Label of the ConfigMaps (in the operator's namespace) that hold the annotation flow's
/// records, one per Machine; its value is the Machine's uid. Only the operator's account (and
/// the administrators of its namespace) writes them: a Machine's annotations, which any
/// editor of the Machine may write, are markers for other tools and never read back.
pub const MACHINE_FLOW_RECORD_LABEL: &str = "remediation.hostcycle.io/machine-uid";
/// The key of a flow record ConfigMap's data holding the [`MachineFlowRecord`] (JSON).
pub const MACHINE_FLOW_RECORD_KEY: &str = "record";

/// The name of the ConfigMap holding the record of the annotation flow on the Machine with
/// uid `machine_uid`.
pub fn machine_flow_record_name(machine_uid: &str) -> String {
    format!("hostcycle-machine-flow-{machine_uid}")
}

/// The record of one annotation flow (a Machine's `host.metal3.io/external-remediation`),
/// kept where only hostcycle writes it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MachineFlowRecord {
    /// The Machine, `<group>/<namespace>/<name>`.
    pub machine: String,
    /// The Machine's uid: a Machine deleted and recreated under the same name is another one.
    pub machine_uid: String,
    /// When the remediation began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// Step, binding, times and backups, as a request's status holds them.
    #[serde(default)]
    pub status: HostRemediationStatus,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn phases_read_and_write_capm3_strings() {
        for (text, phase) in [
            ("Running", RemediationPhase::Running),
            ("Waiting", RemediationPhase::Waiting),
            ("Deleting machine", RemediationPhase::DeletingMachine),
            ("Failed", RemediationPhase::Failed),
        ] {
            let v = serde_json::to_value(phase).unwrap();
            assert_eq!(v, text);
            let back: RemediationPhase = serde_json::from_value(v).unwrap();
            assert_eq!(back, phase);
        }
        let odd: RemediationPhase = serde_json::from_value(serde_json::json!("Later")).unwrap();
        assert_eq!(odd, RemediationPhase::Unknown);
    }

    #[test]
    fn a_template_spec_deserialises_from_what_checkers_copy() {
        let t: HostRemediationTemplateSpec = serde_json::from_value(serde_json::json!({
            "template": { "spec": { "strategy": { "type": "Reboot", "retryLimit": 2, "timeoutSeconds": 300 } } }
        }))
        .unwrap();
        let s = t.template.spec.strategy.unwrap();
        assert_eq!((s.retry_limit, s.timeout_seconds), (Some(2), Some(300)));
    }
}
