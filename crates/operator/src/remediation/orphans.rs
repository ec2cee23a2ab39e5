//! Orphans: power-off annotations whose remediation no longer exists are removed, so no
//! host is left off.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hostcycle_api::BareMetalHost;
use hostcycle_api::queue::HostReference;
use hostcycle_api::reasons::EventType;
use hostcycle_api::reasons::remediation::event_reason;
use hostcycle_api::remediation::{
    HostRemediation, REQUEST_POWER_OFF_PREFIX, is_remediation_power_off,
};
use hostcycle_core::remediation::orphans::orphaned_power_off_keys;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::controller::{Controller, log_write_error};
use super::records::StoredFlow;
use crate::cluster::objects::{MachineObject, binding_index, host_reference};

impl Controller {
    /// Power-off annotations whose remediation no longer exists (a Machine or request deleted
    /// without its cleanup): the host is released, never left off.
    pub(super) async fn sweep_orphans(&mut self) {
        // Most hosts carry no power-off annotation: nothing more is read for them.
        let fenced: Vec<Arc<BareMetalHost>> = self
            .stores
            .hosts
            .state()
            .into_iter()
            .filter(|h| h.annotations().keys().any(|k| is_remediation_power_off(k)))
            .collect();
        if fenced.is_empty() {
            return;
        }
        let requests: HashSet<String> = self
            .stores
            .requests
            .state()
            .iter()
            .filter_map(|r| r.uid())
            .collect();
        let machines = self.cached_machines();
        let records = super::records::index(&self.stores.records.state());
        let claims = self.machine_flow_claims(&machines, &records);
        for host in fenced {
            let reference = host_reference(&host);
            let uid = host.uid().unwrap_or_default();
            let orphaned = orphaned_power_off_keys(
                host.annotations().keys(),
                |uid| requests.contains(uid),
                || claims.claims(&reference, &uid),
            );
            if orphaned.is_empty() {
                continue;
            }
            let ns = reference.namespace.clone();
            let name = reference.name.clone();
            for key in orphaned {
                // Confirm with the API server: the caches may lag a write of our own.
                if !self.orphan_confirmed(&key, &reference, &uid).await {
                    continue;
                }
                let api: Api<BareMetalHost> = Api::namespaced(self.client.clone(), &ns);
                let patch = json!({ "metadata": {
                    "resourceVersion": host.resource_version(),
                    "annotations": { key.clone(): null },
                }});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        let note = format!(
                            "removed {key}: the remediation that put it there is gone; the host is released"
                        );
                        self.events.emit(
                            &host.object_ref(&()),
                            EventType::Warning,
                            event_reason::ORPHAN_RELEASED,
                            &note,
                        );
                    }
                    Err(e) => {
                        let host_id = format!("{ns}/{name}");
                        let _about = tracing::info_span!("orphan", host = %host_id).entered();
                        log_write_error(&format!("BareMetalHost {host_id}"), &e);
                        self.retry_soon = true;
                    }
                }
            }
        }
    }

    /// Flow records whose Machine is gone (deleted, or recreated with another uid), and
    /// records of flows that gave up with nothing left to restore once their trigger is
    /// removed, are deleted — each confirmed on a fresh read of the Machine (the caches may
    /// lag). A deleted record's power-off, if any, is then an orphan: released above.
    pub(super) async fn sweep_records(&mut self) {
        let records = super::records::index(&self.stores.records.state());
        if records.is_empty() {
            return;
        }
        let machines = self.cached_machines();
        let by_uid: HashMap<String, &MachineObject> = machines
            .iter()
            .filter_map(|m| m.object.uid().map(|uid| (uid, m)))
            .collect();
        for stored in records.values() {
            let candidate = match by_uid.get(&stored.machine_uid) {
                None => true,
                Some(m) => !m.triggered() && stored.record.retires_without_trigger(),
            };
            if !candidate || !self.record_retired(stored).await {
                continue;
            }
            if let Err(e) =
                super::records::delete(&self.client, &self.config.record_namespace, stored).await
            {
                log_write_error(&format!("flow record {}", stored.name), &e);
                self.retry_soon = true;
            } else {
                tracing::info!(record = %stored.name, "flow record removed: its Machine is gone, or its flow gave up and its trigger was removed");
            }
        }
    }

    /// Whether a record may go, on a fresh read of its Machine: gone, or without the trigger
    /// with a flow that gave up and has nothing to restore. An unreadable record's Machine is
    /// found by its uid among every Machine.
    async fn record_retired(&self, stored: &StoredFlow) -> bool {
        for (resource, _) in &self.stores.machines {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            let Ok(list) = api.list(&Default::default()).await else {
                return false;
            };
            if let Some(m) = list
                .items
                .into_iter()
                .find(|m| m.uid().as_deref() == Some(stored.machine_uid.as_str()))
            {
                let m = MachineObject {
                    object: Arc::new(m),
                    resource: resource.clone(),
                };
                return !m.triggered() && stored.record.retires_without_trigger();
            }
        }
        true
    }

    /// The hosts the annotation flows hold, by the flow's own rule: the host each record
    /// bound (namespace, name and uid), and — for a triggered Machine without a record yet —
    /// the host the resolver binds to it (hosts and Nodes from the caches).
    fn machine_flow_claims(
        &self,
        machines: &[MachineObject],
        records: &HashMap<String, Arc<StoredFlow>>,
    ) -> FlowClaims {
        let mut claims = FlowClaims::default();
        for stored in records.values() {
            if let Some(bound) = &stored.record.host {
                claims
                    .bound
                    .insert((bound.reference.clone(), bound.uid.clone()));
            }
        }
        let unrecorded: Vec<&MachineObject> = machines
            .iter()
            .filter(|m| {
                m.triggered() && !m.object.uid().is_some_and(|uid| records.contains_key(&uid))
            })
            .collect();
        if unrecorded.is_empty() {
            return claims;
        }
        let hosts = self.stores.hosts.state();
        let nodes = self.stores.nodes.state();
        let index = binding_index(
            hosts.iter().map(|h| &**h),
            machines.iter().map(|m| &*m.object),
            nodes.iter().map(|n| &**n),
        );
        for m in unrecorded {
            if let Ok(b) = index.machine(&crate::cluster::objects::machine_key(&m.object)) {
                claims.resolved.insert(b.host);
            }
        }
        claims
    }

    async fn orphan_confirmed(&self, key: &str, host: &HostReference, uid: &str) -> bool {
        if let Some(uid) = key.strip_prefix(REQUEST_POWER_OFF_PREFIX) {
            let api: Api<HostRemediation> = Api::all(self.client.clone());
            return match api.list(&Default::default()).await {
                Ok(list) => !list.items.iter().any(|r| r.uid().as_deref() == Some(uid)),
                Err(_) => false,
            };
        }
        let mut fresh = Vec::new();
        for (resource, _) in &self.stores.machines {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            let Ok(list) = api.list(&Default::default()).await else {
                return false;
            };
            fresh.extend(list.items.into_iter().map(|m| MachineObject {
                object: Arc::new(m),
                resource: resource.clone(),
            }));
        }
        let Ok(records) =
            super::records::list_fresh(&self.client, &self.config.record_namespace).await
        else {
            return false;
        };
        !self.machine_flow_claims(&fresh, &records).claims(host, uid)
    }
}

/// Hosts held by annotation flows: bound ones (with their uid), and ones a flow that has not
/// bound yet resolves to.
#[derive(Default)]
struct FlowClaims {
    bound: HashSet<(HostReference, String)>,
    resolved: HashSet<HostReference>,
}

impl FlowClaims {
    fn claims(&self, host: &HostReference, uid: &str) -> bool {
        self.resolved.contains(host) || self.bound.contains(&(host.clone(), uid.to_string()))
    }
}
