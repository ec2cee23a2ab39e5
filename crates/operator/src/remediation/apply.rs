//! Apply: one remediation's decision carried out — the record written first (write-ahead),
//! then the actions in order, the Events, and a deleted request's finalizer.

use std::sync::Arc;

use hostcycle_api::reasons::remediation::event_reason;
use hostcycle_api::remediation::{HOST_REMEDIATION_FINALIZER, HostRemediation, RemediationStep};
use hostcycle_core::remediation::{Action, Decision, Event, Record};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::controller::{Controller, Item, log_write_error};
use super::observe::Subject;
use super::records::{self, StoredFlow};
use crate::cluster::objects::MachineObject;
use crate::events::node_ref;
use crate::metrics::RemediationLabels;

impl Controller {
    /// Carries out `decision` for `item`. A write that fails ends the pass's work on it: the
    /// next pass decides again.
    pub(super) async fn apply(&mut self, item: &Item, decision: &Decision, now: Timestamp) {
        // 1. The record first (write-ahead); a failed write stops here.
        let Some(written) = self.write_ahead(item, decision, now).await else {
            return;
        };
        // 2. The metrics of the steps the record took.
        self.observe_metrics(item, decision, now);
        // 3. The actions, in order; one failing stops the rest until the next pass.
        self.perform_actions(
            item,
            decision,
            written.machine.as_ref(),
            written.stored.as_ref(),
        )
        .await;
        // 4. The Events, once per distinct set.
        self.emit_events(item, decision);
        // 5. A request being deleted lets go once nothing of it is left on the host.
        if let Some(request) = &written.request {
            self.release_when_settled(request, item, decision).await;
        }
    }

    /// Writes the record where it lives: on the Machine's annotations, or in the request's
    /// status once the request holds the finalizer. `None`: a write failed.
    async fn write_ahead(
        &mut self,
        item: &Item,
        decision: &Decision,
        now: Timestamp,
    ) -> Option<Written> {
        match &item.subject {
            Subject::Machine(m, stored) => {
                let (machine, stored) = match (&decision.record, stored) {
                    (Some(next), _) => {
                        let (m, s) = self
                            .write_machine_record(m, stored.as_deref(), next)
                            .await?;
                        (Some(m), Some(s))
                    }
                    // No new record: the markers still follow the one there is (a write of
                    // them that failed last time is made good).
                    (None, Some(stored)) => (
                        Some(self.write_markers(m, &stored.record).await?),
                        Some((**stored).clone()),
                    ),
                    (None, None) => (item.machine.clone(), None),
                };
                Some(Written {
                    machine,
                    stored,
                    request: None,
                })
            }
            Subject::Request(r) => {
                let request = self.hold_request(r).await?;
                let record = decision
                    .record
                    .clone()
                    .unwrap_or_else(|| item.observation.record.clone());
                let request = self
                    .write_request_status(&request, &record, decision, item, now)
                    .await?;
                Some(Written {
                    machine: None,
                    stored: None,
                    request: Some(request),
                })
            }
        }
    }

    /// A request keeps a finalizer while it is being worked on, so cleanup finishes: added
    /// unless there or the request is being deleted. `None`: the write failed.
    async fn hold_request(&mut self, r: &HostRemediation) -> Option<HostRemediation> {
        if r.meta().deletion_timestamp.is_none()
            && !r
                .finalizers()
                .iter()
                .any(|f| f == HOST_REMEDIATION_FINALIZER)
        {
            return self.add_finalizer(r).await;
        }
        Some(r.clone())
    }

    async fn perform_actions(
        &mut self,
        item: &Item,
        decision: &Decision,
        machine: Option<&MachineObject>,
        stored: Option<&StoredFlow>,
    ) {
        for action in &decision.actions {
            if !self.perform(item, decision, action, machine, stored).await {
                self.retry_soon = true;
                break;
            }
        }
    }

