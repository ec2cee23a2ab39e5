//! The release strategies that keep the Node (`ReleaseWorkloads`, `OutOfServiceTaint`)
//! through the remediation's `decide`: tables (one observation in, the decision out), a
//! whole flow replayed against a small world, and a property: nothing is released — no pod
//! force-deleted, no `volumesInUse` cleared, no out-of-service taint added, no power-on — before
//! the host is confirmed off by readings from the bound BMC after this cycle's power-off.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hostcycle_api::queue::HostReference;
use hostcycle_api::reasons::remediation::event_reason as ev;
use hostcycle_api::remediation::{
    FENCED_TAINT_KEY, OUT_OF_SERVICE_OURS_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY, RemediationStep,
    TaintBackup,
};
use hostcycle_core::binding::BoundHost;
use hostcycle_core::remediation::release::{Release, ReleaseAction as RA, ReleaseStrategy};
use hostcycle_core::remediation::{
    Action, Decision, Escalation, Observation, Record, RemediationHostView, RemediationNodeView,
    Trigger, Workloads, decide, left_off, needs_workloads, off_confirmed,
};
use jiff::Timestamp;
use proptest::prelude::*;

const NODE: &str = "worker-0";
const HOST: &str = "machines/host-0";
const HOST_UID: &str = "0b5e-host-uid";

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600 + s).unwrap()
}

fn bound() -> BoundHost {
    BoundHost {
        reference: HostReference {
            namespace: "machines".into(),
            name: "host-0".into(),
        },
        uid: HOST_UID.into(),
    }
}

fn taint(key: &str, effect: &str) -> TaintBackup {
    TaintBackup {
        key: key.into(),
        value: None,
        effect: effect.into(),
    }
}

/// The dead node: NotReady, its last boot, the volumes its kubelet last reported.
fn dead_node() -> RemediationNodeView {
    RemediationNodeView {
        ready: false,
        boot_id: Some("boot-1".into()),
        volumes_in_use: 2,
        ..Default::default()
    }
}

fn fenced(mut node: RemediationNodeView) -> RemediationNodeView {
    node.taints.push(taint(FENCED_TAINT_KEY, "NoSchedule"));
    node
}

fn out_of_service_ours(mut node: RemediationNodeView) -> RemediationNodeView {
    node.taints
        .push(taint(OUT_OF_SERVICE_TAINT_KEY, "NoExecute"));
    node.annotations
        .insert(OUT_OF_SERVICE_OURS_ANNOTATION.into(), "uid-r".into());
    node
}

fn host(
    powered_on: Option<bool>,
    power_off_requested: bool,
    readings_from: i64,
) -> RemediationHostView {
    RemediationHostView {
        name: HOST.into(),
        uid: HOST_UID.into(),
        powered_on,
        last_updated: Some(t(readings_from)),
        observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
        spec_bmc: hostcycle_api::ObservedBmc::default(),
        power_off_requested,
        online: true,
        externally_provisioned: false,
        error: None,
        cannot_power_off: None,
        marked_unhealthy: None,
    }
}

/// A request asking for `strategy`, its node alive (before the start).
fn obs(strategy: ReleaseStrategy, served: bool) -> Observation {
    Observation {
        trigger: Trigger::Request,
        requested: true,
        target: Ok(host(Some(true), false, 0)),
        bound: None,
        node_name: Some(NODE.into()),
        node: Some(RemediationNodeView {
            ready: true,
            ..dead_node()
        }),
        record: Record::default(),
        retry_limit: 1,
        power_on_timeout: Duration::from_secs(600),
        power_off_timeout: Duration::from_secs(300),
        slot_free: true,
        queue_reboot_until: None,
        escalation: Escalation::None("a health check's request".into()),
        held_elsewhere: None,
        joined_running: None,
        clock_untrusted: None,
        release_strategy: Ok(strategy),
        out_of_service_served: served,
        workloads: None,
        leave_off: false,
    }
}

/// The record of a flow that started at t(0) with `release`.
fn started(release: Release) -> Record {
    Record {
        step: RemediationStep::PowerOffRequested,
        host: Some(bound()),
        bmc: Some(hostcycle_api::ObservedBmc::default()),
        started_at: Some(t(0)),
        cycle_started_at: Some(t(0)),
        release: Some(release),
        fenced_boot_id: Some("boot-1".into()),
        ..Record::default()
    }
}

