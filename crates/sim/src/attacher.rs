//! A simulated CSI driver's controller side: a minimal provisioner (PVCs of its StorageClass
//! get a CSI PersistentVolume) and an external-attacher (VolumeAttachments of the driver are
//! attached and detached in the [`StorageSim`]). Tokio tasks with a kube Client, as the real
//! sidecars are; VolumeAttachments are created and deleted only by the attach/detach
//! controller, never here.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::storage::StorageSim;

/// The simulated CSI driver's name.
pub const SIM_CSI_DRIVER: &str = "sim.csi.hostcycle.io";
/// The StorageClass provisioned by the simulated driver (ReadWriteOnce block storage).
pub const SIM_STORAGE_CLASS: &str = "hostcycle-sim-rwo";
/// The finalizer the attacher keeps on VolumeAttachments until it has detached them.
pub const SIM_ATTACHER_FINALIZER: &str = "external-attacher/sim-csi-hostcycle-io";
/// Annotation naming the provisioner of a PV (as external-provisioner sets it).
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Timing and names of the simulated CSI controller.
#[derive(Debug, Clone)]
pub struct CsiSimConfig {
    pub driver_name: String,
    pub storage_class: String,
    /// Time from seeing a VolumeAttachment until the storage is asked to attach it.
    pub attach_delay: Duration,
    /// Time from seeing a VolumeAttachment deleted until the storage detaches it.
    pub detach_delay: Duration,
    /// Wait before asking the storage again after it refused an attach.
    pub attach_retry_interval: Duration,
    /// How often every VolumeAttachment and claim is looked at even without a watch event.
    pub resync_interval: Duration,
}

impl Default for CsiSimConfig {
    fn default() -> Self {
        CsiSimConfig {
            driver_name: SIM_CSI_DRIVER.into(),
            storage_class: SIM_STORAGE_CLASS.into(),
            attach_delay: Duration::from_millis(500),
            detach_delay: Duration::from_secs(1),
            attach_retry_interval: Duration::from_secs(2),
            resync_interval: Duration::from_millis(500),
        }
    }
}

/// Creates the `CSIDriver` (attachRequired) and the `StorageClass` if they do not exist.
pub async fn install_csi_driver(client: &Client, config: &CsiSimConfig) -> Result<(), kube::Error> {
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let driver: CSIDriver = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": { "name": config.driver_name },
        "spec": { "attachRequired": true, "podInfoOnMount": false, "volumeLifecycleModes": ["Persistent"] },
    }))
    .map_err(kube::Error::SerdeError)?;
    create_if_absent(&drivers, &driver).await?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": config.storage_class },
        "provisioner": config.driver_name,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
    .map_err(kube::Error::SerdeError)?;
    create_if_absent(&classes, &class).await
}

async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The running provisioner and attacher; dropping it stops them.
#[derive(Debug)]
pub struct CsiSimHandle {
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl CsiSimHandle {
    pub async fn stop(mut self) {
        self.cancel.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for CsiSimHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Installs the driver and StorageClass, then starts the provisioner and the attacher.
pub async fn start_csi_sim(
    client: Client,
    config: CsiSimConfig,
    storage: StorageSim,
) -> Result<CsiSimHandle, kube::Error> {
    install_csi_driver(&client, &config).await?;
    let cancel = CancellationToken::new();
    let provisioner = tokio::spawn(run_provisioner(
        client.clone(),
        config.clone(),
        cancel.clone(),
    ));
    let attacher = tokio::spawn(run_attacher(client, config, storage, cancel.clone()));
    Ok(CsiSimHandle {
        cancel,
        tasks: vec![provisioner, attacher],
    })
}

/// What the attacher knows of one VolumeAttachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachmentView {
    pub has_finalizer: bool,
    pub deleting: bool,
    pub attached: bool,
}

/// When the attacher first saw a VolumeAttachment in its current phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachmentTimers {
    /// First seen wanting an attach.
    pub attach_wanted_since: Option<Instant>,
    /// First seen with a deletionTimestamp.
    pub deleting_since: Option<Instant>,
    /// The storage refused; not before this instant again.
    pub retry_at: Option<Instant>,
}

/// The attacher's next step for one VolumeAttachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttacherAction {
    Nothing,
    AddFinalizer,
    /// Look again at this instant.
    WaitUntil(Instant),
    Attach,
    /// Detach in storage, then remove the finalizer.
    DetachAndRelease,
}

