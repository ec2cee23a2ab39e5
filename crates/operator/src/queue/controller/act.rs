//! Acting on the plan and on the workers' reports: every per-entry step is decided by
//! `hostcycle_core::queue::entry`; [`Controller::carry_out`] takes a decision's steps in its
//! order (stop the worker, record, act, tell) and adds no rule of its own.

use std::collections::HashMap;

use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::{EntryPhase, RebootQueueEntry};
use hostcycle_core::queue::entry::{
    self, EntryAction, EntryDecision, EntryEvent, EventSubject, QueueCount, WorkerKind, WorkerNews,
    apply_edits,
};
use hostcycle_core::queue::{DequeueReason, Plan, QueueConfig, QueueSnapshot};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::oneshot;

use super::writes::replace_status;
use super::{Controller, MESSAGE_WRITES_IN_FLIGHT};
use crate::events::node_ref;
use crate::metrics::ReasonLabels;
use crate::queue::cordon;
use crate::queue::{Report, ReportKind};
use hostcycle_api::reasons::{EventType, queue_event_reason as reason};

/// What a decision is carried out with.
#[derive(Clone, Copy)]
pub(super) struct Context<'a> {
    pub config: &'a QueueConfig,
    /// The round's snapshot; `None` while reports are handled (before it is taken). The
    /// workers' actions need it.
    pub snapshot: Option<&'a QueueSnapshot>,
    /// The entry's bound host, at hand, for the host actions.
    pub host: Option<&'a BareMetalHost>,
    pub now: Timestamp,
}

impl<'a> Context<'a> {
    pub fn of(snapshot: &'a QueueSnapshot, now: Timestamp) -> Self {
        Context {
            config: &snapshot.config,
            snapshot: Some(snapshot),
            host: None,
            now,
        }
    }
}

/// A jitter fraction in `[0, 1)` for a backoff.
pub(super) fn jitter() -> f64 {
    rand::random::<f64>()
}

impl Controller {
    /// Carries out `decision` for `entry`: stops its worker, records the status change
    /// (resourceVersion precondition), takes the actions, publishes the Events. Returns the
    /// entry as recorded (unchanged when nothing was to be recorded), `None` when the record
    /// failed: then nothing else was done, and the next round decides again.
    pub(super) async fn carry_out(
        &mut self,
        entry: &RebootQueueEntry,
        decision: EntryDecision,
        context: Context<'_>,
    ) -> Option<RebootQueueEntry> {
        if decision.stop_worker {
            self.stop_worker(entry);
        }
        let current = if decision.status.is_empty() {
            entry.clone()
        } else {
            self.write(entry, |s| apply_edits(s, &decision.status))
                .await?
        };
        for action in decision.actions {
            self.take(&current, action, context).await;
        }
        self.tell(&current, &decision.events).await;
        Some(current)
    }

    async fn take(&mut self, entry: &RebootQueueEntry, action: EntryAction, context: Context<'_>) {
        match action {
            EntryAction::SpawnDrain => self.spawn_drain(entry, context.config),
            EntryAction::RequestHostReboot => match context.host {
                Some(host) => self.request_host_reboot(entry, host).await,
                // The bound host is not in the cache yet: the next round asks.
                None => self.retry_soon = true,
            },
            EntryAction::MarkCommandReboot => {
                if let Some(host) = context.host {
                    self.mark_command_reboot(entry, host).await;
                }
            }
            EntryAction::SpawnCommand { run } => match context.snapshot {
                Some(snapshot) => {
                    self.spawn_command(entry, snapshot, run).await;
                }
                None => self.retry_soon = true,
            },
            EntryAction::Complete { detail } => self.complete(entry, context.now, &detail).await,
            EntryAction::StartReboot => {
                Box::pin(self.start_reboot(entry, context.config, context.now)).await
            }
            EntryAction::Count(count) => self.count(count),
            EntryAction::LookAgainSoon => self.retry_soon = true,
        }
    }

    fn count(&self, count: QueueCount) {
        let metrics = &self.shared.metrics.queue;
        match count {
            QueueCount::DrainBackoff { kind } => {
                metrics
                    .drain_backoffs
                    .get_or_create(&ReasonLabels {
                        reason: kind.into(),
                    })
                    .inc();
            }
            QueueCount::BootTimedOut => {
                metrics.boot_timeouts.inc();
            }
            QueueCount::DrainDuration(d) => metrics.drain_duration.observe(d.as_secs_f64()),
        }
    }

