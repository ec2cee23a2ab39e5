//! A hostile or broken BMC cannot hurt the operator or leak a secret: bodies are read with a
//! cap, BMC text is cut to about 1 KiB and scrubbed of the password, and children
//! (ipmitool, reboot commands) get a cleared environment.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::Parser;
use common::*;
use hostcycle_bmc::cli::{BmcArgs, execute};
use hostcycle_bmc::command::COMMAND_ENVIRONMENT;
use hostcycle_bmc::{
    BmcConnector, BmcError, CommandDriver, CommandDriverConfig, ConnectorOptions,
    HostConnectOptions, IpmiOptions, PowerDriver, PowerOffMode, RedfishAuthMode, RetryPolicy,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const SYSTEM: &str = "/redfish/v1/Systems/1";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
const MIB: usize = 1024 * 1024;
/// An error's text stays around this size whatever the BMC sends (a few fields of ~1 KiB).
const MAX_ERROR_TEXT: usize = 6 * 1024;

fn fast_options() -> ConnectorOptions {
    ConnectorOptions {
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_retry_after: Duration::from_millis(100),
            deadline: Duration::from_secs(20),
        },
        ..ConnectorOptions::default()
    }
}

fn driver_at(
    address: &str,
    options: ConnectorOptions,
    auth: RedfishAuthMode,
) -> Arc<dyn PowerDriver> {
    init_tracing();
    let host = HostConnectOptions {
        redfish_auth: auth,
        ..Default::default()
    };
    BmcConnector::new(options)
        .connect_str(address, credentials(), &host)
        .unwrap()
}

fn driver(server: &MockServer) -> Arc<dyn PowerDriver> {
    driver_at(
        &format!("redfish+http://{}{SYSTEM}", server.address()),
        fast_options(),
        RedfishAuthMode::Basic,
    )
}

/// The error's Display and Debug are bounded and free of the password.
fn assert_contained(err: &BmcError) {
    let display = err.to_string();
    let debug = format!("{err:?}");
    assert!(
        display.len() <= MAX_ERROR_TEXT,
        "error is {} bytes: {}…",
        display.len(),
        &display[..300]
    );
    assert!(
        debug.len() <= 2 * MAX_ERROR_TEXT,
        "Debug is {} bytes",
        debug.len()
    );
    assert_no_secret(&display);
    assert_no_secret(&debug);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    assert!(
        !display.contains(&basic) && !debug.contains(&basic),
        "{display}"
    );
}

fn system(power: &str, reset: Value) -> Value {
    json!({
        "@odata.id": SYSTEM,
        "Id": "1",
        "PowerState": power,
        "Actions": { "#ComputerSystem.Reset": reset },
    })
}

async fn mount_get(server: &MockServer, at: &str, body: Value) {
    Mock::given(method("GET"))
        .and(path(at))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(server)
        .await;
}

/// A System that is on, whose reset action (target `/reset`) allows `reset_types` according
/// to its ActionInfo at `/info` (where the driver trusts any value).
async fn mount_reset_types(server: &MockServer, reset_types: Value) {
    mount_get(
        server,
        SYSTEM,
        system(
            "On",
            json!({ "target": "/reset", "@Redfish.ActionInfo": "/info" }),
        ),
    )
    .await;
    mount_get(
        server,
        "/info",
        json!({ "Parameters": [{ "Name": "ResetType", "AllowableValues": reset_types }] }),
    )
    .await;
}

/// The peak resident set of this process (nextest runs each test in its own process).
fn peak_rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A BMC that answers every request with a chunked body of `total` bytes (no
/// Content-Length), counting what it managed to send.
async fn streaming_bmc(total: usize) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 8192];
                let _ = socket.read(&mut request).await;
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                            Transfer-Encoding: chunked\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 * 1024];
                let framed = [
                    format!("{:x}\r\n", chunk.len()).into_bytes(),
                    chunk,
                    b"\r\n".to_vec(),
                ]
                .concat();
                let mut written = 0;
                while written < total {
                    if socket.write_all(&framed).await.is_err() {
                        return;
                    }
                    written += 64 * 1024;
                    counter.fetch_add(64 * 1024, Ordering::Relaxed);
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    (address, sent)
}

