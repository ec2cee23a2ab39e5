//! Cordon and uncordon, recording on the Node that the queue did it: only a node carrying
//! [`CORDONED_BY_ANNOTATION`] is ever uncordoned, so an administrator's cordon stays.

use crate::cluster::errors::{is_conflict, is_not_found};
use hostcycle_api::queue::CORDONED_BY_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// What [`cordon`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cordon {
    /// The queue cordoned it now.
    Cordoned,
    /// The queue had cordoned it already (a resumed drain).
    AlreadyOurs,
    /// Someone else cordoned it: left as is, and never uncordoned by the queue.
    ByAdministrator,
}

/// How often a patch that lost a race with another writer is tried again.
const CONFLICT_RETRIES: usize = 5;

/// Marks the node unschedulable and records that the queue did it (one patch, with the
/// node's resourceVersion as a precondition so an administrator's concurrent cordon is seen).
pub async fn cordon(nodes: &Api<Node>, name: &str, entry: &str) -> Result<Cordon, kube::Error> {
    for _ in 0..CONFLICT_RETRIES {
        let node = nodes.get(name).await?;
        let ours = node.annotations().contains_key(CORDONED_BY_ANNOTATION);
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        match (unschedulable, ours) {
            (true, true) => return Ok(Cordon::AlreadyOurs),
            (true, false) => return Ok(Cordon::ByAdministrator),
            _ => {}
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": { CORDONED_BY_ANNOTATION: entry },
            },
            "spec": { "unschedulable": true },
        });
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(Cordon::Cordoned),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(
            &format!("Node {name} kept changing while being cordoned; will retry"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}

/// Makes the node schedulable again if, and only if, the queue cordoned it. Returns whether
/// it did anything. A missing node is nothing to do.
pub async fn uncordon(nodes: &Api<Node>, name: &str) -> Result<bool, kube::Error> {
    for _ in 0..CONFLICT_RETRIES {
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(false);
        };
        if !node.annotations().contains_key(CORDONED_BY_ANNOTATION) {
            return Ok(false);
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": { CORDONED_BY_ANNOTATION: null },
            },
            "spec": { "unschedulable": null },
        });
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if is_conflict(&e) => continue,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(
            &format!("Node {name} kept changing while being uncordoned; will retry"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}
