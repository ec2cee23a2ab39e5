//! The drain worker: one task per draining node. It never writes the entry; it reports to
//! the controller loop, which records every transition.
//!
//! 0. Cordon the node, recording on it that the queue did (unless it already was cordoned).
//! 1. List the node's pods and sort them with `hostcycle_core::queue::drain::drain_work`.
//!    Protected running Job pods → fail (back off) before anything is touched.
//! 2. Eviction dry-run of every pod to evict, so a node that cannot be drained loses no pods.
//! 3. Delete unprotected running Job pods; evict the rest concurrently (a PodDisruptionBudget
//!    refusal in an unprotected namespace deletes the pod; in a protected one it is retried
//!    `evictRetries` times, then the drain fails).
//! 4. Watch the node's pods until no counted pod is left and the Node reports no
//!    `volumesInUse`; pods that show up meanwhile are evicted too. The controller enforces
//!    `evictionTimeoutSeconds` from the recorded `Draining` time.

use crate::cluster::errors::{is_conflict, is_not_found};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use hostcycle_api::reasons::queue_event_reason as reason;
use hostcycle_core::queue::QueueConfig;
use hostcycle_core::queue::drain::{
    DrainWork, EvictionStep, PodView, after_dry_run, after_eviction, drain_work, job_pod_blockers,
    namespace_protected,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::cordon::{Cordon, cordon};
use super::{Report, ReportKind, Shared};
use crate::events::node_ref;
use crate::metrics::EvictionLabels;
use hostcycle_api::reasons::EventType;

/// Evictions (and dry runs) in flight at once for one node.
const EVICTION_CONCURRENCY: usize = 32;
/// At most one "waiting for N pods" progress report this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How often "volumes still in use" is looked at again (the Node store has no per-node wake).
const VOLUME_POLL: Duration = Duration::from_secs(1);

/// One drain to run.
pub struct DrainJob {
    pub entry: String,
    pub entry_uid: String,
    pub node: String,
    pub config: QueueConfig,
}

/// Runs a drain until it completes, fails, or `cancel` fires; reports the outcome.
pub async fn run(
    shared: Arc<Shared>,
    nodes: Store<Node>,
    job: DrainJob,
    reports: mpsc::UnboundedSender<Report>,
    cancel: CancellationToken,
) {
    let started = Instant::now();
    let report = |kind| Report {
        entry: job.entry.clone(),
        entry_uid: job.entry_uid.clone(),
        kind,
    };
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return,
        outcome = drain(&shared, &nodes, &job, &reports) => outcome,
    };
    let kind = match outcome {
        Ok(()) => {
            tracing::info!(node = %job.node, entry = %job.entry, elapsed = ?started.elapsed(), "drain complete");
            ReportKind::DrainCompleted
        }
        Err(reason) => {
            tracing::warn!(node = %job.node, entry = %job.entry, %reason, "drain failed");
            ReportKind::DrainFailed { reason }
        }
    };
    let _ = reports.send(report(kind));
}

async fn drain(
    shared: &Shared,
    nodes: &Store<Node>,
    job: &DrainJob,
    reports: &mpsc::UnboundedSender<Report>,
) -> Result<(), String> {
    let progress = Progress { reports, job };
    // 1. Cordon, recording that the queue did it (an administrator's cordon is kept).
    cordon_node(shared, job, &progress).await?;
    // 2. What the node runs: protected running Job pods fail the drain before anything is
    //    touched.
    let pods_api: Api<Pod> = Api::all(shared.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", job.node));
    let work = list_work(&pods_api, &on_node, job).await?;
    job_pod_blockers(&work).map_err(|f| f.0)?;
    let protected = ProtectedNamespaces::load(shared, &job.config).await?;
    // 3. Dry run: nothing is evicted unless everything can be.
    dry_run(shared, &work, &protected, &progress).await?;
    // 4. Evict and delete, then follow the node until it is empty.
    let pods = NodePods {
        api: pods_api,
        on_node,
    };
    empty_node(shared, nodes, job, &pods, work, &protected, &progress).await
}

/// The drain's progress reports to the loop.
struct Progress<'a> {
    reports: &'a mpsc::UnboundedSender<Report>,
    job: &'a DrainJob,
}