/// A BMC that announces a `Content-Length` and then sends nothing.
async fn announcing_bmc(length: u64) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = vec![0u8; 8192];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            );
            let _ = socket.write_all(head.as_bytes()).await;
            // Kept open, body never sent.
            open.push(socket);
        }
    });
    address
}

#[tokio::test]
async fn a_body_streaming_far_past_the_cap_is_cut_off_quickly_in_bounded_memory() {
    let (address, sent) = streaming_bmc(256 * MIB).await;
    let driver = driver_at(
        &format!("redfish+http://{address}{SYSTEM}"),
        fast_options(),
        RedfishAuthMode::Basic,
    );
    let peak_before = peak_rss_bytes();
    let start = Instant::now();
    let err = driver.power_state().await.unwrap_err();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(
        matches!(err, BmcError::InvalidResponse { .. }),
        "not retried, not a timeout: {err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("larger than the 1 MiB hostcycle reads from a BMC"),
        "{message}"
    );
    assert!(message.contains("kept sending"), "{message}");
    assert_contained(&err);
    // Whatever sits in socket buffers aside, the BMC could not send much past the cap.
    let sent = sent.load(Ordering::Relaxed) as usize;
    assert!(sent < 48 * MIB, "the client read {sent} bytes");
    let growth = peak_rss_bytes().saturating_sub(peak_before);
    assert!(growth < 16 * MIB, "peak memory grew by {growth} bytes");
}

#[tokio::test]
async fn a_content_length_over_the_cap_is_refused_before_reading() {
    let address = announcing_bmc(3_000_000_000).await;
    let driver = driver_at(
        &format!("redfish+http://{address}{SYSTEM}"),
        fast_options(),
        RedfishAuthMode::Basic,
    );
    let start = Instant::now();
    let err = driver.power_state().await.unwrap_err();
    // Not waiting for a body that never comes (the request timeout is 5 s).
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let message = err.to_string();
    assert!(
        message.contains("announced 3000000000 bytes and was not read"),
        "{message}"
    );
}

#[tokio::test]
async fn the_cap_is_configurable() {
    let server = MockServer::start().await;
    let mut body = system("On", json!({ "target": "/t" }));
    body["Padding"] = json!("p".repeat(10_000));
    mount_get(&server, SYSTEM, body).await;
    let address = format!("redfish+http://{}{SYSTEM}", server.address());
    let small = ConnectorOptions {
        max_response_bytes: 4096,
        ..fast_options()
    };
    let err = driver_at(&address, small, RedfishAuthMode::Basic)
        .power_state()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("larger than the 4 KiB"), "{err}");
    driver_at(&address, fast_options(), RedfishAuthMode::Basic)
        .power_state()
        .await
        .unwrap();
}

#[tokio::test]
async fn hostcycle_bmc_status_reads_with_the_same_cap() {
    let (address, sent) = streaming_bmc(256 * MIB).await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, PASSWORD).unwrap();
    #[derive(Parser)]
    struct Bmc {
        #[command(flatten)]
        args: BmcArgs,
    }
    let cli = Bmc::try_parse_from([
        "bmc",
        "status",
        "--address",
        &format!("redfish+http://{address}{SYSTEM}"),
        "--username",
        USER,
        "--password-file",
        password_file.to_str().unwrap(),
        "--auth",
        "basic",
    ])
    .unwrap();
    let peak_before = peak_rss_bytes();
    let start = Instant::now();
    let err = execute(&cli.args).await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert!(
        format!("{err:#}").contains("larger than the 1 MiB"),
        "{err:#}"
    );
    assert!((sent.load(Ordering::Relaxed) as usize) < 48 * MIB);
    assert!(peak_rss_bytes().saturating_sub(peak_before) < 16 * MIB);
}

