//! Remediation at the seams, as tables: the host bound at the start is the only one acted on;
//! "off" counts only in a status written after the power-off request and without error
//! (hostcycle's sub-second `lastUpdated`, metal3's whole seconds); a power-off not confirmed
//! by its deadline gives up and escalates; a host that cannot be powered off takes no slot;
//! an administrator's cordon and taints survive the Node's deletion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::reasons::remediation::event_reason as ev;
use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::{CORDONED_BY_ANNOTATION, HostReference};
use hostcycle_api::remediation::{NodeSpecBackup, RemediationPhase, RemediationStep, TaintBackup};
use hostcycle_core::binding::BoundHost;
use hostcycle_core::evidence::{PowerEvidence, PowerReport, off_since, power_since};
use hostcycle_core::remediation::{
    Acting, Action, Blocker, Escalation, Observation, Record, RemediationHostView,
    RemediationNodeView, Trigger, acting_host, decide, off_confirmed, start_blocker, wants_slot,
};
use jiff::Timestamp;

/// 2025-01-01T00:00:00Z plus `s` seconds.
fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_735_689_600 + s).unwrap()
}

/// `t(s)` plus `ms` milliseconds.
fn tm(s: i64, ms: i64) -> Timestamp {
    t(s) + jiff::SignedDuration::from_millis(ms)
}

const UID: &str = "uid-h1";

fn host(powered_on: bool, last_updated: Timestamp) -> RemediationHostView {
    RemediationHostView {
        name: "metal/h1".into(),
        uid: UID.into(),
        powered_on: Some(powered_on),
        last_updated: Some(last_updated),
        observed_bmc: Some(hostcycle_api::ObservedBmc::default()),
        spec_bmc: hostcycle_api::ObservedBmc::default(),
        power_off_requested: true,
        online: true,
        externally_provisioned: false,
        error: None,
        cannot_power_off: None,
        marked_unhealthy: None,
    }
}

fn bound() -> BoundHost {
    BoundHost {
        reference: HostReference {
            namespace: "metal".into(),
            name: "h1".into(),
        },
        uid: UID.into(),
    }
}

fn taint(key: &str, effect: &str) -> TaintBackup {
    TaintBackup {
        key: key.into(),
        value: None,
        effect: effect.into(),
    }
}

fn node() -> RemediationNodeView {
    RemediationNodeView {
        labels: BTreeMap::from([("a".to_string(), "1".to_string())]),
        annotations: BTreeMap::new(),
        ready: false,
        unschedulable: false,
        taints: Vec::new(),
        boot_id: None,
        volumes_in_use: 0,
    }
}

/// Power-off requested at 0 s (sub-second: 0.5 s), bound to h1.
fn powering_off() -> Record {
    Record {
        step: RemediationStep::PowerOffRequested,
        host: Some(bound()),
        started_at: Some(tm(0, 500)),
        cycle_started_at: Some(tm(0, 500)),
        ..Record::default()
    }
}

fn obs(record: Record, h: Option<RemediationHostView>) -> Observation {
    Observation {
        trigger: Trigger::Request,
        requested: true,
        target: h.clone().ok_or(Blocker::HostNotReferenced),
        bound: h,
        node_name: Some("w1".into()),
        node: Some(node()),
        record,
        retry_limit: 1,
        power_on_timeout: Duration::from_secs(600),
        power_off_timeout: Duration::from_secs(120),
        slot_free: true,
        queue_reboot_until: None,
        escalation: Escalation::MarkOwnerRemediated,
        held_elsewhere: None,
        joined_running: None,
        clock_untrusted: None,
        release_strategy: Ok(hostcycle_core::remediation::release::ReleaseStrategy::DeleteNode),
        out_of_service_served: false,
        workloads: None,
        leave_off: false,
    }
}

