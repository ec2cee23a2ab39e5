//! What a host's status says about its credentials Secret, as the host controller produces
//! it (`DriverCache::driver_for` against an API server answering with the Secret): someone who
//! may edit the host but not read the Secret learns only that the Secret it names cannot be
//! used — one message whether the Secret is missing, unlabelled, lacks a key or does not list
//! the BMC — never which keys it has, how long a value is, or a piece of one. And how often
//! the Secret is read: never when it is unlabelled under `--bmc-credentials-label`, never for
//! a host whose `spec.bmc` is beyond the CRD's limits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hostcycle_api::BareMetalHost;
use hostcycle_bmc::{BmcConnector, ConnectorOptions};
use hostcycle_core::bmh::{BmcFailure, BmcFailureKind};
use hostcycle_operator::CredentialsPolicy;
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
    client_counting(secret, Arc::default())
}

/// [`client_serving`], counting the requests in `requests`.
fn client_counting(secret: Option<Value>, requests: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let secret = secret.clone();
        requests.fetch_add(1, Ordering::SeqCst);
        async move {
            assert_eq!(req.method(), http::Method::GET);
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

/// Credentials may go anywhere: these tests are about the Secret's messages.
fn anywhere(label: Option<(&str, &str)>) -> CredentialsPolicy {
    CredentialsPolicy {
        destinations: hostcycle_bmc::destination::CredentialDestinations::unrestricted(),
        refuse_unverified_tls: false,
        label: label.map(|(k, v)| (k.to_string(), v.to_string())),
    }
}

async fn failure(secret: Option<Value>, address: &str) -> BmcFailure {
    failure_under(&anywhere(None), secret, &host(address)).await
}

async fn failure_under(
    policy: &CredentialsPolicy,
    secret: Option<Value>,
    host: &BareMetalHost,
) -> BmcFailure {
    let (store, _writer) = reflector::store::<PartialObjectMeta<Secret>>();
    let secrets = SecretCache::new(store);
    let drivers = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
    match drivers
        .driver_for(&client_serving(secret), &secrets, policy, host)
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

/// The one message a host's status gives for an unusable Secret (see `observe.rs`).
fn unusable(label: Option<(&str, &str)>) -> String {
    hostcycle_operator::bmh::observe::unusable_secret_message(&anywhere(label), "hosts", "creds")
}

/// Missing, lacking a key, an empty, non-UTF-8 or over-long value, an addresses annotation
/// that does not list the BMC or cannot be read: one message, naming the Secret, the
/// annotation and what to fix — nothing a host editor could tell the cases apart by.
#[tokio::test]
async fn every_unusable_secret_gets_one_message() {
    let annotated = |addresses: &str| {
        let mut secret = secret_with(&[("username", USERNAME), ("password", PASSWORD)]);
        secret["metadata"]["annotations"] = json!({ "hostcycle.io/bmc-addresses": addresses });
        secret
    };
    let long_password = "Hj8-Zv2q-Kc5w-".repeat(100);
    let cases: Vec<(&str, Option<Value>)> = vec![
        ("missing", None),
        ("no keys", Some(secret_with(&[]))),
        ("no password", Some(secret_with(&[("username", USERNAME)]))),
        ("no username", Some(secret_with(&[("password", PASSWORD)]))),
        (
            "blank username",
            Some(secret_with(&[("username", b" \n"), ("password", PASSWORD)])),
        ),
        (
            "blank password",
            Some(secret_with(&[("username", USERNAME), ("password", b"\t")])),
        ),
        (
            "password not UTF-8",
            Some(secret_with(&[
                ("username", USERNAME),
                ("password", b"Hj8-\xfeZv2q"),
            ])),
        ),
        (
            "password too long",
            Some(secret_with(&[
                ("username", USERNAME),
                ("password", long_password.as_bytes()),
            ])),
        ),
        (
            "lists another BMC",
            Some(annotated("10.0.0.7, 10.0.0.8:443")),
        ),
        ("annotation unreadable", Some(annotated("-oProxyCommand=x"))),
        (
            "annotation too long",
            Some(annotated(&"10.0.0.7,".repeat(2000))),
        ),
    ];
    let expected = unusable(None);
    assert!(expected.contains("hosts/creds"), "{expected}");
    assert!(
        expected.contains("hostcycle.io/bmc-addresses"),
        "{expected}"
    );
    for (case, secret) in cases {
        let failure = failure(secret, REDFISH).await;
        assert_eq!(
            failure.kind,
            BmcFailureKind::Credentials,
            "{case}: {failure:?}"
        );
        assert_eq!(failure.message, expected, "{case}");
        assert_reveals_nothing(
            &failure.message,
            &[USERNAME, PASSWORD, long_password.as_bytes(), b"10.0.0.7"],
        );
        assert!(
            !failure.message.chars().any(|c| c.is_ascii_digit()),
            "{case}: no size or address in: {}",
            failure.message
        );
    }
}

/// With `--bmc-credentials-label`, a missing Secret and an unlabelled one read the same, and
/// neither is fetched: the watch lists labelled Secrets only, and a Secret it does not show
/// is not asked for, however many reconciles name it.
#[tokio::test]
async fn an_unlabelled_secret_is_never_fetched_and_reads_as_missing() {
    const LABEL: (&str, &str) = ("hostcycle.io/bmc-credentials", "true");
    let policy = anywhere(Some(LABEL));
    let unlabelled = secret_with(&[("username", USERNAME), ("password", PASSWORD)]);
    for served in [Some(unlabelled), None] {
        let requests = Arc::new(AtomicUsize::new(0));
        let client = client_counting(served.clone(), requests.clone());
        // The watch has listed the labelled Secrets: this one is not among them.
        let (store, _writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let secrets = SecretCache::new(store);
        let drivers = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        for _ in 0..5 {
            let Err(failure) = drivers
                .driver_for(&client, &secrets, &policy, &host(REDFISH))
                .await
            else {
                panic!("a driver was made from an unlabelled Secret");
            };
            assert_eq!(failure.kind, BmcFailureKind::Credentials);
            assert_eq!(failure.message, unusable(Some(LABEL)));
        }
        assert_eq!(
            requests.load(Ordering::SeqCst),
            0,
            "GETs of a Secret the labelled watch does not show (served: {})",
            served.is_some()
        );
        assert!(secrets.is_empty());
    }
}

/// A labelled Secret is read once per resourceVersion the watch shows, and used; one whose
/// label went away after the watch showed it (the watch lags) is refused like any other.
#[tokio::test]
async fn a_labelled_secret_is_read_once_and_its_label_checked_again() {
    use kube::core::PartialObjectMetaExt;
    use kube::runtime::watcher;
    const LABEL: (&str, &str) = ("hostcycle.io/bmc-credentials", "true");
    let policy = anywhere(Some(LABEL));
    let shown = ObjectMeta {
        name: Some("creds".into()),
        namespace: Some("hosts".into()),
        resource_version: Some("7".into()),
        ..Default::default()
    }
    .into_response_partial::<Secret>();
    let mut labelled = secret_with(&[("username", USERNAME), ("password", PASSWORD)]);
    labelled["metadata"]["labels"] = json!({ LABEL.0: LABEL.1 });
    let unlabelled = secret_with(&[("username", USERNAME), ("password", PASSWORD)]);
    for (served, usable) in [(labelled, true), (unlabelled, false)] {
        let requests = Arc::new(AtomicUsize::new(0));
        let client = client_counting(Some(served), requests.clone());
        let (store, mut writer) = reflector::store::<PartialObjectMeta<Secret>>();
        writer.apply_watcher_event(&watcher::Event::Apply(shown.clone()));
        let secrets = SecretCache::new(store);
        let drivers = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        for _ in 0..5 {
            let result = drivers
                .driver_for(&client, &secrets, &policy, &host(REDFISH))
                .await;
            match (usable, result) {
                (true, Ok(_)) => {}
                (false, Err(failure)) => assert_eq!(failure.message, unusable(Some(LABEL))),
                (_, other) => panic!("usable: {usable}, got {:?}", other.err()),
            }
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "usable: {usable}");
    }
}

/// A `spec.bmc` beyond the CRD's limits (written before them, or under metal3's CRD, which
/// has none): refused with a short message naming the field, the value never echoed, and no
/// Secret read for it.
#[tokio::test]
async fn an_over_long_spec_bmc_is_refused_without_a_read_or_an_echo() {
    let long_address = format!(
        "redfish+http://127.0.0.1:9/redfish/v1/Systems/{}",
        "Xq4zLp".repeat(1000)
    );
    let mut bad_name = host(REDFISH);
    bad_name.spec.bmc.as_mut().unwrap().credentials_name = "creds-".repeat(100);
    let mut odd_name = host(REDFISH);
    odd_name.spec.bmc.as_mut().unwrap().credentials_name = "../configmaps/creds".into();
    for (host, field) in [
        (host(&long_address), "spec.bmc.address"),
        (bad_name, "spec.bmc.credentialsName"),
        (odd_name, "spec.bmc.credentialsName"),
    ] {
        let requests = Arc::new(AtomicUsize::new(0));
        let client = client_counting(None, requests.clone());
        let (store, _writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let secrets = SecretCache::new(store);
        let drivers = DriverCache::new(BmcConnector::new(ConnectorOptions::default()));
        let Err(failure) = drivers
            .driver_for(&client, &secrets, &anywhere(None), &host)
            .await
        else {
            panic!("a driver was made for an over-long spec.bmc");
        };
        let message = &failure.message;
        assert!(message.contains(field), "{message}");
        assert!(message.len() < 200, "{message}");
        for echoed in ["Xq4zLp", "creds-creds", "configmaps"] {
            assert!(!message.contains(echoed), "{echoed} in: {message}");
        }
        assert_eq!(requests.load(Ordering::SeqCst), 0, "{field}");
    }
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