/// Mid-flow: `record`, the host as `h`, the node as `node`, the workloads as read.
fn during(
    record: Record,
    h: RemediationHostView,
    node: Option<RemediationNodeView>,
    workloads: Option<Workloads>,
) -> Observation {
    let release = record.release.unwrap_or(Release::DeleteNode);
    Observation {
        record,
        target: Ok(h.clone()),
        bound: Some(h),
        node,
        workloads,
        ..obs(
            match release {
                Release::OutOfServiceTaint => ReleaseStrategy::OutOfServiceTaint,
                Release::ReleaseWorkloads => ReleaseStrategy::ReleaseWorkloads,
                Release::DeleteNode => ReleaseStrategy::DeleteNode,
            },
            release == Release::OutOfServiceTaint,
        )
    }
}

fn off() -> RemediationHostView {
    // Readings Off since after the request at t(0).
    host(Some(false), true, 5)
}

fn releases(d: &Decision) -> Vec<RA> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Release(r) => Some(*r),
            _ => None,
        })
        .collect()
}

fn reasons(d: &Decision) -> Vec<&'static str> {
    d.events.iter().map(|e| e.reason).collect()
}

/// The steps that release workloads (irreversible); `AddFencedTaint` and the removals are not.
fn releasing(a: &Action) -> bool {
    matches!(
        a,
        Action::Release(RA::ForceDeletePods | RA::ClearVolumesInUse | RA::AddOutOfServiceTaint)
            | Action::DeleteNode
    )
}

#[test]
fn the_start_binds_the_strategy_and_the_fenced_boot_and_taints_the_node() {
    for (strategy, served, want) in [
        (
            ReleaseStrategy::ReleaseWorkloads,
            false,
            Release::ReleaseWorkloads,
        ),
        (ReleaseStrategy::Auto, false, Release::ReleaseWorkloads),
        (ReleaseStrategy::Auto, true, Release::OutOfServiceTaint),
        (
            ReleaseStrategy::OutOfServiceTaint,
            true,
            Release::OutOfServiceTaint,
        ),
    ] {
        let d = decide(&obs(strategy, served), t(0));
        let record = d.record.expect("the start is recorded");
        assert_eq!(record.step, RemediationStep::PowerOffRequested);
        assert_eq!(record.release, Some(want), "{strategy:?} served={served}");
        assert_eq!(record.fenced_boot_id.as_deref(), Some("boot-1"));
        assert_eq!(
            d.actions,
            vec![Action::RequestPowerOff, Action::Release(RA::AddFencedTaint)],
            "{strategy:?}"
        );
    }
    // DeleteNode: the seed's flow, no taint.
    let d = decide(&obs(ReleaseStrategy::DeleteNode, true), t(0));
    assert_eq!(d.actions, vec![Action::RequestPowerOff]);
    assert_eq!(d.record.unwrap().release, Some(Release::DeleteNode));
}

#[test]
fn an_out_of_service_taint_the_cluster_does_not_honour_blocks_the_start() {
    let d = decide(&obs(ReleaseStrategy::OutOfServiceTaint, false), t(0));
    assert!(d.record.is_none(), "{d:#?}");
    assert!(d.actions.is_empty(), "{d:#?}");
    assert_eq!(d.blocked, Some(ev::STRATEGY_UNAVAILABLE));
    assert!(d.message.contains("1.28"), "{}", d.message);
    let mut unknown = obs(ReleaseStrategy::Auto, true);
    unknown.release_strategy = Err("spec.strategy.release \"Teleport\" is unknown".into());
    let d = decide(&unknown, t(0));
    assert!(d.actions.is_empty() && d.record.is_none(), "{d:#?}");
    assert_eq!(d.blocked, Some(ev::STRATEGY_UNAVAILABLE));
}

