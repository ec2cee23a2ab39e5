//! The command driver (CKE-compatible reboot and boot-check commands) with real scripts.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hostcycle_bmc::{
    BmcError, CommandDriver, CommandDriverConfig, PowerDriver, PowerOffMode, PowerState,
};

/// Writes an executable script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A "cluster" whose reboot command records its argv and marks the node as rebooted after a
/// moment, and whose boot check prints `true` when the node booted after the given time.
fn tooling(dir: &Path) -> CommandDriverConfig {
    let reboot = script(
        dir,
        "reboot",
        &format!(
            "echo \"$@\" >> {d}/reboot.log\nfor node; do :; done\necho rebooting $node\n\
             (sleep 1; date +%s > {d}/booted-$node) > /dev/null 2>&1 &",
            d = dir.display()
        ),
    );
    let check = script(
        dir,
        "boot-check",
        &format!(
            "echo \"$@\" >> {d}/check.log\n\
             f={d}/booted-$1\n\
             if [ -f $f ] && [ $(cat $f) -ge $2 ]; then echo true; else echo false; fi",
            d = dir.display()
        ),
    );
    CommandDriverConfig {
        reboot_command: vec![
            reboot.display().to_string(),
            "--cluster".into(),
            "lab".into(),
        ],
        boot_check_command: vec![check.display().to_string()],
        command_timeout: Some(Duration::from_secs(10)),
    }
}

