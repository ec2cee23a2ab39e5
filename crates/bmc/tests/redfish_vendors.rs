//! The Redfish driver against real vendors' BMCs: every folder of
//! `crates/testkit/fixtures/redfish-mockups` (the payloads eleven real BMC models served), each
//! served with that vendor's documented behaviour (`vendor.json`) by
//! `hostcycle_testkit::redfish_vendor`, delays scaled down. Table-driven: a failure names the
//! vendor and the step.
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hostcycle_bmc::cli::{BmcArgs, execute};
use hostcycle_bmc::soft_off::{
    OffPath, SoftOffPolicy, power_off_with_fallback, wait_for_power_state,
};
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, BmcError, ConnectorOptions, HostConnectOptions, PowerDriver,
    PowerOffMode, PowerState, RedfishAuthMode, RetryPolicy,
};
use hostcycle_testkit::redfish_vendor::{
    RequestAuth, VendorServer, VendorServerOptions, vendor_folders,
};

/// Every vendor delay times this: a 2 s shutdown takes 100 ms.
const TIME_SCALE: f64 = 0.05;

/// What each vendor's payload lets the driver do.
struct Vendor {
    folder: &'static str,
    /// The reset type a soft power-off sends: GracefulShutdown when offered (or when the BMC
    /// does not usably say), ForceOff when not offered.
    soft_off: &'static str,
    /// What a soft reboot sends; `None`: the BMC offers no restart at all.
    soft_reboot: Option<&'static str>,
}