#[test]
fn release_steps_in_order_on_fresh_off_evidence() {
    let rw = started(Release::ReleaseWorkloads);
    let oos = started(Release::OutOfServiceTaint);
    let w = |pods, attachments| Some(Workloads { pods, attachments });
    struct Case {
        name: &'static str,
        obs: Observation,
        releases: Vec<RA>,
        step: Option<RemediationStep>,
        events: Vec<&'static str>,
    }
    let cases = vec![
        Case {
            name: "still on: only the fenced taint, kept",
            obs: during(
                rw.clone(),
                host(Some(true), true, 5),
                Some(dead_node()),
                w(3, 1),
            ),
            releases: vec![RA::AddFencedTaint],
            step: None,
            events: vec![],
        },
        Case {
            name: "Off, but read before the request: nothing released",
            obs: during(
                rw.clone(),
                host(Some(false), true, -5),
                Some(fenced(dead_node())),
                w(3, 1),
            ),
            releases: vec![],
            step: None,
            events: vec![],
        },
        Case {
            name: "Off, fresh, workloads not read yet: the power-off time is recorded, nothing released",
            obs: during(rw.clone(), off(), Some(fenced(dead_node())), None),
            releases: vec![],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF],
        },
        Case {
            name: "Off, fresh, pods left: force-delete them (release begins)",
            obs: during(rw.clone(), off(), Some(fenced(dead_node())), w(3, 1)),
            releases: vec![RA::ForceDeletePods],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF, ev::RELEASING_WORKLOADS],
        },
        Case {
            name: "pods gone, volumesInUse left: clear it",
            obs: during(rw.clone(), off(), Some(fenced(dead_node())), w(0, 1)),
            releases: vec![RA::ClearVolumesInUse],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF, ev::RELEASING_WORKLOADS],
        },
        Case {
            name: "volumesInUse cleared, an attachment left: wait for the detach",
            obs: during(
                rw.clone(),
                off(),
                Some(RemediationNodeView {
                    volumes_in_use: 0,
                    ..fenced(dead_node())
                }),
                w(0, 1),
            ),
            releases: vec![],
            step: Some(RemediationStep::PowerOffRequested),
            // Nothing done this round: the release has not begun (a withdrawal still cancels).
            events: vec![ev::POWERED_OFF],
        },
        Case {
            name: "nothing left: released, the power-on follows",
            obs: during(
                rw.clone(),
                off(),
                Some(RemediationNodeView {
                    volumes_in_use: 0,
                    ..fenced(dead_node())
                }),
                w(0, 0),
            ),
            releases: vec![],
            step: Some(RemediationStep::NodeReleased),
            events: vec![
                ev::POWERED_OFF,
                ev::RELEASING_WORKLOADS,
                ev::WORKLOADS_RELEASED,
            ],
        },
        Case {
            name: "out-of-service: the taint and the pods' deletion on the evidence",
            obs: during(oos.clone(), off(), Some(fenced(dead_node())), w(2, 1)),
            releases: vec![RA::AddOutOfServiceTaint, RA::ForceDeletePods],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF, ev::RELEASING_WORKLOADS],
        },
        Case {
            name: "out-of-service put there by someone else: not added again (and never ours)",
            obs: during(
                oos.clone(),
                off(),
                Some({
                    let mut n = fenced(dead_node());
                    n.taints.push(taint(OUT_OF_SERVICE_TAINT_KEY, "NoExecute"));
                    n
                }),
                w(2, 1),
            ),
            releases: vec![RA::ForceDeletePods],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF, ev::RELEASING_WORKLOADS],
        },
        Case {
            name: "out-of-service: volumesInUse is left to Kubernetes; attachments awaited",
            obs: during(
                oos.clone(),
                off(),
                Some(out_of_service_ours(fenced(dead_node()))),
                w(0, 1),
            ),
            releases: vec![],
            step: Some(RemediationStep::PowerOffRequested),
            events: vec![ev::POWERED_OFF],
        },
    ];
    for case in cases {
        let d = decide(&case.obs, t(10));
        assert_eq!(
            releases(&d),
            case.releases,
            "{}: releases\n{d:#?}",
            case.name
        );
        assert_eq!(
            d.record.as_ref().map(|r| r.step),
            case.step,
            "{}: step\n{d:#?}",
            case.name
        );
        assert_eq!(reasons(&d), case.events, "{}: events\n{d:#?}", case.name);
        assert!(
            !d.actions.contains(&Action::DeleteNode),
            "{}: never deletes the Node",
            case.name
        );
    }
}

