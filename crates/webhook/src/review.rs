//! The `AdmissionReview` wire format (`admission.k8s.io/v1`, and `v1beta1` answered in kind:
//! the two differ only in their defaults), reduced to the fields the webhook reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";
pub const KIND: &str = "AdmissionReview";

/// An `AdmissionReview` as the API server sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The operation under review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<serde_json::Value>,
    #[serde(default)]
    pub old_object: Option<serde_json::Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl AdmissionRequest {
    /// `namespace/name` of the object, or what is known of it.
    pub fn object_name(&self) -> String {
        let name = self
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                self.object
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/name"))
                    .and_then(serde_json::Value::as_str)
            })
            .or_else(|| {
                self.object
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/generateName"))
                    .and_then(serde_json::Value::as_str)
            })
            .unwrap_or("");
        match self.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        }
    }
}

/// `status` of a refusal: the API server shows `message` to the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    pub status: &'static str,
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The answer: an `AdmissionReview` of the request's version carrying the response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewResponse {
    pub api_version: String,
    pub kind: &'static str,
    pub response: AdmissionResponse,
}

/// Why a body is not a review the webhook can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(#[source] serde_json::Error),
    #[error(
        "unsupported AdmissionReview apiVersion {0:?} (expected {API_VERSION_V1} or {API_VERSION_V1BETA1})"
    )]
    UnsupportedVersion(String),
    #[error("unexpected kind {0:?} (expected AdmissionReview)")]
    WrongKind(String),
    #[error("the AdmissionReview carries no request")]
    NoRequest,
}

/// Parses a request body; the version is kept for the answer.
pub fn parse_review(body: &[u8]) -> Result<(String, AdmissionRequest), ReviewError> {
    let review: AdmissionReview = serde_json::from_slice(body).map_err(ReviewError::NotAReview)?;
    if review.api_version != API_VERSION_V1 && review.api_version != API_VERSION_V1BETA1 {
        return Err(ReviewError::UnsupportedVersion(review.api_version));
    }
    if review.kind != KIND {
        return Err(ReviewError::WrongKind(review.kind));
    }
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    Ok((review.api_version, request))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_a_v1_update_as_the_api_server_sends_it() {
        let body = serde_json::json!({
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
                "resource": {"group": "metal3.io", "version": "v1alpha1", "resource": "baremetalhosts"},
                "requestKind": {"group": "metal3.io", "version": "v1alpha1", "kind": "BareMetalHost"},
                "requestResource": {"group": "metal3.io", "version": "v1alpha1", "resource": "baremetalhosts"},
                "name": "worker-1",
                "namespace": "metal3",
                "operation": "UPDATE",
                "userInfo": {"username": "alice", "uid": "1", "groups": ["system:authenticated"], "extra": {"scopes": ["x"]}},
                "object": {"metadata": {"name": "worker-1"}},
                "oldObject": {"metadata": {"name": "worker-1"}},
                "dryRun": false,
                "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
            }
        });
        let (version, request) = parse_review(body.to_string().as_bytes()).unwrap();
        assert_eq!(version, API_VERSION_V1);
        assert_eq!(request.operation, Operation::Update);
        assert_eq!(request.user_info.username, "alice");
        assert_eq!(request.resource.resource, "baremetalhosts");
        assert_eq!(request.object_name(), "metal3/worker-1");
        assert!(request.old_object.is_some());
    }

    #[test]
    fn refuses_what_is_not_a_review() {
        assert!(matches!(
            parse_review(b"not json"),
            Err(ReviewError::NotAReview(_))
        ));
        let other = br#"{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview"}"#;
        assert!(matches!(
            parse_review(other),
            Err(ReviewError::UnsupportedVersion(v)) if v == "admission.k8s.io/v2"
        ));
        let kind = br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#;
        assert!(matches!(parse_review(kind), Err(ReviewError::WrongKind(_))));
        let empty = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#;
        assert!(matches!(parse_review(empty), Err(ReviewError::NoRequest)));
    }

    #[test]
    fn a_response_has_the_shape_the_api_server_reads() {
        let response = AdmissionReviewResponse {
            api_version: API_VERSION_V1BETA1.to_string(),
            kind: KIND,
            response: AdmissionResponse {
                uid: "u".into(),
                allowed: false,
                status: Some(Status {
                    status: "Failure",
                    code: 403,
                    reason: "Forbidden",
                    message: "no".into(),
                }),
                warnings: vec![],
            },
        };
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({
                "apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": "u",
                    "allowed": false,
                    "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "no"}
                }
            })
        );
    }
}
