//! The annotation flow's records: one ConfigMap per Machine in the operator's namespace,
//! labelled with the Machine's uid, holding a [`MachineFlowRecord`]. Only the operator's
//! account (and the administrators of its namespace) may write there; a Machine's
//! annotations, which anyone who may edit the Machine can write, are markers for other tools
//! and are never read back (docs/security.md, "What each irreversible step trusts").
//!
//! A record is written before any action it decides (write-ahead, with the ConfigMap's
//! resourceVersion as a precondition) and deleted when the flow ends: once the trigger and
//! the markers are off the Machine (`FinishAnnotationFlow`), when its Machine is gone, or
//! when a flow that gave up has nothing left to restore and its trigger was removed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hostcycle_api::remediation::{
    MACHINE_FLOW_RECORD_KEY, MACHINE_FLOW_RECORD_LABEL, MachineFlowRecord, RemediationStep,
    machine_flow_record_name,
};
use hostcycle_core::remediation::Record;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::{Client, ResourceExt};

/// The largest record read (a ConfigMap holds at most 1 MiB).
const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// One Machine's flow record as stored.
#[derive(Debug, Clone)]
pub struct StoredFlow {
    /// The ConfigMap's name and resourceVersion (the precondition of the next write).
    pub name: String,
    pub resource_version: Option<String>,
    /// The Machine's uid.
    pub machine_uid: String,
    /// What it says. A record that cannot be read is one under way that lacks everything:
    /// `decide` gives it up cleanly (`Record::missing_field`).
    pub record: Record,
}

/// The label selector of the records' watch and lists.
pub fn selector() -> String {
    MACHINE_FLOW_RECORD_LABEL.to_string()
}

/// The records of `config_maps` by Machine uid. Only a ConfigMap named after the uid its label
/// and its record both name counts.
pub fn index(config_maps: &[Arc<ConfigMap>]) -> HashMap<String, Arc<StoredFlow>> {
    config_maps
        .iter()
        .filter_map(|cm| read(cm))
        .map(|s| (s.machine_uid.clone(), Arc::new(s)))
        .collect()
}

/// One record, or `None` when the ConfigMap is not one (no label, or a name that does not
/// match the label).
pub fn read(cm: &ConfigMap) -> Option<StoredFlow> {
    let uid = cm.labels().get(MACHINE_FLOW_RECORD_LABEL)?.clone();
    let name = cm.name_any();
    if name != machine_flow_record_name(&uid) {
        return None;
    }
    let stored = cm
        .data
        .as_ref()
        .and_then(|d| d.get(MACHINE_FLOW_RECORD_KEY))
        .filter(|text| text.len() <= MAX_RECORD_BYTES)
        .and_then(|text| serde_json::from_str::<MachineFlowRecord>(text).ok())
        .filter(|r| r.machine_uid == uid);
    let record = match stored {
        Some(r) => Record::from_machine_flow(&r),
        None => Record {
            step: RemediationStep::PowerOffRequested,
            ..Record::default()
        },
    };
    Some(StoredFlow {
        name,
        resource_version: cm.resource_version(),
        machine_uid: uid,
        record,
    })
}

/// Writes `record` for the Machine `machine` (`<group>/<namespace>/<name>`) with uid
/// `machine_uid`: created, or replaced with `existing`'s resourceVersion as a precondition (a
/// conflict means another write came first: the next pass decides again).
pub async fn write(
    client: &Client,
    namespace: &str,
    machine: &str,
    machine_uid: &str,
    record: &Record,
    existing: Option<&StoredFlow>,
) -> Result<StoredFlow, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let stored = record.to_machine_flow(machine, machine_uid);
    let text = serde_json::to_string(&stored).map_err(kube::Error::SerdeError)?;
    let name = machine_flow_record_name(machine_uid);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_string()),
            resource_version: existing.and_then(|e| e.resource_version.clone()),
            labels: Some(BTreeMap::from([
                (
                    MACHINE_FLOW_RECORD_LABEL.to_string(),
                    machine_uid.to_string(),
                ),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "hostcycle".to_string(),
                ),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            MACHINE_FLOW_RECORD_KEY.to_string(),
            text,
        )])),
        ..Default::default()
    };
    let written = match existing {
        Some(_) => api.replace(&name, &PostParams::default(), &cm).await?,
        None => api.create(&PostParams::default(), &cm).await?,
    };
    Ok(StoredFlow {
        name,
        resource_version: written.resource_version(),
        machine_uid: machine_uid.to_string(),
        record: record.clone(),
    })
}

