//! Releasing a fenced node's workloads without deleting the Node (`spec.strategy.release`
//! `ReleaseWorkloads` or `OutOfServiceTaint`): the strategy a request asks for, whether the
//! cluster honours the out-of-service taint, the live read of what is left on the node, and
//! the steps themselves. Every step that releases something (force-deleting pods, clearing
//! `volumesInUse`, the out-of-service taint) first reads the host again from the API server
//! and goes ahead only if it is still confirmed off for this cycle, as the Node's deletion
//! does.

use futures::StreamExt;
use hostcycle_api::remediation::{
    FENCED_TAINT_KEY, OUT_OF_SERVICE_OURS_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY,
    OUT_OF_SERVICE_TAINT_VALUE,
};
use hostcycle_core::remediation::release::{ReleaseAction, ReleaseStrategy};
use hostcycle_core::remediation::{Record, Workloads};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::actions::NodeEdit;
use super::controller::{Controller, Item, log_write_error};
use super::observe::Subject;
use crate::cluster::errors::{is_conflict, is_not_found};

/// Pods deleted at once when a node's workloads are released.
const DELETES_IN_FLIGHT: usize = 16;
/// Pods and VolumeAttachments read per page (a node has at most a few hundred pods).
const PAGE: u32 = 500;

/// Whether the cluster honours `node.kubernetes.io/out-of-service` (Kubernetes 1.28 and
/// later, where the pod GC and the attach/detach controller act on it). A taint is not an API
/// resource, so the server's version is what discovery tells; unknown counts as not served
/// (`Auto` then releases the workloads itself, which works everywhere).
pub(super) async fn out_of_service_served(client: &Client) -> bool {
    match client.apiserver_version().await {
        Ok(info) => {
            let served = version_serves_out_of_service(&info.major, &info.minor);
            tracing::info!(
                version = %format!("{}.{}", hostcycle_core::text::bounded(&info.major, 8), hostcycle_core::text::bounded(&info.minor, 8)),
                out_of_service_served = served,
                "the API server's version decides what release strategy Auto runs"
            );
            served
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the API server's version: Auto releases workloads without the out-of-service taint");
            false
        }
    }
}

/// `1.28` and later (the minor may carry a suffix, as `28+` on managed clusters).
fn version_serves_out_of_service(major: &str, minor: &str) -> bool {
    let number = |s: &str| {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    };
    match (number(major), number(minor)) {
        (Some(1), Some(minor)) => minor >= 28,
        (Some(major), _) => major > 1,
        _ => false,
    }
}

/// The strategy a remediation asked for: a request's `spec.strategy.release` (absent:
/// `DeleteNode`); the annotation flow always deletes the Node, as OpenShift's does.
pub(super) fn requested_strategy(subject: &Subject) -> Result<ReleaseStrategy, String> {
    match subject {
        Subject::Machine(..) => Ok(ReleaseStrategy::DeleteNode),
        Subject::Request(r) => match r.spec.strategy.as_ref().and_then(|s| s.release.as_deref()) {
            None => Ok(ReleaseStrategy::DeleteNode),
            Some(text) => ReleaseStrategy::parse(text).ok_or_else(|| {
                format!(
                    "spec.strategy.release {:?} is not one of DeleteNode, ReleaseWorkloads, \
                     OutOfServiceTaint, Auto: nothing is done (fix the request)",
                    hostcycle_core::text::bounded(text, 64)
                )
            }),
        },
    }
}

/// `spec.strategy.afterRelease: LeaveOff` on a request (the annotation flow always powers
/// on). Read every round: a person resumes a held host by setting `PowerOn`, and the field
/// can only keep a host off, never power anything.
pub(super) fn leave_off(subject: &Subject) -> bool {
    match subject {
        Subject::Machine(..) => false,
        Subject::Request(r) => r
            .spec
            .strategy
            .as_ref()
            .is_some_and(hostcycle_api::remediation::RemediationStrategy::leave_off),
    }
}

