//! The `RebootQueue`'s status and the queue's gauges, from the entries and the plan.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use hostcycle_api::queue::{EntryPhase, REBOOT_QUEUE_NAME, RebootQueue, RebootQueueStatus};
use hostcycle_core::queue::{EntryView, Plan, QueueSnapshot};
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::Controller;
use crate::cluster::errors::is_not_found;
use crate::metrics::{NodePhaseLabels, PhaseLabels};

impl Controller {
    pub(super) async fn publish_queue_status(
        &mut self,
        snapshot: &QueueSnapshot,
        plan: &Plan,
        now: Timestamp,
    ) {
        let entries = self.entries();
        let mut status = RebootQueueStatus {
            enabled: snapshot.config.enabled,
            running: snapshot.config.enabled && !entries.is_empty(),
            ..Default::default()
        };
        let mut phases: BTreeMap<&'static str, i64> =
            EntryPhase::ALL.iter().map(|p| (p.as_str(), 0)).collect();
        let mut overdue = 0;
        let mut node_phases: HashSet<NodePhaseLabels> = HashSet::new();
        for e in &entries {
            let view = EntryView::from_entry(e);
            *phases.entry(view.phase.as_str()).or_default() += 1;
            match view.phase {
                EntryPhase::Queued => {
                    status.queued += 1;
                    if view.backed_off(now) {
                        status.backed_off += 1;
                    }
                }
                EntryPhase::Draining => status.draining += 1,
                EntryPhase::Rebooting => status.rebooting += 1,
                EntryPhase::Cancelled => status.cancelled += 1,
                EntryPhase::Unknown => {}
            }
            if view.boot_timed_out {
                overdue += 1;
            }
            node_phases.insert(NodePhaseLabels {
                node: view.node.clone(),
                phase: view.phase.as_str().into(),
            });
        }
        status.message = queue_message(snapshot, plan, &status);
        // `reboot-queue add` hands out indices above this, so they keep increasing once
        // entries leave the queue (it writes nothing on the RebootQueue itself).
        let recorded = self
            .stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .and_then(|q| q.status.as_ref()?.highest_index);
        // What this loop last wrote too: the cache may not have caught up with it yet.
        let written = self
            .last_queue_status
            .as_ref()
            .and_then(|s| s.highest_index);
        status.highest_index = entries
            .iter()
            .map(|e| e.spec.index)
            .chain(recorded)
            .chain(written)
            .max();
        let metrics = &self.shared.metrics.queue;
        metrics.enabled.set(i64::from(snapshot.config.enabled));
        for (phase, count) in phases {
            metrics
                .entries
                .get_or_create(&PhaseLabels {
                    phase: phase.into(),
                })
                .set(count);
        }
        metrics.boot_overdue.set(overdue);
        metrics.backed_off.set(i64::from(status.backed_off));
        for gone in self.node_phase_series.difference(&node_phases) {
            metrics.node_phase.remove(gone);
        }
        for labels in &node_phases {
            metrics.node_phase.get_or_create(labels).set(1);
        }
        self.node_phase_series = node_phases;

        if self.last_queue_status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<RebootQueue> = Api::all(self.shared.client.clone());
        let mut body = status.clone();
        body.last_updated = Some(now);
        body.observed_generation = self
            .stores
            .queues
            .get(&ObjectRef::new(REBOOT_QUEUE_NAME))
            .and_then(|q| q.metadata.generation);
        let patch = json!({ "status": body });
        match api
            .patch_status(
                REBOOT_QUEUE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => self.last_queue_status = Some(status),
            Err(e) if is_not_found(&e) => {
                self.ensure_queue_object().await;
                self.retry_soon = true;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot write the RebootQueue status; retrying");
                self.retry_soon = true;
            }
        }
    }

    pub(super) fn forget_node_phase(&mut self, node: &str) {
        let gone: Vec<NodePhaseLabels> = self
            .node_phase_series
            .iter()
            .filter(|l| l.node == node)
            .cloned()
            .collect();
        for labels in gone {
            self.shared.metrics.queue.node_phase.remove(&labels);
            self.node_phase_series.remove(&labels);
        }
    }
}

fn queue_message(snapshot: &QueueSnapshot, plan: &Plan, status: &RebootQueueStatus) -> String {
    if !snapshot.config.enabled {
        return format!(
            "disabled: no new drains ({} rebooting, {} queued)",
            status.rebooting, status.queued
        );
    }
    if snapshot.entries.is_empty() {
        return "idle: the queue is empty".into();
    }
    let waiting_reasons: BTreeSet<String> =
        plan.waiting.iter().map(|w| w.reason.to_string()).collect();
    let mut text = format!(
        "{} draining, {} rebooting, {} queued ({} backed off)",
        status.draining, status.rebooting, status.queued, status.backed_off
    );
    if status.draining + status.rebooting == 0
        && let Some(first) = waiting_reasons.iter().next()
    {
        text.push_str(&format!("; waiting: {first}"));
    }
    text
}
