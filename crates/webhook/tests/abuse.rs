//! The webhook under abuse, as `hostcycle webhook` runs it: each test serves from a child
//! process (this test binary run again with only [`child_webhook_server`], which calls
//! `hostcycle_webhook::cli::run` with the flags given, so the defaults are the command's), and
//! measures it from outside: idle sockets must not keep a review from being answered within
//! the API server's 5 s, the probe port must answer while the review port is saturated, a full
//! server must refuse rather than queue, and huge bodies must not grow the process's memory
//! beyond a bound (its peak resident size, `VmHWM` in /proc/PID/status).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hostcycle_testkit::pki::TestCa;
use hostcycle_testkit::{ManagedProcess, free_port};
use hostcycle_webhook::VALIDATE_PATH;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The child's arguments (after `hostcycle`), one per line; unset outside a child.
const CHILD_ARGS: &str = "HOSTCYCLE_WEBHOOK_TEST_CHILD_ARGS";
/// The API server's timeout for this webhook (`timeoutSeconds` of the install).
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    Webhook(hostcycle_webhook::cli::WebhookArgs),
}

/// Not a test on its own: the server the other tests run in a child process. Without
/// [`CHILD_ARGS`] it returns at once.
#[test]
fn child_webhook_server() {
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return;
    };
    // A test run killed outright cannot stop its children: go when the parent does.
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(0);
            }
        }
    });
    let cli = Cli::try_parse_from(std::iter::once("hostcycle").chain(args.lines())).unwrap();
    let Command::Webhook(args) = cli.command;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(hostcycle_webhook::cli::run(args)).unwrap();
}

/// A `hostcycle webhook` in a child process, stopped (SIGTERM, then SIGKILL) when dropped.
struct Child {
    process: ManagedProcess,
    port: u16,
    probe_port: u16,
    ca: TestCa,
    _dir: tempfile::TempDir,
}

impl Child {
    /// Starts the server with the command's defaults plus `extra` and waits for its probe
    /// port to say it is ready.
    async fn start(name: &str, extra: &[&str]) -> Child {
        let dir = tempfile::Builder::new()
            .prefix("webhook-abuse-")
            .tempdir()
            .unwrap();
        let ca = TestCa::new("webhook-abuse-ca").unwrap();
        let files = ca
            .write_server_cert(dir.path(), "webhook", &["127.0.0.1"])
            .unwrap();
        let (port, probe_port) = (free_port().unwrap(), free_port().unwrap());
        let mut args = vec![
            "webhook".to_string(),
            format!("--listen=127.0.0.1:{port}"),
            format!("--probe-addr=127.0.0.1:{probe_port}"),
            format!("--tls-cert-file={}", files.cert.display()),
            format!("--tls-key-file={}", files.key.display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "child_webhook_server",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ARGS, args.join("\n"));
        let mut process = ManagedProcess::spawn(name, cmd, dir.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            process.ensure_running().unwrap();
            if probe(probe_port, "/readyz").await.as_deref() == Some("200") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: the probe port {probe_port} did not say ready within 60 s; log {}",
                log(process.log_path())
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Child {
            process,
            port,
            probe_port,
            ca,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn client(&self) -> reqwest::Client {
        hostcycle_testkit::http::client(Some(&self.ca.cert_pem())).unwrap()
    }

    /// Peak resident set size so far, in bytes (`VmHWM`).
    fn peak_rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.process.pid())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .unwrap_or_else(|| panic!("no VmHWM in /proc/PID/status:\n{status}"));
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unreadable {line:?}"));
        kib * 1024
    }

    async fn tls_connect(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tls = self.ca.client_config();
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .unwrap()
    }
}

fn log(path: &Path) -> String {
    hostcycle_testkit::process::log_tail(path, 30)
}

/// `GET path` on the plain-HTTP probe port: the status code, or `None` when it does not
/// answer within 2 s.
async fn probe(port: u16, path: &str) -> Option<String> {
    let exchange = async {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: probe\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            let n = tcp.read(&mut buf).await.ok()?;
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&answer).to_string();
        text.split_whitespace().nth(1).map(str::to_string)
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

fn review(object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "a1b2c3d4-0000-4000-8000-000000000001",
            "kind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
            "resource": {"group": "metal3.io", "version": "v1alpha1", "resource": "baremetalhosts"},
            "name": "worker-1",
            "namespace": "metal3",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false
        }
    })
}

fn valid_review() -> Value {
    review(json!({
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {"name": "worker-1", "namespace": "metal3",
                     "annotations": {"reboot.metal3.io": "{\"mode\":\"hard\"}"}},
        "spec": {"online": true, "bmc": {"address": "redfish://10.0.0.1/redfish/v1/Systems/1",
                                          "credentialsName": "worker-1-bmc"}}
    }))
}