/// Decides the step for one VolumeAttachment (pure; the timers are updated by the caller).
pub fn attacher_action(
    view: AttachmentView,
    timers: AttachmentTimers,
    now: Instant,
    config: &CsiSimConfig,
) -> AttacherAction {
    if view.deleting {
        if !view.has_finalizer {
            return AttacherAction::Nothing;
        }
        let due = timers.deleting_since.unwrap_or(now) + config.detach_delay;
        return if now >= due {
            AttacherAction::DetachAndRelease
        } else {
            AttacherAction::WaitUntil(due)
        };
    }
    if !view.has_finalizer {
        return AttacherAction::AddFinalizer;
    }
    if view.attached {
        return AttacherAction::Nothing;
    }
    let due = (timers.attach_wanted_since.unwrap_or(now) + config.attach_delay)
        .max(timers.retry_at.unwrap_or(now));
    if now >= due {
        AttacherAction::Attach
    } else {
        AttacherAction::WaitUntil(due)
    }
}

fn view_of(va: &VolumeAttachment) -> AttachmentView {
    AttachmentView {
        has_finalizer: va
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == SIM_ATTACHER_FINALIZER)),
        deleting: va.metadata.deletion_timestamp.is_some(),
        attached: va.status.as_ref().is_some_and(|s| s.attached),
    }
}

struct Attacher {
    config: CsiSimConfig,
    storage: StorageSim,
    attachments: Api<VolumeAttachment>,
    volumes: Api<PersistentVolume>,
    /// Per VolumeAttachment UID.
    timers: HashMap<String, AttachmentTimers>,
    /// Volume handle per PV name, remembered so a detach works after the PV is gone.
    handles: HashMap<String, String>,
}

async fn run_attacher(
    client: Client,
    config: CsiSimConfig,
    storage: StorageSim,
    cancel: CancellationToken,
) {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let writer = kube::runtime::reflector::store::Writer::<VolumeAttachment>::default();
    let store = writer.as_reader();
    let changed = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch_into(attachments.clone(), writer, changed.clone()));
    let mut attacher = Attacher {
        config,
        storage,
        attachments,
        volumes: Api::all(client),
        timers: HashMap::new(),
        handles: HashMap::new(),
    };
    tracing::info!(driver = %attacher.config.driver_name, "simulated CSI attacher started");
    let mut wait = attacher.config.resync_interval;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
            _ = changed.notified() => {}
        }
        let all: Vec<VolumeAttachment> = store.state().iter().map(|v| (**v).clone()).collect();
        wait = attacher.reconcile_all(all).await;
    }
    watch.abort();
}

async fn watch_into<K>(
    api: Api<K>,
    writer: kube::runtime::reflector::store::Writer<K>,
    changed: Arc<tokio::sync::Notify>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    let stream = kube::runtime::reflector(
        writer,
        kube::runtime::watcher(api, kube::runtime::watcher::Config::default()),
    )
    .default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        if event.is_ok() {
            changed.notify_one();
        }
    }
}