#[tokio::test]
async fn thousands_of_allowed_reset_types_are_cut_in_errors_and_outcomes() {
    let server = MockServer::start().await;
    // Valid ResetType values only (a list with unknown values is looked up in the ActionInfo
    // instead), repeated into a huge list.
    let known = ["On", "Nmi", "PushPowerButton", "ForceOn", "PowerCycle"];
    let mut many: Vec<String> = (0..40_000)
        .map(|i| known[i % known.len()].to_string())
        .collect();
    mount_get(
        &server,
        SYSTEM,
        system(
            "On",
            json!({ "target": "/reset", "ResetType@Redfish.AllowableValues": many }),
        ),
    )
    .await;
    // Neither GracefulShutdown nor ForceOff: unsupported, naming the list.
    let err = driver(&server)
        .power_off(PowerOffMode::Soft)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("(truncated)"), "{err}");
    assert_contained(&err);

    // With ForceOff allowed, the soft request falls back, and the reason is cut too.
    let server = MockServer::start().await;
    many.push("ForceOff".into());
    mount_get(
        &server,
        SYSTEM,
        system(
            "On",
            json!({ "target": "/reset", "ResetType@Redfish.AllowableValues": many }),
        ),
    )
    .await;
    Mock::given(method("POST"))
        .and(path("/reset"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    let reason = outcome.hard_fallback.clone().unwrap();
    assert!(reason.len() <= 1024, "{} bytes", reason.len());
    assert!(outcome.to_string().len() < 2048);
}

#[tokio::test]
async fn huge_member_ids_are_cut() {
    let server = MockServer::start().await;
    let members: Vec<Value> = (0..2)
        .map(|i| json!({ "@odata.id": format!("/redfish/v1/Systems/{i}{}", "x".repeat(400_000)) }))
        .collect();
    mount_get(
        &server,
        "/redfish/v1/Systems",
        json!({ "Members": members }),
    )
    .await;
    let err = driver_at(
        &format!("redfish+http://{}", server.address()),
        fast_options(),
        RedfishAuthMode::Basic,
    )
    .power_state()
    .await
    .unwrap_err();
    assert!(
        matches!(err, BmcError::SystemAmbiguous { count: 2, .. }),
        "{err:?}"
    );
    assert_contained(&err);
}

#[tokio::test]
async fn a_huge_reset_target_is_cut() {
    let server = MockServer::start().await;
    let target = format!("/redfish/v1/Systems/1/Actions/{}", "t".repeat(600_000));
    mount_get(&server, SYSTEM, system("Off", json!({ "target": target }))).await;
    // Nothing answers at that target (404, or 414 for so long a URI).
    let err = driver(&server).power_on().await.unwrap_err();
    assert_contained(&err);
}

#[tokio::test]
async fn huge_error_bodies_are_cut() {
    for body in [
        // Past the body cap.
        "E".repeat(4 * MIB),
        // Under the cap, as a Redfish error message and as plain text.
        json!({ "error": { "message": "m".repeat(900_000) } }).to_string(),
        "line ".repeat(180_000),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path(SYSTEM))
            .respond_with(ResponseTemplate::new(500).set_body_string(body))
            .mount(&server)
            .await;
        let err = driver(&server).power_state().await.unwrap_err();
        assert_contained(&err);
    }
}

/// Answers with the request echoed back: its body and its headers, as a careless BMC
/// might in an error page.
struct Echo(u16);

impl Respond for Echo {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let headers: Vec<String> = request
            .headers
            .iter()
            .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("?")))
            .collect();
        let basic = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|token| base64::engine::general_purpose::STANDARD.decode(token).ok())
            .map(|decoded| String::from_utf8_lossy(&decoded).into_owned())
            .unwrap_or_default();
        let body = format!(
            "could not process {basic} {} with headers {}",
            String::from_utf8_lossy(&request.body),
            headers.join("; ")
        );
        ResponseTemplate::new(self.0).set_body_string(body)
    }
}

#[tokio::test]
async fn a_login_that_echoes_the_password_does_not_leak_it() {
    for status in [500, 503, 429] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(SESSIONS))
            .respond_with(Echo(status))
            .mount(&server)
            .await;
        let err = driver_at(
            &format!("redfish+http://{}{SYSTEM}", server.address()),
            fast_options(),
            RedfishAuthMode::Session,
        )
        .power_state()
        .await
        .unwrap_err();
        assert!(err.to_string().contains(&format!("HTTP {status}")), "{err}");
        assert_contained(&err);
    }
}

