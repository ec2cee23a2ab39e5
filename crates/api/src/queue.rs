//! The reboot queue's custom resources (`hostcycle.io/v1alpha1`, cluster-scoped):
//!
//! - [`RebootQueue`] (`rq`): the singleton `default` holding the queue's configuration. An
//!   absent object, or an absent field, means the documented default.
//! - [`RebootQueueEntry`] (`rqe`): one node to reboot. Administrators (the CLI) write `spec`;
//!   the controller writes only `status`, so a cancel can never be lost to a status write.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Name of the one `RebootQueue` the controller reads.
pub const REBOOT_QUEUE_NAME: &str = "default";

/// On a Node: hostcycle's reboot queue cordoned it (value: the entry's name). Only a node
/// carrying this annotation is ever uncordoned by the queue; an administrator's cordon stays.
pub const CORDONED_BY_ANNOTATION: &str = "hostcycle.io/cordoned-by-reboot-queue";

/// On a BareMetalHost: the UID of the queue entry whose reboot request it carries.
pub const REQUEST_MARKER_ANNOTATION: &str = "hostcycle.io/reboot-queue-request";
/// On a BareMetalHost: the UID of the queue entry rebooting it with the reboot command. The
/// host controller then leaves the host's power to the command: it does not "correct" a
/// host it finds off mid-cycle (which would make a waiting command time out and, retried,
/// reboot the node twice).
pub const COMMAND_MARKER_ANNOTATION: &str = "hostcycle.io/reboot-queue-command";

/// On a Node: `<namespace>/<name>` of its BareMetalHost, when no other mapping finds it.
pub const NODE_HOST_ANNOTATION: &str = "hostcycle.io/baremetalhost";

/// On the `RebootQueue`: the next index older versions of `hostcycle reboot-queue add`
/// handed out. Read (never written) so indices keep increasing across an upgrade: writing it
/// needed a patch of the RebootQueue, which RBAC cannot limit to one annotation.
pub const NEXT_INDEX_ANNOTATION: &str = "hostcycle.io/next-index";

/// The ConfigMap, in the operator's namespace, holding the reboot and boot-check commands the
/// queue may run: one key per command set. Only administrators of that namespace write it;
/// the RebootQueue only selects a set by name (`spec.reboot.commands`).
pub const REBOOT_COMMANDS_CONFIG_MAP: &str = "hostcycle-reboot-commands";
/// The command set used when `spec.reboot.commands` is unset.
pub const DEFAULT_COMMAND_SET: &str = "default";

/// Default `maxConcurrentReboots`.
pub const DEFAULT_MAX_CONCURRENT_REBOOTS: u32 = 1;
/// Default `maxUnreachableNodes`.
pub const DEFAULT_MAX_UNREACHABLE_NODES: u32 = 0;
/// Default `evictionTimeoutSeconds`.
pub const DEFAULT_EVICTION_TIMEOUT_SECONDS: u64 = 600;
/// Default `drainBackoff.baseSeconds`.
pub const DEFAULT_DRAIN_BACKOFF_BASE_SECONDS: u64 = 300;
/// Default `drainBackoff.maxSeconds`.
pub const DEFAULT_DRAIN_BACKOFF_MAX_SECONDS: u64 = 1200;
/// Default `drainBackoff.jitterSeconds`.
pub const DEFAULT_DRAIN_BACKOFF_JITTER_SECONDS: u64 = 300;
/// Default `reboot.commandTimeoutSeconds` (0 means no timeout).
pub const DEFAULT_COMMAND_TIMEOUT_SECONDS: u64 = 30;
/// Default `reboot.bootTimeoutSeconds`.
pub const DEFAULT_BOOT_TIMEOUT_SECONDS: u64 = 1800;
/// Default `reboot.bootCheckIntervalSeconds`.
pub const DEFAULT_BOOT_CHECK_INTERVAL_SECONDS: u64 = 10;

