//! One entry's next step (`hostcycle_core::queue::entry`), as tables: what is recorded
//! first, what is done after it, and what people are told — for drains, back-offs, the
//! start of a reboot, its progress through the BMC, the boot timeout, the workers' reports,
//! waiting and leaving. The controller carries these decisions out and adds no rule.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::{
    EntryPhase, HostReference, RebootMethod, RebootProgress, RebootQueueEntry,
    RebootQueueEntrySpec, RebootQueueEntryStatus,
};
use hostcycle_api::reasons::{EventType, queue_condition, queue_event_reason as reason};
use hostcycle_core::queue::commands::CommandSet;
use hostcycle_core::queue::entry::{
    EntryAction, EntryDecision, EventSubject, QueueCount, RebootStart, StatusEdit, WorkerNews,
    after_worker_news, apply_edits, back_off, boot_timeout, completed, dequeued,
    drain_failure_kind, follow_bmc_reboot, follow_drain, message_only, record_cancelled,
    start_drain, start_reboot, stop_drain, waiting, withdrawn,
};
use hostcycle_core::queue::reboot::BmcRebootStep;
use hostcycle_core::queue::{
    DequeueReason, QueueConfig, QueueNodeView, RebootConfig, RebootTarget, WaitReason,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn entry(phase: Option<EntryPhase>, since: i64) -> RebootQueueEntry {
    let mut e = RebootQueueEntry::new(
        "entry-3",
        RebootQueueEntrySpec {
            node: "w1".into(),
            index: 3,
            cancel: false,
        },
    );
    e.metadata.uid = Some("uid-3".into());
    e.metadata.generation = Some(2);
    e.metadata.creation_timestamp = Some(Time(ts(-100)));
    e.status = Some(RebootQueueEntryStatus {
        phase,
        last_transition_time: phase.map(|_| ts(since)),
        ..Default::default()
    });
    e
}

fn with(
    mut e: RebootQueueEntry,
    change: impl FnOnce(&mut RebootQueueEntryStatus),
) -> RebootQueueEntry {
    change(e.status.as_mut().unwrap());
    e
}

fn cancelled(mut e: RebootQueueEntry) -> RebootQueueEntry {
    e.spec.cancel = true;
    e
}

/// The status after the decision's edits, from `e`'s.
fn applied(e: &RebootQueueEntry, d: &EntryDecision) -> RebootQueueEntryStatus {
    let mut status = e.status.clone().unwrap_or_default();
    apply_edits(&mut status, &d.status);
    status
}

fn events(d: &EntryDecision) -> Vec<(EventSubject, EventType, &'static str)> {
    d.events
        .iter()
        .map(|e| (e.on, e.event_type, e.reason))
        .collect()
}

fn host() -> HostReference {
    HostReference {
        namespace: "metal".into(),
        name: "h1".into(),
    }
}

fn node(address: &str) -> QueueNodeView {
    QueueNodeView {
        name: "w1".into(),
        api_server: false,
        ready: true,
        ready_heartbeat: Some(ts(0)),
        boot_id: Some("boot-a".into()),
        unschedulable: true,
        cordoned_by_queue: true,
        volumes_in_use: 0,
        address: address.into(),
        reported_addresses: vec![address.into()],
    }
}

fn config() -> QueueConfig {
    QueueConfig::default()
}

fn command_config() -> QueueConfig {
    QueueConfig {
        reboot: RebootConfig {
            commands: Ok(CommandSet {
                reboot: vec!["reboot-node".into()],
                boot_check: vec!["check-boot".into()],
            }),
            ..QueueConfig::default().reboot
        },
        ..QueueConfig::default()
    }
}

// ----- drains ------------------------------------------------------------------------------

#[test]
fn a_drain_starts_fresh_and_names_its_attempt() {
    let e = with(entry(Some(EntryPhase::Queued), 0), |s| {
        s.drain_backoff_count = 2;
        s.reboot = Some(RebootProgress::new(RebootMethod::Bmc));
        s.conditions.push(Condition {
            type_: queue_condition::BLOCKED.into(),
            status: "True".into(),
            reason: "x".into(),
            message: "x".into(),
            last_transition_time: Time(ts(0)),
            observed_generation: None,
        });
    });
    let d = start_drain(&e, ts(10));
    let s = applied(&e, &d);
    assert_eq!(s.phase, Some(EntryPhase::Draining));
    assert_eq!(s.last_transition_time, Some(ts(10)));
    assert_eq!(s.message, "draining: cordoning the node");
    assert!(s.reboot.is_none() && s.conditions.is_empty());
    assert_eq!(s.drain_backoff_count, 2, "the backoff count is kept");
    assert_eq!(d.actions, vec![EntryAction::SpawnDrain]);
    assert!(!d.stop_worker);
    assert_eq!(
        events(&d),
        vec![
            (
                EventSubject::Entry,
                EventType::Normal,
                reason::DRAIN_STARTED
            ),
            (EventSubject::Node, EventType::Normal, reason::DRAIN_STARTED),
        ]
    );
    assert!(
        d.events[0].message.contains("entry 3, attempt 3"),
        "{}",
        d.events[0].message
    );
}

#[test]
fn a_drain_runs_until_the_eviction_timeout_then_backs_off() {
    let timeout = config().eviction_timeout.as_secs() as i64;
    let e = with(entry(Some(EntryPhase::Draining), 0), |s| {
        s.message = "draining: waiting for pod a/b".into()
    });
    // (seconds since Draining, backs off)
    for (at, backs_off) in [
        (0, false),
        (timeout - 1, false),
        (timeout, true),
        (timeout + 60, true),
    ] {
        let d = follow_drain(&e, &config(), ts(at), 0.0);
        if !backs_off {
            assert_eq!(d.actions, vec![EntryAction::SpawnDrain], "at {at}s");
            assert!(d.status.is_empty() && d.events.is_empty() && !d.stop_worker);
            continue;
        }
        assert!(d.stop_worker, "at {at}s");
        let s = applied(&e, &d);
        assert_eq!(s.phase, Some(EntryPhase::Queued));
        assert_eq!(
            s.last_drain_failure.as_deref(),
            Some(
                format!(
                    "drain timed out after {timeout}s (evictionTimeoutSeconds): waiting for pod a/b"
                )
                .as_str()
            )
        );
        assert!(
            d.actions
                .contains(&EntryAction::Count(QueueCount::DrainBackoff {
                    kind: "timeout"
                }))
        );
    }
}

#[test]
fn a_stopped_drain_goes_back_to_queued_and_says_why() {
    // (node being remediated, words in the message)
    for (remediated, words) in [
        (true, "the node is being remediated"),
        (false, "the reboot queue was disabled"),
    ] {
        let e = entry(Some(EntryPhase::Draining), 0);
        let d = stop_drain(remediated, ts(30));
        let s = applied(&e, &d);
        assert!(d.stop_worker);
        assert_eq!(s.phase, Some(EntryPhase::Queued));
        assert_eq!(s.last_transition_time, Some(ts(30)));
        assert!(s.message.contains(words), "{}", s.message);
        assert_eq!(
            events(&d),
            vec![(
                EventSubject::Entry,
                EventType::Normal,
                reason::DRAIN_STOPPED
            )]
        );
        assert!(d.actions.is_empty());
    }
}

#[test]
fn a_back_off_counts_the_failure_and_clears_the_reboot_record() {
    let cfg = config();
    let e = with(entry(Some(EntryPhase::Draining), 0), |s| {
        s.drain_backoff_count = 1;
        s.reboot = Some(RebootProgress::new(RebootMethod::Command));
    });
    let d = back_off(
        &e,
        &cfg.backoff,
        ts(50),
        "eviction refused",
        "eviction",
        0.0,
    );
    let s = applied(&e, &d);
    assert!(d.stop_worker);
    assert_eq!(s.phase, Some(EntryPhase::Queued));
    assert_eq!(s.drain_backoff_count, 2);
    // The second failure waits twice the base (no jitter drawn).
    let expected = hostcycle_core::time::add(
        ts(50),
        cfg.backoff.base.saturating_mul(2).min(cfg.backoff.max),
    );
    assert_eq!(s.drain_backoff_expire, Some(expected));
    assert_eq!(s.last_drain_failure.as_deref(), Some("eviction refused"));
    assert!(s.reboot.is_none());
    assert!(
        s.message
            .starts_with("drain failed (eviction refused); trying again after"),
        "{}",
        s.message
    );
    assert!(s.message.ends_with("(failure 2)"), "{}", s.message);
    assert_eq!(
        d.actions,
        vec![
            EntryAction::Count(QueueCount::DrainBackoff { kind: "eviction" }),
            EntryAction::LookAgainSoon,
        ]
    );
    assert_eq!(
        events(&d),
        vec![
            (
                EventSubject::Entry,
                EventType::Warning,
                reason::DRAIN_BACKOFF
            ),
            (
                EventSubject::Node,
                EventType::Warning,
                reason::DRAIN_BACKOFF
            ),
        ]
    );
}

#[test]
fn a_long_failure_is_bounded_in_the_status() {
    let e = entry(Some(EntryPhase::Draining), 0);
    let why = "x".repeat(5_000);
    let d = back_off(&e, &config().backoff, ts(1), &why, "error", 0.5);
    let s = applied(&e, &d);
    assert!(s.message.len() <= 1024 && s.last_drain_failure.unwrap().len() <= 1024);
}

#[test]
fn drain_failures_are_labelled_by_kind() {
    for (failure, kind) in [
        ("Job pod ns/j-1 is protected", "job_pods"),
        ("eviction of ns/p refused 5 times", "eviction"),
        ("blocked by PodDisruptionBudget ns/pdb", "eviction"),
        ("cannot cordon: connection refused", "error"),
    ] {
        assert_eq!(drain_failure_kind(failure), kind, "{failure}");
    }
}

// ----- the start of a reboot ---------------------------------------------------------------

struct Start {
    config: QueueConfig,
    remediated: bool,
    target: RebootTarget,
    address: &'static str,
    bound: bool,
}

/// The address of the other node, w2, every start sees.
const OTHER_NODE_ADDRESS: &str = "10.0.0.2";

fn start(e: &RebootQueueEntry, case: &Start) -> EntryDecision {
    let n = node(case.address);
    let other = QueueNodeView {
        name: "w2".into(),
        ..node(OTHER_NODE_ADDRESS)
    };
    let nodes = BTreeMap::from([("w1".to_string(), n.clone()), ("w2".to_string(), other)]);
    let input = RebootStart {
        config: &case.config,
        being_remediated: case.remediated,
        target: &case.target,
        node: Some(&n),
        nodes: &nodes,
        bound_host: case.bound.then(|| (host(), "host-uid".to_string())),
        now: ts(100),
        jitter: 0.0,
    };
    start_reboot(e, &input)
}

#[test]
fn a_reboot_starts_only_when_the_plans_checks_still_hold() {
    let draining = entry(Some(EntryPhase::Draining), 40);
    let disabled = QueueConfig {
        enabled: false,
        ..config()
    };
    // (case, phase after, first event reason, metric label of a back-off)
    let cases: Vec<(&str, Start, EntryPhase, &str, Option<&str>)> = vec![
        (
            "queue disabled meanwhile",
            through_the_host(disabled),
            EntryPhase::Queued,
            reason::DRAIN_STOPPED,
            None,
        ),
        (
            "a remediation started meanwhile",
            Start {
                remediated: true,
                ..through_the_host(config())
            },
            EntryPhase::Queued,
            reason::DRAIN_STOPPED,
            None,
        ),
        (
            "no host and no commands",
            Start {
                config: config(),
                remediated: false,
                target: RebootTarget::NoHost,
                address: "10.0.0.1",
                bound: false,
            },
            EntryPhase::Queued,
            reason::REBOOT_BLOCKED,
            Some("reboot_blocked"),
        ),
        (
            "commands, but an address they must not get",
            Start {
                config: command_config(),
                remediated: false,
                target: RebootTarget::NoHost,
                address: "-oProxyCommand=x",
                bound: false,
            },
            EntryPhase::Queued,
            reason::UNSAFE_NODE_ADDRESS,
            Some("unsafe_node_address"),
        ),
        (
            "commands, but another node (w2) reports the address too",
            Start {
                config: command_config(),
                remediated: false,
                target: RebootTarget::NoHost,
                address: "::ffff:10.0.0.2",
                bound: false,
            },
            EntryPhase::Queued,
            reason::AMBIGUOUS_NODE_ADDRESS,
            Some("ambiguous_node_address"),
        ),
        (
            "through the bound host, another node's address is not used",
            Start {
                address: OTHER_NODE_ADDRESS,
                ..through_the_host(config())
            },
            EntryPhase::Rebooting,
            reason::DRAIN_COMPLETED,
            None,
        ),
        (
            "through the bound host",
            through_the_host(config()),
            EntryPhase::Rebooting,
            reason::DRAIN_COMPLETED,
            None,
        ),
        (
            "by command",
            Start {
                config: command_config(),
                remediated: false,
                target: RebootTarget::NoHost,
                address: "10.0.0.1",
                bound: false,
            },
            EntryPhase::Rebooting,
            reason::DRAIN_COMPLETED,
            None,
        ),
    ];
    for (name, case, phase, first_event, backoff) in cases {
        let d = start(&draining, &case);
        let s = applied(&draining, &d);
        assert_eq!(s.phase, Some(phase), "{name}");
        assert_eq!(s.last_transition_time, Some(ts(100)), "{name}");
        assert_eq!(d.events[0].reason, first_event, "{name}");
        let counted = d.actions.iter().find_map(|a| match a {
            EntryAction::Count(QueueCount::DrainBackoff { kind }) => Some(*kind),
            _ => None,
        });
        assert_eq!(counted, backoff, "{name}");
        if phase == EntryPhase::Queued {
            assert!(d.stop_worker, "{name}");
            assert!(s.reboot.is_none(), "{name}: nothing is requested");
            assert!(
                !d.actions.iter().any(|a| matches!(
                    a,
                    EntryAction::RequestHostReboot | EntryAction::SpawnCommand { .. }
                )),
                "{name}"
            );
        }
    }
}

/// A node with a usable, bound host and a safe address.
fn through_the_host(config: QueueConfig) -> Start {
    Start {
        config,
        remediated: false,
        target: RebootTarget::Host(host()),
        address: "10.0.0.1",
        bound: true,
    }
}

/// At the end of the drain, a command address another node reports too backs off with a
/// Warning naming both nodes and the address.
#[test]
fn a_reboot_by_command_never_starts_with_another_nodes_address() {
    let draining = entry(Some(EntryPhase::Draining), 40);
    let d = start(
        &draining,
        &Start {
            config: command_config(),
            remediated: false,
            target: RebootTarget::NoHost,
            address: OTHER_NODE_ADDRESS,
            bound: false,
        },
    );
    let warning = &d.events[0];
    assert_eq!(warning.event_type, EventType::Warning);
    assert_eq!(warning.reason, reason::AMBIGUOUS_NODE_ADDRESS);
    for words in ["node w1", "node w2", "\"10.0.0.2\"", "commands are not run"] {
        assert!(warning.message.contains(words), "{}", warning.message);
    }
    let s = applied(&draining, &d);
    assert_eq!(
        s.phase,
        Some(EntryPhase::Queued),
        "backed off, not rebooting"
    );
    assert!(s.message.contains(&warning.message), "{}", s.message);
}

#[test]
fn a_bmc_reboot_records_its_host_before_asking_it() {
    let draining = entry(Some(EntryPhase::Draining), 40);
    let d = start(&draining, &through_the_host(config()));
    let s = applied(&draining, &d);
    let record = s.reboot.expect("the write-ahead record");
    assert_eq!(record.method, RebootMethod::Bmc);
    assert_eq!(record.host, Some(host()));
    assert_eq!(record.host_uid.as_deref(), Some("host-uid"));
    assert_eq!(record.boot_id.as_deref(), Some("boot-a"));
    assert_eq!(record.requested_at, Some(ts(100)));
    assert_eq!(record.command_attempts, 0);
    assert_eq!(s.message, "rebooting through BareMetalHost metal/h1");
    assert_eq!(
        d.actions,
        vec![
            EntryAction::RequestHostReboot,
            EntryAction::Count(QueueCount::DrainDuration(Duration::from_secs(60))),
        ]
    );
    assert_eq!(
        events(&d),
        vec![
            (
                EventSubject::Entry,
                EventType::Normal,
                reason::DRAIN_COMPLETED
            ),
            (
                EventSubject::Entry,
                EventType::Normal,
                reason::REBOOT_STARTED
            ),
            (
                EventSubject::Node,
                EventType::Normal,
                reason::REBOOT_STARTED
            ),
        ]
    );
}

#[test]
fn a_command_reboot_records_attempt_one_and_marks_the_host() {
    let draining = entry(Some(EntryPhase::Draining), 40);
    let by_command = QueueConfig {
        reboot: RebootConfig {
            method: Some(RebootMethod::Command),
            command_retries: 2,
            ..command_config().reboot
        },
        ..command_config()
    };
    let d = start(&draining, &through_the_host(by_command));
    let s = applied(&draining, &d);
    let record = s.reboot.expect("the write-ahead record");
    assert_eq!(record.method, RebootMethod::Command);
    assert_eq!(record.command_attempts, 1, "recorded before it runs");
    assert_eq!(
        record.host,
        Some(host()),
        "the host is bound for the marker"
    );
    assert_eq!(
        s.message,
        "rebooting with the reboot command (attempt 1 of 3)"
    );
    assert_eq!(
        &d.actions[..2],
        &[
            EntryAction::MarkCommandReboot,
            EntryAction::SpawnCommand { run: Some(1) },
        ]
    );
}

// ----- following a reboot ------------------------------------------------------------------

#[test]
fn the_boot_timeout_is_raised_once() {
    let timeout = config().reboot.boot_timeout;
    let secs = timeout.as_secs() as i64;
    let rebooting = entry(Some(EntryPhase::Rebooting), 0);
    assert_eq!(
        boot_timeout(&rebooting, timeout, ts(secs - 1)),
        None,
        "not yet"
    );
    let d = boot_timeout(&rebooting, timeout, ts(secs)).expect("overdue");
    let s = applied(&rebooting, &d);
    let c = &s.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (
            queue_condition::BOOT_TIMED_OUT,
            "True",
            queue_condition::BOOT_NOT_CONFIRMED
        )
    );
    assert_eq!(c.observed_generation, Some(2));
    assert_eq!(
        d.actions,
        vec![EntryAction::Count(QueueCount::BootTimedOut)]
    );
    assert_eq!(
        events(&d),
        vec![
            (
                EventSubject::Entry,
                EventType::Warning,
                reason::BOOT_TIMED_OUT
            ),
            (
                EventSubject::Node,
                EventType::Warning,
                reason::BOOT_TIMED_OUT
            ),
        ]
    );
    let raised = with(rebooting, |st| st.conditions = s.conditions.clone());
    assert_eq!(boot_timeout(&raised, timeout, ts(secs * 2)), None, "once");
}

