//! Leader election on a coordination.k8s.io Lease: only the holder runs controllers, so two
//! replicas never send power commands for the same host.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where and as whom to take the leader Lease.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub lease_duration: Duration,
}

/// A running election: `is_leader` flips as the Lease is won or lost.
pub struct Election {
    pub is_leader: watch::Receiver<bool>,
    pub task: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

impl LeaderElection {
    /// Starts campaigning in the background.
    pub async fn start(
        &self,
        client: Client,
    ) -> Result<Election, kube_lease_manager::LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, &self.lease_name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.lease_duration.as_secs().max(2))
            .with_grace((self.lease_duration.as_secs() / 3).max(1))
            .build()
            .await?;
        let (is_leader, task) = manager.watch().await;
        Ok(Election { is_leader, task })
    }
}

/// Waits until `rx` says we lead; false if the election task ended first.
pub async fn wait_for_leadership(rx: &mut watch::Receiver<bool>) -> bool {
    loop {
        if *rx.borrow_and_update() {
            return true;
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

/// Opens once this replica holds the leader Lease (at once without leader election). Every
/// controller starts its watches before it — a standby replica keeps warm caches, so it can
/// act the moment it takes over — and acts only after it. It never closes again: losing the
/// Lease cancels the work token and ends the process instead.
#[derive(Debug, Clone, Default)]
pub struct LeaderGate(CancellationToken);

impl LeaderGate {
    pub fn new() -> Self {
        LeaderGate::default()
    }

    /// This replica leads from now on.
    pub fn open(&self) {
        self.0.cancel();
    }

    pub fn is_open(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Waits until this replica leads; false if `work` was cancelled (shutdown, or the
    /// election ended) first.
    pub async fn wait_to_lead(&self, work: &CancellationToken) -> bool {
        tokio::select! {
            biased;
            _ = work.cancelled() => false,
            _ = self.0.cancelled() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gate_opens_once_and_stays_open() {
        let gate = LeaderGate::new();
        let work = CancellationToken::new();
        assert!(!gate.is_open());
        let waiter = tokio::spawn({
            let (gate, work) = (gate.clone(), work.clone());
            async move { gate.wait_to_lead(&work).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a standby replica waits");
        gate.open();
        assert!(waiter.await.unwrap_or(false));
        assert!(gate.is_open());
        assert!(gate.wait_to_lead(&work).await, "open stays open");
    }

    #[tokio::test]
    async fn stopping_ends_the_wait_of_a_standby_replica() {
        let gate = LeaderGate::new();
        let work = CancellationToken::new();
        work.cancel();
        assert!(!gate.wait_to_lead(&work).await);
    }
}
