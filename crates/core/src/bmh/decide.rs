//! The decision function. See `docs/reboot-api.md` for the rules in prose and as a table.

use std::time::Duration;

use hostcycle_api::reasons::{condition, condition_reason, event_reason};
use hostcycle_api::{
    BareMetalHostStatus, ErrorType, HardFallback, HardFallbackSource, LastPowerAction,
    OperationalStatus, PowerActionState, PowerActionTrigger, PowerOffMode, PowerTarget,
    ProvisioningInputs, ProvisioningState, REBOOT_ANNOTATION, RebootRequests,
    derive_provisioning_state,
};
use jiff::{SignedDuration, Timestamp};

use super::config::DecideConfig;
use super::decision::{
    Action, AnnotationRemovalReason, ConditionUpdate, Decision, Event, EventType, StatusUpdate,
};
use super::observation;
use super::snapshot::{
    BmcFailure, BmcFailureKind, BmcObservation, HostSnapshot, ObservedPower, PowerCallResult,
};
use super::status::condition_differs;

/// [`decide_with_config`] with the default timings.
pub fn decide(snapshot: &HostSnapshot, now: Timestamp) -> Decision {
    decide_with_config(snapshot, now, &DecideConfig::default())
}

/// The next step for a host, from a snapshot of it and the controller's clock.
///
/// Pure and idempotent: the same snapshot gives the same decision, and a decision never
/// repeats a power request that is still in flight.
pub fn decide_with_config(s: &HostSnapshot, now: Timestamp, cfg: &DecideConfig) -> Decision {
    let mut d = decide_power(s, now, cfg);
    warn_invalid_on_request_change(&mut d, s);
    restart_readings_on_request_change(&mut d, s);
    read_again_to_confirm(&mut d, s, cfg);
    d
}

/// The set of requests holding an off host changed (the `RebootPending` condition is rewritten
/// as `HeldByAnnotations`; its message names the annotations) while the readings' run went on
/// unchanged: readings made before count for none of the new requests — a remediation's
/// power-off added again for a retry to a host that stayed off must see two new readings, not
/// the run confirmed before it. (A run that began in this pass consists of readings made with
/// the requests visible; a new pending reboot and a power request restart the run by
/// themselves.)
fn restart_readings_on_request_change(d: &mut Decision, s: &HostSnapshot) {
    let held_anew = d.status.iter().any(|u| {
        matches!(u, StatusUpdate::SetCondition(c)
            if c.type_ == condition::REBOOT_PENDING
                && c.reason == condition_reason::HELD_BY_ANNOTATIONS)
    });
    let run_went_on = !d
        .status
        .iter()
        .any(|u| matches!(u, StatusUpdate::SetPowerObservation(_)));
    let counted = s
        .status
        .power_observation
        .as_ref()
        .is_some_and(|o| o.readings > 0);
    if held_anew && run_went_on && counted {
        d.status.push(StatusUpdate::RestartPowerObservation);
    }
}

/// A run of readings not yet confirmed by a second one (a power change, a new request) is
/// read again within [`DecideConfig::transition_requeue`], not at the steady interval: fencing
/// waits for that second reading. Only after a reading that worked (a failing BMC keeps its
/// error backoff).
fn read_again_to_confirm(d: &mut Decision, s: &HostSnapshot, cfg: &DecideConfig) {
    if !matches!(s.bmc, BmcObservation::Power(_)) || s.paused || s.detached {
        return;
    }
    let mut after = s.status.clone();
    super::status::apply_status_updates(&mut after, &d.status, Timestamp::UNIX_EPOCH, None);
    // A failed power call keeps its error backoff: nothing can be confirmed before its retry.
    let call_failed = after
        .last_power_action
        .as_ref()
        .is_some_and(|a| a.state == PowerActionState::Failed);
    if !call_failed && observation::unconfirmed(after.power_observation.as_ref()) {
        d.requeue_after = Some(
            d.requeue_after
                .map_or(cfg.transition_requeue, |r| r.min(cfg.transition_requeue)),
        );
    }
}

/// The set of reboot requests changed (the `RebootPending` condition is rewritten — its
/// message names the annotations) while an unusable annotation is present, and this decision
/// has not warned yet: warn now. This covers a malformed annotation added while the host is
/// already held off, without repeating the warning on every poll.
fn warn_invalid_on_request_change(d: &mut Decision, s: &HostSnapshot) {
    if s.paused || s.detached {
        return;
    }
    let warned = d
        .events()
        .any(|e| e.reason == event_reason::INVALID_REBOOT_ANNOTATION);
    let requests_changed = d.status.iter().any(
        |u| matches!(u, StatusUpdate::SetCondition(c) if c.type_ == condition::REBOOT_PENDING),
    );
    if !warned && requests_changed {
        let mut warned = false;
        warn_invalid(d, &s.reboot_requests, &mut warned);
    }
}

/// The power decision as a ladder: each step reads what the earlier ones established from the
/// [`PowerPass`] and adds its updates, actions and Events to the decision.
fn decide_power(s: &HostSnapshot, now: Timestamp, cfg: &DecideConfig) -> Decision {
    // Paused: hands off entirely, status included; the annotation's removal triggers a reconcile.
    if s.paused {
        return Decision::default();
    }
    if s.detached {
        return detached(s, cfg);
    }
    let mut pass = PowerPass::new(s, now, cfg);
    let state = pass.provisioning_state();
    pass.power_off_while_deprovisioning(&state);
    pass.drop_requests_of_departed_consumer(&state);
    pass.refuse_what_would_hold_power_off();
    let Some(power) = pass.power_reading(&state) else {
        return pass.d;
    };
    if pass.refuse_changed_bmc() {
        return pass.d;
    }
    pass.record_reading(power);
    let observed = power.as_bool();

    // 1. An outstanding power action whose target state is now observed has completed.
    pass.complete_observed_action(observed);
    // 2. Notice new reboot requests, and the pending reboot's mode.
    let reboot = pass.notice_reboot_requests();
    let Some(on) = observed else {
        return pass.await_visible_power(power, reboot);
    };
    // 3. The host is off: the suffixless request's power cycle has done its "off".
    pass.finish_suffixless_power_off(reboot.pending, on);
    // 4. Desired power, and the power request (or the wait) that gets there.
    let desired = pass.desired_power(reboot, on);
    let step = pass.drive_power(&desired, on);
    // 5. Errors and the BMC's health.
    pass.settle_errors(&desired, on, step.timed_out);
    pass.finish(Some(on), step.requeue)
}

