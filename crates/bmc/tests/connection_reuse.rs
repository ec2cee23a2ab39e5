//! A driver keeps its connection to the BMC between reads within
//! `ConnectorOptions::idle_timeout` and opens a new one after it: a loopback Redfish server
//! counts the TCP connections it accepts.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hostcycle_bmc::{
    BmcConnector, BmcCredentials, ConnectorOptions, HostConnectOptions, PowerState, RedfishAuthMode,
};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// Serves one system that is on; returns its port and the count of accepted connections.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = service_fn(|_request: Request<hyper::body::Incoming>| async {
                    let body = serde_json::json!({
                        "@odata.id": "/redfish/v1/Systems/1",
                        "Id": "1",
                        "PowerState": "On",
                    });
                    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
                    response
                        .headers_mut()
                        .insert("content-type", "application/json".parse().unwrap());
                    Ok::<_, Infallible>(response)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, accepted)
}

#[tokio::test]
async fn a_connection_is_reused_within_the_idle_timeout_and_closed_after_it() {
    let (port, accepted) = counting_server().await;
    // Long enough that three reads in a row fit in it on a loaded machine.
    let idle_timeout = Duration::from_secs(2);
    let connector = BmcConnector::new(ConnectorOptions {
        idle_timeout,
        ..ConnectorOptions::default()
    });
    let host = HostConnectOptions {
        redfish_auth: RedfishAuthMode::Basic,
        ..Default::default()
    };
    let driver = connector
        .connect_str(
            &format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1"),
            BmcCredentials::new("admin", "password").unwrap(),
            &host,
        )
        .unwrap();

    // Reads in quick succession (a watched reboot) share one connection.
    for _ in 0..3 {
        assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // After the idle timeout (a steady poll later) the connection is gone: a new one.
    tokio::time::sleep(idle_timeout + Duration::from_millis(500)).await;
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
