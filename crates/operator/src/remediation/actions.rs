//! The actions `decide` asks for, each against the API server: the host's power-off
//! annotation, the Node's deletion and restore, the escalations.

use std::collections::BTreeMap;
use std::sync::Arc;

use hostcycle_api::BareMetalHost;
use hostcycle_api::remediation::{
    CAPM3_UNHEALTHY_ANNOTATION, CAPM3_UNHEALTHY_VALUE, HostRemediation, RemediationStep,
};
use hostcycle_core::remediation::escalation::{
    ConditionsLayout, capi_gave_up_patch, capi_remediated_patch,
};
use hostcycle_core::remediation::{Escalation, Record, off_confirmed};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::controller::{Controller, Item, log_write_error};
use super::observe::{Subject, host_view};
use crate::cluster::errors::{is_conflict, is_not_found};

/// How [`Controller::edit_node`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeEdit {
    /// Changed, or nothing to change.
    Done,
    /// No such Node.
    Missing,
    /// A read or write failed (logged), or conflicts outlasted the tries.
    Failed,
}

impl Controller {
    /// Adds (`Some(value)`) or removes this remediation's power-off annotation on its host.
    pub(super) async fn set_host_annotation(&mut self, item: &Item, value: Option<&str>) -> bool {
        // No acting host (the bound one is gone or was replaced): nothing to release, and a
        // power-off is never requested from another host.
        let Some(host) = &item.host else {
            return value.is_none();
        };
        let key = item.subject.power_off_annotation();
        match self
            .patch_bound_host_annotations(host, json!({ key: value }))
            .await
        {
            Ok(()) => true,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                false
            }
        }
    }

    /// Merges `annotations` into the host's. The uid in the patch is a precondition: a host
    /// re-created under this name since it was read has another, immutable one, and the
    /// patch is refused.
    async fn patch_bound_host_annotations(
        &self,
        host: &BareMetalHost,
        annotations: serde_json::Value,
    ) -> Result<(), kube::Error> {
        let api: Api<BareMetalHost> =
            Api::namespaced(self.client.clone(), &host.namespace().unwrap_or_default());
        let patch = json!({ "metadata": { "uid": host.uid(), "annotations": annotations } });
        api.patch(
            &host.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// Deletes the Node the record backed up (UID precondition: never a newer one).
    ///
    /// Deleting the Node releases its workloads for good, so the evidence is read again
    /// first, from the API server (the cache may lag): the bound host, off in a status written
    /// after this cycle's power-off request, without error.
    pub(super) async fn delete_node(&mut self, item: &Item, record: &Record) -> bool {
        let Some(node) = &item.node else { return true };
        if !self.confirmed_off_now(item, record).await {
            tracing::info!(
                node = %node.name_any(),
                remediation = %item.subject.key(),
                "a fresh read of the host does not confirm it off: the node is kept"
            );
            return false;
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: node.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&node.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(node = %node.name_any(), remediation = %item.subject.key(), "node deleted; its host is off");
                true
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => true,
            Err(e) => {
                log_write_error(&format!("Node {}", node.name_any()), &e);
                false
            }
        }
    }

    /// Whether the bound host is off for this cycle on a fresh read from the API server (the
    /// cache may lag): off in readings made after this cycle's power-off, from the bound BMC,
    /// without error. Asked right before every step that releases a node's workloads.
    pub(super) async fn confirmed_off_now(&self, item: &Item, record: &Record) -> bool {
        let Some(host) = &item.host else { return false };
        let hosts: Api<BareMetalHost> =
            Api::namespaced(self.client.clone(), &host.namespace().unwrap_or_default());
        let fresh = match hosts.get_opt(&host.name_any()).await {
            Ok(Some(h)) => h,
            Ok(None) => return false,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                return false;
            }
        };
        let view = host_view(&fresh, &item.subject.power_off_annotation());
        let same_host = record.host.as_ref().is_none_or(|b| b.uid == view.uid);
        same_host && off_confirmed(&view, record) && self.clock.untrusted().is_none()
    }

    /// Adds the backed-up labels, annotations and taints the new Node lacks (its own keys
    /// win), and its cordon when `cordon`.
    pub(super) async fn restore_node(
        &mut self,
        item: &Item,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        cordon: bool,
        taints: &[hostcycle_api::remediation::TaintBackup],
    ) -> bool {
        let Some(name) = &item.observation.node_name else {
            return true;
        };
        // A missing Node is not restored: the flow waits for it to register.
        self.edit_node(name, |node| {
            let missing = |have: &BTreeMap<String, String>, backup: &BTreeMap<String, String>| {
                backup
                    .iter()
                    .filter(|(k, _)| !have.contains_key(*k))
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect::<serde_json::Map<String, Value>>()
            };
            let add_labels = missing(node.labels(), labels);
            let add_annotations = missing(node.annotations(), annotations);
            let spec = node.spec.clone().unwrap_or_default();
            let have_taints = spec.taints.clone().unwrap_or_default();
            let add_taints: Vec<&hostcycle_api::remediation::TaintBackup> = taints
                .iter()
                .filter(|t| {
                    !have_taints
                        .iter()
                        .any(|h| h.key == t.key && h.effect == t.effect)
                })
                .collect();
            let add_cordon = cordon && spec.unschedulable != Some(true);
            if add_labels.is_empty()
                && add_annotations.is_empty()
                && add_taints.is_empty()
                && !add_cordon
            {
                return None;
            }
            let mut patch = json!({ "metadata": {
                "labels": add_labels,
                "annotations": add_annotations,
            }});
            if add_cordon {
                patch["spec"]["unschedulable"] = json!(true);
            }
            if !add_taints.is_empty() {
                // A merge patch replaces the whole list: the Node's own taints, then the
                // restored ones (with the resourceVersion, so none added meanwhile is lost).
                let mut all: Vec<Value> = have_taints
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect();
                all.extend(
                    add_taints
                        .iter()
                        .map(|t| json!({ "key": t.key, "value": t.value, "effect": t.effect })),
                );
                patch["spec"]["taints"] = Value::Array(all);
            }
            Some(patch)
        })
        .await
            == NodeEdit::Done
    }

    /// Changes Node `name` with the merge patch `change` computes from it (`None`: nothing to
    /// change), with the resourceVersion it was computed from as precondition; read again
    /// and recomputed on a conflict (five tries).
    pub(super) async fn edit_node(
        &self,
        name: &str,
        change: impl Fn(&Node) -> Option<Value>,
    ) -> NodeEdit {
        let api: Api<Node> = Api::all(self.client.clone());
        for _ in 0..5 {
            let node = match api.get_opt(name).await {
                Ok(Some(n)) => n,
                Ok(None) => return NodeEdit::Missing,
                Err(e) => {
                    log_write_error(&format!("Node {name}"), &e);
                    return NodeEdit::Failed;
                }
            };
            let Some(mut patch) = change(&node) else {
                return NodeEdit::Done;
            };
            patch["metadata"]["resourceVersion"] = json!(node.resource_version());
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return NodeEdit::Done,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    log_write_error(&format!("Node {name}"), &e);
                    return NodeEdit::Failed;
                }
            }
        }
        NodeEdit::Failed
    }

    pub(super) async fn escalate(&mut self, item: &Item, kind: &Escalation) -> bool {
        let Some(machine) = &item.machine else {
            return true;
        };
        let api = self.machine_api(machine);
        let name = machine.object.name_any();
        match kind {
            Escalation::DeleteMachine => {
                // Irreversible: read the Machine (and a request) from the API server first,
                // and delete only the very version that still gives up; a change in between
                // (409) is read again.
                for _ in 0..3 {
                    let fresh = match api.get_opt(&name).await {
                        Ok(Some(m)) => m,
                        Ok(None) => return true,
                        Err(e) => {
                            log_write_error(&format!("Machine {}", machine.key()), &e);
                            return false;
                        }
                    };
                    if fresh.uid() != machine.object.uid()
                        || fresh.meta().deletion_timestamp.is_some()
                    {
                        return true;
                    }
                    if item.observation.record.power_on_timeout_at.is_some()
                        && self.node_exists(item).await != Some(false)
                    {
                        tracing::info!(machine = %machine.key(), "the node registered meanwhile (or cannot be read): the Machine is kept");
                        return true;
                    }
                    if !self.still_gives_up(item, &fresh).await {
                        tracing::info!(machine = %machine.key(), "a fresh read shows the remediation no longer gives up: the Machine is kept");
                        return true;
                    }
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: fresh.uid(),
                            resource_version: fresh.resource_version(),
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(&name, &params).await {
                        Ok(_) => return true,
                        Err(e) if is_not_found(&e) => return true,
                        Err(e) if is_conflict(&e) => continue,
                        Err(e) => {
                            log_write_error(&format!("Machine {}", machine.key()), &e);
                            return false;
                        }
                    }
                }
                false
            }
            Escalation::MarkOwnerRemediated => {
                let current = match api.get(&name).await {
                    Ok(m) => m,
                    Err(e) => {
                        log_write_error(&format!("Machine {}", machine.key()), &e);
                        return false;
                    }
                };
                let status = current.data.get("status").cloned().unwrap_or(Value::Null);
                let mut patch = capi_gave_up_patch(
                    &status,
                    ConditionsLayout::of(&machine.resource.api_version),
                    Timestamp::now(),
                    "hostcycle gave up remediating this machine; its owner should replace it",
                    // The MachineHealthCheck set ExternallyRemediated when it made the request.
                    matches!(item.subject, Subject::Request(_)),
                );
                patch["metadata"] = json!({ "resourceVersion": current.resource_version() });
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => true,
                    Err(e) => {
                        log_write_error(&format!("Machine {} status", machine.key()), &e);
                        false
                    }
                }
            }
            Escalation::None(_) => true,
        }
    }

    /// Whether the remediation's Node exists, read from the API server; `None` when unknown.
    async fn node_exists(&self, item: &Item) -> Option<bool> {
        let name = item.observation.node_name.as_ref()?;
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Ok(node) => Some(node.is_some()),
            Err(e) => {
                log_write_error(&format!("Node {name}"), &e);
                None
            }
        }
    }

    /// Marks the host the remediation gave up on as CAPM3 does (`capm3.metal3.io/unhealthy`):
    /// CAPM3 chooses no such host for a new Machine, and hostcycle starts no remediation on it.
    pub(super) async fn mark_host_unhealthy(&mut self, item: &Item) -> bool {
        let Some(host) = &item.host else { return true };
        let mark = json!({ CAPM3_UNHEALTHY_ANNOTATION: CAPM3_UNHEALTHY_VALUE });
        match self.patch_bound_host_annotations(host, mark).await {
            Ok(()) => true,
            Err(e) if is_not_found(&e) || is_conflict(&e) => true,
            Err(e) => {
                log_write_error(&format!("BareMetalHost {}", host.name_any()), &e);
                false
            }
        }
    }

    /// Removes `ExternallyRemediated` from the request's Cluster API Machine: remediated.
    pub(super) async fn clear_externally_remediated(&mut self, item: &Item) -> bool {
        let Some(machine) = &item.machine else {
            return true;
        };
        let api = self.machine_api(machine);
        let name = machine.object.name_any();
        for _ in 0..3 {
            let current = match api.get_opt(&name).await {
                Ok(Some(m)) => m,
                Ok(None) => return true,
                Err(e) => {
                    log_write_error(&format!("Machine {}", machine.key()), &e);
                    return false;
                }
            };
            let status = current.data.get("status").cloned().unwrap_or(Value::Null);
            let Some(mut patch) =
                capi_remediated_patch(&status, ConditionsLayout::of(&machine.resource.api_version))
            else {
                return true;
            };
            patch["metadata"] = json!({ "resourceVersion": current.resource_version() });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return true,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    log_write_error(&format!("Machine {} status", machine.key()), &e);
                    return false;
                }
            }
        }
        false
    }

    /// Whether the remediation still gives up on this Machine, read from the API server: the
    /// annotation flow's Machine still carries its trigger and its failure; a request still
    /// exists, is not being deleted, and no checker gave up on it.
    async fn still_gives_up(&self, item: &Item, fresh: &DynamicObject) -> bool {
        match &item.subject {
            Subject::Machine(..) => {
                let a = fresh.annotations();
                a.contains_key(hostcycle_api::remediation::EXTERNAL_REMEDIATION_ANNOTATION)
                    && a.contains_key(hostcycle_api::remediation::REMEDIATION_FAILED_ANNOTATION)
            }
            Subject::Request(r) => {
                let api: Api<HostRemediation> =
                    Api::namespaced(self.client.clone(), &r.namespace().unwrap_or_default());
                match api.get_opt(&r.name_any()).await {
                    Ok(Some(now)) => {
                        now.uid() == r.uid()
                            && super::observe::requested(&Subject::Request(Arc::new(now.clone())))
                            && now
                                .status
                                .as_ref()
                                .is_some_and(|s| s.step == RemediationStep::GaveUp)
                    }
                    _ => false,
                }
            }
        }
    }
}