#[tokio::test]
async fn error_pages_echoing_the_credentials_are_scrubbed() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(Echo(500))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/reset"))
        .respond_with(Echo(400))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert!(err.to_string().contains("<redacted>"), "{err}");
    assert_contained(&err);

    // The BMC quotes the password in a value the driver cannot decode.
    let server = MockServer::start().await;
    mount_get(
        &server,
        SYSTEM,
        system(
            "On",
            json!({ "target": "/reset", "ResetType@Redfish.AllowableValues": PASSWORD }),
        ),
    )
    .await;
    let err = driver(&server)
        .power_off(PowerOffMode::Soft)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::InvalidResponse { .. }), "{err:?}");
    assert_contained(&err);

    // And in a 400 to a graceful request: the reason of the hard fallback is clean.
    let server = MockServer::start().await;
    mount_get(&server, SYSTEM, system("On", json!({ "target": "/reset" }))).await;
    Mock::given(method("POST"))
        .and(path("/reset"))
        .and(wiremock::matchers::body_json(
            json!({ "ResetType": "GracefulShutdown" }),
        ))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "error": { "message": format!("user {USER} with password {PASSWORD} may not") }
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/reset"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    let reason = outcome.hard_fallback.clone().unwrap();
    assert!(reason.contains("<redacted>"), "{reason}");
    assert_no_secret(&reason);
    assert_no_secret(&format!("{outcome:?}"));
}

/// The password, percent-encoded as a BMC would put it in a path or a `Location`.
fn percent_encoded_password() -> String {
    PASSWORD
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A BMC that lists the password among its reset types (in the ActionInfo, where the driver
/// trusts any value) and puts it in its reset target: what the driver copies into a hard
/// fallback's reason and into errors is clean.
#[tokio::test]
async fn reset_types_and_targets_holding_the_password_are_scrubbed() {
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let server = MockServer::start().await;
    mount_reset_types(
        &server,
        json!(["On", "ForceOff", PASSWORD, format!("Basic {basic}")]),
    )
    .await;
    Mock::given(method("POST"))
        .and(path("/reset"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let outcome = driver(&server).power_off(PowerOffMode::Soft).await.unwrap();
    let reason = outcome.hard_fallback.clone().unwrap();
    assert!(reason.contains("not among"), "{reason}");
    assert!(reason.contains("<redacted>"), "{reason}");
    assert_no_secret(&format!("{outcome} {outcome:?}"));
    assert!(!reason.contains(&basic), "{reason}");
    // Reboot needs GracefulRestart or ForceRestart, neither listed: the refusal lists the
    // types without the password.
    let err = driver(&server)
        .reboot(PowerOffMode::Soft)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    assert_contained(&err);

    // The reset target holds the password (as is, and percent-encoded): the 500 it answers
    // names the path, and the retries name the operation.
    for target in [
        format!("/reset/{PASSWORD}/ComputerSystem.Reset"),
        format!("/reset/{}/ComputerSystem.Reset", percent_encoded_password()),
    ] {
        let server = MockServer::start().await;
        mount_get(&server, SYSTEM, system("On", json!({ "target": target }))).await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(500).set_body_string("internal error"))
            .mount(&server)
            .await;
        let err = driver(&server)
            .power_off(PowerOffMode::Hard)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("ComputerSystem.Reset"), "{err}");
        assert!(err.to_string().contains("<redacted>"), "{err}");
        assert_contained(&err);
    }
}

/// A BMC that redirects to a path holding the password, and one whose session lives at such
/// a path and refuses the logout: neither error shows it.
#[tokio::test]
async fn redirects_and_sessions_holding_the_password_are_scrubbed() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(307).insert_header(
            "Location",
            format!("/redfish/v1/Systems/{}", percent_encoded_password()).as_str(),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;
    let err = driver(&server).power_state().await.unwrap_err();
    assert_contained(&err);

    let server = MockServer::start().await;
    let session = format!("{SESSIONS}/{}", percent_encoded_password());
    mount_get(
        &server,
        "/redfish/v1/",
        json!({ "Links": { "Sessions": { "@odata.id": SESSIONS } } }),
    )
    .await;
    Mock::given(method("POST"))
        .and(path(SESSIONS))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("X-Auth-Token", "token-1")
                .insert_header("Location", session.as_str()),
        )
        .mount(&server)
        .await;
    mount_get(&server, SYSTEM, system("On", json!({}))).await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(500).set_body_string("cannot delete"))
        .mount(&server)
        .await;
    let driver = driver_at(
        &format!("redfish+http://{}{SYSTEM}", server.address()),
        fast_options(),
        RedfishAuthMode::Session,
    );
    driver.power_state().await.unwrap();
    let err = driver.close().await.unwrap_err();
    assert!(err.to_string().contains("DELETE"), "{err}");
    assert_contained(&err);
}

