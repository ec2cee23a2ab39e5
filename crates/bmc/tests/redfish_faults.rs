//! Fault injection for the Redfish driver with a mock HTTP server: failures the emulator
//! cannot produce (5xx, slow answers, bad JSON, restricted reset types, sessions, redirects).
//! The functional behaviour is tested against sushy-emulator in `redfish_emulator.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hostcycle_bmc::{
    BmcConnector, BmcError, ConnectorOptions, HostConnectOptions, PowerDriver, PowerOffMode,
    PowerState, RedfishAuthMode, RetryPolicy,
};
use serde_json::{Value, json};
use wiremock::matchers::{body_json, header, header_exists, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const SYSTEM: &str = "/redfish/v1/Systems/1";
const RESET: &str = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";

fn system(power: &str, allowed: Option<&[&str]>) -> Value {
    let mut reset = json!({ "target": RESET });
    if let Some(allowed) = allowed {
        reset["ResetType@Redfish.AllowableValues"] = json!(allowed);
    }
    json!({
        "@odata.id": SYSTEM,
        "Id": "1",
        "PowerState": power,
        "Actions": { "#ComputerSystem.Reset": reset },
    })
}

fn fast_options() -> ConnectorOptions {
    ConnectorOptions {
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_retry_after: Duration::from_secs(2),
            deadline: Duration::from_secs(20),
        },
        ..ConnectorOptions::default()
    }
}

fn driver_with(
    server: &MockServer,
    options: ConnectorOptions,
    auth: RedfishAuthMode,
) -> Arc<dyn PowerDriver> {
    init_tracing();
    let host = HostConnectOptions {
        redfish_auth: auth,
        ..Default::default()
    };
    BmcConnector::new(options)
        .connect_str(
            &format!("redfish+http://{}{SYSTEM}", server.address()),
            credentials(),
            &host,
        )
        .unwrap()
}

fn driver(server: &MockServer) -> Arc<dyn PowerDriver> {
    driver_with(server, fast_options(), RedfishAuthMode::Basic)
}

async fn requests_to(server: &MockServer, method: &str, path: &str) -> usize {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.method.as_str() == method && r.url.path() == path)
        .count()
}

async fn mount_system(server: &MockServer, body: Value) {
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(server)
        .await;
}

async fn mount_reset(server: &MockServer, reset_type: &str, status: u16) {
    Mock::given(method("POST"))
        .and(path(RESET))
        .and(body_json(json!({ "ResetType": reset_type })))
        .respond_with(ResponseTemplate::new(status))
        .mount(server)
        .await;
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    mount_system(&server, system("On", None)).await;
    assert_eq!(driver(&server).power_state().await.unwrap(), PowerState::On);
    assert_eq!(requests_to(&server, "GET", SYSTEM).await, 3);
}

#[tokio::test]
async fn retry_after_of_a_503_is_honoured() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    mount_system(&server, system("Off", None)).await;
    let start = Instant::now();
    assert_eq!(
        driver(&server).power_state().await.unwrap(),
        PowerState::Off
    );
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "waited only {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn persistent_server_errors_give_up_naming_the_request_and_the_bmc_message() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({
            "error": { "code": "Base.1.0.InternalError", "message": "BMC firmware is sulking" }
        })))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(
        matches!(err, BmcError::RetriesExhausted { attempts: 3, .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("GET http://{}:", server.address().ip())),
        "{message}"
    );
    assert!(
        message.contains("HTTP 500: BMC firmware is sulking"),
        "{message}"
    );
    assert_eq!(requests_to(&server, "GET", SYSTEM).await, 3);
}

#[tokio::test]
async fn slow_responses_time_out() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(system("On", None))
                .set_delay(Duration::from_secs(10)),
        )
        .mount(&server)
        .await;
    let options = ConnectorOptions {
        request_timeout: Duration::from_millis(300),
        retry: RetryPolicy {
            max_attempts: 2,
            ..fast_options().retry
        },
        ..fast_options()
    };
    let start = Instant::now();
    let err = driver_with(&server, options, RedfishAuthMode::Basic)
        .power_state()
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let BmcError::RetriesExhausted {
        last, attempts: 2, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(matches!(**last, BmcError::Timeout { .. }), "{last:?}");
    assert!(
        err.to_string()
            .contains("timed out after 300ms waiting for the answer of BMC"),
        "{err}"
    );
}

