//! Drain rules: which pods a drain evicts, deletes, skips or stops at; what to do with an
//! eviction's answer; when a drain is done or timed out; how long a failed drain backs off.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hostcycle_api::queue::selector_matches;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::config::{BackoffConfig, QueueConfig};
use crate::time::{add, elapsed};

/// Annotation the kubelet puts on mirror pods (static pods as seen by the API server).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod on a node being drained, reduced to what the rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `status.phase`: Pending, Running, Succeeded, Failed, Unknown (empty when absent).
    pub phase: String,
    /// Kind of the controlling owner (`DaemonSet`, `Job`, `ReplicaSet`, ...).
    pub controller_kind: Option<String>,
    pub mirror: bool,
    /// `deletionTimestamp` is set: the pod is already going away.
    pub terminating: bool,
    pub labels: BTreeMap<String, String>,
}

impl PodView {
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        PodView {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            controller_kind: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.kind.clone()),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION)),
            terminating: meta.deletion_timestamp.is_some(),
            labels: meta.labels.clone().unwrap_or_default(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why a pod does not stop a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    DaemonSet,
    Mirror,
    /// A Job pod that is Pending, Succeeded or Failed (CKE leaves those alone).
    JobNotRunning,
}

/// What a drain does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodDisposition {
    /// Left alone and not waited for.
    Skip(SkipReason),
    /// Evicted (PodDisruptionBudgets respected); waited for until gone.
    Evict,
    /// A running Job pod outside `protectedJobPods`: deleted; waited for until gone.
    DeleteJobPod,
    /// A running Job pod inside `protectedJobPods`: the drain backs off.
    ProtectedJobPod,
}

/// Classifies one pod for a drain.
pub fn classify_pod(pod: &PodView, protected_job_pods: Option<&LabelSelector>) -> PodDisposition {
    if pod.mirror {
        return PodDisposition::Skip(SkipReason::Mirror);
    }
    match pod.controller_kind.as_deref() {
        Some("DaemonSet") => PodDisposition::Skip(SkipReason::DaemonSet),
        Some("Job") => match pod.phase.as_str() {
            "Pending" | "Succeeded" | "Failed" => PodDisposition::Skip(SkipReason::JobNotRunning),
            _ if pod.terminating => PodDisposition::DeleteJobPod,
            _ => {
                let protected = match protected_job_pods {
                    None => true,
                    // An unusable selector protects: never delete on a misread.
                    Some(selector) => selector_matches(selector, &pod.labels).unwrap_or(true),
                };
                if protected {
                    PodDisposition::ProtectedJobPod
                } else {
                    PodDisposition::DeleteJobPod
                }
            }
        },
        _ => PodDisposition::Evict,
    }
}

/// Whether pods in `namespace` are protected: `None` selector protects every namespace.
/// `labels` are the namespace's labels (`None`: namespace unknown, treated as protected).
pub fn namespace_protected(
    selector: Option<&LabelSelector>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match (selector, labels) {
        (None, _) | (_, None) => true,
        (Some(selector), Some(labels)) => selector_matches(selector, labels).unwrap_or(true),
    }
}

/// The pods of one node, sorted for a drain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainWork {
    /// Pods to evict (not yet terminating).
    pub evict: Vec<PodView>,
    /// Unprotected running Job pods to delete (not yet terminating).
    pub delete: Vec<PodView>,
    /// Protected running Job pods: the drain cannot proceed while any exists.
    pub blockers: Vec<PodView>,
    /// Pods the drain waits for: everything not skipped, terminating ones included.
    pub remaining: Vec<PodView>,
}

/// Sorts a node's pods into drain work.
pub fn drain_work(pods: &[PodView], protected_job_pods: Option<&LabelSelector>) -> DrainWork {
    let mut work = DrainWork::default();
    for pod in pods {
        let disposition = classify_pod(pod, protected_job_pods);
        if matches!(disposition, PodDisposition::Skip(_)) {
            continue;
        }
        work.remaining.push(pod.clone());
        match disposition {
            PodDisposition::ProtectedJobPod => work.blockers.push(pod.clone()),
            _ if pod.terminating => {}
            PodDisposition::Evict => work.evict.push(pod.clone()),
            PodDisposition::DeleteJobPod => work.delete.push(pod.clone()),
            PodDisposition::Skip(_) => {}
        }
    }
    work
}

/// What the API server answered to one eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionAnswer {
    /// 201/200: the pod is being deleted.
    Evicted,
    /// 404: already gone.
    NotFound,
    /// 429: a PodDisruptionBudget refused it (message from the server).
    Refused(String),
    /// Anything else.
    Failed(String),
}

impl EvictionAnswer {
    /// Label for metrics.
    pub fn result_label(&self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::NotFound => "not_found",
            Self::Refused(_) => "refused",
            Self::Failed(_) => "error",
        }
    }
}

/// The next step for a pod after an eviction answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionStep {
    /// Nothing more to do for this pod (wait for it to go).
    Done,
    /// Delete the pod: its namespace is not protected.
    Delete,
    /// Try the eviction again after this long.
    RetryAfter(Duration),
    /// The drain fails (and backs off) with this reason.
    Fail(String),
}

