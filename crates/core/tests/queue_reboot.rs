//! Reboot rules of the reboot queue, as tables: when a BMC reboot is requested (write-ahead,
//! never twice), what proves the node booted, and the Command method's attempts, boot check
//! and boot timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hostcycle_api::queue::{HostReference, RebootMethod, RebootProgress};
use hostcycle_core::queue::QueueNodeView;
use hostcycle_core::queue::reboot::{
    BmcRebootStep, QueueHostView, RebootCommandStep, bmc_reboot_step, boot_check_passed,
    boot_deadline, boot_overdue, next_command_attempt, reboot_command_step,
};
use jiff::Timestamp;

/// A fixed instant plus `s` seconds. `T` (the `Rebooting` transition) is `ts(0)`.
fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

const UID: &str = "entry-uid-1";
/// The `Rebooting` transition.
fn rebooting_since() -> Timestamp {
    ts(0)
}

fn host_ref() -> HostReference {
    HostReference {
        namespace: "metal".into(),
        name: "h1".into(),
    }
}

/// The write-ahead record of a BMC reboot requested at `ts(5)`, boot ID "boot-a" recorded.
fn requested() -> RebootProgress {
    RebootProgress {
        host: Some(host_ref()),
        boot_id: Some("boot-a".into()),
        requested_at: Some(ts(5)),
        ..RebootProgress::new(RebootMethod::Bmc)
    }
}

/// Nothing recorded yet but the method and host.
fn fresh() -> RebootProgress {
    RebootProgress {
        host: Some(host_ref()),
        boot_id: Some("boot-a".into()),
        ..RebootProgress::new(RebootMethod::Bmc)
    }
}

/// The host after the queue's patch: reboot annotation and our marker, still on, powered on
/// last an hour before `T`.
fn host() -> QueueHostView {
    QueueHostView {
        reference: host_ref(),
        uid: "host-uid-1".into(),
        reboot_annotation: true,
        request_marker: Some(UID.into()),
        powered_on: Some(true),
        last_powered_on: Some(ts(-3_600)),
        // Statuses in these tables are written after the request unless a case says else.
        last_updated: Some(ts(1_000_000)),
        error: None,
        request_taken_at: None,
    }
}

/// The node as it was before the reboot: Ready, heartbeat just before `T`, boot "boot-a".
fn node() -> QueueNodeView {
    QueueNodeView {
        name: "w1".into(),
        api_server: false,
        ready: true,
        ready_heartbeat: Some(ts(-5)),
        boot_id: Some("boot-a".into()),
        unschedulable: true,
        cordoned_by_queue: true,
        volumes_in_use: 0,
        address: "10.0.0.1".into(),
        reported_addresses: vec!["10.0.0.1".into()],
    }
}

fn progress_with(f: impl FnOnce(&mut RebootProgress)) -> RebootProgress {
    let mut p = requested();
    f(&mut p);
    p
}

fn host_with(f: impl FnOnce(&mut QueueHostView)) -> QueueHostView {
    let mut h = host();
    f(&mut h);
    h
}

fn node_with(f: impl FnOnce(&mut QueueNodeView)) -> QueueNodeView {
    let mut n = node();
    f(&mut n);
    n
}

/// What the step must be: exact, or a `Wait` whose text holds these words.
#[derive(Debug)]
enum Want {
    Is(BmcRebootStep),
    WaitSaying(&'static [&'static str]),
    /// The boot canary failed, saying these words.
    NotPowerCycled(&'static [&'static str]),
}

struct Case {
    name: &'static str,
    progress: RebootProgress,
    host: Option<QueueHostView>,
    node: QueueNodeView,
    want: Want,
}

