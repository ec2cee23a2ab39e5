//! The webhook's HTTPS server on loopback, without an API server: reviews in both versions,
//! health and metrics, the limits (body size, slow body, garbage), a certificate rotated
//! under it, a bad certificate at start, shutdown.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hostcycle_testkit::pki::TestCa;
use hostcycle_testkit::wait_until;
use hostcycle_webhook::server::{App, Running, ServerOptions, serve};
use hostcycle_webhook::{Policy, VALIDATE_PATH};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

struct Served {
    ca: TestCa,
    dir: tempfile::TempDir,
    running: Running,
    shutdown: CancellationToken,
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.running.local_addr.port())
    }

    fn client(&self) -> reqwest::Client {
        hostcycle_testkit::http::client(Some(&self.ca.cert_pem())).unwrap()
    }
}

async fn start(policy: Policy, tune: impl FnOnce(&mut ServerOptions)) -> Served {
    let ca = TestCa::new("webhook-test-ca").unwrap();
    let dir = tempfile::Builder::new()
        .prefix("i10-webhook-server-")
        .tempdir()
        .unwrap();
    let files = ca
        .write_server_cert(dir.path(), "webhook", &["127.0.0.1", "localhost"])
        .unwrap();
    let mut options = ServerOptions::new("127.0.0.1:0".parse().unwrap(), files.cert, files.key);
    tune(&mut options);
    let shutdown = CancellationToken::new();
    let running = serve(options, Arc::new(App::new(policy)), shutdown.clone())
        .await
        .unwrap();
    Served {
        ca,
        dir,
        running,
        shutdown,
    }
}

fn review(api_version: &str, value: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b3c8a77-0000-4000-8000-000000000042",
            "kind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
            "resource": {"group": "metal3.io", "version": "v1alpha1", "resource": "baremetalhosts"},
            "name": "worker-1",
            "namespace": "metal3",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": {
                "metadata": {"name": "worker-1", "annotations": {"reboot.metal3.io": value}},
                "spec": {"online": true}
            },
            "oldObject": null,
            "dryRun": false
        }
    })
}

async fn post(served: &Served, body: &Value) -> (u16, Value) {
    let response = served
        .client()
        .post(served.url(VALIDATE_PATH))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn answers_reviews_in_the_version_asked() {
    let served = start(Policy::validate_only(), |_| {}).await;
    for version in ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] {
        let (status, answer) = post(&served, &review(version, r#"{"mode":"hard"}"#)).await;
        assert_eq!(status, 200);
        assert_eq!(answer["apiVersion"], version);
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(
            answer["response"]["uid"],
            "0b3c8a77-0000-4000-8000-000000000042"
        );
        assert_eq!(answer["response"]["allowed"], true, "{answer}");

        let (status, answer) = post(&served, &review(version, "hard")).await;
        assert_eq!(status, 200);
        assert_eq!(answer["apiVersion"], version);
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["status"]["code"], 400);
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("reboot.metal3.io: value is not JSON"),
            "{message}"
        );
    }
    let metrics = served
        .client()
        .get(served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains(r#"hostcycle_webhook_reviews_total{operation="CREATE",outcome="allowed"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"hostcycle_webhook_reviews_total{operation="CREATE",outcome="invalid_value"} 2"#
        ),
        "{metrics}"
    );
    served.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), served.running.task)
        .await
        .expect("the server stops after shutdown")
        .unwrap();
}

#[tokio::test]
async fn health_paths_and_methods() {
    let served = start(Policy::validate_only(), |_| {}).await;
    let client = served.client();
    let health = client.get(served.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    assert_eq!(health.text().await.unwrap().trim(), "ok");
    let missing = client.get(served.url("/other")).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    let wrong = client.get(served.url(VALIDATE_PATH)).send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 405);
}