#[test]
fn withdrawn_before_the_release_the_taint_comes_off_then_the_host_is_released() {
    let rw = started(Release::ReleaseWorkloads);
    let mut o = during(
        rw.clone(),
        host(Some(true), true, 5),
        Some(fenced(dead_node())),
        None,
    );
    o.requested = false;
    let d = decide(&o, t(10));
    assert_eq!(
        d.actions,
        vec![Action::Release(RA::RemoveFencedTaint)],
        "{d:#?}"
    );
    assert!(d.record.is_none(), "the record waits for the taint: {d:#?}");
    o.node = Some(dead_node());
    let d = decide(&o, t(11));
    assert_eq!(d.actions, vec![Action::ReleasePowerOff], "{d:#?}");
    assert_eq!(d.record.unwrap().step, RemediationStep::Cancelled);
    // Once the release began, a withdrawal no longer cancels: the flow finishes.
    let begun = Record {
        release_started_at: Some(t(6)),
        ..rw
    };
    let mut o = during(
        begun,
        off(),
        Some(fenced(dead_node())),
        Some(Workloads {
            pods: 1,
            attachments: 1,
        }),
    );
    o.requested = false;
    let d = decide(&o, t(12));
    assert_eq!(releases(&d), vec![RA::ForceDeletePods], "{d:#?}");
}

#[test]
fn the_node_is_back_only_with_a_new_boot_and_then_loses_only_our_taints() {
    let waiting = Record {
        step: RemediationStep::PowerOnRequested,
        powered_off_at: Some(t(5)),
        node_released_at: Some(t(20)),
        release_started_at: Some(t(6)),
        power_on_timeout_at: Some(t(600)),
        ..started(Release::OutOfServiceTaint)
    };
    let on = host(Some(true), false, 30);
    let ready_old_boot = RemediationNodeView {
        ready: true,
        ..out_of_service_ours(fenced(dead_node()))
    };
    let d = decide(
        &during(waiting.clone(), on.clone(), Some(ready_old_boot), None),
        t(40),
    );
    assert!(
        d.record.is_none() && releases(&d).is_empty(),
        "same boot is the same run: {d:#?}"
    );
    assert!(d.message.contains("new boot"), "{}", d.message);
    // A lost fenced taint is put back while the node is not back.
    let d = decide(
        &during(waiting.clone(), on.clone(), Some(dead_node()), None),
        t(40),
    );
    assert_eq!(releases(&d), vec![RA::AddFencedTaint], "{d:#?}");
    let new_boot = RemediationNodeView {
        ready: true,
        boot_id: Some("boot-2".into()),
        volumes_in_use: 0,
        ..out_of_service_ours(fenced(dead_node()))
    };
    let d = decide(
        &during(waiting.clone(), on.clone(), Some(new_boot.clone()), None),
        t(40),
    );
    assert_eq!(
        releases(&d),
        vec![RA::RemoveOutOfServiceTaint, RA::RemoveFencedTaint],
        "{d:#?}"
    );
    assert!(
        d.record.is_none(),
        "the flow ends only once the taints are off: {d:#?}"
    );
    // Someone else's out-of-service taint stays.
    let foreign = RemediationNodeView {
        taints: vec![taint(OUT_OF_SERVICE_TAINT_KEY, "NoExecute")],
        annotations: Default::default(),
        ..new_boot
    };
    let d = decide(&during(waiting, on, Some(foreign), None), t(41));
    assert!(releases(&d).is_empty(), "{d:#?}");
    assert_eq!(d.record.unwrap().step, RemediationStep::Done);
    assert_eq!(
        reasons(&decide(&obs(ReleaseStrategy::Auto, true), t(0)))[0],
        ev::STARTED
    );
}

// ---------------------------------------------------------------------------------------
// A whole flow against a small world: the BMC follows the power-off, pods go when deleted,
// the attach/detach controller detaches once the pods are gone and volumesInUse is clear.

#[derive(Clone)]
struct World {
    obs: Observation,
    /// The BMC's state and when the host controller's run of Off readings began.
    on: bool,
    requested_off: bool,
    pods: usize,
    attachments: usize,
    oos_served: bool,
    log: Vec<Action>,
}

