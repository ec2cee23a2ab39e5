//! Leader election on a coordination.k8s.io Lease: only the holder runs controllers, so two
//! replicas never send power commands for the same host.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::ErrorBackoff;

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
    /// Starts campaigning in the background. Like `LeaseManager::watch`, with two changes:
    /// an API error is retried within seconds ([`ErrorBackoff::WATCH`]) instead of after up to
    /// 30 s, so after an API server outage a standby takes an expired Lease as soon as the
    /// server is back; and a standby reads the Lease every second, so one released by a
    /// leader that shut down cleanly is taken at once — the lease manager itself would look
    /// again only when the Lease it last saw expires. Dropping every receiver releases the
    /// Lease (if held) and ends the task.
    pub async fn start(
        &self,
        client: Client,
    ) -> Result<Election, kube_lease_manager::LeaseManagerError> {
        let mut manager = self.manager(client.clone()).await?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        let election = self.clone();
        let (sender, is_leader) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let standby = !*sender.borrow();
                let step = tokio::select! {
                    biased;
                    _ = sender.closed() => break,
                    () = released(&leases, &election.lease_name), if standby => Step::Released,
                    changed = manager.changed() => Step::Changed(changed),
                };
                match step {
                    Step::Released => {
                        // A fresh manager reads the Lease at once and locks it if it is free.
                        tracing::info!("the leader Lease was released; campaigning at once");
                        match election.manager(client.clone()).await {
                            Ok(fresh) => manager = fresh,
                            Err(e) => {
                                tracing::debug!(error = %e, "leader election: cannot reach the Lease")
                            }
                        }
                    }
                    Step::Changed(Ok(leads)) => {
                        failures = 0;
                        if sender.send(leads).is_err() {
                            break;
                        }
                    }
                    Step::Changed(Err(e)) => {
                        failures = failures.saturating_add(1);
                        let delay = ErrorBackoff::WATCH.delay(failures, rand::random::<f64>());
                        tracing::debug!(error = %e, retry_in = ?delay, "leader election: cannot reach the Lease");
                        tokio::select! {
                            _ = sender.closed() => break,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
            manager.release().await.map(|()| manager)
        });
        Ok(Election { is_leader, task })
    }

    async fn manager(
        &self,
        client: Client,
    ) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
        LeaseManagerBuilder::new(client, &self.lease_name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.duration().as_secs())
            .with_grace(self.grace().as_secs())
            .build()
            .await
    }
}

/// One turn of the election loop.
enum Step {
    /// The Lease has no holder: its leader released it.
    Released,
    Changed(Result<bool, kube_lease_manager::LeaseManagerError>),
}

/// Returns once a read of the Lease shows no holder (read every second).
async fn released(leases: &Api<Lease>, name: &str) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(Some(lease)) = leases.get_opt(name).await {
            let holder = lease.spec.and_then(|s| s.holder_identity);
            if holder.is_none_or(|h| h.is_empty()) {
                return;
            }
        }
    }
}

/// Why a leader stops leading on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLapse {
    /// The Lease names another holder, or none, or is gone.
    Taken { holder: Option<String> },
    /// This replica could not confirm a renewal before its Lease expired (the API server
    /// unreachable or too slow): another replica may take it from now on.
    Expired { at: jiff::Timestamp },
}

impl std::fmt::Display for LeaseLapse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLapse::Taken { holder: Some(h) } => write!(f, "the Lease is held by {h}"),
            LeaseLapse::Taken { holder: None } => write!(f, "the Lease has no holder"),
            LeaseLapse::Expired { at } => write!(
                f,
                "no renewal of the Lease could be confirmed before it expired at {at}"
            ),
        }
    }
}