    /// Carries out one action; `false`: it failed. `machine` and `stored` are the annotation
    /// flow's Machine and record, as the record write left them.
    async fn perform(
        &mut self,
        item: &Item,
        decision: &Decision,
        action: &Action,
        machine: Option<&MachineObject>,
        stored: Option<&StoredFlow>,
    ) -> bool {
        match action {
            Action::RequestPowerOff => {
                self.set_host_annotation(item, Some(r#"{"mode":"hard"}"#))
                    .await
            }
            Action::ReleasePowerOff => self.set_host_annotation(item, None).await,
            Action::DeleteNode => {
                let record = decision.record.as_ref().unwrap_or(&item.observation.record);
                self.delete_node(item, record).await
            }
            Action::RestoreNode {
                labels,
                annotations,
                cordon,
                taints,
            } => {
                self.restore_node(item, labels, annotations, *cordon, taints)
                    .await
            }
            Action::FinishAnnotationFlow => match machine {
                Some(m) => self.finish_machine(m, stored).await,
                None => true,
            },
            Action::MarkHostUnhealthy => self.mark_host_unhealthy(item).await,
            Action::ClearExternallyRemediated => self.clear_externally_remediated(item).await,
            Action::Escalate(kind) => self.escalate(item, kind).await,
            Action::Release(step) => {
                let record = decision.record.as_ref().unwrap_or(&item.observation.record);
                self.perform_release(item, record, *step).await
            }
        }
    }

    /// Publishes the decision's Events, and a Warning for an ignored Node hint, on the
    /// Machine or request, the host and the Node; a set already published last time is not
    /// (a waiting remediation does not repeat itself).
    fn emit_events(&mut self, item: &Item, decision: &Decision) {
        let key = item.subject.key();
        let mut events = decision.events.clone();
        if let Some(hint) = &item.ignored_hint {
            events.push(Event::warning(event_reason::HINT_IGNORED, hint.clone()));
        }
        let emitted: Vec<(&'static str, String)> = events
            .iter()
            .map(|e| (e.reason, e.message.clone()))
            .collect();
        if emitted.is_empty() || self.last_events.get(&key) == Some(&emitted) {
            return;
        }
        let regarding = event_objects(item);
        for e in &events {
            for object in &regarding {
                self.events.emit(object, e.event_type, e.reason, &e.message);
            }
        }
        self.last_events.insert(key, emitted);
    }

    /// Removes the finalizer of a request being deleted once its step settled and its
    /// power-off annotation is off the host (or released now).
    async fn release_when_settled(
        &mut self,
        r: &HostRemediation,
        item: &Item,
        decision: &Decision,
    ) {
        if r.meta().deletion_timestamp.is_none() {
            return;
        }
        let step = decision
            .record
            .as_ref()
            .map(|rec| rec.step)
            .unwrap_or(item.observation.record.step);
        let settled = matches!(
            step,
            RemediationStep::NotStarted
                | RemediationStep::Done
                | RemediationStep::GaveUp
                | RemediationStep::Cancelled
        );
        let host_clear = !item.host.as_ref().is_some_and(|h| {
            h.annotations()
                .contains_key(&item.subject.power_off_annotation())
        }) || decision.actions.contains(&Action::ReleasePowerOff);
        if settled && host_clear {
            self.remove_finalizer(r).await;
        }
    }

    fn observe_metrics(&self, item: &Item, decision: &Decision, now: Timestamp) {
        let Some(next) = &decision.record else { return };
        let before = &item.observation.record;
        let m = &self.metrics.remediation;
        let trigger = item.subject.trigger().as_str().to_string();
        let secs = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
            (Some(a), Some(b)) => Some(b.duration_since(a).as_secs_f64().max(0.0)),
            _ => None,
        };
        if before.powered_off_at.is_none()
            && let Some(s) = secs(next.started_at, next.powered_off_at)
        {
            m.time_to_fence.observe(s);
        }
        if before.node_released_at.is_none()
            && let Some(s) = secs(next.powered_off_at, next.node_released_at)
        {
            m.time_to_release.observe(s);
        }
        let result = match (before.step, next.step) {
            (a, RemediationStep::Done) if a != RemediationStep::Done => {
                if let Some(s) = secs(next.started_at, Some(now)) {
                    m.time_to_recover.observe(s);
                }
                Some("succeeded")
            }
            (a, RemediationStep::GaveUp) if a != RemediationStep::GaveUp => Some("failed"),
            (a, RemediationStep::Cancelled) if a != RemediationStep::Cancelled => Some("cancelled"),
            _ => None,
        };
        if let Some(result) = result {
            m.remediations
                .get_or_create(&RemediationLabels {
                    trigger,
                    result: result.into(),
                })
                .inc();
        }
    }

    // ----- writes ------------------------------------------------------------------

    pub(super) fn machine_api(&self, m: &MachineObject) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &m.object.namespace().unwrap_or_default(),
            &m.resource,
        )
    }

    /// Writes the annotation flow's record where only hostcycle writes ([`super::records`]),
    /// then metal3's markers onto the Machine for other tools (only those that differ). The
    /// record's resourceVersion precondition makes a pass deciding from a stale cache stop
    /// here, before any action, metric or Event — also for a flow that ends (Done,
    /// Cancelled), whose `FinishAnnotationFlow` then removes the trigger, the markers and the
    /// record. `None`: a write failed.
    async fn write_machine_record(
        &mut self,
        m: &MachineObject,
        stored: Option<&StoredFlow>,
        record: &Record,
    ) -> Option<(MachineObject, StoredFlow)> {
        let uid = m.object.uid().unwrap_or_default();
        let written = match records::write(
            &self.client,
            &self.config.record_namespace,
            &m.key(),
            &uid,
            record,
            stored,
        )
        .await
        {
            Ok(written) => written,
            Err(e) => {
                log_write_error(&format!("the flow record of Machine {}", m.key()), &e);
                self.retry_soon = true;
                return None;
            }
        };
        let machine = self.write_markers(m, record).await?;
        Some((machine, written))
    }