/// A detached host: no power decision, only the operational status says so.
fn detached(s: &HostSnapshot, cfg: &DecideConfig) -> Decision {
    let mut d = Decision::default();
    set_operational_status(&mut d, &s.status, OperationalStatus::Detached);
    clear_observation(&mut d, &s.status);
    d.requeue_after = Some(cfg.steady_requeue);
    d
}

/// What the steps of one [`decide_power`] pass share: the decision being built, and the facts
/// earlier steps established for later ones.
struct PowerPass<'a> {
    s: &'a HostSnapshot,
    st: &'a BareMetalHostStatus,
    now: Timestamp,
    cfg: &'a DecideConfig,
    d: Decision,
    /// The reboot requests still in force: those this pass removes or refuses are not.
    requests: RebootRequests,
    /// This pass removes reboot annotations, so the next snapshot shows fewer.
    removed_annotations: bool,
    /// `spec.online`, or `spec.disablePowerOff` (the host always runs); false while the
    /// host deprovisions.
    online: bool,
    /// The host is deprovisioning: it is powered off before it is `available`.
    deprovisioning: bool,
    last_powered_on: Option<Timestamp>,
    pending: Option<Timestamp>,
    /// The last power action as this pass leaves it (step 1 completes it).
    last_action: Option<LastPowerAction>,
    /// This pass has warned about unusable reboot annotations.
    warned_invalid: bool,
}

/// The pending reboot as step 2 leaves it.
#[derive(Clone, Copy)]
struct PendingReboot {
    pending: bool,
    /// Hard once any of its requests was hard; the requests' mode when none is pending.
    mode: PowerOffMode,
}

/// The power state step 4 wants, and why.
struct DesiredPower {
    want_on: bool,
    /// A BMC restart (`spec.disablePowerOff`) instead of a power cycle.
    restart: bool,
    /// A reboot is pending or requested: it, not `spec.online`, decides.
    reboot_driven: bool,
    trigger: PowerActionTrigger,
    mode: PowerOffMode,
    target: PowerTarget,
}

/// What step 4 did: when to look again, and whether a power action timed out just now.
struct PowerStep {
    requeue: Duration,
    timed_out: bool,
}

impl<'a> PowerPass<'a> {
    fn new(s: &'a HostSnapshot, now: Timestamp, cfg: &'a DecideConfig) -> Self {
        let st = &s.status;
        PowerPass {
            s,
            st,
            now,
            cfg,
            d: Decision::default(),
            requests: s.reboot_requests.clone(),
            removed_annotations: false,
            online: s.online || s.disable_power_off,
            deprovisioning: false,
            last_powered_on: st.provisioning.last_powered_on,
            pending: st.provisioning.pending_reboot_since,
            last_action: st.last_power_action.clone(),
            warned_invalid: false,
        }
    }

    /// Derives the provisioning state and records it, with the image a provisioned host runs.
    fn provisioning_state(&mut self) -> ProvisioningState {
        let (s, st) = (self.s, self.st);
        let previous_state = st.provisioning.state.as_ref();
        let provisioned_image = st.provisioning.image_url();
        let state = derive_provisioning_state(ProvisioningInputs {
            externally_provisioned: s.externally_provisioned,
            has_consumer: s.has_consumer,
            image_removed: provisioned_image.is_some() && s.image.is_none(),
            bmc_configured: s.bmc_configured,
            registered: st.good_credentials.is_some() || matches!(s.bmc, BmcObservation::Power(_)),
            reboot_annotations_present: !self.requests.is_empty(),
            confirmed_off: s.disable_power_off
                || st.power_observation.as_ref().is_some_and(|o| {
                    o.confirmed() && o.state == hostcycle_api::ObservedPowerState::Off
                }),
            previous: previous_state,
        });
        if previous_state != Some(&state) {
            self.d
                .status
                .push(StatusUpdate::SetProvisioningState(state.clone()));
        }
        // `status.provisioning.image` records the image a provisioned host runs; it stays after
        // the image is removed while the consumer is still set (that removal deprovisioned the
        // host, which must not count as provisioned again until an image is set again).
        if state == ProvisioningState::Provisioned
            && let Some(image) = &s.image
            && st.provisioning.extra.get("image") != Some(image)
        {
            self.d
                .status
                .push(StatusUpdate::SetProvisionedImage(Some(image.clone())));
        } else if !s.has_consumer && st.provisioning.extra.contains_key("image") {
            self.d.status.push(StatusUpdate::SetProvisionedImage(None));
        }
        state
    }

    /// A deprovisioning host is powered off (as metal3 does), whatever `spec.online` says; it
    /// becomes `available` once readings confirm it off. A host that may never be powered off
    /// (`disablePowerOff`) is left running.
    fn power_off_while_deprovisioning(&mut self, state: &ProvisioningState) {
        if *state == ProvisioningState::Deprovisioning && !self.s.disable_power_off {
            self.online = false;
            self.deprovisioning = true;
        }
    }

    /// Reboot requests belong to the consumer that just left: drop them all.
    fn drop_requests_of_departed_consumer(&mut self, state: &ProvisioningState) {
        if *state == ProvisioningState::Deprovisioning && !self.requests.is_empty() {
            remove_annotations(
                &mut self.d,
                self.requests.annotation_keys(),
                AnnotationRemovalReason::HostDeprovisioned,
                "the host left the provisioned state",
            );
            self.requests = RebootRequests::default();
            self.removed_annotations = true;
        }
    }

    /// spec.disablePowerOff: power is never cut, so nothing can hold the host off. Keyed holds
    /// are not reboot requests here (a restart cannot keep the host off until its owner
    /// releases it; restarting once and ignoring the hold would let a fencing client believe
    /// it is held): they and `online: false` are refused, loudly.
    fn refuse_what_would_hold_power_off(&mut self) {
        refuse_power_off(&mut self.d, self.s, &self.requests);
        if self.s.disable_power_off {
            self.requests.keyed.clear();
        }
    }

