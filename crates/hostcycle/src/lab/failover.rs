//! What the fenced-failover demo needs beyond the base lab: a StatefulSet with ReadWriteOnce
//! volumes on the workers, and a HostHealthCheck that turns a silent worker into a
//! HostRemediation.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

use super::LAB_NAMESPACE;

/// The sample StatefulSet, and its pods' `app` label.
pub const STATEFULSET: &str = "db";
const REPLICAS: i32 = 2;
/// The label only control-plane hosts carry (the simulator sets it).
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
const HEALTH_CHECK_GROUP: &str = "hostcycle.io";
const HEALTH_CHECK_VERSION: &str = "v1alpha1";
const HEALTH_CHECK_KIND: &str = "HostHealthCheck";

/// `db`: 2 pause pods, each with a 1Gi ReadWriteOnce claim of the simulated CSI class, only
/// on workers and never two on one host, so a failed worker's pod must move to another one.
pub async fn create_statefulset(client: &Client) -> anyhow::Result<()> {
    let mut statefulset = hostcycle_testkit::pause_statefulset_with_volume(
        STATEFULSET,
        REPLICAS,
        hostcycle_sim::SIM_STORAGE_CLASS,
        None,
    );
    let affinity = json!({
        "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
            { "matchExpressions": [{ "key": CONTROL_PLANE_LABEL, "operator": "DoesNotExist" }] }
        ]}},
        "podAntiAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [
            { "labelSelector": { "matchLabels": { "app": STATEFULSET } },
              "topologyKey": "kubernetes.io/hostname" }
        ]},
    });
    let pod_spec = statefulset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .context("the StatefulSet builder made no pod spec")?;
    pod_spec.affinity = Some(serde_json::from_value(affinity)?);
    // A simulated container exits at once; no need to wait the default 30 s on a clean delete.
    pod_spec.termination_grace_period_seconds = Some(5);
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), LAB_NAMESPACE);
    api.create(&PostParams::default(), &statefulset)
        .await
        .with_context(|| format!("creating StatefulSet {STATEFULSET}"))?;
    Ok(())
}

/// Waits until every pod of the StatefulSet runs (its volume attached).
pub async fn wait_statefulset_running(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), LAB_NAMESPACE);
    let selector = format!("app={STATEFULSET}");
    hostcycle_testkit::wait_until(
        &format!("the {REPLICAS} pods of StatefulSet {STATEFULSET} to run with their volumes"),
        timeout,
        || {
            let pods = pods.clone();
            let params = ListParams::default().labels(&selector);
            async move {
                let list = pods.list(&params).await.ok()?;
                let running = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                (running >= REPLICAS as usize).then_some(())
            }
        },
    )
    .await?;
    Ok(())
}

/// The lab's HostHealthCheck, as JSON: the kind is not in this branch's api crate.
fn health_check_body() -> serde_json::Value {
    json!({
        "apiVersion": format!("{HEALTH_CHECK_GROUP}/{HEALTH_CHECK_VERSION}"),
        "kind": HEALTH_CHECK_KIND,
        "metadata": { "name": "workers" },
        "spec": {
            "selector": { "matchExpressions": [
                { "key": CONTROL_PLANE_LABEL, "operator": "DoesNotExist" }
            ]},
            "leaseStaleAfterSeconds": 20,
            "warmUpSeconds": 30,
            "remediation": { "release": "Auto", "timeoutSeconds": 300 },
        },
    })
}

/// Creates the HostHealthCheck `workers` when the server serves the kind; says why not
/// otherwise. Returns whether it exists.
pub async fn create_host_health_check(client: &Client) -> anyhow::Result<bool> {
    let served = match kube::discovery::group(client, HEALTH_CHECK_GROUP).await {
        Ok(group) => group
            .versioned_resources(HEALTH_CHECK_VERSION)
            .into_iter()
            .find(|(resource, _)| resource.kind == HEALTH_CHECK_KIND),
        Err(e) => {
            tracing::info!(error = %e, "discovering {HEALTH_CHECK_GROUP}");
            None
        }
    };
    let Some((resource, _)) = served else {
        println!(
            "No HostHealthCheck: the API server does not serve {HEALTH_CHECK_KIND}.{HEALTH_CHECK_GROUP}/{HEALTH_CHECK_VERSION} \
             (this build's CRDs lack it); a failed worker is not remediated on its own — \
             create a HostRemediation by hand (see below)."
        );
        return Ok(false);
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object: DynamicObject = serde_json::from_value(health_check_body())?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating HostHealthCheck workers"),
    }
    println!(
        "HostHealthCheck workers: a worker whose Lease is stale for 20 s is fenced and its workloads released."
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_check_selects_workers_only() {
        let body = health_check_body();
        assert_eq!(body["apiVersion"], "hostcycle.io/v1alpha1");
        assert_eq!(
            body["spec"]["selector"]["matchExpressions"][0],
            json!({ "key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist" })
        );
        let object: Result<DynamicObject, _> = serde_json::from_value(body);
        assert!(object.is_ok());
    }
}