impl Controller {
    /// The pods bound to the node and its VolumeAttachments, read from the API server; `None`
    /// when a read failed (the flow waits and says so).
    pub(super) async fn read_workloads(&mut self, item: &Item) -> Option<Workloads> {
        let node = item.observation.node_name.as_deref()?;
        let pods = match self.pods_on(node).await {
            Ok(pods) => pods.len(),
            Err(e) => {
                log_write_error(&format!("the pods of node {node}"), &e);
                self.retry_soon = true;
                return None;
            }
        };
        let attachments = match self.attachments_of(node).await {
            Ok(n) => n,
            Err(e) => {
                log_write_error(&format!("the VolumeAttachments of node {node}"), &e);
                self.retry_soon = true;
                return None;
            }
        };
        Some(Workloads { pods, attachments })
    }

    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>, kube::Error> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default()
            .fields(&format!("spec.nodeName={node}"))
            .limit(PAGE);
        let mut pods = Vec::new();
        loop {
            let page = api.list(&params).await?;
            let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            pods.extend(page.items);
            match next {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(pods),
            }
        }
    }

    async fn attachments_of(&self, node: &str) -> Result<usize, kube::Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(PAGE);
        let mut count = 0;
        loop {
            let page = api.list(&params).await?;
            count += page
                .items
                .iter()
                .filter(|va| va.spec.node_name == node)
                .count();
            match page.metadata.continue_.clone().filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(count),
            }
        }
    }

    /// Carries out one release step; `false`: it failed or the fresh read of the host did not
    /// confirm it off (retried next pass).
    pub(super) async fn perform_release(
        &mut self,
        item: &Item,
        record: &Record,
        step: ReleaseAction,
    ) -> bool {
        let Some(node) = item.observation.node_name.clone() else {
            return true;
        };
        let releases = matches!(
            step,
            ReleaseAction::ForceDeletePods
                | ReleaseAction::ClearVolumesInUse
                | ReleaseAction::AddOutOfServiceTaint
        );
        if releases && !self.confirmed_off_now(item, record).await {
            tracing::info!(node = %node, remediation = %item.subject.key(), step = ?step, "a fresh read of the host does not confirm it off: nothing is released");
            return false;
        }
        let request_uid = match &item.subject {
            Subject::Request(r) => r.uid().unwrap_or_default(),
            Subject::Machine(m, _) => m.object.uid().unwrap_or_default(),
        };
        let edited = match step {
            ReleaseAction::AddFencedTaint => {
                self.edit_node(&node, |n| {
                    with_taint(n, FENCED_TAINT_KEY, None, "NoSchedule", None)
                })
                .await
            }
            ReleaseAction::RemoveFencedTaint => {
                self.edit_node(&node, |n| without_taint(n, FENCED_TAINT_KEY, None))
                    .await
            }
            ReleaseAction::AddOutOfServiceTaint => {
                self.edit_node(&node, |n| {
                    with_taint(
                        n,
                        OUT_OF_SERVICE_TAINT_KEY,
                        Some(OUT_OF_SERVICE_TAINT_VALUE),
                        "NoExecute",
                        Some(&request_uid),
                    )
                })
                .await
            }
            ReleaseAction::RemoveOutOfServiceTaint => {
                self.edit_node(&node, |n| {
                    without_taint(
                        n,
                        OUT_OF_SERVICE_TAINT_KEY,
                        Some(OUT_OF_SERVICE_OURS_ANNOTATION),
                    )
                })
                .await
            }
            ReleaseAction::ForceDeletePods => return self.force_delete_pods(&node).await,
            ReleaseAction::ClearVolumesInUse => return self.clear_volumes_in_use(&node).await,
            // The record's step and the power-off's release, not an action of its own.
            ReleaseAction::RecordReleasedAndPowerOn => return true,
        };
        // No Node: nothing to taint or untaint.
        edited != NodeEdit::Failed
    }

    /// Force-deletes (grace 0) every pod bound to the node, each with its uid as
    /// precondition: the kubelet that would confirm their end is off.
    async fn force_delete_pods(&self, node: &str) -> bool {
        let pods = match self.pods_on(node).await {
            Ok(pods) => pods,
            Err(e) => {
                log_write_error(&format!("the pods of node {node}"), &e);
                return false;
            }
        };
        let count = pods.len();
        let results: Vec<bool> = futures::stream::iter(pods)
            .map(|pod| {
                let api: Api<Pod> =
                    Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
                async move {
                    let params = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: pod.uid(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(&pod.name_any(), &params).await {
                        Ok(_) => true,
                        Err(e) if is_not_found(&e) || is_conflict(&e) => true,
                        Err(e) => {
                            log_write_error(
                                &format!(
                                    "Pod {}/{}",
                                    pod.namespace().unwrap_or_default(),
                                    pod.name_any()
                                ),
                                &e,
                            );
                            false
                        }
                    }
                }
            })
            .buffer_unordered(DELETES_IN_FLIGHT)
            .collect()
            .await;
        tracing::info!(node = %node, pods = count, "force-deleted the fenced node's pods; its host is off");
        results.into_iter().all(|ok| ok)
    }

    /// Clears the Node's `status.volumesInUse`, as a kubelet that stopped cleanly would have:
    /// the attach/detach controller then detaches at once instead of waiting six minutes.
    async fn clear_volumes_in_use(&self, node: &str) -> bool {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({ "status": { "volumesInUse": null } });
        match api
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = %node, "cleared the fenced node's volumesInUse; its host is off");
                true
            }
            Err(e) if is_not_found(&e) => true,
            Err(e) => {
                log_write_error(&format!("Node {node} status"), &e);
                false
            }
        }
    }
}

