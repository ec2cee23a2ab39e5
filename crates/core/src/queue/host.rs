//! How a Node finds its BareMetalHost, first match wins:
//!
//! 1. the Node's `hostcycle.io/baremetalhost: <namespace>/<name>` annotation;
//! 2. its `spec.providerID`: `metal3://<namespace>/<host>/<machine>` (CAPM3),
//!    `metal3://<host-uid>` (older CAPM3) or `baremetalhost:///<namespace>/<host>/<uid>`
//!    (OpenShift);
//! 3. a Machine (`cluster.x-k8s.io` or `machine.openshift.io`) whose `status.nodeRef.name`
//!    is the node: the host named by its `metal3.io/BareMetalHost` annotation, or the host
//!    whose `spec.consumerRef` is that Machine or its `spec.infrastructureRef`
//!    (a Metal3Machine);
//! 4. the only BareMetalHost, in any namespace, with the Node's name.

use std::collections::BTreeMap;

use hostcycle_api::queue::{HostReference, NODE_HOST_ANNOTATION};

use super::snapshot::RebootTarget;

/// Annotation on a Machine (OpenShift, CAPM3's Metal3Machine) naming its host.
pub const MACHINE_HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";

/// An object reference as found in `consumerRef` / `infrastructureRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// A BareMetalHost, reduced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSummary {
    pub reference: HostReference,
    pub uid: String,
    pub consumer: Option<ObjectKey>,
    /// Why the queue cannot reboot through it now (paused, detached, offline), if so.
    pub unusable: Option<String>,
}

/// A Machine, reduced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSummary {
    pub key: ObjectKey,
    pub node_name: Option<String>,
    /// Its `metal3.io/BareMetalHost` annotation.
    pub host_annotation: Option<String>,
    pub infrastructure: Option<ObjectKey>,
}

/// Which rule found the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMatch {
    Annotation,
    ProviderId,
    Machine,
    SameName,
}

/// A Node, reduced to what the mapping reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeIdentity {
    pub name: String,
    pub provider_id: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

fn parse_ref(text: &str) -> Option<HostReference> {
    let (namespace, name) = text.trim().split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then(|| HostReference {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// Finds the node's host; `None` when no rule matches.
pub fn find_host(
    node: &NodeIdentity,
    hosts: &[HostSummary],
    machines: &[MachineSummary],
) -> Option<(HostReference, HostMatch)> {
    let exists = |r: &HostReference| hosts.iter().any(|h| &h.reference == r);

    if let Some(r) = node
        .annotations
        .get(NODE_HOST_ANNOTATION)
        .and_then(|v| parse_ref(v))
    {
        // An explicit annotation is authoritative, even when it names a missing host.
        return Some((r, HostMatch::Annotation));
    }

    if let Some(id) = node.provider_id.as_deref().map(str::trim) {
        let by_path = |path: &str| -> Option<HostReference> {
            let mut parts = path.split('/').filter(|p| !p.is_empty());
            let namespace = parts.next()?;
            let name = parts.next()?;
            let r = HostReference {
                namespace: namespace.to_string(),
                name: name.to_string(),
            };
            exists(&r).then_some(r)
        };
        let found = if let Some(rest) = id.strip_prefix("metal3://") {
            if rest.contains('/') {
                by_path(rest)
            } else {
                hosts
                    .iter()
                    .find(|h| !rest.is_empty() && h.uid == rest)
                    .map(|h| h.reference.clone())
            }
        } else if let Some(rest) = id.strip_prefix("baremetalhost://") {
            by_path(rest)
        } else {
            None
        };
        if let Some(r) = found {
            return Some((r, HostMatch::ProviderId));
        }
    }

    for machine in machines
        .iter()
        .filter(|m| m.node_name.as_deref() == Some(node.name.as_str()))
    {
        if let Some(r) = machine
            .host_annotation
            .as_deref()
            .and_then(parse_ref)
            .filter(|r| exists(r))
        {
            return Some((r, HostMatch::Machine));
        }
        let consumers: Vec<&ObjectKey> = std::iter::once(&machine.key)
            .chain(machine.infrastructure.iter())
            .collect();
        if let Some(host) = hosts
            .iter()
            .find(|h| h.consumer.as_ref().is_some_and(|c| consumers.contains(&c)))
        {
            return Some((host.reference.clone(), HostMatch::Machine));
        }
    }

    let mut same_name = hosts.iter().filter(|h| h.reference.name == node.name);
    match (same_name.next(), same_name.next()) {
        (Some(only), None) => Some((only.reference.clone(), HostMatch::SameName)),
        _ => None,
    }
}

/// The node's reboot target: its usable host, an unusable one, or none.
pub fn reboot_target(
    node: &NodeIdentity,
    hosts: &[HostSummary],
    machines: &[MachineSummary],
) -> RebootTarget {
    match find_host(node, hosts, machines) {
        None => RebootTarget::NoHost,
        Some((reference, _)) => match hosts.iter().find(|h| h.reference == reference) {
            None => RebootTarget::UnusableHost {
                host: reference,
                why: "does not exist (named by the node's hostcycle.io/baremetalhost annotation)"
                    .into(),
            },
            Some(HostSummary {
                unusable: Some(why),
                ..
            }) => RebootTarget::UnusableHost {
                host: reference,
                why: why.clone(),
            },
            Some(_) => RebootTarget::Host(reference),
        },
    }
}