impl Progress<'_> {
    fn say(&self, message: String) {
        let _ = self.reports.send(Report {
            entry: self.job.entry.clone(),
            entry_uid: self.job.entry_uid.clone(),
            kind: ReportKind::DrainProgress { message },
        });
    }
}

/// The pods API and the selector of the node's pods.
struct NodePods {
    api: Api<Pod>,
    on_node: ListParams,
}

async fn cordon_node(
    shared: &Shared,
    job: &DrainJob,
    progress: &Progress<'_>,
) -> Result<(), String> {
    let nodes_api: Api<Node> = Api::all(shared.client.clone());
    match cordon(&nodes_api, &job.node, &job.entry)
        .await
        .map_err(|e| format!("cordoning node {}: {e}", job.node))?
    {
        Cordon::Cordoned => progress.say("cordoned; listing pods".into()),
        Cordon::AlreadyOurs => progress.say("cordoned (resumed); listing pods".into()),
        Cordon::ByAdministrator => progress.say(
            "the node was already cordoned by someone else; it stays cordoned after the reboot"
                .into(),
        ),
    }
    Ok(())
}

/// An eviction dry run of every pod to evict: a node that cannot be drained loses no pods.
async fn dry_run(
    shared: &Shared,
    work: &DrainWork,
    protected: &ProtectedNamespaces,
    progress: &Progress<'_>,
) -> Result<(), String> {
    if work.evict.is_empty() {
        return Ok(());
    }
    progress.say(format!(
        "eviction dry-run of {} pod{}",
        work.evict.len(),
        plural(work.evict.len())
    ));
    let dry_runs: Vec<_> = work
        .evict
        .iter()
        .cloned()
        .map(|pod| {
            let evictor = shared.evictor.clone();
            let protected = protected.is_protected(&pod.namespace);
            async move {
                let answer = evictor.evict(&pod.namespace, &pod.name, true).await;
                after_dry_run(&pod, &answer, protected)
            }
        })
        .collect();
    futures::stream::iter(dry_runs)
        .buffer_unordered(EVICTION_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Evicts and deletes the node's pods, pods that show up meanwhile too, until no counted
/// pod is left and the Node reports no `volumesInUse`.
async fn empty_node(
    shared: &Shared,
    nodes: &Store<Node>,
    job: &DrainJob,
    pods: &NodePods,
    work: DrainWork,
    protected: &ProtectedNamespaces,
    progress: &Progress<'_>,
) -> Result<(), String> {
    let mut watch = PodWatch::start(&pods.api, &job.node);
    let mut last_count_report: Option<Instant> = None;
    let mut handled: HashSet<String> = HashSet::new();
    let mut current = work;
    loop {
        evict_new_pods(shared, job, &current, protected, &mut handled, progress).await?;
        let pods_left = current.remaining.len();
        if pods_left > 0 {
            // Every pod that goes would be a status write; one a second is plenty to read.
            if last_count_report.is_none_or(|t: Instant| t.elapsed() >= PROGRESS_EVERY) {
                progress.say(waiting_message(&current.remaining));
                last_count_report = Some(Instant::now());
            }
            current = wait_for_pod_change(
                &mut watch,
                job,
                &pods.api,
                &pods.on_node,
                &current,
                &handled,
            )
            .await?;
            job_pod_blockers(&current).map_err(|f| f.0)?;
            continue;
        }
        let volumes = nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&job.node))
            .and_then(|n| n.status.as_ref()?.volumes_in_use.as_ref().map(Vec::len))
            .unwrap_or(0);
        if volumes == 0 {
            return Ok(());
        }
        progress.say(format!(
            "all pods are gone; waiting for {volumes} volume{} to detach",
            plural(volumes)
        ));
        tokio::time::sleep(VOLUME_POLL).await;
        current = list_work(&pods.api, &pods.on_node, job).await?;
    }
}