    /// The BMC's power reading; `None` when there is none to decide on (no BMC configured,
    /// the BMC failed, not queried yet), and the decision is complete.
    fn power_reading(&mut self, state: &ProvisioningState) -> Option<ObservedPower> {
        if !self.s.bmc_configured {
            set_operational_status(&mut self.d, self.st, OperationalStatus::Discovered);
            clear_observation(&mut self.d, self.st);
            self.d.requeue_after = Some(self.cfg.steady_requeue);
            return None;
        }
        match &self.s.bmc {
            BmcObservation::Power(power) => Some(*power),
            BmcObservation::Failed(failure) => {
                record_bmc_failure(&mut self.d, self.st, state, failure, self.cfg, false);
                // A failed read between two readings makes them not consecutive.
                if self
                    .st
                    .power_observation
                    .as_ref()
                    .is_some_and(|o| o.readings > 0)
                {
                    self.d.status.push(StatusUpdate::RestartPowerObservation);
                }
                None
            }
            BmcObservation::NotQueried => {
                self.d.requeue_after = Some(self.cfg.steady_requeue);
                None
            }
        }
    }

    /// `spec.bmc` (address; a Secret no identity vouches for) or the identity its BMC reports
    /// changed since the last readings while reboot annotations are outstanding: those were
    /// asked of the machine behind the old BMC, and carrying them out through the new one would
    /// power off another machine. Nothing is sent or recorded (the readings keep naming the old BMC,
    /// so the refusal lasts) until the annotations are withdrawn; a Warning says so. `true`
    /// when refused (the decision is complete).
    fn refuse_changed_bmc(&mut self) -> bool {
        let Some(last) = self.st.power_observation.as_ref() else {
            return false;
        };
        let changed = !last.bmc.same_machine(&self.s.read_with);
        // The reboot annotations are the requests made of the old BMC's machine; once they
        // are withdrawn, what the host should do is decided afresh from its spec.
        if !changed || self.requests.is_empty() {
            return false;
        }
        let message = format!(
            "spec.bmc or the BMC's identity changed (readings came from {} with Secret {}{}) \
             while reboot annotations ({}) were outstanding: no power action reaches the new \
             BMC until they are withdrawn (remove the annotations, or fix spec.bmc back)",
            crate::text::bounded(&last.bmc.address, 128),
            crate::text::bounded(&last.bmc.credentials_name, 253),
            last.bmc
                .identity
                .as_deref()
                .map(|i| format!(", identity {i}"))
                .unwrap_or_default(),
            self.requests.annotation_keys().join(", ")
        );
        set_operational_status(&mut self.d, self.st, OperationalStatus::Error);
        if self.st.error_message != message {
            self.d.status.push(StatusUpdate::SetError {
                error_type: ErrorType::PowerManagementError,
                message: message.clone(),
                count: self.st.error_count,
            });
        }
        set_condition(
            &mut self.d,
            self.st,
            ConditionUpdate {
                type_: condition::BMC_HEALTHY,
                status: condition::FALSE,
                reason: condition_reason::BMC_CHANGED_UNDER_REQUEST,
                message: message.clone(),
            },
        );
        event(
            &mut self.d,
            EventType::Warning,
            event_reason::BMC_CHANGED_UNDER_REQUEST,
            message,
        );
        self.d.requeue_after = Some(self.cfg.steady_requeue);
        true
    }

    /// The BMC answered: its credentials are good, and the power state it reports is recorded.
    fn record_reading(&mut self, power: ObservedPower) {
        if let Some(credentials) = &self.s.credentials
            && self.st.good_credentials.as_ref() != Some(credentials)
        {
            self.d
                .status
                .push(StatusUpdate::SetGoodCredentials(credentials.clone()));
        }
        if let Some(on) = power.as_bool()
            && self.st.powered_on != Some(on)
        {
            self.d.status.push(StatusUpdate::SetPoweredOn(on));
        }
        if let Some(run) = observation::after_reading(
            self.st.power_observation.as_ref(),
            observation::recorded_state(power),
            &self.s.read_with,
            self.now,
        ) {
            self.d.status.push(StatusUpdate::SetPowerObservation(run));
        }
    }

    /// An outstanding power action whose target state is now observed has completed (also a
    /// timed-out or failed one: the host is where we asked it to be).
    fn complete_observed_action(&mut self, observed: Option<bool>) {
        let (Some(action), Some(on)) = (self.last_action.as_mut(), observed) else {
            return;
        };
        if action.state == PowerActionState::Completed
            || action.action.is_on() != on
            || action.restart
        {
            return;
        }
        self.d
            .status
            .push(StatusUpdate::CompletePowerAction { at: self.now });
        action.state = PowerActionState::Completed;
        action.completed_at = Some(self.now);
        // lastPoweredOn is the *request* time of the confirmed power-on: the host was off
        // when it was sent, so every process running before it has stopped, and a reboot
        // requested while the power-on was under way stays pending (it is later).
        let requested_at = action.requested_at;
        if on && self.last_powered_on.is_none_or(|t| requested_at > t) {
            let was_pending = reboot_is_pending(self.pending, self.last_powered_on);
            self.d
                .status
                .push(StatusUpdate::SetLastPoweredOn(requested_at));
            self.last_powered_on = Some(requested_at);
            if was_pending && !reboot_is_pending(self.pending, self.last_powered_on) {
                event(
                    &mut self.d,
                    EventType::Normal,
                    event_reason::REBOOT_COMPLETED,
                    // No times in the note (they are in status): repeats fold into a series.
                    "host powered back on after the pending reboot".to_string(),
                );
            }
        }
    }

