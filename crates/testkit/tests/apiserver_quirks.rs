//! Regression tests for behaviour of our kube-apiserver v1.20.2 build that differs from a
//! stock 1.20 server because it is compiled with a newer Go (see docs/testing.md, "The control
//! plane build").
//!
//! Empty strings in custom resources: kube-openapi's type validator (vendored in 1.20) treated
//! a decoded `""` as `null` when built with Go >= 1.16, so a CRD with `default: ""` was
//! rejected and any custom resource with an empty string in a schema-typed field got a 422
//! `Invalid value: "null": ... must be of type string`. `scripts/build-k8s.sh` patches it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hostcycle_testkit::{ClusterOptions, LocalCluster};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

const GROUP: &str = "quirks.hostcycle.test";
const VERSION: &str = "v1";
const KIND: &str = "Quirk";
const PLURAL: &str = "quirks";

fn quirk_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{PLURAL}.{GROUP}") },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": { "kind": KIND, "plural": PLURAL, "singular": "quirk", "listKind": "QuirkList" },
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {
                                "defaulted": { "type": "string", "default": "" },
                                "label": { "type": "string" },
                                "extra": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": true
                                }
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "errorMessage": { "type": "string" },
                                "conditions": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "type": { "type": "string" },
                                            "status": { "type": "string" },
                                            "message": { "type": "string" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }}
            }]
        }
    }))
    .expect("CRD JSON")
}

fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[*k],
    })
}

fn assert_empty_string(obj: &Value, path: &[&str]) {
    let got = at(obj, path);
    assert_eq!(
        got,
        &Value::String(String::new()),
        "{} should be \"\", got {got} in {obj:#}",
        path.join(".")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_strings_in_custom_resources_stay_empty_strings() {
    tokio::time::timeout(Duration::from_secs(180), async {
        let cluster = LocalCluster::start(ClusterOptions::default())
            .await
            .unwrap();

        // A CRD with `default: ""` used to be rejected ("default: Invalid value: \"null\"").
        cluster
            .install_crds(&[quirk_crd()])
            .await
            .expect("a CRD with `default: \"\"` on a string property must be accepted");

        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL);
        let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), "default", &ar);
        let obj = DynamicObject::new("q1", &ar).data(json!({
            "spec": {
                "label": "",
                "extra": { "inner": "", "nested": { "deeper": "" }, "list": [""] }
            }
        }));

        // The CRD is Established; give the new resource a few seconds to be served (404 until
        // then). Any other error fails at once.
        let deadline = Instant::now() + Duration::from_secs(30);
        let created = loop {
            match api.create(&PostParams::default(), &obj).await {
                Ok(o) => break o,
                Err(kube::Error::Api(e)) if e.code == 404 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("creating a Quirk with empty strings in spec: {e}"),
            }
        };

        let mut with_status = created.clone();
        with_status.data["status"] = json!({
            "errorMessage": "",
            "conditions": [{ "type": "Ready", "status": "True", "message": "" }]
        });
        api.replace_status("q1", &PostParams::default(), &with_status)
            .await
            .expect("a status update with empty strings must be accepted");

        let back = api.get("q1").await.unwrap();
        let data = &back.data;
        assert_empty_string(data, &["spec", "defaulted"]);
        assert_empty_string(data, &["spec", "label"]);
        assert_empty_string(data, &["spec", "extra", "inner"]);
        assert_empty_string(data, &["spec", "extra", "nested", "deeper"]);
        assert_empty_string(data, &["spec", "extra", "list", "0"]);
        assert_empty_string(data, &["status", "errorMessage"]);
        assert_empty_string(data, &["status", "conditions", "0", "message"]);
    })
    .await
    .expect("test timed out after 180 s");
}