#[test]
fn off_counts_only_in_a_status_written_after_the_request_without_error() {
    let since = tm(100, 500);
    let report = |on: Option<bool>, at: Option<Timestamp>, error: Option<&str>| PowerReport {
        powered_on: on,
        last_updated: at,
        error: error.map(str::to_string),
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, PowerReport, PowerEvidence)> = vec![
        ("off, written after (sub-second)", report(Some(false), Some(tm(100, 501)), None), PowerEvidence::Off),
        ("on, written after", report(Some(true), Some(tm(101, 0)), None), PowerEvidence::On),
        ("off, written before the request: stale", report(Some(false), Some(tm(100, 499)), None),
            PowerEvidence::Stale { written_at: Some(tm(100, 499)) }),
        ("off, written at the request's very instant: stale", report(Some(false), Some(since), None),
            PowerEvidence::Stale { written_at: Some(since) }),
        ("off, never stamped: stale", report(Some(false), None, None), PowerEvidence::Stale { written_at: None }),
        ("off and fresh but the controller reports an error", report(Some(false), Some(t(200)), Some("BMC unreachable")),
            PowerEvidence::InError("BMC unreachable".into())),
        ("written after, no power state", report(None, Some(t(200)), None), PowerEvidence::Unknown),
        // metal3 stamps whole seconds: 100 s stands for any moment of that second.
        ("metal3: the request's own second is not after it", report(Some(false), Some(t(100)), None),
            PowerEvidence::Stale { written_at: Some(t(100)) }),
        ("metal3: the next whole second is", report(Some(false), Some(t(101)), None), PowerEvidence::Off),
        ("metal3: an earlier second is not", report(Some(false), Some(t(99)), None),
            PowerEvidence::Stale { written_at: Some(t(99)) }),
    ];
    for (name, r, want) in cases {
        assert_eq!(power_since(&r, since), want, "{name}");
        assert_eq!(off_since(&r, since), want == PowerEvidence::Off, "{name}");
    }
    // A request on a whole second: a whole-second stamp of that second is not after it.
    let whole = t(100);
    assert!(!off_since(&report(Some(false), Some(t(100)), None), whole));
    assert!(off_since(&report(Some(false), Some(t(101)), None), whole));
    assert!(off_since(
        &report(Some(false), Some(tm(100, 1)), None),
        whole
    ));
}

#[test]
fn the_node_is_released_only_on_fresh_evidence() {
    struct Case {
        name: &'static str,
        host: RemediationHostView,
        delete: bool,
        message: &'static str,
    }
    let cases = [
        Case {
            name: "off in a status written after the request → DeleteNode",
            host: host(false, t(5)),
            delete: true,
            message: "deleting node w1",
        },
        Case {
            name: "stale poweredOn: false (written before the request) → kept",
            host: host(false, t(-30)),
            delete: false,
            message: "before the power-off request",
        },
        Case {
            name: "poweredOn: false with the BMC unreachable (an error) → kept",
            host: RemediationHostView {
                error: Some("BMC unreachable".into()),
                ..host(false, t(5))
            },
            delete: false,
            message: "BMC unreachable",
        },
        Case {
            name: "metal3's whole-second stamp of the request's own second → kept",
            host: host(false, t(0)),
            delete: false,
            message: "before the power-off request",
        },
        Case {
            name: "metal3's stamp of the next second → DeleteNode",
            host: host(false, t(1)),
            delete: true,
            message: "deleting node w1",
        },
        Case {
            name: "fresh but on → kept, waiting for the power-off",
            host: host(true, t(5)),
            delete: false,
            message: "waiting for host metal/h1 to power off",
        },
    ];
    for c in cases {
        let o = obs(powering_off(), Some(c.host.clone()));
        let d = decide(&o, t(10));
        assert_eq!(
            d.actions.contains(&Action::DeleteNode),
            c.delete,
            "{}: {d:#?}",
            c.name
        );
        assert_eq!(off_confirmed(&c.host, &o.record), c.delete, "{}", c.name);
        assert!(d.message.contains(c.message), "{}: {}", c.name, d.message);
        if !c.delete {
            assert_eq!(d.record, None, "{}: nothing recorded while waiting", c.name);
            assert!(d.requeue.is_some(), "{}", c.name);
        }
    }
}