const NOW: i64 = 300;

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in cases {
        let got = bmc_reboot_step(
            UID,
            rebooting_since(),
            &c.progress,
            c.host.as_ref(),
            &c.node,
            ts(NOW),
        );
        let ok = match (&c.want, &got) {
            (Want::Is(w), g) => w == g,
            (Want::WaitSaying(words), BmcRebootStep::Wait(text))
            | (Want::NotPowerCycled(words), BmcRebootStep::NotPowerCycled(text)) => {
                words.iter().all(|w| text.contains(w))
            }
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "case {:?}: want {:?}, got {:?}",
                c.name, c.want, got
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bmc_reboot_is_requested_write_ahead_and_never_twice() {
    run(vec![
        Case {
            name: "nothing recorded → record requestedAt first, then patch the host",
            progress: fresh(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.request_marker = None;
            })),
            node: node(),
            want: Want::Is(BmcRebootStep::Request { record: true }),
        },
        Case {
            name: "recorded but the marker is missing → the patch never landed: patch only",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.request_marker = None;
            })),
            node: node(),
            want: Want::Is(BmcRebootStep::Request { record: false }),
        },
        Case {
            name: "recorded but the marker names another entry → patch only",
            progress: requested(),
            host: Some(host_with(|h| h.request_marker = Some("other-entry".into()))),
            node: node(),
            want: Want::Is(BmcRebootStep::Request { record: false }),
        },
        Case {
            name: "recorded and marked, annotation still there → wait for the power-off",
            progress: requested(),
            host: Some(host()),
            node: node(),
            want: Want::WaitSaying(&["BareMetalHost controller", "metal/h1", "off"]),
        },
        Case {
            name: "recorded and marked, annotation gone, host still on → wait, never re-request",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node(),
            want: Want::WaitSaying(&["metal/h1", "power off and on"]),
        },
        Case {
            name: "host missing → wait naming it, nothing requested",
            progress: requested(),
            host: None,
            node: node(),
            want: Want::WaitSaying(&["BareMetalHost metal/h1 not found"]),
        },
        Case {
            name: "host missing before anything was recorded → wait, nothing requested",
            progress: fresh(),
            host: None,
            node: node(),
            want: Want::WaitSaying(&["metal/h1", "not found"]),
        },
        Case {
            name: "host missing and none recorded → wait saying so",
            progress: progress_with(|p| p.host = None),
            host: None,
            node: node(),
            want: Want::WaitSaying(&["(none recorded)", "not found"]),
        },
    ]);
}

#[test]
fn bmc_boot_needs_a_power_on_after_t_and_a_ready_heartbeat_after_that() {
    run(vec![
        Case {
            name: "lastPoweredOn after T + Ready with a heartbeat after it → booted",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = Some(ts(100));
            })),
            node: node_with(|n| {
                n.ready_heartbeat = Some(ts(150));
                n.boot_id = Some("boot-b".into());
            }),
            want: Want::Is(BmcRebootStep::Booted {
                boot_started: ts(100),
            }),
        },
        Case {
            name: "lastPoweredOn after T + Ready, but the boot ID recorded at T → never power-cycled (boot canary)",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = Some(ts(100));
            })),
            node: node_with(|n| {
                n.ready_heartbeat = Some(ts(150));
            }),
            want: Want::NotPowerCycled(&["metal/h1", "still reports boot ID boot-a"]),
        },
        Case {
            name: "lastPoweredOn after T but the heartbeat is older than the power-on → wait",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = Some(ts(100));
            })),
            node: node_with(|n| n.ready_heartbeat = Some(ts(90))),
            want: Want::WaitSaying(&["powered on again", "node w1", "Ready"]),
        },
        Case {
            name: "a heartbeat at the very instant of the power-on is not after it → wait",
            progress: requested(),
            host: Some(host_with(|h| h.last_powered_on = Some(ts(100)))),
            node: node_with(|n| n.ready_heartbeat = Some(ts(100))),
            want: Want::WaitSaying(&["powered on again"]),
        },
        Case {
            name: "lastPoweredOn after T, fresh heartbeat, but not Ready → wait",
            progress: requested(),
            host: Some(host_with(|h| h.last_powered_on = Some(ts(100)))),
            node: node_with(|n| {
                n.ready = false;
                n.ready_heartbeat = Some(ts(150));
            }),
            want: Want::WaitSaying(&["powered on again"]),
        },
        Case {
            name: "lastPoweredOn after T, Ready but no heartbeat at all → wait",
            progress: requested(),
            host: Some(host_with(|h| h.last_powered_on = Some(ts(100)))),
            node: node_with(|n| n.ready_heartbeat = None),
            want: Want::WaitSaying(&["powered on again"]),
        },
        Case {
            name: "lastPoweredOn before T is not evidence, however fresh the heartbeat",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = Some(ts(-1));
            })),
            node: node_with(|n| n.ready_heartbeat = Some(ts(290))),
            want: Want::WaitSaying(&["power off and on"]),
        },
        Case {
            name: "lastPoweredOn exactly at T is not evidence",
            progress: requested(),
            host: Some(host_with(|h| h.last_powered_on = Some(ts(0)))),
            node: node_with(|n| n.ready_heartbeat = Some(ts(290))),
            want: Want::WaitSaying(&["waiting for the BareMetalHost controller"]),
        },
        Case {
            name: "lastPoweredOn after T wins over a recorded power-off as the boot start",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(20))),
            host: Some(host_with(|h| h.last_powered_on = Some(ts(60)))),
            node: node_with(|n| {
                n.ready_heartbeat = Some(ts(61));
                n.boot_id = Some("boot-b".into());
            }),
            want: Want::Is(BmcRebootStep::Booted {
                boot_started: ts(60),
            }),
        },
    ]);
}