impl LeaderElection {
    /// How long the Lease is valid (as the lease manager writes it).
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration.as_secs().max(2))
    }

    /// How long before the Lease expires its holder renews it (what the lease manager is
    /// given): two thirds of the duration, whole seconds, at least one — so the renewal is
    /// sent a third into the Lease and has until [`Self::stop_margin`] to be seen. Renewing
    /// only a third before the expiry left a loaded API server 2.5 s of a 15 s Lease to take
    /// the write and answer the read after it, and a leader under load fenced itself with a
    /// write of 1.8 s (found by two suites run at once). client-go renews as early.
    pub fn grace(&self) -> Duration {
        let seconds = self.duration().as_secs();
        Duration::from_secs((seconds * 2 / 3).clamp(1, seconds - 1))
    }

    /// How often a leader reads its own Lease ([`Self::confirm_held`]): a twelfth of the
    /// duration (1.25 s of a 15 s Lease), so the renewal is read several times before the
    /// stop margin. Reading only every fifth of the duration let a read land just before the
    /// renewal, the next one after the expiry, and the leader fenced itself with its Lease
    /// renewed.
    pub fn confirm_period(&self) -> Duration {
        (self.duration() / 12).clamp(Duration::from_millis(200), Duration::from_secs(5))
    }

    /// How long before its Lease could expire a leader stops acting when it cannot confirm a
    /// renewal: a quarter of the duration (3.75 s of a 15 s Lease). A standby takes the Lease
    /// only after the expiry, so the two never act at once even with a call in flight or
    /// clocks a little apart.
    pub fn stop_margin(&self) -> Duration {
        self.duration() / 4
    }

    /// While this replica leads: reads the Lease every [`Self::confirm_period`] and returns as
    /// soon as it is no longer ours, or [`Self::stop_margin`] before it expires without a
    /// renewal seen.
    ///
    /// The lease manager learns of a lost Lease only at its next successful read, and after
    /// errors (an API server outage) it backs off for up to 30 s: a leader cut off from the
    /// API server would go on acting while a standby, seeing the Lease expired, takes it over.
    /// This stops the leader first — a margin before its Lease expires — as client-go's renew
    /// deadline does. (Clocks of the replicas are assumed to agree within that margin.)
    pub async fn confirm_held(&self, client: Client) -> LeaseLapse {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        let duration = self.duration();
        let period = self.confirm_period();
        let margin = self.stop_margin();
        // Just won: the Lease was renewed a moment ago. Confirmed by the first read below.
        let mut valid_until = Timestamp::now() + duration;
        loop {
            let Some(left) = until(valid_until - margin) else {
                return LeaseLapse::Expired { at: valid_until };
            };
            // A read that hangs past the expiry counts as no renewal seen.
            if let Ok(read) = tokio::time::timeout(left, leases.get_opt(&self.lease_name)).await {
                match read {
                    Ok(Some(lease)) => {
                        let spec = lease.spec.unwrap_or_default();
                        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                            return LeaseLapse::Taken {
                                holder: spec.holder_identity,
                            };
                        }
                        if let (Some(renewed), Some(seconds)) =
                            (spec.renew_time, spec.lease_duration_seconds)
                        {
                            let seconds = u64::try_from(seconds).unwrap_or(0);
                            valid_until = renewed.0 + Duration::from_secs(seconds);
                        }
                    }
                    Ok(None) => return LeaseLapse::Taken { holder: None },
                    // Unreachable or refused: the last confirmed expiry stands.
                    Err(e) => tracing::debug!(error = %e, "cannot read the leader Lease"),
                }
            }
            let Some(left) = until(valid_until - margin) else {
                return LeaseLapse::Expired { at: valid_until };
            };
            tokio::time::sleep(left.min(period)).await;
        }
    }
}