/// Issue 24, case 5: at the power-off deadline nothing is deleted, handed back or marked
/// while the host was never confirmed off: the flow holds with `CannotFence` (condition,
/// Warning), keeps the power-off requested, and a person decides.
#[test]
fn a_power_off_not_confirmed_by_its_deadline_holds_with_cannot_fence_and_escalates_nothing() {
    // Deadline: 0.5 s + 120 s.
    for (name, h, why) in [
        (
            "stale readings",
            host(false, t(-30)),
            "before the power-off request",
        ),
        (
            "controller in error",
            RemediationHostView {
                error: Some("BMC unreachable".into()),
                ..host(false, t(60))
            },
            "BMC unreachable",
        ),
        ("still on", host(true, t(60)), "still on"),
        (
            "no readings from the bound BMC",
            RemediationHostView {
                observed_bmc: None,
                ..host(false, t(60))
            },
            "no readings from the bound BMC",
        ),
        (
            "detached",
            RemediationHostView {
                cannot_power_off: Some("is detached (baremetalhost.metal3.io/detached)".into()),
                ..host(false, t(60))
            },
            "detached",
        ),
    ] {
        let before = decide(&obs(powering_off(), Some(h.clone())), t(120));
        assert!(before.record.is_none(), "{name}: waits until the deadline");
        assert!(!before.cannot_fence, "{name}: not held before the deadline");
        for at in [121, 600, 86_400] {
            let d = decide(&obs(powering_off(), Some(h.clone())), t(at));
            assert_eq!(d.record, None, "{name} at {at}: the record is unchanged");
            assert!(d.actions.is_empty(), "{name} at {at}: {d:#?}");
            assert!(d.cannot_fence, "{name} at {at}");
            assert_eq!(d.phase, RemediationPhase::Running, "{name}");
            assert!(d.message.contains(why), "{name}: {}", d.message);
            assert!(
                d.events
                    .iter()
                    .any(|e| e.reason == ev::CANNOT_FENCE && e.is_warning()),
                "{name}"
            );
        }
    }
    // Withdrawn after the backup (deletion decided), not off by the deadline: no escalation.
    let mut o = obs(
        Record {
            labels_backup: Some(BTreeMap::new()),
            annotations_backup: Some(BTreeMap::new()),
            ..powering_off()
        },
        Some(host(false, t(-30))),
    );
    o.requested = false;
    let d = decide(&o, t(200));
    assert_eq!(d.actions, vec![Action::ReleasePowerOff]);
}