impl World {
    fn new(strategy: ReleaseStrategy, oos_served: bool) -> World {
        World {
            obs: obs(strategy, oos_served),
            on: true,
            requested_off: false,
            pods: 3,
            attachments: 2,
            oos_served,
            log: Vec::new(),
        }
    }

    /// Rounds one second apart from t(1) until the record reaches `step`; returns the last
    /// round's time.
    fn run_until(&mut self, step: RemediationStep) -> i64 {
        let mut now = 0;
        while self.obs.record.step != step {
            now += 1;
            assert!(
                now < 100,
                "stuck at {:?} on the way to {step:?}\n{:#?}",
                self.obs.record,
                self.log
            );
            self.round(now);
        }
        now
    }

    fn round(&mut self, now: i64) -> Decision {
        let mut o = self.obs.clone();
        let readings = host(Some(self.on), self.requested_off, now - 1);
        if o.record.host.is_some() {
            o.bound = Some(readings.clone());
        }
        o.target = Ok(readings);
        o.workloads = Some(Workloads {
            pods: self.pods,
            attachments: self.attachments,
        });
        let d = decide(&o, t(now));
        if let Some(r) = &d.record {
            self.obs.record = r.clone();
        }
        for a in &d.actions {
            self.log.push(a.clone());
            let node = self.obs.node.as_mut().unwrap();
            match a {
                Action::RequestPowerOff => self.requested_off = true,
                Action::ReleasePowerOff => self.requested_off = false,
                Action::Release(RA::AddFencedTaint) => {
                    node.taints.push(taint(FENCED_TAINT_KEY, "NoSchedule"))
                }
                Action::Release(RA::RemoveFencedTaint) => {
                    node.taints.retain(|t| t.key != FENCED_TAINT_KEY)
                }
                Action::Release(RA::AddOutOfServiceTaint) => {
                    *node = out_of_service_ours(node.clone())
                }
                Action::Release(RA::RemoveOutOfServiceTaint) => {
                    node.taints.retain(|t| t.key != OUT_OF_SERVICE_TAINT_KEY);
                    node.annotations.remove(OUT_OF_SERVICE_OURS_ANNOTATION);
                }
                Action::Release(RA::ForceDeletePods) => self.pods = 0,
                Action::Release(RA::ClearVolumesInUse) => node.volumes_in_use = 0,
                other => panic!("unexpected {other:?}"),
            }
        }
        // The world moves: the BMC follows the request, the kubelet dies with the power and
        // boots anew after it; the ADC detaches released volumes (out-of-service: at once).
        self.on = !self.requested_off;
        let node = self.obs.node.as_mut().unwrap();
        let oos = self.oos_served && node.out_of_service().0;
        if self.pods == 0 && (node.volumes_in_use == 0 || oos) {
            self.attachments = 0;
        }
        if self.on && self.obs.record.step == RemediationStep::PowerOnRequested {
            node.ready = true;
            node.boot_id = Some("boot-2".into());
            node.volumes_in_use = 0;
        } else if !self.on {
            node.ready = false;
        }
        d
    }
}

/// The strategies that keep the Node, each with whether the cluster serves the
/// out-of-service taint (`Auto` resolves to it only where served).
const KEPT_NODE_STRATEGIES: [(ReleaseStrategy, bool); 2] = [
    (ReleaseStrategy::ReleaseWorkloads, false),
    (ReleaseStrategy::Auto, true),
];

#[test]
fn whole_flows_release_power_on_and_clean_up_in_order() {
    for (strategy, served) in KEPT_NODE_STRATEGIES {
        let mut w = World::new(strategy, served);
        w.obs.node.as_mut().unwrap().volumes_in_use = 2;
        w.run_until(RemediationStep::Done);
        let position = |want: &Action| w.log.iter().position(|a| a == want);
        let power_on = position(&Action::ReleasePowerOff).expect("powered on");
        let force = position(&Action::Release(RA::ForceDeletePods)).expect("pods deleted");
        assert!(force < power_on, "{strategy:?}: {:#?}", w.log);
        assert!(
            w.obs.node.as_ref().unwrap().taints.is_empty(),
            "{strategy:?}: our taints are gone"
        );
        assert!(!w.log.contains(&Action::DeleteNode));
        assert_eq!(w.pods, 0);
    }
}

