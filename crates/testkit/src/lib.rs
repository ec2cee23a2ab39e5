//! Starts and stops the real parts hostcycle is tested against: a Kubernetes control plane
//! (etcd + kube-apiserver + kube-controller-manager + kube-scheduler), BMC emulators and the
//! node simulator, and the CRDs of the objects hostcycle reads but does not own (Machines).
//! Used by end-to-end tests and by `hostcycle lab`.

pub mod bmc_emulators;
pub mod cluster;
pub mod echo_bmc;
pub mod http;
pub mod machines;
pub mod pki;
pub mod process;
pub mod redfish_stub;
pub mod redfish_vendor;

pub use process::{
    ManagedProcess, cache_dir, ensure_port_free, free_port, free_udp_port, require_program,
    venv_bin, wait_until,
};

pub use cluster::{ClusterOptions, LocalCluster, client_from_kubeconfig};
pub use machines::{MachineKind, create_machine, create_machine_object, machine, machine_crds};

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong while starting or driving a test component.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error(
        "{component}: required program {path} is missing; run `scripts/install-prereqs.sh` (or `make test`) to install it"
    )]
    MissingBinary { component: String, path: PathBuf },
    #[error("{component}: could not start {program}: {source}")]
    Spawn {
        component: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{component}: loopback port {port} is already in use; stop whatever holds it or pick another port"
    )]
    PortInUse { component: String, port: u16 },
    #[error("{component} exited early ({status}); its log is {log}:\n{log_tail}", log = .log.display())]
    ComponentExited {
        component: String,
        status: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Other { what: String, message: String },
}

/// A Deployment of `replicas` pause containers labelled `app: <name>`: a workload for
/// simulated nodes (nothing is pulled; the simulator only reports the pods running).
pub fn pause_deployment(name: &str, replicas: i32) -> k8s_openapi::api::apps::v1::Deployment {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    let labels = std::collections::BTreeMap::from([("app".to_string(), name.to_string())]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some("registry.k8s.io/pause:3.2".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A StatefulSet of `replicas` pause containers labelled `app: <name>`, each with a
/// ReadWriteOnce volume `data` (1Gi) claimed from `storage_class` through a
/// volumeClaimTemplate; `node_name` pins its pods to one node (`kubernetes.io/hostname`).
/// A workload for simulated nodes with simulated CSI storage.
pub fn pause_statefulset_with_volume(
    name: &str,
    replicas: i32,
    storage_class: &str,
    node_name: Option<&str>,
) -> k8s_openapi::api::apps::v1::StatefulSet {
    use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
    use k8s_openapi::api::core::v1::{
        Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec,
        VolumeMount, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use std::collections::BTreeMap;
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    let node_selector =
        node_name.map(|n| BTreeMap::from([("kubernetes.io/hostname".to_string(), n.to_string())]));
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name.to_string()),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some("registry.k8s.io/pause:3.2".into()),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "data".into(),
                            mount_path: "/data".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    node_selector,
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: Some(storage_class.to_string()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity("1Gi".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