/// Configuration of the reboot queue. Every field is optional; an absent field (or an
/// absent object) takes the default named in its description.
// Several printcolumns share a `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "hostcycle.io",
    version = "v1alpha1",
    kind = "RebootQueue",
    plural = "rebootqueues",
    singular = "rebootqueue",
    shortname = "rq",
    status = "RebootQueueStatus",
    derive = "PartialEq",
    doc = "RebootQueue is the reboot queue's configuration; hostcycle reads the one named `default`.",
    printcolumn(
        name = "Enabled",
        type_ = "boolean",
        json_path = ".status.enabled",
        description = "Whether new drains may start"
    ),
    printcolumn(
        name = "Running",
        type_ = "boolean",
        json_path = ".status.running",
        description = "Whether the controller is processing the queue"
    ),
    printcolumn(name = "Queued", type_ = "integer", json_path = ".status.queued"),
    printcolumn(name = "Draining", type_ = "integer", json_path = ".status.draining"),
    printcolumn(name = "Rebooting", type_ = "integer", json_path = ".status.rebooting"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RebootQueueSpec {
    /// Whether new drains may start (default true). Cancels and removals happen either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Most nodes draining or rebooting at once (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_reboots: Option<u32>,
    /// A drain starts only while at most this many nodes that are not being processed have a
    /// Ready condition that is not True (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unreachable_nodes: Option<u32>,
    /// A drain not complete after this long backs off (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub eviction_timeout_seconds: Option<u64>,
    /// How often an eviction refused by a PodDisruptionBudget in a protected namespace is
    /// tried again before the drain backs off (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_retries: Option<u32>,
    /// Seconds between those tries (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_interval_seconds: Option<u64>,
    /// Namespaces (by label) whose pods are never deleted when a PodDisruptionBudget refuses
    /// their eviction. Unset: every namespace is protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_namespaces: Option<LabelSelector>,
    /// Running Job pods (by label) that make a drain back off instead of being deleted.
    /// Unset: every Job pod is protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_job_pods: Option<LabelSelector>,
    /// How long a failed drain waits before it is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_backoff: Option<DrainBackoffSpec>,
    /// How nodes are rebooted and how a boot is confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<RebootSpec>,
}

/// Backoff after a failed drain: `min(2^(n-1) * baseSeconds, maxSeconds) + random[0, jitterSeconds)`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainBackoffSpec {
    /// Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_seconds: Option<u64>,
    /// Default 1200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seconds: Option<u64>,
    /// Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_seconds: Option<u64>,
}

/// How the queue reboots a drained node.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum RebootMethod {
    /// Add the `reboot.metal3.io` annotation to the node's BareMetalHost.
    #[serde(rename = "BMC")]
    Bmc,
    /// Run a command set's reboot and boot-check commands (CKE compatible), from ConfigMap
    /// `hostcycle-reboot-commands` in the operator's namespace.
    Command,
}

impl RebootMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bmc => "BMC",
            Self::Command => "Command",
        }
    }
}

/// Reboot and boot-check settings.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootSpec {
    /// `BMC` or `Command`. Unset: `BMC` for a node with a BareMetalHost, else `Command`
    /// when the selected command set is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<RebootMethod>,
    /// Name of the command set (a key of ConfigMap `hostcycle-reboot-commands` in the
    /// operator's namespace, which only administrators write) that reboots a node and checks
    /// its boot with `Command` (default `default`). The commands themselves are never read
    /// from the RebootQueue: whoever may write it must not choose what the operator runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub commands: Option<String>,
    /// Deprecated and never run: commands are configured by an administrator in ConfigMap
    /// `hostcycle-reboot-commands` of the operator's namespace. Kept so that a queue still
    /// carrying it is told so instead of silently changing method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub reboot_command: Vec<String>,
    /// Deprecated and never run, as `rebootCommand`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub boot_check_command: Vec<String>,
    /// A command still running after this long is killed (default 30; 0: never, as in CKE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_timeout_seconds: Option<u64>,
    /// How often a failed command is tried again (default 0): only a run that exited, once the
    /// boot check reaches the node at least 15 s later and says it has not booted; never a
    /// run that timed out (its reboot may be pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_retries: Option<u32>,
    /// Seconds between those tries (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_interval_seconds: Option<u64>,
    /// Seconds between boot checks with `Command` (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub boot_check_interval_seconds: Option<u64>,
    /// A boot not confirmed this long after the `Rebooting` transition raises a Warning, a
    /// condition and a metric; the entry keeps waiting (default 1800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub boot_timeout_seconds: Option<u64>,
}