/// Issue 24, cases 1 and 2: a host whose BMC changed under the flow (address, Secret or the
/// identity the BMC reports), or whose readings come from another BMC, is never confirmed
/// off: the Node is kept, with a Warning naming the change.
#[test]
fn readings_count_only_from_the_bmc_the_flow_bound() {
    let bmc = |address: &str, identity: Option<&str>| hostcycle_api::ObservedBmc {
        address: address.into(),
        credentials_name: "bmc-w1".into(),
        identity: identity.map(str::to_string),
    };
    let bound_bmc = bmc("redfish://10.0.0.1/redfish/v1/Systems/1", Some("uuid:aaaa"));
    let record = Record {
        bmc: Some(bound_bmc.clone()),
        ..powering_off()
    };
    let off_from =
        |spec: hostcycle_api::ObservedBmc, read: hostcycle_api::ObservedBmc| RemediationHostView {
            spec_bmc: hostcycle_api::ObservedBmc {
                identity: None,
                ..spec
            },
            observed_bmc: Some(read),
            ..host(false, t(5))
        };
    let spec = bmc("redfish://10.0.0.1/redfish/v1/Systems/1", None);
    // The bound BMC, fresh Off readings: released.
    let h = off_from(spec.clone(), bound_bmc.clone());
    assert!(off_confirmed(&h, &record));
    assert!(
        decide(&obs(record.clone(), Some(h)), t(10))
            .actions
            .contains(&Action::DeleteNode)
    );

    let other = bmc("redfish://10.0.0.2/redfish/v1/Systems/1", Some("uuid:bbbb"));
    let secret_changed = hostcycle_api::ObservedBmc {
        credentials_name: "bmc-w2".into(),
        ..bound_bmc.clone()
    };
    for (name, h, warns) in [
        (
            "spec.bmc.address changed to another BMC (its readings say Off)",
            off_from(other.clone(), other.clone()),
            true,
        ),
        (
            "same address, another machine answers",
            off_from(
                spec.clone(),
                bmc("redfish://10.0.0.1/redfish/v1/Systems/1", Some("uuid:bbbb")),
            ),
            true,
        ),
        (
            "readings still from the old address (not read since the change back)",
            off_from(spec.clone(), other.clone()),
            false,
        ),
        (
            "the bound BMC reported an identity; this reading has none",
            off_from(
                spec.clone(),
                bmc("redfish://10.0.0.1/redfish/v1/Systems/1", None),
            ),
            false,
        ),
    ] {
        assert!(!off_confirmed(&h, &record), "{name}");
        let d = decide(&obs(record.clone(), Some(h)), t(10));
        assert!(d.actions.is_empty(), "{name}: the Node is kept: {d:#?}");
        assert_eq!(d.record, None, "{name}");
        assert_eq!(
            d.events
                .iter()
                .any(|e| e.reason == ev::BMC_CHANGED && e.is_warning()),
            warns,
            "{name}: {:?}",
            d.events
        );
    }

    // A new Secret (a broken BMC's credentials fixed): the same machine when the BMC answers
    // with the bound identity; bound without an identity (IPMI), it cannot be told: held.
    let h = off_from(secret_changed.clone(), secret_changed.clone());
    assert!(
        off_confirmed(&h, &record),
        "the bound identity answers with the new Secret"
    );
    let without_identity = Record {
        bmc: Some(hostcycle_api::ObservedBmc {
            identity: None,
            ..bound_bmc.clone()
        }),
        ..powering_off()
    };
    let h = off_from(
        secret_changed.clone(),
        hostcycle_api::ObservedBmc {
            identity: None,
            ..secret_changed.clone()
        },
    );
    assert!(!off_confirmed(&h, &without_identity));
    let d = decide(&obs(without_identity, Some(h)), t(10));
    assert!(d.actions.is_empty(), "{d:#?}");
    assert!(d.events.iter().any(|e| e.reason == ev::BMC_CHANGED));

    // The start binds spec.bmc with the identity its readings report.
    let mut fresh = obs(Record::default(), None);
    fresh.target = Ok(RemediationHostView {
        power_off_requested: false,
        ..off_from(spec.clone(), bound_bmc.clone())
    });
    let d = decide(&fresh, t(0));
    assert_eq!(d.record.unwrap().bmc, Some(bound_bmc));
}

#[test]
fn every_step_after_the_start_acts_on_the_bound_host_only() {
    // The lookup now names another host (a forged hint, the Node deleted): ignored.
    let mut o = obs(powering_off(), Some(host(false, t(5))));
    o.target = Err(Blocker::NodeHostUnknown("w1".into()));
    assert!(matches!(acting_host(&o), Acting::Host(h) if h.uid == UID));
    assert!(decide(&o, t(10)).actions.contains(&Action::DeleteNode));
    o.target = Ok(RemediationHostView {
        name: "metal/h0".into(),
        uid: "uid-h0".into(),
        ..host(true, t(5))
    });
    assert!(decide(&o, t(10)).actions.contains(&Action::DeleteNode));
    assert!(start_blocker(&o).is_none());

    // The bound host deleted: wait with a Warning, no action; give up at the deadline
    // without a release (there is nothing to release).
    let mut gone = obs(powering_off(), None);
    gone.target = Ok(host(false, t(5)));
    assert_eq!(acting_host(&gone), Acting::Missing);
    let d = decide(&gone, t(10));
    assert!(d.actions.is_empty(), "{d:#?}");
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == ev::HOST_LOST && e.is_warning())
    );
    assert!(d.message.contains("no longer exists"), "{}", d.message);
    // Past the deadline: held (CannotFence), nothing escalated (issue 24, case 5).
    let d = decide(&gone, t(200));
    assert_eq!(d.record, None);
    assert!(d.actions.is_empty(), "{d:#?}");
    assert!(d.cannot_fence);

    // Re-created under the same name (another uid): never acted on.
    let replaced = RemediationHostView {
        uid: "uid-new".into(),
        power_off_requested: false,
        ..host(true, t(5))
    };
    let o = obs(powering_off(), Some(replaced.clone()));
    assert!(matches!(acting_host(&o), Acting::Replaced(_)));
    let d = decide(&o, t(10));
    assert!(
        d.actions.is_empty(),
        "no power-off requested on the new host: {d:#?}"
    );
    assert!(d.message.contains("uid-new"), "{}", d.message);
    // Later steps never release a power-off on it either.
    for step in [
        RemediationStep::NodeReleased,
        RemediationStep::PowerOnRequested,
        RemediationStep::Done,
        RemediationStep::GaveUp,
    ] {
        let o = obs(
            Record {
                step,
                power_on_timeout_at: Some(t(600)),
                ..powering_off()
            },
            Some(RemediationHostView {
                power_off_requested: true,
                ..replaced.clone()
            }),
        );
        let d = decide(&o, t(10));
        let released = d.actions.contains(&Action::ReleasePowerOff);
        // NodeReleased always asks for the release: the controller carries it out on the
        // acting host only, and there is none.
        assert!(
            acting_host(&o).host().is_none()
                && (!released || step == RemediationStep::NodeReleased),
            "{step:?}: {d:#?}"
        );
    }
}