#[tokio::test]
async fn refuses_bodies_that_are_too_large_garbage_or_too_slow() {
    let served = start(Policy::validate_only(), |options| {
        options.max_body_bytes = 2048;
        options.request_timeout = Duration::from_millis(500);
    })
    .await;
    let client = served.client();
    let big = review("admission.k8s.io/v1", &"x".repeat(4096));
    let response = client
        .post(served.url(VALIDATE_PATH))
        .body(big.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("larger than 2048 bytes")
    );

    for (body, says) in [
        ("not json", "the body is not an AdmissionReview"),
        (
            r#"{"apiVersion":"admission.k8s.io/v9","kind":"AdmissionReview"}"#,
            "unsupported AdmissionReview apiVersion",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "carries no request",
        ),
    ] {
        let response = client
            .post(served.url(VALIDATE_PATH))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{body}");
        assert!(response.text().await.unwrap().contains(says), "{body}");
    }

    // A client that announces 100 bytes and sends 10 gets 408 after the deadline.
    let tls = served.ca.client_config();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let tcp = tokio::net::TcpStream::connect(served.running.local_addr)
        .await
        .unwrap();
    let mut stream = connector
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    stream
        .write_all(
            format!(
                "POST {VALIDATE_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100\r\n\r\n0123456789"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("an answer before the test's own deadline")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let served = start(Policy::validate_only(), |options| {
        options.tls_reload_interval = Duration::from_millis(100);
    })
    .await;
    let health = |ca_pem: String, url: String| async move {
        let client = hostcycle_testkit::http::client(Some(&ca_pem)).unwrap();
        client.get(url).send().await.map(|r| r.status().as_u16())
    };
    assert_eq!(
        health(served.ca.cert_pem(), served.url("/healthz"))
            .await
            .unwrap(),
        200
    );

    // cert-manager renews: a new key pair from another CA replaces the files.
    let new_ca = TestCa::new("rotated-ca").unwrap();
    new_ca
        .write_server_cert(served.dir.path(), "webhook", &["127.0.0.1"])
        .unwrap();
    wait_until(
        "the webhook to serve the rotated certificate",
        Duration::from_secs(20),
        || {
            let (pem, url) = (new_ca.cert_pem(), served.url("/healthz"));
            async move { health(pem, url).await.ok().filter(|s| *s == 200) }
        },
    )
    .await
    .unwrap();
    assert!(
        health(served.ca.cert_pem(), served.url("/healthz"))
            .await
            .is_err(),
        "the old certificate is no longer served"
    );

    // A certificate whose key does not match (files replaced one at a time) is not loaded:
    // the last good pair stays.
    let (other_cert, _) = TestCa::new("third-ca")
        .unwrap()
        .issue_server_cert("webhook", &["127.0.0.1"])
        .unwrap();
    std::fs::write(served.dir.path().join("webhook.crt"), other_cert).unwrap();
    wait_until(
        "the failed reload to be counted",
        Duration::from_secs(20),
        || {
            let (pem, url) = (new_ca.cert_pem(), served.url("/metrics"));
            async move {
                let client = hostcycle_testkit::http::client(Some(&pem)).ok()?;
                let text = client.get(url).send().await.ok()?.text().await.ok()?;
                text.contains(r#"hostcycle_webhook_certificate_reloads_total{result="error"}"#)
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        health(new_ca.cert_pem(), served.url("/healthz"))
            .await
            .unwrap(),
        200
    );
}

#[tokio::test]
async fn a_bad_certificate_stops_the_start_with_the_file_named() {
    let dir = tempfile::Builder::new()
        .prefix("i10-webhook-badcert-")
        .tempdir()
        .unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, "not a certificate").unwrap();
    std::fs::write(&key, "not a key").unwrap();
    let err = serve(
        ServerOptions::new("127.0.0.1:0".parse().unwrap(), cert.clone(), key),
        Arc::new(App::new(Policy::validate_only())),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains(&cert.display().to_string()), "{message}");
    assert!(message.contains("no certificate"), "{message}");

    let missing = dir.path().join("missing.crt");
    let err = serve(
        ServerOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            missing.clone(),
            missing.clone(),
        ),
        Arc::new(App::new(Policy::validate_only())),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("missing.crt"), "{err:#}");
}

/// `GET path` on a plain-HTTP port: the status code, `None` when refused or silent.
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: probe\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.ok()?;
        String::from_utf8_lossy(&answer)
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn the_probe_port_answers_and_says_not_ready_while_draining() {
    let served = start(Policy::validate_only(), |options| {
        options.probe_listen = Some("127.0.0.1:0".parse().unwrap());
        options.request_timeout = Duration::from_secs(4);
    })
    .await;
    let probes = served.running.probe_addr.expect("a probe port");
    assert_ne!(probes.port(), served.running.local_addr.port());
    assert_eq!(plain_get(probes, "/healthz").await, Some(200));
    assert_eq!(plain_get(probes, "/readyz").await, Some(200));
    assert_eq!(plain_get(probes, "/metrics").await, Some(404));

    // A review in flight (its body still coming) keeps the server draining after shutdown:
    // meanwhile it is alive but not ready.
    let tls = served.ca.client_config();
    let tcp = tokio::net::TcpStream::connect(served.running.local_addr)
        .await
        .unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    stream
        .write_all(
            format!(
                "POST {VALIDATE_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nexpect: 100-continue\r\ncontent-length: 100\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"));
    served.shutdown.cancel();
    wait_until(
        "/readyz to answer 503 while draining",
        Duration::from_secs(3),
        || async { (plain_get(probes, "/readyz").await == Some(503)).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(plain_get(probes, "/healthz").await, Some(200));
    // The review ends at its deadline (408), then the server stops, probes included.
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"));
    tokio::time::timeout(Duration::from_secs(15), served.running.task)
        .await
        .expect("the server stops once drained")
        .unwrap();
    assert_eq!(plain_get(probes, "/healthz").await, None);
}