impl Attacher {
    /// Handles every VolumeAttachment of the driver; returns how long to sleep at most.
    async fn reconcile_all(&mut self, all: Vec<VolumeAttachment>) -> Duration {
        let now = Instant::now();
        let mut next = now + self.config.resync_interval;
        let mut seen = HashSet::new();
        let driver = self.config.driver_name.clone();
        for va in all.iter().filter(|va| va.spec.attacher == driver) {
            let Some(uid) = va.metadata.uid.clone() else {
                continue;
            };
            seen.insert(uid.clone());
            let view = view_of(va);
            let timers = self.timers.entry(uid.clone()).or_default();
            if view.deleting {
                timers.deleting_since.get_or_insert(now);
            } else if !view.attached {
                timers.attach_wanted_since.get_or_insert(now);
            }
            let action = attacher_action(view, *timers, now, &self.config);
            let name = va.metadata.name.clone().unwrap_or_default();
            let result = match action {
                AttacherAction::Nothing => Ok(()),
                AttacherAction::WaitUntil(at) => {
                    next = next.min(at);
                    Ok(())
                }
                AttacherAction::AddFinalizer => self.set_finalizer(va, true).await,
                AttacherAction::Attach => self.attach(va).await,
                AttacherAction::DetachAndRelease => self.detach(va).await,
            };
            if let Err(e) = result {
                tracing::warn!(volume_attachment = %name, error = %e, "simulated attacher step failed; retrying");
            }
        }
        self.timers.retain(|uid, _| seen.contains(uid));
        next.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(20))
    }

    async fn volume_handle(&mut self, va: &VolumeAttachment) -> Result<String, String> {
        if let Some(inline) = va
            .spec
            .source
            .inline_volume_spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
        {
            return Ok(inline.volume_handle.clone());
        }
        let pv_name = va
            .spec
            .source
            .persistent_volume_name
            .clone()
            .ok_or("VolumeAttachment names neither a PV nor an inline volume")?;
        if let Some(handle) = self.handles.get(&pv_name) {
            return Ok(handle.clone());
        }
        let pv = self
            .volumes
            .get(&pv_name)
            .await
            .map_err(|e| format!("reading PersistentVolume {pv_name}: {e}"))?;
        let handle = pv
            .spec
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle)
            .ok_or_else(|| format!("PersistentVolume {pv_name} has no CSI source"))?;
        self.handles.insert(pv_name, handle.clone());
        Ok(handle)
    }

    async fn attach(&mut self, va: &VolumeAttachment) -> Result<(), String> {
        let name = va.metadata.name.clone().unwrap_or_default();
        let node = va.spec.node_name.clone();
        let handle = self.volume_handle(va).await?;
        let status = match self.storage.attach(&handle, &node) {
            Ok(()) => {
                tracing::info!(volume = %handle, %node, volume_attachment = %name, "volume attached");
                json!({ "status": { "attached": true, "attachError": null } })
            }
            Err(refused) => {
                let uid = va.metadata.uid.clone().unwrap_or_default();
                let retry_at = Instant::now() + self.config.attach_retry_interval;
                self.timers.entry(uid).or_default().retry_at = Some(retry_at);
                tracing::info!(volume = %handle, %node, error = %refused, "storage refused the attach; retrying later");
                json!({ "status": { "attached": false, "attachError": {
                    "time": Timestamp::now().to_string(), "message": refused.to_string() } } })
            }
        };
        self.attachments
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| format!("updating the status of VolumeAttachment {name}: {e}"))?;
        Ok(())
    }

    async fn detach(&mut self, va: &VolumeAttachment) -> Result<(), String> {
        let node = va.spec.node_name.clone();
        match self.volume_handle(va).await {
            Ok(handle) => {
                let was = self.storage.detach(&handle, &node);
                tracing::info!(volume = %handle, %node, was_attached = was, "volume detached");
            }
            // Nothing can be detached without knowing the volume; releasing the object is
            // still right (the storage never attached what it could not name).
            Err(e) => tracing::warn!(%node, error = %e, "detaching an unknown volume"),
        }
        self.set_finalizer(va, false).await
    }

    async fn set_finalizer(&self, va: &VolumeAttachment, present: bool) -> Result<(), String> {
        let name = va.metadata.name.clone().unwrap_or_default();
        let mut finalizers: Vec<String> = va
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != SIM_ATTACHER_FINALIZER)
            .collect();
        if present {
            finalizers.push(SIM_ATTACHER_FINALIZER.into());
        }
        // The resourceVersion makes this a compare-and-swap: another finalizer changed since
        // is not lost (a 409 is retried at the next pass).
        let patch = json!({ "metadata": {
            "finalizers": finalizers, "resourceVersion": va.metadata.resource_version } });
        match self
            .attachments
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!(
                "updating the finalizers of VolumeAttachment {name}: {e}"
            )),
        }
    }
}

/// Creates a PV for each unbound claim of the class and deletes released PVs of the driver.
async fn run_provisioner(client: Client, config: CsiSimConfig, cancel: CancellationToken) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client);
    let mut provisioned: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(config.resync_interval) => {}
        }
        if let Err(e) = provision_pass(&claims, &volumes, &config, &mut provisioned).await {
            tracing::warn!(error = %e, "simulated provisioner pass failed; retrying");
        }
    }
}

