//! Kubelet faults of simulated hosts, switchable while the simulator runs.
//!
//! A fault affects only the kubelet: the host keeps its power and its running containers keep
//! writing to their volumes. Any fault ends when the host loses power, so the next boot has a
//! healthy kubelet (a fenced and powered-on host rejoins).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// What is wrong with a simulated host's kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// A healthy kubelet.
    #[default]
    None,
    /// The kubelet process is gone: no API call at all (no Lease renewal, no status, no pod
    /// update); containers keep running and writing.
    KubeletDead,
    /// The kubelet runs but cannot reach the API server: every API call is skipped; its pods
    /// keep running and writing.
    Partitioned,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::None => 0,
            Fault::KubeletDead => 1,
            Fault::Partitioned => 2,
        }
    }

    fn from_code(code: u8) -> Fault {
        match code {
            1 => Fault::KubeletDead,
            2 => Fault::Partitioned,
            _ => Fault::None,
        }
    }
}

/// One host's current fault, shared between its kubelet task and the controllers.
#[derive(Debug, Clone, Default)]
pub struct FaultSwitch(Arc<AtomicU8>);

impl FaultSwitch {
    pub fn get(&self) -> Fault {
        Fault::from_code(self.0.load(Ordering::Acquire))
    }

    pub fn set(&self, fault: Fault) {
        self.0.store(fault.code(), Ordering::Release);
    }
}

/// The host named is not one the simulator plays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no simulated host named {0:?}")]
pub struct UnknownHost(pub String);

/// A cloneable handle that switches the fault of any simulated host at run time.
#[derive(Debug, Clone, Default)]
pub struct SimControl {
    faults: Arc<BTreeMap<String, FaultSwitch>>,
}

impl SimControl {
    pub(crate) fn new(faults: BTreeMap<String, FaultSwitch>) -> Self {
        SimControl {
            faults: Arc::new(faults),
        }
    }

    /// Gives `node_name`'s kubelet `fault` (or heals it with [`Fault::None`]).
    pub fn set_fault(&self, node_name: &str, fault: Fault) -> Result<(), UnknownHost> {
        let switch = self
            .faults
            .get(node_name)
            .ok_or_else(|| UnknownHost(node_name.to_string()))?;
        switch.set(fault);
        tracing::info!(node = %node_name, ?fault, "kubelet fault set");
        Ok(())
    }

    /// `node_name`'s current fault; it is back to [`Fault::None`] once the host lost power.
    pub fn fault(&self, node_name: &str) -> Result<Fault, UnknownHost> {
        self.faults
            .get(node_name)
            .map(FaultSwitch::get)
            .ok_or_else(|| UnknownHost(node_name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_round_trip_and_unknown_hosts_are_errors() {
        let control = SimControl::new(BTreeMap::from([("a".to_string(), FaultSwitch::default())]));
        for fault in [Fault::KubeletDead, Fault::Partitioned, Fault::None] {
            assert!(control.set_fault("a", fault).is_ok());
            assert_eq!(control.fault("a"), Ok(fault));
        }
        assert_eq!(
            control.set_fault("b", Fault::KubeletDead),
            Err(UnknownHost("b".into()))
        );
    }
}