#[test]
fn bmc_steps_become_records_requests_and_messages() {
    let progress = RebootProgress {
        host: Some(host()),
        requested_at: Some(ts(5)),
        ..RebootProgress::new(RebootMethod::Bmc)
    };
    let rebooting = with(entry(Some(EntryPhase::Rebooting), 0), |s| {
        s.reboot = Some(progress.clone());
        s.message = "rebooting: waiting".into();
    });
    let note = "cancel requested, but host metal/h1 has begun its power cycle";
    let wait = BmcRebootStep::Wait("waiting".into());
    // (step, cancel note, status edits, actions)
    type Case<'a> = (
        BmcRebootStep,
        Option<&'a str>,
        Vec<StatusEdit>,
        Vec<EntryAction>,
    );
    let cases: Vec<Case> = vec![
        (
            BmcRebootStep::Request { record: true },
            None,
            vec![StatusEdit::RebootRequestedAt(ts(60))],
            vec![EntryAction::RequestHostReboot],
        ),
        (
            BmcRebootStep::Request { record: false },
            None,
            vec![],
            vec![EntryAction::RequestHostReboot],
        ),
        // A cancelled entry asks nothing more of its host.
        (
            BmcRebootStep::Request { record: true },
            Some(note),
            vec![],
            vec![],
        ),
        (
            BmcRebootStep::RecordPowerOff { at: ts(60) },
            None,
            vec![
                StatusEdit::HostPoweredOffAt(ts(60)),
                StatusEdit::Message(
                    "rebooting: the host is powered off; waiting for it to power on".into(),
                ),
            ],
            vec![],
        ),
        (
            BmcRebootStep::RecordPowerOff { at: ts(60) },
            Some(note),
            vec![
                StatusEdit::HostPoweredOffAt(ts(60)),
                StatusEdit::Message(note.into()),
            ],
            vec![],
        ),
        (
            BmcRebootStep::Booted {
                boot_started: ts(30),
            },
            None,
            vec![],
            vec![EntryAction::Complete {
                detail: format!("node w1 is Ready after a boot that started at {}", ts(30)),
            }],
        ),
        // Already the message: nothing is written.
        (wait.clone(), None, vec![], vec![]),
        (
            wait,
            Some(note),
            vec![StatusEdit::Message(format!("{note}; waiting"))],
            vec![],
        ),
    ];
    for (step, cancel_note, status, actions) in cases {
        let d = follow_bmc_reboot(&rebooting, &step, cancel_note, ts(60));
        assert_eq!(d.status, status, "{step:?} {cancel_note:?}");
        assert_eq!(d.actions, actions, "{step:?} {cancel_note:?}");
        assert!(d.events.is_empty() && !d.stop_worker);
    }
}

