//! The `AdmissionReview` wire format (`admission.k8s.io/v1`, and `v1beta1` answered in kind:
//! the two differ only in their defaults), reduced to the fields the webhook reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";
pub const KIND: &str = "AdmissionReview";

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
    #[error("the AdmissionReview's objects are not shaped like BareMetalHosts: {}", .0.join("; "))]
    WrongShape(Vec<String>),
}

/// A review as read from a body: the request, reduced to what the decision reads, and where
/// its objects are not shaped like BareMetalHosts.
#[derive(Debug, Clone)]
pub struct ParsedReview {
    /// The request's version, answered in kind.
    pub api_version: String,
    /// `object` and `oldObject` hold only `metadata.name`, `metadata.namespace`,
    /// `metadata.generateName`, the reboot, paused and detached annotations, `spec.online`,
    /// `spec.bmc`'s `address`, `credentialsName` and `disableCertificateVerification`, and
    /// `spec.consumerRef`'s `apiVersion`, `kind`, `namespace` and `name`; `userInfo.extra`
    /// is dropped.
    pub request: AdmissionRequest,
    /// Fields of `object` / `oldObject` of the wrong type, e.g. `request.object: expected a
    /// JSON object, found an array`. The API server checks hosts against their CRD's
    /// schema, so these come only from something else posting to the webhook.
    pub shape_problems: Vec<String>,
}

/// Parses a request body; the version is kept for the answer. Objects of the wrong shape
/// are an error here ([`read_review`] reports them alongside the request instead).
pub fn parse_review(body: &[u8]) -> Result<(String, AdmissionRequest), ReviewError> {
    let parsed = read_review(body)?;
    if !parsed.shape_problems.is_empty() {
        return Err(ReviewError::WrongShape(parsed.shape_problems));
    }
    Ok((parsed.api_version, parsed.request))
}

/// Reads a request body into typed fields, skipping everything the decision does not read
/// without building it (serde's `IgnoredAny`): a body costs its own bytes and a few small
/// strings, never a JSON tree several times its size.
pub fn read_review(body: &[u8]) -> Result<ParsedReview, ReviewError> {
    let review: wire::Review = serde_json::from_slice(body).map_err(ReviewError::NotAReview)?;
    if review.api_version != API_VERSION_V1 && review.api_version != API_VERSION_V1BETA1 {
        return Err(ReviewError::UnsupportedVersion(review.api_version));
    }
    if review.kind != KIND {
        return Err(ReviewError::WrongKind(review.kind));
    }
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    let mut shape_problems = Vec::new();
    let object = request
        .object
        .into_value("request.object", &mut shape_problems);
    let old_object = request
        .old_object
        .into_value("request.oldObject", &mut shape_problems);
    Ok(ParsedReview {
        api_version: review.api_version,
        request: AdmissionRequest {
            uid: request.uid,
            resource: request.resource,
            sub_resource: request.sub_resource,
            name: request.name,
            namespace: request.namespace,
            operation: request.operation,
            user_info: UserInfo {
                username: request.user_info.username,
                uid: request.user_info.uid,
                groups: request.user_info.groups.0,
                extra: BTreeMap::new(),
            },
            object,
            old_object,
            dry_run: request.dry_run,
        },
        shape_problems,
    })
}

/// The wire format, typed: only the fields the decision reads, each of the expected type or
/// recorded as a shape problem (so the review can still be answered with its `uid`).
mod wire {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    use hostcycle_api::{DETACHED_ANNOTATION, PAUSED_ANNOTATION, classify_reboot_annotation};
    use serde::Deserialize;
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    use super::{GroupVersionResource, Operation};

    /// Most groups a user may have: the list is kept, so it is bounded (4096 of the shortest
    /// strings cost ~100 KiB).
    pub const MAX_GROUPS: usize = 4096;
    /// Most bytes of kept annotations (keys and values) per object: the API server allows
    /// 256 KiB for all of an object's annotations.
    pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Review {
        #[serde(default)]
        pub api_version: String,
        #[serde(default)]
        pub kind: String,
        #[serde(default)]
        pub request: Option<Request>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Request {
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
        pub user_info: User,
        #[serde(default)]
        pub object: Shaped<Host>,
        #[serde(default)]
        pub old_object: Shaped<Host>,
        #[serde(default)]
        pub dry_run: Option<bool>,
    }

    /// `userInfo` without `extra`, which nothing reads.
    #[derive(Default, Deserialize)]
    pub struct User {
        #[serde(default)]
        pub username: String,
        #[serde(default)]
        pub uid: String,
        #[serde(default)]
        pub groups: Groups,
    }

    #[derive(Default)]
    pub struct Groups(pub Vec<String>);

    impl<'de> Deserialize<'de> for Groups {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct GroupsVisitor;
            impl<'de> Visitor<'de> for GroupsVisitor {
                type Value = Groups;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    write!(f, "a list of at most {MAX_GROUPS} group names")
                }
                fn visit_unit<E: serde::de::Error>(self) -> Result<Groups, E> {
                    Ok(Groups::default())
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Groups, A::Error> {
                    let mut groups = Vec::new();
                    while let Some(group) = seq.next_element::<String>()? {
                        if groups.len() == MAX_GROUPS {
                            return Err(serde::de::Error::custom(format!(
                                "request.userInfo.groups has more than {MAX_GROUPS} entries"
                            )));
                        }
                        groups.push(group);
                    }
                    Ok(Groups(groups))
                }
            }
            deserializer.deserialize_any(GroupsVisitor)
        }
    }

