//! Failures of the rig itself give one clear error naming the component (and its log), fast,
//! never a hang — and leave nothing running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hostcycle_testkit::{ClusterOptions, LocalCluster, TestkitError, free_port};

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn missing_binary_names_the_component_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let err = LocalCluster::start(ClusterOptions {
        k8s_bin_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .expect_err("must fail without binaries");
    let text = err.to_string();
    assert!(matches!(err, TestkitError::MissingBinary { .. }), "{text}");
    assert!(
        text.contains("kube-apiserver") && text.contains("install-prereqs.sh"),
        "{text}"
    );
}

#[tokio::test]
async fn port_in_use_is_reported_for_the_component() {
    let port = free_port().unwrap();
    let _held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let err = LocalCluster::start(ClusterOptions {
        apiserver_port: Some(port),
        ..Default::default()
    })
    .await
    .expect_err("must fail on a taken port");
    let text = err.to_string();
    assert!(matches!(err, TestkitError::PortInUse { .. }), "{text}");
    assert!(
        text.contains("kube-apiserver") && text.contains(&port.to_string()),
        "{text}"
    );
}

#[tokio::test]
async fn a_component_that_exits_early_fails_fast_with_its_log_and_leaves_nothing_running() {
    let started = Instant::now();
    let err = LocalCluster::start(ClusterOptions {
        extra_apiserver_args: vec!["--no-such-flag-for-this-test".into()],
        ..Default::default()
    })
    .await
    .expect_err("the API server must refuse the flag and exit");
    let text = err.to_string();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failed fast, not after a timeout: {:?}",
        started.elapsed()
    );
    let TestkitError::ComponentExited { component, log, .. } = &err else {
        panic!("unexpected error: {text}")
    };
    assert_eq!(component, "kube-apiserver");
    assert!(
        log.ends_with("kube-apiserver.log") && text.contains(&log.display().to_string()),
        "{text}"
    );
    assert!(
        text.contains("no-such-flag"),
        "the log tail shows why: {text}"
    );
    // The log the error points at is still there to read.
    let kept = std::fs::read_to_string(log).expect("the failed cluster's log is kept");
    assert!(kept.contains("no-such-flag"));
    // etcd, started before the API server, was stopped by its PID. Every process of this
    // cluster mentions its directory (config paths, etcd's data dir).
    let root = log
        .parent()
        .and_then(|logs| logs.parent())
        .unwrap()
        .to_path_buf();
    let marker = root.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        processes_mentioning(&marker).is_empty(),
        "left running: {:?}",
        processes_mentioning(&marker)
    );
    std::fs::remove_dir_all(&root).unwrap();
}