/// The time left until `t`; `None` once it has come.
fn until(t: Timestamp) -> Option<Duration> {
    let left = t.duration_since(Timestamp::now());
    if left.is_positive() {
        Duration::try_from(left).ok()
    } else {
        None
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
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::{fake_client, status};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    fn election() -> LeaderElection {
        LeaderElection {
            namespace: "ops".into(),
            lease_name: "hostcycle-operator".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(2),
        }
    }

    fn lease(holder: &str, renewed: Timestamp) -> serde_json::Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": "hostcycle-operator", "namespace": "ops" },
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 2,
                "renewTime": renewed.to_string(),
            },
        })
    }

    #[tokio::test]
    async fn a_leader_stops_when_another_replica_holds_the_lease() {
        // Renewed by us on every read, until another replica shows up as the holder.
        let reads = Arc::new(Mutex::new(0u32));
        let counter = reads.clone();
        let client = fake_client(move |req| {
            let counter = counter.clone();
            async move {
                assert_eq!(
                    req.path,
                    "/apis/coordination.k8s.io/v1/namespaces/ops/leases/hostcycle-operator"
                );
                let mut n = counter.lock().unwrap();
                *n += 1;
                let holder = if *n < 4 { "me" } else { "other" };
                (200, lease(holder, Timestamp::now()))
            }
        });
        let lapse = tokio::time::timeout(Duration::from_secs(10), election().confirm_held(client))
            .await
            .unwrap();
        assert_eq!(
            lapse,
            LeaseLapse::Taken {
                holder: Some("other".into())
            }
        );
        assert_eq!(*reads.lock().unwrap(), 4, "kept reading while it was ours");
    }

    /// The lease manager renews when the grace period starts (3 s before the expiry of a 5 s
    /// Lease); a write that takes a moment must still be seen before the expiry.
    #[tokio::test]
    async fn a_renewal_at_the_start_of_the_grace_period_is_seen_in_time() {
        let election = LeaderElection {
            lease_duration: Duration::from_secs(5),
            ..election()
        };
        assert_eq!(election.grace(), Duration::from_secs(3));
        let won = Timestamp::now();
        // The renewal is written 2.1 s after the Lease was won (the grace period starts at 2 s).
        let renewed = won + Duration::from_millis(2100);
        let client = fake_client(move |_req| async move {
            let seen = if Timestamp::now() >= renewed {
                renewed
            } else {
                won
            };
            let mut lease = lease("me", seen);
            lease["spec"]["leaseDurationSeconds"] = json!(5);
            (200, lease)
        });
        // Past the first expiry (5 s): still leading (until 1.25 s before the renewed
        // Lease's expiry at 7.1 s, as the fake renews only once).
        let lapse =
            tokio::time::timeout(Duration::from_millis(5500), election.confirm_held(client)).await;
        assert!(
            lapse.is_err(),
            "the leader stopped although its Lease was renewed: {lapse:?}"
        );
    }

    #[tokio::test]
    async fn a_leader_cut_off_from_the_api_server_stops_a_margin_before_its_lease_expires() {
        for answer in ["refused", "hangs"] {
            let renewed = Timestamp::now();
            let first = Arc::new(Mutex::new(true));
            let client = fake_client(move |_req| {
                let first = first.clone();
                async move {
                    let was_first = std::mem::replace(&mut *first.lock().unwrap(), false);
                    if was_first {
                        return (200, lease("me", renewed));
                    }
                    if answer == "hangs" {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    status(503, "ServiceUnavailable")
                }
            });
            let lapse =
                tokio::time::timeout(Duration::from_secs(10), election().confirm_held(client))
                    .await
                    .unwrap();
            let expiry = renewed + Duration::from_secs(2);
            assert_eq!(lapse, LeaseLapse::Expired { at: expiry }, "{answer}");
            // 2 s Lease: grace 1 s, margin 0.5 s (a quarter).
            let margin = election().stop_margin();
            assert_eq!(margin, Duration::from_millis(500));
            let stopped = Timestamp::now();
            let early = expiry.duration_since(stopped);
            assert!(
                stopped < expiry,
                "{answer}: still acting at the expiry ({stopped} ≥ {expiry})"
            );
            assert!(
                early <= jiff::SignedDuration::try_from(margin).unwrap(),
                "{answer}: stopped {early:?} before the expiry, more than the margin"
            );
            assert!(
                early >= jiff::SignedDuration::from_millis(300),
                "{answer}: stopped only {early:?} before the expiry; the margin is {margin:?}"
            );
        }
    }

    /// A renewal is sent a third into the Lease and has until the stop margin to be seen: at
    /// least a quarter of the Lease (6.25 s of the default 15 s, was 2.5 s), read at least
    /// twice meanwhile.
    #[test]
    fn a_renewal_has_most_of_the_lease_to_land() {
        // (duration s, grace s, margin ms, read every ms)
        let cases: [(u64, u64, u64, u128); 5] = [
            (2, 1, 500, 200),
            (5, 3, 1250, 416),
            (15, 10, 3750, 1250),
            (30, 20, 7500, 2500),
            (137, 91, 34250, 5000),
        ];
        for (duration, grace, margin, period) in cases {
            let election = LeaderElection {
                lease_duration: Duration::from_secs(duration),
                ..election()
            };
            assert_eq!(election.grace(), Duration::from_secs(grace), "{duration}");
            assert_eq!(
                election.stop_margin(),
                Duration::from_millis(margin),
                "{duration}"
            );
            assert_eq!(election.confirm_period().as_millis(), period, "{duration}");
            assert!(election.grace() < election.duration());
            // From the renewal to the stop: the grace period less the margin.
            let window = election.grace() - election.stop_margin();
            assert!(window * 4 >= election.duration(), "{duration}: {window:?}");
            assert!(
                window >= election.confirm_period() * 2,
                "{duration}: read twice"
            );
        }
    }

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