/// The controller reads the node's pods and VolumeAttachments (two live LISTs) only when
/// `decide` can release: a flow that keeps the Node, not yet released, its host confirmed off
/// by readings after this cycle's power-off from the bound BMC.
#[test]
fn workloads_are_read_only_when_a_release_can_follow() {
    let released = |r: Release| Record {
        step: RemediationStep::NodeReleased,
        node_released_at: Some(t(7)),
        ..started(r)
    };
    let node = Some(fenced(dead_node()));
    #[rustfmt::skip]
    let rows: Vec<(&str, Record, RemediationHostView, bool)> = vec![
        ("ReleaseWorkloads, off on fresh readings", started(Release::ReleaseWorkloads), off(), true),
        ("OutOfServiceTaint, off on fresh readings", started(Release::OutOfServiceTaint), off(), true),
        ("DeleteNode: the Node is deleted, nothing to read", started(Release::DeleteNode), off(), false),
        ("still on", started(Release::ReleaseWorkloads), host(Some(true), true, 5), false),
        ("Off read before the power-off", started(Release::ReleaseWorkloads), host(Some(false), true, -5), false),
        ("power-off no longer requested", started(Release::ReleaseWorkloads), host(Some(false), false, 5), false),
        ("no reading", started(Release::ReleaseWorkloads), host(None, true, 5), false),
        ("already released", released(Release::ReleaseWorkloads), off(), false),
        ("not started", Record::default(), off(), false),
    ];
    for (name, record, h, want) in rows {
        let o = during(record, h, node.clone(), None);
        assert_eq!(needs_workloads(&o), want, "{name}");
    }
    // Off readings from another BMC than the bound one are not evidence.
    let mut other = off();
    other.observed_bmc = Some(hostcycle_api::ObservedBmc {
        address: "redfish://10.0.0.99/redfish/v1/Systems/1".into(),
        ..hostcycle_api::ObservedBmc::default()
    });
    let o = during(
        started(Release::ReleaseWorkloads),
        other,
        node.clone(),
        None,
    );
    assert!(!needs_workloads(&o), "another BMC's readings");
    // A replaced host (same name, another uid) is not the bound one.
    let mut replaced = off();
    replaced.uid = "another-uid".into();
    let o = during(started(Release::ReleaseWorkloads), replaced, node, None);
    assert!(!needs_workloads(&o), "a replaced host");
}

/// `afterRelease: LeaveOff` (a node that failed again soon after its last remediation): the
/// flow fences and releases as always, then holds the host off — no power-on, however long —
/// and says so; a person resumes it with `PowerOn`, or withdraws the request, and only then is
/// the host powered on. Earlier steps are untouched: the hold begins once released.
#[test]
fn leave_off_holds_the_host_off_after_the_release_until_a_person_resumes() {
    for (strategy, served) in KEPT_NODE_STRATEGIES {
        let mut w = World::new(strategy, served);
        w.obs.leave_off = true;
        let mut now = w.run_until(RemediationStep::NodeReleased);
        assert!(left_off(&w.obs), "{strategy:?}");
        // Held: an hour of rounds powers nothing on and releases nothing more.
        let before = w.log.len();
        for _ in 0..3600 {
            now += 1;
            let d = w.round(now);
            assert_eq!(
                d.record, None,
                "{strategy:?}: the record stays NodeReleased"
            );
            assert!(!d.cannot_fence);
            assert!(
                reasons(&d) == vec![ev::LEFT_OFF],
                "{strategy:?}: {:?}",
                d.events
            );
            assert!(d.message.starts_with("left off:"), "{}", d.message);
        }
        assert_eq!(w.log.len(), before, "{strategy:?}: {:#?}", &w.log[before..]);
        assert!(
            w.requested_off && !w.on,
            "{strategy:?}: the host is still off"
        );

        // A person sets `PowerOn`: the flow goes on and powers the host on.
        for resume in ["PowerOn", "withdrawn"] {
            let mut o = w.obs.clone();
            match resume {
                "PowerOn" => o.leave_off = false,
                _ => o.requested = false,
            }
            assert!(!left_off(&o));
            let mut world = World {
                obs: o,
                log: Vec::new(),
                ..w.clone()
            };
            let d = world.round(now + 1);
            assert_eq!(
                d.actions,
                vec![Action::ReleasePowerOff],
                "{strategy:?}, {resume}: powered on"
            );
            assert_eq!(
                d.record.map(|r| r.step),
                Some(RemediationStep::PowerOnRequested)
            );
        }
    }
    // DeleteNode: the Node is gone, the host is held off all the same.
    let released = Record {
        step: RemediationStep::NodeReleased,
        powered_off_at: Some(t(5)),
        node_released_at: Some(t(6)),
        ..started(Release::DeleteNode)
    };
    let o = Observation {
        leave_off: true,
        ..during(released, off(), None, None)
    };
    let d = decide(&o, t(100));
    assert!(d.actions.is_empty() && d.record.is_none(), "{d:?}");
    assert_eq!(reasons(&d), vec![ev::LEFT_OFF]);
    let d = decide(
        &Observation {
            leave_off: false,
            ..o
        },
        t(100),
    );
    assert_eq!(d.actions, vec![Action::ReleasePowerOff]);

    // Not yet released: LeaveOff changes nothing before the hold.
    let o = Observation {
        leave_off: true,
        ..during(
            started(Release::ReleaseWorkloads),
            off(),
            Some(fenced(dead_node())),
            None,
        )
    };
    assert!(!left_off(&o));
    assert_eq!(
        decide(&o, t(10)),
        decide(
            &Observation {
                leave_off: false,
                ..o.clone()
            },
            t(10)
        )
    );
}