/// What the controller reports about the queue.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootQueueStatus {
    /// `spec.enabled` as the controller last applied it.
    #[serde(default)]
    pub enabled: bool,
    /// True while a controller processes the queue: it is enabled and has entries.
    #[serde(default)]
    pub running: bool,
    #[serde(default)]
    pub queued: u32,
    /// Queued entries whose drain backoff has not expired (also counted in `queued`).
    #[serde(default)]
    pub backed_off: u32,
    #[serde(default)]
    pub draining: u32,
    #[serde(default)]
    pub rebooting: u32,
    #[serde(default)]
    pub cancelled: u32,
    /// In words: what the queue is doing or waiting for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Timestamp>,
    /// The highest entry index the controller has seen: `hostcycle reboot-queue add` hands
    /// out indices above it, so they keep increasing after entries leave the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_index: Option<u64>,
}

/// One node waiting to be, or being, drained and rebooted.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "hostcycle.io",
    version = "v1alpha1",
    kind = "RebootQueueEntry",
    plural = "rebootqueueentries",
    singular = "rebootqueueentry",
    shortname = "rqe",
    status = "RebootQueueEntryStatus",
    derive = "PartialEq",
    doc = "RebootQueueEntry asks hostcycle to drain and reboot one node.",
    printcolumn(name = "Index", type_ = "integer", json_path = ".spec.index"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Cancel",
        type_ = "boolean",
        json_path = ".spec.cancel",
        priority = 1
    ),
    printcolumn(
        name = "Backoff-Until",
        type_ = "string",
        json_path = ".status.drainBackoffExpire"
    ),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RebootQueueEntrySpec {
    /// Name of the Node to reboot.
    pub node: String,
    /// Position in the queue: unique and strictly increasing, assigned when added.
    pub index: u64,
    /// Set to true to cancel: a draining node is uncordoned and not rebooted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
}

/// Where an entry is. Unknown values (a newer writer) read as [`EntryPhase::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EntryPhase {
    #[default]
    Queued,
    Draining,
    Rebooting,
    Cancelled,
    /// A value this version does not know; treated as `Queued` and never written.
    Unknown,
}

impl EntryPhase {
    pub const ALL: [EntryPhase; 4] = [
        EntryPhase::Queued,
        EntryPhase::Draining,
        EntryPhase::Rebooting,
        EntryPhase::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "Queued",
            Self::Draining => "Draining",
            Self::Rebooting => "Rebooting",
            Self::Cancelled => "Cancelled",
            Self::Unknown => "Unknown",
        }
    }

    /// Draining or Rebooting: counts against `maxConcurrentReboots`.
    pub fn in_progress(self) -> bool {
        matches!(self, Self::Draining | Self::Rebooting)
    }
}

impl std::fmt::Display for EntryPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntryPhase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntryPhase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "Queued" => Self::Queued,
            "Draining" => Self::Draining,
            "Rebooting" => Self::Rebooting,
            "Cancelled" => Self::Cancelled,
            _ => Self::Unknown,
        })
    }
}

impl JsonSchema for EntryPhase {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EntryPhase".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "Queued, Draining, Rebooting or Cancelled.",
        })
    }
}

/// What the controller records about an entry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootQueueEntryStatus {
    /// Absent until the controller first writes: the entry is queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<EntryPhase>,
    /// When `phase` last changed (controller clock, sub-second RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Timestamp>,
    /// Failed drains so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drain_backoff_count: u32,
    /// The entry is not drained again before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_backoff_expire: Option<Timestamp>,
    /// Why the last drain failed (kept while the entry waits out its backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drain_failure: Option<String>,
    /// In words: what the entry is doing or waiting for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The reboot in progress; written before the reboot is requested (write-ahead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<RebootProgress>,
    /// `BootTimedOut`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RebootQueueEntryStatus {
    /// The phase, `Queued` when never written (or unknown).
    pub fn phase(&self) -> EntryPhase {
        match self.phase {
            None | Some(EntryPhase::Unknown) => EntryPhase::Queued,
            Some(p) => p,
        }
    }
}

