//! The reboot queue at the seams, as tables: the host bound at `Rebooting` (a replaced host is
//! never asked), a power-off seen only in a status written after the request, a new boot ID
//! that completes only once the request left the host or the cycle was seen, what a cancel
//! of a rebooting entry does, the checks made again when a drain completes, and when a failed
//! reboot command runs again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::queue::{HostReference, RebootMethod, RebootProgress};
use hostcycle_core::queue::QueueNodeView;
use hostcycle_core::queue::reboot::{
    AfterDrain, AfterFailedCommand, BmcRebootStep, CancelStep, FailedRun, QueueHostView,
    after_drain, after_failed_command, bmc_reboot_step, cancel_step,
};
use jiff::Timestamp;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

const UID: &str = "entry-uid-1";
const HOST_UID: &str = "host-uid-1";

fn host_ref() -> HostReference {
    HostReference {
        namespace: "metal".into(),
        name: "h1".into(),
    }
}

/// Rebooting since 0, requested at 5, host h1 (uid recorded), boot "boot-a".
fn requested() -> RebootProgress {
    RebootProgress {
        host: Some(host_ref()),
        host_uid: Some(HOST_UID.into()),
        boot_id: Some("boot-a".into()),
        requested_at: Some(ts(5)),
        ..RebootProgress::new(RebootMethod::Bmc)
    }
}

/// Carries the request and the marker, on, status written at 6 (after the request).
fn host() -> QueueHostView {
    QueueHostView {
        reference: host_ref(),
        uid: HOST_UID.into(),
        reboot_annotation: true,
        request_marker: Some(UID.into()),
        powered_on: Some(true),
        last_powered_on: Some(ts(-3_600)),
        last_updated: Some(ts(6)),
        error: None,
        request_taken_at: None,
    }
}

fn node() -> QueueNodeView {
    QueueNodeView {
        name: "w1".into(),
        api_server: false,
        ready: true,
        ready_heartbeat: Some(ts(50)),
        boot_id: Some("boot-a".into()),
        unschedulable: true,
        cordoned_by_queue: true,
        volumes_in_use: 0,
        address: "10.0.0.1".into(),
        reported_addresses: vec!["10.0.0.1".into()],
    }
}

/// A table row: name, progress, host, and what the step must satisfy.
type CancelCase = (
    &'static str,
    RebootProgress,
    Option<QueueHostView>,
    fn(CancelStep) -> bool,
);
/// A table row: name, enabled, remediated, method, want.
type DrainCase = (
    &'static str,
    bool,
    bool,
    Result<RebootMethod, String>,
    AfterDrain,
);
/// A table row: name, attempt, retries, boot check, want.
type CommandCase = (
    &'static str,
    u32,
    u32,
    FailedRun,
    Result<bool, String>,
    AfterFailedCommand,
);

fn step(progress: &RebootProgress, host: &QueueHostView, node: &QueueNodeView) -> BmcRebootStep {
    bmc_reboot_step(UID, ts(0), progress, Some(host), node, ts(60))
}

#[test]
fn a_host_replaced_under_the_same_name_is_never_asked_to_reboot() {
    let replaced = QueueHostView {
        uid: "host-uid-2".into(),
        reboot_annotation: false,
        request_marker: None,
        ..host()
    };
    // Before the request is even on the host: no Request step for the new host.
    for progress in [
        requested(),
        RebootProgress {
            requested_at: None,
            ..requested()
        },
    ] {
        match step(&progress, &replaced, &node()) {
            BmcRebootStep::Wait(text) => {
                assert!(
                    text.contains("replaced") && text.contains("host-uid-2"),
                    "{text}"
                )
            }
            other => panic!("want Wait, got {other:?}"),
        }
        assert_eq!(
            cancel_step(UID, &progress, Some(&replaced), false),
            CancelStep::Remove,
            "nothing to withdraw from a host that is not the bound one"
        );
    }
    // An entry recorded before uids were: the host is taken as it is.
    let legacy = RebootProgress {
        host_uid: None,
        ..requested()
    };
    assert!(matches!(
        step(&legacy, &replaced, &node()),
        BmcRebootStep::Request { record: false }
    ));
}