async fn provision_pass(
    claims: &Api<PersistentVolumeClaim>,
    volumes: &Api<PersistentVolume>,
    config: &CsiSimConfig,
    provisioned: &mut HashSet<String>,
) -> Result<(), kube::Error> {
    for claim in claims.list(&ListParams::default()).await?.items {
        let Some(pv) = volume_for_claim(&claim, config) else {
            continue;
        };
        let Some(pv_name) = pv.metadata.name.clone() else {
            continue;
        };
        if provisioned.contains(&pv_name) {
            continue;
        }
        create_if_absent(volumes, &pv).await?;
        tracing::info!(pv = %pv_name, claim = ?claim.metadata.name, "volume provisioned");
        provisioned.insert(pv_name);
    }
    for pv in volumes.list(&ListParams::default()).await?.items {
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == config.driver_name);
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete_policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        if ours && released && delete_policy && pv.metadata.deletion_timestamp.is_none() {
            let name = pv.metadata.name.clone().unwrap_or_default();
            match volumes.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(pv = %name, "released volume deleted"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The PV to create for `claim`: `None` unless it is an unbound, live claim of the class.
pub fn volume_for_claim(
    claim: &PersistentVolumeClaim,
    config: &CsiSimConfig,
) -> Option<PersistentVolume> {
    let spec = claim.spec.as_ref()?;
    if spec.storage_class_name.as_deref() != Some(config.storage_class.as_str())
        || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
        || claim.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let uid = claim.metadata.uid.clone()?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let access_modes = spec
        .access_modes
        .clone()
        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    let pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{uid}"),
            "annotations": BTreeMap::from([(PROVISIONED_BY, config.driver_name.as_str())]),
        },
        "spec": {
            "capacity": { "storage": size },
            "accessModes": access_modes,
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": config.storage_class,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace, "name": claim.metadata.name, "uid": uid,
            },
            "csi": { "driver": config.driver_name, "volumeHandle": format!("vol-{uid}"), "fsType": "ext4" },
        },
    });
    serde_json::from_value(pv).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attacher_action_table() {
        let config = CsiSimConfig {
            attach_delay: Duration::from_secs(1),
            detach_delay: Duration::from_secs(2),
            ..CsiSimConfig::default()
        };
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t3 = t0 + Duration::from_secs(3);
        let view = |has_finalizer, deleting, attached| AttachmentView {
            has_finalizer,
            deleting,
            attached,
        };
        let wanted = AttachmentTimers {
            attach_wanted_since: Some(t0),
            ..Default::default()
        };
        let refused = AttachmentTimers {
            retry_at: Some(t3),
            ..wanted
        };
        let deleting = AttachmentTimers {
            deleting_since: Some(t0),
            ..Default::default()
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, AttachmentView, AttachmentTimers, Instant, AttacherAction)> = vec![
            ("new: finalizer first",           view(false, false, false), wanted, t0, AttacherAction::AddFinalizer),
            ("attach delay not over",          view(true, false, false), wanted, t0, AttacherAction::WaitUntil(t1)),
            ("attach delay over",              view(true, false, false), wanted, t1, AttacherAction::Attach),
            ("refused waits for the retry",    view(true, false, false), refused, t1, AttacherAction::WaitUntil(t3)),
            ("refused retries when due",       view(true, false, false), refused, t3, AttacherAction::Attach),
            ("attached: nothing",              view(true, false, true), wanted, t3, AttacherAction::Nothing),
            ("deleting waits the detach delay", view(true, true, true), deleting, t1, AttacherAction::WaitUntil(t0 + Duration::from_secs(2))),
            ("deleting detaches",              view(true, true, true), deleting, t3, AttacherAction::DetachAndRelease),
            ("deleting, never attached",       view(true, true, false), deleting, t3, AttacherAction::DetachAndRelease),
            ("deleting without our finalizer", view(false, true, false), deleting, t3, AttacherAction::Nothing),
        ];
        for (name, view, timers, now, want) in cases {
            assert_eq!(attacher_action(view, timers, now, &config), want, "{name}");
        }
    }

    #[test]
    fn claims_of_the_class_get_a_csi_volume() {
        let config = CsiSimConfig::default();
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": { "name": "data-db-0", "namespace": "default", "uid": "u1" },
            "spec": { "storageClassName": SIM_STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                      "resources": { "requests": { "storage": "2Gi" } } },
        }))
        .expect("valid claim");
        let pv = volume_for_claim(&claim, &config).expect("a PV for an unbound claim");
        let spec = pv.spec.expect("PV spec");
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u1"));
        assert_eq!(
            spec.csi.as_ref().map(|c| c.volume_handle.as_str()),
            Some("vol-u1")
        );
        assert_eq!(
            spec.csi.as_ref().map(|c| c.driver.as_str()),
            Some(SIM_CSI_DRIVER)
        );
        assert_eq!(spec.claim_ref.and_then(|c| c.uid).as_deref(), Some("u1"));
        assert_eq!(
            spec.capacity
                .and_then(|c| c.get("storage").map(|q| q.0.clone()))
                .as_deref(),
            Some("2Gi")
        );

        let mut bound = claim.clone();
        if let Some(s) = bound.spec.as_mut() {
            s.volume_name = Some("pvc-u1".into());
        }
        assert!(
            volume_for_claim(&bound, &config).is_none(),
            "bound claims are left alone"
        );
        let mut other = claim;
        if let Some(s) = other.spec.as_mut() {
            s.storage_class_name = Some("standard".into());
        }
        assert!(
            volume_for_claim(&other, &config).is_none(),
            "other classes are left alone"
        );
    }
}
