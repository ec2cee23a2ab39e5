//! What every controller reads the same way from a Node.

use k8s_openapi::api::core::v1::{Node, NodeCondition};

/// The Node's `Ready` condition, if it reports one.
pub fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The Ready condition is True. Anything else (False, Unknown, absent) is not ready.
pub fn is_ready(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}
