//! What a host's status says about its credentials Secret, as the host controller produces
//! it (`DriverCache::driver_for` against an API server answering with the Secret): someone who
//! may read the host but not the Secret learns which required key is missing or unusable,
//! never which other keys the Secret has, how long a value is, or a piece of one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::BareMetalHost;
use hostcycle_bmc::{BmcConnector, ConnectorOptions};
use hostcycle_core::bmh::{BmcFailure, BmcFailureKind};
use hostcycle_operator::bmh::observe::{DriverCache, SecretCache};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use serde_json::{Value, json};

/// Keys a Secret may hold beside the BMC's, with values no message may show.
const DECOYS: [(&str, &str); 4] = [
    ("Password", "dcy-Qz7x-Pw-Kr2m"),
    ("login", "dcy-Rt9v-Lq"),
    ("ssh-privatekey", "MIIEvQIBADANBgkq"),
    ("bmc-token", "dcy-Tk3j-Wn8b"),
];

/// A kube client whose API server answers every GET of `hosts/creds` with `secret` (404 when
/// `None`).
fn client_serving(secret: Option<Value>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let secret = secret.clone();
        async move {
            assert_eq!(req.uri().path(), "/api/v1/namespaces/hosts/secrets/creds");
            let (status, body) = match secret {
                Some(secret) => (200, secret),
                None => (
                    404,
                    json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure",
                            "reason": "NotFound", "code": 404,
                            "message": "secrets \"creds\" not found" }),
                ),
            };
            let response = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

/// The Secret `hosts/creds` with the decoys and `data`, as the API server sends it.
fn secret_with(data: &[(&str, &[u8])]) -> Value {
    let mut all: BTreeMap<String, ByteString> = DECOYS
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    all.extend(
        data.iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))),
    );
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            namespace: Some("hosts".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        data: Some(all),
        ..Default::default()
    };
    let mut value = serde_json::to_value(secret).unwrap();
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("Secret");
    value
}

fn host(address: &str) -> BareMetalHost {
    serde_json::from_value(json!({
        "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
        "metadata": { "name": "h-0", "namespace": "hosts", "uid": "uid-h-0" },
        "spec": { "online": true, "bmc": { "address": address, "credentialsName": "creds" } },
    }))
    .unwrap()
}

async fn failure(secret: Option<Value>, address: &str) -> BmcFailure {
    let (store, _writer) = reflector::store::<PartialObjectMeta<Secret>>();
    let secrets = SecretCache::new(store);
    let drivers = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
    match drivers
        .driver_for(
            &client_serving(secret),
            &secrets,
            // Credentials may go anywhere: these tests are about the Secret's messages.
            &hostcycle_operator::CredentialsPolicy {
                destinations: hostcycle_bmc::destination::CredentialDestinations::unrestricted(),
                label: None,
            },
            &host(address),
        )
        .await
    {
        Ok(_) => panic!("a driver was made from a bad Secret"),
        Err(failure) => failure,
    }
}

/// The message reveals none of the decoy keys, and no 4-byte piece of any value.
fn assert_reveals_nothing(message: &str, values: &[&[u8]]) {
    for (key, _) in DECOYS {
        assert!(!message.contains(key), "reveals key {key}: {message}");
    }
    let decoy_values = DECOYS.iter().map(|(_, v)| v.as_bytes());
    for value in decoy_values.chain(values.iter().copied()) {
        for piece in value.windows(4) {
            let piece = String::from_utf8_lossy(piece);
            assert!(
                !message.contains(piece.as_ref()),
                "reveals {piece:?}: {message}"
            );
        }
    }
}

const REDFISH: &str = "redfish+http://127.0.0.1:9/redfish/v1/Systems/1";
const USERNAME: &[u8] = b"adm-Xq4z";
const PASSWORD: &[u8] = b"Hj8-Zv2q-Kc5w";

#[tokio::test]
async fn a_missing_or_unusable_key_is_named_and_nothing_else() {
    for (secret, key) in [
        (secret_with(&[]), "username"),
        (secret_with(&[("username", USERNAME)]), "password"),
        (secret_with(&[("password", PASSWORD)]), "username"),
        (
            secret_with(&[("username", b" \n"), ("password", PASSWORD)]),
            "username",
        ),
        (
            secret_with(&[("username", USERNAME), ("password", b"\t")]),
            "password",
        ),
        (
            secret_with(&[("username", USERNAME), ("password", b"Hj8-\xfeZv2q")]),
            "password",
        ),
    ] {
        let failure = failure(Some(secret), REDFISH).await;
        assert_eq!(failure.kind, BmcFailureKind::Credentials, "{failure:?}");
        let message = &failure.message;
        assert!(message.contains(&format!("`{key}`")), "{message}");
        assert!(message.contains("hosts/creds"), "{message}");
        assert_reveals_nothing(message, &[USERNAME, PASSWORD]);
        assert!(
            !message
                .replace("UTF-8", "")
                .chars()
                .any(|c| c.is_ascii_digit()),
            "no size in: {message}"
        );
    }
}

#[tokio::test]
async fn a_missing_secret_names_the_required_keys_only() {
    let failure = failure(None, REDFISH).await;
    assert_eq!(failure.kind, BmcFailureKind::Credentials);
    assert!(
        failure
            .message
            .contains("hosts/creds not found; create it with keys `username` and `password`"),
        "{}",
        failure.message
    );
}

/// A password IPMI cannot carry: the message says so without its length (nor the decoys).
#[tokio::test]
async fn a_password_too_long_for_ipmi_is_named_without_its_length() {
    let long: &[u8] = b"Hj8-Zv2q-Kc5w-Lp3n-Tr6y-Bq";
    let secret = secret_with(&[("username", USERNAME), ("password", long)]);
    let failure = failure(Some(secret), "ipmi://10.0.0.5").await;
    let message = &failure.message;
    assert!(
        message.contains("password") && message.contains("longer than the 20 bytes IPMI allows"),
        "{message}"
    );
    assert_reveals_nothing(message, &[USERNAME, long]);
    assert!(
        !message.contains(&long.len().to_string()),
        "the length is in: {message}"
    );
}

/// A Secret the client cannot read (data that is not base64: a broken API server or proxy):
/// the deserializer's message would quote a byte of a value, its offset and the position
/// in the answer; the status says what failed without it.
#[tokio::test]
async fn an_unreadable_secret_is_reported_without_the_parsers_details() {
    let mut secret = secret_with(&[("username", USERNAME)]);
    secret["data"]["password"] = json!("Hj8-Zv2q!Kc5w");
    let failure = failure(Some(secret), REDFISH).await;
    let message = &failure.message;
    assert!(
        message.contains("reading BMC credentials Secret hosts/creds")
            && message.contains("could not be read"),
        "{message}"
    );
    assert_reveals_nothing(message, &[USERNAME, b"Hj8-Zv2q!Kc5w"]);
    for detail in ["symbol", "offset", "column", "45"] {
        assert!(!message.contains(detail), "{detail:?} in: {message}");
    }
}
