//! The CustomResourceDefinition generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::host::BareMetalHost;

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
pub fn crd() -> CustomResourceDefinition {
    BareMetalHost::crd()
}

/// The CRD as a YAML document, for `hostcycle crd`.
pub fn crd_yaml() -> Result<String, CrdError> {
    Ok(serde_saphyr::to_string(&crd())?)
}