#[test]
fn a_message_already_shown_is_not_written_again() {
    let e = with(entry(Some(EntryPhase::Rebooting), 0), |s| {
        s.message = "same".into()
    });
    assert!(message_only(&e, "same").is_empty());
    assert_eq!(
        message_only(&e, "other").status,
        vec![StatusEdit::Message("other".into())]
    );
}

// ----- the workers' reports ----------------------------------------------------------------

#[test]
fn a_report_counts_only_in_the_phase_it_is_about() {
    let draining = entry(Some(EntryPhase::Draining), 0);
    let rebooting = with(entry(Some(EntryPhase::Rebooting), 0), |s| {
        s.reboot = Some(RebootProgress::new(RebootMethod::Command))
    });
    let start_reboot = vec![EntryAction::StartReboot];
    let backs_off = |kind: &'static str| {
        vec![
            EntryAction::Count(QueueCount::DrainBackoff { kind }),
            EntryAction::LookAgainSoon,
        ]
    };
    let complete = |detail: &str| {
        vec![EntryAction::Complete {
            detail: detail.into(),
        }]
    };
    // (entry, news, records something, actions)
    let cases: Vec<(&str, RebootQueueEntry, WorkerNews, bool, Vec<EntryAction>)> = vec![
        (
            "progress while draining",
            draining.clone(),
            WorkerNews::DrainProgress("pod a/b".into()),
            true,
            vec![],
        ),
        (
            "progress after a cancel",
            cancelled(draining.clone()),
            WorkerNews::DrainProgress("pod a/b".into()),
            false,
            vec![],
        ),
        (
            "progress while rebooting",
            rebooting.clone(),
            WorkerNews::DrainProgress("pod a/b".into()),
            false,
            vec![],
        ),
        (
            "drain done",
            draining.clone(),
            WorkerNews::DrainCompleted,
            false,
            start_reboot.clone(),
        ),
        (
            "drain done after a cancel",
            cancelled(draining.clone()),
            WorkerNews::DrainCompleted,
            false,
            vec![],
        ),
        (
            "drain done, entry moved on",
            rebooting.clone(),
            WorkerNews::DrainCompleted,
            false,
            vec![],
        ),
        (
            "drain failed",
            draining.clone(),
            WorkerNews::DrainFailed("eviction refused".into()),
            true,
            backs_off("eviction"),
        ),
        (
            "drain failed after a cancel: backs off too",
            cancelled(draining.clone()),
            WorkerNews::DrainFailed("x".into()),
            true,
            backs_off("error"),
        ),
        (
            "command attempt",
            rebooting.clone(),
            WorkerNews::CommandAttempt {
                attempt: 2,
                previous_error: "exit 1".into(),
            },
            true,
            vec![],
        ),
        (
            "command attempt after a cancel: refused",
            cancelled(rebooting.clone()),
            WorkerNews::CommandAttempt {
                attempt: 2,
                previous_error: "exit 1".into(),
            },
            false,
            vec![],
        ),
        (
            "command attempt while draining",
            draining.clone(),
            WorkerNews::CommandAttempt {
                attempt: 2,
                previous_error: "exit 1".into(),
            },
            false,
            vec![],
        ),
        (
            "command succeeded",
            rebooting.clone(),
            WorkerNews::CommandSucceeded,
            true,
            vec![],
        ),
        (
            "command gave up",
            rebooting.clone(),
            WorkerNews::CommandGaveUp("exit 1".into()),
            true,
            vec![],
        ),
        (
            "booted",
            rebooting.clone(),
            WorkerNews::BootCheck {
                booted: true,
                detail: "printed true".into(),
            },
            false,
            complete("printed true"),
        ),
        (
            "booted after a cancel",
            cancelled(rebooting.clone()),
            WorkerNews::BootCheck {
                booted: true,
                detail: "printed true".into(),
            },
            false,
            complete("printed true"),
        ),
        (
            "not booted yet",
            rebooting.clone(),
            WorkerNews::BootCheck {
                booted: false,
                detail: "printed false".into(),
            },
            true,
            vec![],
        ),
        (
            "not booted, cancelled",
            cancelled(rebooting.clone()),
            WorkerNews::BootCheck {
                booted: false,
                detail: "printed false".into(),
            },
            false,
            vec![],
        ),
        (
            "boot check while draining",
            draining.clone(),
            WorkerNews::BootCheck {
                booted: true,
                detail: "x".into(),
            },
            false,
            vec![],
        ),
    ];
    for (name, e, news, records, actions) in cases {
        let d = after_worker_news(&e, &news, None, &config(), ts(10), 0.0);
        assert_eq!(!d.status.is_empty(), records, "{name}");
        assert_eq!(d.actions, actions, "{name}");
    }
}

