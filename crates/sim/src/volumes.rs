//! The pure part of the simulated kubelet's volume handling: from a snapshot of the node's
//! pods and of the volumes the attach/detach controller reports attached, which volumes the
//! kubelet reports in use and which pods may start.
//!
//! As a real kubelet with `controller-managed-attach-detach`: a pod's CSI volumes are in use
//! from the moment the kubelet wants to mount them until its containers have stopped; a pod
//! starts only once every one of them is listed in the Node's `status.volumesAttached`.

use std::collections::{BTreeMap, BTreeSet};

/// The in-tree plugin name every CSI volume's unique name starts with.
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// Node annotation asking kube-controller-manager's attach/detach controller to attach and
/// detach volumes for the node (a real kubelet sets it at registration by default).
pub const CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The unique volume name a kubelet and the attach/detach controller use for a CSI volume:
/// `kubernetes.io/csi/<driver>^<volumeHandle>`.
pub fn csi_unique_name(driver: &str, volume_handle: &str) -> String {
    format!("{CSI_PLUGIN_NAME}/{driver}^{volume_handle}")
}

/// One CSI volume a pod mounts, resolved from its claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CsiVolume {
    pub driver: String,
    pub volume_handle: String,
}

impl CsiVolume {
    pub fn unique_name(&self) -> String {
        csi_unique_name(&self.driver, &self.volume_handle)
    }
}

/// What the kubelet knows of one pod bound to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVolumes {
    pub pod_uid: String,
    /// The pod's CSI volumes; `None` while one of its claims is not bound yet (the pod waits,
    /// and nothing is mounted). Pods without CSI volumes have `Some(empty)`.
    pub csi_volumes: Option<Vec<CsiVolume>>,
    /// The pod's containers have stopped (it is being finalized): its volumes are unmounted.
    pub stopped: bool,
}

/// What the kubelet should report and do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumePlan {
    /// The Node's `status.volumesInUse`.
    pub volumes_in_use: BTreeSet<String>,
    /// Pods whose volumes are all attached (or that have none): they may run.
    pub may_start: BTreeSet<String>,
    /// Pods waiting for volumes, with the unique names not yet attached (empty while a claim
    /// is still unbound).
    pub waiting: BTreeMap<String, Vec<String>>,
}

/// Computes the plan from the pods and the Node's `status.volumesAttached` names.
pub fn plan_volumes(pods: &[PodVolumes], attached: &BTreeSet<String>) -> VolumePlan {
    let mut plan = VolumePlan::default();
    for pod in pods.iter().filter(|p| !p.stopped) {
        let Some(volumes) = &pod.csi_volumes else {
            plan.waiting.insert(pod.pod_uid.clone(), Vec::new());
            continue;
        };
        let names: Vec<String> = volumes.iter().map(CsiVolume::unique_name).collect();
        let missing: Vec<String> = names
            .iter()
            .filter(|n| !attached.contains(*n))
            .cloned()
            .collect();
        plan.volumes_in_use.extend(names);
        if missing.is_empty() {
            plan.may_start.insert(pod.pod_uid.clone());
        } else {
            plan.waiting.insert(pod.pod_uid.clone(), missing);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(handle: &str) -> CsiVolume {
        CsiVolume {
            driver: "d".into(),
            volume_handle: handle.into(),
        }
    }

    fn pod(uid: &str, volumes: Option<&[&str]>, stopped: bool) -> PodVolumes {
        PodVolumes {
            pod_uid: uid.into(),
            csi_volumes: volumes.map(|v| v.iter().map(|h| vol(h)).collect()),
            stopped,
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|h| csi_unique_name("d", h)).collect()
    }

    #[test]
    fn unique_names_follow_the_csi_plugin() {
        assert_eq!(
            csi_unique_name("sim.csi.hostcycle.io", "vol-1"),
            "kubernetes.io/csi/sim.csi.hostcycle.io^vol-1"
        );
    }

    #[test]
    fn table() {
        type Names = &'static [&'static str];
        /// name, pods, attached, want in use, want may start, want waiting
        type Case = (&'static str, Vec<PodVolumes>, Names, Names, Names, Names);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            // name, pods, attached, want in use, want may start, want waiting
            ("no volumes starts at once",     vec![pod("p", Some(&[]), false)], &[], &[], &["p"], &[]),
            ("unbound claim waits, not in use", vec![pod("p", None, false)], &[], &[], &[], &["p"]),
            ("in use before attached",        vec![pod("p", Some(&["v1"]), false)], &[], &["v1"], &[], &["p"]),
            ("attached starts",               vec![pod("p", Some(&["v1"]), false)], &["v1"], &["v1"], &["p"], &[]),
            ("all volumes needed",            vec![pod("p", Some(&["v1", "v2"]), false)], &["v1"], &["v1", "v2"], &[], &["p"]),
            ("stopped pod releases",          vec![pod("p", Some(&["v1"]), true)], &["v1"], &[], &[], &[]),
            ("two pods, one stopped",         vec![pod("p", Some(&["v1"]), true), pod("q", Some(&["v2"]), false)], &["v1", "v2"], &["v2"], &["q"], &[]),
            ("shared volume stays in use",    vec![pod("p", Some(&["v1"]), true), pod("q", Some(&["v1"]), false)], &["v1"], &["v1"], &["q"], &[]),
        ];
        for (name, pods, attached, in_use, may_start, waiting) in cases {
            let plan = plan_volumes(&pods, &set(attached));
            assert_eq!(plan.volumes_in_use, set(in_use), "{name}: in use");
            let starts: BTreeSet<String> = may_start.iter().map(|s| s.to_string()).collect();
            assert_eq!(plan.may_start, starts, "{name}: may start");
            let waits: Vec<&str> = plan.waiting.keys().map(String::as_str).collect();
            assert_eq!(waits, waiting, "{name}: waiting");
        }
    }
}