/// Posts a review and returns the status code and the answer, within the API server's
/// timeout or panics saying how long it took.
async fn post_review(child: &Child, body: &Value) -> (u16, Value) {
    let started = Instant::now();
    let client = child.client();
    let exchange = async {
        let response = client
            .post(child.url(VALIDATE_PATH))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok::<_, reqwest::Error>((status, response.text().await?))
    };
    let (status, text) = match tokio::time::timeout(API_SERVER_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("the review failed after {:?}: {e}", started.elapsed()),
        Err(_) => panic!(
            "no answer to a valid review within the API server's {API_SERVER_TIMEOUT:?}; log {}",
            log(child.process.log_path())
        ),
    };
    let answer = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, answer)
}

/// Connections that say nothing: neither a TLS handshake nor a request.
async fn idle_sockets(port: u16, count: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        sockets.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    sockets
}

/// Whether the server closed `socket` (EOF or reset) within `within`.
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, socket.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_do_not_keep_a_review_from_being_answered() {
    let child = Child::start("webhook-idle", &[]).await;
    // Warm the path once, so what is timed below is the server, not the first TLS setup.
    let (status, _) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200);

    let opened = Instant::now();
    let mut idle = idle_sockets(child.port, 300).await;
    let started = Instant::now();
    let (status, answer) = post_review(&child, &valid_review()).await;
    let latency = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["uid"],
        "a1b2c3d4-0000-4000-8000-000000000001"
    );
    println!("a review with 300 idle sockets open was answered in {latency:?}");

    // The probe port is not the review port: it answers however busy that one is.
    let started = Instant::now();
    assert_eq!(
        probe(child.probe_port, "/healthz").await.as_deref(),
        Some("200")
    );
    assert_eq!(
        probe(child.probe_port, "/readyz").await.as_deref(),
        Some("200")
    );
    println!("the probes answered in {:?}", started.elapsed());

    // Sockets that never sent a request are closed after the pre-request limit (5 s by
    // default), not held for the keep-alive idle timeout (120 s).
    let deadline = opened + Duration::from_secs(15);
    for (i, socket) in idle.iter_mut().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            closed_within(socket, left).await,
            "idle socket {i} still open {:?} after it connected",
            opened.elapsed()
        );
    }
    println!(
        "all 300 idle sockets were closed by the server within {:?}",
        opened.elapsed()
    );
    // Beyond --max-connections (256), the oldest silent ones made room for newer ones; the
    // rest ran out of time.
    let metrics = child
        .client()
        .get(child.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for reason in ["evicted", "no_request"] {
        let counted = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "hostcycle_webhook_connections_closed_total{{reason=\"{reason}\"}}"
                ))
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(counted > 0, "no connection closed as {reason}:\n{metrics}");
    }
}