    /// Publishes a decision's Events, on the entry or on its node.
    pub(super) async fn tell(&self, entry: &RebootQueueEntry, events: &[EntryEvent]) {
        for e in events {
            match e.on {
                EventSubject::Entry => {
                    self.event_entry(entry, e.event_type, e.reason, &e.message)
                        .await
                }
                EventSubject::Node => {
                    self.shared
                        .publish(
                            &node_ref(&entry.spec.node),
                            e.event_type,
                            e.reason,
                            &e.message,
                        )
                        .await
                }
            }
        }
    }

    /// Sets the entry's message alone (nothing when it already says it).
    pub(super) async fn set_message(&mut self, entry: &RebootQueueEntry, text: &str) {
        let decision = entry::message_only(entry, text);
        if !decision.is_empty() {
            self.write(entry, |s| apply_edits(s, &decision.status))
                .await;
        }
    }

    // ----- the workers' reports ----------------------------------------------------------

    /// A worker's report about its entry (ignored when the entry is gone or re-created).
    pub(super) async fn handle_report(
        &mut self,
        report: Report,
        config: &QueueConfig,
        now: Timestamp,
    ) {
        let (news, ack) = worker_news(report.kind);
        let Some(entry) = self.entry(&report.entry, &report.entry_uid) else {
            if let Some(ack) = ack {
                let _ = ack.send(false);
            }
            return;
        };
        let boot_id = self.boot_id_for(&entry, &news).await;
        let decision =
            entry::after_worker_news(&entry, &news, boot_id.as_deref(), config, now, jitter());
        let records = !decision.status.is_empty();
        let context = Context {
            config,
            snapshot: None,
            host: None,
            now,
        };
        let recorded = self.carry_out(&entry, decision, context).await.is_some();
        // A command attempt runs only once it is recorded (write-ahead).
        if let Some(ack) = ack {
            let _ = ack.send(records && recorded);
        }
    }

    // ----- acting on the plan --------------------------------------------------------------

    /// Carries out the plan, entry by entry.
    pub(super) async fn act(&mut self, snapshot: &QueueSnapshot, plan: &Plan, now: Timestamp) {
        let by_name: HashMap<String, RebootQueueEntry> = self
            .entries()
            .into_iter()
            .map(|e| (e.name_any(), e))
            .collect();
        let context = Context::of(snapshot, now);
        // 1. Entries that leave the queue.
        for dequeue in &plan.dequeue {
            if let Some(entry) = by_name.get(&dequeue.entry.name) {
                self.dequeue(entry, &dequeue.reason, now).await;
            }
        }
        // 2. Drains the plan stops (queue disabled, node being remediated).
        for stopped in &plan.stop_draining {
            if let Some(entry) = by_name.get(&stopped.name) {
                let remediated = snapshot.being_remediated.contains(&entry.spec.node);
                self.carry_out(entry, entry::stop_drain(remediated, now), context)
                    .await;
            }
        }
        // 3. Drains that start.
        for start in &plan.start_draining {
            if let Some(entry) = by_name.get(&start.name) {
                self.carry_out(entry, entry::start_drain(entry, now), context)
                    .await;
            }
        }
        // 4. Cordons no entry needs any more.
        for node in &plan.uncordon {
            self.uncordon(node, "no reboot queue entry is draining or rebooting it")
                .await;
        }
        // 5. Cancelled mid-reboot, then every entry in progress.
        let cancel_notes = self.cancel_rebooting_entries(plan, &by_name, now).await;
        self.follow_in_progress(snapshot, plan, &by_name, &cancel_notes, now)
            .await;
        // 6. Why every other entry waits.
        self.write_waiting(plan, &by_name, now).await;
        // 7. Workers whose entry is gone or no longer in their phase.
        self.stop_stale_workers();
    }

    /// Cancelled mid-reboot: withdrawn (or removed) now, or kept cordoned until booted —
    /// then the note that says so, by entry name.
    async fn cancel_rebooting_entries(
        &mut self,
        plan: &Plan,
        by_name: &HashMap<String, RebootQueueEntry>,
        now: Timestamp,
    ) -> HashMap<String, String> {
        let mut notes = HashMap::new();
        for cancelled in &plan.cancel_rebooting {
            if let Some(entry) = by_name.get(&cancelled.name)
                && let Some(note) = self.cancel_rebooting(entry, now).await
            {
                notes.insert(cancelled.name.clone(), note);
            }
        }
        notes
    }