#[test]
fn bmc_power_off_is_recorded_once_and_counts_as_evidence_once_the_host_is_on_again() {
    run(vec![
        Case {
            name: "host seen off, not yet recorded → record the power-off now",
            progress: requested(),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.powered_on = Some(false);
            })),
            node: node_with(|n| n.ready = false),
            want: Want::Is(BmcRebootStep::RecordPowerOff { at: ts(NOW) }),
        },
        Case {
            name: "host off, already recorded → wait for it to power on (no second record)",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(20))),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.powered_on = Some(false);
            })),
            node: node_with(|n| n.ready = false),
            want: Want::WaitSaying(&["metal/h1 is powered off", "power on"]),
        },
        Case {
            name: "metal3 mode (no lastPoweredOn): recorded off + host on + fresh heartbeat → booted",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(60))),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = None;
            })),
            node: node_with(|n| {
                n.ready_heartbeat = Some(ts(120));
                n.boot_id = Some("boot-b".into());
            }),
            want: Want::Is(BmcRebootStep::Booted {
                boot_started: ts(60),
            }),
        },
        Case {
            name: "metal3 mode: recorded off + host on, heartbeat from before the power-off → wait",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(60))),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = None;
            })),
            node: node_with(|n| n.ready_heartbeat = Some(ts(59))),
            want: Want::WaitSaying(&["powered on again", "w1"]),
        },
        Case {
            name: "metal3 mode: recorded off, power state unknown → no evidence yet",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(60))),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = None;
                h.powered_on = None;
            })),
            node: node_with(|n| n.ready_heartbeat = Some(ts(120))),
            want: Want::WaitSaying(&["power off and on"]),
        },
        Case {
            name: "host on again with a stale lastPoweredOn + recorded off → the off time counts",
            progress: progress_with(|p| p.host_powered_off_at = Some(ts(60))),
            host: Some(host_with(|h| {
                h.reboot_annotation = false;
                h.last_powered_on = Some(ts(-3_600));
            })),
            node: node_with(|n| {
                n.ready_heartbeat = Some(ts(61));
                n.boot_id = Some("boot-b".into());
            }),
            want: Want::Is(BmcRebootStep::Booted {
                boot_started: ts(60),
            }),
        },
    ]);
}