#[test]
fn the_power_off_counts_only_in_a_status_written_after_the_request() {
    #[rustfmt::skip]
    let cases: Vec<(&str, QueueHostView, bool)> = vec![
        ("off, written after the request → recorded", QueueHostView { powered_on: Some(false), last_updated: Some(ts(7)), ..host() }, true),
        ("off, written before the request (stale) → not recorded", QueueHostView { powered_on: Some(false), last_updated: Some(ts(4)), ..host() }, false),
        ("off, but the host controller reports an error → not recorded",
            QueueHostView { powered_on: Some(false), last_updated: Some(ts(7)), error: Some("BMC unreachable".into()), ..host() }, false),
    ];
    for (name, h, recorded) in cases {
        let got = step(&requested(), &h, &node());
        assert_eq!(
            got == BmcRebootStep::RecordPowerOff { at: ts(60) },
            recorded,
            "{name}: {got:?}"
        );
        if !recorded {
            assert!(matches!(got, BmcRebootStep::Wait(_)), "{name}: {got:?}");
        }
    }
    let in_error = QueueHostView {
        powered_on: Some(false),
        last_updated: Some(ts(7)),
        error: Some("BMC unreachable".into()),
        ..host()
    };
    match step(&requested(), &in_error, &node()) {
        BmcRebootStep::Wait(text) => assert!(text.contains("BMC unreachable"), "{text}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_new_boot_id_completes_only_once_the_request_left_the_host_or_the_cycle_was_seen() {
    let rebooted = QueueNodeView {
        boot_id: Some("boot-b".into()),
        ready_heartbeat: Some(ts(50)),
        ..node()
    };
    // The request still on the host, no power-off seen: some other reboot; keep waiting.
    match step(&requested(), &host(), &rebooted) {
        BmcRebootStep::Wait(_) => {}
        other => panic!("a new boot ID with the request pending completed: {other:?}"),
    }
    // The request consumed (annotation gone): booted.
    let consumed = QueueHostView {
        reboot_annotation: false,
        ..host()
    };
    assert!(matches!(
        step(&requested(), &consumed, &rebooted),
        BmcRebootStep::Booted { .. }
    ));
    // The power-off seen by the queue: booted (from the power-off on).
    let seen = RebootProgress {
        host_powered_off_at: Some(ts(20)),
        ..requested()
    };
    assert!(matches!(
        step(
            &seen,
            &QueueHostView {
                powered_on: None,
                ..host()
            },
            &rebooted
        ),
        BmcRebootStep::Booted { .. }
    ));
}

#[test]
fn cancelling_a_rebooting_entry_withdraws_only_a_cycle_that_has_not_begun() {
    let wait = |s: CancelStep| matches!(s, CancelStep::WaitForCycle(_));
    #[rustfmt::skip]
    let cases: Vec<CancelCase> = vec![
        ("requested, still on, nothing begun → withdraw", requested(), Some(host()), |s| s == CancelStep::Withdraw),
        ("no request recorded → remove", RebootProgress { requested_at: None, ..requested() }, Some(host()), |s| s == CancelStep::Remove),
        ("the patch never reached the host (no marker) → remove",
            requested(), Some(QueueHostView { request_marker: None, reboot_annotation: false, ..host() }), |s| s == CancelStep::Remove),
        ("the host is gone → remove", requested(), None, |s| s == CancelStep::Remove),
        ("the queue saw the host off → keep cordoned until booted",
            RebootProgress { host_powered_off_at: Some(ts(20)), ..requested() }, Some(host()), wait),
        ("the host reports off → keep cordoned", requested(), Some(QueueHostView { powered_on: Some(false), ..host() }), wait),
        ("the request was consumed (annotation gone, marker ours) → keep cordoned",
            requested(), Some(QueueHostView { reboot_annotation: false, ..host() }), wait),
        ("hostcycle's controller took the request (pending reboot or power-off recorded, write-ahead) → keep cordoned",
            requested(), Some(QueueHostView { request_taken_at: Some(ts(6)), ..host() }), wait),
        ("a request taken before this one is someone else's → withdraw",
            requested(), Some(QueueHostView { request_taken_at: Some(ts(1)), ..host() }), |s| s == CancelStep::Withdraw),
        ("command method, never run → remove",
            RebootProgress::new(RebootMethod::Command), None, |s| s == CancelStep::Remove),
        ("command method, run (even failed) → keep cordoned until the boot check passes",
            RebootProgress { command_attempts: 2, command_failure: Some("timed out".into()), ..RebootProgress::new(RebootMethod::Command) }, None, wait),
    ];
    for (name, progress, h, ok) in cases {
        let got = cancel_step(UID, &progress, h.as_ref(), false);
        assert!(ok(got.clone()), "{name}: got {got:?}");
        if let CancelStep::WaitForCycle(text) = got {
            assert!(
                text.contains("cordoned") && text.contains("delete the entry"),
                "{name}: {text}"
            );
        }
        // Past bootTimeoutSeconds a cancel removes the entry whatever the cycle did.
        assert_eq!(
            cancel_step(UID, &progress, h.as_ref(), true),
            CancelStep::Remove,
            "{name}, boot timed out"
        );
    }
}

#[test]
fn a_completed_drain_reboots_only_if_the_queue_is_enabled_and_no_remediation_started() {
    #[rustfmt::skip]
    let cases: Vec<DrainCase> = vec![
        ("enabled, not remediated, BMC → reboot", true, false, Ok(RebootMethod::Bmc), AfterDrain::Reboot(RebootMethod::Bmc)),
        ("enabled, command → reboot by command", true, false, Ok(RebootMethod::Command), AfterDrain::Reboot(RebootMethod::Command)),
        ("disabled meanwhile → stop", false, false, Ok(RebootMethod::Bmc), AfterDrain::Stop(String::new())),
        ("a remediation started meanwhile → stop", true, true, Ok(RebootMethod::Bmc), AfterDrain::Stop(String::new())),
        ("disabled and remediated → stop", false, true, Err("no host".into()), AfterDrain::Stop(String::new())),
        ("no way to reboot → blocked with the reason", true, false, Err("no host".into()), AfterDrain::Blocked("no host".into())),
    ];
    for (name, enabled, remediated, method, want) in cases {
        let got = after_drain(enabled, remediated, method);
        match (&got, &want) {
            (AfterDrain::Stop(text), AfterDrain::Stop(_)) => {
                assert!(!text.is_empty(), "{name}: says why")
            }
            _ => assert_eq!(got, want, "{name}"),
        }
    }
}

#[test]
fn a_failed_reboot_command_runs_again_only_when_the_boot_check_says_not_booted() {
    #[rustfmt::skip]
    let cases: Vec<CommandCase> = vec![
        ("exited, not booted, a retry left → attempt 2", 1, 1, FailedRun::Exited, Ok(false), AfterFailedCommand::Retry { attempt: 2 }),
        ("timed out, not booted → no retry: the reboot may be pending", 1, 3, FailedRun::TimedOut, Ok(false), AfterFailedCommand::GiveUp(String::new())),
        ("timed out after rebooting it (booted after all) → no retry", 1, 3, FailedRun::TimedOut, Ok(true), AfterFailedCommand::Booted),
        ("exited, booted after all → no retry", 1, 3, FailedRun::Exited, Ok(true), AfterFailedCommand::Booted),
        ("exited, not booted, retries used up → give up", 2, 1, FailedRun::Exited, Ok(false), AfterFailedCommand::GiveUp(String::new())),
        ("exited, the boot check cannot tell → no retry", 1, 3, FailedRun::Exited, Err("boot check timed out".into()), AfterFailedCommand::GiveUp(String::new())),
        ("timed out, the boot check cannot tell → no retry", 1, 3, FailedRun::TimedOut, Err("unreachable".into()), AfterFailedCommand::GiveUp(String::new())),
    ];
    for (name, attempt, retries, run, check, want) in cases {
        let got = after_failed_command(attempt, retries, run, check);
        match (&got, &want) {
            (AfterFailedCommand::GiveUp(text), AfterFailedCommand::GiveUp(_)) => {
                assert!(!text.is_empty(), "{name}")
            }
            _ => assert_eq!(got, want, "{name}"),
        }
    }
    match after_failed_command(1, 3, FailedRun::TimedOut, Ok(false)) {
        AfterFailedCommand::GiveUp(text) => assert!(text.contains("pending"), "{text}"),
        other => panic!("{other:?}"),
    }
    match after_failed_command(1, 3, FailedRun::Exited, Err("boot check timed out".into())) {
        AfterFailedCommand::GiveUp(text) => assert!(text.contains("boot check timed out")),
        other => panic!("{other:?}"),
    }
}
