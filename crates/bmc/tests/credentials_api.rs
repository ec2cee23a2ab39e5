//! `load_credentials` against a real API server (local etcd + kube-apiserver from testkit).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::{PASSWORD, assert_no_secret, init_tracing};
use hostcycle_bmc::{CredentialsError, load_credentials};
use hostcycle_testkit::{ClusterOptions, LocalCluster};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

async fn create_secret(api: &Api<Secret>, name: &str, data: &[(&str, &str)]) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    api.create(&PostParams::default(), &secret).await.unwrap();
}

#[tokio::test]
async fn loads_credentials_and_explains_what_is_wrong() {
    init_tracing();
    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap_or_else(|e| panic!("starting the local cluster: {e}"));
    let client = cluster.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    create_secret(
        &secrets,
        "good",
        &[
            ("username", " admin\n"),
            ("password", &format!("{PASSWORD}\n")),
        ],
    )
    .await;
    create_secret(&secrets, "no-password", &[("username", "admin")]).await;
    create_secret(
        &secrets,
        "empty-user",
        &[("username", "  "), ("password", PASSWORD)],
    )
    .await;

    let creds = load_credentials(client.clone(), "default", "good")
        .await
        .unwrap();
    assert_eq!(creds.username(), "admin");
    assert_eq!(creds.password(), PASSWORD);
    assert_no_secret(&format!("{creds:?}"));

    let err = load_credentials(client.clone(), "default", "missing")
        .await
        .unwrap_err();
    assert!(
        matches!(err, CredentialsError::SecretNotFound { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "BMC credentials Secret default/missing not found; create it with keys `username` and \
         `password` (or fix spec.bmc.credentialsName)"
    );

    let err = load_credentials(client.clone(), "default", "no-password")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "BMC credentials Secret default/no-password has no `password` key; add it"
    );

    let err = load_credentials(client.clone(), "default", "empty-user")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CredentialsError::Empty {
                key: "username",
                ..
            }
        ),
        "{err:?}"
    );
    assert_no_secret(&format!("{err} {err:?}"));

    let err = load_credentials(client, "default", "").await.unwrap_err();
    assert!(matches!(err, CredentialsError::NoSecretName), "{err:?}");
}