#[tokio::test]
async fn the_call_deadline_bounds_retries() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .mount(&server)
        .await;
    let options = ConnectorOptions {
        retry: RetryPolicy {
            max_attempts: 100,
            deadline: Duration::from_millis(2500),
            ..fast_options().retry
        },
        ..fast_options()
    };
    let start = Instant::now();
    let err = driver_with(&server, options, RedfishAuthMode::Basic)
        .power_state()
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_millis(2600),
        "took {:?}",
        start.elapsed()
    );
    assert!(err.to_string().contains("HTTP 503"), "{err}");
}

#[tokio::test]
async fn malformed_json_is_an_invalid_response_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(200).set_body_string("{\"PowerState\": \"On\", oops"))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::InvalidResponse { .. }), "{err:?}");
    assert!(err.to_string().contains("malformed JSON"), "{err}");
    assert_eq!(requests_to(&server, "GET", SYSTEM).await, 1);
}

#[tokio::test]
async fn soft_off_not_allowed_falls_through_to_force_off_and_says_so() {
    let server = MockServer::start().await;
    mount_system(&server, system("On", Some(&["On", "ForceOff"]))).await;
    mount_reset(&server, "ForceOff", 204).await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOff"));
    assert_eq!(
        outcome.hard_fallback.as_deref(),
        Some("GracefulShutdown is not among the BMC's allowed reset types [On, ForceOff]")
    );
    assert_eq!(requests_to(&server, "POST", RESET).await, 1);
}

#[tokio::test]
async fn soft_off_rejected_with_400_falls_through_to_force_off_at_once() {
    let server = MockServer::start().await;
    mount_system(
        &server,
        system("On", Some(&["On", "ForceOff", "GracefulShutdown"])),
    )
    .await;
    Mock::given(method("POST"))
        .and(path(RESET))
        .and(body_json(json!({ "ResetType": "GracefulShutdown" })))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "error": { "message": "OS does not support ACPI shutdown" }
        })))
        .mount(&server)
        .await;
    mount_reset(&server, "ForceOff", 200).await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOff"));
    assert_eq!(
        outcome.hard_fallback.as_deref(),
        Some("the BMC rejected GracefulShutdown (HTTP 400: OS does not support ACPI shutdown)")
    );
    assert_eq!(
        requests_to(&server, "POST", RESET).await,
        2,
        "400 is not retried"
    );
}

#[tokio::test]
async fn power_on_uses_force_on_when_on_is_not_allowed() {
    let server = MockServer::start().await;
    mount_system(&server, system("Off", Some(&["ForceOn", "ForceOff"]))).await;
    mount_reset(&server, "ForceOn", 202).await;
    let outcome = driver(&server).power_on().await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOn"));
}

#[tokio::test]
async fn a_reset_type_that_is_not_allowed_is_unsupported_and_nothing_is_sent() {
    let server = MockServer::start().await;
    mount_system(&server, system("On", Some(&["On", "GracefulShutdown"]))).await;
    let err = driver(&server)
        .power_off(PowerOffMode::Hard)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("ForceOff is not among the allowed reset types [On, GracefulShutdown]"),
        "{err}"
    );
    assert_eq!(requests_to(&server, "POST", RESET).await, 0);
}

#[tokio::test]
async fn allowed_reset_types_can_come_from_action_info() {
    let server = MockServer::start().await;
    let mut body = system("On", None);
    body["Actions"]["#ComputerSystem.Reset"]["@Redfish.ActionInfo"] =
        json!("/redfish/v1/Systems/1/ResetActionInfo");
    mount_system(&server, body).await;
    Mock::given(method("GET"))
        .and(path("/redfish/v1/Systems/1/ResetActionInfo"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Parameters": [{ "Name": "ResetType", "AllowableValues": ["On", "ForceOff"] }]
        })))
        .mount(&server)
        .await;
    mount_reset(&server, "ForceOff", 204).await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOff"));
    assert!(outcome.fell_back_to_hard());
}