const VENDORS: &[Vendor] = &[
    // Reset types only in its ResetActionInfo: GracefulShutdown, ForceRestart, ForceOff, On.
    Vendor {
        folder: "ami-megarac-gigabyte",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("ForceRestart"),
    },
    Vendor {
        folder: "cisco-cimc-c220m5",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    Vendor {
        folder: "dell-idrac9",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    Vendor {
        folder: "dmtf-public-rackmount1",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    // ActionInfo: ForceOff, On and the non-standard Off; no graceful type, no restart.
    Vendor {
        folder: "hpe-cray-ex425",
        soft_off: "ForceOff",
        soft_reboot: None,
    },
    // On, ForceOff, ForceRestart, Nmi, PushPowerButton only.
    Vendor {
        folder: "hpe-ilo5-v1.10",
        soft_off: "ForceOff",
        soft_reboot: Some("ForceRestart"),
    },
    Vendor {
        folder: "hpe-ilo5-xl675d",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    // No GracefulRestart.
    Vendor {
        folder: "intel-s2600bp",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("ForceRestart"),
    },
    Vendor {
        folder: "lenovo-xcc",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    // Reset types only in its ResetActionInfo; PoweringOn/PoweringOff while transitioning.
    Vendor {
        folder: "openbmc",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
    // Inline list holds "GracefulShutdownGracefulRestart"; its ActionInfo answers 404: the
    // list is not trusted, graceful types are tried (and accepted).
    Vendor {
        folder: "supermicro-x12",
        soft_off: "GracefulShutdown",
        soft_reboot: Some("GracefulRestart"),
    },
];

fn options() -> ConnectorOptions {
    ConnectorOptions {
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_retry_after: Duration::from_millis(100),
            deadline: Duration::from_secs(10),
        },
        ..ConnectorOptions::default()
    }
}

fn policy() -> SoftOffPolicy {
    SoftOffPolicy {
        soft_timeout: Duration::from_secs(3),
        poll_interval: Duration::from_millis(20),
        hard_timeout: Duration::from_secs(3),
    }
}

fn fast() -> VendorServerOptions {
    VendorServerOptions {
        time_scale: TIME_SCALE,
        ..VendorServerOptions::default()
    }
}

async fn serve(folder: &str, options: VendorServerOptions) -> VendorServer {
    common::init_tracing();
    VendorServer::start(folder, options)
        .await
        .unwrap_or_else(|e| panic!("{folder}: starting the mockup: {e}"))
}

fn credentials(server: &VendorServer) -> BmcCredentials {
    let c = &server.profile().credentials;
    BmcCredentials::new(&c.username, &c.password).unwrap()
}

fn connect(server: &VendorServer, address: &str, auth: RedfishAuthMode) -> Arc<dyn PowerDriver> {
    let host = HostConnectOptions {
        redfish_auth: auth,
        ..HostConnectOptions::default()
    };
    BmcConnector::new(options())
        .connect_str(address, credentials(server), &host)
        .unwrap()
}

/// Runs every vendor's check at once; fails listing every vendor that failed and why.
async fn for_every_vendor<F, Fut>(check: F)
where
    F: Fn(&'static Vendor) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut folders = vendor_folders().unwrap();
    let mut listed: Vec<&str> = VENDORS.iter().map(|v| v.folder).collect();
    folders.sort();
    listed.sort();
    assert_eq!(
        folders, listed,
        "the mockup folders and this test's vendor table differ: add the new vendor to VENDORS"
    );
    let results = futures::future::join_all(VENDORS.iter().map(|v| {
        let check = check(v);
        async move { (v.folder, check.await) }
    }))
    .await;
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|(folder, result)| result.err().map(|e| format!("{folder}: {e}")))
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// `Err("<step>: <what>")` unless `cond`.
fn ensure(cond: bool, step: &str, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(format!("{step}: {}", what()))
    }
}

fn step<T, E: std::fmt::Display>(step: &str, result: Result<T, E>) -> Result<T, String> {
    result.map_err(|e| format!("{step}: {e}"))
}

async fn wait(driver: &dyn PowerDriver, state: PowerState) -> Result<(), BmcError> {
    wait_for_power_state(
        driver,
        state,
        Duration::from_secs(5),
        Duration::from_millis(20),
    )
    .await
    .map(|_| ())
}

fn reset_types_since(server: &VendorServer, from: usize) -> Vec<String> {
    server.resets()[from..]
        .iter()
        .map(|r| r.reset_type.clone())
        .collect()
}

/// status, soft off, on, hard off, cycle, soft and hard reboot, all on one session, then
/// logout.
async fn full_run(vendor: &'static Vendor) -> Result<(), String> {
    let server = serve(vendor.folder, fast()).await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
    let system = match &server.profile().address_path {
        Some(path) => path.clone(),
        None => server.system_paths()[0].clone(),
    };
    let system = system.trim_end_matches('/').to_string();
    let shown = |server: &VendorServer| server.power_state(&system).unwrap_or_default();

    let state = step("status", driver.power_state().await)?;
    ensure(state == PowerState::On, "status", || {
        format!("{state}, not on")
    })?;

    let mark = server.resets().len();
    let report = step(
        "soft off",
        power_off_with_fallback(driver.as_ref(), PowerOffMode::Soft, &policy(), None).await,
    )?;
    let expected_path = if vendor.soft_off == "GracefulShutdown" {
        OffPath::Soft
    } else {
        OffPath::SoftUnavailable
    };
    ensure(report.path == expected_path, "soft off", || {
        format!("went off via {:?}, expected {expected_path:?}", report.path)
    })?;
    let sent = reset_types_since(&server, mark);
    ensure(sent == [vendor.soft_off], "soft off", || {
        format!("sent {sent:?}, expected [{}]", vendor.soft_off)
    })?;
    ensure(shown(&server) == "Off", "soft off", || {
        format!("the BMC shows {}", shown(&server))
    })?;

    let mark = server.resets().len();
    step("on", driver.power_on().await)?;
    step("on (wait)", wait(driver.as_ref(), PowerState::On).await)?;
    let sent = reset_types_since(&server, mark);
    ensure(sent.len() == 1 && sent[0].ends_with("On"), "on", || {
        format!("sent {sent:?}")
    })?;

    let mark = server.resets().len();
    let report = step(
        "hard off",
        power_off_with_fallback(driver.as_ref(), PowerOffMode::Hard, &policy(), None).await,
    )?;
    ensure(report.path == OffPath::Hard, "hard off", || {
        format!("went off via {:?}", report.path)
    })?;
    let sent = reset_types_since(&server, mark);
    ensure(sent == ["ForceOff"], "hard off", || {
        format!("sent {sent:?}")
    })?;

    // Cycle as `hostcycle bmc cycle` does it: off (soft first), on.
    step("cycle: on", driver.power_on().await)?;
    step(
        "cycle: on (wait)",
        wait(driver.as_ref(), PowerState::On).await,
    )?;
    step(
        "cycle: off",
        power_off_with_fallback(driver.as_ref(), PowerOffMode::Soft, &policy(), None).await,
    )?;
    step("cycle: on again", driver.power_on().await)?;
    step(
        "cycle: on again (wait)",
        wait(driver.as_ref(), PowerState::On).await,
    )?;

    // A restart (the BMC's own).
    for (mode, expected) in [
        (PowerOffMode::Soft, vendor.soft_reboot),
        (
            PowerOffMode::Hard,
            vendor.soft_reboot.map(|_| "ForceRestart"),
        ),
    ] {
        let name = format!("{mode} reboot");
        let mark = server.resets().len();
        let result = driver.reboot(mode).await;
        match expected {
            Some(expected) => {
                let outcome = step(&name, result)?;
                let sent = reset_types_since(&server, mark);
                ensure(sent == [expected], &name, || {
                    format!("sent {sent:?}, expected [{expected}] ({outcome})")
                })?;
                // The host goes down, then up again.
                step(&name, wait(driver.as_ref(), PowerState::On).await)?;
                tokio::time::sleep(Duration::from_secs_f64(6.0 * TIME_SCALE)).await;
                step(&name, wait(driver.as_ref(), PowerState::On).await)?;
            }
            None => {
                let err = match result {
                    Ok(outcome) => {
                        return Err(format!(
                            "{name}: succeeded ({outcome}) on a BMC without restart"
                        ));
                    }
                    Err(e) => e,
                };
                ensure(
                    matches!(err, BmcError::Unsupported { .. })
                        && err.to_string().contains("ForceRestart"),
                    &name,
                    || format!("not a clear 'unsupported': {err}"),
                )?;
                ensure(server.resets().len() == mark, &name, || {
                    "sent a reset anyway".into()
                })?;
            }
        }
    }

    // Session auth: one login, at the service root's Links.Sessions, every other request with
    // the session's token; nothing rejected.
    ensure(server.logins() == 1, "session auth", || {
        format!("{} logins for one driver", server.logins())
    })?;
    let requests = server.requests();
    let sessions_path = server
        .profile()
        .sessions
        .path
        .trim_end_matches('/')
        .to_lowercase();
    let login = requests
        .iter()
        .find(|r| r.method == "POST" && r.status == 201)
        .ok_or("session auth: no successful login")?;
    ensure(
        login.path.trim_end_matches('/').to_lowercase() == sessions_path,
        "session auth",
        || format!("logged in at {}, not at {sessions_path}", login.path),
    )?;
    let rejected: Vec<_> = requests.iter().filter(|r| r.status == 401).collect();
    ensure(rejected.is_empty(), "session auth", || {
        format!("requests rejected: {rejected:?}")
    })?;
    let unauthenticated: Vec<_> = requests
        .iter()
        .filter(|r| !matches!(r.auth, RequestAuth::Session(_)))
        .filter(|r| {
            let p = r.path.trim_end_matches('/').to_lowercase();
            p != "/redfish/v1" && p != sessions_path
        })
        .collect();
    ensure(unauthenticated.is_empty(), "session auth", || {
        format!("requests without the session token: {unauthenticated:?}")
    })?;

    step("close", driver.close().await)?;
    ensure(server.open_sessions() == 0, "close", || {
        format!("{} sessions still open", server.open_sessions())
    })?;
    // After a close the driver still works: it logs in again.
    step("after close", driver.power_state().await)?;
    step("close again", driver.close().await)?;
    ensure(
        server.logins() == 2 && server.open_sessions() == 0,
        "close again",
        || {
            format!(
                "{} logins, {} open",
                server.logins(),
                server.open_sessions()
            )
        },
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vendor_status_off_on_cycle_reboot_and_sessions() {
    for_every_vendor(full_run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_off_that_never_completes_falls_back_to_hard_on_every_vendor() {
    for_every_vendor(|vendor| async move {
        let server = serve(
            vendor.folder,
            VendorServerOptions {
                graceful_never_completes: true,
                ..fast()
            },
        )
        .await;
        let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
        let short = SoftOffPolicy {
            soft_timeout: Duration::from_millis(400),
            ..policy()
        };
        let report = step(
            "soft-off timeout",
            power_off_with_fallback(driver.as_ref(), PowerOffMode::Soft, &short, None).await,
        )?;
        let sent = reset_types_since(&server, 0);
        if vendor.soft_off == "GracefulShutdown" {
            ensure(
                report.path == OffPath::SoftTimedOut,
                "soft-off timeout",
                || format!("went off via {:?}", report.path),
            )?;
            ensure(
                sent == ["GracefulShutdown", "ForceOff"],
                "soft-off timeout",
                || format!("sent {sent:?}"),
            )?;
        } else {
            ensure(
                report.path == OffPath::SoftUnavailable && sent == ["ForceOff"],
                "soft-off timeout",
                || format!("went off via {:?}, sent {sent:?}", report.path),
            )?;
        }
        step("close", driver.close().await)?;
        ensure(server.open_sessions() == 0, "close", || {
            "a session stayed open".into()
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_without_a_system_path_on_every_vendor() {
    for_every_vendor(|vendor| async move {
        let server = serve(vendor.folder, fast()).await;
        let driver = connect(
            &server,
            &server.address_without_system(),
            RedfishAuthMode::Auto,
        );
        let systems = server.system_paths();
        let result = driver.power_state().await;
        if vendor.folder == "hpe-ilo5-v1.10" {
            // Its source holds no Systems collection, so this mockup has none.
            let err = result
                .err()
                .ok_or("discovery: succeeded without a Systems collection")?;
            ensure(
                err.to_string().contains("/redfish/v1/Systems") && err.to_string().contains("404"),
                "discovery",
                || format!("unclear error: {err}"),
            )?;
        } else if systems.len() > 1 {
            let err = result
                .err()
                .ok_or("discovery: picked one of several Systems")?;
            ensure(
                matches!(err, BmcError::SystemAmbiguous { .. })
                    && systems.iter().all(|s| err.to_string().contains(s.as_str())),
                "discovery",
                || format!("does not name the Systems {systems:?}: {err}"),
            )?;
        } else {
            let state = step("discovery: status", result)?;
            ensure(state == PowerState::On, "discovery: status", || {
                format!("{state}")
            })?;
            step(
                "discovery: hard off",
                power_off_with_fallback(driver.as_ref(), PowerOffMode::Hard, &policy(), None).await,
            )?;
            let shown = server.power_state(&systems[0]).unwrap_or_default();
            ensure(shown == "Off", "discovery: hard off", || {
                format!("{} shows {shown}", systems[0])
            })?;
        }
        step("close", driver.close().await)?;
        ensure(server.open_sessions() == 0, "close", || {
            "a session stayed open".into()
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_where_the_vendor_allows_it() {
    for_every_vendor(|vendor| async move {
        let server = serve(vendor.folder, fast()).await;
        if !server.profile().auth.basic {
            return Ok(());
        }
        let driver = connect(&server, &server.address(), RedfishAuthMode::Basic);
        step("basic: status", driver.power_state().await)?;
        step(
            "basic: hard off",
            power_off_with_fallback(driver.as_ref(), PowerOffMode::Hard, &policy(), None).await,
        )?;
        step("basic: on", driver.power_on().await)?;
        step("basic: close", driver.close().await)?;
        ensure(server.logins() == 0, "basic", || "opened a session".into())?;
        let requests = server.requests();
        let wrong: Vec<_> = requests
            .iter()
            .filter(|r| r.auth != RequestAuth::Basic || r.status == 401)
            .collect();
        ensure(wrong.is_empty(), "basic", || {
            format!("requests without basic auth or rejected: {wrong:?}")
        })
    })
    .await;
}

/// `hostcycle bmc …` logs out before it returns (the process exits right after): every
/// session it opened is deleted by then, for every vendor and command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_closes_its_session_before_it_returns() {
    for_every_vendor(|vendor| async move {
        let server = serve(vendor.folder, fast()).await;
        let dir = tempfile::tempdir().unwrap();
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, &server.profile().credentials.password).unwrap();
        let address = server.address();
        let username = server.profile().credentials.username.clone();
        let password_file = password_file.display().to_string();
        let mut runs = 0;
        for command in [
            vec!["status"],
            vec!["off", "--hard"],
            vec!["on"],
            vec!["cycle", "--soft-timeout", "2s"],
            vec!["status"],
        ] {
            let mut argv = vec!["bmc"];
            argv.extend(command.iter().copied());
            argv.extend([
                "--address",
                &address,
                "--username",
                &username,
                "--password-file",
                &password_file,
                "--poll-interval",
                "20ms",
                "--wait-timeout",
                "5s",
            ]);
            if command == ["status"] {
                argv.truncate(argv.len() - 4);
            }
            let name = format!("hostcycle bmc {}", command.join(" "));
            let cli = BmcCli::try_parse_from(&argv).map_err(|e| format!("{name}: {e}"))?;
            step(&name, execute(&cli.args).await)?;
            runs += 1;
            // No await between the command's end and this check: nothing else could close it.
            ensure(server.open_sessions() == 0, &name, || {
                format!(
                    "{} of {} sessions still open when the command returned",
                    server.open_sessions(),
                    server.logins()
                )
            })?;
        }
        ensure(server.logins() == runs, "cli", || {
            format!("{} logins for {runs} runs", server.logins())
        })
    })
    .await;
}

#[derive(Debug, Parser)]
struct BmcCli {
    #[command(flatten)]
    args: BmcArgs,
}

/// The operator keeps one driver per host: its session is reused by every call.
#[tokio::test]
async fn one_driver_uses_one_session_for_many_operations() {
    let server = serve("hpe-ilo5-xl675d", fast()).await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
    for _ in 0..10 {
        driver.power_state().await.unwrap();
    }
    power_off_with_fallback(driver.as_ref(), PowerOffMode::Hard, &policy(), None)
        .await
        .unwrap();
    driver.power_on().await.unwrap();
    wait(driver.as_ref(), PowerState::On).await.unwrap();
    assert_eq!(server.logins(), 1, "{:?}", server.sessions());
    assert_eq!(server.open_sessions(), 1);
    driver.close().await.unwrap();
    assert_eq!(server.open_sessions(), 0);
}

/// Concurrent first calls log in once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_open_one_session() {
    let server = serve("openbmc", fast()).await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
    let calls = (0..8).map(|_| driver.power_state());
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    assert_eq!(server.logins(), 1);
    driver.close().await.unwrap();
    assert_eq!(server.open_sessions(), 0);
}

/// A session the BMC expired (401) is replaced by one new login, and the call succeeds.
#[tokio::test]
async fn an_expired_session_is_renewed_once_and_the_call_succeeds() {
    let server = serve("dell-idrac9", fast()).await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    server.expire_sessions();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(server.logins(), 2, "{:?}", server.sessions());
    driver.close().await.unwrap();
    assert_eq!(server.open_sessions(), 0);
    assert!(server.sessions()[1].deleted, "the new session was deleted");
}

/// A BMC that keeps refusing fresh tokens: one re-login, then a clear credentials error, not
/// a login per retry.
#[tokio::test]
async fn a_token_refused_right_after_login_fails_after_one_relogin() {
    let server = serve(
        "lenovo-xcc",
        VendorServerOptions {
            tokens_rejected: true,
            ..fast()
        },
    )
    .await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Session);
    let err = driver.power_state().await.unwrap_err();
    assert!(
        matches!(err, BmcError::AuthenticationFailed { .. }),
        "{err:?}"
    );
    assert_eq!(server.logins(), 2, "{:?}", server.sessions());
    common::assert_no_secret(&err.to_string());
}

/// Login goes to the service root's Links.Sessions, wherever that is; logout too.
#[tokio::test]
async fn login_goes_where_the_service_root_says() {
    const CUSTOM: &str = "/redfish/v1/AccountService/Sessions";
    for folder in ["openbmc", "hpe-cray-ex425"] {
        let server = serve(
            folder,
            VendorServerOptions {
                sessions_path: Some(CUSTOM.into()),
                ..fast()
            },
        )
        .await;
        let driver = connect(&server, &server.address(), RedfishAuthMode::Session);
        driver.power_state().await.unwrap();
        driver.close().await.unwrap();
        let requests = server.requests();
        let posts: Vec<_> = requests
            .iter()
            .filter(|r| r.method == "POST")
            .map(|r| (r.path.as_str(), r.status))
            .collect();
        assert_eq!(posts, [(CUSTOM, 201)], "{folder}");
        let deletes: Vec<_> = requests.iter().filter(|r| r.method == "DELETE").collect();
        assert_eq!(deletes.len(), 1, "{folder}: {deletes:?}");
        assert!(deletes[0].path.starts_with(CUSTOM), "{folder}: {deletes:?}");
        assert_eq!(server.open_sessions(), 0, "{folder}");
    }
}

/// iLO 5 1.10 (as modelled) redirects every path without a trailing slash with a 301, POSTs
/// included. With a service root naming the slash-less form (as older Supermicro BMCs that
/// redirect POST .../Sessions to .../Sessions/), the login is re-sent as a POST with its body,
/// not turned into a credential-less GET that the BMC answers 401 ("rejected the credentials").
#[tokio::test]
async fn a_redirected_login_keeps_its_method_body_and_credentials() {
    let server = serve(
        "hpe-ilo5-v1.10",
        VendorServerOptions {
            sessions_path: Some("/redfish/v1/SessionService/Sessions".into()),
            ..fast()
        },
    )
    .await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Session);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    let requests = server.requests();
    let to_sessions: Vec<_> = requests
        .iter()
        .filter(|r| r.path.to_lowercase().contains("/sessionservice/sessions"))
        .map(|r| (r.method.as_str(), r.path.as_str(), r.status))
        .collect();
    assert_eq!(
        to_sessions,
        [
            ("POST", "/redfish/v1/SessionService/Sessions", 301),
            ("POST", "/redfish/v1/SessionService/Sessions/", 201)
        ],
        "{requests:?}"
    );
    let login = requests.iter().find(|r| r.status == 201).unwrap();
    assert_eq!(
        login
            .body
            .as_ref()
            .and_then(|b| b.get("UserName"))
            .and_then(|u| u.as_str()),
        Some("Administrator"),
        "the body went along"
    );
    assert!(
        requests.iter().all(|r| r.status != 401),
        "nothing rejected: {requests:?}"
    );
    // The System path of the address has no slash: redirected, followed with the token.
    assert!(
        requests.iter().any(
            |r| r.path == "/redfish/v1/Systems/1/" && matches!(r.auth, RequestAuth::Session(_))
        ),
        "{requests:?}"
    );
    driver.close().await.unwrap();
    assert_eq!(server.open_sessions(), 0);
}

/// Supermicro X12: the inline list is garbled and its ActionInfo answers 404, so graceful is
/// tried first; a BMC that then refuses it with 400 gets ForceOff at once, and the outcome
/// says why.
#[tokio::test]
async fn a_graceful_type_refused_with_400_falls_back_to_hard_at_once() {
    let server = serve(
        "supermicro-x12",
        VendorServerOptions {
            accepted: Some(vec!["On".into(), "ForceOff".into(), "ForceRestart".into()]),
            ..fast()
        },
    )
    .await;
    let driver = connect(&server, &server.address(), RedfishAuthMode::Auto);
    let outcome = driver.power_off(PowerOffMode::Soft).await.unwrap();
    let sent: Vec<_> = server
        .resets()
        .iter()
        .map(|r| (r.reset_type.clone(), r.status))
        .collect();
    assert_eq!(
        sent,
        [
            ("GracefulShutdown".to_string(), 400),
            ("ForceOff".to_string(), 200)
        ]
    );
    let reason = outcome.hard_fallback.unwrap();
    assert!(reason.contains("HTTP 400"), "{reason}");
    driver.close().await.unwrap();
}

/// Cray EX: two Systems behind one BMC; each address drives its own.
#[tokio::test]
async fn cray_ex_systems_are_driven_separately() {
    let server = serve("hpe-cray-ex425", fast()).await;
    let node1 = connect(
        &server,
        &server.address_with_path("/redfish/v1/Systems/Node1"),
        RedfishAuthMode::Auto,
    );
    power_off_with_fallback(node1.as_ref(), PowerOffMode::Hard, &policy(), None)
        .await
        .unwrap();
    assert_eq!(
        server.power_state("/redfish/v1/Systems/Node1").unwrap(),
        "Off"
    );
    assert_eq!(
        server.power_state("/redfish/v1/Systems/Node0").unwrap(),
        "On"
    );
    node1.close().await.unwrap();
    assert_eq!(server.open_sessions(), 0);
}