/// Issue 24, the boot canary: a passed boot check completes the entry only when the Node
/// booted anew — its boot ID differs from the one recorded when the reboot began. The same
/// boot ID (the command reached another machine) is a Warning on the entry and the Node, and
/// the entry keeps its node cordoned.
#[test]
fn a_passed_boot_check_completes_only_with_a_new_boot_id() {
    let rebooting = with(entry(Some(EntryPhase::Rebooting), 0), |s| {
        let mut progress = RebootProgress::new(RebootMethod::Command);
        progress.boot_id = Some("boot-1".into());
        s.reboot = Some(progress)
    });
    let complete = |detail: &str| {
        vec![EntryAction::Complete {
            detail: detail.into(),
        }]
    };
    let passed = WorkerNews::BootCheck {
        booted: true,
        detail: "printed true".into(),
    };
    let d = after_worker_news(&rebooting, &passed, Some("boot-2"), &config(), ts(10), 0.0);
    assert_eq!(
        d.actions,
        complete("printed true"),
        "a new boot ID completes"
    );
    for (name, now) in [("the same boot ID", Some("boot-1")), ("no boot ID", None)] {
        let d = after_worker_news(&rebooting, &passed, now, &config(), ts(10), 0.0);
        assert!(d.actions.is_empty(), "{name}: never completes: {d:?}");
        let s = applied(&rebooting, &d);
        assert!(
            s.message.contains("the boot check passed, but"),
            "{name}: {}",
            s.message
        );
        assert_eq!(
            events(&d),
            vec![
                (
                    EventSubject::Entry,
                    EventType::Warning,
                    reason::NOT_POWER_CYCLED
                ),
                (
                    EventSubject::Node,
                    EventType::Warning,
                    reason::NOT_POWER_CYCLED
                )
            ],
            "{name}"
        );
    }
}