#[tokio::test]
async fn a_missing_reset_action_is_unsupported() {
    let server = MockServer::start().await;
    mount_system(&server, system("Off", None)).await;
    Mock::given(method("POST"))
        .and(path(RESET))
        .respond_with(ResponseTemplate::new(405))
        .mount(&server)
        .await;
    let err = driver(&server).power_on().await.unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    assert_eq!(requests_to(&server, "POST", RESET).await, 1);
}

#[tokio::test]
async fn sessions_are_used_and_renewed_when_they_expire() {
    let server = MockServer::start().await;
    let login = |token: &'static str| {
        Mock::given(method("POST"))
            .and(path(SESSIONS))
            .and(body_json(json!({ "UserName": USER, "Password": PASSWORD })))
            .respond_with(
                ResponseTemplate::new(201)
                    .insert_header("X-Auth-Token", token)
                    .insert_header("Location", format!("{SESSIONS}/{token}")),
            )
    };
    login("token-1")
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    login("token-2").with_priority(2).mount(&server).await;
    // token-1 works once, then the BMC forgets the session.
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .and(header("X-Auth-Token", "token-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(system("On", None)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .and(header("X-Auth-Token", "token-1"))
        .respond_with(ResponseTemplate::new(401))
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .and(header("X-Auth-Token", "token-2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(system("Off", None)))
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path(format!("{SESSIONS}/token-2")))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;

    let driver = driver_with(&server, fast_options(), RedfishAuthMode::Session);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::Off);
    assert_eq!(requests_to(&server, "POST", SESSIONS).await, 2);
    let requests = server.received_requests().await.unwrap();
    assert!(
        requests
            .iter()
            .all(|r| !r.headers.contains_key("authorization")),
        "no basic auth with sessions"
    );

    // Dropping the driver closes its session.
    drop(driver);
    let closed = hostcycle_testkit::wait_until(
        "the session to be closed",
        Duration::from_secs(5),
        || async {
            (requests_to(&server, "DELETE", &format!("{SESSIONS}/token-2")).await == 1)
                .then_some(())
        },
    )
    .await;
    closed.unwrap();
}

#[tokio::test]
async fn auto_auth_uses_basic_when_there_is_no_session_service() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SESSIONS))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .and(header_exists("authorization"))
        .respond_with(ResponseTemplate::new(200).set_body_json(system("On", None)))
        .mount(&server)
        .await;
    let driver = driver_with(&server, fast_options(), RedfishAuthMode::Auto);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(
        requests_to(&server, "POST", SESSIONS).await,
        1,
        "the decision is remembered"
    );
}

#[tokio::test]
async fn redirects_to_another_host_are_refused() {
    let server = MockServer::start().await;
    let elsewhere = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("Location", format!("{}{SYSTEM}", elsewhere.uri())),
        )
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(matches!(err, BmcError::RedirectRefused { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("to http://{}", elsewhere.address())),
        "{message}"
    );
    assert!(message.contains("refusing to follow"), "{message}");
    assert!(
        elsewhere.received_requests().await.unwrap().is_empty(),
        "credentials went elsewhere"
    );
    assert_eq!(requests_to(&server, "GET", SYSTEM).await, 1, "not retried");
}

#[tokio::test]
async fn unauthorized_and_forbidden_are_permanent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(401))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(
        matches!(err, BmcError::AuthenticationFailed { .. }),
        "{err:?}"
    );
    assert_eq!(requests_to(&server, "GET", SYSTEM).await, 1);
    assert_no_secret(&format!("{err} {err:?}"));

    let server = MockServer::start().await;
    mount_system(&server, system("Off", None)).await;
    Mock::given(method("POST"))
        .and(path(RESET))
        .respond_with(ResponseTemplate::new(403))
        .mount(&server)
        .await;
    let err = driver(&server).power_on().await.unwrap_err();
    assert!(matches!(err, BmcError::PermissionDenied { .. }), "{err:?}");
    assert!(
        err.to_string().contains("Operator or Administrator"),
        "{err}"
    );
    assert_eq!(requests_to(&server, "POST", RESET).await, 1);
}