#[tokio::test]
async fn reboots_and_reports_the_boot() {
    let dir = tempfile::tempdir().unwrap();
    // The node booted long ago.
    std::fs::write(dir.path().join("booted-node-1"), "1000\n").unwrap();
    let driver = CommandDriver::new(tooling(dir.path()), "node-1").unwrap();
    assert_eq!(
        driver.power_state().await.unwrap(),
        PowerState::On,
        "booted since the epoch"
    );

    let before = jiff::Timestamp::now();
    let outcome = driver.reboot(PowerOffMode::Soft).await.unwrap();
    assert!(
        outcome
            .action
            .as_deref()
            .unwrap()
            .contains("--cluster lab node-1"),
        "{outcome:?}"
    );
    assert_eq!(outcome.output.as_deref(), Some("rebooting node-1"));
    let log = std::fs::read_to_string(dir.path().join("reboot.log")).unwrap();
    assert_eq!(log, "--cluster lab node-1\n");

    // Until the node comes back, the reboot is in progress.
    assert_eq!(
        driver.power_state().await.unwrap(),
        PowerState::Transitioning
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while driver.power_state().await.unwrap() != PowerState::On {
        assert!(
            Instant::now() < deadline,
            "timed out after 10s waiting for the node to boot"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The boot check was asked about boots after the reboot started.
    let checks = std::fs::read_to_string(dir.path().join("check.log")).unwrap();
    let last: Vec<&str> = checks.lines().last().unwrap().split(' ').collect();
    assert_eq!(last[0], "node-1");
    let since: i64 = last[1].parse().unwrap();
    assert!(
        (since - before.as_second()).abs() <= 1,
        "{since} vs {before}"
    );
}

#[tokio::test]
async fn booted_only_on_exit_zero_and_true() {
    let dir = tempfile::tempdir().unwrap();
    let reboot = script(dir.path(), "reboot", "true").display().to_string();
    let cases = [
        ("echo true", true),
        ("echo '  true  '", true),
        ("echo yes", false),
        ("echo true; exit 3", false),
        ("echo TRUE", false),
        ("exit 0", false),
    ];
    for (body, expected) in cases {
        let check = script(dir.path(), "check", body).display().to_string();
        let config = CommandDriverConfig {
            reboot_command: vec![reboot.clone()],
            boot_check_command: vec![check],
            command_timeout: Some(Duration::from_secs(5)),
        };
        let driver = CommandDriver::new(config, "n").unwrap();
        assert_eq!(
            driver
                .booted_since(jiff::Timestamp::UNIX_EPOCH)
                .await
                .unwrap(),
            expected,
            "{body}"
        );
    }
}

#[tokio::test]
async fn arguments_are_not_interpreted_by_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let reboot = script(
        dir.path(),
        "reboot",
        &format!("printf '%s' \"$1\" > {}/arg", dir.path().display()),
    );
    let config = CommandDriverConfig {
        reboot_command: vec![reboot.display().to_string()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    let node = format!("node; touch {}", marker.display());
    let driver = CommandDriver::new(config, node.clone()).unwrap();
    driver.reboot(PowerOffMode::Hard).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("arg")).unwrap(),
        node
    );
    assert!(!marker.exists());
}

/// A node that would read as an option (`-oProxyCommand=…` to ssh) never reaches the
/// commands: the driver is not made, and a recording command never runs.
#[tokio::test]
async fn a_node_starting_with_a_hyphen_is_never_passed_to_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let record = script(
        dir.path(),
        "record",
        &format!("echo \"$@\" >> {}/argv\necho true", dir.path().display()),
    );
    let config = CommandDriverConfig {
        reboot_command: vec![record.display().to_string()],
        boot_check_command: vec![record.display().to_string()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    let long = format!("-o{}", "x".repeat(10_000));
    for node in ["-oProxyCommand=touch /tmp/pwned", "-", "--", long.as_str()] {
        let err = CommandDriver::new(config.clone(), node).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, BmcError::Config(_)), "{err:?}");
        assert!(text.contains("starts with '-'"), "{text}");
        assert!(
            text.len() < 300,
            "the node is clipped: {} bytes",
            text.len()
        );
    }
    assert!(!dir.path().join("argv").exists(), "a command ran");
    // A node with a hyphen inside is fine.
    let driver = CommandDriver::new(config, "node-1").unwrap();
    driver.reboot(PowerOffMode::Hard).await.unwrap();
    let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
    assert_eq!(argv, "node-1\n");
}

#[tokio::test]
async fn a_failing_reboot_command_is_an_error_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let reboot = script(dir.path(), "reboot", "echo 'cannot reach node' >&2; exit 4");
    let config = CommandDriverConfig {
        reboot_command: vec![reboot.display().to_string()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    let driver = CommandDriver::new(config, "node-9").unwrap();
    let err = driver.reboot(PowerOffMode::Hard).await.unwrap_err();
    assert!(matches!(err, BmcError::Command { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("node-9 failed (exit status: 4)"),
        "{message}"
    );
    assert!(message.contains("cannot reach node"), "{message}");
    assert_eq!(
        driver.reboot_started(),
        None,
        "a failed reboot does not count"
    );
}

#[tokio::test]
async fn a_hanging_command_is_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let reboot = script(
        dir.path(),
        "reboot",
        &format!("echo $$ > {}\nexec sleep 60", pid_file.display()),
    );
    let config = CommandDriverConfig {
        reboot_command: vec![reboot.display().to_string()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_millis(500)),
    };
    let driver = CommandDriver::new(config, "node-2").unwrap();
    let start = Instant::now();
    let err = driver.reboot(PowerOffMode::Hard).await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(err, BmcError::Timeout { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("timed out after 500ms waiting for command"),
        "{err}"
    );
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    // The child was killed (and reaped by tokio); its /proc entry goes away.
    let gone = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            Instant::now() < gone,
            "timed out after 5s waiting for pid {pid} to die"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// No timeout (CKE's `command_timeout_seconds: 0`): a command slower than any deadline the
/// other tests use is waited for, and its success counts.
#[tokio::test]
async fn without_a_timeout_a_slow_command_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let reboot = script(dir.path(), "reboot", "sleep 1.5\necho rebooting");
    let config = CommandDriverConfig {
        reboot_command: vec![reboot.display().to_string()],
        boot_check_command: vec!["true".into()],
        command_timeout: None,
    };
    let driver = CommandDriver::new(config, "node-5").unwrap();
    let start = Instant::now();
    driver.reboot(PowerOffMode::Hard).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(1500));
    assert!(driver.reboot_started().is_some());
}

/// In a serialized config the timeout is whole seconds, and 0 means none, as in CKE.
#[test]
fn a_zero_timeout_in_a_serialized_config_means_none() {
    let config: CommandDriverConfig = serde_json::from_value(serde_json::json!({
        "reboot_command": ["true"],
        "boot_check_command": ["true"],
        "command_timeout": 0,
    }))
    .unwrap();
    assert_eq!(config.command_timeout, None);
    assert_eq!(serde_json::to_value(&config).unwrap()["command_timeout"], 0);
    let config: CommandDriverConfig = serde_json::from_value(serde_json::json!({
        "reboot_command": ["true"],
        "boot_check_command": ["true"],
        "command_timeout": 45,
    }))
    .unwrap();
    assert_eq!(config.command_timeout, Some(Duration::from_secs(45)));
}

/// What a timed-out command started goes too: a script's `sleep`, an `ipmitool` it runs.
#[tokio::test]
async fn a_timeout_also_kills_what_the_command_started() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild");
    let reboot = script(
        dir.path(),
        "reboot",
        &format!("sleep 60 &\necho $! > {}\nwait", pid_file.display()),
    );
    let config = CommandDriverConfig {
        reboot_command: vec![reboot.display().to_string()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_millis(500)),
    };
    let driver = CommandDriver::new(config, "node-4").unwrap();
    let err = driver.reboot(PowerOffMode::Hard).await.unwrap_err();
    assert!(matches!(err, BmcError::Timeout { .. }), "{err:?}");
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let gone = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init to reap it: either way no longer running.
        if stat.is_empty() || stat.contains(") Z") {
            break;
        }
        assert!(
            Instant::now() < gone,
            "timed out after 5s waiting for the command's child {pid} to die"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn power_on_and_off_are_unsupported() {
    let config = CommandDriverConfig {
        reboot_command: vec!["true".into()],
        boot_check_command: vec!["false".into()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    let driver = CommandDriver::new(config, "node-3").unwrap();
    let err = driver.power_on().await.unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("can only reboot"), "{err}");
    assert!(driver.power_off(PowerOffMode::Hard).await.is_err());
    // A failing boot check before any reboot: unknown, not off.
    assert_eq!(driver.power_state().await.unwrap(), PowerState::Unknown);
    assert_eq!(
        driver.description().to_string(),
        "command node-3 (reboot: true)"
    );
}

#[test]
fn bad_configurations_are_rejected() {
    let ok = CommandDriverConfig {
        reboot_command: vec!["true".into()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    assert!(
        CommandDriver::new(
            CommandDriverConfig {
                reboot_command: vec![],
                ..ok.clone()
            },
            "n"
        )
        .is_err()
    );
    assert!(
        CommandDriver::new(
            CommandDriverConfig {
                boot_check_command: vec![String::new()],
                ..ok.clone()
            },
            "n"
        )
        .is_err()
    );
    assert!(
        CommandDriver::new(
            CommandDriverConfig {
                command_timeout: Some(Duration::ZERO),
                ..ok.clone()
            },
            "n"
        )
        .is_err()
    );
    assert!(CommandDriver::new(ok, " ").is_err());
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let config = CommandDriverConfig {
        reboot_command: vec!["/nonexistent/reboot-tool".into()],
        boot_check_command: vec!["true".into()],
        command_timeout: Some(Duration::from_secs(5)),
    };
    let err = CommandDriver::new(config, "n")
        .unwrap()
        .reboot(PowerOffMode::Hard)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::Spawn { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("could not run /nonexistent/reboot-tool"),
        "{err}"
    );
}