    /// Writes the markers of `record` onto the Machine where they differ (metal3's keys and
    /// hostcycle's, for people and other tools; never read back). No resourceVersion
    /// precondition: only these keys are patched, hostcycle alone writes them, and the record
    /// they follow was written first. `None`: the write failed.
    async fn write_markers(&mut self, m: &MachineObject, record: &Record) -> Option<MachineObject> {
        let have = m.object.annotations();
        let annotations: serde_json::Map<String, Value> = record
            .machine_annotations()
            .into_iter()
            .filter(|(k, v)| have.get(*k) != v.as_ref())
            .map(|(k, v)| (k.to_string(), v.map(Value::String).unwrap_or(Value::Null)))
            .collect();
        if annotations.is_empty() {
            return Some(m.clone());
        }
        self.patch_machine(m, json!({ "metadata": { "annotations": annotations } }))
            .await
    }

    /// The flow is over: the trigger and every marker go, then its record.
    async fn finish_machine(&mut self, m: &MachineObject, stored: Option<&StoredFlow>) -> bool {
        let annotations: serde_json::Map<String, Value> =
            crate::cluster::objects::MACHINE_RECORD_ANNOTATIONS
                .iter()
                .filter(|k| m.object.annotations().contains_key(**k))
                .map(|k| (k.to_string(), Value::Null))
                .collect();
        if !annotations.is_empty()
            && self
                .patch_machine_annotations(m, annotations)
                .await
                .is_none()
        {
            return false;
        }
        let Some(stored) = stored else { return true };
        match records::delete(&self.client, &self.config.record_namespace, stored).await {
            Ok(()) => true,
            Err(e) => {
                log_write_error(&format!("the flow record of Machine {}", m.key()), &e);
                self.retry_soon = true;
                false
            }
        }
    }

    /// Sets (or, with null, removes) Machine annotations, with the Machine's
    /// resourceVersion as a precondition.
    async fn patch_machine_annotations(
        &mut self,
        m: &MachineObject,
        annotations: serde_json::Map<String, Value>,
    ) -> Option<MachineObject> {
        self.patch_machine(
            m,
            json!({ "metadata": {
                "resourceVersion": m.object.resource_version(),
                "annotations": annotations,
            }}),
        )
        .await
    }

    async fn patch_machine(&mut self, m: &MachineObject, patch: Value) -> Option<MachineObject> {
        match self
            .machine_api(m)
            .patch(
                &m.object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(object) => Some(MachineObject {
                object: Arc::new(object),
                resource: m.resource.clone(),
            }),
            Err(e) => {
                log_write_error(&format!("Machine {}", m.key()), &e);
                self.retry_soon = true;
                None
            }
        }
    }

    async fn add_finalizer(&mut self, r: &HostRemediation) -> Option<HostRemediation> {
        let mut finalizers = r.finalizers().to_vec();
        finalizers.push(HOST_REMEDIATION_FINALIZER.to_string());
        let patch = json!({ "metadata": { "resourceVersion": r.resource_version(), "finalizers": finalizers } });
        self.patch_request(r, &patch).await
    }

    async fn remove_finalizer(&mut self, r: &HostRemediation) {
        let finalizers: Vec<String> = r
            .finalizers()
            .iter()
            .filter(|f| *f != HOST_REMEDIATION_FINALIZER)
            .cloned()
            .collect();
        let patch = json!({ "metadata": { "resourceVersion": r.resource_version(), "finalizers": finalizers } });
        self.patch_request(r, &patch).await;
    }

    async fn patch_request(
        &mut self,
        r: &HostRemediation,
        patch: &Value,
    ) -> Option<HostRemediation> {
        let api: Api<HostRemediation> =
            Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
        match api
            .patch(&r.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(updated) => Some(updated),
            Err(e) => {
                log_write_error(&format!("HostRemediation {}", r.name_any()), &e);
                self.retry_soon = true;
                None
            }
        }
    }
}

/// The objects the record was written on, as the writes returned them.
struct Written {
    /// The annotation flow's Machine (a request's is never patched by `FinishAnnotationFlow`).
    machine: Option<MachineObject>,
    /// The annotation flow's record as written (its resourceVersion the precondition of its
    /// deletion).
    stored: Option<StoredFlow>,
    request: Option<HostRemediation>,
}

/// Where an Event about `item` goes: its Machine or request, then its host and its Node when
/// known.
fn event_objects(item: &Item) -> Vec<ObjectReference> {
    let host = item.host.as_ref().map(|h| {
        let mut r = h.object_ref(&());
        r.field_path = None;
        r
    });
    let node = item.observation.node_name.as_deref().map(node_ref);
    [Some(primary_ref(&item.subject)), host, node]
        .into_iter()
        .flatten()
        .collect()
}

fn primary_ref(subject: &Subject) -> ObjectReference {
    match subject {
        Subject::Machine(m, _) => ObjectReference {
            api_version: Some(m.resource.api_version.clone()),
            kind: Some(m.resource.kind.clone()),
            name: Some(m.object.name_any()),
            namespace: m.object.namespace(),
            uid: m.object.uid(),
            ..Default::default()
        },
        Subject::Request(r) => r.object_ref(&()),
    }
}