    /// Notices new reboot requests. Unlike the seed (host on only) this also applies to a host
    /// that is off or transitioning: the request is recorded either way, so the suffixless
    /// form can complete and `lastPoweredOn > pendingRebootSince` means "the reboot asked for
    /// is done" whatever the power state was.
    fn notice_reboot_requests(&mut self) -> PendingReboot {
        let mut pending = reboot_is_pending(self.pending, self.last_powered_on);
        let recorded_now = !self.requests.is_empty() && !pending;
        if recorded_now {
            let since = strictly_after(self.now, self.last_powered_on);
            self.d
                .status
                .push(StatusUpdate::SetPendingRebootSince(since));
            self.pending = Some(since);
            pending = true;
            event(
                &mut self.d,
                EventType::Normal,
                event_reason::REBOOT_REQUESTED,
                format!(
                    "reboot requested by {} ({} mode)",
                    self.requests.annotation_keys().join(", "),
                    self.requests.effective_mode().as_str()
                ),
            );
            warn_invalid(&mut self.d, &self.requests, &mut self.warned_invalid);
        }
        PendingReboot {
            pending,
            mode: self.pending_reboot_mode(pending, recorded_now),
        }
    }

    /// The pending reboot's mode: hard once any of its requests was hard, recorded before any
    /// power-off it causes, so a hard request removed before its power-off is sent (host
    /// transitioning, failed or lost call, BMC down) is still served hard.
    fn pending_reboot_mode(&mut self, pending: bool, recorded_now: bool) -> PowerOffMode {
        if !pending {
            return self.requests.effective_mode();
        }
        let recorded = if recorded_now {
            PowerOffMode::Soft
        } else {
            self.st
                .provisioning
                .pending_reboot_mode
                .unwrap_or(PowerOffMode::Soft)
        };
        if recorded != PowerOffMode::Hard && self.requests.effective_mode() == PowerOffMode::Hard {
            self.d.status.push(StatusUpdate::MarkPendingRebootHard);
            return PowerOffMode::Hard;
        }
        recorded
    }

    /// Transitioning or unknown: no power decision on a state we cannot see, except that a
    /// hard request overrides a soft power-off in flight at once.
    fn await_visible_power(mut self, power: ObservedPower, reboot: PendingReboot) -> Decision {
        if let Some(action) = self.last_action.as_ref()
            && reboot.pending
            && should_escalate(action, reboot.mode)
        {
            escalate(&mut self.d, action, &self.requests, self.now);
        }
        let requeue = match power {
            ObservedPower::Unknown => self.cfg.unknown_power_requeue,
            _ => self.cfg.transition_requeue,
        };
        self.finish(None, requeue)
    }

    /// The host is off: the suffixless request's power cycle has done its "off".
    fn finish_suffixless_power_off(&mut self, reboot_pending: bool, on: bool) {
        if reboot_pending && !on && self.online && self.requests.has_suffixless() {
            remove_annotations(
                &mut self.d,
                vec![REBOOT_ANNOTATION.to_owned()],
                AnnotationRemovalReason::RebootPoweredOff,
                "the host is off; it is powered back on once no reboot annotation remains",
            );
            self.requests = self.requests.without_suffixless();
            self.removed_annotations = true;
        }
    }

    /// Any reboot annotation holds the host off; a pending reboot must pass through "off"
    /// before the host may run again; otherwise spec.online decides.
    fn desired_power(&self, reboot: PendingReboot, on: bool) -> DesiredPower {
        let reboot_driven = reboot.pending || !self.requests.is_empty();
        // spec.disablePowerOff: the host always runs, and a pending reboot of a running host is
        // a BMC restart (the power-on rule below still waits for a snapshot without
        // annotations).
        let disable_power_off = self.s.disable_power_off;
        let restart = disable_power_off && reboot.pending && on;
        let want_on = disable_power_off
            || (self.online && self.requests.is_empty() && !(reboot.pending && on));
        let (trigger, mode) = if restart {
            (PowerActionTrigger::RebootRequested, reboot.mode)
        } else if want_on {
            (PowerActionTrigger::SpecOnline, PowerOffMode::Soft)
        } else if reboot_driven {
            (PowerActionTrigger::RebootRequested, reboot.mode)
        } else if self.deprovisioning {
            (PowerActionTrigger::Deprovisioning, PowerOffMode::Soft)
        } else {
            (PowerActionTrigger::SpecOffline, PowerOffMode::Soft)
        };
        DesiredPower {
            want_on,
            restart,
            reboot_driven,
            trigger,
            mode,
            target: PowerTarget::from_powered_on(want_on),
        }
    }

    /// Requests the desired power, or waits: for an action that may still land, for a host
    /// coming back by itself, for the reboot command, or for a snapshot without annotations.
    fn drive_power(&mut self, desired: &DesiredPower, on: bool) -> PowerStep {
        let cfg = self.cfg;
        let waiting = PowerStep {
            requeue: cfg.transition_requeue,
            timed_out: false,
        };
        if on == desired.want_on && !desired.restart {
            // Nothing to change. Keep watching closely while an action may still land.
            let may_land = self.last_action.as_ref().is_some_and(|a| {
                a.state == PowerActionState::Requested && !timed_out(a, self.now, cfg)
            });
            return if may_land || self.removed_annotations {
                waiting
            } else {
                PowerStep {
                    requeue: cfg.steady_requeue,
                    timed_out: false,
                }
            };
        }
        if desired.want_on && !on && self.host_is_off_on_purpose(desired) {
            return waiting;
        }
        if desired.want_on && self.removed_annotations {
            // Power on only from a snapshot that shows no reboot annotation at all.
            return waiting;
        }
        self.request_desired_power(desired, on)
    }

    /// The host is off although it should run, and that is expected for now.
    fn host_is_off_on_purpose(&self, desired: &DesiredPower) -> bool {
        // A host seen off just after a BMC restart is coming back by itself (a restart may
        // show "off" for a while): no power-on, and no "corrected" warning, unless it stays
        // off past the power-action timeout.
        let restarting = self
            .last_action
            .as_ref()
            .is_some_and(|a| a.restart && !timed_out(a, self.now, self.cfg));
        // The reboot queue's reboot command is power-cycling this host: it is off on purpose.
        // Powering it on would race the command (a waiting command then times out, and a
        // retried one reboots the node twice): the power is the command's until the queue
        // removes its marker.
        let command_cycling = self.s.command_reboot && !desired.reboot_driven;
        restarting || command_cycling
    }