    /// A field as found: absent (or null), of the expected type, or something else, which
    /// was skipped unread.
    #[derive(Default)]
    pub enum Shaped<T> {
        #[default]
        Absent,
        Found(T),
        /// What it was instead: "a string", "an array", ...
        Wrong(&'static str),
    }

    impl<T: Expected> Shaped<T> {
        /// The value, or `None` with a problem recorded when it had the wrong type.
        fn take(self, path: &str, problems: &mut Vec<String>) -> Option<T> {
            match self {
                Shaped::Absent => None,
                Shaped::Found(value) => Some(value),
                Shaped::Wrong(found) => {
                    problems.push(format!("{path}: expected {}, found {found}", T::EXPECTED));
                    None
                }
            }
        }
    }

    /// What a [`Shaped`] field accepts.
    pub trait Expected: Sized {
        const EXPECTED: &'static str;
        fn from_bool(_: bool) -> Option<Self> {
            None
        }
        fn from_str(_: &str) -> Option<Self> {
            None
        }
        /// Reads a JSON object; `Ok(None)` when this is not one of the types that are.
        fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }

    impl Expected for String {
        const EXPECTED: &'static str = "a string";
        fn from_str(text: &str) -> Option<Self> {
            Some(text.to_string())
        }
    }

    impl Expected for bool {
        const EXPECTED: &'static str = "a boolean";
        fn from_bool(value: bool) -> Option<Self> {
            Some(value)
        }
    }

