//! The CustomResourceDefinition generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::health::HostHealthCheck;
use crate::host::BareMetalHost;
use crate::queue::{RebootQueue, RebootQueueEntry};
use crate::remediation::{HostRemediation, HostRemediationTemplate};

/// Errors producing the CRD manifest.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("serializing the BareMetalHost CRD to YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

/// The BareMetalHost CRD (`baremetalhosts.metal3.io`).
///
/// `spec`, `status` and `status.provisioning` carry `x-kubernetes-preserve-unknown-fields`
/// (kube rewrites our flattened `extra` maps into it), so metal3 manifests apply unchanged.
///
/// The schema carries no `default`s: our types default missing fields when they read an
/// object, and Kubernetes 1.20 rejects `default: ""` on string properties (it reads the
/// empty string back as null).
pub fn crd() -> CustomResourceDefinition {
    without_defaults(BareMetalHost::crd())
}

/// Every CRD hostcycle ships: BareMetalHost, RebootQueue, RebootQueueEntry,
/// HostRemediation, HostRemediationTemplate, HostHealthCheck.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        crd(),
        without_defaults(RebootQueue::crd()),
        without_defaults(RebootQueueEntry::crd()),
        without_defaults(HostRemediation::crd()),
        without_defaults(HostRemediationTemplate::crd()),
        without_defaults(HostHealthCheck::crd()),
    ]
}

fn without_defaults(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            strip_defaults(schema);
        }
    }
    crd
}

fn strip_defaults(schema: &mut JSONSchemaProps) {
    schema.default = None;
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(
            schema
                .pattern_properties
                .iter_mut()
                .flat_map(|p| p.values_mut()),
        )
        .chain(schema.definitions.iter_mut().flat_map(|d| d.values_mut()))
        .chain(schema.all_of.iter_mut().flatten())
        .chain(schema.any_of.iter_mut().flatten())
        .chain(schema.one_of.iter_mut().flatten())
        .chain(schema.not.as_deref_mut());
    for child in children {
        strip_defaults(child);
    }
    if let Some(items) = schema.items.as_mut() {
        match items {
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(s) => strip_defaults(s),
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schemas(list) => {
                list.iter_mut().for_each(strip_defaults)
            }
        }
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(s)) =
        schema.additional_properties.as_mut()
    {
        strip_defaults(s);
    }
}

/// The BareMetalHost CRD as a YAML document.
pub fn crd_yaml() -> Result<String, CrdError> {
    Ok(serde_saphyr::to_string(&crd())?)
}

/// Every CRD as a multi-document YAML stream, for `hostcycle crd`.
pub fn crds_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for (i, crd) in crds().iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(clippy::unwrap_used)]
    fn schema_has_no_defaults() {
        for crd in super::crds() {
            let json = serde_json::to_value(crd).unwrap();
            fn walk(v: &serde_json::Value, path: &str) {
                match v {
                    serde_json::Value::Object(map) => {
                        assert!(!map.contains_key("default"), "schema default at {path}");
                        for (k, child) in map {
                            walk(child, &format!("{path}.{k}"));
                        }
                    }
                    serde_json::Value::Array(items) => items.iter().for_each(|c| walk(c, path)),
                    _ => {}
                }
            }
            walk(&json["spec"]["versions"], "spec.versions");
        }
    }
}