// ---------------------------------------------------------------------------------------
// Property: no release without the evidence.

fn arb_node() -> impl Strategy<Value = Option<RemediationNodeView>> {
    prop::option::of(
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0usize..3,
            prop::option::of(0u8..3),
        )
            .prop_map(|(ready, fenced_taint, oos, volumes_in_use, boot)| {
                let mut n = RemediationNodeView {
                    ready,
                    volumes_in_use,
                    boot_id: boot.map(|b| format!("boot-{b}")),
                    ..Default::default()
                };
                if fenced_taint {
                    n = fenced(n);
                }
                if oos {
                    n = out_of_service_ours(n);
                }
                n
            }),
    )
}

proptest! {
    #[test]
    fn nothing_is_released_without_fresh_off_evidence_from_the_bound_bmc(
        release in prop_oneof![Just(Release::ReleaseWorkloads), Just(Release::OutOfServiceTaint)],
        step in prop_oneof![
            Just(RemediationStep::PowerOffRequested),
            Just(RemediationStep::NodeReleased),
            Just(RemediationStep::PowerOnRequested),
        ],
        powered_on in prop::option::of(any::<bool>()),
        requested_off in any::<bool>(),
        readings_from in -20i64..20,
        other_bmc in any::<bool>(),
        clock_untrusted in any::<bool>(),
        requested in any::<bool>(),
        node in arb_node(),
        pods in 0usize..3,
        attachments in 0usize..3,
        now in 1i64..400,
    ) {
        let mut record = started(release);
        record.step = step;
        let mut h = host(powered_on, requested_off, readings_from);
        if other_bmc {
            h.observed_bmc = Some(hostcycle_api::ObservedBmc {
                address: "redfish://10.0.0.9".into(),
                ..Default::default()
            });
        }
        let mut o = during(record.clone(), h.clone(), node, Some(Workloads { pods, attachments }));
        o.requested = requested;
        if clock_untrusted {
            o.clock_untrusted = Some("skew".into());
        }
        let d = decide(&o, t(now));
        let evidence = off_confirmed(&h, &record) && !clock_untrusted;
        if step == RemediationStep::PowerOffRequested && !evidence {
            prop_assert!(
                !d.actions.iter().any(releasing),
                "released without evidence: {d:#?}"
            );
            prop_assert!(
                d.record.as_ref().is_none_or(|r| r.step != RemediationStep::NodeReleased),
                "recorded released without evidence: {d:#?}"
            );
        }
        prop_assert!(!d.actions.contains(&Action::DeleteNode), "never deletes the Node");
        if d.record.as_ref().is_some_and(|r| r.step == RemediationStep::NodeReleased)
            && record.step == RemediationStep::PowerOffRequested
        {
            prop_assert_eq!((pods, attachments), (0, 0), "powered on with workloads left");
        }
    }
}