/// A BareMetalHost by namespace and name.
#[derive(
    Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct HostReference {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for HostReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The reboot of one entry, as far as it got.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootProgress {
    pub method: RebootMethod,
    /// The node's BareMetalHost (method `BMC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostReference>,
    /// The uid of that host when the reboot began: a host re-created under the same name is
    /// not the one being rebooted.
    #[serde(default, rename = "hostUID", skip_serializing_if = "Option::is_none")]
    pub host_uid: Option<String>,
    /// The node's `status.nodeInfo.bootID` when the reboot began; a different one later
    /// proves a new boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// When the reboot was (about to be) requested: annotation added, or command started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Timestamp>,
    /// When the queue first saw the host powered off after the `Rebooting` transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_powered_off_at: Option<Timestamp>,
    /// Reboot command runs started so far (method `Command`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub command_attempts: u32,
    /// The reboot command gave up after its retries (method `Command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_failure: Option<String>,
}

impl RebootProgress {
    pub fn new(method: RebootMethod) -> Self {
        RebootProgress {
            method,
            host: None,
            host_uid: None,
            boot_id: None,
            requested_at: None,
            host_powered_off_at: None,
            command_attempts: 0,
            command_failure: None,
        }
    }
}

impl RebootQueueEntry {
    /// The canonical object name for an entry with this index (`rqe-0000000042`).
    pub fn name_for_index(index: u64) -> String {
        format!("rqe-{index:010}")
    }

    /// A new entry for `node` at `index`.
    pub fn for_node(node: &str, index: u64) -> Self {
        RebootQueueEntry::new(
            &Self::name_for_index(index),
            RebootQueueEntrySpec {
                node: node.to_string(),
                index,
                cancel: false,
            },
        )
    }

    /// The phase (Queued when the status was never written).
    pub fn phase(&self) -> EntryPhase {
        self.status.as_ref().map(|s| s.phase()).unwrap_or_default()
    }

    /// `Some(T)` while the queue has a reboot in flight on `spec.node`: the entry is
    /// `Rebooting` since `T`, cancelled or not — a cancelled entry whose power cycle began stays
    /// `Rebooting` until the node booted (one whose cycle had not begun is withdrawn at once),
    /// and that cycle goes on. What other controllers read of the queue.
    pub fn rebooting_since(&self) -> Option<Timestamp> {
        let status = self.status.as_ref()?;
        (status.phase() == EntryPhase::Rebooting)
            .then_some(status.last_transition_time)
            .flatten()
    }
}

impl RebootQueueSpec {
    /// `reboot.bootTimeoutSeconds` as the queue applies it: the default when absent, at
    /// least one second.
    pub fn boot_timeout_seconds(&self) -> u64 {
        self.reboot
            .as_ref()
            .and_then(|r| r.boot_timeout_seconds)
            .unwrap_or(DEFAULT_BOOT_TIMEOUT_SECONDS)
            .max(1)
    }
}

impl RebootQueue {
    /// The lowest index a new entry may get, from what the queue object records: past the
    /// highest index the controller has seen, and past the annotation older versions wrote.
    pub fn next_index(&self) -> Option<u64> {
        let legacy = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NEXT_INDEX_ANNOTATION))
            .and_then(|v| v.trim().parse::<u64>().ok());
        let seen = self
            .status
            .as_ref()
            .and_then(|s| s.highest_index)
            .map(|h| h.saturating_add(1));
        legacy.max(seen)
    }
}