#[tokio::test]
async fn a_reboot_that_times_out_is_not_repeated() {
    let server = MockServer::start().await;
    mount_system(&server, system("On", None)).await;
    Mock::given(method("POST"))
        .and(path(RESET))
        .respond_with(ResponseTemplate::new(204).set_delay(Duration::from_secs(10)))
        .mount(&server)
        .await;
    let options = ConnectorOptions {
        request_timeout: Duration::from_millis(300),
        ..fast_options()
    };
    let err = driver_with(&server, options, RedfishAuthMode::Basic)
        .reboot(PowerOffMode::Hard)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::OutcomeUnknown { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("check the power state before trying again"),
        "{err}"
    );
    assert_eq!(requests_to(&server, "POST", RESET).await, 1);
}

#[tokio::test]
async fn an_unreachable_bmc_is_retried_then_reported() {
    init_tracing();
    let port = hostcycle_testkit::free_port().unwrap();
    let driver = BmcConnector::new(fast_options())
        .connect_str(
            &format!("redfish+http://127.0.0.1:{port}{SYSTEM}"),
            credentials(),
            &HostConnectOptions {
                redfish_auth: RedfishAuthMode::Basic,
                ..Default::default()
            },
        )
        .unwrap();
    let err = driver.power_state().await.unwrap_err();
    let BmcError::RetriesExhausted {
        last, attempts: 3, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(matches!(**last, BmcError::Connection { .. }), "{last:?}");
    assert!(
        err.to_string()
            .contains(&format!("could not reach BMC http://127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn concurrency_per_endpoint_is_bounded() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(system("On", None))
                .set_delay(Duration::from_millis(200)),
        )
        .mount(&server)
        .await;
    let options = ConnectorOptions {
        max_requests_per_endpoint: 2,
        ..fast_options()
    };
    let connector = BmcConnector::new(options);
    let host = HostConnectOptions {
        redfish_auth: RedfishAuthMode::Basic,
        ..Default::default()
    };
    let address = format!("redfish+http://{}{SYSTEM}", server.address());
    // Two drivers for the same endpoint share its limit.
    let a = connector
        .connect_str(&address, credentials(), &host)
        .unwrap();
    let b = connector
        .connect_str(&address, credentials(), &host)
        .unwrap();
    let start = Instant::now();
    let reads = (0..6).map(|i| {
        let driver = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { driver.power_state().await }
    });
    for result in futures::future::join_all(reads).await {
        assert_eq!(result.unwrap(), PowerState::On);
    }
    // 6 requests, 2 at a time, 200 ms each: at least 3 rounds.
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_malformed_inline_list_is_resolved_from_action_info() {
    let server = MockServer::start().await;
    let mut body = system(
        "On",
        Some(&["On", "ForceOff", "GracefulShutdownGracefulRestart"]),
    );
    body["Actions"]["#ComputerSystem.Reset"]["@Redfish.ActionInfo"] =
        json!("/redfish/v1/Systems/1/ResetActionInfo");
    mount_system(&server, body).await;
    Mock::given(method("GET"))
        .and(path("/redfish/v1/Systems/1/ResetActionInfo"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Parameters": [{ "Name": "ResetType",
                "AllowableValues": ["On", "ForceOff", "GracefulShutdown", "GracefulRestart"] }]
        })))
        .mount(&server)
        .await;
    mount_reset(&server, "GracefulShutdown", 204).await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(
        outcome.action.as_deref(),
        Some("ResetType=GracefulShutdown")
    );
    assert!(!outcome.fell_back_to_hard());
}

#[tokio::test]
async fn a_malformed_inline_list_without_a_usable_action_info_tries_graceful_first() {
    let server = MockServer::start().await;
    let mut body = system(
        "On",
        Some(&["On", "ForceOff", "GracefulShutdownGracefulRestart"]),
    );
    body["Actions"]["#ComputerSystem.Reset"]["@Redfish.ActionInfo"] =
        json!("/redfish/v1/Systems/1/ResetActionInfo");
    mount_system(&server, body).await;
    // No ActionInfo mounted: 404.
    mount_reset(&server, "GracefulShutdown", 400).await;
    mount_reset(&server, "ForceOff", 204).await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    assert_eq!(outcome.action.as_deref(), Some("ResetType=ForceOff"));
    let reason = outcome.hard_fallback.unwrap();
    assert!(
        reason.contains("rejected GracefulShutdown (HTTP 400"),
        "{reason}"
    );
    assert_eq!(
        requests_to(&server, "POST", RESET).await,
        2,
        "graceful once, then hard"
    );
}