/// The patch adding a taint (and hostcycle's mark, when `mark`), or `None` when it is there.
fn with_taint(
    node: &Node,
    key: &str,
    value: Option<&str>,
    effect: &str,
    mark: Option<&str>,
) -> Option<Value> {
    let taints = taints_of(node);
    if taints.iter().any(|t| t.key == key) {
        return None;
    }
    let mut all: Vec<Value> = taints
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    all.push(json!({ "key": key, "value": value, "effect": effect }));
    let mut patch = json!({ "spec": { "taints": all } });
    if let Some(uid) = mark {
        patch["metadata"]["annotations"] = json!({ OUT_OF_SERVICE_OURS_ANNOTATION: uid });
    }
    Some(patch)
}

/// The patch removing a taint (with hostcycle's mark `mark`; a taint that needs the mark and
/// lacks it is someone else's and stays), or `None` when there is nothing to remove.
fn without_taint(node: &Node, key: &str, mark: Option<&str>) -> Option<Value> {
    let taints = taints_of(node);
    if let Some(mark) = mark
        && !node.annotations().contains_key(mark)
    {
        return None;
    }
    let marked = mark.is_some_and(|m| node.annotations().contains_key(m));
    if !taints.iter().any(|t| t.key == key) && !marked {
        return None;
    }
    let kept: Vec<Value> = taints
        .iter()
        .filter(|t| t.key != key)
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    let mut patch = json!({ "spec": { "taints": kept } });
    if let Some(mark) = mark {
        patch["metadata"]["annotations"] = json!({ mark: null });
    }
    Some(patch)
}

fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(taints: &[(&str, &str)], marked: bool) -> Node {
        let mut n = Node {
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: (*k).into(),
                            effect: (*e).into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            ..Node::default()
        };
        if marked {
            n.metadata.annotations = Some(
                [(
                    OUT_OF_SERVICE_OURS_ANNOTATION.to_string(),
                    "uid".to_string(),
                )]
                .into(),
            );
        }
        n
    }

    #[test]
    fn out_of_service_is_served_from_1_28() {
        for (major, minor, want) in [
            ("1", "20", false),
            ("1", "27", false),
            ("1", "28", true),
            ("1", "33+", true),
            ("2", "0", true),
            ("", "", false),
            ("1", "x", false),
        ] {
            assert_eq!(
                version_serves_out_of_service(major, minor),
                want,
                "{major}.{minor}"
            );
        }
    }

    #[test]
    fn taints_are_added_once_and_only_ours_are_removed() {
        let plain = node(&[("dedicated", "NoSchedule")], false);
        let patch = with_taint(&plain, FENCED_TAINT_KEY, None, "NoSchedule", None).unwrap();
        let keys: Vec<&str> = patch["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(
            keys,
            ["dedicated", FENCED_TAINT_KEY],
            "the admin's taint is kept"
        );
        let fenced = node(
            &[
                ("dedicated", "NoSchedule"),
                (FENCED_TAINT_KEY, "NoSchedule"),
            ],
            false,
        );
        assert!(with_taint(&fenced, FENCED_TAINT_KEY, None, "NoSchedule", None).is_none());
        let patch = without_taint(&fenced, FENCED_TAINT_KEY, None).unwrap();
        assert_eq!(patch["spec"]["taints"].as_array().unwrap().len(), 1);
        // Out-of-service: added with the mark; someone else's (unmarked) is never removed.
        let patch = with_taint(
            &plain,
            OUT_OF_SERVICE_TAINT_KEY,
            Some("nodeshutdown"),
            "NoExecute",
            Some("uid-r"),
        )
        .unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][OUT_OF_SERVICE_OURS_ANNOTATION],
            "uid-r"
        );
        let foreign = node(&[(OUT_OF_SERVICE_TAINT_KEY, "NoExecute")], false);
        assert!(
            without_taint(
                &foreign,
                OUT_OF_SERVICE_TAINT_KEY,
                Some(OUT_OF_SERVICE_OURS_ANNOTATION)
            )
            .is_none()
        );
        let ours = node(&[(OUT_OF_SERVICE_TAINT_KEY, "NoExecute")], true);
        let patch = without_taint(
            &ours,
            OUT_OF_SERVICE_TAINT_KEY,
            Some(OUT_OF_SERVICE_OURS_ANNOTATION),
        )
        .unwrap();
        assert!(patch["spec"]["taints"].as_array().unwrap().is_empty());
        assert!(patch["metadata"]["annotations"][OUT_OF_SERVICE_OURS_ANNOTATION].is_null());
    }
}