    /// The host is not where it should be: request it there, or follow up the request in
    /// flight (fall back to hard, escalate, wait, retry after a timeout or failure).
    fn request_desired_power(&mut self, desired: &DesiredPower, on: bool) -> PowerStep {
        let (now, cfg) = (self.now, self.cfg);
        let open_same = self.last_action.clone().filter(|a| {
            a.state != PowerActionState::Completed
                && a.action == desired.target
                && a.restart == desired.restart
        });
        let reason = power_reason(desired.trigger, &self.requests);
        let wanted = WantedPower {
            target: desired.target,
            mode: desired.mode,
            restart: desired.restart,
            trigger: desired.trigger,
            pending: self.pending,
            now,
            reason: &reason,
        };
        let mut step = PowerStep {
            requeue: cfg.transition_requeue,
            timed_out: false,
        };
        match open_same {
            Some(action) if soft_off_timed_out(&action, now, cfg) => {
                // Soft first; still on after the soft timeout: cut power.
                soft_timeout_fallback(&mut self.d, &action, now, cfg);
            }
            Some(action)
                if action.state == PowerActionState::Requested && !timed_out(&action, now, cfg) =>
            {
                if should_escalate(&action, desired.mode) {
                    escalate(&mut self.d, &action, &self.requests, now);
                }
                // Otherwise already asked and not yet observed: wait, do not ask again.
            }
            Some(action) if action.state == PowerActionState::Requested => {
                step.timed_out = true;
                self.report_power_timeout(&action, desired.target);
                self.send(&wanted, Some(&action));
            }
            Some(action) => {
                // The BMC call failed: retry once the error backoff has passed.
                let wait = cfg.error_backoff(self.st.error_count.max(1));
                match remaining(wait, now.duration_since(action.last_attempt_at)) {
                    Some(left) => step.requeue = left,
                    None => self.send(&wanted, Some(&action)),
                }
            }
            None => {
                self.warn_power_changed_by_others(desired, on, &reason);
                self.send(&wanted, None);
            }
        }
        step
    }

    fn send(&mut self, wanted: &WantedPower, retry_of: Option<&LastPowerAction>) {
        send_power_request(
            &mut self.d,
            wanted,
            retry_of,
            &self.requests,
            &mut self.warned_invalid,
        );
    }

    /// Timed out: the request may have been lost; asking again is safe (power calls are
    /// idempotent at the BMC) and the chain keeps its first request time.
    fn report_power_timeout(&mut self, action: &LastPowerAction, target: PowerTarget) {
        let (st, cfg) = (self.st, self.cfg);
        let count = st.error_count.saturating_add(1);
        let message = format!(
            "power {} requested at {} was not observed within {}s (attempt {}); requesting again",
            target.as_str(),
            action.last_attempt_at,
            cfg.power_action_timeout.as_secs(),
            action.attempts.max(1)
        );
        set_operational_status(&mut self.d, st, OperationalStatus::Error);
        self.d.status.push(StatusUpdate::SetError {
            error_type: ErrorType::PowerManagementError,
            message: message.clone(),
            count,
        });
        set_condition(
            &mut self.d,
            st,
            ConditionUpdate {
                type_: condition::BMC_HEALTHY,
                status: condition::FALSE,
                reason: condition_reason::POWER_ACTION_TIMED_OUT,
                message: format!("power {} not observed in time", target.as_str()),
            },
        );
        // The status message says when and which attempt; the Event note carries no counter or
        // time, so repeated timeouts fold into one Event series.
        event(
            &mut self.d,
            EventType::Warning,
            event_reason::POWER_ACTION_TIMED_OUT,
            format!(
                "power {} was not observed within {}s; requesting again",
                target.as_str(),
                cfg.power_action_timeout.as_secs()
            ),
        );
    }

    /// We saw the host in the desired state before and did not change it since: someone else
    /// did. It is put back; say so.
    fn warn_power_changed_by_others(&mut self, desired: &DesiredPower, on: bool, reason: &str) {
        let target = desired.target;
        if !desired.restart
            && self
                .st
                .observed_powered_on()
                .map(PowerTarget::from_powered_on)
                == Some(target)
        {
            event(
                &mut self.d,
                EventType::Warning,
                event_reason::POWER_STATE_CORRECTED,
                format!(
                    "host was found powered {} but should be {} ({reason}); correcting",
                    if on { "on" } else { "off" },
                    target.as_str()
                ),
            );
        }
    }

    /// A power-management error lasts until the power change it is about is seen (so its count
    /// keeps backing off retries); anything else clears once the BMC answers.
    fn settle_errors(&mut self, desired: &DesiredPower, on: bool, timed_out_now: bool) {
        let st = self.st;
        let power_error_outstanding = timed_out_now
            || (st.error_type.is_some()
                && (on != desired.want_on || desired.restart)
                && self.last_action.as_ref().is_some_and(|a| {
                    a.action == desired.target
                        && (a.state == PowerActionState::Failed
                            || (a.state == PowerActionState::Requested
                                && st.error_type == Some(ErrorType::PowerManagementError)))
                }));
        if power_error_outstanding {
            return;
        }
        if st.error_type.is_some() || st.error_count > 0 || !st.error_message.is_empty() {
            self.d.status.push(StatusUpdate::ClearError);
            event(
                &mut self.d,
                EventType::Normal,
                event_reason::BMC_RECOVERED,
                "BMC answers again; error cleared".to_owned(),
            );
        }
        set_operational_status(&mut self.d, st, OperationalStatus::Ok);
        set_condition(
            &mut self.d,
            st,
            ConditionUpdate {
                type_: condition::BMC_HEALTHY,
                status: condition::TRUE,
                reason: condition_reason::BMC_RESPONDING,
                message: "BMC answers and power actions succeed".to_owned(),
            },
        );
    }

    /// Records the reboot condition as the pass leaves the reboot, and when to look again.
    fn finish(mut self, on: Option<bool>, requeue: Duration) -> Decision {
        set_reboot_condition(
            &mut self.d,
            self.st,
            reboot_is_pending(self.pending, self.last_powered_on),
            on,
            &self.requests,
            self.online,
            self.s.disable_power_off,
        );
        self.d.requeue_after = Some(requeue);
        self.d
    }
}