/// A login POST redirected (308, or 301 as some BMCs do for the trailing-slash form) is sent
/// again as a POST with its body to the new place, never as a GET without credentials.
#[tokio::test]
async fn a_redirected_login_is_posted_again_with_its_body() {
    for status in [301u16, 308] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(SESSIONS))
            .respond_with(
                ResponseTemplate::new(status).insert_header("Location", format!("{SESSIONS}/")),
            )
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{SESSIONS}/")))
            .and(body_json(json!({ "UserName": USER, "Password": PASSWORD })))
            .respond_with(
                ResponseTemplate::new(201)
                    .insert_header("X-Auth-Token", "token-r")
                    .insert_header("Location", format!("{SESSIONS}/r")),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(SYSTEM))
            .and(header("X-Auth-Token", "token-r"))
            .respond_with(ResponseTemplate::new(200).set_body_json(system("On", None)))
            .mount(&server)
            .await;
        Mock::given(method("DELETE"))
            .and(path(format!("{SESSIONS}/r")))
            .and(header("X-Auth-Token", "token-r"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;
        let driver = driver_with(&server, fast_options(), RedfishAuthMode::Session);
        assert_eq!(
            driver.power_state().await.unwrap(),
            PowerState::On,
            "{status}"
        );
        assert_eq!(requests_to(&server, "GET", SESSIONS).await, 0, "{status}");
        assert_eq!(
            requests_to(&server, "GET", &format!("{SESSIONS}/")).await,
            0
        );
        driver.close().await.unwrap();
        assert_eq!(
            requests_to(&server, "DELETE", &format!("{SESSIONS}/r")).await,
            1,
            "{status}: logged out"
        );
    }
}

/// Redirects that go nowhere are reported as redirect problems, never as wrong credentials.
#[tokio::test]
async fn redirect_problems_are_reported_as_such() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SESSIONS))
        .respond_with(ResponseTemplate::new(301).insert_header("Location", format!("{SESSIONS}/")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("{SESSIONS}/")))
        .respond_with(ResponseTemplate::new(301).insert_header("Location", SESSIONS))
        .mount(&server)
        .await;
    let err = driver_with(&server, fast_options(), RedfishAuthMode::Session)
        .power_state()
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        !matches!(err, BmcError::AuthenticationFailed { .. }),
        "{message}"
    );
    assert!(message.contains("redirects"), "{message}");
    assert!(!message.contains("credentials"), "{message}");
    assert_no_secret(&message);

    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(307))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(
        err.to_string().contains("redirect") && err.to_string().contains("without a Location"),
        "{err}"
    );
}

/// `close` deletes the session at once, and the driver logs in again if used afterwards.
#[tokio::test]
async fn close_logs_out_now_and_a_later_call_logs_in_again() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SESSIONS))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("X-Auth-Token", "t")
                .insert_header("Location", format!("{SESSIONS}/t")),
        )
        .mount(&server)
        .await;
    mount_system(&server, system("On", None)).await;
    Mock::given(method("DELETE"))
        .and(path(format!("{SESSIONS}/t")))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let driver = driver_with(&server, fast_options(), RedfishAuthMode::Session);
    driver.power_state().await.unwrap();
    driver.close().await.unwrap();
    assert_eq!(
        requests_to(&server, "DELETE", &format!("{SESSIONS}/t")).await,
        1
    );
    driver.close().await.unwrap();
    assert_eq!(
        requests_to(&server, "DELETE", &format!("{SESSIONS}/t")).await,
        1,
        "nothing left to close"
    );
    driver.power_state().await.unwrap();
    assert_eq!(requests_to(&server, "POST", SESSIONS).await, 2);
    drop(driver);
}
