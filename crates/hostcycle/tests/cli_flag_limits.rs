//! No flag value makes `hostcycle` panic (exit 101): durations past the documented maximum
//! (365 days) are refused by the argument parser with a message naming the limit.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn hostcycle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(args)
        .env("HOSTCYCLE_BMC_PASSWORD", "not-used-here")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap()
}

const HUGE: &[&str] = &[
    "18446744073709551615",
    "18446744073709551615s",
    "9223372036854775807s",
    "8785h",
];

fn assert_refused(args: &[&str]) {
    let output = hostcycle(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{args:?} should be a usage error (not a panic): {stderr}"
    );
    assert!(
        stderr.contains("longer than the maximum of 365 days") || stderr.contains("not a duration"),
        "{args:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
}

#[test]
fn bmc_duration_flags_refuse_huge_values() {
    let base = [
        "bmc",
        "off",
        "--address",
        "redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
        "--username",
        "admin",
    ];
    for flag in [
        "--request-timeout",
        "--wait-timeout",
        "--poll-interval",
        "--soft-timeout",
    ] {
        for value in HUGE {
            let mut args = base.to_vec();
            args.extend([flag, value]);
            assert_refused(&args);
        }
    }
}

#[test]
fn the_largest_accepted_request_timeout_does_not_panic() {
    // The maximum itself is accepted; the unreachable BMC is then an ordinary error (exit 1).
    let output = hostcycle(&[
        "bmc",
        "status",
        "--address",
        "redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
        "--username",
        "admin",
        "--request-timeout",
        "8760h",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
}

#[test]
fn operator_duration_flags_refuse_huge_values() {
    for flag in [
        "--steady-poll",
        "--transition-poll",
        "--soft-power-off-timeout",
        "--bmc-request-timeout",
        "--bmc-call-deadline",
        "--remediation-power-on-timeout",
    ] {
        for value in ["9223372036854775807s", "8785h"] {
            assert_refused(&["operator", flag, value]);
        }
    }
}

#[test]
fn reboot_queue_and_sim_duration_flags_refuse_huge_values() {
    for value in ["9223372036854775807s", "8785h"] {
        assert_refused(&["reboot-queue", "wait", "--timeout", value]);
        // `sim` exists only in builds with the `lab` feature (tests/production_build.rs
        // checks the production build has none).
        if cfg!(feature = "lab") {
            assert_refused(&["sim", "--boot-delay", value]);
            assert_refused(&["sim", "--lease-interval", value]);
        }
    }
}

#[test]
fn webhook_duration_flags_refuse_huge_values() {
    for flag in [
        "--request-timeout",
        "--tls-reload-interval",
        "--idle-timeout",
        "--header-timeout",
    ] {
        for value in HUGE {
            assert_refused(&[
                "webhook",
                "--tls-cert-file",
                "tls.crt",
                "--tls-key-file",
                "tls.key",
                flag,
                value,
            ]);
        }
    }
}
