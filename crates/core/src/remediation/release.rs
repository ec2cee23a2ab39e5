//! How a fenced node's workloads are released without deleting the Node (issue 26, part 2):
//! the order of steps for the `ReleaseWorkloads` and `OutOfServiceTaint` strategies, as a pure
//! step function. (`DeleteNode`, the seed's flow, stays in [`super::decide`].)
//!
//! The order, and why:
//! 1. From the power-off request, the Node carries `hostcycle.io/fenced:NoSchedule`, so that
//!    nothing new is scheduled onto a machine being fenced.
//! 2. **Nothing is released before fresh Off evidence** (two readings `Off` after hostcycle's
//!    power-off for this cycle, from the bound BMC). Without it the flow waits and says so; it
//!    never releases on a timeout.
//! 3. `OutOfServiceTaint`: the taint `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
//!    is added only then, marked as hostcycle's; a taint someone else put there is left alone
//!    (and never removed by hostcycle).
//! 4. The node's pods are force-deleted (grace 0): the kubelet that would confirm them is off.
//! 5. `ReleaseWorkloads`: once no pod of the node is left, the Node's `status.volumesInUse` is
//!    cleared — what a cleanly stopped kubelet reports — so the attach/detach controller
//!    detaches at once instead of waiting six minutes. VolumeAttachments are never deleted.
//! 6. The release is complete when no pod and no VolumeAttachment of the node is left; only
//!    then is the host powered on.
//! 7. The taints hostcycle added are removed once the Node is `Ready` again with a new bootID
//!    (a Node that merely reports Ready with the old boot is the same dead run).

/// The strategy a remediation asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseStrategy {
    /// Back up and delete the Node (the seed's flow).
    DeleteNode,
    /// Force-delete the pods and clear `status.volumesInUse`.
    ReleaseWorkloads,
    /// The out-of-service taint, plus force-deleting the pods.
    OutOfServiceTaint,
    /// `OutOfServiceTaint` where the cluster serves it, else `ReleaseWorkloads`.
    Auto,
}

/// The strategy a flow runs, once the cluster is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    DeleteNode,
    ReleaseWorkloads,
    OutOfServiceTaint,
}

impl Release {
    /// The name recorded in a request's status (`status.release`).
    pub fn as_str(self) -> &'static str {
        match self {
            Release::DeleteNode => "DeleteNode",
            Release::ReleaseWorkloads => "ReleaseWorkloads",
            Release::OutOfServiceTaint => "OutOfServiceTaint",
        }
    }

    /// Reads a recorded name back; `None` for anything else.
    pub fn parse(text: &str) -> Option<Release> {
        Some(match text {
            "DeleteNode" => Release::DeleteNode,
            "ReleaseWorkloads" => Release::ReleaseWorkloads,
            "OutOfServiceTaint" => Release::OutOfServiceTaint,
            _ => return None,
        })
    }

    /// Releases the workloads without deleting the Node.
    pub fn keeps_node(self) -> bool {
        self != Release::DeleteNode
    }
}

impl ReleaseStrategy {
    /// Parses the spec's value.
    pub fn parse(text: &str) -> Option<ReleaseStrategy> {
        Some(match text {
            "DeleteNode" => ReleaseStrategy::DeleteNode,
            "ReleaseWorkloads" => ReleaseStrategy::ReleaseWorkloads,
            "OutOfServiceTaint" => ReleaseStrategy::OutOfServiceTaint,
            "Auto" => ReleaseStrategy::Auto,
            _ => return None,
        })
    }

