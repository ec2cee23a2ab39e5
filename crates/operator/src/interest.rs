//! Which BareMetalHosts a loop depends on, so that a host's change wakes the reboot queue or
//! remediation only when it matters to them.
//!
//! Both loops re-read their whole world on every pass. Woken by every host change, they would
//! run a pass per status write of every host in the fleet: with 5,000 hosts, the host
//! controller's own registration writes kept both loops busy and starved it of CPU. Each pass
//! says which hosts it read; a change of any other host is ignored. While a loop has a target
//! it could not find a host for, every host change wakes it (a new host may be the one).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use hostcycle_api::BareMetalHost;
use kube::ResourceExt;
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    /// Every host: before the first pass, or while a target is unresolved.
    All,
    /// These hosts, as `namespace/name`.
    Some(HashSet<String>),
}

/// The hosts a loop's last pass depended on. Cheap to clone; shared with the host watch.
#[derive(Debug, Clone)]
pub struct HostInterest {
    wanted: Arc<Mutex<Wanted>>,
}

impl Default for HostInterest {
    fn default() -> Self {
        HostInterest {
            wanted: Arc::new(Mutex::new(Wanted::All)),
        }
    }
}

impl HostInterest {
    fn lock(&self) -> MutexGuard<'_, Wanted> {
        match self.wanted.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether a change of `host` should wake the loop.
    pub fn wants(&self, host: &BareMetalHost) -> bool {
        match &*self.lock() {
            Wanted::All => true,
            Wanted::Some(keys) => keys.contains(&key(
                &host.namespace().unwrap_or_default(),
                &host.name_any(),
            )),
        }
    }

    /// Records what a pass depended on: `hosts` (`namespace/name`), and every host when
    /// `unresolved`. When the interest grows, `wake` is notified: a change to a newly
    /// wanted host may have arrived during the pass, before it was wanted, and been ignored.
    pub fn set(&self, hosts: HashSet<String>, unresolved: bool, wake: &Notify) {
        let next = if unresolved {
            Wanted::All
        } else {
            Wanted::Some(hosts)
        };
        let grew = {
            let mut wanted = self.lock();
            let grew = match (&*wanted, &next) {
                (Wanted::All, _) => false,
                (Wanted::Some(_), Wanted::All) => true,
                (Wanted::Some(old), Wanted::Some(new)) => !new.is_subset(old),
            };
            *wanted = next;
            grew
        };
        if grew {
            wake.notify_one();
        }
    }
}

/// `namespace/name`, the form [`HostInterest::set`] takes.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(ns: &str, name: &str) -> BareMetalHost {
        let mut h = BareMetalHost::externally_provisioned(name, "redfish://192.0.2.1", "bmc");
        h.metadata.namespace = Some(ns.to_string());
        h
    }

    #[tokio::test]
    async fn every_host_until_the_first_pass_then_only_the_wanted_ones() {
        let interest = HostInterest::default();
        let wake = Notify::new();
        assert!(interest.wants(&host("a", "x")));
        interest.set(HashSet::from([key("a", "x")]), false, &wake);
        assert!(interest.wants(&host("a", "x")));
        assert!(!interest.wants(&host("a", "y")));
        assert!(!interest.wants(&host("b", "x")));
        interest.set(HashSet::new(), false, &wake);
        assert!(!interest.wants(&host("a", "x")), "nothing wanted");
        interest.set(HashSet::new(), true, &wake);
        assert!(interest.wants(&host("c", "z")), "unresolved: everything");
    }

    #[tokio::test]
    async fn a_growing_interest_wakes_the_loop_once_more() {
        let interest = HostInterest::default();
        let wake = Notify::new();
        interest.set(HashSet::from([key("a", "x")]), false, &wake);
        let woke = |wake: &Notify| {
            let notified = wake.notified();
            futures::pin_mut!(notified);
            futures::FutureExt::now_or_never(notified).is_some()
        };
        assert!(!woke(&wake), "from everything to fewer: no wake");
        interest.set(HashSet::from([key("a", "x")]), false, &wake);
        assert!(!woke(&wake), "unchanged: no wake");
        interest.set(HashSet::from([key("a", "x"), key("a", "y")]), false, &wake);
        assert!(woke(&wake), "a new host wanted: wake");
        interest.set(HashSet::new(), false, &wake);
        assert!(!woke(&wake));
        interest.set(HashSet::new(), true, &wake);
        assert!(woke(&wake), "unresolved: wake");
    }
}