/// Deletes a record (its resourceVersion as a precondition when known); gone already is done.
pub async fn delete(
    client: &Client,
    namespace: &str,
    stored: &StoredFlow,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: stored.resource_version.clone(),
            uid: None,
        }),
        ..Default::default()
    };
    match api.delete(&stored.name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if crate::cluster::errors::is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every record, read from the API server (not the cache): for decisions that must not rest
/// on a cache that may lag a write.
pub async fn list_fresh(
    client: &Client,
    namespace: &str,
) -> Result<HashMap<String, Arc<StoredFlow>>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let list = api.list(&ListParams::default().labels(&selector())).await?;
    let items: Vec<Arc<ConfigMap>> = list.items.into_iter().map(Arc::new).collect();
    Ok(index(&items))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hostcycle_core::binding::BoundHost;

    fn config_map(name: &str, label: Option<&str>, data: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: label.map(|l| {
                    BTreeMap::from([(MACHINE_FLOW_RECORD_LABEL.to_string(), l.to_string())])
                }),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            data: data.map(|d| BTreeMap::from([(MACHINE_FLOW_RECORD_KEY.to_string(), d.into())])),
            ..Default::default()
        }
    }

    #[test]
    fn a_record_round_trips_and_only_one_named_after_its_machine_counts() {
        let record = Record {
            step: RemediationStep::NodeReleased,
            host: BoundHost::parse("machines/host-0/uid-0"),
            started_at: Some("2025-01-01T00:00:00Z".parse().unwrap()),
            cycle_started_at: Some("2025-01-01T00:00:00Z".parse().unwrap()),
            labels_backup: Some(BTreeMap::from([("a".into(), "1".into())])),
            ..Record::default()
        };
        let text = serde_json::to_string(
            &record.to_machine_flow("cluster.x-k8s.io/machines/m-0", "uid-m"),
        )
        .unwrap();
        let name = machine_flow_record_name("uid-m");
        let good = config_map(&name, Some("uid-m"), Some(&text));
        let read_back = read(&good).unwrap();
        assert_eq!(read_back.record, record);
        assert_eq!(read_back.machine_uid, "uid-m");
        assert_eq!(read_back.resource_version.as_deref(), Some("7"));
        // Not a record: no label; a name that is not the label's; a label naming another uid.
        assert!(read(&config_map(&name, None, Some(&text))).is_none());
        assert!(
            read(&config_map(
                "hostcycle-machine-flow-x",
                Some("uid-m"),
                Some(&text)
            ))
            .is_none()
        );
        let other = machine_flow_record_name("uid-other");
        let mismatched = read(&config_map(&other, Some("uid-other"), Some(&text))).unwrap();
        assert_eq!(
            mismatched.record.missing_field(),
            Some("the host it bound"),
            "a record naming another Machine's uid is unreadable: the flow gives up cleanly"
        );
    }

    #[test]
    fn an_unreadable_record_is_one_under_way_that_lacks_everything() {
        let name = machine_flow_record_name("uid-m");
        for data in [None, Some("not json"), Some("{}"), Some(r#"{"machine":1}"#)] {
            let s = read(&config_map(&name, Some("uid-m"), data)).unwrap();
            assert!(s.record.in_flight(), "{data:?}");
            assert!(s.record.missing_field().is_some(), "{data:?}");
        }
        let index = index(&[Arc::new(config_map(&name, Some("uid-m"), None))]);
        assert!(index.contains_key("uid-m"));
    }
}