/// The session token a BMC hands out in the tests below: long enough to be searched for.
const TOKEN: &str = "tok-Zq81x7Yw3k";

/// A BMC that opens sessions with [`TOKEN`], echoes each request's headers (the token among
/// them) in its error pages, and quotes the token — as it is and JSON-escaped — when it
/// refuses the logout: neither errors nor logs show the token, though the driver no longer
/// holds the session when the logout fails.
#[tokio::test]
async fn session_tokens_echoed_by_the_bmc_are_scrubbed() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SESSIONS))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("X-Auth-Token", TOKEN)
                .insert_header("Location", format!("{SESSIONS}/1").as_str()),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(Echo(500))
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({ "error": {
            "message": format!("cannot delete session {TOKEN}"),
            "@Message.ExtendedInfo": [{ "Message": "token \\u0074ok-Zq81x7Yw3k in use" }],
        }})))
        .mount(&server)
        .await;
    let logs = logs_of(async {
        let driver = driver_at(
            &format!("redfish+http://{}{SYSTEM}", server.address()),
            fast_options(),
            RedfishAuthMode::Session,
        );
        let err = driver.power_state().await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(text.contains("x-auth-token: <redacted>"), "{text}");
        assert!(
            !text.contains(TOKEN),
            "the session token leaked into: {text}"
        );
        assert_contained(&err);
        let err = driver.close().await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(text.contains("cannot delete session <redacted>"), "{text}");
        assert!(
            !text.contains(TOKEN),
            "the session token leaked into: {text}"
        );
        assert!(
            !text.contains("Zq81x7Yw3k"),
            "the session token leaked into: {text}"
        );
    })
    .await;
    assert!(logs.contains("x-auth-token: <redacted>"), "{logs}");
    assert!(
        !logs.contains("Zq81x7Yw3k"),
        "the session token leaked into the logs: {logs}"
    );
}

/// Log lines written while `run` runs (this thread, every level).
async fn logs_of<F: std::future::Future<Output = ()>>(run: F) -> String {
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    run.await;
    drop(guard);
    String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned()
}

/// What the driver logs on the way — retries naming the operation and its error, redirects
/// followed, a soft request carried out hard with the BMC's reset types, a service root that
/// could not be read — holds no password, whatever the BMC put where.
#[tokio::test]
async fn logs_hold_no_password_from_an_echoing_bmc() {
    let logs = logs_of(async {
        // Retries of a reset whose target holds the password.
        let server = MockServer::start().await;
        let target = format!("/reset/{PASSWORD}/ComputerSystem.Reset");
        mount_get(&server, SYSTEM, system("On", json!({ "target": target }))).await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(500).set_body_string("internal error"))
            .mount(&server)
            .await;
        let err = driver(&server)
            .power_off(PowerOffMode::Hard)
            .await
            .unwrap_err();
        assert!(matches!(err, BmcError::RetriesExhausted { .. }), "{err:?}");

        // A redirect to a path holding it.
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path(SYSTEM))
            .respond_with(ResponseTemplate::new(307).insert_header(
                "Location",
                format!("/redfish/v1/Systems/{}", percent_encoded_password()).as_str(),
            ))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(503).set_body_string("busy"))
            .mount(&server)
            .await;
        driver(&server).power_state().await.unwrap_err();

        // Reset types holding it: soft carried out hard, logged with the reason.
        let server = MockServer::start().await;
        mount_reset_types(&server, json!(["On", "ForceOff", PASSWORD])).await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;
        driver(&server).power_off(PowerOffMode::Soft).await.unwrap();

        // A service root redirecting in a loop through paths holding it (session auth looks
        // up Links.Sessions there, and logs why it could not).
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/redfish/v1/"))
            .respond_with(
                ResponseTemplate::new(302)
                    .insert_header("Location", format!("/redfish/v1/{PASSWORD}/").as_str()),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(302).insert_header(
                "Location",
                format!("/redfish/v1/{}/again", percent_encoded_password()).as_str(),
            ))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(401))
            .mount(&server)
            .await;
        driver_at(
            &format!("redfish+http://{}{SYSTEM}", server.address()),
            fast_options(),
            RedfishAuthMode::Session,
        )
        .power_state()
        .await
        .unwrap_err();
    })
    .await;
    for needle in [
        "transient BMC failure; retrying",
        "following the BMC's redirect",
        "soft request carried out hard",
        "no Links.Sessions",
    ] {
        assert!(logs.contains(needle), "the case logs {needle:?}:\n{logs}");
    }
    assert_no_secret(&logs);
    assert!(!logs.contains(&percent_encoded_password()), "{logs}");
    assert!(logs.contains("<redacted>"), "{logs}");
}