#[test]
fn bmc_boot_id_change_proves_a_boot_once_ready_after_the_request() {
    run(vec![
        Case {
            name: "new bootID + Ready with a heartbeat after requestedAt → booted",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| {
                n.boot_id = Some("boot-b".into());
                n.ready_heartbeat = Some(ts(6));
            }),
            want: Want::Is(BmcRebootStep::Booted {
                boot_started: ts(5),
            }),
        },
        Case {
            name: "new bootID but the heartbeat predates requestedAt → wait",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| {
                n.boot_id = Some("boot-b".into());
                n.ready_heartbeat = Some(ts(4));
            }),
            want: Want::WaitSaying(&["powered on again"]),
        },
        Case {
            name: "new bootID but NotReady → wait",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| {
                n.boot_id = Some("boot-b".into());
                n.ready = false;
                n.ready_heartbeat = Some(ts(200));
            }),
            want: Want::WaitSaying(&["Ready"]),
        },
        Case {
            name: "same bootID is no evidence",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| n.ready_heartbeat = Some(ts(200))),
            want: Want::WaitSaying(&["power off and on"]),
        },
        Case {
            name: "no bootID recorded at T: a bootID now is no evidence",
            progress: progress_with(|p| p.boot_id = None),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| {
                n.boot_id = Some("boot-b".into());
                n.ready_heartbeat = Some(ts(200));
            }),
            want: Want::WaitSaying(&["power off and on"]),
        },
        Case {
            name: "node reports no bootID: no evidence",
            progress: requested(),
            host: Some(host_with(|h| h.reboot_annotation = false)),
            node: node_with(|n| {
                n.boot_id = None;
                n.ready_heartbeat = Some(ts(200));
            }),
            want: Want::WaitSaying(&["power off and on"]),
        },
        Case {
            name: "a new bootID does not skip the write-ahead: no marker → request",
            progress: requested(),
            host: Some(host_with(|h| h.request_marker = None)),
            node: node_with(|n| {
                n.boot_id = Some("boot-b".into());
                n.ready_heartbeat = Some(ts(200));
            }),
            want: Want::Is(BmcRebootStep::Request { record: false }),
        },
    ]);
}

/// The whole BMC reboot against metal3's baremetal-operator (no `lastPoweredOn`), one step
/// at a time, applying each step as the controller would.
#[test]
fn bmc_reboot_sequence_against_metal3_requests_once_and_boots() {
    let mut progress = fresh();
    let mut h = host_with(|h| {
        h.reboot_annotation = false;
        h.request_marker = None;
        h.last_powered_on = None;
    });
    let mut n = node();
    let step = |p: &RebootProgress, h: &QueueHostView, n: &QueueNodeView, at: i64| {
        bmc_reboot_step(UID, rebooting_since(), p, Some(h), n, ts(at))
    };

    // 1. Write-ahead.
    assert_eq!(
        step(&progress, &h, &n, 1),
        BmcRebootStep::Request { record: true }
    );
    progress.requested_at = Some(ts(1));
    // A crash before the patch: asked again, without a second record.
    assert_eq!(
        step(&progress, &h, &n, 2),
        BmcRebootStep::Request { record: false }
    );
    // 2. The patch lands.
    h.reboot_annotation = true;
    h.request_marker = Some(UID.into());
    for at in [3, 4, 10] {
        assert!(matches!(
            step(&progress, &h, &n, at),
            BmcRebootStep::Wait(_)
        ));
    }
    // 3. The BMH controller powers the host off and removes the annotation.
    h.powered_on = Some(false);
    h.reboot_annotation = false;
    n.ready = false;
    assert_eq!(
        step(&progress, &h, &n, 30),
        BmcRebootStep::RecordPowerOff { at: ts(30) }
    );
    progress.host_powered_off_at = Some(ts(30));
    assert!(matches!(
        step(&progress, &h, &n, 31),
        BmcRebootStep::Wait(_)
    ));
    // 4. Powered on; the kubelet is not back yet.
    h.powered_on = Some(true);
    assert!(matches!(
        step(&progress, &h, &n, 60),
        BmcRebootStep::Wait(_)
    ));
    // 5. The kubelet reports Ready again — from the same boot (the power cycle reached
    // another machine): never complete (the boot canary).
    n.ready = true;
    n.ready_heartbeat = Some(ts(90));
    assert!(matches!(
        step(&progress, &h, &n, 91),
        BmcRebootStep::NotPowerCycled(why) if why.contains("still reports boot ID boot-a")
    ));
    // 6. From a new boot: booted.
    n.boot_id = Some("boot-b".into());
    assert_eq!(
        step(&progress, &h, &n, 91),
        BmcRebootStep::Booted {
            boot_started: ts(30)
        }
    );
}