#[test]
fn the_start_binds_the_host_and_a_host_that_cannot_move_takes_no_slot() {
    let fresh = || obs(Record::default(), Some(host(true, t(-5))));
    let d = decide(&fresh(), t(0));
    let r = d.record.unwrap();
    assert_eq!(r.host, Some(bound()), "namespace, name and uid recorded");
    assert_eq!(r.cycle_started_at, Some(t(0)));
    assert!(wants_slot(&fresh(), t(0)));

    #[rustfmt::skip]
    let blocked: Vec<(&str, Observation, &str)> = vec![
        ("disablePowerOff", { let mut o = fresh(); o.target = Ok(RemediationHostView { cannot_power_off: Some("has spec.disablePowerOff set (power is never cut)".into()), ..host(true, t(-5)) }); o }, "HostCannotPowerOff"),
        ("paused", { let mut o = fresh(); o.target = Ok(RemediationHostView { cannot_power_off: Some("is paused (baremetalhost.metal3.io/paused)".into()), ..host(true, t(-5)) }); o }, "HostCannotPowerOff"),
        ("offline", { let mut o = fresh(); o.target = Ok(RemediationHostView { online: false, ..host(true, t(-5)) }); o }, "HostOffline"),
        ("binding in doubt", { let mut o = fresh(); o.target = Err(Blocker::Binding { reason: "HostBindingConflict", message: "sources disagree on the BareMetalHost of node w1: metal/h0 by a, metal/h1 by b".into() }); o }, "HostBindingConflict"),
    ];
    for (name, o, reason) in blocked {
        let d = decide(&o, t(0));
        assert_eq!(d.blocked, Some(reason), "{name}");
        assert!(d.actions.is_empty() && d.record.is_none(), "{name}");
        assert!(
            d.events
                .iter()
                .any(|e| e.reason == ev::BLOCKED && e.is_warning()),
            "{name}"
        );
        assert!(!wants_slot(&o, t(0)), "{name}: takes no slot");
    }
    let mut waiting = fresh();
    waiting.queue_reboot_until = Some(t(50));
    assert!(
        !wants_slot(&waiting, t(0)),
        "waiting for the queue's reboot: no slot"
    );
    assert!(wants_slot(&waiting, t(50)), "its boot deadline passed");
    let mut started = fresh();
    started.record = powering_off();
    assert!(
        !wants_slot(&started, t(0)),
        "started: holds its slot already"
    );
}

