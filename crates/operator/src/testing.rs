//! A fake API server for unit tests: a kube `Client` whose requests a closure answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;

use serde_json::{Value, json};

/// One request the fake API server received.
#[derive(Debug, Clone)]
pub struct FakeRequest {
    pub method: http::Method,
    pub path: String,
    /// The query string without `?` (empty when there is none).
    pub query: String,
    pub body: Vec<u8>,
}

impl FakeRequest {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A client whose every request `handler` answers with (HTTP status, JSON body).
pub fn fake_client<F, Fut>(handler: F) -> kube::Client
where
    F: Fn(FakeRequest) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = (u16, Value)> + Send + 'static,
{
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let handler = handler.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect_bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            let (status, json) = handler(FakeRequest {
                method: parts.method,
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                body,
            })
            .await;
            let response = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&json).unwrap()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

/// A Kubernetes `Status` failure with `code`.
pub fn status(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": reason, "code": code, "message": reason,
        }),
    )
}