    /// The strategy to run where the out-of-service taint is (or is not) honoured (Kubernetes
    /// 1.28 and later, found by discovery). An explicit `OutOfServiceTaint` on a cluster that
    /// does not honour it is refused rather than silently changed: the taint alone would
    /// release nothing there.
    pub fn resolve(self, out_of_service_served: bool) -> Result<Release, String> {
        match (self, out_of_service_served) {
            (ReleaseStrategy::DeleteNode, _) => Ok(Release::DeleteNode),
            (ReleaseStrategy::ReleaseWorkloads, _) => Ok(Release::ReleaseWorkloads),
            (ReleaseStrategy::OutOfServiceTaint | ReleaseStrategy::Auto, true) => {
                Ok(Release::OutOfServiceTaint)
            }
            (ReleaseStrategy::Auto, false) => Ok(Release::ReleaseWorkloads),
            (ReleaseStrategy::OutOfServiceTaint, false) => Err(
                "strategy OutOfServiceTaint needs Kubernetes 1.28 or later (the \
                 node.kubernetes.io/out-of-service taint); this cluster does not honour it: \
                 use ReleaseWorkloads or Auto"
                    .to_string(),
            ),
        }
    }
}

/// What the controller observed, for one flow that fences with `ReleaseWorkloads` or
/// `OutOfServiceTaint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReleaseFacts {
    /// hostcycle asked for the host's power-off in this cycle.
    pub power_off_requested: bool,
    /// Fresh Off evidence: two readings `Off`, a second apart, after that request, from the
    /// bound BMC.
    pub off_confirmed: bool,
    /// The Node still exists.
    pub node_exists: bool,
    /// `hostcycle.io/fenced:NoSchedule` is on the Node.
    pub fenced_taint: bool,
    /// The out-of-service taint is on the Node, marked as hostcycle's.
    pub out_of_service_ours: bool,
    /// The out-of-service taint is on the Node, put there by someone else.
    pub out_of_service_foreign: bool,
    /// Pods bound to the Node that are not gone.
    pub pods_left: usize,
    /// Entries of the Node's `status.volumesInUse`.
    pub volumes_in_use: usize,
    /// VolumeAttachments of the Node.
    pub attachments_left: usize,
    /// The flow recorded the release as complete (the host may be powered on).
    pub released: bool,
    /// After the power-on: the Node is `Ready` with a bootID other than the fenced run's.
    pub back_with_new_boot: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    AddFencedTaint,
    AddOutOfServiceTaint,
    ForceDeletePods,
    ClearVolumesInUse,
    /// Record the release as complete, then release the power-off so the host powers on.
    RecordReleasedAndPowerOn,
    RemoveFencedTaint,
    RemoveOutOfServiceTaint,
}

/// Why the flow waits (its condition's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseWait {
    /// No fresh Off evidence yet: nothing is released.
    AwaitingOffEvidence,
    /// Pods force-deleted, waiting for them to be gone.
    AwaitingPodsGone,
    /// Waiting for the attach/detach controller to detach the node's volumes.
    AwaitingDetach,
    /// Released and powered on: waiting for the Node to be Ready with a new boot.
    AwaitingNewBoot,
    /// Nothing left to do.
    Done,
}

impl ReleaseWait {
    pub fn reason(self) -> &'static str {
        match self {
            ReleaseWait::AwaitingOffEvidence => "AwaitingOffEvidence",
            ReleaseWait::AwaitingPodsGone => "AwaitingPodsGone",
            ReleaseWait::AwaitingDetach => "AwaitingDetach",
            ReleaseWait::AwaitingNewBoot => "AwaitingNewBoot",
            ReleaseWait::Done => "Released",
        }
    }
}