#[test]
fn an_administrators_cordon_and_taints_are_backed_up_and_restored() {
    let admin = RemediationNodeView {
        unschedulable: true,
        taints: vec![
            taint("example.com/dedicated", "NoSchedule"),
            taint("node.kubernetes.io/unreachable", "NoExecute"),
            taint("node.kubernetes.io/unschedulable", "NoSchedule"),
        ],
        annotations: BTreeMap::from([("example.com/owner".to_string(), "ops".to_string())]),
        ..node()
    };
    let mut o = obs(powering_off(), Some(host(false, t(5))));
    o.node = Some(admin.clone());
    let r = decide(&o, t(10)).record.unwrap();
    assert_eq!(
        r.node_spec_backup,
        Some(NodeSpecBackup {
            unschedulable: true,
            taints: vec![taint("example.com/dedicated", "NoSchedule")],
        }),
        "the cordon and the admin's taint; never Kubernetes' own taints"
    );

    // The reboot queue's cordon is the queue's, not the admin's: neither it nor its marker
    // is backed up.
    let mut queue_cordoned = admin.clone();
    queue_cordoned.taints.clear();
    queue_cordoned
        .annotations
        .insert(CORDONED_BY_ANNOTATION.into(), "rqe-1".into());
    o.node = Some(queue_cordoned);
    let r = decide(&o, t(10)).record.unwrap();
    assert_eq!(r.node_spec_backup, None);
    assert!(
        !r.annotations_backup
            .unwrap()
            .contains_key(CORDONED_BY_ANNOTATION)
    );

    // The new Node: the cordon and the missing taint come back; a taint it has is kept.
    let backup = Record {
        step: RemediationStep::PowerOnRequested,
        labels_backup: Some(BTreeMap::new()),
        annotations_backup: Some(BTreeMap::new()),
        node_spec_backup: Some(NodeSpecBackup {
            unschedulable: true,
            taints: vec![
                taint("example.com/dedicated", "NoSchedule"),
                taint("example.com/gpu", "NoExecute"),
            ],
        }),
        power_on_timeout_at: Some(t(600)),
        ..powering_off()
    };
    let mut o = obs(
        backup.clone(),
        Some(RemediationHostView {
            power_off_requested: false,
            ..host(true, t(50))
        }),
    );
    o.node = Some(RemediationNodeView {
        ready: true,
        taints: vec![taint("example.com/gpu", "NoExecute")],
        ..node()
    });
    let d = decide(&o, t(60));
    assert_eq!(
        d.actions,
        vec![Action::RestoreNode {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            cordon: true,
            taints: vec![taint("example.com/dedicated", "NoSchedule")],
        }]
    );
    assert_eq!(d.record, None, "the backup is kept until the Node has it");
    // Once it has them: the backup is forgotten and the remediation is done.
    o.node = Some(RemediationNodeView {
        ready: true,
        unschedulable: true,
        taints: vec![
            taint("example.com/gpu", "NoExecute"),
            taint("example.com/dedicated", "NoSchedule"),
        ],
        ..node()
    });
    let r = decide(&o, t(61)).record.unwrap();
    assert_eq!(r.step, RemediationStep::Done);
    assert_eq!(r.node_spec_backup, None);
}

/// `--remediation-request-namespaces`: which requests may fence which hosts.
#[test]
fn request_namespaces_decide_which_requests_may_fence_which_hosts() {
    use hostcycle_core::remediation::{Blocker, RequestNamespaces};
    // (flag value, request namespace, host, allowed)
    let cases = [
        ("same-as-host", "team-a", "team-a/worker-0", true),
        ("same-as-host", "team-b", "team-a/worker-0", false),
        ("*", "team-b", "team-a/worker-0", true),
        ("remediation", "remediation", "metal/worker-0", true),
        ("remediation", "metal", "metal/worker-0", false),
        ("same-as-host,remediation", "metal", "metal/worker-0", true),
        (
            "same-as-host,remediation",
            "remediation",
            "metal/worker-0",
            true,
        ),
        (
            "same-as-host,remediation",
            "team-b",
            "metal/worker-0",
            false,
        ),
    ];
    for (flag, request_ns, host, allowed) in cases {
        let rule: RequestNamespaces = flag.parse().unwrap();
        assert_eq!(
            rule.to_string().split(',').count(),
            flag.split(',').count(),
            "{flag}"
        );
        match rule.check(request_ns, host) {
            Ok(()) => assert!(allowed, "{flag}: {request_ns} -> {host} allowed"),
            Err(blocker) => {
                assert!(
                    !allowed,
                    "{flag}: {request_ns} -> {host} refused: {blocker}"
                );
                assert!(matches!(blocker, Blocker::RequestNamespace { .. }));
                assert_eq!(blocker.reason(), "RequestNamespaceNotAllowed");
                let text = blocker.to_string();
                assert!(text.contains(request_ns) && text.contains(host), "{text}");
                assert!(text.contains("--remediation-request-namespaces"), "{text}");
            }
        }
    }
    assert_eq!(
        RequestNamespaces::default(),
        "same-as-host,operator-namespace".parse().unwrap()
    );
    // `operator-namespace` honours the operator's namespace once resolved, nothing before.
    let rule: RequestNamespaces = "operator-namespace".parse().unwrap();
    assert!(!rule.allows("hostcycle-system", "metal"));
    let rule = rule.with_operator_namespace(Some("hostcycle-system"));
    assert!(rule.allows("hostcycle-system", "metal"));
    assert!(!rule.allows("tenant-a", "metal"));
    assert!(!rule.allows("metal", "metal"));
    for bad in ["", ",", "Team-A", "a b", "-x", "same-as-host,*,x_y"] {
        assert!(bad.parse::<RequestNamespaces>().is_err(), "{bad:?}");
    }
}