/// A request whose headers arrived and whose body is still coming: a connection serving it
/// is busy, not idle. Returns once the server is reading the body (it answered `100
/// Continue`), with `sent` bytes of the body sent.
async fn start_slow_request(
    child: &Child,
    length: usize,
    sent: usize,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut stream = child.tls_connect().await;
    stream
        .write_all(
            format!(
                "POST {VALIDATE_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: {length}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    stream.flush().await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("100 Continue within 10 s")
            .unwrap();
        assert!(n > 0, "closed before 100 Continue: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 100"), "{answer}");
    stream.write_all(" ".repeat(sent).as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_refuses_new_connections_at_once_and_probes_still_answer() {
    // Bodies trickling past --slow-body-after would let a new connection take their place,
    // and past --min-body-rate end early: both off, so the four requests stay busy.
    let child = Child::start(
        "webhook-full",
        &[
            "--max-connections=4",
            "--request-timeout=6s",
            "--slow-body-after=1h",
            "--min-body-rate=0",
        ],
    )
    .await;
    let mut busy = Vec::new();
    for _ in 0..4 {
        busy.push(start_slow_request(&child, 1000, 10).await);
    }
    // Every connection is serving a request: a fifth is closed at once rather than left
    // waiting in the listen backlog for a slot.
    let mut refused = TcpStream::connect(("127.0.0.1", child.port)).await.unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut refused, Duration::from_secs(3)).await,
        "a connection beyond --max-connections was not refused within 3 s"
    );
    println!(
        "a connection beyond the limit was refused in {:?}",
        started.elapsed()
    );
    assert_eq!(
        probe(child.probe_port, "/healthz").await.as_deref(),
        Some("200")
    );
    assert_eq!(
        probe(child.probe_port, "/readyz").await.as_deref(),
        Some("200")
    );

    // The slow requests end with 408 at their deadline; the server is usable again.
    for stream in &mut busy {
        let mut answer = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut answer))
            .await
            .expect("the slow request is answered at its deadline")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let (status, answer) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_beyond_the_concurrency_bound_get_503_not_a_queue() {
    let child = Child::start(
        "webhook-reviews",
        &[
            "--max-concurrent-reviews=1",
            "--max-request-bytes=2000",
            "--request-timeout=8s",
            // A body still arriving would give its budget up to a review after
            // --slow-body-after, and end early below --min-body-rate: both off, so the bound
            // itself is what answers here.
            "--slow-body-after=1h",
            "--min-body-rate=0",
        ],
    )
    .await;
    // One review's body is arriving slowly: what it sent takes most of the body budget.
    let slow = start_slow_request(&child, 1900, 1800).await;
    // The server takes budget as it reads the bytes: until then a review still fits.
    let deadline = Instant::now() + Duration::from_secs(6);
    let (status, answer, took) = loop {
        let started = Instant::now();
        let (status, answer) = post_review(&child, &valid_review()).await;
        if status != 200 || Instant::now() > deadline {
            break (status, answer, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer.as_str().unwrap_or_default().contains("overloaded"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
    println!("a review beyond the bound was refused (503) in {took:?}");
    drop(slow);
    let (status, answer) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200, "{answer}");
}

/// A review of the largest size accepted (4 MiB by default) whose `request.object` is an
/// array of numbers: 2 bytes of JSON each, 32 bytes each as a JSON tree.
fn big_array_review(max_bytes: usize) -> String {
    let skeleton = review(json!([])).to_string();
    let room = max_bytes - skeleton.len() - 16;
    let numbers = "0,".repeat(room / 2);
    skeleton.replacen("[]", &format!("[{}0]", numbers), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_do_not_grow_memory_beyond_a_bound() {
    let child = Child::start("webhook-memory", &[]).await;
    let (status, _) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200);
    let before = child.peak_rss();

    let body = big_array_review(4 * 1024 * 1024);
    assert!(body.len() <= 4 * 1024 * 1024);
    let client = child.client();
    let mut posts = Vec::new();
    for _ in 0..4 {
        let (client, url, body) = (client.clone(), child.url(VALIDATE_PATH), body.clone());
        posts.push(tokio::spawn(async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .timeout(Duration::from_secs(60))
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }));
    }
    for post in posts {
        let (status, text) = post.await.unwrap();
        // An object that is not a JSON object is refused in an AdmissionReview, naming it.
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["status"]["code"], 400, "{answer}");
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("request.object"), "{message}");
    }
    let after = child.peak_rss();
    let growth = after.saturating_sub(before);
    println!(
        "peak RSS {} MiB before, {} MiB after four concurrent 4 MiB array bodies: +{} MiB",
        before >> 20,
        after >> 20,
        growth >> 20
    );
    assert!(
        growth < 64 * 1024 * 1024,
        "peak RSS grew by {} MiB (bound 64 MiB)",
        growth >> 20
    );
    // Still serving, deciding as before.
    let (status, answer) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

/// A connection that announced a `length`-byte body and sent as much of `length - 1` bytes as
/// the server would take within `within`, then stalls (kept open by the caller).
async fn held_body(
    child: &Child,
    length: usize,
    within: Duration,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut stream = child.tls_connect().await;
    stream
        .write_all(
            format!(
                "POST {VALIDATE_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let body = vec![b' '; length - 1];
    // A server that stops reading leaves the write pending: stop there and hold what it took.
    let _ = tokio::time::timeout(within, async {
        stream.write_all(&body).await?;
        stream.flush().await
    })
    .await;
    stream
}

/// Issue 25, point 3: nine connections each sent 4 MiB − 1 of a 4 MiB body and stalled held
/// the whole body budget (8 × 4 MiB), and every review then got a 503 after 1 s. A body that
/// arrives at once must be answered whatever stalled bodies hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_do_not_keep_a_fast_review_from_being_answered() {
    let child = Child::start("webhook-stalled-bodies", &[]).await;
    let (status, _) = post_review(&child, &valid_review()).await;
    assert_eq!(status, 200);

    let length = 4 * 1024 * 1024;
    let held = futures::future::join_all(
        (0..9).map(|_| held_body(&child, length, Duration::from_secs(2))),
    )
    .await;
    println!("9 connections hold up to {} bytes of body each", length - 1);

    for attempt in 0..3 {
        let started = Instant::now();
        let (status, answer) = post_review(&child, &valid_review()).await;
        let latency = started.elapsed();
        assert_eq!(
            status, 200,
            "attempt {attempt}: a review sent at once was refused after {latency:?} while \
             stalled bodies held the budget: {answer}"
        );
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(
            latency <= Duration::from_secs(1),
            "attempt {attempt}: the review took {latency:?} (at most 1 s)"
        );
        println!("attempt {attempt}: answered (200) in {latency:?} with 9 stalled bodies");
    }
    drop(held);
}