/// Deletes the unprotected running Job pods and evicts the other pods of `current` not
/// `handled` yet (concurrently), then counts them as handled.
async fn evict_new_pods(
    shared: &Shared,
    job: &DrainJob,
    current: &DrainWork,
    protected: &ProtectedNamespaces,
    handled: &mut HashSet<String>,
    progress: &Progress<'_>,
) -> Result<(), String> {
    let fresh = |pods: &[PodView]| -> Vec<PodView> {
        pods.iter()
            .filter(|p| !handled.contains(&p.uid))
            .cloned()
            .collect()
    };
    let fresh_evict = fresh(&current.evict);
    let fresh_delete = fresh(&current.delete);
    if fresh_evict.is_empty() && fresh_delete.is_empty() {
        return Ok(());
    }
    progress.say(format!(
        "evicting {} pod{}{}",
        fresh_evict.len(),
        plural(fresh_evict.len()),
        if fresh_delete.is_empty() {
            String::new()
        } else {
            format!(
                ", deleting {} unprotected Job pod{}",
                fresh_delete.len(),
                plural(fresh_delete.len())
            )
        }
    ));
    for pod in &fresh_delete {
        delete_pod(
            shared,
            job,
            pod,
            "it is a running Job pod outside protectedJobPods",
        )
        .await?;
        handled.insert(pod.uid.clone());
    }
    let evictions: Vec<_> = fresh_evict
        .iter()
        .map(|pod| {
            let protected = protected.is_protected(&pod.namespace);
            evict_one(shared, job, pod, protected)
        })
        .collect();
    futures::stream::iter(evictions)
        .buffer_unordered(EVICTION_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    handled.extend(fresh_evict.iter().map(|p| p.uid.clone()));
    Ok(())
}

async fn list_work(
    pods_api: &Api<Pod>,
    on_node: &ListParams,
    job: &DrainJob,
) -> Result<DrainWork, String> {
    let pods: Vec<PodView> = pods_api
        .list(on_node)
        .await
        .map_err(|e| format!("listing the pods on node {}: {e}", job.node))?
        .items
        .iter()
        .map(PodView::from_pod)
        .collect();
    Ok(drain_work(&pods, job.config.protected_job_pods.as_ref()))
}

/// The node's pods, kept current by a watch: every change wakes the drain at once, and
/// the drain reads the cache instead of listing the node's pods again and again.
struct PodWatch {
    store: reflector::Store<Pod>,
    events: futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>,
    synced: bool,
}

impl PodWatch {
    fn start(pods_api: &Api<Pod>, node: &str) -> PodWatch {
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let events = reflector(
            writer,
            crate::cluster::watch::lean_watcher(pods_api.clone(), config),
        )
        .backoff(crate::backoff::WatchBackoff::default())
        .boxed();
        PodWatch {
            store,
            events,
            synced: false,
        }
    }

    fn work(&self, job: &DrainJob) -> DrainWork {
        let pods: Vec<PodView> = self
            .store
            .state()
            .iter()
            .map(|p| PodView::from_pod(p))
            .collect();
        drain_work(&pods, job.config.protected_job_pods.as_ref())
    }
}

/// Pods still counted, and whether each is already terminating.
fn fingerprint(work: &DrainWork) -> Vec<(String, bool)> {
    work.remaining
        .iter()
        .map(|p| (p.uid.clone(), p.terminating))
        .collect()
}

/// Whether `work` holds a pod the drain has not evicted or deleted yet.
fn has_new_pods(work: &DrainWork, handled: &HashSet<String>) -> bool {
    work.evict
        .iter()
        .chain(work.delete.iter())
        .any(|p| !handled.contains(&p.uid))
}

/// Waits until the counted pods differ from `current`, or a pod that was not handled yet
/// needs evicting, and returns the new work.
async fn wait_for_pod_change(
    watch: &mut PodWatch,
    job: &DrainJob,
    pods_api: &Api<Pod>,
    on_node: &ListParams,
    current: &DrainWork,
    handled: &HashSet<String>,
) -> Result<DrainWork, String> {
    let before = fingerprint(current);
    // A re-list now and then, in case the watch is stuck reconnecting.
    let resync = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(resync);
    loop {
        tokio::select! {
            _ = &mut resync => return list_work(pods_api, on_node, job).await,
            event = watch.events.next() => match event {
                Some(Ok(watcher::Event::InitDone)) => watch.synced = true,
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) if watch.synced => {}
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::debug!(node = %job.node, error = %e, "pod watch error; retrying");
                    continue;
                }
                None => return list_work(pods_api, on_node, job).await,
            }
        }
        let work = watch.work(job);
        if fingerprint(&work) != before || has_new_pods(&work, handled) {
            return Ok(work);
        }
    }
}