/// Issue 24, case 7 — one remediation per host: a second trigger for a host joins the
/// remediation running there (or the oldest one that could start, when both are seen at once)
/// and never starts its own; different hosts are independent.
#[test]
fn a_second_trigger_for_a_host_joins_the_running_remediation() {
    use hostcycle_core::remediation::joins::{FlowOnHost, joins};
    let flow = |key: &'static str, created: i64, host: &'static str, running: bool, could: bool| {
        FlowOnHost {
            key,
            created: t(created),
            host_uid: Some(host),
            running,
            not_started: !running,
            could_start: !running && could,
        }
    };
    #[rustfmt::skip]
    type JoinCase<'a> = (&'a str, Vec<FlowOnHost<'a>>, Vec<(&'a str, &'a str)>);
    let cases: Vec<JoinCase> = vec![
        (
            "a request while the Machine's annotation flow runs → joins it",
            vec![
                flow("machine", 0, "h1", true, false),
                flow("request", 5, "h1", false, true),
            ],
            vec![("request", "machine")],
        ),
        (
            "both seen at once → the older starts, the later joins it",
            vec![
                flow("request", 5, "h1", false, true),
                flow("machine", 0, "h1", false, true),
            ],
            vec![("request", "machine")],
        ),
        (
            "the older one is blocked → the later one leads",
            vec![
                flow("machine", 0, "h1", false, false),
                flow("request", 5, "h1", false, true),
            ],
            vec![("machine", "request")],
        ),
        (
            "other hosts → independent",
            vec![
                flow("a", 0, "h1", true, false),
                flow("b", 5, "h2", false, true),
            ],
            vec![],
        ),
        (
            "alone → nothing to join",
            vec![flow("a", 0, "h1", false, true)],
            vec![],
        ),
    ];
    for (name, flows, want) in cases {
        let got: Vec<(&str, &str)> = joins(&flows).into_iter().collect();
        let mut want = want;
        want.sort();
        assert_eq!(got, want, "{name}");
    }

    // The joined remediation: recorded, no action, no slot.
    let mut o = obs(Record::default(), None);
    o.target = Ok(RemediationHostView {
        power_off_requested: false,
        ..host(true, t(-5))
    });
    o.joined_running = Some("Machine default/m-w1".into());
    assert!(!wants_slot(&o, t(0)));
    let d = decide(&o, t(0));
    assert!(d.actions.is_empty(), "{d:#?}");
    assert_eq!(
        d.record.as_ref().and_then(|r| r.joined.as_deref()),
        Some("Machine default/m-w1")
    );
    assert!(d.events.iter().any(|e| e.reason == ev::JOINED));
    // It ends with the flow it joined: Node back and Ready → succeeded, no power cycle.
    let joined = Record {
        joined: Some("Machine default/m-w1".into()),
        ..Record::default()
    };
    let mut after = obs(joined.clone(), None);
    after.target = o.target.clone();
    after.node = Some(RemediationNodeView {
        ready: true,
        ..node()
    });
    let d = decide(&after, t(60));
    assert_eq!(d.record.as_ref().unwrap().step, RemediationStep::Done);
    assert_eq!(
        d.actions,
        vec![Action::ClearExternallyRemediated],
        "no power cycle of its own: {d:#?}"
    );
    // … the Node not back → failed, without an escalation of its own.
    after.node = Some(node());
    let d = decide(&after, t(60));
    assert_eq!(d.record.as_ref().unwrap().step, RemediationStep::GaveUp);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Escalate(_) | Action::MarkHostUnhealthy)),
        "{d:#?}"
    );
    // … withdrawn meanwhile → cancelled; an annotation flow's markers go.
    let mut withdrawn = obs(joined, None);
    withdrawn.trigger = Trigger::MachineAnnotation;
    withdrawn.requested = false;
    let d = decide(&withdrawn, t(60));
    assert_eq!(d.record.as_ref().unwrap().step, RemediationStep::Cancelled);
    assert_eq!(d.actions, vec![Action::FinishAnnotationFlow]);
}