#[test]
fn a_command_attempt_is_recorded_before_it_runs_and_a_give_up_warns() {
    let rebooting = with(entry(Some(EntryPhase::Rebooting), 0), |s| {
        s.reboot = Some(RebootProgress::new(RebootMethod::Command))
    });
    let news = WorkerNews::CommandAttempt {
        attempt: 2,
        previous_error: "exit 1".into(),
    };
    let d = after_worker_news(&rebooting, &news, None, &config(), ts(10), 0.0);
    let s = applied(&rebooting, &d);
    assert_eq!(s.reboot.as_ref().unwrap().command_attempts, 2);
    assert_eq!(
        s.message,
        "reboot command failed (exit 1); running attempt 2"
    );

    let d = after_worker_news(
        &rebooting,
        &WorkerNews::CommandGaveUp("exit 1".into()),
        None,
        &config(),
        ts(10),
        0.0,
    );
    let s = applied(&rebooting, &d);
    assert_eq!(s.reboot.unwrap().command_failure.as_deref(), Some("exit 1"));
    assert!(s.message.contains("boot checks go on"), "{}", s.message);
    assert_eq!(
        events(&d),
        vec![(
            EventSubject::Entry,
            EventType::Warning,
            reason::REBOOT_COMMAND_FAILED
        )]
    );
}