    impl<'de, T: Expected> Deserialize<'de> for Shaped<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(ShapedVisitor(PhantomData))
        }
    }

    struct ShapedVisitor<T>(PhantomData<T>);

    impl<T: Expected> ShapedVisitor<T> {
        fn found(value: Option<T>, instead: &'static str) -> Shaped<T> {
            value.map_or(Shaped::Wrong(instead), Shaped::Found)
        }
    }

    impl<'de, T: Expected> Visitor<'de> for ShapedVisitor<T> {
        type Value = Shaped<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::EXPECTED)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Shaped<T>, E> {
            Ok(Shaped::Absent)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Shaped<T>, E> {
            Ok(Shaped::Absent)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Shaped<T>, D::Error> {
            Shaped::deserialize(d)
        }
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Shaped<T>, E> {
            Ok(Self::found(T::from_bool(v), "a boolean"))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Shaped<T>, E> {
            Ok(Shaped::Wrong("a number"))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Shaped<T>, E> {
            Ok(Shaped::Wrong("a number"))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Shaped<T>, E> {
            Ok(Shaped::Wrong("a number"))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Shaped<T>, E> {
            Ok(Self::found(T::from_str(v), "a string"))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shaped<T>, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Shaped::Wrong("an array"))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Shaped<T>, A::Error> {
            Ok(Self::found(T::from_map(map)?, "a JSON object"))
        }
    }

    /// Implements [`Expected`] for a struct read from a JSON object.
    macro_rules! object {
        ($type:ty) => {
            impl Expected for $type {
                const EXPECTED: &'static str = "a JSON object";
                fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
                    <$type>::deserialize(MapAccessDeserializer::new(map)).map(Some)
                }
            }
        };
    }

    /// A BareMetalHost, reduced to what the decision reads.
    #[derive(Default, Deserialize)]
    pub struct Host {
        #[serde(default)]
        metadata: Shaped<Metadata>,
        #[serde(default)]
        spec: Shaped<Spec>,
    }
    object!(Host);

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        #[serde(default)]
        name: Shaped<String>,
        #[serde(default)]
        namespace: Shaped<String>,
        #[serde(default)]
        generate_name: Shaped<String>,
        #[serde(default)]
        annotations: Shaped<Annotations>,
    }
    object!(Metadata);

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        #[serde(default)]
        online: Shaped<bool>,
        #[serde(default)]
        bmc: Shaped<Bmc>,
        #[serde(default)]
        consumer_ref: Shaped<ConsumerRef>,
    }
    object!(Spec);

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Bmc {
        #[serde(default)]
        address: Shaped<String>,
        #[serde(default)]
        credentials_name: Shaped<String>,
        #[serde(default)]
        disable_certificate_verification: Shaped<bool>,
    }
    object!(Bmc);

    /// `spec.consumerRef`, reduced to what names the object (its `uid`, `resourceVersion` and
    /// `fieldPath` are skipped unread).
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ConsumerRef {
        #[serde(default)]
        api_version: Shaped<String>,
        #[serde(default)]
        kind: Shaped<String>,
        #[serde(default)]
        namespace: Shaped<String>,
        #[serde(default)]
        name: Shaped<String>,
    }
    object!(ConsumerRef);

    /// The annotations the decision reads (reboot, paused, detached); the others are skipped.
    #[derive(Default)]
    struct Annotations {
        kept: BTreeMap<String, Shaped<String>>,
    }

    /// Whether the decision reads an annotation.
    fn kept_annotation(key: &str) -> bool {
        classify_reboot_annotation(key).is_some()
            || key == PAUSED_ANNOTATION
            || key == DETACHED_ANNOTATION
    }

    impl Expected for Annotations {
        const EXPECTED: &'static str = "a JSON object";
        fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
            let mut kept = BTreeMap::new();
            let mut bytes = 0usize;
            while let Some(key) = map.next_key::<String>()? {
                if !kept_annotation(&key) {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                let value = map.next_value::<Shaped<String>>()?;
                bytes += key.len()
                    + match &value {
                        Shaped::Found(text) => text.len(),
                        _ => 0,
                    };
                if bytes > MAX_ANNOTATION_BYTES {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_ANNOTATION_BYTES} bytes of reboot, paused and detached \
                         annotations on one object (the API server allows {MAX_ANNOTATION_BYTES} \
                         for all of them)"
                    )));
                }
                kept.insert(key, value);
            }
            Ok(Some(Annotations { kept }))
        }
    }

    impl Shaped<Host> {
        /// The object as the decision reads it (a JSON object with only the fields it
        /// reads), or `None` when absent or not an object.
        pub fn into_value(self, path: &str, problems: &mut Vec<String>) -> Option<Value> {
            let host = self.take(path, problems)?;
            let mut object = Map::new();
            if let Some(metadata) = host.metadata.take(&format!("{path}.metadata"), problems) {
                object.insert(
                    "metadata".to_string(),
                    metadata.into_value(&format!("{path}.metadata"), problems),
                );
            }
            if let Some(spec) = host.spec.take(&format!("{path}.spec"), problems) {
                object.insert(
                    "spec".to_string(),
                    spec.into_value(&format!("{path}.spec"), problems),
                );
            }
            Some(Value::Object(object))
        }
    }

    fn put<T: Expected + Into<Value>>(
        object: &mut Map<String, Value>,
        key: &str,
        field: Shaped<T>,
        path: &str,
        problems: &mut Vec<String>,
    ) {
        if let Some(value) = field.take(&format!("{path}.{key}"), problems) {
            object.insert(key.to_string(), value.into());
        }
    }

    impl Metadata {
        fn into_value(self, path: &str, problems: &mut Vec<String>) -> Value {
            let mut object = Map::new();
            put(&mut object, "name", self.name, path, problems);
            put(&mut object, "namespace", self.namespace, path, problems);
            put(
                &mut object,
                "generateName",
                self.generate_name,
                path,
                problems,
            );
            let annotations_path = format!("{path}.annotations");
            if let Some(annotations) = self.annotations.take(&annotations_path, problems) {
                let mut kept = Map::new();
                for (key, value) in annotations.kept {
                    let path = format!("{annotations_path}[{key:?}]");
                    // null is kept as it is: the decision refuses it as not a string.
                    match value {
                        Shaped::Absent => {
                            kept.insert(key, Value::Null);
                        }
                        other => {
                            if let Some(text) = other.take(&path, problems) {
                                kept.insert(key, Value::String(text));
                            }
                        }
                    }
                }
                object.insert("annotations".to_string(), Value::Object(kept));
            }
            Value::Object(object)
        }
    }

    impl Spec {
        fn into_value(self, path: &str, problems: &mut Vec<String>) -> Value {
            let mut object = Map::new();
            put(&mut object, "online", self.online, path, problems);
            let bmc_path = format!("{path}.bmc");
            if let Some(bmc) = self.bmc.take(&bmc_path, problems) {
                let mut fields = Map::new();
                put(&mut fields, "address", bmc.address, &bmc_path, problems);
                put(
                    &mut fields,
                    "credentialsName",
                    bmc.credentials_name,
                    &bmc_path,
                    problems,
                );
                put(
                    &mut fields,
                    "disableCertificateVerification",
                    bmc.disable_certificate_verification,
                    &bmc_path,
                    problems,
                );
                object.insert("bmc".to_string(), Value::Object(fields));
            }
            let consumer_path = format!("{path}.consumerRef");
            if let Some(consumer) = self.consumer_ref.take(&consumer_path, problems) {
                let mut fields = Map::new();
                let path = consumer_path.as_str();
                put(
                    &mut fields,
                    "apiVersion",
                    consumer.api_version,
                    path,
                    problems,
                );
                put(&mut fields, "kind", consumer.kind, path, problems);
                put(&mut fields, "namespace", consumer.namespace, path, problems);
                put(&mut fields, "name", consumer.name, path, problems);
                object.insert("consumerRef".to_string(), Value::Object(fields));
            }
            Value::Object(object)
        }
    }
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