    async fn follow_in_progress(
        &mut self,
        snapshot: &QueueSnapshot,
        plan: &Plan,
        by_name: &HashMap<String, RebootQueueEntry>,
        cancel_notes: &HashMap<String, String>,
        now: Timestamp,
    ) {
        for (reference, phase) in &plan.in_progress {
            let Some(entry) = by_name.get(&reference.name) else {
                continue;
            };
            let cancelled = plan
                .cancel_rebooting
                .iter()
                .any(|c| c.name == reference.name);
            match phase {
                EntryPhase::Draining => {
                    let decision = entry::follow_drain(entry, &snapshot.config, now, jitter());
                    self.carry_out(entry, decision, Context::of(snapshot, now))
                        .await;
                }
                // A cancelled entry not kept for its cycle was removed above.
                EntryPhase::Rebooting if cancelled => {
                    if let Some(note) = cancel_notes.get(&reference.name) {
                        self.follow_reboot(entry, snapshot, now, Some(note)).await
                    }
                }
                EntryPhase::Rebooting => self.follow_reboot(entry, snapshot, now, None).await,
                _ => {}
            }
        }
    }

    /// Waiting messages: many entries may need one at once (a burst of `rq add`), and none
    /// of them is a step of a reboot, so they are written concurrently. An entry whose node
    /// cannot be rebooted also says so with the `Blocked` condition and a Warning, once per
    /// distinct reason.
    async fn write_waiting(
        &mut self,
        plan: &Plan,
        by_name: &HashMap<String, RebootQueueEntry>,
        now: Timestamp,
    ) {
        let mut messages = Vec::new();
        let mut warnings = Vec::new();
        for waiting in &plan.waiting {
            let Some(entry) = by_name.get(&waiting.entry.name) else {
                continue;
            };
            if let Some(decision) = entry::waiting(entry, &waiting.reason, now) {
                messages.push(self.with_status(entry, |s| apply_edits(s, &decision.status)));
                warnings.push((entry, decision.events));
            }
        }
        for (entry, events) in warnings {
            self.tell(entry, &events).await;
        }
        let api: Api<RebootQueueEntry> = Api::all(self.shared.client.clone());
        let results: Vec<_> = futures::stream::iter(messages.into_iter().map(|next| {
            let api = api.clone();
            async move { (replace_status(&api, &next).await, next) }
        }))
        .buffer_unordered(MESSAGE_WRITES_IN_FLIGHT)
        .collect()
        .await;
        for (result, next) in results {
            self.record_write(&next, result);
        }
    }