/// Issue 24, case 8: a host a person holds off after the Node was released (`online: false`,
/// paused, detached) does not power on — no failure of the remediation: past the power-on
/// deadline nothing is retried or escalated; once released, the wait starts afresh.
#[test]
fn a_host_held_off_by_a_person_after_the_release_is_waited_for_not_escalated() {
    let powering_on = Record {
        step: RemediationStep::PowerOnRequested,
        powered_off_at: Some(t(10)),
        node_released_at: Some(t(11)),
        power_on_timeout_at: Some(t(100)),
        ..powering_off()
    };
    for (name, held) in [
        (
            "online: false",
            RemediationHostView {
                online: false,
                power_off_requested: false,
                ..host(false, t(20))
            },
        ),
        (
            "paused",
            RemediationHostView {
                cannot_power_off: Some("is paused (baremetalhost.metal3.io/paused)".into()),
                power_off_requested: false,
                ..host(false, t(20))
            },
        ),
    ] {
        let mut o = obs(powering_on.clone(), Some(held.clone()));
        o.node = None;
        let d = decide(&o, t(500));
        assert!(
            d.actions.is_empty(),
            "{name}: nothing retried or escalated: {d:#?}"
        );
        assert_eq!(
            d.record.as_ref().map(|r| r.power_on_timeout_at),
            Some(None),
            "{name}: the deadline is dropped"
        );
        assert!(
            d.message.contains("nothing is escalated"),
            "{name}: {}",
            d.message
        );
        // Released: the wait starts afresh from now.
        let waiting = Record {
            power_on_timeout_at: None,
            ..powering_on.clone()
        };
        let mut o = obs(
            waiting,
            Some(RemediationHostView {
                online: true,
                cannot_power_off: None,
                ..held
            }),
        );
        o.node = None;
        let d = decide(&o, t(600));
        assert!(d.actions.is_empty(), "{name}: {d:#?}");
        assert_eq!(
            d.record.and_then(|r| r.power_on_timeout_at),
            Some(t(1200)),
            "{name}: a fresh power-on deadline (600 s)"
        );
    }
}

/// Issue 24, case 8: clocks are measured, not assumed — while this replica's clock is off the
/// API server's by more than the bound, readings and requests written by different clocks
/// cannot be compared: the Node is kept (past the deadline: `CannotFence`).
#[test]
fn no_release_while_the_clocks_disagree() {
    let mut o = obs(powering_off(), Some(host(false, t(5))));
    assert!(decide(&o, t(10)).actions.contains(&Action::DeleteNode));
    o.clock_untrusted = Some("this replica's clock is 5.0s off the API server's".into());
    let d = decide(&o, t(10));
    assert!(d.actions.is_empty(), "{d:#?}");
    assert!(d.message.contains("5.0s off"), "{}", d.message);
    let d = decide(&o, t(200));
    assert!(d.cannot_fence && d.actions.is_empty(), "{d:#?}");
}
