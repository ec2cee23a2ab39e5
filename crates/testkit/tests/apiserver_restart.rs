//! `LocalCluster::stop_apiserver` / `start_apiserver`: an API server outage with etcd kept.
//! While it is down, requests fail; once it is back on the same port with the same
//! certificates and tokens, the same client works again and every object is still there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hostcycle_testkit::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_restarts_alone_and_keeps_every_object() {
    let mut cluster = LocalCluster::start(ClusterOptions {
        crds: Vec::new(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let kept: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "kept" }, "data": { "k": "v" } }))
            .unwrap();
    let created = maps.create(&PostParams::default(), &kept).await.unwrap();

    cluster.stop_apiserver();
    let refused = tokio::time::timeout(Duration::from_secs(10), maps.get("kept"))
        .await
        .expect("a request to a stopped API server fails fast");
    assert!(
        refused.is_err(),
        "the API server answered while stopped: {refused:?}"
    );
    assert!(
        cluster.start_apiserver().await.is_ok(),
        "kube-apiserver starts again"
    );
    assert!(
        cluster.start_apiserver().await.is_err(),
        "starting a running API server is refused"
    );

    // The same client (same kubeconfig: port, CA, token) reads the object etcd kept.
    let back = maps.get("kept").await.unwrap();
    assert_eq!(back.metadata.uid, created.metadata.uid);
    assert_eq!(back.data, created.data);
    cluster.ensure_running().unwrap();

    // The restarted server is a full one: writes work, and a second outage works the same.
    cluster.stop_apiserver();
    cluster.start_apiserver().await.unwrap();
    let later: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "later" } })).unwrap();
    maps.create(&PostParams::default(), &later).await.unwrap();
    assert!(
        cluster.log_dir().join("kube-apiserver-3.log").is_file(),
        "each start has its own log"
    );
}