    /// Stops workers whose entry is gone or no longer wants them ([`entry::wanted_worker`]).
    fn stop_stale_workers(&mut self) {
        let wanted: HashMap<String, WorkerKind> = self
            .entries()
            .iter()
            .filter_map(|e| Some((e.uid()?, entry::wanted_worker(e)?)))
            .collect();
        let stale: Vec<String> = self
            .workers
            .iter()
            .filter(|(uid, w)| wanted.get(*uid) != Some(&w.kind))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            if let Some(w) = self.workers.remove(&uid) {
                w.cancel.cancel();
            }
        }
    }

    // ----- leaving the queue -----------------------------------------------------------------

    /// Removes an entry the plan dequeues. A missing node is confirmed with the API server
    /// first (the cache may lag a Node created a moment ago); a cancel is recorded first.
    pub(super) async fn dequeue(
        &mut self,
        entry: &RebootQueueEntry,
        why: &DequeueReason,
        now: Timestamp,
    ) {
        self.stop_worker(entry);
        if *why == DequeueReason::NodeNotFound && !self.node_confirmed_gone(entry).await {
            return;
        }
        let mut current = entry.clone();
        if *why == DequeueReason::Cancelled {
            let edits = entry::record_cancelled(entry, now);
            if !edits.is_empty() {
                match self.write(entry, |s| apply_edits(s, &edits)).await {
                    Some(written) => current = written,
                    None => return,
                }
            }
        }
        let leaving = entry::dequeued(entry, why, entry.phase());
        if self.delete(&current).await {
            self.clear_host_marker(&current).await;
            self.tell(&current, std::slice::from_ref(&leaving.event))
                .await;
            self.count_dequeued(leaving.metric_reason);
        }
    }

    /// The entry's Node's boot ID, for the boot canary of a passed boot check: read from the
    /// API server (completing uncordons the node; the cache may lag the new boot). `None`
    /// for other news, or when it cannot be read (the canary then holds the entry back).
    async fn boot_id_for(&mut self, entry: &RebootQueueEntry, news: &WorkerNews) -> Option<String> {
        if !matches!(news, WorkerNews::BootCheck { booted: true, .. }) {
            return None;
        }
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        match nodes.get_opt(&entry.spec.node).await {
            Ok(node) => node
                .and_then(|n| n.status)
                .and_then(|s| s.node_info)
                .map(|i| i.boot_id)
                .filter(|id| !id.is_empty()),
            Err(e) => {
                tracing::warn!(node = %entry.spec.node, error = %e, "cannot read the node's boot ID");
                self.retry_soon = true;
                None
            }
        }
    }

    /// True when the API server says the entry's Node does not exist.
    async fn node_confirmed_gone(&mut self, entry: &RebootQueueEntry) -> bool {
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        match nodes.get_opt(&entry.spec.node).await {
            Ok(None) => true,
            Ok(Some(_)) => false,
            Err(e) => {
                tracing::warn!(node = %entry.spec.node, error = %e, "cannot confirm the node is gone");
                self.retry_soon = true;
                false
            }
        }
    }

    fn count_dequeued(&self, metric_reason: &'static str) {
        self.shared
            .metrics
            .queue
            .dequeued
            .get_or_create(&ReasonLabels {
                reason: metric_reason.into(),
            })
            .inc();
    }

    /// The node booted: uncordon (if the queue cordoned it), remove the entry.
    pub(super) async fn complete(
        &mut self,
        entry: &RebootQueueEntry,
        now: Timestamp,
        detail: &str,
    ) {
        self.stop_worker(entry);
        // Uncordon first: if the removal is lost to a crash, the next round repeats both.
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        let uncordoned = match cordon::uncordon(&nodes, &entry.spec.node).await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(node = %entry.spec.node, error = %e, "cannot uncordon; retrying");
                self.retry_soon = true;
                return;
            }
        };
        if !self.delete(entry).await {
            return;
        }
        self.clear_host_marker(entry).await;
        if let Some(since) = entry.status.as_ref().and_then(|s| s.last_transition_time) {
            self.shared
                .metrics
                .queue
                .reboot_duration
                .observe(hostcycle_core::time::elapsed(since, now).as_secs_f64());
        }
        let (events, metric_reason) = entry::completed(entry, detail, uncordoned);
        self.count_dequeued(metric_reason);
        self.tell(entry, &events).await;
    }

    pub(super) async fn uncordon(&mut self, node: &str, why: &str) {
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        match cordon::uncordon(&nodes, node).await {
            Ok(true) => {
                self.shared
                    .publish(
                        &node_ref(node),
                        EventType::Normal,
                        reason::UNCORDONED,
                        &format!("uncordoned node {node}: {why}"),
                    )
                    .await
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot uncordon; retrying");
                self.retry_soon = true;
            }
        }
    }
}

/// A report's news, and the answer a command attempt waits for.
fn worker_news(kind: ReportKind) -> (WorkerNews, Option<oneshot::Sender<bool>>) {
    match kind {
        ReportKind::DrainProgress { message } => (WorkerNews::DrainProgress(message), None),
        ReportKind::DrainCompleted => (WorkerNews::DrainCompleted, None),
        ReportKind::DrainFailed { reason } => (WorkerNews::DrainFailed(reason), None),
        ReportKind::RecordCommandAttempt {
            attempt,
            previous_error,
            ack,
        } => (
            WorkerNews::CommandAttempt {
                attempt,
                previous_error,
            },
            Some(ack),
        ),
        ReportKind::RebootCommandSucceeded => (WorkerNews::CommandSucceeded, None),
        ReportKind::RebootCommandGaveUp { message } => (WorkerNews::CommandGaveUp(message), None),
        ReportKind::BootCheck { booted, detail } => {
            (WorkerNews::BootCheck { booted, detail }, None)
        }
    }
}