/// After the `attempt`-th eviction (1-based) of a pod: CKE's rules. A refusal in an
/// unprotected namespace deletes the pod; in a protected one it is retried `evictRetries`
/// times, `evictInterval` apart, then the drain fails.
pub fn after_eviction(
    pod: &PodView,
    answer: &EvictionAnswer,
    namespace_protected: bool,
    attempt: u32,
    config: &QueueConfig,
) -> EvictionStep {
    match answer {
        EvictionAnswer::Evicted | EvictionAnswer::NotFound => EvictionStep::Done,
        EvictionAnswer::Refused(_) if !namespace_protected => EvictionStep::Delete,
        EvictionAnswer::Refused(_) if attempt <= config.evict_retries => {
            EvictionStep::RetryAfter(config.evict_interval)
        }
        EvictionAnswer::Refused(message) => EvictionStep::Fail(format!(
            "eviction of {} refused by a PodDisruptionBudget in protected namespace {} after {attempt} attempt{}: {}",
            pod.key(),
            pod.namespace,
            if attempt == 1 { "" } else { "s" },
            message
        )),
        EvictionAnswer::Failed(message) => {
            EvictionStep::Fail(format!("eviction of {} failed: {message}", pod.key()))
        }
    }
}

/// The verdict of the eviction dry-run (run before anything is evicted, so a node that
/// cannot be drained loses no pods). `Err` is the reason the drain cannot proceed.
pub fn after_dry_run(
    pod: &PodView,
    answer: &EvictionAnswer,
    namespace_protected: bool,
) -> Result<(), String> {
    match answer {
        EvictionAnswer::Evicted | EvictionAnswer::NotFound => Ok(()),
        // It would be deleted instead.
        EvictionAnswer::Refused(_) if !namespace_protected => Ok(()),
        EvictionAnswer::Refused(message) => Err(format!(
            "a PodDisruptionBudget refuses the eviction of {} in protected namespace {}: {message}",
            pod.key(),
            pod.namespace
        )),
        EvictionAnswer::Failed(message) => Err(format!(
            "the eviction dry-run of {} failed: {message}",
            pod.key()
        )),
    }
}

/// Why a drain cannot go on now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainFailure(pub String);

impl fmt::Display for DrainFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A drain's verdict on protected Job pods: `Err` names them.
pub fn job_pod_blockers(work: &DrainWork) -> Result<(), DrainFailure> {
    if work.blockers.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = work.blockers.iter().map(PodView::key).collect();
    Err(DrainFailure(format!(
        "running Job pod{} protected by protectedJobPods: {}",
        if names.len() == 1 { "" } else { "s" },
        names.join(", ")
    )))
}

/// Where a drain stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainProgress {
    /// No counted pod is left and the node reports no volume in use.
    Complete,
    /// Still waiting for these.
    Waiting { pods: usize, volumes_in_use: usize },
    /// Not complete within `evictionTimeoutSeconds` of the `Draining` transition.
    TimedOut { pods: usize, volumes_in_use: usize },
}

/// Judges a drain from what is left on the node. The timeout counts from the recorded
/// `Draining` transition, so an operator restart never extends it.
pub fn drain_progress(
    remaining_pods: usize,
    volumes_in_use: usize,
    draining_since: Option<Timestamp>,
    now: Timestamp,
    timeout: Duration,
) -> DrainProgress {
    if remaining_pods == 0 && volumes_in_use == 0 {
        return DrainProgress::Complete;
    }
    let timed_out = draining_since.is_some_and(|since| elapsed(since, now) >= timeout);
    if timed_out {
        DrainProgress::TimedOut {
            pods: remaining_pods,
            volumes_in_use,
        }
    } else {
        DrainProgress::Waiting {
            pods: remaining_pods,
            volumes_in_use,
        }
    }
}

/// When a drain that started at `draining_since` times out.
pub fn drain_deadline(draining_since: Timestamp, timeout: Duration) -> Timestamp {
    add(draining_since, timeout)
}

/// Backoff after the `failures`-th failed drain (1-based):
/// `min(2^(failures-1) * base, max) + jitter_fraction * jitter`, never overflowing.
/// `jitter_fraction` is a random number in `[0, 1)` (the caller draws it).
pub fn backoff_delay(failures: u32, config: &BackoffConfig, jitter_fraction: f64) -> Duration {
    let doublings = failures.saturating_sub(1);
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    let exponential = if doublings >= 32 {
        config.max
    } else {
        config.base.saturating_mul(factor).min(config.max)
    };
    let fraction = if jitter_fraction.is_finite() {
        jitter_fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // [0, jitter): never the full jitter. (`mul_f64` would panic when the product rounds
    // past `Duration::MAX`.)
    let jitter = Duration::try_from_secs_f64(config.jitter.as_secs_f64() * fraction)
        .unwrap_or(config.jitter)
        .min(
            config
                .jitter
                .saturating_sub(Duration::from_nanos(1))
                .max(Duration::ZERO),
        );
    exponential.saturating_add(jitter)
}

/// The new backoff count and expiry after a failed drain.
pub fn next_backoff(
    previous_failures: u32,
    config: &BackoffConfig,
    now: Timestamp,
    jitter_fraction: f64,
) -> (u32, Timestamp) {
    let failures = previous_failures.saturating_add(1);
    (
        failures,
        add(now, backoff_delay(failures, config, jitter_fraction)),
    )
}
