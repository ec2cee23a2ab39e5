//! Leader election on a coordination.k8s.io Lease: only the holder runs controllers, so two
//! replicas never send power commands for the same host.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

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