/// Follow-up of a power call: record what the BMC layer did. `status` is the status as
/// persisted before the call (with the write-ahead `lastPowerAction`).
pub fn after_power_call(
    status: &BareMetalHostStatus,
    result: &PowerCallResult,
    now: Timestamp,
    cfg: &DecideConfig,
) -> Decision {
    let mut d = Decision::default();
    match result {
        PowerCallResult::Accepted { hard_fallback } => {
            let restart = status
                .last_power_action
                .as_ref()
                .filter(|a| a.restart && a.state == PowerActionState::Requested);
            if let Some(reason) = hard_fallback {
                d.status.push(StatusUpdate::SetHardFallback(HardFallback {
                    by: HardFallbackSource::Bmc,
                    reason: reason.clone(),
                    at: Some(now),
                }));
                let what = if restart.is_some() {
                    "soft restart fell back to ForceRestart"
                } else {
                    "soft power-off fell back to hard"
                };
                event(
                    &mut d,
                    EventType::Warning,
                    event_reason::SOFT_POWER_OFF_FALLBACK,
                    format!("{what}: {reason}"),
                );
            }
            // A BMC restart (spec.disablePowerOff) cannot be observed the way a power cycle is
            // (the host reports on before and after): the BMC accepting it is the proof that
            // the processes running before the request are stopped. lastPoweredOn is its
            // request time, as for a power-on.
            if let Some(action) = restart {
                d.status.push(StatusUpdate::CompletePowerAction { at: now });
                let last_powered_on = status.provisioning.last_powered_on;
                let pending = status.provisioning.pending_reboot_since;
                if last_powered_on.is_none_or(|t| action.requested_at > t) {
                    d.status
                        .push(StatusUpdate::SetLastPoweredOn(action.requested_at));
                    if reboot_is_pending(pending, last_powered_on)
                        && !reboot_is_pending(pending, Some(action.requested_at))
                    {
                        event(
                            &mut d,
                            EventType::Normal,
                            event_reason::REBOOT_COMPLETED,
                            // No times in the note (they are in status): repeats fold.
                            "host restarted through its BMC after the pending reboot".to_string(),
                        );
                    }
                }
            }
            d.requeue_after = Some(cfg.transition_requeue);
        }
        PowerCallResult::Failed(failure) => {
            d.status.push(StatusUpdate::FailPowerAction {
                message: failure.message.clone(),
            });
            let state = status
                .provisioning
                .state
                .clone()
                .unwrap_or(ProvisioningState::Available);
            record_bmc_failure(&mut d, status, &state, failure, cfg, true);
        }
    }
    d
}

fn record_bmc_failure(
    d: &mut Decision,
    st: &BareMetalHostStatus,
    state: &ProvisioningState,
    failure: &BmcFailure,
    cfg: &DecideConfig,
    during_power_call: bool,
) {
    let count = st.error_count.saturating_add(1);
    let (error_type, reason) = match failure.kind {
        BmcFailureKind::Credentials if state.is_provisioned() => (
            ErrorType::ProvisionedRegistrationError,
            condition_reason::CREDENTIALS_REJECTED,
        ),
        BmcFailureKind::Credentials => (
            ErrorType::RegistrationError,
            condition_reason::CREDENTIALS_REJECTED,
        ),
        BmcFailureKind::Unreachable => (
            ErrorType::PowerManagementError,
            condition_reason::BMC_UNREACHABLE,
        ),
        BmcFailureKind::Other => (ErrorType::PowerManagementError, condition_reason::BMC_ERROR),
    };
    let reason = if during_power_call && failure.kind != BmcFailureKind::Credentials {
        condition_reason::POWER_ACTION_FAILED
    } else {
        reason
    };
    set_operational_status(d, st, OperationalStatus::Error);
    d.status.push(StatusUpdate::SetError {
        error_type,
        message: failure.message.clone(),
        count,
    });
    set_condition(
        d,
        st,
        ConditionUpdate {
            type_: condition::BMC_HEALTHY,
            status: condition::FALSE,
            reason,
            message: failure.message.clone(),
        },
    );
    event(
        d,
        EventType::Warning,
        event_reason::BMC_ERROR,
        // No error count in the note: a BMC failing on every retry is one Event series.
        format!("{}: {}", error_type.as_str(), failure.message),
    );
    // Backoff, not a hot loop: 5 s, 10 s, 20 s ... capped.
    d.requeue_after = Some(cfg.error_backoff(count));
}

/// No BMC is read any more: the readings of the last one are not left standing as evidence.
fn clear_observation(d: &mut Decision, st: &BareMetalHostStatus) {
    if st.power_observation.is_some() {
        d.status.push(StatusUpdate::ClearPowerObservation);
    }
}

