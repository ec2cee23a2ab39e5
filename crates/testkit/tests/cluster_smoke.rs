#![allow(clippy::unwrap_used)]
use hostcycle_testkit::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn cluster_starts_and_serves_requests() {
    let _ = tracing_subscriber_init();
    let t = std::time::Instant::now();
    let cluster = LocalCluster::start(ClusterOptions::default()).await.unwrap();
    eprintln!("cluster up in {:?}", t.elapsed());
    let ns: Api<Namespace> = Api::all(cluster.client());
    let list = ns.list(&ListParams::default()).await.unwrap();
    assert!(list.items.iter().any(|n| n.metadata.name.as_deref() == Some("kube-system")));
}

fn tracing_subscriber_init() {}