// ----- waiting and leaving -----------------------------------------------------------------

#[test]
fn a_waiting_entry_says_why_and_a_blocked_one_warns() {
    let new = entry(None, 0);
    let slots = WaitReason::BehindEarlierEntries { free_slots: 0 };
    let blocked = WaitReason::CannotReboot {
        why: "no BareMetalHost and no reboot command".into(),
    };

    // Never written: Queued since its creation, the reason as its message.
    let d = waiting(&new, &slots, ts(10)).expect("a first message");
    let s = applied(&new, &d);
    assert_eq!(s.phase, Some(EntryPhase::Queued));
    assert_eq!(s.last_transition_time, Some(ts(-100)));
    assert_eq!(s.message, format!("waiting: {}", slots.summary()));
    assert!(d.events.is_empty());

    // Already says so: nothing to write.
    let shown = with(new.clone(), |st| *st = s.clone());
    assert_eq!(waiting(&shown, &slots, ts(20)), None);

    // Blocked: the condition and a Warning.
    let d = waiting(&shown, &blocked, ts(30)).expect("blocked");
    let b = applied(&shown, &d);
    let c = b
        .conditions
        .iter()
        .find(|c| c.type_ == queue_condition::BLOCKED)
        .expect("Blocked");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", queue_condition::CANNOT_REBOOT)
    );
    assert_eq!(
        b.last_transition_time,
        Some(ts(-100)),
        "the phase is not re-entered"
    );
    assert_eq!(
        events(&d),
        vec![(
            EventSubject::Entry,
            EventType::Warning,
            reason::REBOOT_BLOCKED
        )]
    );
    assert!(
        d.events[0]
            .message
            .starts_with("node w1 cannot be rebooted now: ")
    );

    // Still blocked, same words: no second Warning.
    let still = with(shown.clone(), |st| *st = b.clone());
    assert_eq!(waiting(&still, &blocked, ts(40)), None);

    // No longer blocked: the condition goes.
    let d = waiting(&still, &slots, ts(50)).expect("unblocked");
    assert!(applied(&still, &d).conditions.is_empty());

    // Another node's address: its own reason, and a Warning naming both nodes and the address.
    let ambiguous = WaitReason::AmbiguousNodeAddress {
        address: "\"10.0.0.2\"".into(),
        other: "w2".into(),
    };
    let d = waiting(&shown, &ambiguous, ts(60)).expect("blocked");
    let c = applied(&shown, &d)
        .conditions
        .into_iter()
        .find(|c| c.type_ == queue_condition::BLOCKED)
        .expect("Blocked");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", queue_condition::AMBIGUOUS_NODE_ADDRESS)
    );
    assert_eq!(
        events(&d),
        vec![(
            EventSubject::Entry,
            EventType::Warning,
            reason::AMBIGUOUS_NODE_ADDRESS
        )]
    );
    assert_eq!(
        d.events[0].message,
        "node w1 cannot be rebooted now: cannot be rebooted by command: its address \"10.0.0.2\" \
         (from the Node's status) is also an address of node w2; the commands are not run with it"
    );
}