/// The next steps of a `ReleaseWorkloads` or `OutOfServiceTaint` flow (`DeleteNode` has none
/// here), and what it then waits for.
pub fn next_steps(release: Release, f: &ReleaseFacts) -> (Vec<ReleaseAction>, ReleaseWait) {
    use ReleaseAction as A;
    let mut actions = Vec::new();
    if release == Release::DeleteNode {
        return (actions, ReleaseWait::Done);
    }
    if f.released {
        // After the release only the taints hostcycle added come off, on a new boot.
        if !f.back_with_new_boot {
            return (actions, ReleaseWait::AwaitingNewBoot);
        }
        if f.out_of_service_ours {
            actions.push(A::RemoveOutOfServiceTaint);
        }
        if f.fenced_taint {
            actions.push(A::RemoveFencedTaint);
        }
        return (actions, ReleaseWait::Done);
    }
    if f.power_off_requested && f.node_exists && !f.fenced_taint {
        actions.push(A::AddFencedTaint);
    }
    if !(f.power_off_requested && f.off_confirmed) {
        return (actions, ReleaseWait::AwaitingOffEvidence);
    }
    if release == Release::OutOfServiceTaint
        && f.node_exists
        && !f.out_of_service_ours
        && !f.out_of_service_foreign
    {
        actions.push(A::AddOutOfServiceTaint);
    }
    if f.pods_left > 0 {
        actions.push(A::ForceDeletePods);
        return (actions, ReleaseWait::AwaitingPodsGone);
    }
    if release == Release::ReleaseWorkloads && f.node_exists && f.volumes_in_use > 0 {
        actions.push(A::ClearVolumesInUse);
        return (actions, ReleaseWait::AwaitingDetach);
    }
    if f.attachments_left > 0 {
        return (actions, ReleaseWait::AwaitingDetach);
    }
    actions.push(A::RecordReleasedAndPowerOn);
    (actions, ReleaseWait::AwaitingNewBoot)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ReleaseAction as A;
    use ReleaseWait as W;

    #[test]
    fn strategies_resolve_by_what_the_cluster_serves() {
        use ReleaseStrategy as S;
        #[rustfmt::skip]
        let cases = [
            (S::Auto, true, Ok(Release::OutOfServiceTaint)),
            (S::Auto, false, Ok(Release::ReleaseWorkloads)),
            (S::OutOfServiceTaint, true, Ok(Release::OutOfServiceTaint)),
            (S::ReleaseWorkloads, true, Ok(Release::ReleaseWorkloads)),
            (S::DeleteNode, true, Ok(Release::DeleteNode)),
            (S::DeleteNode, false, Ok(Release::DeleteNode)),
        ];
        for (strategy, served, want) in cases {
            assert_eq!(strategy.resolve(served), want, "{strategy:?} {served}");
        }
        let refused = S::OutOfServiceTaint.resolve(false).unwrap_err();
        assert!(refused.contains("1.28"), "{refused}");
        for text in [
            "DeleteNode",
            "ReleaseWorkloads",
            "OutOfServiceTaint",
            "Auto",
        ] {
            assert!(ReleaseStrategy::parse(text).is_some(), "{text}");
        }
        assert_eq!(ReleaseStrategy::parse("auto"), None);
    }

    fn fenced() -> ReleaseFacts {
        ReleaseFacts {
            power_off_requested: true,
            node_exists: true,
            fenced_taint: true,
            pods_left: 3,
            volumes_in_use: 2,
            attachments_left: 2,
            ..ReleaseFacts::default()
        }
    }

    #[test]
    fn release_steps_in_order() {
        let off = ReleaseFacts {
            off_confirmed: true,
            ..fenced()
        };
        let pods_gone = ReleaseFacts {
            pods_left: 0,
            ..off
        };
        let unused = ReleaseFacts {
            volumes_in_use: 0,
            ..pods_gone
        };
        let detached = ReleaseFacts {
            attachments_left: 0,
            ..unused
        };
        let released = ReleaseFacts {
            released: true,
            ..detached
        };
        let back = ReleaseFacts {
            back_with_new_boot: true,
            ..released
        };
        let rw = Release::ReleaseWorkloads;
        let oos = Release::OutOfServiceTaint;
        #[rustfmt::skip]
        let cases: Vec<(&str, Release, ReleaseFacts, Vec<ReleaseAction>, ReleaseWait)> = vec![
            ("the power-off request taints the node NoSchedule", rw,
             ReleaseFacts { fenced_taint: false, ..fenced() }, vec![A::AddFencedTaint], W::AwaitingOffEvidence),
            ("no evidence: nothing is released", rw, fenced(), vec![], W::AwaitingOffEvidence),
            ("no evidence: no out-of-service taint either", oos, fenced(), vec![], W::AwaitingOffEvidence),
            ("evidence without our power-off is none", rw,
             ReleaseFacts { power_off_requested: false, off_confirmed: true, ..fenced() }, vec![], W::AwaitingOffEvidence),
            ("off: pods are force-deleted first", rw, off, vec![A::ForceDeletePods], W::AwaitingPodsGone),
            ("off: the out-of-service taint, then the pods", oos, off,
             vec![A::AddOutOfServiceTaint, A::ForceDeletePods], W::AwaitingPodsGone),
            ("a foreign out-of-service taint is not claimed", oos,
             ReleaseFacts { out_of_service_foreign: true, ..off }, vec![A::ForceDeletePods], W::AwaitingPodsGone),
            ("pods gone: volumesInUse cleared", rw, pods_gone, vec![A::ClearVolumesInUse], W::AwaitingDetach),
            ("the taint strategy leaves volumesInUse to Kubernetes", oos,
             ReleaseFacts { out_of_service_ours: true, ..pods_gone }, vec![], W::AwaitingDetach),
            ("waiting for the detach; attachments are never deleted", rw, unused, vec![], W::AwaitingDetach),
            ("all released: then the power-on", rw, detached, vec![A::RecordReleasedAndPowerOn], W::AwaitingNewBoot),
            ("a Node deleted meanwhile: nothing to taint or clear", rw,
             ReleaseFacts { node_exists: false, fenced_taint: false, ..pods_gone }, vec![], W::AwaitingDetach),
            ("released: taints stay until a new boot", oos,
             ReleaseFacts { out_of_service_ours: true, ..released }, vec![], W::AwaitingNewBoot),
            ("back with a new boot: our taints come off", oos,
             ReleaseFacts { out_of_service_ours: true, ..back },
             vec![A::RemoveOutOfServiceTaint, A::RemoveFencedTaint], W::Done),
            ("back: a foreign out-of-service taint stays", oos,
             ReleaseFacts { out_of_service_foreign: true, ..back }, vec![A::RemoveFencedTaint], W::Done),
            ("DeleteNode has no steps here", Release::DeleteNode, off, vec![], W::Done),
        ];
        for (name, release, facts, actions, wait) in cases {
            assert_eq!(next_steps(release, &facts), (actions, wait), "{name}");
        }
    }

    /// Whatever the facts, nothing is released and the host is never powered on without
    /// fresh Off evidence after hostcycle's own power-off.
    #[test]
    fn nothing_is_released_without_evidence_whatever_the_facts() {
        for bits in 0u32..(1 << 9) {
            let b = |i: u32| bits & (1 << i) != 0;
            let facts = ReleaseFacts {
                power_off_requested: b(0),
                off_confirmed: b(1),
                node_exists: b(2),
                fenced_taint: b(3),
                out_of_service_ours: b(4),
                out_of_service_foreign: b(5),
                pods_left: usize::from(b(6)),
                volumes_in_use: usize::from(b(7)),
                attachments_left: usize::from(b(8)),
                released: false,
                back_with_new_boot: false,
            };
            for release in [Release::ReleaseWorkloads, Release::OutOfServiceTaint] {
                let (actions, _) = next_steps(release, &facts);
                if !(facts.power_off_requested && facts.off_confirmed) {
                    assert!(
                        actions.iter().all(|a| *a == A::AddFencedTaint),
                        "{release:?} {facts:?}: {actions:?}"
                    );
                }
                if actions.contains(&A::RecordReleasedAndPowerOn) {
                    assert!(
                        facts.pods_left == 0 && facts.attachments_left == 0,
                        "{facts:?}"
                    );
                }
                assert!(
                    !actions.contains(&A::RemoveOutOfServiceTaint)
                        && !actions.contains(&A::RemoveFencedTaint),
                    "taints come off only after the release: {facts:?}"
                );
            }
        }
    }
}