/// Label selectors as the queue evaluates them: `matchLabels` and `matchExpressions`
/// (`In`, `NotIn`, `Exists`, `DoesNotExist`). An empty selector matches everything.
/// `Err` names an unusable expression; callers treat it as matching (the safe reading:
/// protected).
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    for (key, value) in selector.match_labels.iter().flatten() {
        if labels.get(key) != Some(value) {
            return Ok(false);
        }
    }
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr.values.as_deref().unwrap_or_default();
        let present = labels.get(&expr.key);
        let ok = match expr.operator.as_str() {
            "In" => {
                if values.is_empty() {
                    return Err(format!("operator In on {:?} needs values", expr.key));
                }
                present.is_some_and(|v| values.contains(v))
            }
            "NotIn" => {
                if values.is_empty() {
                    return Err(format!("operator NotIn on {:?} needs values", expr.key));
                }
                present.is_none_or(|v| !values.contains(v))
            }
            "Exists" => present.is_some(),
            "DoesNotExist" => present.is_none(),
            other => return Err(format!("unknown selector operator {other:?}")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selectors() {
        let l = labels(&[("team", "db"), ("tier", "prod")]);
        let sel = |ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: (!ml.is_empty()).then(|| labels(ml)),
            match_expressions: (!me.is_empty()).then_some(me),
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, LabelSelector, Result<bool, ()>)> = vec![
            ("empty matches all", sel(&[], vec![]), Ok(true)),
            ("matchLabels hit", sel(&[("team", "db")], vec![]), Ok(true)),
            ("matchLabels miss", sel(&[("team", "web")], vec![]), Ok(false)),
            ("In hit", sel(&[], vec![expr("tier", "In", &["prod", "qa"])]), Ok(true)),
            ("In miss", sel(&[], vec![expr("tier", "In", &["qa"])]), Ok(false)),
            ("NotIn absent key", sel(&[], vec![expr("zone", "NotIn", &["a"])]), Ok(true)),
            ("NotIn hit", sel(&[], vec![expr("tier", "NotIn", &["prod"])]), Ok(false)),
            ("Exists", sel(&[], vec![expr("team", "Exists", &[])]), Ok(true)),
            ("DoesNotExist", sel(&[], vec![expr("team", "DoesNotExist", &[])]), Ok(false)),
            ("both must hold", sel(&[("team", "db")], vec![expr("tier", "In", &["qa"])]), Ok(false)),
            ("In without values", sel(&[], vec![expr("tier", "In", &[])]), Err(())),
            ("unknown operator", sel(&[], vec![expr("tier", "Gt", &["1"])]), Err(())),
        ];
        for (name, selector, want) in cases {
            let got = selector_matches(&selector, &l).map_err(|_| ());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn unknown_phase_reads_as_unknown_and_counts_as_queued() {
        let status: RebootQueueEntryStatus =
            serde_json::from_value(serde_json::json!({ "phase": "Paused" })).unwrap();
        assert_eq!(status.phase, Some(EntryPhase::Unknown));
        assert_eq!(status.phase(), EntryPhase::Queued);
        let status: RebootQueueEntryStatus =
            serde_json::from_value(serde_json::json!({ "phase": "Rebooting" })).unwrap();
        assert_eq!(status.phase(), EntryPhase::Rebooting);
    }

    #[test]
    fn entry_names_sort_by_index() {
        assert_eq!(RebootQueueEntry::name_for_index(42), "rqe-0000000042");
        assert!(RebootQueueEntry::name_for_index(9) < RebootQueueEntry::name_for_index(10));
    }

    /// (phase, cancelled, transition recorded, in flight)
    #[test]
    fn a_reboot_is_in_flight_while_rebooting_cancelled_or_not() {
        let at = Timestamp::from_second(1_750_000_000).unwrap();
        let cases = [
            (Some(EntryPhase::Rebooting), false, true, Some(at)),
            // Issue 24, case 8: a cancel does not stop a power cycle that began; the entry
            // stays Rebooting until the node booted, and a remediation keeps waiting for it.
            (Some(EntryPhase::Rebooting), true, true, Some(at)),
            (Some(EntryPhase::Rebooting), false, false, None),
            (Some(EntryPhase::Draining), false, true, None),
            (Some(EntryPhase::Queued), false, true, None),
            (None, false, true, None),
        ];
        for (phase, cancel, recorded, expected) in cases {
            let mut entry = RebootQueueEntry::for_node("w1", 1);
            entry.spec.cancel = cancel;
            entry.status = Some(RebootQueueEntryStatus {
                phase,
                last_transition_time: recorded.then_some(at),
                ..Default::default()
            });
            assert_eq!(
                entry.rebooting_since(),
                expected,
                "{phase:?} cancel={cancel}"
            );
        }
        assert_eq!(RebootQueueEntry::for_node("w1", 1).rebooting_since(), None);
    }

    #[test]
    fn the_boot_timeout_defaults_and_is_at_least_a_second() {
        let with = |seconds: Option<u64>| RebootQueueSpec {
            reboot: Some(RebootSpec {
                boot_timeout_seconds: seconds,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            RebootQueueSpec::default().boot_timeout_seconds(),
            DEFAULT_BOOT_TIMEOUT_SECONDS
        );
        assert_eq!(
            with(None).boot_timeout_seconds(),
            DEFAULT_BOOT_TIMEOUT_SECONDS
        );
        assert_eq!(with(Some(0)).boot_timeout_seconds(), 1);
        assert_eq!(with(Some(600)).boot_timeout_seconds(), 600);
    }
}