#[test]
fn leaving_the_queue_is_recorded_and_told() {
    let draining = entry(Some(EntryPhase::Draining), 0);
    let rebooting = entry(Some(EntryPhase::Rebooting), 0);
    // (entry, why, event type, reason, metric reason, words in the note)
    let cases: Vec<(
        &RebootQueueEntry,
        DequeueReason,
        EventType,
        &str,
        &str,
        &str,
    )> = vec![
        (
            &draining,
            DequeueReason::Cancelled,
            EventType::Normal,
            reason::CANCELLED,
            "Cancelled",
            "cancelled while draining",
        ),
        (
            &rebooting,
            DequeueReason::Cancelled,
            EventType::Normal,
            reason::CANCELLED,
            "Cancelled",
            "cancelled while rebooting, before any power cycle began",
        ),
        (
            &draining,
            DequeueReason::NodeNotFound,
            EventType::Warning,
            reason::NODE_NOT_FOUND,
            "NodeNotFound",
            "removed: node not found",
        ),
        (
            &draining,
            DequeueReason::Duplicate { first_index: 1 },
            EventType::Warning,
            reason::DUPLICATE_ENTRY,
            "Duplicate",
            "entry 1 already queues this node",
        ),
    ];
    for (e, why, event_type, event_reason, metric, words) in cases {
        let leaving = dequeued(e, &why, e.phase());
        assert_eq!(leaving.event.event_type, event_type, "{why:?}");
        assert_eq!(leaving.event.reason, event_reason, "{why:?}");
        assert_eq!(leaving.metric_reason, metric, "{why:?}");
        assert!(
            leaving.event.message.contains(words),
            "{}",
            leaving.event.message
        );
    }
    let edits = record_cancelled(&draining, ts(5));
    assert_eq!(
        applied(
            &draining,
            &EntryDecision {
                status: edits,
                ..Default::default()
            }
        )
        .phase,
        Some(EntryPhase::Cancelled)
    );
    let already = entry(Some(EntryPhase::Cancelled), 0);
    assert!(record_cancelled(&already, ts(5)).is_empty());
}

