//! `hostcycle bmc` as a process against every real vendor's Redfish mockup
//! (`hostcycle_testkit::redfish_vendor`): the process exits right after its command, so a
//! logout left to `Drop` never happens. Every session each run opened must be deleted by the
//! time the process has exited.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use hostcycle_testkit::redfish_vendor::{VendorServer, VendorServerOptions, vendor_folders};

async fn hostcycle_bmc(args: Vec<String>, password_file: String) -> std::process::Output {
    let run = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hostcycle"))
            .arg("bmc")
            .args(&args)
            .args(["--password-file", &password_file])
            .env_remove("RUST_LOG")
            .env_remove("HOSTCYCLE_BMC_PASSWORD")
            .stdin(Stdio::null())
            .output()
            .expect("running hostcycle")
    });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("hostcycle bmc did not finish within 60 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_is_deleted_before_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for folder in vendor_folders().unwrap() {
        let server = VendorServer::start(
            &folder,
            VendorServerOptions {
                time_scale: 0.05,
                ..VendorServerOptions::default()
            },
        )
        .await
        .unwrap();
        let password_file = dir.path().join(&folder);
        std::fs::write(&password_file, &server.profile().credentials.password).unwrap();
        let password_file = password_file.display().to_string();
        let connection = |command: &[&str]| {
            let mut args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
            args.extend([
                "--address".to_string(),
                server.address(),
                "--username".to_string(),
                server.profile().credentials.username.clone(),
            ]);
            args
        };
        let runs: [&[&str]; 3] = [
            &["status"],
            &["off", "--hard", "--poll-interval", "20ms"],
            &["on", "--poll-interval", "20ms"],
        ];
        for command in runs {
            let out = hostcycle_bmc(connection(command), password_file.clone()).await;
            let name = format!("{folder}: hostcycle bmc {}", command.join(" "));
            if !out.status.success() {
                failures.push(format!(
                    "{name}: exit {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            }
            if server.open_sessions() != 0 {
                failures.push(format!(
                    "{name}: {} of {} sessions left open",
                    server.open_sessions(),
                    server.logins()
                ));
            }
        }
        if server.logins() != runs.len() {
            failures.push(format!(
                "{folder}: {} logins for {} runs",
                server.logins(),
                runs.len()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