// ---------------------------------------------------------------------------------------
// Command method.

#[test]
fn reboot_command_runs_only_when_no_attempt_was_ever_recorded() {
    let command = |attempts: u32, failure: Option<&str>| RebootProgress {
        command_attempts: attempts,
        command_failure: failure.map(str::to_string),
        ..RebootProgress::new(RebootMethod::Command)
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, RebootProgress, RebootCommandStep)> = vec![
        ("never ran → run attempt 1", command(0, None), RebootCommandStep::Run { attempt: 1 }),
        ("one attempt recorded (maybe mid-run at a crash) → never again", command(1, None), RebootCommandStep::AlreadyRequested),
        ("several attempts → never again", command(4, None), RebootCommandStep::AlreadyRequested),
        ("gave up → never again", command(3, Some("exit 1")), RebootCommandStep::AlreadyRequested),
        ("u32::MAX attempts → never again", command(u32::MAX, None), RebootCommandStep::AlreadyRequested),
    ];
    for (name, progress, want) in cases {
        assert_eq!(reboot_command_step(&progress), want, "{name}");
    }
}

#[test]
fn next_command_attempt_allows_retries_plus_one_runs() {
    #[rustfmt::skip]
    let cases: Vec<(u32, u32, Option<u32>)> = vec![
        // (attempt that failed, commandRetries, next)
        (1, 0, None),
        (1, 1, Some(2)),
        (2, 1, None),
        (1, 3, Some(2)),
        (3, 3, Some(4)),
        (4, 3, None),
        (9, 3, None),
        (u32::MAX - 1, u32::MAX, Some(u32::MAX)),
        // The last representable attempt has no next one (and no overflow).
        (u32::MAX, u32::MAX, None),
    ];
    for (attempt, retries, want) in cases {
        assert_eq!(
            next_command_attempt(attempt, retries),
            want,
            "attempt {attempt}, retries {retries}"
        );
    }
    // Counting runs: exactly retries + 1.
    for retries in 0..6 {
        let mut runs = 1;
        let mut attempt = 1;
        while let Some(next) = next_command_attempt(attempt, retries) {
            attempt = next;
            runs += 1;
        }
        assert_eq!(runs, retries + 1, "retries {retries}");
    }
}

#[test]
fn boot_check_passes_only_on_exit_zero_and_true() {
    #[rustfmt::skip]
    let cases: Vec<(&str, bool, &str, bool)> = vec![
        ("true", true, "true", true),
        ("true + newline", true, "true\n", true),
        ("whitespace around", true, "  \ttrue \r\n", true),
        ("True is not true", true, "True", false),
        ("TRUE is not true", true, "TRUE\n", false),
        ("yes is not true", true, "yes", false),
        ("1 is not true", true, "1", false),
        ("empty output", true, "", false),
        ("extra words", true, "true true", false),
        ("a log line before", true, "booting...\ntrue", false),
        ("non-zero exit printing true", false, "true", false),
        ("non-zero exit, empty", false, "", false),
    ];
    for (name, exit_ok, stdout, want) in cases {
        assert_eq!(boot_check_passed(exit_ok, stdout), want, "{name}");
    }
}

#[test]
fn boot_is_overdue_from_the_rebooting_transition() {
    let timeout = Duration::from_secs(1_800);
    #[rustfmt::skip]
    let cases: Vec<(&str, i64, bool)> = vec![
        ("just rebooted", 0, false),
        ("one second early", 1_799, false),
        ("exactly at the timeout", 1_800, true),
        ("past the timeout", 7_200, true),
        ("clock behind the transition", -60, false),
    ];
    for (name, now, want) in cases {
        assert_eq!(boot_overdue(ts(0), ts(now), timeout), want, "{name}");
    }
    assert_eq!(boot_deadline(ts(0), timeout), ts(1_800));
    assert_eq!(
        boot_deadline(Timestamp::MAX, timeout),
        Timestamp::MAX,
        "saturates"
    );
    assert!(!boot_overdue(ts(0), Timestamp::MAX, Duration::MAX));
}