/// A reboot is pending while `pendingRebootSince` is later than `lastPoweredOn`.
fn reboot_is_pending(pending: Option<Timestamp>, last_powered_on: Option<Timestamp>) -> bool {
    match (pending, last_powered_on) {
        (Some(p), Some(l)) => p > l,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// `now`, or the smallest instant after `floor` if the clock is not past it (clock steps,
/// skew between replicas): the ordering between the two timestamps is the guarantee.
fn strictly_after(now: Timestamp, floor: Option<Timestamp>) -> Timestamp {
    match floor {
        Some(floor) if now <= floor => floor
            .checked_add(SignedDuration::from_nanos(1))
            .unwrap_or(floor),
        _ => now,
    }
}

fn timed_out(action: &LastPowerAction, now: Timestamp, cfg: &DecideConfig) -> bool {
    remaining(
        cfg.power_action_timeout,
        now.duration_since(action.last_attempt_at),
    )
    .is_none()
}

/// How much of `wait` is left after `elapsed`; `None` when it has passed.
fn remaining(wait: Duration, elapsed: SignedDuration) -> Option<Duration> {
    let wait = SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX);
    let left = wait.checked_sub(elapsed).unwrap_or(SignedDuration::ZERO);
    if left.is_positive() {
        Duration::try_from(left).ok()
    } else {
        None
    }
}

/// A soft power-off in flight for longer than the soft timeout.
fn soft_off_timed_out(action: &LastPowerAction, now: Timestamp, cfg: &DecideConfig) -> bool {
    action.state == PowerActionState::Requested
        && action.action == PowerTarget::Off
        && action.mode == Some(PowerOffMode::Soft)
        && remaining(
            cfg.soft_power_off_timeout,
            now.duration_since(action.last_attempt_at),
        )
        .is_none()
}

/// The host ignored a soft power-off for the whole soft timeout: go hard, and record why.
fn soft_timeout_fallback(
    d: &mut Decision,
    action: &LastPowerAction,
    now: Timestamp,
    cfg: &DecideConfig,
) {
    let reason = format!(
        "host still on {}s after a soft power-off",
        cfg.soft_power_off_timeout.as_secs()
    );
    let message = format!("{reason}; powering off hard");
    go_hard(
        d,
        action,
        action.trigger,
        HardFallbackSource::SoftTimeout,
        reason,
        now,
    );
    event(
        d,
        EventType::Warning,
        event_reason::SOFT_POWER_OFF_FALLBACK,
        message,
    );
}

fn should_escalate(action: &LastPowerAction, mode: PowerOffMode) -> bool {
    action.state == PowerActionState::Requested
        && action.action == PowerTarget::Off
        && action.mode == Some(PowerOffMode::Soft)
        && mode == PowerOffMode::Hard
}

/// A hard request arrived while a soft power-off is in flight: go hard now.
fn escalate(d: &mut Decision, action: &LastPowerAction, requests: &RebootRequests, now: Timestamp) {
    let hard_by: Vec<&str> = requests
        .iter()
        .filter(|r| r.mode == PowerOffMode::Hard)
        .map(|r| r.annotation.as_str())
        .collect();
    let by = if hard_by.is_empty() {
        "a request since removed (pendingRebootMode: hard)".to_owned()
    } else {
        hard_by.join(", ")
    };
    let reason = format!("hard reboot requested by {by} while a soft power-off was in flight");
    go_hard(
        d,
        action,
        PowerActionTrigger::RebootRequested,
        HardFallbackSource::Escalation,
        reason.clone(),
        now,
    );
    event(
        d,
        EventType::Normal,
        event_reason::POWER_OFF_ESCALATED,
        reason,
    );
}

/// Replaces the soft power-off `action` in flight with a hard one: records it (same chain,
/// next attempt, why it went hard), then sends it.
fn go_hard(
    d: &mut Decision,
    action: &LastPowerAction,
    trigger: PowerActionTrigger,
    by: HardFallbackSource,
    reason: String,
    now: Timestamp,
) {
    d.status
        .push(StatusUpdate::RecordPowerRequest(LastPowerAction {
            action: PowerTarget::Off,
            mode: Some(PowerOffMode::Hard),
            trigger,
            state: PowerActionState::Requested,
            requested_at: action.requested_at,
            last_attempt_at: now,
            attempts: action.attempts.saturating_add(1),
            completed_at: None,
            hard_fallback: Some(HardFallback {
                by,
                reason,
                at: Some(now),
            }),
            failure: None,
            restart: false,
        }));
    d.actions.push(Action::PowerOff {
        mode: PowerOffMode::Hard,
    });
}

/// The power state a decision wants, and why: what every power request of it carries.
struct WantedPower<'a> {
    target: PowerTarget,
    mode: PowerOffMode,
    /// A BMC restart (`spec.disablePowerOff`) instead of a power-off; `target` is `On`.
    restart: bool,
    trigger: PowerActionTrigger,
    /// `pendingRebootSince` as it will be written.
    pending: Option<Timestamp>,
    now: Timestamp,
    reason: &'a str,
}

/// Requests `wanted` (as a retry of `retry_of`, if any); a request that serves a reboot first
/// warns about unusable reboot annotations.
fn send_power_request(
    d: &mut Decision,
    wanted: &WantedPower,
    retry_of: Option<&LastPowerAction>,
    requests: &RebootRequests,
    warned: &mut bool,
) {
    if wanted.trigger == PowerActionTrigger::RebootRequested {
        warn_invalid(d, requests, warned);
    }
    if wanted.restart && requests.has_suffixless() {
        // metal3 removes the suffixless form once the restart is issued; removing it before
        // the call means a crash in between still restarts (the reboot stays pending) and the
        // annotation can never start a second cycle.
        remove_annotations(
            d,
            vec![REBOOT_ANNOTATION.to_owned()],
            AnnotationRemovalReason::RebootRestarted,
            "the host is restarted through its BMC (spec.disablePowerOff)",
        );
    }
    request_power(d, wanted, retry_of);
}

/// Records the request (write-ahead), then the power call and its event.
fn request_power(d: &mut Decision, wanted: &WantedPower, retry_of: Option<&LastPowerAction>) {
    let WantedPower {
        target,
        mode,
        restart,
        trigger,
        pending,
        now,
        reason,
    } = *wanted;
    let mut requested_at = retry_of.map_or(now, |a| a.requested_at);
    // A power-on must be later than the reboot it completes, or lastPoweredOn would not pass
    // pendingRebootSince and the reboot would never finish.
    if target == PowerTarget::On
        && let Some(pending) = pending
        && requested_at <= pending
    {
        requested_at = strictly_after(now, Some(pending));
    }
    let attempts = retry_of.map_or(1, |a| a.attempts.saturating_add(1));
    d.status
        .push(StatusUpdate::RecordPowerRequest(LastPowerAction {
            action: target,
            mode: (target == PowerTarget::Off || restart).then_some(mode),
            trigger,
            state: PowerActionState::Requested,
            requested_at,
            last_attempt_at: now,
            attempts,
            completed_at: None,
            hard_fallback: None,
            failure: None,
            restart,
        }));
    // Retries say so without a counter, so they fold into one Event series.
    let retry = if attempts > 1 { " (retry)" } else { "" };
    match target {
        PowerTarget::Off => {
            d.actions.push(Action::PowerOff { mode });
            event(
                d,
                EventType::Normal,
                event_reason::POWER_OFF,
                format!("{} power-off: {reason}{retry}", mode.as_str()),
            );
        }
        PowerTarget::On if restart => {
            d.actions.push(Action::Restart { mode });
            event(
                d,
                EventType::Normal,
                event_reason::POWER_RESTART,
                format!(
                    "{} restart through the BMC (spec.disablePowerOff): {reason}{retry}",
                    mode.as_str()
                ),
            );
        }
        PowerTarget::On => {
            d.actions.push(Action::PowerOn);
            event(
                d,
                EventType::Normal,
                event_reason::POWER_ON,
                format!("power-on: {reason}{retry}"),
            );
        }
    }
}