fn waiting_message(remaining: &[PodView]) -> String {
    const SHOWN: usize = 3;
    let names: Vec<String> = remaining.iter().take(SHOWN).map(PodView::key).collect();
    let more = remaining.len().saturating_sub(SHOWN);
    format!(
        "waiting for {} pod{} to terminate ({}{})",
        remaining.len(),
        plural(remaining.len()),
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Evicts one pod, following CKE's rules for refusals (`after_eviction`).
async fn evict_one(
    shared: &Shared,
    job: &DrainJob,
    pod: &PodView,
    namespace_protected: bool,
) -> Result<(), String> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let answer = shared.evictor.evict(&pod.namespace, &pod.name, false).await;
        shared
            .metrics
            .queue
            .evictions
            .get_or_create(&EvictionLabels {
                result: answer.result_label().into(),
            })
            .inc();
        match after_eviction(pod, &answer, namespace_protected, attempt, &job.config) {
            EvictionStep::Done => return Ok(()),
            EvictionStep::Delete => {
                return delete_pod(
                    shared,
                    job,
                    pod,
                    "a PodDisruptionBudget refused its eviction and its namespace is not protected",
                )
                .await;
            }
            EvictionStep::RetryAfter(delay) => {
                tracing::info!(node = %job.node, pod = %pod.key(), attempt, "eviction refused by a PodDisruptionBudget; retrying");
                tokio::time::sleep(delay).await;
            }
            EvictionStep::Fail(reason) => return Err(reason),
        }
    }
}

/// Deletes a pod (UID precondition: never a replacement with the same name), with a Warning
/// Event on the Node.
async fn delete_pod(
    shared: &Shared,
    job: &DrainJob,
    pod: &PodView,
    why: &str,
) -> Result<(), String> {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(()),
        Err(e) => return Err(format!("deleting pod {}: {e}", pod.key())),
    }
    shared
        .metrics
        .queue
        .evictions
        .get_or_create(&EvictionLabels {
            result: "deleted".into(),
        })
        .inc();
    shared
        .publish(
            &node_ref(&job.node),
            EventType::Warning,
            reason::POD_DELETED,
            &format!(
                "deleted pod {} while draining for a reboot: {why}",
                pod.key()
            ),
        )
        .await;
    Ok(())
}

/// Which namespaces are protected, read once per drain.
struct ProtectedNamespaces {
    selector: Option<LabelSelector>,
    /// Labels of every namespace; only read when a selector is set.
    labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl ProtectedNamespaces {
    async fn load(shared: &Shared, config: &QueueConfig) -> Result<Self, String> {
        let Some(selector) = config.protected_namespaces.clone() else {
            return Ok(ProtectedNamespaces {
                selector: None,
                labels: BTreeMap::new(),
            });
        };
        let namespaces: Api<Namespace> = Api::all(shared.client.clone());
        let list = namespaces
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing namespaces (for protectedNamespaces): {e}"))?;
        let labels = list
            .items
            .iter()
            .map(|ns| {
                (
                    ns.metadata.name.clone().unwrap_or_default(),
                    ns.metadata.labels.clone().unwrap_or_default(),
                )
            })
            .collect();
        Ok(ProtectedNamespaces {
            selector: Some(selector),
            labels,
        })
    }

    /// A namespace created after the list is unknown: protected, the safe reading.
    fn is_protected(&self, namespace: &str) -> bool {
        namespace_protected(self.selector.as_ref(), self.labels.get(namespace))
    }
}
