//! The per-entry workers: a drain, or the reboot command and its boot checks. They report
//! to the loop and never write the entry; one runs per entry at most.

use hostcycle_api::queue::RebootQueueEntry;
use hostcycle_api::reasons::EventType;
use hostcycle_core::queue::{QueueConfig, QueueSnapshot};
use jiff::Timestamp;
use kube::ResourceExt;
use tracing::Instrument;

use super::{Controller, Worker};
use crate::events::node_ref;
use crate::queue::command::{self, CommandJob};
use crate::queue::drain::{self, DrainJob};
use hostcycle_core::queue::entry::{self, WorkerKind, WorkerRoom};

impl Controller {
    /// Whether a worker of `kind` may start for the entry `uid` ([`entry::worker_room`]);
    /// a finished worker of the other kind is stopped first.
    fn make_room(&mut self, uid: &str, kind: WorkerKind) -> bool {
        match entry::worker_room(self.workers.get(uid).map(|w| w.kind), kind) {
            WorkerRoom::Busy => false,
            WorkerRoom::Free => true,
            WorkerRoom::ReplaceFinished => {
                if let Some(done) = self.workers.remove(uid) {
                    done.cancel.cancel();
                }
                true
            }
        }
    }

    pub(super) fn spawn_drain(&mut self, entry: &RebootQueueEntry, config: &QueueConfig) {
        let Some(uid) = entry.uid() else { return };
        if !self.make_room(&uid, WorkerKind::Drain) {
            return;
        }
        let cancel = self.work.child_token();
        let job = DrainJob {
            entry: entry.name_any(),
            entry_uid: uid.clone(),
            node: entry.spec.node.clone(),
            config: config.clone(),
        };
        // Every line the worker logs names its node and entry.
        let span = tracing::info_span!("drain", node = %job.node, entry = %job.entry);
        let handle = tokio::spawn(
            drain::run(
                self.shared.clone(),
                self.stores.nodes.clone(),
                job,
                self.reports_tx.clone(),
                cancel.clone(),
            )
            .instrument(span),
        );
        self.workers.insert(
            uid,
            Worker {
                kind: WorkerKind::Drain,
                cancel,
                handle,
            },
        );
    }

    pub(super) fn stop_worker(&mut self, entry: &RebootQueueEntry) {
        if let Some(w) = entry.uid().and_then(|uid| self.workers.remove(&uid)) {
            w.cancel.cancel();
        }
    }

    /// Starts the command worker of a rebooting entry, unless its node's address is one the
    /// commands must not get (unsafe, or another Node's too): then nothing runs, the entry's message and a Warning (once per
    /// distinct message) say why, the boot timeout still applies, and `true` is returned.
    pub(super) async fn spawn_command(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        run_attempt: Option<u32>,
    ) -> bool {
        let Some(uid) = entry.uid() else {
            return false;
        };
        if !self.make_room(&uid, WorkerKind::Command) {
            return false;
        }
        let node = &entry.spec.node;
        let Some(address) = snapshot.nodes.get(node).map(|n| n.address.clone()) else {
            return false;
        };
        let rebooting_since = entry
            .status
            .as_ref()
            .and_then(|s| s.last_transition_time)
            .unwrap_or_else(Timestamp::now);
        let job = CommandJob {
            entry: entry.name_any(),
            entry_uid: uid.clone(),
            node: node.clone(),
            address,
            rebooting_since,
            config: snapshot.config.reboot.clone(),
            run_attempt,
        };
        let job = match job.checked(snapshot.nodes.values()) {
            Ok(job) => job,
            Err(refusal) => {
                if entry.status.as_ref().map(|s| s.message.as_str()) != Some(&refusal.message) {
                    tracing::warn!(node = %node, entry = %entry.name_any(), "{}", refusal.message);
                    self.set_message(entry, &refusal.message).await;
                    self.event_entry(entry, EventType::Warning, refusal.reason, &refusal.message)
                        .await;
                    self.shared
                        .publish(
                            &node_ref(node),
                            EventType::Warning,
                            refusal.reason,
                            &refusal.message,
                        )
                        .await;
                }
                return true;
            }
        };
        let cancel = self.work.child_token();
        let span = tracing::info_span!(
            "reboot_command",
            node = %job.job().node,
            entry = %job.job().entry
        );
        let handle = tokio::spawn(
            command::run(job, self.reports_tx.clone(), cancel.clone()).instrument(span),
        );
        self.workers.insert(
            uid,
            Worker {
                kind: WorkerKind::Command,
                cancel,
                handle,
            },
        );
        false
    }
}