/// A script that records its own environment, as the kernel handed it over (a shell adds
/// variables of its own to what `env` prints).
fn environment_recorder(dir: &Path, name: &str, stdout: &str) -> std::path::PathBuf {
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntr '\\000' '\\n' < /proc/$$/environ > {out}\necho '{stdout}'\n",
            out = dir.join(format!("{name}.env")).display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

fn recorded_names(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("{name}.env")))
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('=').next().unwrap().to_string())
        .collect()
}

/// A variable of this process that a child must not see.
fn some_other_variable() -> String {
    std::env::vars()
        .map(|(name, _)| name)
        .find(|name| !COMMAND_ENVIRONMENT.contains(&name.as_str()) && !name.contains("PASSWORD"))
        .expect("the test process has more variables than PATH and HOME")
}

#[tokio::test]
async fn command_driver_children_get_only_the_allowed_environment() {
    let dir = tempfile::tempdir().unwrap();
    let reboot = environment_recorder(dir.path(), "reboot", "rebooting");
    let check = environment_recorder(dir.path(), "check", "true");
    let driver = CommandDriver::new(
        CommandDriverConfig {
            reboot_command: vec![reboot.display().to_string()],
            boot_check_command: vec![check.display().to_string()],
            command_timeout: Some(Duration::from_secs(10)),
        },
        "node-1",
    )
    .unwrap();
    driver.reboot(PowerOffMode::Hard).await.unwrap();
    driver.power_state().await.unwrap();
    let other = some_other_variable();
    for name in ["reboot", "check"] {
        let names = recorded_names(dir.path(), name);
        for variable in &names {
            assert!(
                COMMAND_ENVIRONMENT.contains(&variable.as_str()),
                "{name} saw {variable}: {names:?}"
            );
        }
        assert!(!names.contains(&other), "{other} leaked");
        assert!(names.contains(&"PATH".to_string()), "{names:?}");
    }
}

#[tokio::test]
async fn ipmitool_gets_only_path() {
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = environment_recorder(dir.path(), "ipmitool", "Chassis Power is on");
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool,
            ..IpmiOptions::default()
        },
        ..fast_options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            "ipmi://127.0.0.1:6230",
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    driver.power_state().await.unwrap();
    let mut names = recorded_names(dir.path(), "ipmitool");
    names.sort();
    // The password goes through a pipe on its stdin, not its environment.
    assert_eq!(names, ["PATH"]);
}

#[tokio::test]
async fn ipmitool_output_echoing_the_password_is_scrubbed_and_cut() {
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = dir.path().join("ipmitool");
    std::fs::write(
        &ipmitool,
        "#!/bin/sh\n\
         password=$(cat)\n\
         echo \"Error: Unable to set Chassis Power Control to Down/Off with $password\" >&2\n\
         head -c 3000000 /dev/zero | tr '\\000' x >&2\n\
         exit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &ipmitool,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let options = ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool,
            ..IpmiOptions::default()
        },
        ..fast_options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            "ipmi://127.0.0.1:6230",
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    let err = driver.power_state().await.unwrap_err();
    assert_contained(&err);
}