#[test]
fn a_completed_reboot_tells_entry_and_node() {
    let rebooting = entry(Some(EntryPhase::Rebooting), 0);
    // (cancelled, uncordoned, reasons in order, metric reason)
    let cases = [
        (
            false,
            true,
            vec![
                reason::BOOT_CONFIRMED,
                reason::BOOT_CONFIRMED,
                reason::UNCORDONED,
                reason::COMPLETED,
            ],
            "Completed",
        ),
        (
            false,
            false,
            vec![
                reason::BOOT_CONFIRMED,
                reason::BOOT_CONFIRMED,
                reason::COMPLETED,
            ],
            "Completed",
        ),
        (
            true,
            true,
            vec![
                reason::BOOT_CONFIRMED,
                reason::BOOT_CONFIRMED,
                reason::UNCORDONED,
                reason::CANCELLED,
            ],
            "Cancelled",
        ),
    ];
    for (cancel, uncordoned, reasons, metric) in cases {
        let e = if cancel {
            cancelled(rebooting.clone())
        } else {
            rebooting.clone()
        };
        let (events, metric_reason) = completed(&e, "node w1 is Ready", uncordoned);
        assert_eq!(events.iter().map(|e| e.reason).collect::<Vec<_>>(), reasons);
        assert_eq!(metric_reason, metric);
        assert_eq!(events[0].message, "node w1 rebooted: node w1 is Ready");
    }
    let w = withdrawn(&rebooting, &host());
    assert_eq!(
        (w.event_type, w.reason),
        (EventType::Normal, reason::REBOOT_WITHDRAWN)
    );
    assert!(w.message.contains("withdrawn from BareMetalHost metal/h1"));
}

#[test]
fn an_entry_wants_the_worker_of_its_phase() {
    use hostcycle_core::queue::entry::{WorkerKind, wanted_worker};
    let by =
        |method| move |s: &mut RebootQueueEntryStatus| s.reboot = Some(RebootProgress::new(method));
    let draining = entry(Some(EntryPhase::Draining), 0);
    let by_command = with(
        entry(Some(EntryPhase::Rebooting), 0),
        by(RebootMethod::Command),
    );
    let by_bmc = with(entry(Some(EntryPhase::Rebooting), 0), by(RebootMethod::Bmc));
    // (entry, wanted worker)
    let cases = [
        (draining.clone(), Some(WorkerKind::Drain)),
        (cancelled(draining), None),
        (by_command.clone(), Some(WorkerKind::Command)),
        // A cancelled entry keeps the boot checks of a command that ran.
        (cancelled(by_command), Some(WorkerKind::Command)),
        (by_bmc, None),
        (entry(Some(EntryPhase::Rebooting), 0), None),
        (entry(Some(EntryPhase::Queued), 0), None),
        (entry(None, 0), None),
    ];
    for (e, wanted) in cases {
        assert_eq!(
            wanted_worker(&e),
            wanted,
            "{:?} cancel={}",
            e.phase(),
            e.spec.cancel
        );
    }
}

/// A drain's completion can be reported while its task is still ending; the command worker
/// that follows must start all the same (it runs the reboot command once, never again).
#[test]
fn a_finished_drain_never_keeps_the_command_from_starting() {
    use hostcycle_core::queue::entry::{WorkerKind, WorkerRoom, worker_room};
    let cases = [
        (None, WorkerKind::Drain, WorkerRoom::Free),
        (None, WorkerKind::Command, WorkerRoom::Free),
        (Some(WorkerKind::Drain), WorkerKind::Drain, WorkerRoom::Busy),
        (
            Some(WorkerKind::Command),
            WorkerKind::Command,
            WorkerRoom::Busy,
        ),
        (
            Some(WorkerKind::Drain),
            WorkerKind::Command,
            WorkerRoom::ReplaceFinished,
        ),
        (
            Some(WorkerKind::Command),
            WorkerKind::Drain,
            WorkerRoom::ReplaceFinished,
        ),
    ];
    for (running, wanted, room) in cases {
        assert_eq!(
            worker_room(running, wanted),
            room,
            "{running:?} → {wanted:?}"
        );
    }
}
