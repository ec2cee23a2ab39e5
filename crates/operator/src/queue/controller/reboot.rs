//! Starting and following a reboot: the loop reads what the decision needs (a fresh
//! snapshot at the irreversible step, the bound host — from the API server where the cache
//! could lag a first request), then carries out `hostcycle_core::queue::entry`'s decision.

use hostcycle_api::BareMetalHost;
use hostcycle_api::REBOOT_ANNOTATION;
use hostcycle_api::queue::{RebootMethod, RebootProgress, RebootQueueEntry};
use hostcycle_core::queue::entry::{self, RebootStart};
use hostcycle_core::queue::reboot::{
    BmcRebootStep, CancelStep, REQUEST_MARKER_ANNOTATION, RebootCommandStep, bmc_reboot_step,
    cancel_step, reboot_command_step,
};
use hostcycle_core::queue::{DequeueReason, EntryView, QueueConfig, QueueSnapshot, RebootTarget};
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;

use super::Controller;
use super::act::{Context, jitter};
use crate::queue::observe::host_view;

impl Controller {
    /// The drain is complete: decide on a fresh snapshot whether the reboot may start, bind
    /// the host, record `Rebooting` with everything a restart needs (write-ahead), then
    /// request the reboot.
    pub(super) async fn start_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        config: &QueueConfig,
        now: Timestamp,
    ) {
        // Read from the API server: the caches may lag a remediation that just began, or a
        // Node that just went, and the gate must see them before a node is rebooted.
        let Some(snapshot) = self.fresh_snapshot(config).await else {
            return;
        };
        let node = &entry.spec.node;
        let target = snapshot
            .reboot_targets
            .get(node)
            .cloned()
            .unwrap_or(RebootTarget::NoHost);
        // The bound host as the API server has it (a re-created host has another uid).
        let fresh_host = match &target {
            RebootTarget::Host(host) => self.fresh_host(host).await.map(Arc::new),
            _ => None,
        };
        let bound_host = match &target {
            RebootTarget::Host(host) => fresh_host
                .as_ref()
                .map(|h| (host.clone(), h.uid().unwrap_or_default())),
            _ => None,
        };
        let input = RebootStart {
            config,
            being_remediated: snapshot.being_remediated.contains(node),
            target: &target,
            node: snapshot.nodes.get(node),
            nodes: &snapshot.nodes,
            bound_host: bound_host.clone(),
            now,
            jitter: jitter(),
        };
        let decision = entry::start_reboot(entry, &input);
        let context = Context {
            host: fresh_host.as_deref(),
            ..Context::of(&snapshot, now)
        };
        self.carry_out(entry, decision, context).await;
    }

    /// A reboot in progress: the boot timeout is raised once; BMC steps are taken here; a
    /// Command worker runs. `cancel_note`: the entry was cancelled but its cycle has begun;
    /// it is followed until the node booted, and its messages say so.
    pub(super) async fn follow_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        snapshot: &QueueSnapshot,
        now: Timestamp,
        cancel_note: Option<&String>,
    ) {
        let context = Context::of(snapshot, now);
        let Some(progress) = entry.status.as_ref().and_then(|s| s.reboot.clone()) else {
            self.carry_out(entry, entry::rebooting_without_record(entry), context)
                .await;
            return;
        };
        let mut entry = entry.clone();
        if let Some(decision) =
            entry::boot_timeout(&entry, snapshot.config.reboot.boot_timeout, now)
            && let Some(written) = self.carry_out(&entry, decision, context).await
        {
            entry = written;
        }
        let cancel_note = cancel_note.map(String::as_str);
        match progress.method {
            RebootMethod::Command => {
                self.follow_command_reboot(&entry, &progress, snapshot, cancel_note)
                    .await
            }
            RebootMethod::Bmc => {
                self.follow_bmc_reboot(&entry, &progress, snapshot, now, cancel_note)
                    .await
            }
        }
    }

    /// The command worker runs the reboot command once (never again after a restart) and
    /// then the boot checks.
    async fn follow_command_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        progress: &RebootProgress,
        snapshot: &QueueSnapshot,
        cancel_note: Option<&str>,
    ) {
        let run = match reboot_command_step(progress) {
            RebootCommandStep::Run { attempt } if cancel_note.is_none() => Some(attempt),
            _ => None,
        };
        let refused = self.spawn_command(entry, snapshot, run).await;
        // The refusal stays the message (it is what blocks the entry); alternating messages
        // would repeat its Warning every round.
        if let Some(note) = cancel_note.filter(|_| !refused) {
            self.set_message(entry, note).await;
        }
    }

    async fn follow_bmc_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        progress: &RebootProgress,
        snapshot: &QueueSnapshot,
        now: Timestamp,
        cancel_note: Option<&str>,
    ) {
        let Some(node) = snapshot.nodes.get(&entry.spec.node) else {
            return;
        };
        let uid = entry.uid().unwrap_or_default();
        let since = EntryView::from_entry(entry).last_transition.unwrap_or(now);
        let step_with = |host: Option<&BareMetalHost>| {
            bmc_reboot_step(
                &uid,
                since,
                progress,
                host.map(host_view).as_ref(),
                node,
                now,
            )
        };
        let mut host: Option<BareMetalHost> = progress
            .host
            .as_ref()
            .and_then(|h| self.cached_host(h))
            .map(|h| (*h).clone());
        let mut step = step_with(host.as_ref());
        if step == (BmcRebootStep::Request { record: false }) {
            // The marker seems missing: asking again would be a second reboot if the cache
            // lags the first request. Read the host from the API server.
            host = match &progress.host {
                Some(h) => self.fresh_host(h).await,
                None => None,
            };
            step = step_with(host.as_ref());
        }
        let decision = entry::follow_bmc_reboot(entry, &step, cancel_note, now);
        let context = Context {
            host: host.as_ref(),
            ..Context::of(snapshot, now)
        };
        self.carry_out(entry, decision, context).await;
    }

    /// A `Rebooting` entry was cancelled ([`cancel_step`]): withdraws a request whose cycle has
    /// not begun and removes the entry, removes an entry that reached no host, or keeps the
    /// entry (its node cordoned) until the node booted — then returns the note that says so.
    pub(super) async fn cancel_rebooting(
        &mut self,
        entry: &RebootQueueEntry,
        now: Timestamp,
    ) -> Option<String> {
        let view = EntryView::from_entry(entry);
        let progress = view.reboot.clone()?;
        let uid = entry.uid().unwrap_or_default();
        let cached = progress.host.as_ref().and_then(|h| self.cached_host(h));
        let step = cancel_step(
            &uid,
            &progress,
            cached.as_deref().map(host_view).as_ref(),
            view.boot_timed_out,
        );
        match step {
            CancelStep::WaitForCycle(note) => Some(note),
            CancelStep::Remove => {
                self.dequeue(entry, &DequeueReason::Cancelled, now).await;
                None
            }
            CancelStep::Withdraw => {
                self.withdraw_reboot(entry, &progress, now).await;
                None
            }
        }
    }

    /// Withdraws a reboot request whose cycle has not begun. Decided on the cache: the host
    /// is read again, and the request withdrawn only from the very version read (its
    /// resourceVersion): a power-off the host controller records meanwhile makes the
    /// withdrawal fail, and the cycle then runs to its end.
    async fn withdraw_reboot(
        &mut self,
        entry: &RebootQueueEntry,
        progress: &RebootProgress,
        now: Timestamp,
    ) {
        let uid = entry.uid().unwrap_or_default();
        let Some(host_ref) = progress.host.clone() else {
            return;
        };
        let Some(fresh) = self.fresh_host(&host_ref).await else {
            return;
        };
        if cancel_step(&uid, progress, Some(&host_view(&fresh)), false) != CancelStep::Withdraw {
            self.retry_soon = true;
            return;
        }
        let patch = json!({ "metadata": {
            "resourceVersion": fresh.resource_version(),
            "annotations": {
                REBOOT_ANNOTATION: null,
                REQUEST_MARKER_ANNOTATION: null,
            },
        }});
        match self.patch_host(&host_ref, &patch).await {
            Ok(_) => {
                let withdrawn = entry::withdrawn(entry, &host_ref);
                self.tell(entry, std::slice::from_ref(&withdrawn)).await;
                self.dequeue(entry, &DequeueReason::Cancelled, now).await;
            }
            Err(e) => {
                tracing::debug!(host = %host_ref, error = %e, "reboot request not withdrawn (the host changed meanwhile); deciding again");
                self.retry_soon = true;
            }
        }
    }
}