fn power_reason(trigger: PowerActionTrigger, requests: &RebootRequests) -> String {
    match trigger {
        PowerActionTrigger::RebootRequested if requests.is_empty() => {
            "a reboot is pending; the host must go off first".to_owned()
        }
        PowerActionTrigger::RebootRequested => {
            format!(
                "reboot requested by {}",
                requests.annotation_keys().join(", ")
            )
        }
        PowerActionTrigger::SpecOffline => "spec.online is false".to_owned(),
        PowerActionTrigger::Deprovisioning => {
            "the host is deprovisioning: it is powered off before it is available".to_owned()
        }
        PowerActionTrigger::SpecOnline => {
            "spec.online is true and no reboot annotation remains".to_owned()
        }
    }
}

fn remove_annotations(
    d: &mut Decision,
    keys: Vec<String>,
    reason: AnnotationRemovalReason,
    why: &str,
) {
    let messages: Vec<String> = keys
        .iter()
        .map(|k| format!("removed reboot annotation {k}: {why}"))
        .collect();
    d.actions.push(Action::RemoveAnnotations { keys, reason });
    for message in messages {
        event(
            d,
            EventType::Normal,
            event_reason::REBOOT_ANNOTATION_REMOVED,
            message,
        );
    }
}

/// One Warning per unusable annotation, once per decision, when a request is acted upon.
fn warn_invalid(d: &mut Decision, requests: &RebootRequests, warned: &mut bool) {
    if *warned {
        return;
    }
    *warned = true;
    for (annotation, why) in requests.invalid() {
        event(
            d,
            EventType::Warning,
            event_reason::INVALID_REBOOT_ANNOTATION,
            format!("{annotation}: {why}; treated as a soft reboot request"),
        );
    }
}

/// `spec.disablePowerOff`: what asks for the host to stay off is refused. The
/// `PowerOffRefused` condition says so (and says False again once nothing is refused or the
/// flag is cleared); a Warning Event goes with every change of what is refused.
fn refuse_power_off(d: &mut Decision, s: &HostSnapshot, requests: &RebootRequests) {
    let st = &s.status;
    let present = st
        .conditions
        .iter()
        .any(|c| c.type_ == condition::POWER_OFF_REFUSED);
    if !s.disable_power_off && !present {
        return;
    }
    let mut refused = Vec::new();
    if s.disable_power_off {
        if !s.online {
            refused.push("online: false".to_owned());
        }
        refused.extend(requests.keyed.values().map(|r| r.annotation.clone()));
    }
    let update = if refused.is_empty() {
        ConditionUpdate {
            type_: condition::POWER_OFF_REFUSED,
            status: condition::FALSE,
            reason: condition_reason::NOTHING_REFUSED,
            message: if s.disable_power_off {
                "spec.disablePowerOff: nothing asks for the host to stay off".to_owned()
            } else {
                "spec.disablePowerOff is false: power-off is allowed".to_owned()
            },
        }
    } else {
        ConditionUpdate {
            type_: condition::POWER_OFF_REFUSED,
            status: condition::TRUE,
            reason: condition_reason::POWER_OFF_DISABLED,
            message: format!(
                "spec.disablePowerOff is true: the host is never powered off, so {} cannot hold it off; it stays on (reboots are BMC restarts)",
                refused.join(", ")
            ),
        }
    };
    if !refused.is_empty() && condition_differs(&st.conditions, &update) {
        event(
            d,
            EventType::Warning,
            event_reason::POWER_OFF_REFUSED,
            update.message.clone(),
        );
    }
    set_condition(d, st, update);
}

fn set_reboot_condition(
    d: &mut Decision,
    st: &BareMetalHostStatus,
    pending: bool,
    observed_on: Option<bool>,
    requests: &RebootRequests,
    online: bool,
    restarts: bool,
) {
    let (status, reason, message) = if !pending {
        (
            condition::FALSE,
            condition_reason::NO_REBOOT_PENDING,
            String::new(),
        )
    } else if observed_on != Some(false) && restarts {
        (
            condition::TRUE,
            condition_reason::AWAITING_RESTART,
            "the host is being restarted through its BMC (spec.disablePowerOff)".to_owned(),
        )
    } else if observed_on != Some(false) {
        (
            condition::TRUE,
            condition_reason::AWAITING_POWER_OFF,
            "the host is being powered off for a reboot".to_owned(),
        )
    } else if !requests.is_empty() {
        (
            condition::TRUE,
            condition_reason::HELD_BY_ANNOTATIONS,
            format!("held off by {}", requests.annotation_keys().join(", ")),
        )
    } else if !online {
        (
            condition::TRUE,
            condition_reason::OFFLINE,
            "spec.online is false; the host stays off".to_owned(),
        )
    } else {
        (
            condition::TRUE,
            condition_reason::AWAITING_POWER_ON,
            "the host is being powered back on".to_owned(),
        )
    };
    set_condition(
        d,
        st,
        ConditionUpdate {
            type_: condition::REBOOT_PENDING,
            status,
            reason,
            message,
        },
    );
}

fn set_condition(d: &mut Decision, st: &BareMetalHostStatus, update: ConditionUpdate) {
    if condition_differs(&st.conditions, &update) {
        d.status.push(StatusUpdate::SetCondition(update));
    }
}

fn set_operational_status(d: &mut Decision, st: &BareMetalHostStatus, status: OperationalStatus) {
    if st.operational_status != Some(status) {
        d.status.push(StatusUpdate::SetOperationalStatus(status));
    }
}

fn event(d: &mut Decision, type_: EventType, reason: &'static str, message: String) {
    d.actions.push(Action::EmitEvent(Event {
        type_,
        reason,
        message,
    }));
}
