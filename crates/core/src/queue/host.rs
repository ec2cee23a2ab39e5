//! What the queue can reboot a node with: the host [`crate::binding`] binds to the node, if
//! it can be used now.

use hostcycle_api::queue::HostReference;

use super::snapshot::RebootTarget;
use crate::binding::{BindingIndex, Refusal};

/// The node's reboot target: its usable host, an unusable one (paused, detached, offline, no
/// BMC: `unusable` says why), a refusal (the binding is in doubt), or none.
pub fn reboot_target(
    index: &BindingIndex,
    node: &str,
    unusable: impl Fn(&HostReference) -> Option<String>,
) -> RebootTarget {
    match index.node(node) {
        Ok(binding) => match unusable(&binding.host) {
            Some(why) => RebootTarget::UnusableHost {
                host: binding.host,
                why,
            },
            None => RebootTarget::Host(binding.host),
        },
        Err(refusal) if matches!(*refusal, Refusal::NoHost { .. }) => RebootTarget::NoHost,
        Err(refusal) => RebootTarget::Refused {
            why: refusal.to_string(),
        },
    }
}
